"""LLM_ARCH_LLAMA (src/models/llama.cpp): Llama 2/3/3.1, Mistral, TinyLlama, SmolLM2, Mixtral.

Dense FFN, or routed experts when the header has experts (Mixtral); optional rope_freqs (llama3
rope) or longrope factors.
"""
from __future__ import annotations

from .. import ggml
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext,
                     kq_scale_for)
from ..hparams import LLAMA_ROPE_SCALING_TYPE_LONGROPE, LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Layer, Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        load_layer_tensors(c, layer, i, hp)


def load_layer_tensors(c: TensorCreator, layer: Layer, i: int, hp: HParams) -> None:
    """One llama block (granite's too): attention with optional output bias, rope factors, a dense
    FFN with optional biases or routed experts."""
    n_embd, n_rot = hp.n_embd, hp.n_rot()
    n_ff, n_q = hp.n_ff(i), hp.n_embd_head_k(i) * hp.n_head(i)
    layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
    c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i))
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
    layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
    layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
    create_rope_factors(c, layer, i, hp, n_rot)
    if hp.n_expert == 0:
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_gate_b = c.create_tensor(tn("FFN_GATE", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
        layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
    else:   # Mixtral, Granite MoE
        n_expert = hp.n_expert
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff, n_expert),
                                              TENSOR_NOT_REQUIRED)
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))


def create_rope_factors(c: TensorCreator, layer: Layer, i: int, hp: HParams, n_rot: int) -> None:
    """Optional rope factors shared by every layer (duplicated after layer 0): long/short for
    longrope scaling, else rope_freqs."""
    flags = TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0)
    if hp.rope_scaling_type_train == LLAMA_ROPE_SCALING_TYPE_LONGROPE:
        layer.rope_long = c.create_tensor(tn("ROPE_FACTORS_LONG", "weight", i), (n_rot // 2,), flags)
        layer.rope_short = c.create_tensor(tn("ROPE_FACTORS_SHORT", "weight", i), (n_rot // 2,), flags)
    else:
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (n_rot // 2,), flags)


def build(g: GraphContext, embed: bool = False) -> None:
    """llama_model_llama::graph<embed>: graph<false> for llama; graph<true> (llama-embed) attends
    over the ubatch alone (build_attn_inp_no_cache) and stops at the normed embeddings (no lm_head)."""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_no_cache() if embed else g.build_attn_inp_kv()
    kq_scale = kq_scale_for(hp, n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        g.t_layer_inp[il] = inp_l
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
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if layer.ffn_gate_inp is None:
            cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b, layer.ffn_down,
                              layer.ffn_down_b, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                  None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True,
                                  hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
            g.cb(cur, "ffn_moe_out", il)

        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    if embed:
        cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
        g.cb(cur, "result_norm", -1)
        g.t_embd = cur
        ggml.build_forward_expand(g.gf, cur)
    else:
        g.build_output(inp_l)
