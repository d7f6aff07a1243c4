"""LLM_ARCH_EXAONE4 (src/models/exaone4.cpp): EXAONE 4.0 (1.2B, 32B), EXAONE 4.5 (text).

No pre-norms: RMS norms after attention and after the FFN, per-head QK norms, NEOX rope (with
llama3 rope_freqs where the file has them), a SwiGLU FFN. The 64-layer 32B has sliding windows of
4096 on three layers in four (llama_kv_cache_iswa), its global layers without rope; other sizes
none. Multi-token-prediction blocks (nextn_predict_layers) are counted and skipped.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_NONE, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern, require_head_sizes_equal
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX
LLM_TYPE_32B_LAYERS = 64   # only the 32B has sliding windows


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    if hp.n_layer == LLM_TYPE_32B_LAYERS:
        hp.swa_type = LLAMA_SWA_TYPE_STANDARD
        hp.n_swa = 4096
        load_swa_pattern(ml, hp, 4)
        hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window", hp.n_swa)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # the graph asserts n_embd_head == n_embd_head_v and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_layer, n_ff = hp.n_embd, hp.n_vocab, hp.n_layer, hp.n_ff()
    n_embd_head_k = hp.n_embd_head_k()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers + model.layers_nextn):
        is_nextn = i >= n_layer
        flags = TENSOR_SKIP if is_nextn else 0   # the NextN blocks: counted, not loaded
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * hp.n_head(), hp.n_embd_k_gqa(), hp.n_embd_v_gqa(),
                            flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd), flags)
        if not is_nextn:
            layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (hp.n_rot() // 2,),
                                               TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0))
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,), flags)
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,), flags)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,), flags)
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), flags)
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), flags)
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,), flags)
        if is_nextn:   # llama_layer::nextn without embed_tokens and shared_head_head
            c.create_tensor(tn("NEXTN_EH_PROJ", "weight", i), (2 * n_embd, n_embd), flags)
            c.create_tensor(tn("NEXTN_ENORM", "weight", i), (n_embd,), flags)
            c.create_tensor(tn("NEXTN_HNORM", "weight", i), (n_embd,), flags)
            c.create_tensor(tn("NEXTN_SHARED_HEAD_NORM", "weight", i), (n_embd,), flags | TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_exaone4::graph<iswa>: iswa for the 32B's windows"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_k()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa() if hp.swa_type == LLAMA_SWA_TYPE_STANDARD else g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        use_rope = hp.is_swa(il) or hp.swa_type == LLAMA_SWA_TYPE_NONE   # the window layers, or all
        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, inp_l, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        g.cb(k, "Kcur_normed", il)
        if use_rope:
            q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_post_norm", il)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_ffn(ffn_inp, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, -1)
        g.cb(cur, "ffn_post_norm", -1)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
