"""LLM_ARCH_JAMBA (src/models/jamba.cpp): AI21 Jamba v0.1, Jamba 1.5/1.6 Mini and Large.

Mamba-1 layers (build_mamba_layer of mamba-base.cpp, with dt/B/C RMS norms) and attention layers
without rope (those with KV heads) in llama_memory_hybrid, each followed by a SwiGLU FFN or, where
the layer has a router, softmax-routed experts with unnormalised weights.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .mamba import load_mamba_hparams, load_mamba_tensors
from .mamba_base import build_mamba_layer

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_mamba_hparams(ml, hp)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.is_recr_arr = tuple(hp.n_head_kv(il) == 0 for il in range(hp.n_layer))


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_ff, n_expert = hp.n_embd, hp.n_ff(), hp.n_expert
    if 2 * n_embd != hp.ssm_d_inner:   # GGML_ASSERT: only an expansion factor of 2
        c.ml.fail(f"llama.cpp would abort loading this model: {c.ml.key('%s.ssm.inner_size')} ({hp.ssm_d_inner}) "
                  f"must be twice the embedding length {n_embd} (expansion 2)")
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, hp.n_vocab))
    c.create_output(model, n_embd, hp.n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        if hp.n_head_kv(i) == 0:
            load_mamba_tensors(c, layer, i, with_norms=True)
        else:
            n_embd_gqa = hp.n_embd_v_gqa(i)
            c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
            layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), TENSOR_NOT_REQUIRED)
        if layer.ffn_gate_inp is not None:
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))
        else:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_jamba::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp = g.build_inp_mem_hybrid()
    inp_out_ids = g.build_inp_out_ids()
    for il, layer in enumerate(model.layers):
        n_head_kv = hp.n_head_kv(il)
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        if n_head_kv == 0:
            cur = build_mamba_layer(g, inp.rs, cur, il)
        else:   # no rope
            q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), n_head_kv, il)
            cur = g.build_attn(inp.attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        ffn_inp = ggml.add(inp_l, cur)
        g.cb(cur, "ffn_inp", il)   # sic: names the block's output, not the sum
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if layer.ffn_gate_inp is None:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                  layer.ffn_down_exps, None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, False,
                                  hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
            g.cb(cur, "ffn_moe_out", il)
        cur = ggml.add(ffn_inp, cur)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur
    g.build_output(inp_l)
