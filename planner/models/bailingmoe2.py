"""LLM_ARCH_BAILINGMOE2 (src/models/bailingmoe2.cpp): Ling/Ring mini 2.0 (16B-A1B), flash 2.0
(100B-A6B), Sarvam-MoE.

A fused attn_qkv with per-head Q and K norms and partial NEOX rope, leading dense layers, then
routed experts (sigmoid with a selection bias and expert groups in Ling 2.0) beside a shared expert.
The multi-token-prediction blocks (nextn_predict_layers, the last ones) are counted and skipped.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Layer, Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn
from .qwen3 import build_attn_qk_norm

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    require_gating_func(ml, hp)   # build_moe_ffn aborts on any other
    # the graph asserts it (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the bailingmoe2 graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_layer = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_layer
    n_embd_head_k, n_embd_gqa, n_ff_exp = hp.n_embd_head_k(), hp.n_embd_v_gqa(), hp.n_ff_exp()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    require(c.ml, n_expert > 0, "n_expert must be > 0 for bailingmoe2")
    require(c.ml, hp.n_expert_used() > 0, "n_expert_used must be > 0 for bailingmoe2")

    for i, layer in enumerate(model.layers + model.layers_nextn):
        flags = TENSOR_SKIP if i >= n_layer else 0   # the NextN blocks are not loaded
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_embd + 2 * n_embd_gqa), flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * hp.n_head(i), n_embd), flags)
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,), flags)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,), flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        if i >= hp.n_layer_dense_lead:
            create_moe_shexp_tensors(c, layer, i, n_ff_exp, (hp.n_ff_shexp or n_ff_exp) * hp.n_expert_shared, flags)
        else:
            create_dense_ffn_tensors(c, layer, i, flags)
        if i >= n_layer:
            c.create_nextn(i, flags)
            c.create_tensor(tn("LAYER_OUT_NORM", "weight", i), (n_embd,), flags)


def create_moe_shexp_tensors(c: TensorCreator, layer: Layer, i: int, n_ff_exp: int, n_ff_shexp: int,
                             flags: int = 0) -> None:
    """An expert layer of bailingmoe2 and dots1: router, optional selection bias, gate/down/up
    experts, then the shared expert's gate/down/up."""
    n_embd, n_expert = c.hparams.n_embd, c.hparams.n_expert
    layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
    layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), TENSOR_NOT_REQUIRED | flags)
    layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
    layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert), flags)
    layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
    layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
    layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
    layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)


def create_dense_ffn_tensors(c: TensorCreator, layer: Layer, i: int, flags: int = 0) -> None:
    n_embd, n_ff = c.hparams.n_embd, c.hparams.n_ff(i)
    layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), flags)
    layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
    layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), flags)


def build(g: GraphContext) -> None:
    """llama_model_bailingmoe2::graph"""
    build_qk_norm_moe_shexp(g, "sa_out")


def build_qk_norm_moe_shexp(g: GraphContext, ffn_inp_name: str) -> None:
    """The graph bailingmoe2 and dots1 share (they differ in the residual's name only: sa_out,
    ffn_inp): Q and K RMS-normed per head then roped, dense leading layers, then experts beside
    the shared expert."""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        cur = build_attn_qk_norm(g, layer, cur, inp_pos, inp_attn, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        sa_out = ggml.add(cur, inp_sa)
        g.cb(sa_out, ffn_inp_name, il)

        cur = g.build_norm(sa_out, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = build_ffn_dense_or_moe_shexp(g, cur, il)
        cur = ggml.add(cur, sa_out)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)


def build_ffn_dense_or_moe_shexp(g: GraphContext, cur, il: int):
    """The FFN bailingmoe2 and dots1 share: a dense SwiGLU in the leading layers, else the routed
    experts (the header's gating, weight norm and scale; the selection bias if any) plus the
    shared expert."""
    hp, layer = g.hparams, g.model.layers[il]
    if il < hp.n_layer_dense_lead:
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        return cur
    moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                              layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU,
                              hp.expert_weights_norm, hp.expert_weights_scale, hp.expert_gating_func, il)
    g.cb(moe_out, "ffn_moe_out", il)
    ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp, None,
                            LLM_FFN_SILU, LLM_FFN_PAR, il)
    g.cb(ffn_shexp, "ffn_shexp", il)
    cur = ggml.add(moe_out, ffn_shexp)
    g.cb(cur, "ffn_out", il)
    return cur
