"""LLM_ARCH_CHAMELEON (src/models/chameleon.cpp): Chameleon 7B/34B (text output).

The llama block with per-head LayerNorms (weight and optional bias of head x heads) on Q and K
before NORM rope; with swin_norm (34B) the RMS norms move after attention and after the FFN. The
logits of the image tokens 4..8195 are overwritten by -FLT_MAX: a new F32 tensor of 8192 (a leaf of
the compute buffer), clamped, and set into a copy of the logits (GGML_OP_SET).
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM

FLT_MAX = 3.4028234663852886e38


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_chameleon::load_arch_hparams"""
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_norm_eps = 1e-5   # eps for qk-norm, torch default
    hp.swin_norm = ml.get_bool("%s.swin_norm", False)
    # the graph asserts n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_chameleon::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab, n_ff = hp.n_embd, hp.n_vocab, hp.n_ff()
    n_embd_head_k, n_head, n_head_kv, n_embd_gqa = hp.n_embd_head_k(), hp.n_head(), hp.n_head_kv(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k, n_head))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k, n_head_kv))
        layer.attn_q_norm_b = c.create_tensor(tn("ATTN_Q_NORM", "bias", i), (n_embd_head_k, n_head), TENSOR_NOT_REQUIRED)
        layer.attn_k_norm_b = c.create_tensor(tn("ATTN_K_NORM", "bias", i), (n_embd_head_k, n_head_kv),
                                              TENSOR_NOT_REQUIRED)
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_chameleon::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        if hp.swin_norm:
            cur = inp_l
        else:
            cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "attn_norm", il)

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        if layer.attn_q_norm is not None:
            q = g.build_norm(q, layer.attn_q_norm, layer.attn_q_norm_b, LLM_NORM, il)
            g.cb(q, "Qcur", il)
        if layer.attn_k_norm is not None:
            k = g.build_norm(k, layer.attn_k_norm, layer.attn_k_norm_b, LLM_NORM, il)
            g.cb(k, "Kcur", il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        if hp.swin_norm:
            cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        if not hp.swin_norm:
            cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                          LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        if hp.swin_norm:
            cur = g.build_norm(cur, layer.ffn_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "ffn_norm", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output_with_img_logits", -1)
    # the image tokens' logits [4, 8196) suppressed (text-only output)
    img_token_end_idx, img_token_start_idx = 8196, 4
    img_logits = ggml.new_tensor(ggml.T.F32, img_token_end_idx - img_token_start_idx)
    img_logits = ggml.clamp(img_logits, -FLT_MAX, -FLT_MAX)
    g.cb(img_logits, "img_logits", -1)
    cur = ggml.set_1d(cur, img_logits, ggml.type_size(cur.type) * img_token_start_idx)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
