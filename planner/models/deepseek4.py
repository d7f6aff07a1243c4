"""LLM_ARCH_DEEPSEEK4 (src/models/deepseek4.cpp): DeepSeek-V4 (Flash, Pro).

Manifold-constrained hyper-connections: the residual stream is hc_mult (4) streams, mixed into one
before each sublayer (hc_pre: weights from a projection of the RMS-normed streams) and spread back
after it (hc_post, with a Sinkhorn-normalised stream-mixing matrix, hc_comb); by default the three
are the fused DSV4_HC_* ops, which sched_reserve's probes may turn off. Attention: one K=V
projection (a single head, rms-normed, rope on its last dims) attended as MQA with attention sinks
over a sliding window of raw keys and, per layer by compress_ratios, compressed keys: ratio 4
(CSA: one row per 4 tokens from overlapping windows, the rows a lightning indexer picks), ratio 128
(HCA: one row per 128 tokens, all of them) or none. The output is de-roped and projected by a
grouped low-rank wo_a/wo_b. Experts: sqrt-softplus routing with a selection bias, clamped SwiGLU,
a shared expert; the leading hash_layer_count layers route each token by its id (ffn_gate_tid2eid).
Memory: llama_kv_cache_dsv4 (planner/kv_cache_dsv4.py).
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLAbort, Tensor
from ..gguf import BOOL, INT32, UINT32
from ..graph import (LLM_FFN_PAR, LLM_FFN_SILU, LLM_FUSED_OP_DSV4_HC_COMB, LLM_FUSED_OP_DSV4_HC_POST,
                     LLM_FUSED_OP_DSV4_HC_PRE, LLM_NORM_RMS, DSV4CompInput, DSV4Input, GraphContext,
                     mul_mat_hadamard)
from ..hparams import LLAMA_ROPE_TYPE_NORM, LLAMA_SWA_TYPE_STANDARD, HParams
from ..kv_cache_dsv4 import DSV4_CSA_RATIO, DSV4_HCA_RATIO, DSV4CompState
from ..model import Layer, Model, TensorCreator, require
from ..model_loader import TENSOR_ALLOW_RESHAPE, TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM

LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS = 4


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    # a file whose NextN block is not there (its eh_proj): the trunk alone
    if hp.n_layer_nextn > 0 and ml.get_weight(f"blk.{hp.n_layer}.nextn.eh_proj.weight") is None:
        hp.n_layer_nextn = 0
        hp.n_layer = hp.n_layer_all
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank")
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale")
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm")
    hp.swiglu_clamp_exp = ml.get_key_or_arr_f32("%s.swiglu_clamp_exp", hp.n_layer_all)
    hp.swiglu_clamp_shexp = ml.get_key_or_arr_f32("%s.swiglu_clamp_shexp", hp.n_layer_all) \
        if ml.has("%s.swiglu_clamp_shexp") else hp.swiglu_clamp_exp
    hp.indexer_n_head = ml.get_u32("%s.attention.indexer.head_count")
    hp.indexer_head_size = ml.get_u32("%s.attention.indexer.key_length")
    hp.indexer_top_k = ml.get_u32("%s.attention.indexer.top_k")
    hp.dsv4_o_group_count = ml.get_u32("%s.attention.output_group_count")
    hp.dsv4_o_lora_rank = ml.get_u32("%s.attention.output_lora_rank")
    hp.dsv4_compress_rope_base = ml.get_f32("%s.attention.compress_rope_freq_base")
    hp.dsv4_hc_mult = ml.get_u32("%s.hyper_connection.count")
    hp.dsv4_hc_sinkhorn_iters = ml.get_u32("%s.hyper_connection.sinkhorn_iterations")
    hp.dsv4_hc_eps = ml.get_f32("%s.hyper_connection.epsilon")
    hp.dsv4_hash_layer_count = ml.get_u32("%s.hash_layer_count")
    n_compress_ratios = ml.get_arr_n("%s.attention.compress_ratios")
    if n_compress_ratios < hp.n_layer_all:
        ml.fail("DeepSeek-V4 compress_ratios is shorter than block_count")
    require(ml, n_compress_ratios <= 512, f"{ml.key('%s.attention.compress_ratios')} has {n_compress_ratios} "
            f"entries, more than LLAMA_MAX_LAYERS (512)")
    hp.dsv4_compress_ratios = ml.get_arr("%s.attention.compress_ratios", (BOOL, UINT32, INT32))
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    if hp.expert_gating_func != LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS:
        ml.fail("DeepSeek-V4 loader currently expects sqrtsoftplus MoE scoring")
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    hp.set_swa_pattern(0)
    # the NextN layers are window layers too
    hp.is_swa_arr = hp.is_swa_arr[:hp.n_layer] + (True,) * hp.n_layer_nextn


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    n_head, n_embd_head = hp.n_head(), hp.n_embd_head_k()    # layer 0's, as LLAMA_LOAD_LOCALS reads them
    q_lora_rank, n_ff_exp, n_expert_shared = hp.n_lora_q, hp.n_ff_exp(), hp.n_expert_shared
    o_groups, o_lora_rank = hp.dsv4_o_group_count, hp.dsv4_o_lora_rank
    hc_mult = hp.dsv4_hc_mult
    hc_dim, hc_mix_dim = hc_mult * n_embd, (2 + hc_mult) * hc_mult
    if o_groups == 0:
        c.ml.fail(f"{c.ml.key('%s.attention.output_group_count')} is 0: llama.cpp would crash (an integer "
                  f"division by zero sizing attn_output_a)")
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    mtp_flags = TENSOR_SKIP    # load_mtp is off
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    model.hc_head_fn = c.create_tensor(tn("HC_HEAD_FN", "weight"), (hc_dim, hc_mult))
    model.hc_head_base = c.create_tensor(tn("HC_HEAD_BASE", "weight"), (hc_mult,))
    model.hc_head_scale = c.create_tensor(tn("HC_HEAD_SCALE", "weight"), (1,))
    for i, layer in enumerate(model.layers + model.layers_nextn):
        flags = trunk_flags if i < hp.n_layer else mtp_flags
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        layer.attn_sinks = c.create_tensor(tn("ATTN_SINKS", "weight", i), (n_head,), flags)
        layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank), flags)
        layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,), flags)
        layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head * n_embd_head), flags)
        layer.wkv = c.create_tensor(tn("ATTN_KV", "weight", i), (n_embd, n_embd_head), flags)
        layer.attn_kv_norm = c.create_tensor(tn("ATTN_KV_NORM", "weight", i), (n_embd_head,), flags)
        # the file holds {n_head * head / groups, o_lora_rank * groups}: read as one matrix per group
        layer.wo_a = c.create_tensor(tn("ATTN_OUT_A", "weight", i), (n_head * n_embd_head // o_groups, o_lora_rank,
                                                                      o_groups), flags | TENSOR_ALLOW_RESHAPE)
        layer.wo_b = c.create_tensor(tn("ATTN_OUT_B", "weight", i), (o_groups * o_lora_rank, n_embd), flags)
        layer.hc_attn_fn = c.create_tensor(tn("HC_ATTN_FN", "weight", i), (hc_dim, hc_mix_dim), flags)
        layer.hc_attn_base = c.create_tensor(tn("HC_ATTN_BASE", "weight", i), (hc_mix_dim,), flags)
        layer.hc_attn_scale = c.create_tensor(tn("HC_ATTN_SCALE", "weight", i), (3,), flags)
        layer.hc_ffn_fn = c.create_tensor(tn("HC_FFN_FN", "weight", i), (hc_dim, hc_mix_dim), flags)
        layer.hc_ffn_base = c.create_tensor(tn("HC_FFN_BASE", "weight", i), (hc_mix_dim,), flags)
        layer.hc_ffn_scale = c.create_tensor(tn("HC_FFN_SCALE", "weight", i), (3,), flags)
        ratio = hp.dsv4_compress_ratios[i]
        if ratio != 0:
            coff = 2 if ratio == DSV4_CSA_RATIO else 1
            layer.attn_comp_wkv = c.create_tensor(tn("ATTN_COMPRESSOR_WKV", "weight", i), (n_embd, coff * n_embd_head),
                                                  flags)
            layer.attn_comp_wgate = c.create_tensor(tn("ATTN_COMPRESSOR_WGATE", "weight", i),
                                                    (n_embd, coff * n_embd_head), flags)
            layer.attn_comp_ape = c.create_tensor(tn("ATTN_COMPRESSOR_APE", "weight", i), (coff * n_embd_head, ratio),
                                                  flags)
            layer.attn_comp_norm = c.create_tensor(tn("ATTN_COMPRESSOR_NORM", "weight", i), (n_embd_head,), flags)
            if ratio == DSV4_CSA_RATIO:
                n_embd_indexer = hp.indexer_head_size
                layer.indexer_proj = c.create_tensor(tn("INDEXER_PROJ", "weight", i), (n_embd, hp.indexer_n_head),
                                                     flags)
                layer.indexer_attn_q_b = c.create_tensor(tn("INDEXER_ATTN_Q_B", "weight", i),
                                                         (q_lora_rank, hp.indexer_n_head * n_embd_indexer), flags)
                layer.indexer_comp_wkv = c.create_tensor(tn("INDEXER_COMPRESSOR_WKV", "weight", i),
                                                         (n_embd, 2 * n_embd_indexer), flags)
                layer.indexer_comp_wgate = c.create_tensor(tn("INDEXER_COMPRESSOR_WGATE", "weight", i),
                                                           (n_embd, 2 * n_embd_indexer), flags)
                layer.indexer_comp_ape = c.create_tensor(tn("INDEXER_COMPRESSOR_APE", "weight", i),
                                                         (2 * n_embd_indexer, ratio), flags)
                layer.indexer_comp_norm = c.create_tensor(tn("INDEXER_COMPRESSOR_NORM", "weight", i),
                                                          (n_embd_indexer,), flags)
            elif ratio != DSV4_HCA_RATIO:
                c.ml.fail("DeepSeek-V4 loader only supports compression ratios 0, 4, and 128")
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
        if i < hp.dsv4_hash_layer_count:
            layer.ffn_gate_tid2eid = c.create_tensor(tn("FFN_GATE_TID2EID", "weight", i), (hp.n_expert_used(), n_vocab),
                                                     flags)
        else:
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), flags)
        # the vision variant's routing bias for image tokens
        layer.ffn_exp_probs_b_vl = c.create_tensor(tn("FFN_EXP_PROBS_B_VL", "bias", i), (n_expert,),
                                                   flags | TENSOR_NOT_REQUIRED)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert), flags)
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
        n_ff_shexp = n_ff_exp * n_expert_shared
        layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
        layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        if i >= hp.n_layer:
            c.create_nextn(i, flags)


def build(g: GraphContext) -> None:
    """llama_model_deepseek4::graph: the token rows repeated into hc_mult streams, per layer the
    attention and the experts each between hc_pre and hc_post, the streams merged by the head's own
    hc_pre (unfused, il -1), the output norm and head. rope frequencies, YaRN factors and the
    compressed layers' rope base are op parameters only: they leave memory as it is."""
    model, hp, cp = g.model, g.hparams, g.cparams
    n_embd, n_tokens, n_outputs = hp.n_embd, g.ubatch.n_tokens, g.ubatch.n_outputs
    hc = hp.dsv4_hc_mult
    inp = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_out_ids = g.build_inp_out_ids()
    inp_dsv4 = g.build_inp_dsv4()
    ggml.build_forward_expand(g.gf, inp_dsv4.kq_mask)
    inp_l = ggml.reshape(inp, n_embd, 1, n_tokens)
    inp_l = ggml.repeat_4d(inp_l, n_embd, hc, n_tokens, 1)
    g.cb(inp_l, "hc_init", -1)

    for il, layer in enumerate(model.layers):
        residual = inp_l
        cur, post, comb = build_hc_pre_mix(g, inp_l, layer.hc_attn_fn, layer.hc_attn_scale, layer.hc_attn_base, il)
        g.cb(cur, "hc_attn_pre", il)
        cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        cur = build_attention(g, layer, inp_dsv4, cur, inp_pos, il)
        inp_l = build_hc_post(g, cur, residual, post, comb, il)
        g.cb(inp_l, "hc_attn_post", il)

        residual = inp_l
        cur, post, comb = build_hc_pre_mix(g, inp_l, layer.hc_ffn_fn, layer.hc_ffn_scale, layer.hc_ffn_base, il)
        g.cb(cur, "hc_ffn_pre", il)
        for t in (residual, post, comb):
            ggml.build_forward_expand(g.gf, t)
        cur = g.build_norm(cur, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        # a reserve ubatch is tokens (no embeddings): the hash layers route each token by its id
        selected_experts, exp_probs_b = None, layer.ffn_exp_probs_b
        if il < hp.dsv4_hash_layer_count:
            selected_experts = ggml.get_rows(layer.ffn_gate_tid2eid, g.t_inp_tokens)
            exp_probs_b = None
        moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                  layer.ffn_down_exps, exp_probs_b, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU,
                                  hp.expert_weights_norm, hp.expert_weights_scale, hp.expert_gating_func, il,
                                  selected_experts_in=selected_experts)
        g.cb(moe_out, "ffn_moe_out", il)
        ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp, None,
                                LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(ffn_shexp, "ffn_shexp", il)
        cur = ggml.add(moe_out, ffn_shexp)
        g.cb(cur, "ffn_out", il)
        inp_l = build_hc_post(g, cur, residual, post, comb, il)
        inp_l = g.build_cvec(inp_l, il)
        g.cb(inp_l, "l_last", il)

    flat = ggml.reshape(inp_l, n_embd * hc, n_tokens)
    flat_out = ggml.get_rows(flat, inp_out_ids)
    inp_l = ggml.reshape(flat_out, n_embd, hc, n_outputs)
    cur = build_hc_head(g, inp_l, model.hc_head_fn, model.hc_head_scale, model.hc_head_base)
    g.cb(cur, "hc_head", -1)
    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.mul_mat_no_lora(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


# --- hyper-connections -------------------------------------------------------------------------

def _view_1d(t: Tensor, ne0: int, i0: int) -> Tensor:
    """dsv4_view_1d: ne0 values from the i0-th"""
    return ggml.view(t, (ne0,), (), ggml.row_size(t.type, i0))


def _view_2d(t: Tensor, ne0: int, ne1: int, i0: int) -> Tensor:
    """dsv4_view_2d: ne0 values from the i0-th of each of ne1 rows"""
    return ggml.view(t, (ne0, ne1), (t.nb[1],), ggml.row_size(t.type, i0))


def _affine(x: Tensor, scale: Tensor, base: Tensor) -> Tensor:
    """dsv4_hc_affine"""
    return ggml.add(ggml.mul(x, scale), base)


def build_hc_pre(g: GraphContext, x: Tensor, weights: Tensor, il: int) -> Tensor:
    """graph::build_hc_pre(x, weights): the hc streams of x [n_embd, hc, n_tokens] summed with
    weights [hc, n_tokens]: the fused DSV4_HC_PRE in a layer, else a MUL per stream, summed."""
    hc, nt = g.hparams.dsv4_hc_mult, x.ne[2]
    if g.cparams.fused_dsv4_hc_pre and il >= 0:
        result = ggml.dsv4_hc_pre(x, weights)
        g.fused_nodes.append((LLM_FUSED_OP_DSV4_HC_PRE, result, il))
        return result
    result = None
    for ih in range(hc):
        xh = ggml.view(x, (g.hparams.n_embd, nt), (x.nb[2],), ih * x.nb[1])
        wh = ggml.view(weights, (1, nt), (weights.nb[1],), ih * weights.nb[0])
        cur = ggml.mul(xh, wh)
        result = cur if result is None else ggml.add(result, cur)
    return result


def build_hc_sinkhorn(g: GraphContext, comb: Tensor) -> Tensor:
    """graph::build_hc_sinkhorn: a softmax over the destination streams, one column normalisation,
    then sinkhorn_iterations - 1 rounds of row and column normalisations."""
    comb = ggml.soft_max(comb)
    eps = ggml.fill(ggml.new_tensor(ggml.T.F32, 1), g.hparams.dsv4_hc_eps)
    comb = ggml.add(comb, eps)

    def norm_cols(comb: Tensor) -> Tensor:
        col_sum = ggml.sum_rows(ggml.cont(ggml.permute(comb, 1, 0, 2, 3)))
        col_sum = ggml.permute(ggml.add(col_sum, eps), 1, 0, 2, 3)
        return ggml.div(comb, col_sum)

    def norm_rows(comb: Tensor) -> Tensor:
        return ggml.div(comb, ggml.add(ggml.sum_rows(comb), eps))

    comb = norm_cols(comb)
    for _ in range(1, g.hparams.dsv4_hc_sinkhorn_iters):
        comb = norm_cols(norm_rows(comb))
    return comb


def build_hc_pre_mix(g: GraphContext, x: Tensor, hc_fn: Tensor, hc_scale: Tensor, hc_base: Tensor,
                     il: int) -> tuple[Tensor, Tensor, Tensor]:
    """graph::build_hc_pre(x, hc_fn, hc_scale, hc_base, &post, &comb): the mixes of the RMS-normed
    streams, split into the pre weights (sigmoid + eps), the post weights (2 sigmoid) and the
    stream-mixing matrix (the fused DSV4_HC_COMB, else its Sinkhorn in plain ops); returns the
    mixed input, post and comb."""
    hp = g.hparams
    hc, n_embd, nt = hp.dsv4_hc_mult, hp.n_embd, x.ne[2]
    if hc != 4:
        raise GGMLAbort(f"llama.cpp would abort (deepseek4.cpp build_hc_pre GGML_ASSERT(hc == 4)): "
                        f"{hc} hyper-connection streams")
    flat = ggml.reshape(x, hc * n_embd, nt)
    mixes = g.mul_mat_no_lora(hc_fn, ggml.rms_norm(flat, hp.f_norm_rms_eps))
    g.cb(mixes, "hc_mixes", il)
    scale_pre, scale_post = _view_1d(hc_scale, 1, 0), _view_1d(hc_scale, 1, 1)
    base_pre, base_post = _view_1d(hc_base, hc, 0), _view_1d(hc_base, hc, hc)
    pre = _affine(_view_2d(mixes, hc, nt, 0), scale_pre, base_pre)
    pre = ggml.scale_bias(ggml.unary(pre, "SIGMOID"), 1.0, hp.dsv4_hc_eps)
    g.cb(pre, "hc_pre", il)
    post = _affine(_view_2d(mixes, hc, nt, hc), scale_post, base_post)
    post = ggml.scale(ggml.unary(post, "SIGMOID"), 2.0)
    g.cb(post, "hc_post", il)
    if g.cparams.fused_dsv4_hc_comb:
        comb = ggml.dsv4_hc_comb(mixes, hc_scale, hc_base, hp.dsv4_hc_eps, hp.dsv4_hc_sinkhorn_iters)
        g.fused_nodes.append((LLM_FUSED_OP_DSV4_HC_COMB, comb, il))
    else:
        comb = _affine(_view_2d(mixes, hc * hc, nt, 2 * hc), _view_1d(hc_scale, 1, 2),
                       _view_1d(hc_base, hc * hc, 2 * hc))
        comb = build_hc_sinkhorn(g, ggml.reshape(comb, hc, hc, nt))
    g.cb(comb, "hc_comb", il)
    return build_hc_pre(g, x, pre, il), post, comb


def build_hc_post(g: GraphContext, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor, il: int) -> Tensor:
    """graph::build_hc_post: the sublayer's output x [n_embd, n_tokens] back into hc streams, each
    x times its post weight plus the residual streams mixed by comb: the fused DSV4_HC_POST, else
    per destination stream a sum of MULs, reshaped and concatenated."""
    hc, n_embd, nt = g.hparams.dsv4_hc_mult, g.hparams.n_embd, x.ne[1]
    if g.cparams.fused_dsv4_hc_post:
        result = ggml.dsv4_hc_post(x, residual, post, comb)
        g.fused_nodes.append((LLM_FUSED_OP_DSV4_HC_POST, result, il))
        return result
    out = None
    for dst in range(hc):
        post_dst = ggml.view(post, (1, nt), (post.nb[1],), dst * post.nb[0])
        cur = ggml.mul(x, post_dst)
        for src in range(hc):
            res_src = ggml.view(residual, (n_embd, nt), (residual.nb[2],), src * residual.nb[1])
            comb_src_dst = ggml.view(comb, (1, nt), (comb.nb[2],), dst * comb.nb[0] + src * comb.nb[1])
            cur = ggml.add(cur, ggml.mul(res_src, comb_src_dst))
        cur = ggml.reshape(cur, n_embd, 1, nt)
        out = cur if out is None else ggml.concat(out, cur, 1)
    return out


def build_hc_head(g: GraphContext, x: Tensor, hc_fn: Tensor, hc_scale: Tensor, hc_base: Tensor) -> Tensor:
    """graph::build_hc_head: the output streams merged by weights from their RMS-normed mixes."""
    hp = g.hparams
    flat = ggml.reshape(x, hp.dsv4_hc_mult * hp.n_embd, x.ne[2])
    mixes = g.mul_mat_no_lora(hc_fn, ggml.rms_norm(flat, hp.f_norm_rms_eps))
    g.cb(mixes, "hc_head_mixes", -1)
    pre = ggml.scale_bias(ggml.unary(_affine(mixes, hc_scale, hc_base), "SIGMOID"), 1.0, hp.dsv4_hc_eps)
    g.cb(pre, "hc_head_pre", -1)
    return build_hc_pre(g, x, pre, -1)


# --- attention ----------------------------------------------------------------------------------

def build_attention(g: GraphContext, layer: Layer, inp: DSV4Input, cur: Tensor, inp_pos: Tensor, il: int) -> Tensor:
    """graph::build_attention_impl (main graph): Q through the Q LoRA and a per-head RMS norm, the
    single K=V head, both roped; the layer's compressors update their states and write their
    completed rows; the attention over the raw window (and the compressed rows); the output
    de-roped and projected per group (wo_a) then to n_embd (wo_b)."""
    hp = g.hparams
    n_head, n_embd_head, n_rot = hp.n_head(), hp.n_embd_head_k(), hp.n_rot()
    n_groups, o_lora_rank = hp.dsv4_o_group_count, hp.dsv4_o_lora_rank
    nt = cur.ne[1]
    if n_embd_head != hp.n_embd_head_v() or n_head % n_groups != 0:
        raise GGMLAbort(f"llama.cpp would abort (deepseek4.cpp build_attention_impl GGML_ASSERT): head sizes K "
                        f"{n_embd_head} and V {hp.n_embd_head_v()} must be equal and {n_groups} output groups "
                        f"must divide {n_head} heads")
    o_group_dim = n_head // n_groups * n_embd_head
    ratio = hp.dsv4_compress_ratios[il]

    qr = g.build_lora_mm(layer.wq_a, cur)
    g.cb(qr, "qr", il)
    qr = g.build_norm(qr, layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
    g.cb(qr, "qr_norm", il)
    q = ggml.reshape(g.build_lora_mm(layer.wq_b, qr), n_embd_head, n_head, nt)
    q = ggml.rms_norm(q, hp.f_norm_rms_eps)
    g.cb(q, "q_norm", il)
    q = ggml.rope_ext(q, inp_pos, None, n_rot, hp.rope_type, hp.n_ctx_orig_yarn)   # on the last n_rot values
    g.cb(q, "q", il)
    kv = g.build_lora_mm(layer.wkv, cur)
    kv = g.build_norm(kv, layer.attn_kv_norm, None, LLM_NORM_RMS, il)
    kv = ggml.reshape(kv, n_embd_head, 1, nt)
    g.cb(kv, "kv_norm", il)
    kv = ggml.rope_ext(kv, inp_pos, None, n_rot, hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(kv, "kv", il)

    hca_state_kv = hca_state_score = None
    if ratio == DSV4_HCA_RATIO and inp.hca.state_pos is not None:
        hca_state_kv, hca_state_score = build_comp_state_rows(g, layer.attn_comp_wkv, layer.attn_comp_wgate,
                                                              layer.attn_comp_ape, inp.hca, cur, "hca", il)
    if ratio == DSV4_CSA_RATIO and inp.csa.state_pos is not None:
        csa_state_kv, csa_state_score = build_comp_state_rows(g, layer.attn_comp_wkv, layer.attn_comp_wgate,
                                                              layer.attn_comp_ape, inp.csa, cur, "csa", il)
        build_comp_update(g, inp.csa, inp.kv.csa_state, inp.kv.csa, csa_state_kv, csa_state_score,
                          layer.attn_comp_norm, n_embd_head, "csa_state_compress", il)
        lid_state_kv, lid_state_score = build_comp_state_rows(g, layer.indexer_comp_wkv, layer.indexer_comp_wgate,
                                                              layer.indexer_comp_ape, inp.lid, cur, "lid", il)
        build_comp_update(g, inp.lid, inp.kv.lid_state, inp.kv.lid, lid_state_kv, lid_state_score,
                          layer.indexer_comp_norm, hp.indexer_head_size, "lid_state_compress", il)
    if ratio == DSV4_HCA_RATIO and inp.hca.state_write_idxs is not None:
        state = inp.kv.hca_state
        source_kv, source_score = _state_source(state, hca_state_kv, hca_state_score, il)
        comp = build_hca_compressed_kv(g, source_kv, source_score, inp.hca.state_read_idxs, inp.hca.state_write_pos,
                                       layer.attn_comp_norm, n_embd_head, "hca_state_compress", il)
        if inp.hca.k_rot is not None:
            comp = mul_mat_hadamard(comp, inp.hca.k_rot)
            g.cb(comp, "hca_state_compress_rot", il)
        ggml.build_forward_expand(g.gf, inp.kv.hca.cpy_k(comp, inp.hca.state_write_idxs, il))
    if ratio == DSV4_HCA_RATIO and inp.hca.state_pos is not None:
        build_state_persist(g, inp.hca, inp.kv.hca_state, hca_state_kv, hca_state_score, il)

    kq_scale = 1.0 / math.sqrt(n_embd_head)
    if ratio == DSV4_CSA_RATIO and inp.csa.kq_mask is not None and inp.lid.kq_mask is not None \
            and inp.lid.k_rot is not None:
        out = build_compressed_attention(g, inp, inp.csa, inp.kv.csa, q, kv, layer.attn_sinks, kq_scale, il,
                                         build_lid_top_k(g, layer, inp, qr, cur, inp_pos, il))
    elif ratio == DSV4_HCA_RATIO and inp.hca.kq_mask is not None:
        out = build_compressed_attention(g, inp, inp.hca, inp.kv.hca, q, kv, layer.attn_sinks, kq_scale, il, None)
    else:
        out = build_raw_attention(g, inp, q, kv, layer.attn_sinks, kq_scale, il)

    out = ggml.reshape(out, n_embd_head, n_head, nt)
    out = ggml.rope_ext_back(out, inp_pos, None, n_rot, hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(out, "attn_derope", il)
    out = ggml.permute(ggml.reshape(out, o_group_dim, n_groups, nt), 0, 2, 1, 3)
    oa = g.mul_mat_no_lora(layer.wo_a, out)
    g.cb(oa, "attn_wo_a", il)
    oa = ggml.cont(ggml.permute(oa, 0, 2, 1, 3), o_lora_rank * n_groups, nt)
    out = g.build_lora_mm(layer.wo_b, oa)
    g.cb(out, "attn_out", il)
    return out


def build_comp_state_rows(g: GraphContext, wkv: Tensor, wgate: Tensor, ape: Tensor, inp: DSV4CompInput, cur: Tensor,
                          name: str, il: int) -> tuple[Tensor, Tensor]:
    """A compressor's rows for this ubatch: the kv and score projections, the score plus the
    position-in-block embedding (ape's row of pos % ratio)."""
    state_kv = g.build_lora_mm(wkv, cur)
    g.cb(state_kv, f"{name}_state_kv", il)
    state_score = g.build_lora_mm(wgate, cur)
    g.cb(state_score, f"{name}_state_score", il)
    state_score = ggml.add(state_score, ggml.get_rows(ape, inp.state_pos))
    g.cb(state_score, f"{name}_state_score_ape", il)
    return state_kv, state_score


def _state_source(state: DSV4CompState, state_kv: Tensor, state_score: Tensor, il: int) -> tuple[Tensor, Tensor]:
    """dsv4_build_state_restore (no rollback planes at n_rs_seq 0: the state itself), its first
    n_rows rows, then this ubatch's rows after them: [persistent state | current rows]."""
    kv_all, score_all = state.get_kv_all(il), state.get_score_all(il)
    base_kv = _view_2d(kv_all, kv_all.ne[0], state.get_n_rows(), 0)
    base_score = _view_2d(score_all, score_all.ne[0], state.get_n_rows(), 0)
    return ggml.concat(base_kv, state_kv, 1), ggml.concat(base_score, state_score, 1)


def build_state_persist(g: GraphContext, inp: DSV4CompInput, state: DSV4CompState, state_kv: Tensor,
                        state_score: Tensor, il: int) -> None:
    """The rows of this ubatch kept in the compressor state (its snapshot for rollback needs
    n_rs_seq > 0: none here)."""
    persist_kv = ggml.get_rows(state_kv, inp.state_persist_src_idxs)
    persist_score = ggml.get_rows(state_score, inp.state_persist_src_idxs)
    ggml.build_forward_expand(g.gf, state.cpy_kv(persist_kv, inp.state_persist_dst_idxs, il))
    ggml.build_forward_expand(g.gf, state.cpy_score(persist_score, inp.state_persist_dst_idxs, il))


def build_comp_update(g: GraphContext, inp: DSV4CompInput, state: DSV4CompState, cache, state_kv: Tensor,
                      state_score: Tensor, norm: Tensor, n_embd_head: int, name: str, il: int) -> None:
    """A ratio-4 compressor's part of build_attention_impl (CSA, then the indexer's): the completed
    blocks compressed from [state | current rows] over overlapping windows, rotated when the cache
    rotates its keys, written to the compressed cache; then the state keeps this ubatch's rows."""
    if inp.state_write_idxs is None:
        raise GGMLAbort("llama.cpp would abort (deepseek4.cpp GGML_ASSERT(state_write_idxs))")
    source_kv, source_score = _state_source(state, state_kv, state_score, il)
    comp = build_overlap_compressed_kv(g, source_kv, source_score, inp.state_read_idxs, inp.state_write_pos, norm,
                                       DSV4_CSA_RATIO, n_embd_head, name, il)
    if inp.k_rot is not None:
        comp = mul_mat_hadamard(comp, inp.k_rot)
        g.cb(comp, f"{name}_rot", il)
    ggml.build_forward_expand(g.gf, cache.cpy_k(comp, inp.state_write_idxs, il))
    build_state_persist(g, inp, state, state_kv, state_score, il)


def _compress_tail(g: GraphContext, values: Tensor, scores: Tensor, comp_pos: Tensor, norm: Tensor, n_embd_head: int,
                   name: str, il: int) -> Tensor:
    """The end both compressors share: a softmax over each block's rows weighs their values, summed,
    RMS-normed and roped (at the block's position, on the last n_rot values)."""
    hp = g.hparams
    values = ggml.cont(ggml.permute(values, 1, 0, 2, 3))
    scores = ggml.cont(ggml.permute(scores, 1, 0, 2, 3))
    comp = ggml.sum_rows(ggml.mul(values, ggml.soft_max(scores)))
    comp = ggml.cont(ggml.permute(comp, 1, 0, 2, 3))
    g.cb(comp, name, il)
    comp = g.build_norm(comp, norm, None, LLM_NORM_RMS, il)
    g.cb(comp, name, il)
    comp = ggml.rope_ext(comp, comp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(comp, name, il)
    return comp


def build_hca_compressed_kv(g: GraphContext, kv_state: Tensor, score_state: Tensor, read_idxs: Tensor,
                            comp_pos: Tensor, norm: Tensor, n_embd_head: int, name: str, il: int) -> Tensor:
    """graph::build_hca_compressed_kv_from_state: each block's 128 rows gathered and compressed."""
    n_blocks = comp_pos.ne[0]
    kv = ggml.reshape(ggml.get_rows(kv_state, read_idxs), n_embd_head, DSV4_HCA_RATIO, n_blocks)
    g.cb(kv, name, il)
    score = ggml.reshape(ggml.get_rows(score_state, read_idxs), n_embd_head, DSV4_HCA_RATIO, n_blocks)
    g.cb(score, name, il)
    return _compress_tail(g, kv, score, comp_pos, norm, n_embd_head, name, il)


def _append_zero_row(t: Tensor, neg_inf: bool) -> Tensor:
    """dsv4_append_zero_row: a row of zeros (of -inf) after t's rows, for the first block's missing half."""
    row = ggml.view(t, (t.ne[0],), (), 0)
    row = ggml.scale_bias(row, 0.0, -math.inf) if neg_inf else ggml.scale(row, 0.0)
    return ggml.concat(t, ggml.reshape(row, t.ne[0], 1), 1)


def build_overlap_compressed_kv(g: GraphContext, kv_state: Tensor, score_state: Tensor, read_idxs: Tensor,
                                comp_pos: Tensor, norm: Tensor, ratio: int, n_embd_head: int, name: str,
                                il: int) -> Tensor:
    """graph::build_overlap_compressed_kv_from_state: the rows hold two halves (the previous
    block's part, then the current block's); each block gathers ratio rows of each half and
    compresses the 2 * ratio of them."""
    n_blocks = comp_pos.ne[0]
    kv_state = _append_zero_row(kv_state, False)
    score_state = _append_zero_row(score_state, True)
    n_read = ratio * n_blocks
    kv_rows = ggml.get_rows(kv_state, read_idxs)
    score_rows = ggml.get_rows(score_state, read_idxs)

    def half(rows: Tensor, offset: int) -> Tensor:
        return ggml.reshape(ggml.cont(ggml.view(rows, (n_embd_head, n_read), (rows.nb[1],), offset)),
                            n_embd_head, ratio, n_blocks)

    kv_prev = half(kv_rows, 0)
    g.cb(kv_prev, name, il)
    score_prev = half(score_rows, 0)
    g.cb(score_prev, name, il)
    kv_cur = half(kv_rows, n_read * kv_rows.nb[1] + ggml.row_size(kv_rows.type, n_embd_head))
    score_cur = half(score_rows, n_read * score_rows.nb[1] + ggml.row_size(score_rows.type, n_embd_head))
    values = ggml.concat(kv_prev, kv_cur, 1)
    scores = ggml.concat(score_prev, score_cur, 1)
    return _compress_tail(g, values, scores, comp_pos, norm, n_embd_head, name, il)


def build_lid_top_k(g: GraphContext, layer: Layer, inp: DSV4Input, qr: Tensor, cur: Tensor, inp_pos: Tensor,
                    il: int) -> Tensor:
    """graph::build_lid_top_k: the lightning indexer's query heads (roped, Hadamard-rotated) score
    the compressed keys of its cache with the fused LIGHTNING_INDEXER (cparams.fused_lid is always
    on); the top-k compressed rows per token."""
    hp = g.hparams
    n_head_idx, head_idx, nt = hp.indexer_n_head, hp.indexer_head_size, cur.ne[1]
    if head_idx < hp.n_rot():
        raise GGMLAbort(f"llama.cpp would abort (build_lid_top_k GGML_ASSERT): the indexer key length {head_idx} is "
                        f"below the rope dimensions {hp.n_rot()}")
    q = ggml.reshape(g.build_lora_mm(layer.indexer_attn_q_b, qr), head_idx, n_head_idx, nt)
    g.cb(q, "lid_q", il)
    q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q, "lid_q_rope", il)
    q = mul_mat_hadamard(q, inp.lid.k_rot)
    g.cb(q, "lid_q_rot", il)
    weights = ggml.scale(g.build_lora_mm(layer.indexer_proj, cur), 1.0 / math.sqrt(head_idx * n_head_idx))
    g.cb(weights, "lid_weights", il)
    k = inp.kv.lid.get_k(il)
    n_lid = inp.lid.kq_mask.ne[0]
    k = ggml.view(k, (k.ne[0], k.ne[1], n_lid, k.ne[3]), (k.nb[1], k.nb[2], k.nb[3]), 0)
    g.cb(k, "lid_k", il)
    n_stream = k.ne[3]
    q = ggml.view(q, (q.ne[0], q.ne[1], q.ne[2] // n_stream, n_stream), (q.nb[1], q.nb[2], q.nb[3] // n_stream), 0)
    weights = ggml.view(weights, (weights.ne[0], weights.ne[1] // n_stream, weights.ne[2], n_stream),
                        (weights.nb[1], weights.nb[2] // n_stream, weights.nb[3] // n_stream), 0)
    score = ggml.lightning_indexer(q, k, weights, inp.lid.kq_mask)
    g.cb(score, "lid_score_masked", il)
    top_k = ggml.cont(ggml.top_k(score, min(score.ne[0], hp.indexer_top_k)))
    g.cb(top_k, "lid_top_k", il)
    return top_k


def _rotate_and_store(g: GraphContext, inp: DSV4Input, q: Tensor, kv: Tensor, il: int) -> tuple[Tensor, Tensor]:
    """The start the three attentions share: Q and K=V Hadamard-rotated when the raw cache rotates
    its keys, both expanded, K stored in the raw window cache."""
    if inp.k_rot is not None:
        q = mul_mat_hadamard(q, inp.k_rot)
        kv = mul_mat_hadamard(kv, inp.k_rot)
    ggml.build_forward_expand(g.gf, q)
    ggml.build_forward_expand(g.gf, kv)
    ggml.build_forward_expand(g.gf, inp.kv.raw.swa.cpy_k(kv, inp.k_idxs, il))
    return q, kv


def _unrotate(inp: DSV4Input, out: Tensor) -> Tensor:
    return mul_mat_hadamard(out, inp.k_rot) if inp.k_rot is not None else out


def build_compressed_attention(g: GraphContext, inp: DSV4Input, comp_inp: DSV4CompInput, comp_cache, q: Tensor,
                               kv: Tensor, sinks: Tensor, kq_scale: float, il: int, top_k) -> Tensor:
    """graph::build_csa_lid_attention (top_k: the indexer's, which narrows the compressed rows' mask)
    and graph::build_hca_attention (top_k None: every compressed row): MQA with sinks over the raw
    window's keys followed by the compressed cache's, under both masks side by side."""
    which = "csa" if top_k is not None else "hca"
    q, kv = _rotate_and_store(g, inp, q, kv, il)
    raw_k = inp.kv.raw.swa.get_k(il)
    g.cb(raw_k, f"{which}_raw_k", il)
    comp_k = comp_cache.get_k(il)
    n_comp = comp_inp.kq_mask.ne[0]
    comp_k = ggml.view(comp_k, (comp_k.ne[0], comp_k.ne[1], n_comp, comp_k.ne[3]),
                       (comp_k.nb[1], comp_k.nb[2], comp_k.nb[3]), 0)
    g.cb(comp_k, f"{which}_comp_k", il)
    k_all = ggml.concat(raw_k, comp_k, 2)
    g.cb(k_all, f"{which}_k_all", il)
    comp_mask = comp_inp.kq_mask
    if top_k is not None:
        comp_mask = g.build_top_k_mask(comp_mask, top_k, ggml.T.F16 if g.cparams.flash_attn else ggml.T.F32)
        g.cb(comp_mask, "csa_top_k_mask", il)
    kq_mask = ggml.concat(inp.kq_mask, comp_mask, 0)
    g.cb(kq_mask, "csa_lid_kq_mask" if top_k is not None else "hca_kq_mask", il)
    out = _unrotate(inp, g.build_attn_mha(q, k_all, k_all, kq_mask, kq_scale, il, sinks))
    g.cb(out, "attn_csa_lid" if top_k is not None else "attn_hca", il)
    return out


def build_raw_attention(g: GraphContext, inp: DSV4Input, q: Tensor, kv: Tensor, sinks: Tensor, kq_scale: float,
                        il: int) -> Tensor:
    """graph::build_raw_attention: MQA with sinks over the raw window only (a layer without compression)."""
    q, kv = _rotate_and_store(g, inp, q, kv, il)
    k = inp.kv.raw.swa.get_k(il)
    out = _unrotate(inp, g.build_attn_mha(q, k, k, inp.kq_mask, kq_scale, il, sinks))
    g.cb(out, "attn_raw", il)
    return out
