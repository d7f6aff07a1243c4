"""LLM_ARCH_NEMOTRON_H and LLM_ARCH_NEMOTRON_H_MOE (src/models/nemotron-h.cpp): NVIDIA Nemotron-H,
Nemotron Nano v2 (dense) and Nemotron 3 Nano/Super (squared-ReLU experts, optionally in a latent
space, beside a shared expert).

Each block is one of: Mamba-2 (no KV heads, no FFN size), attention without rope (KV heads, no FFN
size) or a squared-ReLU MLP (an FFN size, no KV heads); llama_memory_hybrid keeps only the first
two kinds (create_memory's nemotron_h filters), the MLP blocks hold no memory.
"""
from __future__ import annotations

from .. import ggml
from ..ggml import Tensor
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, LLM_FFN_PAR, LLM_FFN_RELU_SQR, LLM_NORM_RMS, GraphContext,
                     kq_scale_for)
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Layer, Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn
from .mamba2 import load_mamba2_tensors, load_ssm_hparams
from .mamba_base import build_mamba2_layer

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_ssm_hparams(ml, hp)
    # the appended MTP blocks are dense (non-recurrent)
    hp.is_recr_arr = tuple(il < hp.n_layer and hp.n_head_kv(il) == 0 and hp.n_ff(il) == 0
                           for il in range(hp.n_layer_all))
    hp.attn_only_arr = tuple(not hp.is_recr(il) and hp.n_ff(il) == 0 for il in range(hp.n_layer_all))
    hp.ffn_only_arr = tuple(not hp.is_recr(il) and hp.n_ff(il) != 0 for il in range(hp.n_layer_all))
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon", hp.f_norm_eps)
    # Puzzle models set a different expert FFN size per layer
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all, 0)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count", 0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.moe_latent_size = ml.get_u32("%s.moe_latent_size", 0)
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), trunk_flags)
        if hp.is_recr(i):
            load_mamba2_tensors(c, layer, i, conv_bias_flags=TENSOR_NOT_REQUIRED, flags=trunk_flags)
        elif hp.n_ff(i) == 0:
            load_attn_tensors(c, layer, i, trunk_flags)
        elif hp.n_expert != 0:
            load_moe_tensors(c, layer, i, trunk_flags, hp.n_ff(i))
        else:
            n_ff = hp.n_ff(i)
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), trunk_flags)
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), trunk_flags)
            layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
            layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
    # the NextN (MTP) draft head: each block folds an attention sub-layer and an expert sub-layer;
    # counted and skipped, load_mtp is off
    for i, layer in enumerate(model.layers_nextn, hp.n_layer):
        c.create_tensor(tn("NEXTN_ENORM", "weight", i), (n_embd,), TENSOR_SKIP)
        c.create_tensor(tn("NEXTN_HNORM", "weight", i), (n_embd,), TENSOR_SKIP)
        c.create_tensor(tn("NEXTN_EH_PROJ", "weight", i), (2 * n_embd, n_embd), TENSOR_SKIP)
        c.create_tensor(tn("NEXTN_SHARED_HEAD_NORM", "weight", i), (n_embd,), TENSOR_SKIP)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), TENSOR_SKIP)
        load_attn_tensors(c, layer, i, TENSOR_SKIP)
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,), TENSOR_SKIP)
        load_moe_tensors(c, layer, i, TENSOR_SKIP, hp.n_ff())    # n_ff: layer 0's, as LLAMA_LOAD_LOCALS has it


def load_attn_tensors(c: TensorCreator, layer: Layer, i: int, flags: int) -> None:
    """An attention block without rope: Q, K, V, the output projection and its optional bias."""
    hp, n_embd = c.hparams, c.hparams.n_embd
    n_q = hp.n_embd_head_k() * hp.n_head(i)
    c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i), flags)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd), flags)
    layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED | flags)


