"""LLM_ARCH_LFM2 (src/models/lfm2.cpp): Liquid LFM2 (350M to 2.6B), dense.

Gated short-convolution blocks (in_proj to B, C, x; a depthwise conv over the last l_cache-1
inputs kept in recurrent state) and GQA attention blocks (the layers with KV heads, in a KV cache
of llama_memory_hybrid; with attention.sliding_window, every one of them slides, in the window
cache of llama_memory_hybrid_iswa), each followed by a SwiGLU FFN; RMS-normed Q/K, NEOX rope.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Layer, Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_shortconv_l_cache = ml.get_u32("%s.shortconv.l_cache")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.is_recr_arr = tuple(hp.n_head_kv(il) == 0 for il in range(hp.n_layer))
    hp.n_layer_dense_lead = hp.n_layer   # every FFN dense (lfm2moe shares the graph)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window", 0)
    if hp.n_swa > 0:   # every attention layer slides: llama_memory_hybrid_iswa, graph<true>
        hp.swa_type = LLAMA_SWA_TYPE_STANDARD
        hp.is_swa_arr = tuple(il < hp.n_layer and not hp.is_recr(il) for il in range(hp.n_layer_all))
    require(ml, hp.n_shortconv_l_cache > 1, f"{ml.key('%s.shortconv.l_cache')} must be above 1")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd = hp.n_embd
    load_embd_output_tensors(c, model)
    for i, layer in enumerate(model.layers):
        n_ff = hp.n_ff(i)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        load_operator_tensors(c, layer, i)
    load_dense_out_tensors(c, model)


def load_dense_out_tensors(c: TensorCreator, model: Model) -> None:
    """LFM2-ColBert-350M's projection of the embeddings to n_embd_out, after the layers (lfm2 and
    lfm2moe create the same; build_dense_out applies it)."""
    hp = model.hparams
    model.dense_2_out_layers = c.create_tensor(tn("DENSE_2_OUT", "weight"), (hp.n_embd, hp.n_embd_out()),
                                               TENSOR_NOT_REQUIRED)
    model.dense_2_out_layers_b = c.create_tensor(tn("DENSE_2_OUT", "bias"), (hp.n_embd_out(),), TENSOR_NOT_REQUIRED)


def load_embd_output_tensors(c: TensorCreator, model: Model) -> None:
    """Token embeddings, the LFM2 output norm, and the output (tied to the embeddings if absent);
    lfm2 and lfm2moe create the same."""
    n_embd, n_vocab = model.hparams.n_embd, model.hparams.n_vocab
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM_LFM2", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)


def load_operator_tensors(c: TensorCreator, layer: Layer, i: int) -> None:
    """A layer's operator after its FFN tensors: the operator norm, then GQA attention with Q/K
    norms (layers with KV heads) or a short convolution (lfm2 and lfm2moe create the same)."""
    hp = c.hparams
    n_embd = hp.n_embd
    layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
    if not hp.is_recr(i):
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (hp.n_embd_head_k(),))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (hp.n_embd_head_k(),))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
    else:
        layer.shortconv_conv = c.create_tensor(tn("SHORTCONV_CONV", "weight", i), (hp.n_shortconv_l_cache, n_embd))
        layer.shortconv_in_proj = c.create_tensor(tn("SHORTCONV_INPROJ", "weight", i), (n_embd, 3 * n_embd))
        layer.shortconv_out_proj = c.create_tensor(tn("SHORTCONV_OUTPROJ", "weight", i), (n_embd, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_lfm2::graph<iswa> (iswa: a sliding window, the attention inputs of
    llama_memory_hybrid_iswa), also llama_model_lfm2moe's graph: expert FFNs past the leading
    dense layers."""
    model, hp = g.model, g.hparams
    cur = g.build_inp_embd(model.tok_embd)
    g.cb(cur, "model.embed_tokens", -1)
    ggml.build_forward_expand(g.gf, cur)
    inp = g.build_inp_mem_hybrid_iswa() if hp.swa_type == LLAMA_SWA_TYPE_STANDARD else g.build_inp_mem_hybrid()
    inp_pos = g.build_inp_pos()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        prev_cur = cur
        cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "model.layers.{}.operator_norm", il)
        if hp.is_recr(il):
            cur = build_shortconv_block(g, cur, inp.rs, il)
        else:
            cur = build_attn_block(g, cur, inp_pos, inp.attn, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            prev_cur = ggml.get_rows(prev_cur, inp_out_ids)
        cur = ggml.add(prev_cur, cur)
        ffn_norm_out = g.build_norm(cur, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(ffn_norm_out, "model.layers.{}.ffn_norm", il)
        if il >= hp.n_layer_dense_lead:
            ffn_out = g.build_moe_ffn(ffn_norm_out, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                      LLM_FFN_SILU, True, hp.expert_weights_scale, hp.expert_gating_func, il)
        else:
            ffn_out = g.build_ffn(ffn_norm_out, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                                  LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(ffn_norm_out, "model.layers.{}.ffn_out", il)   # sic: names the norm's output
        cur = ggml.add(cur, ffn_out)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)

    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    if not g.cparams.embeddings:   # with embeddings the graph ends at result_norm (src/models/lfm2.cpp)
        cur = g.build_lora_mm(model.output, cur)
        g.cb(cur, "result_output", -1)
        g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


def build_attn_block(g: GraphContext, cur, inp_pos, inp_attn, il: int):
    hp, layer = g.hparams, g.model.layers[il]
    n_embd_head = hp.n_embd_head_v()
    q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
    q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
    g.cb(q, "model.layers.{}.self_attn.q_layernorm", il)
    k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
    g.cb(k, "model.layers.{}.self_attn.k_layernorm", il)
    q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
    g.cb(cur, "model.layers.{}.self_attn.out_proj", il)
    return cur


def build_shortconv_block(g: GraphContext, cur, inp_rs, il: int):
    """The gated short convolution, causal, n_rs_seq 0 (one conv state written per sequence)."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    mem = inp_rs.mem
    kv_head, n_seqs = mem.get_head(), ub.n_seqs
    n_seq_tokens = ub.n_tokens // n_seqs
    d_conv = hp.n_shortconv_l_cache - 1

    cur = ggml.reshape(cur, cur.ne[0], n_seq_tokens, n_seqs)
    bcx = g.build_lora_mm(layer.shortconv_in_proj, cur)
    g.cb(bcx, "model.layers.{}.conv.in_proj", il)
    chunk = bcx.ne[0] // 3
    es = ggml.type_size(bcx.type)
    b, c, x = (ggml.view(bcx, (chunk, bcx.ne[1], bcx.ne[2]), (bcx.nb[1], bcx.nb[2]), i * chunk * es) for i in range(3))
    bx = ggml.transpose(ggml.mul(b, x))

    conv_state = mem.r_l[il]
    conv_rs = g.build_rs(inp_rs, conv_state, hp.n_embd_r(), n_seqs)
    conv = ggml.reshape(conv_rs, d_conv, hp.n_embd, n_seqs)
    bx = ggml.concat(conv, bx, 0)

    row_size = ggml.row_size(conv_state.type, d_conv * hp.n_embd)
    snap = ggml.view(bx, (d_conv, bx.ne[1], bx.ne[2]), (bx.nb[1], bx.nb[2]), (bx.ne[0] - d_conv) * ggml.type_size(bx.type))
    dst = ggml.view(conv_state, (d_conv * hp.n_embd, n_seqs), (conv_state.nb[1],), kv_head * row_size)
    ggml.build_forward_expand(g.gf, ggml.cpy(snap, dst))

    conv_out = ggml.ssm_conv(bx, layer.shortconv_conv)
    g.cb(conv_out, "model.layers.{}.conv.conv", il)
    y = ggml.mul(c, conv_out)
    y = g.build_lora_mm(layer.shortconv_out_proj, y)
    g.cb(y, "model.layers.{}.conv.out_proj", il)
    return ggml.reshape(y, y.ne[0], n_seq_tokens * n_seqs)
