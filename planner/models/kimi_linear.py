"""LLM_ARCH_KIMI_LINEAR (src/models/kimi-linear.cpp): Kimi-Linear-48B-A3B.

Kimi Delta Attention (KDA) layers, the layers without KV heads, in recurrent state: short
convolutions of Q, K and V (three conv states in one r row), a per-channel gate and the gated delta
rule (the fused GATED_DELTA_NET for pp and tg alike, as llama_context never turns fused_gdn off),
a sigmoid-gated output norm. The other layers are DeepSeek-style multi-head latent attention
without rope (Q uncompressed, K-only cache). DeepSeek-style experts: leading dense layers, sigmoid
routing with a selection bias, normalised and scaled weights, shared experts.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import Tensor
from ..graph import LLM_NORM_RMS, GraphContext, RSInput
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Layer, Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .delta_net import build_delta_net_fused, build_gdn_l2_norm
from .deepseek2 import build_ffn_dense_or_moe, build_mla_absorbed

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla")
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.ssm_d_conv = ml.get_u32("%s.ssm.conv_kernel")
    hp.n_embd_head_kda = ml.get_u32("%s.kda.head_dim")
    # the KDA layers are those without KV heads (the converter writes 0 for them)
    hp.is_recr_arr = tuple(hp.n_head_kv(il) == 0 for il in range(hp.n_layer_all))
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    require_gating_func(ml, hp)
    # no asserts in llama.cpp: an empty head or kernel is a negative view, no experts a null tensor
    if any(hp.is_recr_arr[:hp.n_layer]):
        require(ml, hp.n_embd_head_kda > 0, f"{ml.key('%s.kda.head_dim')} is 0 with KDA layers")
        require(ml, hp.ssm_d_conv > 0, f"{ml.key('%s.ssm.conv_kernel')} is 0 with KDA layers")
    if hp.n_layer_dense_lead < hp.n_layer:
        require(ml, hp.n_expert > 0, f"the {ml.arch} graph needs experts ({ml.key('%s.expert_count')} is 0)")
    require(ml, hp.n_embd_head_k_mla() > hp.n_rot(),
            f"key_length_mla {hp.n_embd_head_k_mla()} must exceed the rope dimensions {hp.n_rot()}")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        if hp.is_recr(i):
            load_kda_tensors(c, layer, i)
        else:
            load_mla_tensors(c, layer, i)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        n_ff_exp, n_expert = hp.n_ff_exp(), hp.n_expert
        if i < hp.n_layer_dense_lead:
            n_ff = hp.n_ff(i)
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        else:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            n_ff_shexp = n_ff_exp * (hp.n_expert_shared if hp.n_expert_shared > 0 else 1)
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp),
                                                   TENSOR_NOT_REQUIRED)
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd),
                                                   TENSOR_NOT_REQUIRED)
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp),
                                                 TENSOR_NOT_REQUIRED)
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,))


def _create_4d_or_3d(c: TensorCreator, name: str, il: int, ne: tuple[int, ...]) -> Tensor:
    """The loader's "try 4D first, then 3D (quantization may remove the trailing 1)"."""
    t = c.create_tensor(tn(name, "weight", il), ne + (1,), TENSOR_NOT_REQUIRED)
    return t if t is not None else c.create_tensor(tn(name, "weight", il), ne)


def load_kda_tensors(c: TensorCreator, layer: Layer, i: int) -> None:
    hp = c.hparams
    n_embd, n_head, head_dim, d_conv = hp.n_embd, hp.n_head(), hp.n_embd_head_kda, hp.ssm_d_conv
    d_inner = head_dim * n_head
    layer.ssm_q_conv = _create_4d_or_3d(c, "SSM_CONV1D_Q", i, (d_conv, 1, d_inner))
    layer.ssm_k_conv = _create_4d_or_3d(c, "SSM_CONV1D_K", i, (d_conv, 1, d_inner))
    layer.ssm_v_conv = _create_4d_or_3d(c, "SSM_CONV1D_V", i, (d_conv, 1, d_inner))
    c.create_tensor_qkv(layer, i, n_embd, d_inner, d_inner, d_inner)
    layer.ssm_f_a = c.create_tensor(tn("SSM_F_A", "weight", i), (n_embd, head_dim))
    layer.ssm_f_b = c.create_tensor(tn("SSM_F_B", "weight", i), (head_dim, d_inner))
    layer.ssm_beta = c.create_tensor(tn("SSM_BETA", "weight", i), (n_embd, n_head))
    layer.ssm_a = c.create_tensor(tn("SSM_A_NOSCAN", None, i), (1, n_head, 1, 1), TENSOR_NOT_REQUIRED)
    if layer.ssm_a is None:
        layer.ssm_a = c.create_tensor(tn("SSM_A_NOSCAN", None, i), (1, n_head))
    layer.ssm_dt_b = c.create_tensor(tn("SSM_DT", "bias", i), (d_inner,))
    layer.ssm_g_a = c.create_tensor(tn("SSM_G_A", "weight", i), (n_embd, head_dim))
    layer.ssm_g_b = c.create_tensor(tn("SSM_G_B", "weight", i), (head_dim, d_inner))
    layer.ssm_o_norm = c.create_tensor(tn("SSM_NORM", "weight", i), (head_dim,))
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (d_inner, n_embd))


