"""LLM_ARCH_HY_V4 (src/models/hy-v4.cpp): Tencent Hy4-preview.

DeepSeek-V3's multi-head latent attention (absorbed, over a K-only cache) with a learnable sink per
head and an elementwise sigmoid gate on the decompressed output before wo; with the indexer keys
DeepSeek sparse attention (llama_kv_cache_dsa: a lightning indexer on its "full" layers, rope on the
last n_rot of each row and no Hadamard rotation, its top-k reused by the "shared" layers after it).
Independent hyper-connections: hc residual streams, each sub-block reading a sigmoid-weighted sum
of them (hc_pre) and adding its output back to every stream by a second gate (hc_post), all in f32
and spelt out in plain ops; a last mixer (hc_head) before the output norm. Leading dense layers,
then sigmoid-routed experts (their SwiGLU clamped by one ggml_swiglu_clamp) beside shared experts.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import Tensor
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM, LLM_NORM_RMS, GraphContext, c_reciprocal
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Layer, Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM   # consecutive pairs, as the reference rotates them


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla")
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0)
    # the routed experts' SwiGLU limit only: the shared and dense FFNs are not clamped
    hp.swiglu_clamp_exp = ml.get_key_or_arr_f32("%s.swiglu_clamp_exp", hp.n_layer_all, 0.0)
    hp.dsv4_hc_mult = ml.get_u32("%s.hyper_connection.count")
    hp.dsv4_hc_eps = ml.get_f32("%s.hyper_connection.epsilon")
    hp.hc_magnitude = ml.get_f32("%s.hyper_connection.magnitude")
    hp.indexer_n_head = ml.get_u32("%s.attention.indexer.head_count", 0)
    hp.indexer_head_size = ml.get_u32("%s.attention.indexer.key_length", 0)
    hp.indexer_top_k = ml.get_u32("%s.attention.indexer.top_k", 0)
    if hp.indexer_top_k > 0:
        hp.f_norm_eps = hp.f_norm_rms_eps   # the indexer's k_norm LayerNorm
        if hp.indexer_n_head == 0 or hp.indexer_head_size <= hp.n_rot():
            ml.fail("hy_v4: bad indexer head count / key length")
        full = (0,) * hp.n_layer
        if ml.has("%s.attention.indexer.types"):
            full = ml.get_key_or_arr("%s.attention.indexer.types", hp.n_layer)
        hp.is_indexer_full_arr = tuple(v != 0 for v in full)
        if not hp.is_indexer_full(0):
            ml.fail("hy_v4: layer 0 must own an indexer, nothing precedes it to share")
    require(ml, hp.is_mla(), "the hy_v4 architecture requires MLA (key_length_mla and value_length_mla)")
    if hp.n_layer_dense_lead < hp.n_layer:   # build_moe_ffn's GGML_ABORT on an unknown gating function
        require_gating_func(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_head, n_expert, hc = hp.n_embd, hp.n_vocab, hp.n_head(), hp.n_expert, hp.dsv4_hc_mult
    n_embd_head_k_mla, n_embd_head_v_mla = hp.n_embd_head_k_mla(), hp.n_embd_head_v_mla()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k_mla - n_embd_head_qk_rope
    require(c.ml, n_embd_head_qk_nope >= 1,
            f"key_length_mla {n_embd_head_k_mla} must exceed the rope dimensions {n_embd_head_qk_rope}")
    q_lora_rank, kv_lora_rank = hp.n_lora_q, hp.n_lora_kv
    n_ff_exp, n_ff_shexp = hp.n_ff_exp(), hp.n_ff_exp() * hp.n_expert_shared
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    model.hc_head_fn = c.create_tensor(tn("HC_HEAD_FN", "weight"), (hc * n_embd, hc))
    model.hc_head_base = c.create_tensor(tn("HC_HEAD_BASE", "weight"), (hc,))
    model.hc_head_scale = c.create_tensor(tn("HC_HEAD_SCALE", "weight"), (1,))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_sinks = c.create_tensor(tn("ATTN_SINKS", "weight", i), (n_head,))
        layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank))
        layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,))
        layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head * n_embd_head_k_mla))
        layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + n_embd_head_qk_rope))
        layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,))
        layer.wk_b = c.create_tensor(tn("ATTN_K_B", "weight", i), (n_embd_head_qk_nope, kv_lora_rank, n_head))
        layer.wv_b = c.create_tensor(tn("ATTN_V_B", "weight", i), (kv_lora_rank, n_embd_head_v_mla, n_head))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_v_mla, n_embd))
        layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, n_head * n_embd_head_v_mla))
        if hp.indexer_top_k > 0 and hp.is_indexer_full(i):   # the shared layers have no indexer
            layer.indexer_attn_q_b = c.create_tensor(tn("INDEXER_ATTN_Q_B", "weight", i),
                                                     (q_lora_rank, hp.indexer_n_head * hp.indexer_head_size))
            layer.indexer_attn_k = c.create_tensor(tn("INDEXER_ATTN_K", "weight", i), (n_embd, hp.indexer_head_size))
            layer.indexer_k_norm = c.create_tensor(tn("INDEXER_K_NORM", "weight", i), (hp.indexer_head_size,))
            layer.indexer_k_norm_b = c.create_tensor(tn("INDEXER_K_NORM", "bias", i), (hp.indexer_head_size,))
            layer.indexer_proj = c.create_tensor(tn("INDEXER_PROJ", "weight", i), (n_embd, hp.indexer_n_head))
        layer.hc_attn_fn = c.create_tensor(tn("HC_ATTN_FN", "weight", i), (hc * n_embd, 2 * hc))
        layer.hc_attn_base = c.create_tensor(tn("HC_ATTN_BASE", "weight", i), (2 * hc,))
        layer.hc_attn_scale = c.create_tensor(tn("HC_ATTN_SCALE", "weight", i), (2,))
        layer.hc_ffn_fn = c.create_tensor(tn("HC_FFN_FN", "weight", i), (hc * n_embd, 2 * hc))
        layer.hc_ffn_base = c.create_tensor(tn("HC_FFN_BASE", "weight", i), (2 * hc,))
        layer.hc_ffn_scale = c.create_tensor(tn("HC_FFN_SCALE", "weight", i), (2,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        if i < hp.n_layer_dense_lead:
            n_ff = hp.n_ff()
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        else:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), TENSOR_NOT_REQUIRED)
            if n_expert == 0:
                c.ml.fail("n_expert must be > 0")
            if hp.n_expert_used() == 0:
                c.ml.fail("n_expert_used must be > 0")
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp))
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd))
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp))


def hc_reduce(x: Tensor, w: Tensor, hc: int, n_embd: int, nt: int, out_type: int) -> Tensor:
    """hy_v4_hc_reduce: the streams x[:, i, :] weighted by w[i, :] and summed, in f32."""
    x_f32 = ggml.cast(x, ggml.T.F32)
    result = None
    for ih in range(hc):
        xh = ggml.view(x_f32, (n_embd, nt), (x_f32.nb[2],), ih * x_f32.nb[1])
        wh = ggml.view(w, (1, nt), (w.nb[1],), ih * w.nb[0])
        cur = ggml.mul(xh, wh)
        result = ggml.add(result, cur) if result is not None else cur
    return ggml.cast(result, out_type)


def build_hc_pre(g: GraphContext, x: Tensor, hc_fn: Tensor, hc_scale: Tensor, hc_base: Tensor,
                 il: int) -> tuple[Tensor, Tensor]:
    """graph::build_hc_pre: the sub-block's input (the streams under the pre gates) and the post gates."""
    hp = g.hparams
    hc, n_embd, nt = hp.dsv4_hc_mult, hp.n_embd, x.ne[2]
    flat = ggml.reshape(x, hc * n_embd, nt)
    flat_norm = ggml.rms_norm(flat, hp.f_norm_rms_eps)
    mixes = g.mul_mat_no_lora(hc_fn, flat_norm)
    g.cb(mixes, "hc_mixes", il)
    scale_pre = ggml.view(hc_scale, (1,), (), 0)
    scale_post = ggml.view(hc_scale, (1,), (), ggml.row_size(hc_scale.type, 1))
    base_pre = ggml.view(hc_base, (hc,), (), 0)
    base_post = ggml.view(hc_base, (hc,), (), ggml.row_size(hc_base.type, hc))
    pre = ggml.view(mixes, (hc, nt), (mixes.nb[1],), 0)
    pre = ggml.mul(pre, scale_pre)
    pre = ggml.add(pre, base_pre)
    pre = ggml.unary(pre, "SIGMOID")
    pre = ggml.scale_bias(pre, 1.0, hp.dsv4_hc_eps)
    g.cb(pre, "hc_pre", il)
    post = ggml.view(mixes, (hc, nt), (mixes.nb[1],), ggml.row_size(mixes.type, hc))
    post = ggml.mul(post, scale_post)
    post = ggml.add(post, base_post)
    post = ggml.unary(post, "SIGMOID")
    post = ggml.scale(post, hp.hc_magnitude)
    post = ggml.scale_bias(post, 1.0, hp.dsv4_hc_eps)
    g.cb(post, "hc_post_gate", il)
    return hc_reduce(x, pre, hc, n_embd, nt, x.type), post


