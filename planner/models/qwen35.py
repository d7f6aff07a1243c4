"""LLM_ARCH_QWEN35 (src/models/qwen35.cpp): Qwen3.5 dense.

Three gated-delta-net (linear attention) layers to one full-attention layer
(full_attention_interval 4) in llama_memory_hybrid: the attention layers' K/V in a KV cache, the
others' conv and delta-net states in recurrent state, one cell per sequence. Full attention has a
sigmoid output gate fused into Q's projection and interleaved M-RoPE; every block has a norm after
attention and a SwiGLU FFN.
"""
from __future__ import annotations

import math
from typing import Callable

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext, set_name
from ..hparams import LLAMA_ROPE_TYPE_IMROPE, HParams
from ..model import Layer, Model, TensorCreator, require
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .delta_net import build_conv_state, build_gdn_l2_norm, build_recurrent_attn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_IMROPE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.rope_sections = ml.get_rope_sections()
    load_gdn_hparams(ml, hp)
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_gdn_hparams(ml: ModelLoader, hp: HParams) -> None:
    """The gated delta net's sizes and which layers are recurrent: attention.recurrent_layers, or
    all but every full_attention_interval-th layer."""
    hp.ssm_d_conv = ml.get_u32("%s.ssm.conv_kernel")
    hp.ssm_d_inner = ml.get_u32("%s.ssm.inner_size")
    hp.ssm_d_state = ml.get_u32("%s.ssm.state_size")
    hp.ssm_dt_rank = ml.get_u32("%s.ssm.time_step_rank")
    hp.ssm_n_group = ml.get_u32("%s.ssm.group_count")
    # build_layer_attn_linear divides d_inner by the V heads; the delta net asserts S_k == S_v and H_v % H_k == 0
    require(ml, hp.ssm_dt_rank > 0 and hp.ssm_n_group > 0 and hp.ssm_dt_rank % hp.ssm_n_group == 0,
            f"{ml.key('%s.ssm.time_step_rank')} ({hp.ssm_dt_rank}) must be a positive multiple of "
            f"{ml.key('%s.ssm.group_count')} ({hp.ssm_n_group})")
    require(ml, hp.ssm_d_inner == hp.ssm_d_state * hp.ssm_dt_rank,
            f"{ml.key('%s.ssm.inner_size')} ({hp.ssm_d_inner}) must be {ml.key('%s.ssm.state_size')} x "
            f"{ml.key('%s.ssm.time_step_rank')}: the delta net's K and V heads have one size")
    if ml.has("%s.attention.recurrent_layers"):
        hp.is_recr_arr = tuple(bool(x) for x in ml.get_key_or_arr("%s.attention.recurrent_layers", hp.n_layer_all))
    else:
        interval = ml.get_u32("%s.full_attention_interval", 4)
        require(ml, interval > 0, f"{ml.key('%s.full_attention_interval')} is 0 (llama.cpp divides by it)")
        # the NextN (MTP) layers are dense attention: never recurrent
        hp.is_recr_arr = tuple(i < hp.n_layer and (i + 1) % interval != 0 for i in range(hp.n_layer_all))


def load_gdn_tensors(c: TensorCreator, layer: Layer, i: int, flags: int) -> None:
    """A gated delta net layer's projections, conv kernel, decay and norm (load_block_trunk)."""
    hp = c.hparams
    n_embd, key_dim = hp.n_embd, hp.ssm_d_state * hp.ssm_n_group
    value_dim, n_v_heads = hp.ssm_d_state * hp.ssm_dt_rank, hp.ssm_dt_rank
    layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, key_dim * 2 + value_dim), TENSOR_NOT_REQUIRED)
    layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, value_dim), TENSOR_NOT_REQUIRED)
    layer.ssm_conv1d = c.create_tensor(tn("SSM_CONV1D", "weight", i), (hp.ssm_d_conv, key_dim * 2 + value_dim), flags)
    layer.ssm_dt = c.create_tensor(tn("SSM_DT", "bias", i), (hp.ssm_dt_rank,), flags)
    layer.ssm_a = c.create_tensor(tn("SSM_A_NOSCAN", None, i), (hp.ssm_dt_rank,), flags)
    layer.ssm_beta = c.create_tensor(tn("SSM_BETA", "weight", i), (n_embd, n_v_heads), flags)
    layer.ssm_alpha = c.create_tensor(tn("SSM_ALPHA", "weight", i), (n_embd, n_v_heads), flags)
    layer.ssm_norm = c.create_tensor(tn("SSM_NORM", "weight", i), (hp.ssm_d_state,), flags)
    layer.ssm_out = c.create_tensor(tn("SSM_OUT", "weight", i), (value_dim, n_embd), flags)