def load_mla_tensors(c: TensorCreator, layer: Layer, i: int) -> None:
    hp = c.hparams
    n_embd, n_head = hp.n_embd, hp.n_head(i)
    q_lora_rank, kv_lora_rank = hp.n_lora_q, hp.n_lora_kv   # q_lora_rank is never read: 0
    n_embd_head_k_mla, n_embd_head_v_mla = hp.n_embd_head_k_mla(), hp.n_embd_head_v_mla()
    qk_rope_head_dim = hp.n_rot()
    layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,), TENSOR_NOT_REQUIRED)
    layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,))
    if layer.attn_q_a_norm is not None:
        layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank))
        layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head * n_embd_head_k_mla))
    else:
        layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd, n_head * n_embd_head_k_mla))
    layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + qk_rope_head_dim))
    layer.wkv_b = c.create_tensor(tn("ATTN_KV_B", "weight", i),
                                  (kv_lora_rank, n_head * (n_embd_head_k_mla - qk_rope_head_dim + n_embd_head_v_mla)),
                                  TENSOR_NOT_REQUIRED)
    if layer.wkv_b is not None:
        if hp.is_mla():
            c.ml.fail(f"blk.{i}.attn_kv_b.weight with key_length_mla set: llama.cpp's graph would read the "
                      "MHA cache input its K-only cache does not build (a null pointer)")
        c.ml.fail(f"blk.{i}.attn_kv_b.weight: the unsplit MLA decompression (MHA over a K/V cache) of "
                  "kimi-linear is not planned yet (reconvert for attn_k_b and attn_v_b)")
    if not hp.is_mla():
        c.ml.fail(f"blk.{i} is an MLA layer but key_length_mla or value_length_mla is 0: llama.cpp's graph "
                  "would read the K-only cache input its KV cache does not build (a null pointer)")
    layer.wk_b = c.create_tensor(tn("ATTN_K_B", "weight", i), (n_embd_head_k_mla - qk_rope_head_dim, kv_lora_rank, n_head))
    layer.wv_b = c.create_tensor(tn("ATTN_V_B", "weight", i), (kv_lora_rank, n_embd_head_v_mla, n_head))
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_v_mla, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_kimi_linear::graph"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    g.cb(inp_l, "model.embed_tokens", -1)
    inp = g.build_inp_mem_hybrid_k() if hp.is_mla() else g.build_inp_mem_hybrid()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        ggml.build_forward_expand(g.gf, cur)
        if hp.is_recr(il):
            cur = build_kda(g, inp.rs, cur, il)
        else:
            cur = build_mla(g, inp.attn, cur, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = build_ffn_dense_or_moe(g, layer, ffn_inp, True, il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, lora=False)


def causal_conv1d(g: GraphContext, conv_states_all: Tensor, conv_state_all: Tensor, qkv: int, x: Tensor,
                  proj_w, conv_w: Tensor, kv_head: int) -> Tensor:
    """causal_conv1d (kimi-linear.cpp): one of Q (0), K (1), V (2): its slice of the conv state before
    the projected input, the last d_conv-1 columns written back, the depthwise conv, SiLU."""
    hp, ub = g.hparams, g.ubatch
    head_dim, n_head, d_conv = hp.n_embd_head_kda, hp.n_head(), hp.ssm_d_conv
    n_seqs, n_tokens = ub.n_seqs, ub.n_tokens
    n_seq_tokens = n_tokens // n_seqs
    d_inner = head_dim * n_head
    conv_state_size = (d_conv - 1) * d_inner
    n_embd_r_total = 3 * conv_state_size
    es = ggml.type_size(conv_state_all.type)
    conv_state_x = ggml.view(conv_state_all, (d_conv - 1, d_inner, n_seqs), ((d_conv - 1) * es, n_embd_r_total * es),
                             qkv * conv_state_size * es)
    x_proj = g.mul_mat_no_lora(proj_w, x) if proj_w is not None else x
    x_3d = ggml.reshape(x_proj, d_inner, n_seq_tokens, n_seqs)
    conv_x = ggml.concat(conv_state_x, ggml.transpose(x_3d), 0)
    last_conv_x = ggml.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]),
                            n_seq_tokens * conv_x.nb[0])
    es_all = ggml.type_size(conv_states_all.type)
    dst = ggml.view(conv_states_all, (d_conv - 1, d_inner, n_seqs), ((d_conv - 1) * es_all, n_embd_r_total * es_all),
                    (kv_head * n_embd_r_total + qkv * conv_state_size) * es_all)
    ggml.build_forward_expand(g.gf, ggml.cpy(last_conv_x, dst))
    conv_weight = ggml.reshape(conv_w, d_conv, d_inner)
    x_cur = ggml.ssm_conv(conv_x, conv_weight)
    x_cur = ggml.reshape(x_cur, d_inner, n_tokens)
    x_cur = ggml.unary(x_cur, "SILU")
    return ggml.reshape(x_cur, head_dim, n_head, n_seq_tokens, n_seqs)


