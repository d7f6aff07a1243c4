"""LLM_ARCH_QWEN3VLMOE (src/models/qwen3vlmoe.cpp): the text model of Qwen3-VL-30B-A3B and
Qwen3-VL-235B-A22B.

qwen3moe's block and tensors with qwen3vl's interleaved M-RoPE and deepstack inputs.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_IMROPE, HParams
from ..model_loader import ModelLoader
from . import qwen3moe
from .qwen3 import build_attn_qk_norm
from .qwen3vl import add_deepstack, load_deepstack_hparams

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_IMROPE

# llama_model_qwen3vlmoe::load_arch_tensors is qwen3moe's, line for line
load_arch_tensors = qwen3moe.load_arch_tensors


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_deepstack_hparams(ml, hp)
    qwen3moe.load_arch_hparams(ml, hp)


def build(g: GraphContext) -> None:
    """llama_model_qwen3vlmoe::graph"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        cur = build_attn_qk_norm(g, layer, cur, inp_pos, inp_attn, il, hp.rope_sections)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                  None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(moe_out, "ffn_moe_out", il)
        cur = moe_out
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = add_deepstack(g, cur, il)

    g.build_output(inp_l)
