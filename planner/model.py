"""The model as llama.cpp loads it: shared hyperparameters, then the architecture's own, then one
tensor per GGUF tensor placed in a buffer type.

Mirrors llama_model_base::load_hparams, load_tensors, create_tensor and create_tensor_qkv
(src/llama-model.cpp) over llama_model_loader's checks (model_loader.py). Each architecture's
load_arch_hparams / load_arch_tensors / graph live in planner/models/<arch>.py.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from . import ggml, models
from .arch import LAYER_INPUT, LAYER_OUTPUT, LLM_TENSOR_INFOS
from .gallocr import alloc_ctx_tensors
from .ggml import Buffer, Tensor
from .hparams import (LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS, LLAMA_POOLING_TYPE_UNSPECIFIED, LLAMA_ROPE_SCALING_TYPES,
                      HParams)
from .gguf import BOOL, INT32, UINT32, shown
from .model_loader import (TENSOR_ALLOW_RESHAPE, TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_READ_LAZY, TENSOR_SKIP,
                           TN, ModelLoader, tn)

if TYPE_CHECKING:
    from ..backends.types import BufferType


@dataclass
class LayerSwitchLora:
    """llama_layer_switch_lora: graniteswitch's embedded adapters, one A/B pair per projection,
    stacked over the adapter slots (slot 0 the base)."""
    a_q: Optional[Tensor] = None
    b_q: Optional[Tensor] = None
    a_k: Optional[Tensor] = None
    b_k: Optional[Tensor] = None
    a_v: Optional[Tensor] = None
    b_v: Optional[Tensor] = None
    a_o: Optional[Tensor] = None
    b_o: Optional[Tensor] = None
    a_gate: Optional[Tensor] = None
    b_gate: Optional[Tensor] = None
    a_up: Optional[Tensor] = None
    b_up: Optional[Tensor] = None
    a_down: Optional[Tensor] = None
    b_down: Optional[Tensor] = None


@dataclass
class LayerPosnet:
    """llama_layer_posnet: wavtokenizer-dec's posnet blocks (resnet, attention or the final norm)."""
    norm1: Optional[Tensor] = None
    norm1_b: Optional[Tensor] = None
    conv1: Optional[Tensor] = None
    conv1_b: Optional[Tensor] = None
    norm2: Optional[Tensor] = None
    norm2_b: Optional[Tensor] = None
    conv2: Optional[Tensor] = None
    conv2_b: Optional[Tensor] = None
    attn_norm: Optional[Tensor] = None
    attn_norm_b: Optional[Tensor] = None
    attn_q: Optional[Tensor] = None
    attn_q_b: Optional[Tensor] = None
    attn_k: Optional[Tensor] = None
    attn_k_b: Optional[Tensor] = None
    attn_v: Optional[Tensor] = None
    attn_v_b: Optional[Tensor] = None
    attn_o: Optional[Tensor] = None
    attn_o_b: Optional[Tensor] = None
    norm: Optional[Tensor] = None
    norm_b: Optional[Tensor] = None


@dataclass
class LayerConvnext:
    """llama_layer_convnext: wavtokenizer-dec's ConvNeXt blocks."""
    dw: Optional[Tensor] = None
    dw_b: Optional[Tensor] = None
    norm: Optional[Tensor] = None
    norm_b: Optional[Tensor] = None
    pw1: Optional[Tensor] = None
    pw1_b: Optional[Tensor] = None
    pw2: Optional[Tensor] = None
    pw2_b: Optional[Tensor] = None
    gamma: Optional[Tensor] = None


