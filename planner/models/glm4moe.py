"""LLM_ARCH_GLM4_MOE (src/models/glm4-moe.cpp): GLM-4.5, GLM-4.5-Air, GLM-4.6, Solar Open.

Attention with biases (and optional QK norms, GLM-4.5 355B), a post-attention norm before the FFN,
leading dense layers, then sigmoid-routed experts with a selection bias beside a shared expert.
The GGUF carries a multi-token-prediction block (nextn_predict_layers, the last blocks): loaded
only with load_mtp, otherwise counted and skipped (TENSOR_SKIP); the graph runs the trunk.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn


def LLAMA_ROPE_TYPE(hp: HParams) -> int:
    """llama_model_rope_type: M-RoPE when the header has rope sections (GLM-4.5V), else NEOX."""
    return LLAMA_ROPE_TYPE_MROPE if hp.use_mrope() else LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    if ml.has("%s.rope.dimension_sections"):
        hp.rope_sections = ml.get_rope_sections()
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    # GLM-4.5 uses sigmoid: the default when the key is absent (LLAMA_EXPERT_GATING_FUNC_TYPE_NONE)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0) or LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    # the graph asserts it (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the glm4moe graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_layer = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_layer
    n_embd_head_k = hp.n_embd_head_k()
    # a file of the MTP block alone, or of the trunk alone (llama_model_glm4_moe::load_arch_tensors)
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    mtp_flags = (TENSOR_NOT_REQUIRED if c.trunk_only() else 0) | TENSOR_SKIP    # load_mtp is off
    require(c.ml, n_expert > 0, "n_expert must be > 0 for GLM4_MOE MoE layers")
    require(c.ml, hp.n_expert_used() > 0, "n_expert_used must be > 0 for GLM4_MOE MoE layers")

    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers + model.layers_nextn):
        flags = trunk_flags if i < n_layer else mtp_flags
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * hp.n_head(i), hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i),
                            flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * hp.n_head(i), n_embd), flags)
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,), TENSOR_NOT_REQUIRED | flags)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,), TENSOR_NOT_REQUIRED | flags)
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,), flags)
        if i >= hp.n_layer_dense_lead:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), flags)
            n_ff_exp = hp.n_ff_exp() or hp.n_ff() // hp.n_expert_used()
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert), flags)
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            if hp.n_expert_shared > 0:
                n_ff_shexp = n_ff_exp * hp.n_expert_shared
                layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
                layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
                layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        else:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, hp.n_ff()), flags)
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (hp.n_ff(), n_embd), flags)
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, hp.n_ff()), flags)
        if i >= n_layer:
            c.create_nextn(i, flags)


def build(g: GraphContext) -> None:
    """llama_model_glm4_moe::graph (embeddings_nextn off: rows picked in the last layer)"""
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
        if layer.attn_q_norm is not None:
            q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
            g.cb(q, "Qcur_normed", il)
        if layer.attn_k_norm is not None:
            k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
            g.cb(k, "Kcur_normed", il)
        if hp.use_mrope():
            q = ggml.rope_multi(q, inp_pos, None, hp.n_rot(il), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_multi(k, inp_pos, None, hp.n_rot(il), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
        else:
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

        cur = g.build_norm(ffn_inp, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "post_attn_norm", il)
        if il < hp.n_layer_dense_lead:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                              LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            routed_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                         layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                         LLM_FFN_SILU, hp.expert_weights_norm, hp.expert_weights_scale,
                                         hp.expert_gating_func, il)
            g.cb(routed_out, "ffn_moe_out", il)
            shared_out = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                                     None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(shared_out, "ffn_shexp_out", il)
            cur = ggml.add(routed_out, shared_out)
            g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, h_nextn=True)
