"""LLM_ARCH_GLM_DSA (src/models/glm-dsa.cpp): GLM-5, GLM-5.1, GLM-5.2.

DeepSeek-V3.2's graph (deepseek32: MLA, experts, DeepSeek sparse attention) with the indexer's
rope NORM and, from GLM-5.2 on, "shared" indexer layers that run no indexer of their own: they
reuse the top-k of the last "full" layer, and only the full layers have indexer keys in the
cache (create_memory's filter_lid).
"""
from __future__ import annotations

from ..graph import GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader
from .deepseek32 import build_dsa, load_dsa_tensors, require_dsa

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM

# GLM_5_2_DEFAULT_INDEXER_TYPES: layers 0 and 1 full, then one full layer in four from layer 2, up to layer 77
GLM_5_2_INDEXER_LAYERS = 78


def glm_5_2_indexer_full(il: int) -> bool:
    return il < 2 or (il < GLM_5_2_INDEXER_LAYERS and (il - 2) % 4 == 0)


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla", 0)
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla", 0)
    hp.indexer_n_head = ml.get_u32("%s.attention.indexer.head_count")
    hp.indexer_head_size = ml.get_u32("%s.attention.indexer.key_length")
    hp.indexer_top_k = ml.get_u32("%s.attention.indexer.top_k")
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0) or 2   # NONE: GLM's sigmoid
    require_gating_func(ml, hp)
    # GLM 5 and 5.1 (trained below 1M tokens, no indexer.types) have a full indexer on every layer
    if hp.n_ctx_train < 1048576:
        full = (True,) * hp.n_layer
    else:
        full = tuple(glm_5_2_indexer_full(il) for il in range(hp.n_layer))
    if ml.has("%s.attention.indexer.types"):
        full = tuple(v != 0 for v in ml.get_key_or_arr("%s.attention.indexer.types", hp.n_layer))
    hp.is_indexer_full_arr = full
    require_dsa(ml, hp)
    require(ml, hp.n_layer == 0 or hp.is_indexer_full(0),
            "layer 0 is a shared indexer layer: there is no full indexer layer before it to take the top-k from")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    load_dsa_tensors(c, model, TENSOR_NOT_REQUIRED)
    hp = model.hparams
    for il, layer in enumerate(model.layers):
        if hp.is_indexer_full(il) and None in (layer.indexer_attn_q_b, layer.indexer_attn_k, layer.indexer_proj):
            c.ml.fail(f"full indexer layer {il} has no indexer weights (blk.{il}.indexer.*): llama.cpp would crash "
                      f"building its graph")


def build(g: GraphContext) -> None:
    build_dsa(g, LLAMA_ROPE_TYPE_NORM, g.hparams.is_indexer_full)