def load_moe_tensors(c: TensorCreator, layer: Layer, i: int, flags: int, n_ff: int) -> None:
    """An FFN block with experts: router, optional latent projections, squared-ReLU experts
    (up/down, no gate) and the shared expert."""
    hp = c.hparams
    n_embd, n_expert, n_ff_shexp = hp.n_embd, hp.n_expert, hp.n_ff_shexp
    moe_n_embd = hp.moe_latent_size if hp.moe_latent_size > 0 else n_embd
    # per-layer n_ff_exp; absent, n_ff / n_expert_used (an integer division llama.cpp does unchecked)
    if hp.n_ff_exp(i) == 0 and hp.n_expert_used(i) == 0:
        c.ml.fail(f"layer {i} declares neither expert_feed_forward_length nor expert_used_count, "
                  "cannot determine the expert FFN size")
    n_ff_exp = hp.n_ff_exp(i) or n_ff // hp.n_expert_used(i)
    layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
    layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), flags)
    layer.ffn_latent_down = c.create_tensor(tn("FFN_LATENT_DOWN", "weight", i), (n_embd, moe_n_embd),
                                            TENSOR_NOT_REQUIRED | flags)
    layer.ffn_latent_up = c.create_tensor(tn("FFN_LATENT_UP", "weight", i), (moe_n_embd, n_embd),
                                          TENSOR_NOT_REQUIRED | flags)
    layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, moe_n_embd, n_expert), flags)
    layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (moe_n_embd, n_ff_exp, n_expert), flags)
    layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
    layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)


def build_ffn_layer(g: GraphContext, cur: Tensor, layer: Layer, il: int) -> Tensor:
    """llama_model_nemotron_h::graph::build_ffn_layer: a squared-ReLU MLP, or the experts on the
    latent input (router logits computed from the full input and handed in) plus the shared expert."""
    hp = g.hparams
    if layer.ffn_gate_inp is None:
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, None, None, layer.ffn_down, layer.ffn_down_b,
                          LLM_FFN_RELU_SQR, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
    else:
        inp_emb = inp_latent = cur
        if layer.ffn_latent_down is not None:
            inp_latent = g.mul_mat_no_lora(layer.ffn_latent_down, cur)
        router_logits = g.build_lora_mm(layer.ffn_gate_inp, cur)
        g.cb(router_logits, "ffn_moe_logits", il)
        moe_out = g.build_moe_ffn(inp_latent, layer.ffn_gate_inp, layer.ffn_up_exps, None, layer.ffn_down_exps,
                                  layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(il), LLM_FFN_RELU_SQR,
                                  hp.expert_weights_norm, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, il, probs_in=router_logits)
        g.cb(moe_out, "ffn_moe_out", il)
        if layer.ffn_latent_up is not None:
            moe_out = g.mul_mat_no_lora(layer.ffn_latent_up, moe_out)
        ffn_shexp = g.build_ffn(inp_emb, layer.ffn_up_shexp, None, None, None, layer.ffn_down_shexp, None,
                                LLM_FFN_RELU_SQR, LLM_FFN_PAR, il)
        g.cb(ffn_shexp, "ffn_shexp", il)
        cur = ggml.add(moe_out, ffn_shexp)
        g.cb(cur, "ffn_out", il)
    cur = g.build_cvec(cur, il)
    g.cb(cur, "l_out", il)
    return cur


def build(g: GraphContext) -> None:
    """llama_model_nemotron_h::graph (embeddings_nextn_masked false, no layer inputs extracted)"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    ggml.build_forward_expand(g.gf, inp_l)
    inp = g.build_inp_mem_hybrid()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        if hp.is_recr(il):
            cur = build_mamba2_layer(g, inp.rs, cur, il)
        elif hp.n_ff(il) == 0:
            q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
            cur = g.build_attn(inp.attn, layer.wo, layer.bo, q, k, v, kq_scale_for(hp, n_embd_head), il)
            g.cb(cur, "attn_out", il)
        else:
            cur = build_ffn_layer(g, cur, layer, il)
        cur = ggml.add(cur, inp_l)
        g.cb(cur, "nemotron_h_block_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "h_nextn", -1)
    g.t_h_nextn = cur
    cur = ggml.get_rows(cur, inp_out_ids)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