@dataclass(init=False, eq=False, repr=False)
class Layer:
    """llama_layer: the weights of one block that the supported builders use (None when absent).
    Built empty and filled by load_tensors; a generated __init__ of its 240 fields would cost every
    plan about 5 ms to build at import, so the absent weights are the class's None defaults."""
    attn_norm: Optional[Tensor] = None
    attn_norm_b: Optional[Tensor] = None
    wq: Optional[Tensor] = None
    wk: Optional[Tensor] = None
    wv: Optional[Tensor] = None
    wqkv: Optional[Tensor] = None
    bq: Optional[Tensor] = None
    bk: Optional[Tensor] = None
    bv: Optional[Tensor] = None
    bqkv: Optional[Tensor] = None
    wo: Optional[Tensor] = None
    bo: Optional[Tensor] = None
    attn_q_norm: Optional[Tensor] = None
    attn_k_norm: Optional[Tensor] = None
    attn_q_norm_b: Optional[Tensor] = None     # mpt's and chameleon's Q/K LayerNorm biases
    attn_k_norm_b: Optional[Tensor] = None
    visexp_attn_wqkv: Optional[Tensor] = None   # cogvlm: the vision expert's weights beside the language ones
    visexp_attn_wo: Optional[Tensor] = None
    visexp_ffn_gate: Optional[Tensor] = None
    visexp_ffn_down: Optional[Tensor] = None
    visexp_ffn_up: Optional[Tensor] = None
    attn_post_norm: Optional[Tensor] = None
    attn_out_norm: Optional[Tensor] = None
    attn_out_norm_b: Optional[Tensor] = None
    layer_out_norm: Optional[Tensor] = None      # BERT's post-FFN norm
    layer_out_norm_b: Optional[Tensor] = None
    ffn_norm: Optional[Tensor] = None
    ffn_norm_b: Optional[Tensor] = None
    ffn_gate: Optional[Tensor] = None
    ffn_up: Optional[Tensor] = None
    ffn_down: Optional[Tensor] = None
    ffn_gate_b: Optional[Tensor] = None
    ffn_up_b: Optional[Tensor] = None
    ffn_down_b: Optional[Tensor] = None
    ffn_post_norm: Optional[Tensor] = None
    ffn_act: Optional[Tensor] = None           # mpt: AWQ's activation scales (ffn.act.scales)
    rope_freqs: Optional[Tensor] = None
    rope_long: Optional[Tensor] = None
    rope_short: Optional[Tensor] = None
    ffn_gate_inp: Optional[Tensor] = None
    ffn_norm_exps: Optional[Tensor] = None
    ffn_gate_inp_b: Optional[Tensor] = None
    ffn_gate_exps: Optional[Tensor] = None
    ffn_up_exps: Optional[Tensor] = None
    ffn_down_exps: Optional[Tensor] = None
    ffn_gate_up_exps: Optional[Tensor] = None
    ffn_gate_exps_b: Optional[Tensor] = None
    ffn_up_exps_b: Optional[Tensor] = None
    ffn_down_exps_b: Optional[Tensor] = None
    ffn_exp_probs_b: Optional[Tensor] = None
    ffn_gate_shexp: Optional[Tensor] = None
    ffn_up_shexp: Optional[Tensor] = None
    ffn_down_shexp: Optional[Tensor] = None
    ffn_gate_inp_shexp: Optional[Tensor] = None
    ffn_gate_chexps: Optional[Tensor] = None   # grovemoe's chunk experts
    ffn_up_chexps: Optional[Tensor] = None
    ffn_down_chexps: Optional[Tensor] = None
    ffn_latent_down: Optional[Tensor] = None
    ffn_latent_up: Optional[Tensor] = None
    attn_sinks: Optional[Tensor] = None
    wq_a: Optional[Tensor] = None              # multi-head latent attention
    wq_b: Optional[Tensor] = None
    attn_q_a_norm: Optional[Tensor] = None
    attn_kv_a_norm: Optional[Tensor] = None
    wkv_a_mqa: Optional[Tensor] = None
    wkv_b: Optional[Tensor] = None             # legacy DeepSeek2 GGUFs: K and V decompression unsplit
    wk_b: Optional[Tensor] = None
    wv_b: Optional[Tensor] = None
    indexer_k_norm: Optional[Tensor] = None    # DeepSeek sparse attention's lightning indexer
    indexer_k_norm_b: Optional[Tensor] = None
    indexer_proj: Optional[Tensor] = None
    indexer_attn_k: Optional[Tensor] = None
    indexer_attn_q_b: Optional[Tensor] = None
    wg: Optional[Tensor] = None                # minimax-01's lightning attention output gate
    wqkv_gate: Optional[Tensor] = None         # recurrent layers: gated delta net, Mamba-2, short conv
    ssm_in: Optional[Tensor] = None
    ssm_conv1d: Optional[Tensor] = None
    ssm_conv1d_b: Optional[Tensor] = None
    ssm_dt: Optional[Tensor] = None
    ssm_dt_b: Optional[Tensor] = None
    ssm_x: Optional[Tensor] = None             # Mamba-1: x to dt, B, C; jamba's RMS norms of them
    ssm_dt_norm: Optional[Tensor] = None
    ssm_b_norm: Optional[Tensor] = None
    ssm_c_norm: Optional[Tensor] = None
    ssm_a: Optional[Tensor] = None
    ssm_d: Optional[Tensor] = None
    ssm_beta: Optional[Tensor] = None
    ssm_alpha: Optional[Tensor] = None
    ssm_beta_alpha: Optional[Tensor] = None
    ssm_norm: Optional[Tensor] = None
    ssm_out: Optional[Tensor] = None
    shortconv_conv: Optional[Tensor] = None
    shortconv_in_proj: Optional[Tensor] = None
    shortconv_out_proj: Optional[Tensor] = None
    ssm_q_conv: Optional[Tensor] = None        # kimi-linear's KDA: Q/K/V short convolutions, gates, output norm
    ssm_k_conv: Optional[Tensor] = None
    ssm_v_conv: Optional[Tensor] = None
    ssm_f_a: Optional[Tensor] = None
    ssm_f_b: Optional[Tensor] = None
    ssm_g_a: Optional[Tensor] = None
    ssm_g_b: Optional[Tensor] = None
    ssm_o_norm: Optional[Tensor] = None
    ssm_g: Optional[Tensor] = None             # kimi-k3: the KDA output gate (full rank)
    attn_res_score: Optional[Tensor] = None    # kimi-k3: cross-layer attention residual scores
    ffn_res_score: Optional[Tensor] = None
    ffn_routed_down: Optional[Tensor] = None   # kimi-k3: the routed experts' latent projections
    ffn_routed_up: Optional[Tensor] = None
    ffn_routed_norm: Optional[Tensor] = None
    # t5, t5encoder: the encoder's block (*_enc), the decoder's relative position bias and cross-attention
    attn_norm_enc: Optional[Tensor] = None
    attn_rel_b_enc: Optional[Tensor] = None
    wq_enc: Optional[Tensor] = None
    wk_enc: Optional[Tensor] = None
    wv_enc: Optional[Tensor] = None
    wo_enc: Optional[Tensor] = None
    ffn_norm_enc: Optional[Tensor] = None
    ffn_gate_enc: Optional[Tensor] = None
    ffn_down_enc: Optional[Tensor] = None
    ffn_up_enc: Optional[Tensor] = None
    attn_rel_b: Optional[Tensor] = None
    attn_norm_cross: Optional[Tensor] = None
    attn_rel_b_cross: Optional[Tensor] = None
    wq_cross: Optional[Tensor] = None
    wk_cross: Optional[Tensor] = None
    wv_cross: Optional[Tensor] = None
    wo_cross: Optional[Tensor] = None
    attn_norm_2: Optional[Tensor] = None       # RWKV: the time mix (attention) and channel mix (FFN)
    attn_norm_2_b: Optional[Tensor] = None
    time_mix_w0: Optional[Tensor] = None
    time_mix_w1: Optional[Tensor] = None
    time_mix_w2: Optional[Tensor] = None
    time_mix_a0: Optional[Tensor] = None
    time_mix_a1: Optional[Tensor] = None
    time_mix_a2: Optional[Tensor] = None
    time_mix_v0: Optional[Tensor] = None
    time_mix_v1: Optional[Tensor] = None
    time_mix_v2: Optional[Tensor] = None
    time_mix_g1: Optional[Tensor] = None
    time_mix_g2: Optional[Tensor] = None
    time_mix_lerp_x: Optional[Tensor] = None
    time_mix_lerp_w: Optional[Tensor] = None
    time_mix_lerp_k: Optional[Tensor] = None
    time_mix_lerp_v: Optional[Tensor] = None
    time_mix_lerp_r: Optional[Tensor] = None
    time_mix_lerp_g: Optional[Tensor] = None
    time_mix_lerp_fused: Optional[Tensor] = None
    time_mix_first: Optional[Tensor] = None
    time_mix_decay: Optional[Tensor] = None
    time_mix_decay_w1: Optional[Tensor] = None
    time_mix_decay_w2: Optional[Tensor] = None
    time_mix_key: Optional[Tensor] = None
    time_mix_key_b: Optional[Tensor] = None
    time_mix_value: Optional[Tensor] = None
    time_mix_value_b: Optional[Tensor] = None
    time_mix_receptance: Optional[Tensor] = None
    time_mix_receptance_b: Optional[Tensor] = None
    time_mix_gate: Optional[Tensor] = None
    time_mix_k_k: Optional[Tensor] = None
    time_mix_k_a: Optional[Tensor] = None
    time_mix_r_k: Optional[Tensor] = None
    time_mix_ln: Optional[Tensor] = None
    time_mix_ln_b: Optional[Tensor] = None
    time_mix_output: Optional[Tensor] = None
    channel_mix_lerp_k: Optional[Tensor] = None
    channel_mix_lerp_r: Optional[Tensor] = None
    channel_mix_key: Optional[Tensor] = None
    channel_mix_value: Optional[Tensor] = None
    channel_mix_receptance: Optional[Tensor] = None
    wo_s: Optional[Tensor] = None              # per-tensor output scales (the generic ".scale" pass: talkie)
    wq_s: Optional[Tensor] = None              # per-tensor weight scales build_qkv and build_ffn apply (bitnet)
    wk_s: Optional[Tensor] = None
    wv_s: Optional[Tensor] = None
    wqkv_s: Optional[Tensor] = None
    ffn_gate_s: Optional[Tensor] = None
    ffn_up_s: Optional[Tensor] = None
    attn_sub_norm: Optional[Tensor] = None     # bitnet: norms before wo and ffn_down
    ffn_sub_norm: Optional[Tensor] = None
    ffn_down_s: Optional[Tensor] = None
    ffn_down_exps_s: Optional[Tensor] = None   # per-expert output scales (llama_model_base's generic ".scale" pass)
    ffn_gate_inp_s: Optional[Tensor] = None    # gemma4: the router's input scale, its expert and dense FFN norms
    ffn_pre_norm_2: Optional[Tensor] = None
    ffn_post_norm_1: Optional[Tensor] = None
    ffn_post_norm_2: Optional[Tensor] = None
    out_scale: Optional[Tensor] = None
    per_layer_inp_gate: Optional[Tensor] = None   # per-layer token embeddings (gemma4 E2B/E4B)
    per_layer_proj: Optional[Tensor] = None
    per_layer_post_norm: Optional[Tensor] = None
    altup_correct_coef: Optional[Tensor] = None   # gemma3n: AltUp's router, prediction and correction; LAuReL
    altup_correct_scale: Optional[Tensor] = None
    altup_predict_coef: Optional[Tensor] = None
    altup_router: Optional[Tensor] = None
    altup_router_norm: Optional[Tensor] = None
    laurel_l: Optional[Tensor] = None
    laurel_r: Optional[Tensor] = None
    laurel_post_norm: Optional[Tensor] = None
    wkv: Optional[Tensor] = None               # DeepSeek-V4: one K=V projection, grouped low-rank output
    attn_kv_norm: Optional[Tensor] = None
    wo_a: Optional[Tensor] = None
    wo_b: Optional[Tensor] = None
    hc_attn_fn: Optional[Tensor] = None        # DeepSeek-V4 hyper-connections: stream mixing per sublayer
    hc_attn_base: Optional[Tensor] = None
    hc_attn_scale: Optional[Tensor] = None
    hc_ffn_fn: Optional[Tensor] = None
    hc_ffn_base: Optional[Tensor] = None
    hc_ffn_scale: Optional[Tensor] = None
    attn_comp_wkv: Optional[Tensor] = None     # DeepSeek-V4 KV compressors (attention, lightning indexer)
    attn_comp_wgate: Optional[Tensor] = None
    attn_comp_ape: Optional[Tensor] = None
    attn_comp_norm: Optional[Tensor] = None
    indexer_comp_wkv: Optional[Tensor] = None
    indexer_comp_wgate: Optional[Tensor] = None
    indexer_comp_ape: Optional[Tensor] = None
    indexer_comp_norm: Optional[Tensor] = None
    ffn_gate_tid2eid: Optional[Tensor] = None  # DeepSeek-V4 hash routing: experts by token id
    ffn_exp_probs_b_vl: Optional[Tensor] = None
    switch_lora: LayerSwitchLora = field(default_factory=LayerSwitchLora)
    # llama_layer::nextn, loaded with load_mtp (the MTP graph reads them)
    nextn_eh_proj: Optional[Tensor] = None
    nextn_enorm: Optional[Tensor] = None
    nextn_hnorm: Optional[Tensor] = None
    nextn_embed_tokens: Optional[Tensor] = None
    nextn_shared_head_head: Optional[Tensor] = None
    nextn_shared_head_norm: Optional[Tensor] = None
    hc_attn_norm: Optional[Tensor] = None          # hyper-connection mixers (qwen4exp)
    hc_attn_down: Optional[Tensor] = None
    hc_attn_up: Optional[Tensor] = None
    hc_attn_inject: Optional[Tensor] = None
    hc_ffn_norm: Optional[Tensor] = None
    hc_ffn_down: Optional[Tensor] = None
    hc_ffn_up: Optional[Tensor] = None
    hc_ffn_inject: Optional[Tensor] = None
    indexer_q_proj: Optional[Tensor] = None        # qwen4exp's QSA indexer
    indexer_k_proj: Optional[Tensor] = None
    indexer_q_norm: Optional[Tensor] = None
    ple_key: Optional[Tensor] = None               # qwen4exp's PLE n-gram embedding layer
    ple_value: Optional[Tensor] = None
    ple_norm_key: Optional[Tensor] = None
    ple_norm_query: Optional[Tensor] = None
    dflash_attn_conv_base: Optional[Tensor] = None   # DFlash2: the dynamic convolutions around attention
    dflash_attn_conv_proj: Optional[Tensor] = None   # and the FFN (static taps and their projection)
    dflash_ffn_conv_base: Optional[Tensor] = None
    dflash_ffn_conv_proj: Optional[Tensor] = None
    ple_norm_conv: Optional[Tensor] = None
    ple_conv1d: Optional[Tensor] = None
    posnet: LayerPosnet = field(default_factory=LayerPosnet)
    convnext: LayerConvnext = field(default_factory=LayerConvnext)

    def __init__(self) -> None:
        self.switch_lora, self.posnet, self.convnext = LayerSwitchLora(), LayerPosnet(), LayerConvnext()


