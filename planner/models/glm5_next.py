"""LLM_ARCH_GLM5_NEXT (src/models/glm5-next.cpp): GLM5-Next (GLM-5.3-Flash).

A hybrid of Kimi Delta Attention layers (recurrent state; kimi-k3's KDA layer with kimi-linear's
low-rank output gate) and rope-less multi-head latent attention layers (K-only latent cache) with
DeepSeek sparse attention over pools of keys: a lightning indexer scores pools of kpool consecutive
positions (each pooled by a softmax gate over its members' keys, cached beside them) and the
attention sees the cells of the top pools plus the incomplete last pool; "shared" indexer layers
reuse the selection of the full one before them. Small ubatches (at most 16 tokens, more cells than
selected) gather the selected latents and attend over them alone; larger ones attend the whole cache
under a mask built by scattering the selection. DeepSeek-V4's hyper-connections (4 residual
streams, the fused DSV4_HC_* ops unless the probes turn them off; planner/models/deepseek4.py
builds both), their mean before the head. DeepSeek-style experts with a clamped SwiGLU, shared
experts, leading dense layers. The NextN block is loaded, never run.
Memory: llama_memory_hybrid_idx (planner/memory_hybrid_idx.py).
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLAbort, Tensor
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..memory_hybrid_idx import MemoryHybridIdx
from ..model import Layer, Model, TensorCreator, require
from ..model_loader import TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn
from .deepseek4 import build_hc_post, build_hc_pre_mix
from .kimi_k3 import build_kda, require_both_kinds
from .kimi_linear import _create_4d_or_3d

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE

LLAMA_EXPERT_GATING_FUNC_TYPE_NONE, LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID = 0, 2
GATHER_MAX_UBATCH = 16   # build_inp_kpool's max_ub


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon", hp.f_norm_eps)
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla")
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla")
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.ssm_d_conv = ml.get_u32("%s.ssm.conv_kernel")
    hp.n_embd_head_kda = ml.get_u32("%s.kda.head_dim")
    hp.kda_gate_lower_bound = ml.get_f32("%s.kda.gate_lower_bound", float("-inf"))
    # the MLA cache holds the compressed latent
    hp.n_embd_head_v_full = hp.n_lora_kv
    # the KDA layers are those without KV heads (the NextN block has one)
    hp.is_recr_arr = tuple(hp.n_head_kv(il) == 0 for il in range(hp.n_layer_all))
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", LLAMA_EXPERT_GATING_FUNC_TYPE_NONE)
    if hp.expert_gating_func == LLAMA_EXPERT_GATING_FUNC_TYPE_NONE:
        hp.expert_gating_func = LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    if ml.has("%s.swiglu_clamp_exp"):
        hp.swiglu_clamp_exp = ml.get_key_or_arr_f32("%s.swiglu_clamp_exp", hp.n_layer_all)
    hp.swiglu_clamp_shexp = ml.get_key_or_arr_f32("%s.swiglu_clamp_shexp", hp.n_layer_all) \
        if ml.has("%s.swiglu_clamp_shexp") else hp.swiglu_clamp_exp
    # the DSA indexer over pools of keys
    hp.indexer_n_head = ml.get_u32("%s.attention.indexer.head_count")
    hp.indexer_head_size = ml.get_u32("%s.attention.indexer.key_length")
    hp.indexer_top_k = ml.get_u32("%s.attention.indexer.top_k")
    hp.indexer_kpool = ml.get_u32("%s.attention.indexer.kpool")
    hp.indexer_kpool_select_tail = ml.get_bool("%s.attention.indexer.kpool_select_tail", False)
    require(ml, hp.indexer_kpool > 1 and hp.indexer_top_k % hp.indexer_kpool == 0,
            f"GGML_ASSERT(indexer_kpool > 1 && indexer_top_k % indexer_kpool == 0): kpool {hp.indexer_kpool}, "
            f"top-k {hp.indexer_top_k}")
    full = (True,) * hp.n_layer
    if ml.has("%s.attention.indexer.types"):
        full = tuple(v != 0 for v in ml.get_key_or_arr("%s.attention.indexer.types", hp.n_layer))
    hp.is_indexer_full_arr = full
    # manifold-constrained hyper-connections
    hp.dsv4_hc_mult = ml.get_u32("%s.hyper_connection.count")
    hp.dsv4_hc_sinkhorn_iters = ml.get_u32("%s.hyper_connection.sinkhorn_iterations")
    hp.dsv4_hc_eps = ml.get_f32("%s.hyper_connection.epsilon")
    require(ml, hp.dsv4_hc_mult == 4, f"GGML_ASSERT(dsv4_hc_mult == 4): {hp.dsv4_hc_mult} hyper-connection streams "
                                      "(mHC with hc_mult != 4 is not supported)")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_head, n_expert = hp.n_embd, hp.n_vocab, hp.n_head(), hp.n_expert
    hc = hp.dsv4_hc_mult
    hc_mix_dim = (2 + hc) * hc
    mtp_flags = TENSOR_SKIP    # load_mtp is off: the NextN block is loaded but not kept
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers + model.layers_nextn):
        flags = mtp_flags if i >= hp.n_layer else 0
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        if i < hp.n_layer:
            layer.hc_attn_fn = c.create_tensor(tn("HC_ATTN_FN", "weight", i), (hc * n_embd, hc_mix_dim))
            layer.hc_attn_base = c.create_tensor(tn("HC_ATTN_BASE", "weight", i), (hc_mix_dim,))
            layer.hc_attn_scale = c.create_tensor(tn("HC_ATTN_SCALE", "weight", i), (3,))
            layer.hc_ffn_fn = c.create_tensor(tn("HC_FFN_FN", "weight", i), (hc * n_embd, hc_mix_dim))
            layer.hc_ffn_base = c.create_tensor(tn("HC_FFN_BASE", "weight", i), (hc_mix_dim,))
            layer.hc_ffn_scale = c.create_tensor(tn("HC_FFN_SCALE", "weight", i), (3,))
        head_dim, d_conv = hp.n_embd_head_kda, hp.ssm_d_conv
        d_inner = head_dim * n_head
        if hp.is_recr(i):
            layer.ssm_q_conv = _create_4d_or_3d(c, "SSM_CONV1D_Q", i, (d_conv, 1, d_inner))
            layer.ssm_k_conv = _create_4d_or_3d(c, "SSM_CONV1D_K", i, (d_conv, 1, d_inner))
            layer.ssm_v_conv = _create_4d_or_3d(c, "SSM_CONV1D_V", i, (d_conv, 1, d_inner))
            c.create_tensor_qkv(layer, i, n_embd, d_inner, d_inner, d_inner)
            layer.ssm_f_a = c.create_tensor(tn("SSM_F_A", "weight", i), (n_embd, head_dim))
            layer.ssm_f_b = c.create_tensor(tn("SSM_F_B", "weight", i), (head_dim, d_inner))
            layer.ssm_beta = c.create_tensor(tn("SSM_BETA", "weight", i), (n_embd, n_head))
            layer.ssm_a = c.create_tensor(tn("SSM_A_NOSCAN", None, i), (n_head,))
            layer.ssm_dt_b = c.create_tensor(tn("SSM_DT", "bias", i), (d_inner,))
            layer.ssm_g_a = c.create_tensor(tn("SSM_G_A", "weight", i), (n_embd, head_dim))
            layer.ssm_g_b = c.create_tensor(tn("SSM_G_B", "weight", i), (head_dim, d_inner))
            layer.ssm_o_norm = c.create_tensor(tn("SSM_NORM", "weight", i), (head_dim,))
            layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (d_inner, n_embd))
        else:
            load_dsa_tensors(c, layer, i, flags)
        if i < hp.n_layer_dense_lead:
            n_ff = hp.n_ff()
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        else:
            n_ff_exp, n_ff_shexp = hp.n_ff_exp(i), hp.n_ff_exp(i) * hp.n_expert_shared
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), flags)
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert),
                                                  flags)
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert),
                                                  flags)
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        if i >= hp.n_layer:
            c.create_nextn(i, flags)


def load_dsa_tensors(c: TensorCreator, layer: Layer, i: int, flags: int) -> None:
    """A DSA layer's latent attention and, on the full indexer layers (and the NextN block), the
    k-pool indexer; the shared layers' indexer tensors are optional."""
    hp = c.hparams
    n_embd, n_head = hp.n_embd, hp.n_head()
    q_lora_rank, kv_lora_rank = hp.n_lora_q, hp.n_lora_kv
    n_embd_head_k, n_embd_head_v = hp.n_embd_head_k_mla(), hp.n_embd_head_v_mla()
    qk_rope_head_dim = hp.n_rot()
    qk_nope_head_dim = n_embd_head_k - qk_rope_head_dim
    layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,), flags)
    layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,), flags)
    layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank), flags)
    layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head * n_embd_head_k), flags)
    layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + qk_rope_head_dim),
                                      flags)
    layer.wk_b = c.create_tensor(tn("ATTN_K_B", "weight", i), (qk_nope_head_dim, kv_lora_rank, n_head), flags)
    layer.wv_b = c.create_tensor(tn("ATTN_V_B", "weight", i), (kv_lora_rank, n_embd_head_v, n_head), flags)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_v, n_embd), flags)
    n_indexer_head, n_embd_indexer, kpool = hp.indexer_n_head, hp.indexer_head_size, hp.indexer_kpool
    full = i >= hp.n_layer or hp.is_indexer_full(i)
    iflags = flags | (0 if full else TENSOR_NOT_REQUIRED)
    layer.indexer_k_norm = c.create_tensor(tn("INDEXER_K_NORM", "weight", i), (n_embd_indexer,), iflags)
    layer.indexer_k_norm_b = c.create_tensor(tn("INDEXER_K_NORM", "bias", i), (n_embd_indexer,), iflags)
    layer.indexer_proj = c.create_tensor(tn("INDEXER_PROJ", "weight", i), (n_embd, n_indexer_head), iflags)
    layer.indexer_attn_k = c.create_tensor(tn("INDEXER_ATTN_K", "weight", i), (n_embd, n_embd_indexer), iflags)
    layer.indexer_attn_q_b = c.create_tensor(tn("INDEXER_ATTN_Q_B", "weight", i),
                                             (q_lora_rank, n_indexer_head * n_embd_indexer), iflags)
    layer.indexer_kpool_gate = c.create_tensor(tn("INDEXER_KPOOL_GATE", "weight", i), (n_embd, n_embd_indexer), iflags)
    layer.indexer_kpool_ape = c.create_tensor(tn("INDEXER_KPOOL_APE", "weight", i), (n_embd_indexer, kpool), iflags)


