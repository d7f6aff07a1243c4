"""LLM_ARCH_DOTS1 (src/models/dots1.cpp): dots.llm1 (142B-A14B).

Multi-head attention (K and V sized by the query heads) with per-head QK norms and NEOX rope,
leading dense layers, then routed experts (sigmoid with a selection bias, weights normed and
scaled) beside shared experts: bailingmoe2's graph under another residual name.
"""
from __future__ import annotations

from ..graph import GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require, require_gating_func, require_head_sizes_equal
from ..model_loader import ModelLoader, tn
from .bailingmoe2 import build_qk_norm_moe_shexp, create_dense_ffn_tensors, create_moe_shexp_tensors

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0)
    require_gating_func(ml, hp)   # absent (NONE) or unknown: build_moe_ffn aborts
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_head_k, n_ff_exp = hp.n_embd, hp.n_vocab, hp.n_embd_head_k(), hp.n_ff_exp()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        n_embd_q = n_embd_head_k * hp.n_head(i)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_q, n_embd_q, n_embd_q)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        if i < hp.n_layer_dense_lead:
            create_dense_ffn_tensors(c, layer, i)
            continue
        require(c.ml, hp.n_expert > 0, "n_expert must be > 0")
        require(c.ml, hp.n_expert_used() > 0, "n_expert_used must be > 0")
        create_moe_shexp_tensors(c, layer, i, n_ff_exp, n_ff_exp * hp.n_expert_shared)


def build(g: GraphContext) -> None:
    """llama_model_dots1::graph"""
    build_qk_norm_moe_shexp(g, "ffn_inp")
