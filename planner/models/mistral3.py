"""LLM_ARCH_MISTRAL3 (src/models/mistral3.cpp): Ministral 3 (3B, 8B, 14B), Mistral Small 3.1/3.2.

The llama block and tensors, plus the optional Llama-4 attention temperature: Q multiplied by a
per-token scale input when attention.temperature_scale is set.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext, kq_scale_for
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import require_head_sizes_equal
from ..model_loader import ModelLoader
from . import llama

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM
load_arch_tensors = llama.load_arch_tensors   # llama_model_mistral3::load_arch_tensors is llama's, line for line


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_attn_temp_scale = ml.get_f32("%s.attention.temperature_scale", 0.0)
    if hp.f_attn_temp_scale != 0.0 and hp.n_ctx_orig_yarn == 0:
        ml.fail("invalid n_ctx_orig_yarn for attention temperature scaling")
    require_head_sizes_equal(ml, hp)


def build(g: GraphContext) -> None:
    """llama_model_mistral3::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn_scale = g.build_inp_attn_scale() if hp.f_attn_temp_scale != 0.0 else None
    inp_attn = g.build_attn_inp_kv()
    kq_scale = kq_scale_for(hp, n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        if inp_attn_scale is not None:
            q = ggml.mul(q, inp_attn_scale)
            g.cb(q, "Qcur_attn_temp_scaled", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b, layer.ffn_down,
                          layer.ffn_down_b, LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
