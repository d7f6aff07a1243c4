"""LLM_ARCH_ARCTIC (src/models/arctic.cpp): Snowflake Arctic base/instruct (480B: a 10B dense
transformer with 128 experts of 4864, 2 used, beside it).

Llama attention (norm rope, Q sized n_embd); each layer's dense residual FFN (n_embd wide, over
ffn_norm of the attention output) and the softmax-routed experts (normalised weights, over
ffn_norm_exps of the layer's input) both add into the residual stream.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require, require_head_sizes_equal
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # no check in llama.cpp: without experts build_moe_ffn reads a null tensor
    require(ml, hp.n_expert > 0, f"the {ml.arch} graph needs experts ({ml.key('%s.expert_count')} is 0)")
    require_head_sizes_equal(ml, hp)
    # Q and attn_output are n_embd wide: the heads fill them only where n_embd = heads * head size
    require(ml, all(hp.n_embd == hp.n_head(il) * hp.n_embd_head_k() for il in range(hp.n_layer)),
            f"the arctic graph needs {ml.key('%s.embedding_length')} ({hp.n_embd}) = heads * head size")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, hp.n_embd_v_gqa(i), hp.n_embd_v_gqa(i))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        # the dense residual FFN is n_embd wide, not feed_forward_length (the experts' size)
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_embd))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_embd, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_embd))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_norm_exps = c.create_tensor(tn("FFN_NORM_EXPS", "weight", i), (n_embd,))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))


def build(g: GraphContext) -> None:
    """llama_model_arctic::graph"""
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

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

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
        ffn_out = ggml.add(cur, ffn_inp)
        g.cb(ffn_out, "ffn_out", il)

        # the experts read the layer's input, not the attention output
        cur = g.build_norm(inp_sa, layer.ffn_norm_exps, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm_exps", il)
        cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                              None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True, hp.expert_weights_scale,
                              LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(cur, "ffn_moe_out", il)
        cur = ggml.add(cur, ffn_out)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
