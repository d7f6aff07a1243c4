"""LLM_ARCH_MUSE_GLIMMER (src/models/muse-glimmer.cpp): Muse-Glimmer-30B.

afmoe's dense twin: the embeddings RMS-normed without weight, three sliding-window layers to one
full layer (load_swa_pattern 4; llama_kv_cache_iswa) with rope on the sliding ones only, per-head
QK norms, the attention output times sigmoid(attn_gate(x)) before wo (afmoe.build_attn_gated_out),
post-attention and post-FFN RMS norms of their own epsilon, the logits times logit_scale, then an
optional final tanh softcap.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext, c_reciprocal
from ..hparams import LLAMA_ROPE_TYPE_NORM, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern, require
from ..model_loader import ModelLoader, tn
from .afmoe import build_attn_gated_out

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM

# the post-attention and post-FFN norms' epsilon (not f_norm_rms_eps)
POST_NORM_EPS = 1e-8


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")   # required
    hp.f_final_logit_softcapping = ml.get_f32("%s.final_logit_softcapping", hp.f_final_logit_softcapping)
    hp.f_logit_scale = ml.get_f32("%s.logit_scale")   # required
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    load_swa_pattern(ml, hp, 4)
    # the graph's GGML_ASSERT
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the muse-glimmer graph needs equal head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_head_k()
    n_q = n_embd_head_k * hp.n_head()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))   # required: no tied fallback
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, n_q))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_muse_glimmer::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = g.build_norm(inp_l, None, None, LLM_NORM_RMS, -1)
    g.cb(inp_l, "embd_norm", -1)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()
    kq_scale = 1.0 / math.sqrt(n_embd_head)

    for il, layer in enumerate(model.layers):
        g.t_layer_inp[il] = inp_l
        inp_sa = inp_l
        use_rope = hp.is_swa(il)   # rope on the sliding-window layers, none on the full ones
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        attn_inp = cur
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        gate = g.build_lora_mm(layer.wqkv_gate, attn_inp)
        g.cb(gate, "attn_gate_proj", il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        g.cb(k, "Kcur_normed", il)
        if use_rope:
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(q, "Qcur_rope", il)
            k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(k, "Kcur_rope", il)
        cur = g.build_attn(inp_attn, None, None, q, k, v, kq_scale, il)   # wo after the gate
        g.cb(cur, "attn_out", il)
        cur = build_attn_gated_out(g, layer, cur, gate, il)
        cur = ggml.rms_norm(cur, POST_NORM_EPS)
        cur = ggml.mul(cur, layer.attn_post_norm)
        g.cb(cur, "attn_post_norm", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.rms_norm(cur, POST_NORM_EPS)
        cur = ggml.mul(cur, layer.ffn_post_norm)
        g.cb(cur, "ffn_post_norm", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    cur = ggml.scale(cur, hp.f_logit_scale)
    if hp.f_final_logit_softcapping:
        softcap = hp.f_final_logit_softcapping
        cur = ggml.scale(ggml.unary(ggml.scale(cur, c_reciprocal(softcap)), "TANH"), softcap)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