@dataclass
class Model:
    hparams: HParams
    tok_embd: Optional[Tensor] = None
    tok_norm: Optional[Tensor] = None               # RWKV's LN0 after the embeddings
    tok_norm_b: Optional[Tensor] = None
    conv1d: Optional[Tensor] = None                 # wavtokenizer-dec's input convolution
    conv1d_b: Optional[Tensor] = None
    pos_embd: Optional[Tensor] = None               # learned positions (starcoder, gpt2, ...)
    type_embd: Optional[Tensor] = None              # BERT's token-type rows
    cls: Optional[Tensor] = None                    # build_pooling's classification (rank) head
    cls_b: Optional[Tensor] = None
    cls_out: Optional[Tensor] = None
    cls_out_b: Optional[Tensor] = None
    cls_norm: Optional[Tensor] = None
    dense_2_out_layers: Optional[Tensor] = None     # build_dense_out: sentence-transformers' dense modules
    dense_2_out_layers_b: Optional[Tensor] = None
    dense_3_out_layers: Optional[Tensor] = None
    output_norm: Optional[Tensor] = None
    output_norm_b: Optional[Tensor] = None
    output_norm_enc: Optional[Tensor] = None        # an encoder's output norm (neo-bert)
    output: Optional[Tensor] = None
    output_b: Optional[Tensor] = None
    per_layer_tok_embd: Optional[Tensor] = None     # gemma3n, gemma4 E2B/E4B
    altup_proj: Optional[Tensor] = None             # gemma3n: the AltUp streams' projections in and out
    altup_unembd_proj: Optional[Tensor] = None
    per_layer_model_proj: Optional[Tensor] = None
    per_layer_proj_norm: Optional[Tensor] = None
    output_norm_enc: Optional[Tensor] = None        # t5, t5encoder: the encoder's final norm
    output_res_score: Optional[Tensor] = None       # kimi-k3: the final residual mix's scores
    hc_head_fn: Optional[Tensor] = None             # DeepSeek-V4: the hyper-connection streams merged for the head
    hc_head_base: Optional[Tensor] = None
    hc_head_scale: Optional[Tensor] = None
    hrm_z_l_init: Optional[Tensor] = None            # hrm_text: the low stack's learned initial state
    hc_head_norm: Optional[Tensor] = None           # qwen4exp: the last hyper-connection mixer
    hc_head_down: Optional[Tensor] = None
    hc_head_up: Optional[Tensor] = None
    fc: Optional[Tensor] = None                     # eagle3: the target features' fusion, and its input norm
    output_norm_enc: Optional[Tensor] = None
    d2t: Optional[Tensor] = None                    # eagle3: draft-to-target token ids (I64)
    dspark_markov_w1: Optional[Tensor] = None       # DSpark: the Markov head and the confidence head
    dspark_markov_w2: Optional[Tensor] = None
    dspark_markov_w2_s: Optional[Tensor] = None
    dspark_conf_proj: Optional[Tensor] = None
    dspark_conf_proj_b: Optional[Tensor] = None
    dflash_selector_prev: Optional[Tensor] = None   # DFlash2: the candidate selector's codebooks
    dflash_selector_next: Optional[Tensor] = None
    dflash_selector_hidden: Optional[Tensor] = None
    nextn_proj_pre: Optional[Tensor] = None         # gemma4-assistant: the target's embedding and state in,
    nextn_proj_post: Optional[Tensor] = None        # and the next hidden state out at the target's width
    layers: list[Layer] = field(default_factory=list)         # the n_layer layers the graph runs
    layers_nextn: list[Layer] = field(default_factory=list)   # layers[n_layer:n_layer_all] in llama.cpp
    buffers: list[Buffer] = field(default_factory=list)   # in creation order
    tensors_by_name: dict[str, Tensor] = field(default_factory=dict)   # llama_model::get_tensor's (the first of a name)

    def get_rope_factors(self, n_ctx_seq: int, il: int) -> Optional[Tensor]:
        """llama_model::get_rope_factors: rope_freqs, else long or short factors by context size."""
        layer = self.layers[il]
        if layer.rope_freqs is not None:
            return layer.rope_freqs
        return layer.rope_long if n_ctx_seq > self.hparams.n_ctx_orig_yarn else layer.rope_short