def build_kda(g: GraphContext, inp: RSInput, cur: Tensor, il: int) -> Tensor:
    """The KDA layer: conv'd Q/K/V, gate g1 = A * softplus(f_b(f_a(x)) + dt_bias), beta, the delta
    rule over the layer's state, RMS norm gated by sigmoid(g_b(g_a(x))), the output projection."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    n_head, head_dim = hp.n_head(), hp.n_embd_head_kda
    d_inner = n_head * head_dim
    n_seqs, n_tokens = ub.n_seqs, ub.n_tokens
    n_seq_tokens = n_tokens // n_seqs
    mem = inp.mem
    kv_head = mem.get_head()
    conv_states_all = mem.r_l[il]
    g.cb(conv_states_all, "conv_states_all", il)
    conv_state_all = g.build_rs(inp, conv_states_all, hp.n_embd_r(), n_seqs)
    q_in = k_in = v_in = cur
    q_w, k_w, v_w = layer.wq, layer.wk, layer.wv
    if layer.wqkv is not None:
        qkv = g.mul_mat_no_lora(layer.wqkv, cur)
        es = ggml.type_size(qkv.type)
        q_in, k_in, v_in = (ggml.cont(ggml.view(qkv, (d_inner, n_tokens), (qkv.nb[1],), j * d_inner * es))
                            for j in range(3))
        q_w = k_w = v_w = None
    q = causal_conv1d(g, conv_states_all, conv_state_all, 0, q_in, q_w, layer.ssm_q_conv, kv_head)
    k = causal_conv1d(g, conv_states_all, conv_state_all, 1, k_in, k_w, layer.ssm_k_conv, kv_head)
    v = causal_conv1d(g, conv_states_all, conv_state_all, 2, v_in, v_w, layer.ssm_v_conv, kv_head)

    f_a = g.mul_mat_no_lora(layer.ssm_f_a, cur)
    g1 = g.mul_mat_no_lora(layer.ssm_f_b, f_a)
    g.cb(g1, "g1 f_b(f_a(cur))", il)
    g1 = ggml.add(g1, layer.ssm_dt_b)
    g1 = ggml.unary(g1, "SOFTPLUS")
    g1 = ggml.reshape(g1, head_dim, n_head, n_tokens)
    g1 = ggml.mul(g1, ggml.reshape(layer.ssm_a, 1, n_head, 1))   # A_log is -exp(A_log) already
    g.cb(g1, "kda_g1", il)
    g1 = ggml.reshape(g1, head_dim, n_head, n_seq_tokens, n_seqs)
    beta = g.mul_mat_no_lora(layer.ssm_beta, cur)
    beta = ggml.reshape(beta, 1, n_head, n_seq_tokens, n_seqs)
    g.cb(beta, "kda_beta", il)
    beta = ggml.unary(beta, "SIGMOID")
    cur = ggml.reshape(cur, cur.ne[0], n_seq_tokens, n_seqs)

    ssm_states_all = mem.s_l[il]
    state = g.build_rs(inp, ssm_states_all, hp.n_embd_s(), n_seqs)
    state = ggml.reshape(state, head_dim, head_dim, n_head, n_seqs)
    q = build_gdn_l2_norm(q, hp.f_norm_rms_eps)
    k = build_gdn_l2_norm(k, hp.f_norm_rms_eps)
    # build_delta_net: fused_gdn_ar and fused_gdn_ch are always on (llama-context.cpp:233)
    attn_out, new_state = build_delta_net_fused(q, k, v, g1, beta, state)
    output = ggml.cont(attn_out)
    g.cb(output, "attn_output", il)
    g.cb(new_state, "new_state", il)
    dst = ggml.view(ssm_states_all, (hp.n_embd_s() * n_seqs,), (),
                    kv_head * hp.n_embd_s() * ggml.type_size(ssm_states_all.type))
    ggml.build_forward_expand(g.gf, ggml.cpy(new_state, dst))

    cur_2d = ggml.reshape(cur, cur.ne[0], n_seq_tokens * n_seqs)
    g_a = g.mul_mat_no_lora(layer.ssm_g_a, cur_2d)
    g2 = g.mul_mat_no_lora(layer.ssm_g_b, g_a)
    g.cb(g2, "g2 g_b(g_a(cur_2d))", il)
    g2 = ggml.reshape(g2, head_dim, n_head, n_seq_tokens * n_seqs)
    attn_out_final = ggml.reshape(output, head_dim, n_head, n_seq_tokens * n_seqs)
    normed = g.build_norm(attn_out_final, layer.ssm_o_norm, None, LLM_NORM_RMS, il)
    g.cb(normed, "kda_normed", il)
    gated = ggml.mul(normed, ggml.unary(g2, "SIGMOID"))
    gated = ggml.cont(gated, d_inner, n_tokens)
    cur = g.mul_mat_no_lora(layer.wo, gated)
    g.cb(cur, "kda_out", il)
    return cur


def build_mla(g: GraphContext, inp, cur: Tensor, il: int) -> Tensor:
    """The MLA layer with the absorption (attn_k_b / attn_v_b) over the K-only cache; no rope."""
    hp, layer = g.hparams, g.model.layers[il]
    n_head, n_tokens = hp.n_head(il), g.ubatch.n_tokens
    n_embd_head_k_mla = hp.n_embd_head_k_mla()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k_mla - n_embd_head_qk_rope
    kv_lora_rank = hp.n_lora_kv
    kq_scale = 1.0 / math.sqrt(n_embd_head_k_mla)

    q = g.mul_mat_no_lora(layer.wq, cur)
    kv_cmpr_pe = g.mul_mat_no_lora(layer.wkv_a_mqa, cur)
    row = ggml.row_size(kv_cmpr_pe.type, kv_lora_rank + n_embd_head_qk_rope)
    kv_cmpr = ggml.view(kv_cmpr_pe, (kv_lora_rank, n_tokens), (row,), 0)
    k_pe = ggml.view(kv_cmpr_pe, (n_embd_head_qk_rope, 1, n_tokens), (row, row),
                     ggml.row_size(kv_cmpr_pe.type, kv_lora_rank))
    kv_cmpr = g.build_norm(kv_cmpr, layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)

    q_row = ggml.row_size(q.type, n_embd_head_k_mla)
    q_nope = ggml.view(q, (n_embd_head_qk_nope, n_head, n_tokens), (q_row, q_row * n_head), 0)
    g.cb(q_nope, "q_nope", il)
    q_pe = ggml.view(q, (n_embd_head_qk_rope, n_head, n_tokens), (q_row, q_row * n_head),
                     ggml.row_size(q.type, n_embd_head_qk_nope))
    g.cb(q_pe, "q_pe", il)
    q_cur, k_cur, v_cur = build_mla_absorbed(g, layer, q_nope, q_pe, kv_cmpr, k_pe, il)
    cur = g.build_attn(inp, layer.wo, None, q_cur, k_cur, v_cur, kq_scale, il, v_mla=layer.wv_b)
    g.cb(cur, "mla_out", il)
    return cur
