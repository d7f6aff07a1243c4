"""LLM_ARCH_MINIMAX_01 (src/models/minimax-01.cpp): MiniMax-Text-01 456B-A45.9B.

Lightning (linear) attention on the recurrent layers (every full_attention_interval-th layer, 8 by
default, is softmax attention instead): its state, head x head per head, lives in
llama_memory_hybrid's recurrent memory (the conv state rows are empty), the decays come from four
graph inputs (ALiBi-like slopes, per-token Q/K decays and the diagonal block decay, whose size grows
with the tokens per sequence squared: sched_reserve's final pp reserve runs one sequence for this
architecture). GQA softmax attention with partial NEOX rope on the others; every layer's residuals
are scaled by residual_scale; softmax-routed experts with normalised weights on every layer.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLAbort
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_residual_scale = ml.get_f32("%s.residual_scale")
    hp.n_embd_head_la = hp.n_embd_head_k_full   # sizes the recurrent state (n_embd_s)
    if ml.has("%s.attention.recurrent_layers"):
        hp.is_recr_arr = tuple(bool(x) for x in ml.get_key_or_arr("%s.attention.recurrent_layers", hp.n_layer_all))
    else:
        interval = ml.get_u32("%s.full_attention_interval", 8)
        if interval == 0:
            ml.fail(f"{ml.key('%s.full_attention_interval')} is 0: llama.cpp takes the layer index modulo it "
                    "(a division by zero)")
        hp.is_recr_arr = tuple(il < hp.n_layer and (il + 1) % interval != 0 for il in range(hp.n_layer_all))


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_expert = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_expert
    n_embd_q = hp.n_embd_head_k() * hp.n_head()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        if not hp.is_recr(i):
            c.create_tensor_qkv(layer, i, n_embd, n_embd_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
        else:
            layer.attn_norm_2 = c.create_tensor(tn("ATTN_NORM_2", "weight", i), (n_embd_q,))
            layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, 3 * n_embd_q))
            layer.wg = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, n_embd_q))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff, n_expert),
                                              TENSOR_NOT_REQUIRED)
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))


def build(g: GraphContext) -> None:
    """llama_model_minimax_01::graph"""
    model, hp, ub = g.model, g.hparams, g.ubatch
    n_embd_head = hp.n_embd_head_v()
    if n_embd_head != hp.n_embd_head_k():
        raise GGMLAbort(f"llama.cpp would abort building the minimax-01 graph (GGML_ASSERT(n_embd_head == "
                        f"n_embd_head_k)): K heads of {hp.n_embd_head_k()}, V heads of {n_embd_head}")
    n_head, n_seqs = hp.n_head(), ub.n_seqs
    n_seq_tokens = ub.n_tokens // n_seqs
    f32 = ggml.T.F32

    inp_l = g.build_inp_embd(model.tok_embd)
    inp = g.build_inp_mem_hybrid()
    inp_pos = g.build_inp_pos()
    inp_out_ids = g.build_inp_out_ids()
    # llm_graph_input_la: the slopes and the Q, K and diagonal decays
    slopes = ggml.new_tensor(f32, n_head)
    slopes.set_input()
    g.cb(slopes, "slopes", -1)
    q_decay_exp = ggml.new_tensor(f32, 1, n_head, n_seq_tokens, n_seqs)
    q_decay_exp.set_input()
    g.cb(q_decay_exp, "q_decay_exp", -1)
    k_decay_exp = ggml.new_tensor(f32, 1, n_head, n_seq_tokens, n_seqs)
    k_decay_exp.set_input()
    g.cb(k_decay_exp, "k_decay_exp", -1)
    diag_decay_exp = ggml.new_tensor(f32, n_seq_tokens, n_seq_tokens, n_head, n_seqs)
    diag_decay_exp.set_input()
    g.cb(diag_decay_exp, "diag_decay_exp", -1)
    decay_exps = (q_decay_exp, k_decay_exp, diag_decay_exp)

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        residual = cur
        if not hp.is_recr(il):
            q, k, v = g.build_qkv(layer, cur, n_embd_head, n_head, hp.n_head_kv(), il)
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(q, "Qcur", il)
            g.cb(k, "Kcur", il)
            g.cb(v, "Vcur", il)
            cur = g.build_attn(inp.attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        else:
            cur = build_lightning_attn(g, inp.rs, cur, slopes, decay_exps, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
            residual = ggml.get_rows(residual, inp_out_ids)
        residual = ggml.scale(residual, hp.f_residual_scale)
        g.cb(residual, "residual_scaled_attn", il)
        ffn_inp = ggml.add(cur, residual)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        residual = cur
        cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                              layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True,
                              hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(cur, "ffn_moe_out", il)
        residual = ggml.scale(residual, hp.f_residual_scale)
        g.cb(residual, "residual_scaled_ffn", il)
        cur = ggml.add(cur, residual)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur
    g.build_output(inp_l)


def build_lightning_attn(g: GraphContext, inp_rs, cur, slopes, decay_exps, il: int):
    """The lightning attention branch of llama_model_minimax_01::graph."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    mem = inp_rs.mem
    kv_head = mem.get_head()
    n_embd_head, n_head, n_seqs = hp.n_embd_head_v(), hp.n_head(), ub.n_seqs
    n_seq_tokens = ub.n_tokens // n_seqs
    q_decay_exp, k_decay_exp, diag_decay_exp = decay_exps

    conv_state_all = g.build_rs(inp_rs, mem.r_l[il], hp.n_embd_r(), n_seqs)   # empty rows, still gathered
    ggml.build_forward_expand(g.gf, conv_state_all)
    # float slope_scale = 1.0 - 1.0 * il / (n_layer - 1) + 1e-5 (one layer: 0/0, NaN)
    slope_scale = 1.0 - (il / (hp.n_layer - 1) if hp.n_layer > 1 else math.nan) + 1e-5
    slope_rate = ggml.scale(slopes, slope_scale)
    g.cb(slope_rate, "slope_rate", il)

    cur = ggml.reshape(cur, cur.ne[0], n_seq_tokens, 1, n_seqs)
    qkv_cur = g.build_lora_mm(layer.wqkv, cur)
    g.cb(qkv_cur, "QKVcur", il)
    qkv_cur = ggml.unary(qkv_cur, "SILU")
    g.cb(qkv_cur, "QKVcur_silu", il)
    qkv_cur = ggml.reshape(qkv_cur, n_embd_head * 3, n_head, n_seq_tokens, n_seqs)
    es = ggml.type_size(qkv_cur.type)
    nb = (qkv_cur.nb[1], qkv_cur.nb[2], qkv_cur.nb[3])
    q, k, v = (ggml.view(qkv_cur, (n_embd_head, n_head, n_seq_tokens, n_seqs), nb, i * es * n_embd_head)
               for i in range(3))
    g.cb(q, "Qcur", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)

    la_states_all = mem.s_l[il]
    state = g.build_rs(inp_rs, la_states_all, hp.n_embd_s(), n_seqs)
    kv_old = ggml.reshape(state, n_embd_head, n_embd_head, n_head, n_seqs)
    g.cb(kv_old, "kv_old", il)

    q_decay = ggml.unary(ggml.scale(q_decay_exp, slope_scale), "EXP")
    g.cb(q_decay, "q_decay", il)
    k_decay = ggml.unary(ggml.scale(k_decay_exp, slope_scale), "EXP")
    g.cb(k_decay, "k_decay", il)
    diag_decay = ggml.unary(ggml.scale(diag_decay_exp, slope_scale), "EXP")
    g.cb(diag_decay, "diag_decay", il)
    q_s = ggml.mul(q, q_decay)
    g.cb(q_s, "q_s", il)
    q_s_trans = ggml.permute(q_s, 0, 2, 1, 3)
    g.cb(q_s_trans, "q_s_trans", il)
    qkv_none_diag = ggml.mul_mat(kv_old, q_s_trans)
    g.cb(qkv_none_diag, "qkv_none_diag", il)
    q_trans = ggml.permute(q, 0, 2, 1, 3)
    g.cb(q_trans, "q_trans", il)
    k_trans = ggml.permute(k, 0, 2, 1, 3)
    g.cb(k_trans, "k_trans", il)
    qk = ggml.mul_mat(k_trans, q_trans)
    g.cb(qk, "qk", il)
    qk = ggml.mul(qk, diag_decay)
    g.cb(qk, "qk_s", il)
    v_trans = ggml.cont(ggml.permute(v, 1, 2, 0, 3))
    g.cb(v_trans, "v_trans", il)
    qkv_diag = ggml.mul_mat(v_trans, qk)
    g.cb(qkv_diag, "qkv_diag", il)
    qkv = ggml.add(qkv_none_diag, qkv_diag)
    g.cb(qkv, "qkv", il)
    ggml.build_forward_expand(g.gf, qkv)

    slopes_neg = ggml.scale(slope_rate, -1.0 * n_seq_tokens)
    g.cb(slopes_neg, "slopes_neg", il)
    block_decay = ggml.unary(slopes_neg, "EXP")
    g.cb(block_decay, "block_decay", il)
    block_decay_3d = ggml.reshape(block_decay, 1, 1, n_head)
    g.cb(block_decay_3d, "block_decay_3d", il)
    kv_old_s = ggml.mul(kv_old, block_decay_3d)
    g.cb(kv_old_s, "kv_old_s", il)
    k_after_decay = ggml.mul(k, k_decay)
    g.cb(k_after_decay, "k_after_decay", il)
    k_after_decay_trans = ggml.cont(ggml.permute(k_after_decay, 1, 2, 0, 3))
    g.cb(k_after_decay_trans, "k_after_decay_trans", il)
    kv_cur = ggml.mul_mat(k_after_decay_trans, v_trans)
    g.cb(kv_cur, "kv_cur", il)
    kv_new = ggml.add(kv_old_s, kv_cur)
    g.cb(kv_new, "kv_new", il)

    dst = ggml.view(la_states_all, (hp.n_embd_s() * n_seqs,), (),
                    kv_head * hp.n_embd_s() * ggml.type_size(la_states_all.type))
    ggml.build_forward_expand(g.gf, ggml.cpy(kv_new, dst))

    qkv = ggml.cont(ggml.permute(qkv, 0, 2, 1, 3))
    g.cb(qkv, "qkv_permuted", il)
    qkv = ggml.reshape(qkv, qkv.ne[0] * qkv.ne[1], qkv.ne[2], 1, qkv.ne[3])
    qkv_norm = g.build_norm(qkv, layer.attn_norm_2, None, LLM_NORM_RMS, il)
    g.cb(qkv_norm, "qkv_norm", il)
    gate = g.build_lora_mm(layer.wg, cur)
    g.cb(gate, "g", il)
    gate = ggml.unary(gate, "SIGMOID")
    g.cb(gate, "g_sigm", il)
    cur = ggml.mul(gate, qkv_norm)
    cur = g.build_lora_mm(layer.wo, cur)
    g.cb(cur, "attn_out", il)
    cur = ggml.reshape(cur, cur.ne[0], n_seq_tokens * n_seqs)
    g.cb(cur, "attn_out", il)
    return cur