def build_hc_post(g: GraphContext, x: Tensor, residual: Tensor, post: Tensor) -> Tensor:
    """graph::build_hc_post: x added to every stream of the residual under its post gate, in f32."""
    hc, n_embd, nt = g.hparams.dsv4_hc_mult, g.hparams.n_embd, x.ne[1]
    x_f32 = ggml.cast(x, ggml.T.F32)
    post_f32 = ggml.cast(post, ggml.T.F32)
    res_f32 = ggml.cast(residual, ggml.T.F32)
    out = None
    for i in range(hc):
        res_i = ggml.view(res_f32, (n_embd, nt), (res_f32.nb[2],), i * res_f32.nb[1])
        post_i = ggml.view(post_f32, (1, nt), (post_f32.nb[1],), i * post_f32.nb[0])
        cur = ggml.add(res_i, ggml.mul(x_f32, post_i))
        cur = ggml.reshape(cur, n_embd, 1, nt)
        out = ggml.concat(out, cur, 1) if out is not None else cur
    return ggml.cast(out, residual.type)


def build_hc_head(g: GraphContext, x: Tensor) -> Tensor:
    """graph::build_hc_head: the streams mixed into one by the head's gates."""
    hp, model = g.hparams, g.model
    hc, n_embd, nt = hp.dsv4_hc_mult, hp.n_embd, x.ne[2]
    flat = ggml.reshape(x, hc * n_embd, nt)
    flat_norm = ggml.rms_norm(flat, hp.f_norm_rms_eps)
    mixes = g.mul_mat_no_lora(model.hc_head_fn, flat_norm)
    g.cb(mixes, "hc_head_mixes", -1)
    pre = ggml.mul(mixes, model.hc_head_scale)
    pre = ggml.add(pre, model.hc_head_base)
    pre = ggml.unary(pre, "SIGMOID")
    pre = ggml.scale_bias(pre, 1.0, hp.dsv4_hc_eps)
    g.cb(pre, "hc_head_pre", -1)
    return hc_reduce(x, pre, hc, n_embd, nt, x.type)


