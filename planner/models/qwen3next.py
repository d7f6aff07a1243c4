"""LLM_ARCH_QWEN3NEXT (src/models/qwen3next.cpp): Qwen3-Next-80B-A3B.

The Qwen3.5 MoE layout before Qwen3.5: gated delta net layers (beta and alpha from one fused
projection, K heads repeated to the V heads before the delta net) and gated attention layers with
NEOX rope, in llama_memory_hybrid; routed experts with a sigmoid-gated shared expert.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Layer, Model, TensorCreator, require
from ..model_loader import TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn
from .qwen35 import build_gdn_core, build_hybrid, build_qkvz, load_gdn_hparams
from .qwen35moe import build_layer_ffn, load_moe_tensors

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all, 0)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    load_gdn_hparams(ml, hp)
    require(ml, hp.n_expert > 0, f"{ml.arch} model cannot have zero experts")
    require(ml, hp.n_expert_used() > 0, f"the {ml.arch} graph needs {ml.key('%s.expert_used_count')} above 0")
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (hp.n_embd, hp.n_vocab))
    c.create_output(model, hp.n_embd, hp.n_vocab)
    for il, layer in enumerate(model.layers):
        load_block_trunk(c, layer, il, trunk_flags)
    for il, layer in enumerate(model.layers_nextn, hp.n_layer):
        load_block_mtp(c, layer, il)


def load_block_trunk(c: TensorCreator, layer: Layer, il: int, flags: int) -> None:
    """load_block_trunk: the norms, gated attention or the gated delta net, the experts."""
    hp = c.hparams
    n_embd = hp.n_embd
    key_dim, value_dim = hp.ssm_d_state * hp.ssm_n_group, hp.ssm_d_state * hp.ssm_dt_rank
    layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", il), (n_embd,), flags)
    layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", il), (n_embd,), flags)
    if not hp.is_recr(il):
        n_embd_head_k = hp.n_embd_head_k()
        c.create_tensor_qkv(layer, il, n_embd, n_embd_head_k * hp.n_head(il) * 2, hp.n_embd_k_gqa(), hp.n_embd_v_gqa(),
                            flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", il), (n_embd_head_k * hp.n_head(il), n_embd), flags)
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", il), (n_embd_head_k,), flags)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", il), (n_embd_head_k,), flags)
    else:
        optional = TENSOR_NOT_REQUIRED | flags
        layer.ssm_in = c.create_tensor(tn("SSM_IN", "weight", il), (n_embd, key_dim * 2 + value_dim * 2), optional)
        if layer.ssm_in is not None:
            c.ml.fail(f"blk.{il}.ssm_in.weight: the legacy fused Q/K/V/Z projection of early Qwen3-Next GGUFs "
                      "is not planned yet (reconvert for attn_qkv and attn_gate)")
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", il), (n_embd, key_dim * 2 + value_dim), optional)
        layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", il), (n_embd, value_dim), optional)
        layer.ssm_conv1d = c.create_tensor(tn("SSM_CONV1D", "weight", il), (hp.ssm_d_conv, key_dim * 2 + value_dim),
                                           flags)
        layer.ssm_dt = c.create_tensor(tn("SSM_DT", "bias", il), (hp.ssm_dt_rank,), flags)
        layer.ssm_a = c.create_tensor(tn("SSM_A_NOSCAN", None, il), (hp.ssm_dt_rank,), flags)
        layer.ssm_beta_alpha = c.create_tensor(tn("SSM_BETA_ALPHA", "weight", il), (n_embd, hp.ssm_dt_rank * 2), flags)
        layer.ssm_norm = c.create_tensor(tn("SSM_NORM", "weight", il), (hp.ssm_d_state,), flags)
        layer.ssm_out = c.create_tensor(tn("SSM_OUT", "weight", il), (value_dim, n_embd), flags)
    load_moe_tensors(c, layer, il, flags, hp.n_ff_shexp or hp.n_ff(il))


def load_block_mtp(c: TensorCreator, layer: Layer, il: int) -> None:
    """load_block_mtp: a trunk block and the NextN tensors, counted and skipped (load_mtp is off)."""
    load_block_trunk(c, layer, il, TENSOR_SKIP)
    c.create_nextn(il, TENSOR_SKIP)


def build(g: GraphContext) -> None:
    """llama_model_qwen3next::graph"""
    build_hybrid(g, build_layer_attn, build_layer_attn_linear, build_layer_ffn, "model.embed_tokens", "post_moe")


def build_layer_attn(g: GraphContext, inp, cur, inp_pos, il: int):
    """build_layer_attn: Q and its gate as views of one 4-D projection, Q/K norms, NEOX rope,
    attention, the sigmoid gate, the output projection."""
    hp, layer = g.hparams, g.model.layers[il]
    n_embd_head, n_head, n_head_kv, n_tokens = hp.n_embd_head_v(), hp.n_head(il), hp.n_head_kv(il), g.ubatch.n_tokens
    q_full, k, v = g.build_qkv_flat(layer, cur, n_embd_head * 2 * n_head, n_embd_head * n_head_kv,
                                    n_embd_head * n_head_kv, il)
    g.cb(q_full, "Qcur_full", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    q_full = ggml.reshape(q_full, n_embd_head * 2, n_head, n_tokens, 1)
    strides = (q_full.nb[1], q_full.nb[2], q_full.nb[3])
    q = ggml.view(q_full, (n_embd_head, n_head, n_tokens, 1), strides, 0)
    g.cb(q, "Qcur_view", il)
    gate = ggml.view(q_full, (n_embd_head, n_head, n_tokens, 1), strides, n_embd_head * ggml.type_size(q_full.type))
    g.cb(gate, "gate", il)
    k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
    v = ggml.reshape(v, n_embd_head, n_head_kv, n_tokens)
    q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
    g.cb(q, "Qcur_normed", il)
    k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
    g.cb(k, "Kcur_normed", il)
    q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q, "Qcur", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    kq_scale = 1.0 / math.sqrt(n_embd_head) if hp.f_attention_scale == 0.0 else hp.f_attention_scale
    cur = g.build_attn(inp, None, None, q, k, v, kq_scale, il)
    g.cb(cur, "attn_pregate", il)
    gate = ggml.cont(gate, n_embd_head * n_head, n_tokens)
    gate = ggml.unary(gate, "SIGMOID")
    g.cb(gate, "gate_sigmoid", il)
    cur = ggml.mul(cur, gate)
    g.cb(cur, "attn_gated", il)
    cur = g.build_lora_mm(layer.wo, cur)
    g.cb(cur, "attn_output", il)
    return cur


def build_layer_attn_linear(g: GraphContext, inp, cur, il: int):
    """build_layer_attn_linear: beta and alpha split from one projection per K head group; K heads
    repeated (interleaved) to the V heads before the delta net."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    n_seqs = ub.n_seqs
    n_seq_tokens = ub.n_tokens // n_seqs
    head_k_dim, num_k_heads, num_v_heads = hp.ssm_d_state, hp.ssm_n_group, hp.ssm_dt_rank

    qkv_mixed, z = build_qkvz(g, cur, il)
    mixed_ba = g.build_lora_mm(layer.ssm_beta_alpha, cur)
    g.cb(mixed_ba, "linear_attn_mixed_ba", il)
    per_group = num_v_heads // num_k_heads
    mixed_ba = ggml.reshape(mixed_ba, 2 * per_group, num_k_heads, n_seq_tokens, n_seqs)
    strides = (mixed_ba.nb[1], mixed_ba.nb[2], mixed_ba.nb[3])
    b = ggml.view(mixed_ba, (per_group, num_k_heads, n_seq_tokens, n_seqs), strides, 0)
    g.cb(b, "b", il)
    a = ggml.view(mixed_ba, (per_group, num_k_heads, n_seq_tokens, n_seqs), strides, per_group * ggml.type_size(mixed_ba.type))
    g.cb(a, "a", il)
    beta = ggml.unary(ggml.cont(b), "SIGMOID")
    alpha = ggml.cont(a, num_v_heads, n_seq_tokens, n_seqs)
    alpha_softplus = ggml.unary(ggml.add(alpha, layer.ssm_dt), "SOFTPLUS")
    g.cb(alpha_softplus, "a_softplus", il)
    gate = ggml.mul(alpha_softplus, layer.ssm_a)
    g.cb(gate, "gate", il)
    beta = ggml.reshape(beta, 1, num_v_heads, n_seq_tokens, n_seqs)
    gate = ggml.reshape(gate, 1, num_v_heads, n_seq_tokens, n_seqs)

    def repeat_heads(q, k):
        # repeat interleave: (head, 1, K heads, tokens) -> (head, factor, K heads, tokens) -> V heads
        out = []
        for t in (q, k):
            t = ggml.reshape(t, head_k_dim, 1, num_k_heads, n_seq_tokens * n_seqs)
            out.append(ggml.repeat_4d(t, head_k_dim, per_group, num_k_heads, n_seq_tokens * n_seqs))
        return tuple(ggml.reshape(t, head_k_dim, num_k_heads * per_group, n_seq_tokens, n_seqs) for t in out)

    return build_gdn_core(g, inp, qkv_mixed, z, gate, beta, repeat_heads if num_k_heads != num_v_heads else None, il)
