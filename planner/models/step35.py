"""LLM_ARCH_STEP35 (src/models/step35.cpp): Step-3.5-Flash (196B-A11B).

Sliding-window and full-attention layers by a per-layer pattern (llama_kv_cache_iswa), with their own
head counts, per-head Q/K norms, NEOX rope over the whole head on the window layers and half of it
on the full ones (with rope_freqs there when the file has them), a head-wise sigmoid gate on the
attention output; leading dense SwiGLU layers, then sigmoid-routed experts with a selection bias
beside a shared expert, each SwiGLU optionally clamped per layer (swiglu_clamp_exp / _shexp). The
multi-token-prediction blocks are counted; those of their tensors llama.cpp creates as merely
optional (norms, gate, FFNs, the shared head) are loaded even without MTP, the others skipped.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_SCALING_TYPE_LONGROPE, LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Layer, Model, TensorCreator, require_gating_func
from ..gguf import BOOL, INT32, UINT32
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    hp.n_rot_full //= 2   # the full-attention layers rope half of the head
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0) or LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    key = "%s.attention.sliding_window_pattern"
    if not ml.is_array(key):
        ml.fail(f"array key not found in model: {ml.key(key)}")
    flags = ml.get_arr(key, (BOOL, UINT32, INT32))
    hp.is_swa_arr = tuple(il < len(flags) and bool(flags[il]) for il in range(hp.n_layer_all))
    hp.swiglu_clamp_exp = ml.get_key_or_arr_f32("%s.swiglu_clamp_exp", hp.n_layer_all, 0.0)
    hp.swiglu_clamp_shexp = ml.get_key_or_arr_f32("%s.swiglu_clamp_shexp", hp.n_layer_all, 0.0)
    require_gating_func(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    # the MTP blocks: skipped without MTP (load_mtp off), optional in a file without them
    mtp_flags = (TENSOR_NOT_REQUIRED if c.trunk_only() else 0) | TENSOR_SKIP
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), trunk_flags)
    # one rope factor tensor for every layer, sized for the widest rope
    n_rot_max = max((hp.n_rot(il) for il in range(hp.n_layer)), default=0) or hp.n_rot()
    for il, layer in enumerate(model.layers):
        load_block(c, layer, il, trunk_flags, n_rot_max, TENSOR_DUPLICATED if il != 0 else 0)
    for il, layer in enumerate(model.layers_nextn, hp.n_layer):
        load_block(c, layer, il, mtp_flags, n_rot_max, TENSOR_DUPLICATED)
        c.create_tensor(tn("NEXTN_EH_PROJ", "weight", il), (2 * n_embd, n_embd), mtp_flags)
        c.create_tensor(tn("NEXTN_ENORM", "weight", il), (n_embd,), mtp_flags)
        c.create_tensor(tn("NEXTN_HNORM", "weight", il), (n_embd,), mtp_flags)
        c.create_tensor(tn("NEXTN_EMBED_TOKENS", "weight", il), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
        c.create_tensor(tn("NEXTN_SHARED_HEAD_HEAD", "weight", il), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
        c.create_tensor(tn("NEXTN_SHARED_HEAD_NORM", "weight", il), (n_embd,), TENSOR_NOT_REQUIRED)


def load_block(c: TensorCreator, layer: Layer, il: int, flags: int, n_rot_max: int, rope_dup: int) -> None:
    """load_block_trunk and load_block_mtp: what `flags` governs, the rest optional (loaded when present)."""
    hp = c.hparams
    n_embd, n_head, n_embd_head_k, n_embd_head_v = hp.n_embd, hp.n_head(il), hp.n_embd_head_k(), hp.n_embd_head_v()
    n_ff, n_ff_exp, n_expert, n_ff_shexp = hp.n_ff(), hp.n_ff_exp(), hp.n_expert, hp.n_ff_shexp
    optional = TENSOR_NOT_REQUIRED
    layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", il), (n_embd,), flags)
    layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", il), (n_embd_head_k,), optional)
    layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", il), (n_embd_head_k,), optional)
    if hp.rope_scaling_type_train == LLAMA_ROPE_SCALING_TYPE_LONGROPE:
        layer.rope_long = c.create_tensor(tn("ROPE_FACTORS_LONG", "weight", il), (n_rot_max // 2,), optional | rope_dup)
        layer.rope_short = c.create_tensor(tn("ROPE_FACTORS_SHORT", "weight", il), (n_rot_max // 2,), optional | rope_dup)
    else:
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", il), (n_rot_max // 2,), optional | rope_dup)
    c.create_tensor_qkv(layer, il, n_embd, n_embd_head_k * n_head, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il), flags)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", il), (n_embd_head_v * n_head, n_embd), flags)
    layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", il), (n_embd, n_head), optional)
    layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", il), (n_embd,), flags)
    layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", il), (n_embd, n_ff), optional)
    layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", il), (n_ff, n_embd), optional)
    layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", il), (n_embd, n_ff), optional)
    layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", il), (n_embd, n_expert), optional)
    layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", il), (n_embd, n_ff_exp, n_expert), optional)
    layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", il), (n_ff_exp, n_embd, n_expert), optional)
    layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", il), (n_embd, n_ff_exp, n_expert), optional)
    layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", il), (n_expert,), optional)
    layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", il), (n_embd, n_ff_shexp), optional)
    layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", il), (n_embd, n_ff_shexp), optional)
    layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", il), (n_ff_shexp, n_embd), optional)


def build(g: GraphContext) -> None:
    """llama_model_step35::graph (embeddings_nextn_masked is false: rows picked after the loop)"""
    model, hp = g.model, g.hparams
    n_embd_head_k, n_embd_head_v, n_tokens = hp.n_embd_head_k(), hp.n_embd_head_v(), g.ubatch.n_tokens
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        n_head, n_head_kv = hp.n_head(il), hp.n_head_kv(il)
        inp_sa = cur = inp_l
        g.cb(cur, "attn_norm_in", il)
        cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = g.build_qkv_flat(layer, cur, n_embd_head_k * n_head, n_embd_head_k * n_head_kv,
                                   n_embd_head_v * n_head_kv, il)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        q = ggml.reshape(q, n_embd_head_k, n_head, n_tokens)
        k = ggml.reshape(k, n_embd_head_k, n_head_kv, n_tokens)
        v = ggml.reshape(v, n_embd_head_v, n_head_kv, n_tokens)
        if layer.attn_q_norm is not None:
            q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
            g.cb(q, "Qcur_normed", il)
        if layer.attn_k_norm is not None:
            k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
            g.cb(k, "Kcur_normed", il)
        rope_factors = None if hp.is_swa(il) else model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur_pos", il)
        g.cb(k, "Kcur_pos", il)
        attn_out = g.build_attn(inp_attn, None, None, q, k, v, 1.0 / math.sqrt(n_embd_head_k), il)
        g.cb(attn_out, "attn_out", il)
        if layer.wqkv_gate is not None:   # head-wise sigmoid gate
            gate = g.build_lora_mm(layer.wqkv_gate, cur)
            g.cb(gate, "attn_gate", il)
            gate = ggml.unary(gate, "SIGMOID")
            g.cb(gate, "attn_gate_sigmoid", il)
            attn_3d = ggml.reshape(attn_out, n_embd_head_v, n_head, n_tokens)
            gate_3d = ggml.reshape(gate, 1, n_head, n_tokens)
            g.cb(gate_3d, "attn_gate_3d", il)
            attn_3d = ggml.mul(attn_3d, gate_3d)
            g.cb(attn_3d, "attn_gated_3d", il)
            attn_out = ggml.reshape(attn_3d, n_embd_head_v * n_head, n_tokens)
            g.cb(attn_out, "attn_gated", il)
        cur = g.build_lora_mm(layer.wo, attn_out)
        g.cb(cur, "attn_proj", il)

        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if layer.ffn_gate_inp is None:   # a dense layer
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                              LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                      LLM_FFN_SILU, hp.expert_weights_norm, hp.expert_weights_scale,
                                      hp.expert_gating_func, il)
            g.cb(moe_out, "ffn_moe_out", il)
            sh_out = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                                 None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(sh_out, "ffn_shared_out", il)
            cur = ggml.add(moe_out, sh_out)
            g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.cb(inp_l, "h_nextn", -1)
    g.t_h_nextn = inp_l
    cur = ggml.get_rows(inp_l, inp_out_ids)
    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