# --- graph ---------------------------------------------------------------------------------------

class KPoolInput:
    """llm_graph_input_kpool (build_inp_kpool): the indexer cache's K indices, each pool's caching
    cell and member cells, the pool mask, the tail cells, the selection slot mask, the pools this
    ubatch completes and their caching cells; whether the ubatch gathers the selected latents."""

    def __init__(self, g: GraphContext, mem: MemoryHybridIdx):
        hp, n_tokens = g.hparams, g.ubatch.n_tokens
        kpool = hp.indexer_kpool
        n_pool = mem.get_n_kpool()
        self.n_kv = mem.idx.get_n_kv()
        # a ubatch that completes no pool still builds one dummy entry
        self.n_new = max(mem.get_n_kpool_new(), 1)
        self.cache_safe = mem.get_kpool_cache_safe()
        # the fused lightning indexer (cparams.fused_lid, always on) wants an f16 mask
        type_mask = ggml.T.F16
        self.k_idxs = mem.idx.build_input_k_idxs(n_tokens)
        self.pool_cells = ggml.new_tensor(ggml.T.I32, n_pool)
        self.pool_idxs = ggml.new_tensor(ggml.T.I32, kpool, n_pool)
        self.pool_mask = ggml.new_tensor(type_mask, n_pool, n_tokens)
        self.tail_idxs = ggml.new_tensor(ggml.T.I32, kpool - 1, n_tokens)
        for t in (self.pool_cells, self.pool_idxs, self.pool_mask, self.tail_idxs):
            t.set_input()
        for t in (self.pool_cells, self.pool_idxs, self.pool_mask, self.tail_idxs):
            ggml.build_forward_expand(g.gf, t)
        n_top_pool = min(n_pool, hp.indexer_top_k // kpool)
        self.n_sel = kpool * n_top_pool + (kpool - 1 if hp.indexer_kpool_select_tail else 0)
        self.gather = n_tokens <= GATHER_MAX_UBATCH and self.n_kv > self.n_sel
        self.gather_mask = ggml.new_tensor(ggml.T.F32, self.n_sel, 1, 1, n_tokens)
        self.gather_mask.set_input()
        ggml.build_forward_expand(g.gf, self.gather_mask)
        self.new_pool_idxs = ggml.new_tensor(ggml.T.I32, kpool, self.n_new)
        self.new_pool_idxs.set_input()
        self.new_pool_rep = None
        if self.cache_safe:
            self.new_pool_rep = ggml.new_tensor(ggml.T.I64, self.n_new)
            self.new_pool_rep.set_input()


def build(g: GraphContext) -> None:
    """llama_model_glm5_next::graph: the token rows repeated into hc_mult streams; per layer the
    attention (KDA or DSA) and the FFN (dense SwiGLU on the leading layers, else experts beside the
    shared ones) each between hc_pre and hc_post; the output rows, their streams' mean, the norm and
    the head."""
    model, hp = g.model, g.hparams
    n_embd, n_tokens, n_outputs = hp.n_embd, g.ubatch.n_tokens, g.ubatch.n_outputs
    hc = hp.dsv4_hc_mult
    mem: MemoryHybridIdx = g.kv
    inp = g.build_inp_embd(model.tok_embd)
    g.cb(inp, "inp_embd", -1)
    inp_hyb = g.build_inp_mem_hybrid_k()
    inp_kpool = KPoolInput(g, mem)
    inp_out_ids = g.build_inp_out_ids()
    require_both_kinds(hp, "DSA")
    inp_l = ggml.repeat_4d(ggml.reshape(inp, n_embd, 1, n_tokens), n_embd, hc, n_tokens, 1)
    g.cb(inp_l, "hc_init", -1)

    prev_sel = None
    for il, layer in enumerate(model.layers):
        residual = inp_l
        cur, post, comb = build_hc_pre_mix(g, inp_l, layer.hc_attn_fn, layer.hc_attn_scale, layer.hc_attn_base, il)
        g.cb(cur, "hc_attn_pre", il)
        cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        ggml.build_forward_expand(g.gf, cur)
        if hp.is_recr(il):
            cur = build_kda(g, inp_hyb.rs, layer, cur, il, low_rank_gate=True)
        else:
            cur, prev_sel = build_dsa_layer(g, layer, mem, inp_hyb.attn, inp_kpool, cur, prev_sel, il)
        inp_l = build_hc_post(g, cur, residual, post, comb, il)
        g.cb(inp_l, "hc_attn_post", il)

        residual = inp_l
        cur, post, comb = build_hc_pre_mix(g, inp_l, layer.hc_ffn_fn, layer.hc_ffn_scale, layer.hc_ffn_base, il)
        g.cb(cur, "hc_ffn_pre", il)
        cur = g.build_norm(cur, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if il < hp.n_layer_dense_lead:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                      LLM_FFN_SILU, hp.expert_weights_norm, hp.expert_weights_scale,
                                      hp.expert_gating_func, il)
            g.cb(moe_out, "ffn_moe_out", il)
            ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                                    None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(ffn_shexp, "ffn_shexp", il)
            cur = ggml.add(moe_out, ffn_shexp)
            g.cb(cur, "ffn_out", il)
        inp_l = build_hc_post(g, cur, residual, post, comb, il)
        inp_l = g.build_cvec(inp_l, il)
        g.cb(inp_l, "l_out", il)

    # the output rows first (a reserve embeds no NextN rows), then the streams' mean
    flat = ggml.get_rows(ggml.reshape(inp_l, n_embd * hc, n_tokens), inp_out_ids)
    inp_l = ggml.reshape(flat, n_embd, hc, n_outputs)
    cur = build_hc_mean(inp_l)
    g.cb(cur, "hc_head", -1)
    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "h_nextn", -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.mul_mat_no_lora(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


def build_hc_mean(x: Tensor) -> Tensor:
    """graph::build_hc_mean: the hc streams of x [n_embd, hc, n_tokens] summed and scaled by 1/hc."""
    hc = x.ne[1]
    acc = ggml.view(x, (x.ne[0], x.ne[2]), (x.nb[2],), 0)
    for s in range(1, hc):
        acc = ggml.add(acc, ggml.view(x, (x.ne[0], x.ne[2]), (x.nb[2],), s * x.nb[1]))
    return ggml.scale(acc, 1.0 / hc)


def build_kpool_select(g: GraphContext, layer: Layer, mem: MemoryHybridIdx, inp: KPoolInput, cur: Tensor,
                       qr: Tensor, kq_mask: Tensor, il: int) -> Tensor:
    """graph::build_kpool_select: the indexer's queries, each token's key and pool gate written to
    the indexer cache, the pools this ubatch completes pooled (a softmax over their members per
    channel) and written back, every pool's pooled key gathered and scored by the lightning
    indexer; the top pools in descending score, expanded to their cells (and the tail's). Gather:
    those cell indices; scatter: an additive mask over the cache, the causal mask folded in."""
    hp, n_tokens = g.hparams, g.ubatch.n_tokens
    n_indexer_head, n_embd_indexer, kpool = hp.indexer_n_head, hp.indexer_head_size, hp.indexer_kpool
    n_pool, n_new = inp.pool_cells.ne[0], inp.n_new
    if layer.indexer_attn_q_b is None or layer.indexer_attn_k is None or layer.indexer_kpool_gate is None:
        raise GGMLAbort(f"llama.cpp would crash (a null pointer): the full indexer layer {il} has no k-pool "
                        f"indexer weights (blk.{il}.indexer.*)")

    iq = ggml.reshape(g.mul_mat_no_lora(layer.indexer_attn_q_b, qr), n_embd_indexer, n_indexer_head, n_tokens)
    g.cb(iq, "indexer_q", il)
    ik = g.build_norm(g.mul_mat_no_lora(layer.indexer_attn_k, cur), layer.indexer_k_norm, layer.indexer_k_norm_b,
                      LLM_NORM, il)
    g.cb(ik, "indexer_k", il)
    ig = g.mul_mat_no_lora(layer.indexer_kpool_gate, cur)
    g.cb(ig, "indexer_gate", il)
    # cache rows hold key | gate | pooled
    pzero = ggml.fill(ggml.new_tensor(ggml.T.F32, n_embd_indexer, n_tokens), 0.0)
    packed = ggml.concat(ggml.concat(ik, ig, 0), pzero, 0)
    packed = ggml.reshape(packed, 3 * n_embd_indexer, 1, n_tokens)
    ggml.build_forward_expand(g.gf, mem.idx.cpy_k(packed, inp.k_idxs, il))
    kpool_cache = mem.get_kpool_access(il, n_embd_indexer)
    n_kv = mem.idx.get_n_kv()

    # pool the entries this ubatch completes (a dummy one when it completes none)
    rows = kpool_cache.gather_key_gate(ggml.reshape(inp.new_pool_idxs, kpool * n_new))
    rows = ggml.reshape(rows, 2 * n_embd_indexer, kpool, n_new)
    pk = ggml.view(rows, (n_embd_indexer, kpool, n_new), (rows.nb[1], rows.nb[2]), 0)
    pg = ggml.view(rows, (n_embd_indexer, kpool, n_new), (rows.nb[1], rows.nb[2]),
                   ggml.row_size(rows.type, n_embd_indexer))
    logits = ggml.add(pg, layer.indexer_kpool_ape)
    logits = ggml.cont(ggml.permute(logits, 1, 0, 2, 3))                  # [kpool, head_dim, n_new]
    probs = ggml.soft_max(ggml.reshape(logits, kpool, n_embd_indexer * n_new))
    probs = ggml.reshape(probs, kpool, n_embd_indexer, n_new)
    pk = ggml.cont(ggml.permute(pk, 1, 0, 2, 3))
    pooled_new = ggml.sum_rows(ggml.mul(probs, pk))                         # [1, head_dim, n_new]
    pooled_new = ggml.reshape(pooled_new, n_embd_indexer, n_new)
    g.cb(pooled_new, "indexer_pool_k_new", il)
    if inp.cache_safe:
        ggml.build_forward_expand(g.gf, kpool_cache.scatter_pooled(pooled_new, inp.new_pool_rep))
        pooled = kpool_cache.gather_pooled(inp.pool_cells)
    else:
        if n_new > n_pool:
            raise GGMLAbort("llama.cpp would abort (build_kpool_select GGML_ASSERT(n_new <= n_pool))")
        pad = ggml.fill(ggml.new_tensor(ggml.T.F32, n_embd_indexer, n_pool - n_new), 0.0)
        pooled = ggml.concat(pooled_new, pad, 1)
    pooled = ggml.reshape(pooled, n_embd_indexer, 1, n_pool)
    g.cb(pooled, "indexer_pool_k", il)

    weights = g.mul_mat_no_lora(layer.indexer_proj, cur)
    weights = ggml.scale(weights, 1.0 / math.sqrt(float(n_embd_indexer * n_indexer_head)))
    g.cb(weights, "indexer_weights", il)
    # cparams.fused_lid is always on
    score = ggml.lightning_indexer(iq, pooled, weights, inp.pool_mask)
    g.cb(score, "indexer_score", il)
    n_top_pool = min(n_pool, hp.indexer_top_k // kpool)
    top_k = ggml.top_k(score, n_top_pool)                                   # unordered
    # the gather mask marks the first slots as the visible pools: order the set by descending score
    sel_score = ggml.get_rows(ggml.reshape(score, 1, n_pool, n_tokens), top_k)
    sel_order = ggml.argsort(ggml.reshape(sel_score, n_top_pool, n_tokens))
    top_k = ggml.get_rows(ggml.reshape(ggml.cast(top_k, ggml.T.F32), 1, n_top_pool, n_tokens), sel_order)
    top_k = ggml.cast(ggml.cont(ggml.reshape(top_k, n_top_pool, n_tokens)), ggml.T.I32)
    g.cb(top_k, "indexer_top_k", il)
    sel_idx = ggml.get_rows(inp.pool_idxs, ggml.reshape(top_k, n_top_pool * n_tokens))
    sel_idx = ggml.reshape(sel_idx, kpool * n_top_pool, n_tokens)
    if hp.indexer_kpool_select_tail:
        sel_idx = ggml.concat(sel_idx, inp.tail_idxs, 0)
    n_sel = sel_idx.ne[0]
    if inp.gather:
        g.cb(sel_idx, "indexer_sel_idx", il)
        return sel_idx

    # scatter: each live slot clears its cell in a -inf mask, each dead one writes its own dump row
    seed = ggml.cast(ggml.view(sel_idx, (1,), (), 0), ggml.T.F32)
    mask_seed = seed if kq_mask.type == ggml.T.F32 else ggml.cast(seed, kq_mask.type)
    mask_seed = ggml.fill(mask_seed, -math.inf)
    mask_all = ggml.repeat_4d(mask_seed, 1, n_kv + n_sel, n_tokens, 1)
    mask_all = ggml.reshape(mask_all, 1, n_kv + n_sel, n_tokens)
    zeros = ggml.repeat_4d(ggml.fill(seed, 0.0), 1, n_sel, n_tokens, 1)
    zeros = ggml.reshape(zeros, 1, n_sel, n_tokens)
    live = ggml.unary(ggml.reshape(inp.gather_mask, n_sel, n_tokens), "EXP")
    dump = ggml.arange(float(n_kv), float(n_kv + n_sel), 1.0)
    idx_f = ggml.cast(sel_idx, ggml.T.F32)
    idx_f = ggml.add(ggml.mul(ggml.sub(idx_f, dump), live), dump)
    sel_idx = ggml.cast(idx_f, ggml.T.I32)
    sel = ggml.set_rows(mask_all, zeros, ggml.reshape(sel_idx, n_sel, n_tokens, 1))
    sel = ggml.view(sel, (n_kv, n_tokens), (sel.nb[2],), 0)
    sel = ggml.add(sel, ggml.reshape(kq_mask, n_kv, n_tokens))
    g.cb(sel, "indexer_sel", il)
    return sel


def build_dsa_layer(g: GraphContext, layer: Layer, mem: MemoryHybridIdx, inp_attn, inp: KPoolInput, cur: Tensor,
                    prev_sel, il: int) -> tuple[Tensor, Tensor]:
    """graph::build_dsa_layer: rope-less MLA (Q LoRA, the latent and its norm, Q absorbed by
    attn_k_b) over the indexer's selection: the gathered latents alone, or the whole cache under the
    selection mask; decompressed by attn_v_b, then attn_output. Returns the output and the selection
    the next shared indexer layer reuses."""
    hp, n_tokens = g.hparams, g.ubatch.n_tokens
    n_head = hp.n_head()
    n_embd_head_k_mla, kv_lora_rank = hp.n_embd_head_k_mla(), hp.n_lora_kv
    n_embd_head_qk_nope = n_embd_head_k_mla - hp.n_rot()
    kq_scale = 1.0 / math.sqrt(float(n_embd_head_k_mla))
    if hp.n_rot() != 0:
        raise GGMLAbort(f"llama.cpp would abort (glm5-next.cpp GGML_ASSERT(n_rot() == 0), \"GLM5-Next MLA is "
                        f"nope-only\"): the DSA layer {il} has {hp.n_rot()} rope dimensions")

    qr = g.build_norm(g.mul_mat_no_lora(layer.wq_a, cur), layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
    g.cb(qr, "q_resid", il)
    q = ggml.reshape(g.mul_mat_no_lora(layer.wq_b, qr), n_embd_head_qk_nope, n_head, n_tokens)
    kv_cmpr = g.build_norm(g.mul_mat_no_lora(layer.wkv_a_mqa, cur), layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)
    kv_cmpr = ggml.reshape(kv_cmpr, kv_lora_rank, 1, n_tokens)
    g.cb(kv_cmpr, "kv_cmpr", il)
    # absorb wk_b so the cache holds only the latent
    q_absorbed = ggml.permute(g.mul_mat_no_lora(layer.wk_b, ggml.permute(q, 0, 2, 1, 3)), 0, 2, 1, 3)
    g.cb(q_absorbed, "q_absorbed", il)
    kq_mask = inp_attn.kq_mask

    if hp.is_indexer_full(il):
        sel = build_kpool_select(g, layer, mem, inp, cur, qr, kq_mask, il)
        prev_sel = sel
    else:
        if prev_sel is None:
            raise GGMLAbort("llama.cpp would abort (glm5-next.cpp GGML_ASSERT(*prev_sel != nullptr), \"shared "
                            f"indexer layer must follow a full indexer layer\"): layer {il} shares the selection "
                            "of a full indexer layer, and none runs before it")
        sel = prev_sel

    ggml.build_forward_expand(g.gf, q_absorbed)
    ggml.build_forward_expand(g.gf, kv_cmpr)
    ggml.build_forward_expand(g.gf, inp_attn.kv.cpy_k(kv_cmpr, inp_attn.k_idxs, il))

    if inp.gather:
        # attend over the gathered latents, the tokens in ne[3]
        ggml.build_forward_expand(g.gf, kq_mask)
        n_sel = sel.ne[0]
        k_g = mem.gather_mla_rows(sel, n_sel * n_tokens, kv_lora_rank, il)
        k_g = ggml.reshape(k_g, kv_lora_rank, n_sel, 1, n_tokens)
        g.cb(k_g, "kv_gathered", il)
        q_g = ggml.permute(q_absorbed, 0, 2, 3, 1)                          # [kv_lora_rank, 1, n_head, n_tokens]
        kq = ggml.mul_mat(k_g, q_g)                                          # [n_sel, 1, n_head, n_tokens]
        kq = ggml.soft_max_ext(kq, inp.gather_mask, kq_scale, 0.0)
        g.cb(kq, "kq_soft_max_gathered", il)
        v_t = ggml.cont(ggml.transpose(k_g))                                 # [n_sel, kv_lora_rank, 1, n_tokens]
        kqv = g.mul_mat_no_lora(layer.wv_b, ggml.mul_mat(v_t, kq))                # [n_embd_head_v, 1, n_head, n_tokens]
        g.cb(kqv, "kqv_gathered", il)
        out = ggml.cont(ggml.permute(kqv, 0, 2, 1, 3))
        out = ggml.reshape(out, kqv.ne[0] * n_head, n_tokens)
    else:
        # the scatter selection already holds the causal mask
        mask = ggml.reshape(sel, *kq_mask.ne)
        g.cb(mask, "kq_mask_dsa", il)
        k = inp_attn.kv.get_k(il)
        v = ggml.view(k, (kv_lora_rank, k.ne[1], k.ne[2], k.ne[3]), (k.nb[1], k.nb[2], k.nb[3]), 0)
        out = g.build_attn_mha(q_absorbed, k, v, mask, kq_scale, il, v_mla=layer.wv_b)
    g.cb(out, "kqv_out", il)
    out = g.mul_mat_no_lora(layer.wo, out)
    g.cb(out, "attn_out", il)
    return out, prev_sel