def load_gated_attn_tensors(c: TensorCreator, layer: Layer, i: int, flags: int) -> None:
    """A full-attention layer: Q and its output gate in one projection, Q/K norms."""
    hp = c.hparams
    n_embd, n_embd_head_k = hp.n_embd, hp.n_embd_head_k()
    c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * hp.n_head(i) * 2, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i),
                        flags)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * hp.n_head(i), n_embd), flags)
    layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,), flags)
    layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,), flags)


def load_ffn_tensors(c: TensorCreator, layer: Layer, i: int, flags: int) -> None:
    """The dense SwiGLU FFN."""
    n_embd, n_ff = c.hparams.n_embd, c.hparams.n_ff()
    layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), flags)
    layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
    layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), flags)


LoadFfn = Callable[[TensorCreator, Layer, int, int], None]


def load_block_trunk(c: TensorCreator, layer: Layer, il: int, flags: int, load_ffn: LoadFfn) -> None:
    """load_block_trunk: the norms, gated attention or the gated delta net, the FFN."""
    n_embd = c.hparams.n_embd
    layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", il), (n_embd,), flags)
    layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", il), (n_embd,), flags)
    if not c.hparams.is_recr(il):
        load_gated_attn_tensors(c, layer, il, flags)
    else:
        load_gdn_tensors(c, layer, il, flags)
    load_ffn(c, layer, il, flags)


def load_block_mtp(c: TensorCreator, layer: Layer, il: int, load_ffn: LoadFfn) -> None:
    """load_block_mtp: a full-attention decoder block and the NextN tensors, counted and
    skipped unless load_mtp (--spec-type draft-mtp)."""
    n_embd, flags = c.hparams.n_embd, c.mtp_flags()
    layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", il), (n_embd,), flags)
    layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", il), (n_embd,), flags)
    load_gated_attn_tensors(c, layer, il, flags)
    load_ffn(c, layer, il, flags)
    c.create_nextn(il, flags, layer)


def load_hybrid_tensors(c: TensorCreator, model: Model, load_ffn: LoadFfn) -> None:
    """llama_model_qwen35(moe)::load_arch_tensors: embeddings, output, the trunk's blocks, the MTP blocks."""
    hp = model.hparams
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (hp.n_embd, hp.n_vocab))
    c.create_output(model, hp.n_embd, hp.n_vocab)
    for il, layer in enumerate(model.layers):
        load_block_trunk(c, layer, il, trunk_flags, load_ffn)
    for il, layer in enumerate(model.layers_nextn, hp.n_layer):
        load_block_mtp(c, layer, il, load_ffn)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    load_hybrid_tensors(c, model, load_ffn_tensors)


def build(g: GraphContext) -> None:
    """llama_model_qwen35::graph"""
    build_hybrid(g, build_layer_attn, build_layer_attn_linear, build_layer_ffn, "model.input_embed", "post_ffn")