def build_indexer_top_k(g: GraphContext, inp_attn_dsa, layer: Layer, cur: Tensor, qr: Tensor, inp_pos: Tensor,
                        il: int) -> Tensor:
    """graph::build_indexer_top_k: the lightning indexer's scores of the cached keys (fused: cparams.fused_lid
    is on), the top-k of them."""
    hp = g.hparams
    n_tokens = g.ubatch.n_tokens
    n_indexer_head, n_embd_indexer = hp.indexer_n_head, hp.indexer_head_size
    n_embd_indexer_nope = n_embd_indexer - hp.n_rot()
    iq = g.mul_mat_no_lora(layer.indexer_attn_q_b, qr)
    iq = ggml.reshape(iq, n_embd_indexer, n_indexer_head, n_tokens)
    iq = ggml.rope_set_offset(ggml.rope_ext(iq, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn),
                              n_embd_indexer_nope)
    g.cb(iq, "indexer_q", il)
    ik = g.mul_mat_no_lora(layer.indexer_attn_k, cur)
    ik = g.build_norm(ik, layer.indexer_k_norm, layer.indexer_k_norm_b, LLM_NORM, il)
    ik = ggml.reshape(ik, n_embd_indexer, 1, n_tokens)
    ik = ggml.rope_set_offset(ggml.rope_ext(ik, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn),
                              n_embd_indexer_nope)
    g.cb(ik, "indexer_k", il)
    kv_lid = inp_attn_dsa.kv.lid
    ggml.build_forward_expand(g.gf, kv_lid.cpy_k(ik, inp_attn_dsa.k_idxs_lid, il))
    iw = g.mul_mat_no_lora(layer.indexer_proj, cur)
    ik = kv_lid.get_k(il)
    n_stream = ik.ne[3]
    iq = ggml.view(iq, (iq.ne[0], iq.ne[1], iq.ne[2] // n_stream, n_stream),
                   (iq.nb[1], iq.nb[2], iq.nb[3] // n_stream), 0)
    iw = ggml.view(iw, (iw.ne[0], iw.ne[1] // n_stream, iw.ne[2], n_stream),
                   (iw.nb[1], iw.nb[2] // n_stream, iw.nb[3] // n_stream), 0)
    iw = ggml.scale(iw, c_reciprocal(math.sqrt(n_embd_indexer * n_indexer_head)))
    # the fused GGML_OP_LIGHTNING_INDEXER (cparams.fused_lid, on as for deepseek32)
    score = ggml.lightning_indexer(iq, ik, iw, inp_attn_dsa.kq_mask_lid)
    g.cb(score, "indexer_score", il)
    return ggml.cont(ggml.top_k(score, min(score.ne[0], hp.indexer_top_k)))


def build_attention(g: GraphContext, inp_attn, layer: Layer, cur: Tensor, inp_pos: Tensor, kq_scale: float,
                    il: int, top_k: Tensor | None = None, qr: Tensor | None = None) -> Tensor:
    """graph::build_attention and graph::build_attention_dsa (top_k given, qr the normed Q LoRA
    projection): MLA with the absorption, the sinks, the gated output, wo."""
    hp = g.hparams
    n_tokens, n_head = g.ubatch.n_tokens, hp.n_head()
    n_embd_head_k = hp.n_embd_head_k_mla()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k - n_embd_head_qk_rope
    kv_lora_rank = hp.n_lora_kv
    if qr is None:
        qr = g.mul_mat_no_lora(layer.wq_a, cur)
        qr = g.build_norm(qr, layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
    q = g.mul_mat_no_lora(layer.wq_b, qr)
    row_q = ggml.row_size(q.type, n_embd_head_k)
    q_nope = ggml.view(q, (n_embd_head_qk_nope, n_head, n_tokens), (row_q, row_q * n_head), 0)
    q_pe = ggml.view(q, (n_embd_head_qk_rope, n_head, n_tokens), (row_q, row_q * n_head),
                     ggml.row_size(q.type, n_embd_head_qk_nope))
    kv_cmpr_pe = g.mul_mat_no_lora(layer.wkv_a_mqa, cur)
    row = ggml.row_size(kv_cmpr_pe.type, kv_lora_rank + n_embd_head_qk_rope)
    kv_cmpr = ggml.view(kv_cmpr_pe, (kv_lora_rank, n_tokens), (row,), 0)
    k_pe = ggml.view(kv_cmpr_pe, (n_embd_head_qk_rope, 1, n_tokens), (row, row),
                     ggml.row_size(kv_cmpr_pe.type, kv_lora_rank))
    q_pe = ggml.rope_ext(q_pe, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q_pe, "q_pe", il)
    k_pe = ggml.rope_ext(k_pe, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(k_pe, "k_pe", il)
    kv_cmpr = g.build_norm(kv_cmpr, layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)
    g.cb(kv_cmpr, "kv_cmpr", il)
    q_nope = ggml.permute(q_nope, 0, 2, 1, 3)
    q_nope_absorbed = ggml.permute(g.mul_mat_no_lora(layer.wk_b, q_nope), 0, 2, 1, 3)
    q_cur = ggml.concat(q_nope_absorbed, q_pe, 0)   # rope last: build_rope_shift works in place
    kv_cmpr = ggml.reshape(kv_cmpr, kv_lora_rank, 1, n_tokens)
    k_cur = ggml.concat(kv_cmpr, k_pe, 0)
    if top_k is None:
        attn = g.build_attn_k(inp_attn, None, None, q_cur, k_cur, kv_cmpr, kq_scale, il, layer.wv_b, layer.attn_sinks)
    else:
        attn = g.build_attn_k_dsa(inp_attn, None, None, q_cur, k_cur, kv_cmpr, layer.wv_b, top_k, kq_scale, il,
                                  layer.attn_sinks)
    g.cb(attn, "attn_kqv", il)
    gate = ggml.unary(g.mul_mat_no_lora(layer.wqkv_gate, cur), "SIGMOID")
    attn = ggml.mul(attn, gate)
    g.cb(attn, "attn_gated", il)
    out = g.build_lora_mm(layer.wo, attn)
    g.cb(out, "attn_out", il)
    return out


def build(g: GraphContext) -> None:
    """llama_model_hy_v4::graph"""
    model, hp = g.model, g.hparams
    hc, n_embd, n_tokens = hp.dsv4_hc_mult, hp.n_embd, g.ubatch.n_tokens
    kq_scale = c_reciprocal(math.sqrt(hp.n_embd_head_k_mla()))
    is_dsa = hp.indexer_top_k > 0
    inp = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_k_dsa() if is_dsa else g.build_attn_inp_k()
    inp_out_ids = g.build_inp_out_ids()
    last_top_k = None

    # the embedding repeated into hc residual streams
    inp_l = ggml.repeat_4d(ggml.reshape(inp, n_embd, 1, n_tokens), n_embd, hc, n_tokens, 1)
    g.cb(inp_l, "hc_init", -1)

    for il, layer in enumerate(model.layers):
        residual = inp_l
        cur, post = build_hc_pre(g, inp_l, layer.hc_attn_fn, layer.hc_attn_scale, layer.hc_attn_base, il)
        cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        if is_dsa:
            qr = g.mul_mat_no_lora(layer.wq_a, cur)
            qr = g.build_norm(qr, layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
            if hp.is_indexer_full(il):
                last_top_k = build_indexer_top_k(g, inp_attn, layer, cur, qr, inp_pos, il)
                g.cb(last_top_k, "top_k", il)
            cur = build_attention(g, inp_attn, layer, cur, inp_pos, kq_scale, il, last_top_k, qr)
        else:
            cur = build_attention(g, inp_attn, layer, cur, inp_pos, kq_scale, il)
        inp_l = build_hc_post(g, cur, residual, post)
        g.cb(inp_l, "hc_attn_out", il)

        residual = inp_l
        cur, post = build_hc_pre(g, inp_l, layer.hc_ffn_fn, layer.hc_ffn_scale, layer.hc_ffn_base, il)
        cur = g.build_norm(cur, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if il < hp.n_layer_dense_lead:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                              LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                      LLM_FFN_SILU, hp.expert_weights_norm, hp.expert_weights_scale,
                                      hp.expert_gating_func, il)
            g.cb(moe_out, "ffn_moe_out", il)
            shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                                None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(shexp, "ffn_shexp", il)
            cur = ggml.add(moe_out, shexp)
            g.cb(cur, "ffn_out", il)
        inp_l = build_hc_post(g, cur, residual, post)
        g.cb(inp_l, "l_out", il)

    # the output rows, picked once after the streams are done
    flat = ggml.get_rows(ggml.reshape(inp_l, n_embd * hc, n_tokens), inp_out_ids)
    inp_l = ggml.reshape(flat, n_embd, hc, g.ubatch.n_outputs)
    cur = build_hc_head(g, inp_l)
    g.cb(cur, "hc_head", -1)
    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.mul_mat_no_lora(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
