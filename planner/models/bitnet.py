"""LLM_ARCH_BITNET (src/models/bitnet.cpp): BitNet b1.58 (1bitLLM 3B, microsoft/bitnet-b1.58-2B-4T).

The llama block with sub-norms: an RMS norm on the attention output before wo and on the gated
FFN's product before ffn_down; each projection may carry a per-tensor scale (".scale", {1})
multiplied after its product (build_qkv, build_ffn, build_lora_mm). The converter writes the
ternary weights as floats; the lm_head is the token embedding itself (no output tensor).
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # the graph asserts n_embd_head == n_embd_head_k
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes ({hp.n_embd_head_k()}, {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_gqa = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_sub_norm = c.create_tensor(tn("ATTN_SUB_NORM", "weight", i), (n_embd,))
        layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd, n_embd))
        layer.wq_s = c.create_tensor(tn("ATTN_Q", "scale", i), (1,), TENSOR_NOT_REQUIRED)
        layer.wk = c.create_tensor(tn("ATTN_K", "weight", i), (n_embd, n_embd_gqa))
        layer.wk_s = c.create_tensor(tn("ATTN_K", "scale", i), (1,), TENSOR_NOT_REQUIRED)
        layer.wv = c.create_tensor(tn("ATTN_V", "weight", i), (n_embd, n_embd_gqa))
        layer.wv_s = c.create_tensor(tn("ATTN_V", "scale", i), (1,), TENSOR_NOT_REQUIRED)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.wo_s = c.create_tensor(tn("ATTN_OUT", "scale", i), (1,), TENSOR_NOT_REQUIRED)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_sub_norm = c.create_tensor(tn("FFN_SUB_NORM", "weight", i), (n_ff,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_gate_s = c.create_tensor(tn("FFN_GATE", "scale", i), (1,), TENSOR_NOT_REQUIRED)
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_down_s = c.create_tensor(tn("FFN_DOWN", "scale", i), (1,), TENSOR_NOT_REQUIRED)
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_up_s = c.create_tensor(tn("FFN_UP", "scale", i), (1,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_bitnet::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, None, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        cur = g.build_norm(cur, layer.attn_sub_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_sub_norm", il)
        cur = g.build_lora_mm(layer.wo, cur, layer.wo_s)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, None, None, LLM_FFN_SILU, LLM_FFN_PAR, il,
                          up_s=layer.ffn_up_s, gate_s=layer.ffn_gate_s)
        g.cb(cur, "ffn_sub_out", il)
        cur = g.build_norm(cur, layer.ffn_sub_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_sub_norm", il)
        cur = g.build_lora_mm(layer.ffn_down, cur, layer.ffn_down_s)
        g.cb(cur, "ffn_down", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "l_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    # "FIXME: do not use model.tok_embd directly, duplicate as model.output"
    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.tok_embd, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