def build_hybrid(g: GraphContext, attn, attn_linear, ffn, embd_name: str, post_name: str) -> None:
    """The qwen3next/qwen35/qwen35moe trunk: per layer `attn_linear` (gated delta net) or `attn`
    (gated attention), the residual, the post-attention norm, `ffn`, the residual (named
    post_name, then l_out); the last hidden state is kept (t_h_nextn)."""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    g.cb(inp_l, embd_name, -1)
    inp = g.build_inp_mem_hybrid()
    inp_pos = g.build_inp_pos()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        g.t_layer_inp[il] = inp_l
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        ggml.build_forward_expand(g.gf, cur)
        if hp.is_recr(il):
            cur = attn_linear(g, inp.rs, cur, il)
        else:
            cur = attn(g, inp.attn, cur, inp_pos, il)
        cur = ggml.add(cur, inp_sa)
        g.cb(cur, "attn_residual", il)
        ffn_residual = cur
        attn_post_norm = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(attn_post_norm, "attn_post_norm", il)
        cur = ffn(g, attn_post_norm, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_residual)
        g.cb(cur, post_name, il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "h_nextn", -1)
    g.t_h_nextn = cur
    cur = ggml.get_rows(cur, inp_out_ids)     # embeddings_nextn_masked is false
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


def build_layer_attn(g: GraphContext, inp, cur, inp_pos, il: int):
    """build_layer_attn: Q and its gate from one projection, Q/K norms, M-RoPE, attention, the
    sigmoid gate, the output projection."""
    hp, layer = g.hparams, g.model.layers[il]
    n_embd_head, n_head, n_head_kv, n_tokens = hp.n_embd_head_v(), hp.n_head(il), hp.n_head_kv(il), g.ubatch.n_tokens
    q_full, k, v = g.build_qkv_flat(layer, cur, n_embd_head * 2 * n_head, n_embd_head * n_head_kv,
                                    n_embd_head * n_head_kv, il)
    g.cb(q_full, "Qcur_full", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    es = ggml.type_size(q_full.type)
    q = ggml.view(q_full, (n_embd_head, n_head, n_tokens), (es * n_embd_head * 2, es * n_embd_head * 2 * n_head), 0)
    g.cb(q, "Qcur_reshaped", il)
    q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
    g.cb(q, "Qcur_normed", il)
    k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
    k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
    g.cb(k, "Kcur_normed", il)
    gate = ggml.view(q_full, (n_embd_head, n_head, n_tokens), (es * n_embd_head * 2, es * n_embd_head * 2 * n_head),
                     es * n_embd_head)
    gate = ggml.cont(gate, n_embd_head * n_head, n_tokens)
    g.cb(gate, "gate_reshaped", il)
    v = ggml.reshape(v, n_embd_head, n_head_kv, n_tokens)
    q = ggml.rope_multi(q, inp_pos, None, hp.n_rot(il), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
    k = ggml.rope_multi(k, inp_pos, None, hp.n_rot(il), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q, "Qcur", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    kq_scale = 1.0 / math.sqrt(n_embd_head) if hp.f_attention_scale == 0.0 else hp.f_attention_scale
    cur = g.build_attn(inp, None, None, q, k, v, kq_scale, il)
    g.cb(cur, "attn_pregate", il)
    gate_sigmoid = ggml.unary(gate, "SIGMOID")
    g.cb(gate_sigmoid, "gate_sigmoid", il)
    cur = ggml.mul(cur, gate_sigmoid)
    g.cb(cur, "attn_gated", il)
    cur = g.build_lora_mm(layer.wo, cur)
    g.cb(cur, "attn_output", il)
    return cur


def build_layer_attn_linear(g: GraphContext, inp, cur, il: int, conv_state=build_conv_state, gate_act: str = "SILU"):
    """build_layer_attn_linear: the gated delta net over the conv state and the recurrent state;
    `conv_state` and `gate_act` as build_gdn_core takes them (qwen4exp's differ)."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    n_seqs, num_v_heads = ub.n_seqs, hp.ssm_dt_rank
    n_seq_tokens = ub.n_tokens // n_seqs
    qkv_mixed, z = build_qkvz(g, cur, il)
    beta = g.build_lora_mm(layer.ssm_beta, cur)
    beta = ggml.reshape(beta, 1, num_v_heads, n_seq_tokens, n_seqs)
    g.cb(beta, "beta", il)
    beta = ggml.unary(beta, "SIGMOID")
    g.cb(beta, "beta_sigmoid", il)
    alpha = g.build_lora_mm(layer.ssm_alpha, cur)
    alpha = ggml.reshape(alpha, num_v_heads, n_seq_tokens, n_seqs)
    g.cb(alpha, "alpha", il)
    alpha_softplus = ggml.unary(ggml.add(alpha, layer.ssm_dt), "SOFTPLUS")
    g.cb(alpha_softplus, "a_softplus", il)
    gate = ggml.mul(alpha_softplus, layer.ssm_a)
    g.cb(gate, "gate", il)
    gate = ggml.reshape(gate, 1, num_v_heads, n_seq_tokens, n_seqs)
    # the fused delta net broadcasts K heads over V heads itself: no repeat
    return build_gdn_core(g, inp, qkv_mixed, z, gate, beta, None, il, conv_state, gate_act)


def build_qkvz(g: GraphContext, cur, il: int):
    """build_qkvz: the mixed Q/K/V projection (per sequence) and the output gate z."""
    layer, ub = g.model.layers[il], g.ubatch
    qkv_mixed = g.build_lora_mm(layer.wqkv, cur)
    qkv_mixed = ggml.reshape(qkv_mixed, qkv_mixed.ne[0], ub.n_tokens // ub.n_seqs, ub.n_seqs)
    g.cb(qkv_mixed, "linear_attn_qkv_mixed", il)
    z = g.build_lora_mm(layer.wqkv_gate, cur)
    g.cb(z, "z", il)
    return qkv_mixed, z


def build_gdn_core(g: GraphContext, inp, qkv_mixed, z, gate, beta, repeat_heads, il: int,
                   conv_state=build_conv_state, gate_act: str = "SILU"):
    """The rest of build_layer_attn_linear, shared by qwen3next, qwen35 and qwen4exp: the conv state
    (`conv_state`: build_conv_state's arguments, the input with the previous conv columns before it),
    SSM conv, Q/K/V views, L2 norms, `repeat_heads(q, k)` where K heads are repeated to the V heads,
    the delta net, the norm gated by `gate_act` of z (build_norm_gated) and the output projection."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    n_seqs = ub.n_seqs
    n_seq_tokens = ub.n_tokens // n_seqs
    head_k_dim, num_k_heads, num_v_heads = hp.ssm_d_state, hp.ssm_n_group, hp.ssm_dt_rank
    head_v_dim = hp.ssm_d_inner // num_v_heads
    mem = inp.mem
    conv_states_all, ssm_states_all = mem.r_l[il], mem.s_l[il]
    conv_kernel = layer.ssm_conv1d
    conv_channels = hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state
    conv_input = conv_state(g, inp, conv_states_all, qkv_mixed, conv_kernel.ne[0], conv_channels, il)
    state = g.build_rs(inp, ssm_states_all, hp.n_embd_s(), n_seqs)
    state = ggml.reshape(state, head_v_dim, head_v_dim, num_v_heads, n_seqs)
    g.cb(state, "state_predelta", il)

    conv_out = ggml.ssm_conv(conv_input, conv_kernel)
    g.cb(conv_out, "conv_output_raw", il)
    conv_out = ggml.unary(conv_out, "SILU")
    g.cb(conv_out, "conv_output_silu", il)
    f32 = conv_out.type
    nb1_qkv = ggml.row_size(f32, head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads)
    strides_k = (ggml.row_size(f32, head_k_dim), nb1_qkv, nb1_qkv * n_seq_tokens)
    q_conv = ggml.view(conv_out, (head_k_dim, num_k_heads, n_seq_tokens, n_seqs), strides_k, 0)
    k_conv = ggml.view(conv_out, (head_k_dim, num_k_heads, n_seq_tokens, n_seqs), strides_k,
                       head_k_dim * num_k_heads * ggml.type_size(f32))
    v_conv = ggml.view(conv_out, (head_v_dim, num_v_heads, n_seq_tokens, n_seqs),
                       (ggml.row_size(f32, head_v_dim), nb1_qkv, nb1_qkv * n_seq_tokens),
                       ggml.row_size(f32, 2 * head_k_dim * num_k_heads))
    g.cb(q_conv, "q_conv", il)
    g.cb(k_conv, "k_conv", il)
    g.cb(v_conv, "v_conv", il)
    q_conv = build_gdn_l2_norm(q_conv, hp.f_norm_rms_eps)
    k_conv = build_gdn_l2_norm(k_conv, hp.f_norm_rms_eps)
    if repeat_heads is not None:
        q_conv, k_conv = repeat_heads(q_conv, k_conv)
    g.cb(q_conv, "q_conv_predelta", il)
    g.cb(k_conv, "k_conv_predelta", il)
    g.cb(v_conv, "v_conv_predelta", il)
    output = build_recurrent_attn(g, inp, ssm_states_all, q_conv, k_conv, v_conv, gate, beta, state, il)

    z_2d = ggml.reshape(z, head_v_dim, num_v_heads, n_seq_tokens, n_seqs)
    normalized = g.build_norm(output, layer.ssm_norm, None, LLM_NORM_RMS, il)   # build_norm_gated
    attn_out_norm = ggml.mul(normalized, ggml.unary(z_2d, gate_act))
    final_output = ggml.reshape(attn_out_norm, head_v_dim * num_v_heads, n_seq_tokens, n_seqs)
    g.cb(final_output, "final_output", il)
    cur = g.build_lora_mm(layer.ssm_out, final_output)
    g.cb(cur, "linear_attn_out", il)
    return ggml.reshape(cur, hp.n_embd, n_seq_tokens * n_seqs)


def build_layer_ffn(g: GraphContext, cur, il: int):
    layer = g.model.layers[il]
    cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU, LLM_FFN_PAR, il)
    g.cb(cur, "ffn_out", il)
    return cur


def build_mtp(g: GraphContext) -> None:
    """llama_model_qwen35::graph_mtp (LLM_GRAPH_TYPE_DECODER_MTP): the draft head over the NextN
    block, in the MTP context of --spec-type draft-mtp."""
    build_mtp_head(g, build_mtp_ffn)


def build_mtp_ffn(g: GraphContext, cur, layer: Layer, il: int):
    return g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                       LLM_FFN_PAR, il)


def build_mtp_head(g: GraphContext, ffn) -> None:
    """graph_mtp of qwen35 and qwen35moe: the token's embedding (the NextN block's own rows, else
    the model's) and the main model's hidden state h, each normed, concatenated and projected
    (eh_proj), then a gated full-attention block over the MTP KV cache, the block's FFN (`ffn`),
    the head norm (kept as h_nextn) and the LM head over the output rows."""
    from ..ggml import GGMLAbort

    model, hp, ub = g.model, g.hparams, g.ubatch
    if hp.n_layer_nextn != 1:
        raise GGMLAbort(f"llama.cpp would abort building the MTP graph ({hp.arch}.cpp GGML_ASSERT(n_layer_nextn == 1): "
                        f"\"MTP currently only supports a single MTP block\"): {hp.n_layer_nextn} NextN blocks")
    il = hp.n_layer
    layer = model.layers_nextn[0]
    n_embd_head, n_head, n_head_kv, n_tokens = hp.n_embd_head_v(), hp.n_head(0), hp.n_head_kv(0), ub.n_tokens

    tokens = ggml.new_tensor(ggml.T.I32, n_tokens)      # llm_graph_input_embd_h
    tokens.set_input()
    embd = ggml.new_tensor(ggml.T.F32, hp.n_embd_inp(), n_tokens)   # read only without tokens
    embd.set_input()
    tok_embd = ggml.get_rows(layer.nextn_embed_tokens if layer.nextn_embed_tokens is not None else model.tok_embd,
                             tokens)
    g.cb(tok_embd, "mtp_tok_embd", il)
    h = ggml.new_tensor(ggml.T.F32, hp.n_embd, n_tokens)
    h.set_input()
    set_name(h, "mtp_h_input")

    inp_pos = g.build_inp_pos()
    inp_out_ids = g.build_inp_out_ids()
    inp_attn = g.build_attn_inp_kv()

    h_norm = g.build_norm(h, layer.nextn_hnorm, None, LLM_NORM_RMS, il)
    g.cb(h_norm, "mtp_hnorm", il)
    e_norm = g.build_norm(tok_embd, layer.nextn_enorm, None, LLM_NORM_RMS, il)
    g.cb(e_norm, "mtp_enorm", il)
    concat = ggml.concat(e_norm, h_norm, 0)
    g.cb(concat, "mtp_concat", il)
    cur = g.build_lora_mm(layer.nextn_eh_proj, concat)
    g.cb(cur, "mtp_eh_proj", il)
    inp_sa = cur
    cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
    g.cb(cur, "mtp_attn_norm", il)

    q_full, k, v = g.build_qkv_flat(layer, cur, n_embd_head * 2 * n_head, n_embd_head * n_head_kv,
                                    n_embd_head * n_head_kv, il)
    g.cb(q_full, "mtp_Qcur_full", il)
    es = ggml.type_size(q_full.type)
    q = ggml.view(q_full, (n_embd_head, n_head, n_tokens), (es * n_embd_head * 2, es * n_embd_head * 2 * n_head), 0)
    q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
    g.cb(q, "mtp_Qcur_normed", il)
    gate = ggml.view(q_full, (n_embd_head, n_head, n_tokens), (es * n_embd_head * 2, es * n_embd_head * 2 * n_head),
                     es * n_embd_head)
    gate = ggml.cont(gate, n_embd_head * n_head, n_tokens)
    g.cb(gate, "mtp_gate", il)
    k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
    k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
    g.cb(k, "mtp_Kcur_normed", il)
    v = ggml.reshape(v, n_embd_head, n_head_kv, n_tokens)
    g.cb(v, "mtp_Vcur", il)
    q = ggml.rope_multi(q, inp_pos, None, hp.n_rot(0), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
    k = ggml.rope_multi(k, inp_pos, None, hp.n_rot(0), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
    kq_scale = 1.0 / math.sqrt(n_embd_head) if hp.f_attention_scale == 0.0 else hp.f_attention_scale
    cur = g.build_attn(inp_attn, None, None, q, k, v, kq_scale, il)
    g.cb(cur, "mtp_attn_pregate", il)
    cur = ggml.mul(cur, ggml.unary(gate, "SIGMOID"))
    cur = g.build_lora_mm(layer.wo, cur)
    g.cb(cur, "mtp_attn_out", il)
    cur = ggml.add(cur, inp_sa)
    g.cb(cur, "mtp_attn_residual", il)

    ffn_residual = cur
    cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
    g.cb(cur, "mtp_attn_post_norm", il)
    cur = ffn(g, cur, layer, il)
    g.cb(cur, "mtp_ffn_out", il)
    cur = ggml.add(cur, ffn_residual)
    g.cb(cur, "mtp_post_ffn", il)

    head_norm = layer.nextn_shared_head_norm if layer.nextn_shared_head_norm is not None else model.output_norm
    cur = g.build_norm(cur, head_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "h_nextn", -1)
    g.t_h_nextn = cur
    cur = ggml.get_rows(cur, inp_out_ids)
    g.cb(cur, "mtp_shared_head_norm", -1)
    head = layer.nextn_shared_head_head if layer.nextn_shared_head_head is not None else model.output
    cur = g.build_lora_mm(head, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
