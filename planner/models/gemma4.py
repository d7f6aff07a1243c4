"""LLM_ARCH_GEMMA4 (src/models/gemma4.cpp): Gemma 4, dense (31B), MoE (26B-A4B) and the small E2B/E4B.

Sliding-window and full-attention layers per a flag array (llama_kv_cache_iswa), with their own head
sizes; RMS-normed Q/K and an unweighted RMS norm of V, proportional rope (rope_freqs) on the full
layers, V projected by K where attn_v is absent, norms after attention and FFN. MoE layers keep the
dense GeGLU FFN beside the experts, each normed before and after, routed from a scaled RMS norm of the
attention output. E2B/E4B add per-layer token embeddings and projections, and their last layers reuse
the K/V of earlier ones (shared_kv_layers). Optional final logit softcapping.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLAbort
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_GELU, LLM_FFN_PAR, LLM_NORM_RMS, GraphContext,
                     c_reciprocal)
from ..gguf import BOOL, INT32, UINT32
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_READ_LAZY, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def _int32(x: int) -> int:
    """A value as C's int32_t holds it (two's complement wrap)."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    key = "%s.attention.sliding_window_pattern"
    if not ml.is_array(key):
        ml.fail(f"array key not found in model: {ml.key(key)}")
    flags = ml.get_arr(key, (BOOL, UINT32, INT32))
    hp.is_swa_arr = tuple(il < len(flags) and flags[il] != 0 for il in range(hp.n_layer_all))
    n_kv_shared_layers = ml.get_u32("%s.attention.shared_kv_layers", 0)
    hp.n_layer_kv_from_start = _int32(hp.n_layer_all - _int32(n_kv_shared_layers))
    hp.f_attention_scale = 1.0   # Gemma4 uses self.scaling = 1.0 (no pre-attn scaling)
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train_swa)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all, 0)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_embd_per_layer = ml.get_u32("%s.embedding_length_per_layer_input")
    hp.n_embd_head_k_swa = ml.get_u32("%s.attention.key_length_swa")
    hp.n_embd_head_v_swa = ml.get_u32("%s.attention.value_length_swa")
    hp.f_final_logit_softcapping = ml.get_f32("%s.final_logit_softcapping", hp.f_final_logit_softcapping)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp, ml = model.hparams, c.ml
    n_embd, n_vocab, n_layer, n_expert = hp.n_embd, hp.n_vocab, hp.n_layer, hp.n_expert
    n_embd_per_layer = hp.n_embd_per_layer
    n_ff_exp = hp.n_ff_exp()
    if hp.n_embd_head_k() != hp.n_embd_head_v():
        ml.fail("Gemma 4 requires n_embd_head_k == n_embd_head_v")
    if hp.n_embd_head_k_swa != hp.n_embd_head_v_swa:
        ml.fail("Gemma 4 requires n_embd_head_k_swa == n_embd_head_v_swa")

    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    if n_embd_per_layer > 0:
        model.per_layer_tok_embd = c.create_tensor(tn("PER_LAYER_TOKEN_EMBD", "weight"),
                                                   (n_embd_per_layer * n_layer, n_vocab), TENSOR_READ_LAZY)
        model.per_layer_model_proj = c.create_tensor(tn("PER_LAYER_MODEL_PROJ", "weight", 0),
                                                     (n_embd, n_embd_per_layer * n_layer))
        model.per_layer_proj_norm = c.create_tensor(tn("PER_LAYER_PROJ_NORM", "weight", 0), (n_embd_per_layer,))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))

    rope_freqs_flag = 0
    for i, layer in enumerate(model.layers):
        n_head, n_embd_head = hp.n_head(i), hp.n_embd_head_k(i)
        n_embd_k, n_embd_v = hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i)
        kv_flags = 0 if hp.has_kv(i) else TENSOR_NOT_REQUIRED
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        # use_alternative_attention: v_proj is optional, K stands in for V
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_embd_head * n_head + n_embd_k + n_embd_v),
                                     TENSOR_NOT_REQUIRED)
        if layer.wqkv is None:
            layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd, n_embd_head * n_head))
            layer.wk = c.create_tensor(tn("ATTN_K", "weight", i), (n_embd, n_embd_k), kv_flags)
            layer.wv = c.create_tensor(tn("ATTN_V", "weight", i), (n_embd, n_embd_v), TENSOR_NOT_REQUIRED)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head * n_head, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head,), kv_flags)
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,))
        layer.out_scale = c.create_tensor(tn("LAYER_OUT_SCALE", "weight", i), (1,), TENSOR_NOT_REQUIRED)
        if not hp.is_swa(i):
            # full-attention layers: proportional rope; one rope_freqs, duplicated per buffer type
            layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (n_embd_head // 2,), rope_freqs_flag)
            rope_freqs_flag = TENSOR_DUPLICATED

        # the dense FFN, kept beside the experts as the shared one in MoE layers
        n_ff = hp.n_ff(i)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,))

        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), TENSOR_NOT_REQUIRED)
        if layer.ffn_gate_inp is not None:
            layer.ffn_gate_inp_s = c.create_tensor(tn("FFN_GATE_INP", "scale", i), (n_embd,))
            layer.ffn_pre_norm_2 = c.create_tensor(tn("FFN_PRE_NORM_2", "weight", i), (n_embd,))
            layer.ffn_post_norm_1 = c.create_tensor(tn("FFN_POST_NORM_1", "weight", i), (n_embd,))
            layer.ffn_post_norm_2 = c.create_tensor(tn("FFN_POST_NORM_2", "weight", i), (n_embd,))
            c.create_tensor_gate_up_exps(layer, i, n_embd, n_ff_exp, n_expert)
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))

        if n_embd_per_layer > 0:
            layer.per_layer_inp_gate = c.create_tensor(tn("PER_LAYER_INP_GATE", "weight", i), (n_embd, n_embd_per_layer))
            layer.per_layer_proj = c.create_tensor(tn("PER_LAYER_PROJ", "weight", i), (n_embd_per_layer, n_embd))
            layer.per_layer_post_norm = c.create_tensor(tn("PER_LAYER_POST_NORM", "weight", i), (n_embd,))

    # llama_model_base::load_tensors' generic pass over the optional ".scale" tensors, after every
    # layer's own: of those, the converter writes the experts' down scales (router.per_expert_scale);
    # the others (NVFP4 checkpoints) are not planned and leave a file with them over-counted
    for i, layer in enumerate(model.layers):
        if layer.ffn_down_exps is not None:
            layer.ffn_down_exps_s = c.create_tensor(tn("FFN_DOWN_EXPS", "scale", i), (n_expert,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_gemma4::graph"""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = ggml.scale(inp_l, math.sqrt(hp.n_embd))
    g.cb(inp_l, "inp_scaled", -1)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()

    inp_per_layer = None
    if model.per_layer_tok_embd is not None:
        inp_per_layer = _build_inp_per_layer(g)
        ggml.build_forward_expand(g.gf, inp_per_layer)
        inp_per_layer = _project_per_layer_inputs(g, inp_l, inp_per_layer)

    for il, layer in enumerate(model.layers):
        n_embd_head, n_head, n_head_kv = hp.n_embd_head_k(il), hp.n_head(il), hp.n_head_kv(il)
        if n_embd_head != hp.n_embd_head_v(il):
            raise GGMLAbort(f"llama.cpp would abort building the graph (gemma4.cpp GGML_ASSERT(n_embd_head == "
                            f"n_embd_head_v(il))): layer {il} has K heads of {n_embd_head}, V heads of {hp.n_embd_head_v(il)}")
        n_rot = hp.n_rot(il)
        g.t_layer_inp[il] = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        freq_factors = None if hp.is_swa(il) else layer.rope_freqs

        qkv_fused = None
        if layer.wqkv is not None:
            qkv_fused = g.build_lora_mm(layer.wqkv, cur)
            g.cb(qkv_fused, "wqkv", il)
            q = ggml.cont(ggml.view(qkv_fused, (n_embd_head * n_head, n_tokens), (qkv_fused.nb[1],), 0))
        else:
            q = g.build_lora_mm(layer.wq, cur)
        g.cb(q, "Qcur", il)
        q = ggml.reshape(q, n_embd_head, n_head, n_tokens)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        q = ggml.rope_ext(q, inp_pos, freq_factors, n_rot, hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur_pos", il)

        if hp.has_kv(il):
            if qkv_fused is not None:
                q_dim, k_dim = n_embd_head * n_head, n_embd_head * n_head_kv
                esize = ggml.row_size(qkv_fused.type, 1)
                k = ggml.cont(ggml.view(qkv_fused, (k_dim, n_tokens), (qkv_fused.nb[1],), q_dim * esize))
                v = ggml.cont(ggml.view(qkv_fused, (k_dim, n_tokens), (qkv_fused.nb[1],), (q_dim + k_dim) * esize))
            else:
                k = g.build_lora_mm(layer.wk, cur)
                v = g.build_lora_mm(layer.wv, cur) if layer.wv is not None else k
            g.cb(k, "Kcur", il)
            g.cb(v, "Vcur", il)
            k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
            v = ggml.reshape(v, n_embd_head, n_head_kv, n_tokens)
            k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
            v = ggml.rms_norm(v, hp.f_norm_rms_eps)
            g.cb(k, "Kcur_normed", il)
            g.cb(v, "Vcur_normed", il)
            k = ggml.rope_ext(k, inp_pos, freq_factors, n_rot, hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(k, "Kcur_pos", il)
            cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, hp.f_attention_scale, il)
        else:
            # the K/V of an earlier layer (llama_kv_cache's reuse map)
            cur = g.build_attn(inp_attn, layer.wo, None, q, None, None, hp.f_attention_scale, il)

        cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_post_norm", il)
        attn_out = ggml.add(cur, inp_l)
        g.cb(attn_out, "attn_out", il)

        if layer.ffn_gate_inp is not None:
            cur_mlp = g.build_norm(attn_out, layer.ffn_norm, None, LLM_NORM_RMS, il)
            g.cb(cur_mlp, "ffn_norm_1", il)
            cur_mlp = g.build_ffn(cur_mlp, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                                  LLM_FFN_GELU, LLM_FFN_PAR, il)
            cur_mlp = g.build_norm(cur_mlp, layer.ffn_post_norm_1, None, LLM_NORM_RMS, il)
            g.cb(cur_mlp, "ffn_mlp", il)

            cur_moe = g.build_norm(attn_out, layer.ffn_pre_norm_2, None, LLM_NORM_RMS, il)
            g.cb(cur_moe, "ffn_norm_2", il)
            # the router reads attn_out, not cur_moe
            tmp = ggml.rms_norm(attn_out, hp.f_norm_rms_eps)
            tmp = ggml.scale(tmp, 1.0 / math.sqrt(hp.n_embd))
            tmp = ggml.mul(tmp, layer.ffn_gate_inp_s)
            logits = g.build_lora_mm(layer.ffn_gate_inp, tmp)
            g.cb(logits, "ffn_moe_logits", il)
            cur_moe = g.build_moe_ffn(cur_moe, None, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                      None, hp.n_expert, hp.n_expert_used(), LLM_FFN_GELU, True, 1.0,
                                      LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il, probs_in=logits,
                                      gate_up_exps=layer.ffn_gate_up_exps, down_exps_s=layer.ffn_down_exps_s)
            cur_moe = g.build_norm(cur_moe, layer.ffn_post_norm_2, None, LLM_NORM_RMS, il)
            g.cb(cur_moe, "ffn_moe", il)
            cur = ggml.add(cur_mlp, cur_moe)
            g.cb(cur, "ffn_moe_combined", il)
        else:
            cur = g.build_norm(attn_out, layer.ffn_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "ffn_norm", il)
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_GELU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, -1)
        g.cb(cur, "ffn_post_norm", il)
        cur = ggml.add(cur, attn_out)

        if inp_per_layer is not None:
            pe_in = cur
            g.cb(cur, "pe_in", il)
            cur = g.build_lora_mm(layer.per_layer_inp_gate, cur)
            cur = ggml.unary(cur, "GELU")
            # the layer's 2-D slice of [n_embd_per_layer, n_tokens, n_layer] (gemma4_view_2d_slice)
            x = inp_per_layer
            inp_this_layer = ggml.view(x, (x.ne[0], x.ne[1]), (ggml.row_size(x.type, x.ne[0]),),
                                       il * x.ne[0] * x.ne[1] * ggml.row_size(x.type, 1))
            cur = ggml.mul(cur, inp_this_layer)
            cur = g.build_lora_mm(layer.per_layer_proj, cur)
            cur = g.build_norm(cur, layer.per_layer_post_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "per_layer_embd_out", il)
            cur = ggml.add(pe_in, cur)

        if layer.out_scale is not None:
            cur = ggml.mul(cur, layer.out_scale)
            g.cb(cur, "out_scaled", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    # embeddings_nextn_masked is false: the output rows are picked after the norm kept for MTP
    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "h_nextn", -1)
    g.t_h_nextn = cur
    cur = ggml.get_rows(cur, inp_out_ids)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    if hp.f_final_logit_softcapping != 0.0:
        cur = ggml.scale(cur, c_reciprocal(hp.f_final_logit_softcapping))
        cur = ggml.unary(cur, "TANH")
        cur = ggml.scale(cur, hp.f_final_logit_softcapping)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


def _build_inp_per_layer(g: GraphContext):
    """graph::build_inp_per_layer for a token batch: the per-layer embeddings of the tokens,
    [n_embd_per_layer, n_layer, n_tokens], scaled by sqrt(n_embd_per_layer)."""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    tokens = ggml.new_tensor(ggml.T.I32, n_tokens)
    tokens.set_input()
    cur = ggml.get_rows(model.per_layer_tok_embd, tokens)
    cur = ggml.reshape(cur, hp.n_embd_per_layer, hp.n_layer, n_tokens)
    cur = ggml.scale(cur, math.sqrt(hp.n_embd_per_layer))
    g.cb(cur, "inp_per_layer_selected", -1)
    return cur


def _project_per_layer_inputs(g: GraphContext, inp_batch, inp_per_layer):
    """graph::project_per_layer_inputs: [n_embd_per_layer, n_tokens, n_layer]"""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    proj = g.mul_mat_no_lora(model.per_layer_model_proj, inp_batch)
    proj = ggml.scale(proj, 1.0 / math.sqrt(hp.n_embd))
    proj = ggml.reshape(proj, hp.n_embd_per_layer, hp.n_layer, n_tokens)
    proj = g.build_norm(proj, model.per_layer_proj_norm, None, LLM_NORM_RMS, -1)
    g.cb(proj, "per_layer_proj", -1)
    cur = ggml.add(proj, inp_per_layer)
    cur = ggml.scale(cur, 1.0 / math.sqrt(2.0))
    g.cb(cur, "inp_per_layer", -1)
    return ggml.cont(ggml.permute(cur, 0, 2, 1, 3))
