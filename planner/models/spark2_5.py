"""LLM_ARCH_SPARK2_5 (src/models/spark2-5.cpp): Spark 2.5 (1.7B).

Sliding-window layers by the header's required pattern array (llama_kv_cache_iswa), per-layer head
counts and rope dimensions, a head-wise sigmoid gate of the layer input on the attention output
before wo, a GELU FFN with a parallel gate.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_GELU, LLM_FFN_PAR, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, require
from ..gguf import BOOL, INT32, UINT32
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")   # required
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    flags = ml.get_arr("%s.attention.sliding_window_pattern", (BOOL, UINT32, INT32))   # required
    hp.is_swa_arr = tuple(il < len(flags) and bool(flags[il]) for il in range(hp.n_layer_all))
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    # the graph's GGML_ASSERT
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the spark2_5 graph needs equal head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff = hp.n_embd, hp.n_vocab, hp.n_ff()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        n_head_i, n_head_kv_i = hp.n_head(i), hp.n_head_kv(i)
        n_embd_q = hp.n_embd_head_k(i) * n_head_i
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_q, hp.n_embd_head_k(i) * n_head_kv_i,
                            hp.n_embd_head_v(i) * n_head_kv_i)
        layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, n_head_i))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_spark2_5::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()
    kq_scale = 1.0 / math.sqrt(n_embd_head)

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        n_head_i, n_head_kv_i, n_rot_i = hp.n_head(il), hp.n_head_kv(il), hp.n_rot(il)
        attn_inp = cur
        q, k, v = g.build_qkv(layer, cur, n_embd_head, n_head_i, n_head_kv_i, il)
        q = ggml.rope_ext(q, inp_pos, None, n_rot_i, hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, n_rot_i, hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur_rope", il)
        g.cb(k, "Kcur_rope", il)
        # the head-wise gate goes before wo, so wo stays out of build_attn
        cur = g.build_attn(inp_attn, None, None, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)
        gate = g.build_lora_mm(layer.wqkv_gate, attn_inp)
        gate = ggml.unary(gate, "SIGMOID")
        g.cb(gate, "attn_gate", il)
        n_tokens_i = cur.ne[1]
        cur = ggml.reshape(cur, n_embd_head, n_head_i, n_tokens_i)
        gate = ggml.reshape(gate, 1, n_head_i, n_tokens_i)
        cur = ggml.mul(cur, gate)
        cur = ggml.reshape(cur, n_embd_head * n_head_i, n_tokens_i)
        g.cb(cur, "attn_gated", il)
        cur = g.build_lora_mm(layer.wo, cur)
        g.cb(cur, "attn_out_proj", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_GELU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