# --- hyperparameters ---------------------------------------------------------------------------------

def require(ml: ModelLoader, ok: bool, what: str) -> None:
    """A GGML_ASSERT of the loader: llama.cpp would abort on this header, so the plan refuses it."""
    if not ok:
        ml.fail(f"llama.cpp would abort loading this model: {what}")


def load_hparams(ml: ModelLoader) -> HParams:
    """llama_model_base::load_hparams: the keys every architecture shares, then load_arch_hparams."""
    arch = models.arch_module(ml)
    hp = HParams(ml.arch)
    hp.n_vocab = ml.n_tokens()
    hp.n_token_types = ml.get_u32("tokenizer.ggml.token_type_count", 0)
    hp.n_ctx_train = ml.get_u32("%s.context_length")
    hp.n_embd = ml.get_u32("%s.embedding_length")
    hp.n_embd_out_impl = ml.get_u32("%s.embedding_length_out", 0)
    hp.causal_attn = ml.get_bool("%s.attention.causal", True)
    # enum llama_pooling_type read from a uint32_t (llama_model_loader::get_key's overload)
    hp.pooling_type = ml.get_i32_from_u32("%s.pooling_type", LLAMA_POOLING_TYPE_UNSPECIFIED)
    hp.pooling_type_cls = ml.get_i32_from_u32("%s.classifier.pooling_type", LLAMA_POOLING_TYPE_UNSPECIFIED)
    n_layer = ml.get_u32("%s.block_count")     # n_layer_all: per-layer arrays have this many entries
    require(ml, 0 < n_layer <= LLAMA_MAX_LAYERS,
            f"{ml.key('%s.block_count')} is {n_layer}, must be in 1..{LLAMA_MAX_LAYERS} (LLAMA_MAX_LAYERS)")
    hp.n_layer_all = n_layer
    hp.n_layer_nextn = ml.get_u32("%s.nextn_predict_layers", 0)
    require(ml, hp.n_layer_nextn <= n_layer, f"{ml.key('%s.nextn_predict_layers')} is {hp.n_layer_nextn}, more than "
            f"the {n_layer} blocks (llama.cpp asserts n_layer_nextn <= n_layer_all)")
    hp.n_layer = n_layer - hp.n_layer_nextn
    hp.n_expert = ml.get_u32("%s.expert_count", 0)
    hp.n_expert_used_arr = ml.get_key_or_arr("%s.expert_used_count", n_layer, 0)
    hp.n_expert_groups = ml.get_u32("%s.expert_group_count", 0)
    hp.n_group_used = ml.get_u32("%s.expert_group_used_count", 0)
    if ml.arch in ("hunyuan_vl", "hunyuan-dense") and hp.n_expert <= 1:   # a single "expert" is no MoE
        hp.n_expert = 0
        hp.n_expert_used_arr = (0,) * n_layer
    if ml.arch == "wavtokenizer-dec":   # its embedding width is features_length; embedding_length is its output's
        hp.n_embd = ml.get_u32("%s.features_length")
        hp.n_embd_out_impl = ml.get_u32("%s.embedding_length")
        hp.posnet_n_embd = ml.get_u32("%s.posnet.embedding_length")
        hp.posnet_n_layer = ml.get_u32("%s.posnet.block_count")
        hp.convnext_n_embd = ml.get_u32("%s.convnext.embedding_length")
        hp.convnext_n_layer = ml.get_u32("%s.convnext.block_count")
        require(ml, hp.posnet_n_layer <= n_layer and hp.convnext_n_layer <= n_layer,
                f"{ml.key('%s.posnet.block_count')} ({hp.posnet_n_layer}) and {ml.key('%s.convnext.block_count')} "
                f"({hp.convnext_n_layer}) must not exceed {ml.key('%s.block_count')} ({n_layer})")
    check_experts(ml, hp)

    hp.n_ff_arr = ml.get_key_or_arr("%s.feed_forward_length", n_layer, 0)
    hp.n_head_arr = ml.get_key_or_arr("%s.attention.head_count", n_layer, 0)
    hp.n_head_kv_arr = ml.get_key_or_arr("%s.attention.head_count_kv", n_layer, 0) \
        if ml.has("%s.attention.head_count_kv") else hp.n_head_arr

    hp.n_ctx_orig_yarn = ml.get_u32("%s.rope.scaling.original_context_length", hp.n_ctx_train)
    hp.rope_freq_base_train = ml.get_f32("%s.rope.freq_base", 10000.0)
    scaling = ml.get_str("%s.rope.scaling.type", "linear")
    require(ml, scaling in LLAMA_ROPE_SCALING_TYPES,
            f"{ml.key('%s.rope.scaling.type')} is '{shown(scaling)}' (known: {', '.join(LLAMA_ROPE_SCALING_TYPES)})")
    hp.rope_scaling_type_train = LLAMA_ROPE_SCALING_TYPES[scaling]

    if hp.n_head() > 0:
        hp.n_embd_head_k_full = ml.get_u32("%s.attention.key_length", hp.n_embd // hp.n_head())
        hp.n_embd_head_v_full = ml.get_u32("%s.attention.value_length", hp.n_embd // hp.n_head())
        hp.n_rot_full = ml.get_u32("%s.rope.dimension_count", hp.n_embd_head_k_full)
        if ml.arch in ("llama", "falcon", "llama-embed") and hp.n_rot_full != hp.n_embd_head_k_full:
            ml.fail(f"invalid n_rot: {hp.n_rot_full}, expected {hp.n_embd_head_k_full}")
    hp.n_embd_head_k_swa = ml.get_u32("%s.attention.key_length_swa", hp.n_embd_head_k_full)
    hp.n_embd_head_v_swa = ml.get_u32("%s.attention.value_length_swa", hp.n_embd_head_v_full)
    hp.n_rot_swa = ml.get_u32("%s.rope.dimension_count_swa", hp.n_rot_full)
    hp.is_swa_arr = (False,) * n_layer
    # for classifier models: as many outputs as labels
    n_labels = ml.get_arr_n_str("%s.classifier.output_labels")
    if n_labels > 0:
        hp.n_cls_out = n_labels

    try:
        arch.load_arch_hparams(ml, hp)
    except ZeroDivisionError:
        # where llama.cpp's float math gives an infinity (1/sqrt of a zero head size: gemma2,
        # gemma3), Python raises; a zero head count or head size is what check_hparams refuses
        check_hparams(ml, hp)
        raise
    # llama_model_rope_type: a constant, or for a few architectures a choice on the hparams
    hp.rope_type = arch.LLAMA_ROPE_TYPE(hp) if callable(arch.LLAMA_ROPE_TYPE) else arch.LLAMA_ROPE_TYPE
    check_hparams(ml, hp)
    return hp


def check_experts(ml: ModelLoader, hp: HParams) -> None:
    """load_hparams' GGML_ASSERTs on the expert counts (per-layer used counts: their maximum)."""
    n_used, count = hp.n_expert_used_max(), ml.key("%s.expert_count")
    require(ml, hp.n_expert <= LLAMA_MAX_EXPERTS, f"{count} is {hp.n_expert}, above LLAMA_MAX_EXPERTS ({LLAMA_MAX_EXPERTS})")
    require(ml, n_used <= hp.n_expert, f"{ml.key('%s.expert_used_count')} is {n_used}, above {count} ({hp.n_expert})")
    if hp.n_expert > 0:
        require(ml, n_used > 0, f"{ml.key('%s.expert_used_count')} is 0 with {hp.n_expert} experts")
        require(ml, hp.n_expert_groups < hp.n_expert,
                f"{ml.key('%s.expert_group_count')} is {hp.n_expert_groups}, not below {count} ({hp.n_expert})")
        if hp.n_expert_groups > 1:
            require(ml, hp.n_expert % hp.n_expert_groups == 0 and 0 < hp.n_group_used < hp.n_expert_groups,
                    f"{hp.n_expert_groups} expert groups must divide {hp.n_expert} experts and "
                    f"{ml.key('%s.expert_group_used_count')} ({hp.n_group_used}) must be between 1 and the groups")
    else:
        require(ml, n_used == 0 and hp.n_expert_groups == 0,
                f"{ml.key('%s.expert_used_count')} or {ml.key('%s.expert_group_count')} set without experts")


def require_head_sizes_equal(ml: ModelLoader, hp: HParams) -> None:
    """The GGML_ASSERTs most graph builders start with: n_embd_head_v == n_embd_head_k == n_rot."""
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k() == hp.n_rot(),
            f"the {ml.arch} graph needs equal head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()}) "
            f"and rope dimensions ({hp.n_rot()})")


def require_equal_head_sizes(ml: ModelLoader, hp: HParams) -> None:
    """The GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()) of graphs without that rope check (the
    BERT family's and other encoders')."""
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {hp.arch} graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


# llama_expert_gating_func_type values build_moe_ffn knows: softmax, sigmoid, softmax_weight,
# sqrt_softplus; anything else (NONE where the key is absent) is its GGML_ABORT
GATING_FUNCS = (1, 2, 3, 4)


def require_gating_func(ml: ModelLoader, hp: HParams) -> None:
    require(ml, hp.expert_gating_func in GATING_FUNCS,
            f"{ml.key('%s.expert_gating_func')} is {hp.expert_gating_func}, not a gating function (1-4)")


def load_swa_pattern(ml: ModelLoader, hp: HParams, n_pattern: int, dense_first: bool = False) -> None:
    """llama_model_base::load_swa_pattern: attention.sliding_window_pattern as one flag per layer,
    or as a period (default n_pattern) expanded by set_swa_pattern."""
    if ml.is_array("%s.attention.sliding_window_pattern"):
        flags = ml.get_arr("%s.attention.sliding_window_pattern", (BOOL, UINT32, INT32))
        hp.is_swa_arr = tuple(il < len(flags) and bool(flags[il]) for il in range(hp.n_layer_all))
        return
    hp.set_swa_pattern(ml.get_u32("%s.attention.sliding_window_pattern", n_pattern), dense_first)


def check_hparams(ml: ModelLoader, hp: HParams) -> None:
    """Values llama.cpp accepts and then cannot build a graph from (a division by zero, an empty
    head): refused here, before any per-layer structure is built from them."""
    require(ml, hp.n_embd > 0, f"{ml.key('%s.embedding_length')} is 0")
    for il in range(hp.n_layer):
        if hp.is_recr(il):
            continue   # a recurrent layer's sizes are its own (ssm.*, shortconv.*): no KV heads, maybe no FFN
        # expert FFNs are sized by expert_feed_forward_length (Qwen3.5 MoE headers carry no dense one)
        require(ml, not hp.has_ffn(il) or hp.n_ff(il) > 0 or hp.n_expert > 0,
                f"{ml.key('%s.feed_forward_length')} is 0 for layer {il}")
        if not hp.has_attn(il):
            continue
        require(ml, hp.n_head(il) > 0, f"{ml.key('%s.attention.head_count')} is 0 for layer {il}")
        require(ml, 0 < hp.n_head_kv(il) <= hp.n_head(il) and hp.n_head(il) % hp.n_head_kv(il) == 0,
                f"{ml.key('%s.attention.head_count_kv')} is {hp.n_head_kv(il)} for layer {il}: "
                f"it must divide the head count {hp.n_head(il)}")
        require(ml, hp.n_embd_head_k(il) > 0 and hp.n_embd_head_v(il) > 0,
                f"the head size of layer {il} is 0 (key_length/value_length)")
        if hp.arch == "glm5-next":
            continue   # nope-only MLA: its graph asserts that the rope dimension count is 0
        # n_rot 0 is built (a rope over no dimension): PLaMo 2's first layer has no heads, so
        # load_hparams leaves n_rot 0 for every layer
        require(ml, 0 <= hp.n_rot(il) <= hp.n_embd_head_k(il) and hp.n_rot(il) % 2 == 0,
                f"rope dimension count {hp.n_rot(il)} of layer {il} must be even and at most the head "
                f"size {hp.n_embd_head_k(il)}")


# --- tensors -----------------------------------------------------------------------------------------

# llama_model_loader::lazy_read::add under LLAMA_LAZY_MODE_AUTO (llama_model_default_params; every
# planned device supports mmap, so AUTO stays): a TENSOR_READ_LAZY tensor above this is read lazily
LAZY_AUTO_MIN_SIZE = 4 << 30


# Placement: the buffer type of a weight (tensor, GGUF name, op that uses it, layer: -1 input,
# n_layer output, else its block)
Placement = Callable[[Tensor, str, str, int], "BufferType"]


@dataclass
class TensorCreator:
    """llama_model_base::create_tensor over the loader: shape checks, buffer-type contexts,
    duplicated tensors, and done_getting_tensors' count."""
    ml: ModelLoader
    hparams: HParams
    place: Placement
    # the buffer type of tensors read lazily (llama_model_loader::lazy_read::buft); None: placed as the others
    lazy_buft: Optional[BufferType] = None
    ctx: dict = field(default_factory=dict)        # buft name -> (buft, [tensors]) in creation order
    lazy_ctx: dict = field(default_factory=dict)   # the same for the lazily read tensors (ctx_key.lazy)
    n_created: int = 0
    load_mtp: bool = False                          # llama_model_loader::load_mtp: the NextN blocks are loaded

    def mtp_flags(self) -> int:
        """The NextN blocks' create_tensor flags: skipped unless load_mtp."""
        return 0 if self.load_mtp else TENSOR_SKIP

    def create_tensor(self, t: TN, ne: tuple[int, ...], flags: int = 0) -> Optional[Tensor]:
        allow_reshape = bool(flags & TENSOR_ALLOW_RESHAPE)
        info = self.ml.check_tensor_dims(t.name, ne, not flags & TENSOR_NOT_REQUIRED, allow_reshape)
        if info is None:
            return None
        if flags & TENSOR_SKIP:   # "model has unused tensor ... -- ignoring" (llama-model-loader.cpp:1178)
            self.n_created += 1
            return None
        tensor_kind = "OUTPUT" if t.tensor == "TOKEN_EMBD" and flags & TENSOR_DUPLICATED else t.tensor
        _, layer, op = LLM_TENSOR_INFOS[tensor_kind]
        if t.name.endswith(".bias"):   # biases are added, to expert outputs by id
            op = "ADD_ID" if op == "MUL_MAT_ID" else "ADD"
        elif self.hparams.router_layer >= 0 and t.name.endswith((".lora_a", ".lora_b")):
            op = "MUL_MAT_ID"          # embedded adapters, picked per token (llama-model-loader.cpp:1193)
        il = -1 if layer == LAYER_INPUT else self.hparams.n_layer_all if layer == LAYER_OUTPUT else t.bid
        w = ggml.new_tensor(info.type, *info.ne)
        if allow_reshape:   # the tensor takes the shape asked for: GGML_ASSERT(ggml_nbytes(&t_meta) == ggml_nbytes(cur))
            meta = ggml.new_tensor(info.type, *ne)
            if ne[0] % ggml.blck_size(info.type) != 0 or meta.nbytes != w.nbytes:
                self.ml.fail(f"llama.cpp would abort loading this model (GGML_ASSERT in create_tensor): tensor "
                             f"'{t.name}' of shape {list(info.ne)} viewed as {list(ne)} does not keep its size")
            w = meta
        w.name = t.name
        ctx = self.ctx
        if flags & TENSOR_READ_LAZY and self.lazy_buft is not None and w.nbytes > LAZY_AUTO_MIN_SIZE:
            # a context of its own on the CPU, whatever the layer's device and the overrides
            buft, ctx = self.lazy_buft, self.lazy_ctx
        else:
            buft = self.place(w, t.name, op, il)
        tensors = ctx.setdefault(buft.name, (buft, []))[1]
        if flags & TENSOR_DUPLICATED:
            for original in tensors:
                if original.name == t.name:
                    return original
        else:
            self.n_created += 1
        tensors.append(w)
        return w

    def create_tensor_qkv(self, layer: Layer, bid: int, n_embd: int, n_embd_q: int, n_embd_k: int,
                          n_embd_v: int, flags: int = 0) -> None:
        """llama_model_base::create_tensor_qkv: a fused attn_qkv if present, else Q, K, V."""
        n_embd_qkv = n_embd_q + n_embd_k + n_embd_v
        if flags & TENSOR_SKIP:
            skip = TENSOR_NOT_REQUIRED | TENSOR_SKIP
            for name, suffix, ne in (("ATTN_QKV", "weight", (n_embd, n_embd_qkv)), ("ATTN_QKV", "bias", (n_embd_qkv,)),
                                     ("ATTN_Q", "weight", (n_embd, n_embd_q)), ("ATTN_K", "weight", (n_embd, n_embd_k)),
                                     ("ATTN_V", "weight", (n_embd, n_embd_v)), ("ATTN_Q", "bias", (n_embd_q,)),
                                     ("ATTN_K", "bias", (n_embd_k,)), ("ATTN_V", "bias", (n_embd_v,))):
                self.create_tensor(tn(name, suffix, bid), ne, skip)
            return
        layer.wqkv = self.create_tensor(tn("ATTN_QKV", "weight", bid), (n_embd, n_embd_qkv), TENSOR_NOT_REQUIRED)
        if layer.wqkv is not None:
            layer.bqkv = self.create_tensor(tn("ATTN_QKV", "bias", bid), (n_embd_qkv,), TENSOR_NOT_REQUIRED)
            if layer.bqkv is None:
                self._qkv_biases(layer, bid, n_embd_q, n_embd_k, n_embd_v)
            return
        layer.wq = self.create_tensor(tn("ATTN_Q", "weight", bid), (n_embd, n_embd_q), flags)
        layer.wk = self.create_tensor(tn("ATTN_K", "weight", bid), (n_embd, n_embd_k), flags)
        layer.wv = self.create_tensor(tn("ATTN_V", "weight", bid), (n_embd, n_embd_v), flags)
        self._qkv_biases(layer, bid, n_embd_q, n_embd_k, n_embd_v)

    def _qkv_biases(self, layer: Layer, bid: int, n_embd_q: int, n_embd_k: int, n_embd_v: int) -> None:
        layer.bq = self.create_tensor(tn("ATTN_Q", "bias", bid), (n_embd_q,), TENSOR_NOT_REQUIRED)
        layer.bk = self.create_tensor(tn("ATTN_K", "bias", bid), (n_embd_k,), TENSOR_NOT_REQUIRED)
        layer.bv = self.create_tensor(tn("ATTN_V", "bias", bid), (n_embd_v,), TENSOR_NOT_REQUIRED)

    def create_tensor_gate_up_exps(self, layer: Layer, bid: int, n_embd: int, n_ff: int, n_expert: int,
                                   flags: int = 0) -> None:
        """llama_model_base::create_tensor_gate_up_exps: merged gate_up experts if present, else gate and up."""
        if flags & TENSOR_SKIP:
            skip = TENSOR_NOT_REQUIRED | TENSOR_SKIP
            self.create_tensor(tn("FFN_GATE_UP_EXPS", "weight", bid), (n_embd, n_ff * 2, n_expert), skip)
            self.create_tensor(tn("FFN_GATE_EXPS", "weight", bid), (n_embd, n_ff, n_expert), skip)
            self.create_tensor(tn("FFN_UP_EXPS", "weight", bid), (n_embd, n_ff, n_expert), skip)
            return
        layer.ffn_gate_up_exps = self.create_tensor(tn("FFN_GATE_UP_EXPS", "weight", bid), (n_embd, n_ff * 2, n_expert),
                                                    TENSOR_NOT_REQUIRED)
        if layer.ffn_gate_up_exps is None:
            layer.ffn_gate_exps = self.create_tensor(tn("FFN_GATE_EXPS", "weight", bid), (n_embd, n_ff, n_expert), flags)
            layer.ffn_up_exps = self.create_tensor(tn("FFN_UP_EXPS", "weight", bid), (n_embd, n_ff, n_expert), flags)

    def mtp_only(self) -> bool:
        """A file of the NextN blocks alone (convert_hf_to_gguf.py --mtp): the loaders' probe, no
        trunk layer 0; its trunk tensors are then not required."""
        return self.hparams.n_layer_nextn > 0 and self.ml.get_weight("blk.0.attn_norm.weight") is None

    def trunk_only(self) -> bool:
        """A file without the NextN blocks (the deepseek2/glm4moe probe): theirs are then not required."""
        return (self.hparams.n_layer_nextn > 0
                and self.ml.get_weight(f"blk.{self.hparams.n_layer}.nextn.eh_proj.weight") is None)

    def create_nextn(self, bid: int, flags: int, layer: Optional[Layer] = None) -> None:
        """A NextN block's own tensors (llama_layer::nextn): eh_proj, enorm, hnorm, and the
        optional embed_tokens and shared head; kept in `layer` for the MTP graph."""
        n_embd, n_vocab = self.hparams.n_embd, self.hparams.n_vocab
        layer = layer if layer is not None else Layer()
        layer.nextn_eh_proj = self.create_tensor(tn("NEXTN_EH_PROJ", "weight", bid), (2 * n_embd, n_embd), flags)
        layer.nextn_enorm = self.create_tensor(tn("NEXTN_ENORM", "weight", bid), (n_embd,), flags)
        layer.nextn_hnorm = self.create_tensor(tn("NEXTN_HNORM", "weight", bid), (n_embd,), flags)
        layer.nextn_embed_tokens = self.create_tensor(tn("NEXTN_EMBED_TOKENS", "weight", bid), (n_embd, n_vocab),
                                                      TENSOR_NOT_REQUIRED | flags)
        layer.nextn_shared_head_head = self.create_tensor(tn("NEXTN_SHARED_HEAD_HEAD", "weight", bid),
                                                          (n_embd, n_vocab), TENSOR_NOT_REQUIRED | flags)
        layer.nextn_shared_head_norm = self.create_tensor(tn("NEXTN_SHARED_HEAD_NORM", "weight", bid), (n_embd,),
                                                          TENSOR_NOT_REQUIRED | flags)

    def create_output(self, model: Model, n_embd: int, n_vocab: int, n_vocab_out: Optional[int] = None) -> None:
        """The output head most builders share: output_norm, output (n_vocab_out rows where the head is
        narrower than the vocabulary: qwen3tts) or the tied token_embd."""
        model.output_norm = self.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
        model.output = self.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab if n_vocab_out is None else n_vocab_out),
                                          TENSOR_NOT_REQUIRED)
        if model.output is None:
            model.output = self.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)

    def done_getting_tensors(self) -> None:
        n_tensors = self.ml.n_tensors
        if self.n_created > n_tensors:   # a skipped tensor asked for twice (a duplicated one of a NextN layer)
            self.ml.fail(f"too many tensors created; expected {n_tensors}, got {self.n_created}")
        if self.n_created != n_tensors:
            used = {t.name for _, ts in self.ctx.values() for t in ts}
            # the first few unused names, without a copy of every name (a file may hold 10^5 of them)
            unused = heapq.nsmallest(4, (name for name in self.ml.tensor_names() if name not in used))
            self.ml.fail(f"wrong number of tensors; expected {n_tensors}, got {self.n_created}"
                         + (f" (not used by the {self.ml.arch} loader: {', '.join(unused[:3])}"
                            f"{', ...' if len(unused) > 3 else ''})" if unused else ""))


