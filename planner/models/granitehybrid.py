"""LLM_ARCH_GRANITE_HYBRID (src/models/granite-hybrid.cpp): IBM Granite 4.0 H (Micro, Tiny, Small).

Mamba-2 layers (the ones without KV heads) and GQA attention layers in llama_memory_hybrid, each
followed by a SwiGLU FFN or experts with a shared expert; Granite's embedding, residual and logit
scales; rope only when rope.scaling.finetuned is true (the 4.0 H models use none).
"""
from __future__ import annotations

from .. import ggml
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext,
                     kq_scale_for)
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Layer, Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn
from .mamba2 import load_mamba2_tensors, load_ssm_hparams
from .mamba_base import build_mamba2_layer

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_logit_scale = ml.get_f32("%s.logit_scale", 0.0)
    hp.f_residual_scale = ml.get_f32("%s.residual_scale", 0.0)
    hp.f_embedding_scale = ml.get_f32("%s.embedding_scale", 0.0)
    hp.f_attention_scale = ml.get_f32("%s.attention.scale", 0.0)
    load_ssm_hparams(ml, hp)
    hp.rope_pattern = (ml.get_bool("%s.rope.scaling.finetuned", True),) * hp.n_layer
    hp.is_recr_arr = tuple(hp.n_head_kv(il) == 0 for il in range(hp.n_layer))   # recurrent iff no KV heads
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    require(ml, 2 * hp.n_embd == hp.ssm_d_inner,
            f"{ml.key('%s.ssm.inner_size')} ({hp.ssm_d_inner}) must be twice the embedding length (expansion 2)")
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        n_ff = hp.n_ff(i)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        if hp.is_recr(i):
            load_mamba2_tensors(c, layer, i, conv_bias_flags=TENSOR_NOT_REQUIRED)
        else:
            n_q = hp.n_embd_head_k() * hp.n_head(i)
            c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i))
            layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
            layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (hp.n_rot() // 2,),
                                           TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0))
        if n_expert > 0:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff, n_expert),
                                                  TENSOR_NOT_REQUIRED)
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))
            load_shexp_tensors(c, layer, i, hp)
        else:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
            layer.ffn_gate_b = c.create_tensor(tn("FFN_GATE", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
            layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
            layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)


def load_shexp_tensors(c: TensorCreator, layer: Layer, i: int, hp: HParams) -> None:
    """Granite MoE Shared: a shared expert of expert_shared_feed_forward_length, if set."""
    if hp.n_ff_shexp > 0:
        layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (hp.n_embd, hp.n_ff_shexp))
        layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (hp.n_embd, hp.n_ff_shexp))
        layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (hp.n_ff_shexp, hp.n_embd))


def build(g: GraphContext) -> None:
    """llama_model_granite_hybrid::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp = g.build_inp_mem_hybrid()
    inp_out_ids = g.build_inp_out_ids()
    inp_pos = g.build_inp_pos() if hp.has_rope(0) else None

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        if hp.is_recr(il):
            cur = build_mamba2_layer(g, inp.rs, cur, il)
        else:
            cur = build_attention_layer(g, cur, inp_pos, inp.attn, n_embd_head, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        inp_l = build_layer_ffn(g, cur, inp_sa, il)

    g.build_output(inp_l, logit_scale=hp.f_logit_scale or None)


def build_attention_layer(g: GraphContext, cur, inp_pos, inp_attn, n_embd_head: int, il: int):
    hp, layer = g.hparams, g.model.layers[il]
    q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
    if hp.has_rope(il):
        rope_factors = g.model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q, "Qcur", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale_for(hp, n_embd_head), il)
    g.cb(cur, "attn_out", il)
    return cur


def build_layer_ffn(g: GraphContext, cur, inp_sa, il: int):
    hp, layer = g.hparams, g.model.layers[il]
    if hp.f_residual_scale:
        cur = ggml.scale(cur, hp.f_residual_scale)
    ffn_inp = ggml.add(cur, inp_sa)
    g.cb(ffn_inp, "ffn_inp", il)
    cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
    g.cb(cur, "ffn_norm", il)
    if layer.ffn_gate_inp is None:
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b, layer.ffn_down,
                          layer.ffn_down_b, LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
    else:
        moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                  None, hp.n_expert, hp.n_expert_used(il), LLM_FFN_SILU, True, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(moe_out, "ffn_moe_out", il)
        if hp.n_ff_shexp > 0:
            shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp, None,
                                LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(shexp, "ffn_shexp", il)
            cur = ggml.add(moe_out, shexp)
            g.cb(cur, "ffn_out", il)
        else:
            cur = moe_out
    if hp.f_residual_scale:
        cur = ggml.scale(cur, hp.f_residual_scale)
    cur = ggml.add(cur, ffn_inp)
    g.cb(cur, "ffn_out", il)
    cur = g.build_cvec(cur, il)
    g.cb(cur, "l_out", il)
    return cur