def load_tensors(ml: ModelLoader, hp: HParams, place: Placement, lazy_buft: Optional[BufferType] = None,
                 load_mtp: bool = False) -> Model:
    """llama_model_base::load_tensors: the arch's tensors, then one buffer per buffer-type context
    (the lazily read tensors' contexts last, as ctx_map orders them)."""
    model = Model(hp, layers=[Layer() for _ in range(hp.n_layer)],
                  layers_nextn=[Layer() for _ in range(hp.n_layer_nextn)])
    creator = TensorCreator(ml, hp, place, lazy_buft, load_mtp=load_mtp)
    models.arch_module(ml).load_arch_tensors(creator, model)
    creator.done_getting_tensors()
    if creator.mtp_only() and not any(isinstance(w, Tensor) for w in vars(model.layers[0]).values()):
        # the loaders that probe for it take it (the trunk's tensors turn optional; elsewhere they
        # are required and the load has failed already); the main graph then reads the missing
        # trunk weights and llama.cpp crashes (SIGSEGV) before reserving
        ml.fail("the file holds only the multi-token-prediction blocks (no blk.0.attn_norm.weight, a --mtp "
                "conversion): llama.cpp loads it but crashes building the main graph; it is a draft model")
    model.buffers = [b for ctx in (creator.ctx, creator.lazy_ctx) for buft, tensors in ctx.values()
                     for b in _alloc_weights(ml, buft, tensors)]
    for ctx in (creator.ctx, creator.lazy_ctx):
        for _, tensors in ctx.values():
            for t in tensors:
                model.tensors_by_name.setdefault(t.name, t)
    return model


def _alloc_weights(ml: ModelLoader, buft: BufferType, tensors: list[Tensor]) -> list[Buffer]:
    """Mapped buffer types get one buffer per file, covering the file range of their tensors
    there (get_mapping_range); others one buffer, as ggml_backend_alloc_ctx_tensors_from_buft makes."""
    if not buft.name.endswith("_Mapped"):
        return [alloc_ctx_tensors(buft, tensors, usage="weights")]
    buffers = []
    weights = {t.name: ml.get_weight(t.name) for t in tensors}
    for idx in range(len(ml.files)):
        in_file = [t for t in tensors if weights[t.name].idx == idx]
        if not in_file:
            continue
        buf = Buffer(buft, "weights")
        offs = {t.name: weights[t.name].offs for t in in_file}
        first = min(offs.values())
        buf.size = max(offs[t.name] + t.nbytes for t in in_file) - first
        for t in in_file:
            t.buffer, t.offset = buf, offs[t.name] - first
        buffers.append(buf)
    return buffers
