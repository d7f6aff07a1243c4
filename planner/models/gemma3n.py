"""LLM_ARCH_GEMMA3N (src/models/gemma3n.cpp): Gemma 3n E2B/E4B (text).

Four AltUp streams of the hidden state (n_altup, the active one i_altup_act; the others projected
from the scaled embeddings by altup_proj, rescaled to its magnitude); per layer the streams are
predicted from a router over the active one, the active prediction runs attention (RMS-normed
Q/K/V, NEOX rope, norms after) beside LAuReL (a low-rank residual), a GeGLU FFN whose gate is
sparsified on the first 10 layers (gaussian_topk), then the streams are corrected and the per-layer
token embeddings (projected from the embeddings, gated by the corrected active stream) added to the
others. Sliding-window layers per the header's pattern (llama_kv_cache_iswa); the layers from 20
on reuse the K/V of layer 18 (sliding) or 19 (full). The streams are merged back (altup_unembd_proj)
before the output, whose logits are softcapped.
n_altup 4, i_altup_act 0, laurel_rank 64 and n_embd_altup 256 are llama_hparams' defaults (the
loader reads none of the converter's keys for them), as is the final softcapping of 30.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLAbort, Tensor
from ..graph import LLM_NORM_RMS, GraphContext, c_reciprocal
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX

N_LAYER_SPARSITY = 10                    # graph::n_layer_sparsity: layers using activation sparsity
F_SPARSITY_STD_MUL = 1.6448533535003662  # graph::f_sparsity_std_mul = normal_dist.icdf(0.95)


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_gemma3n::load_arch_hparams"""
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    load_swa_pattern(ml, hp, 5)
    hp.n_layer_kv_from_start = 20
    hp.f_attention_scale = 1.0
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train_swa)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_gemma3n::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab, n_layer, n_ff = hp.n_embd, hp.n_vocab, hp.n_layer, hp.n_ff()
    n_altup, laurel_rank, n_embd_altup = hp.n_altup, hp.laurel_rank, hp.n_embd_altup
    n_embd_head_k = hp.n_embd_head_k()
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.altup_proj = c.create_tensor(tn("ALTUP_PROJ", "weight"), (n_embd, n_embd, n_altup - 1))
    model.altup_unembd_proj = c.create_tensor(tn("ALTUP_UNEMBD_PROJ", "weight"), (n_embd, n_embd, n_altup - 1))
    model.per_layer_tok_embd = c.create_tensor(tn("PER_LAYER_TOKEN_EMBD", "weight"), (n_embd_altup * n_layer, n_vocab))
    model.per_layer_model_proj = c.create_tensor(tn("PER_LAYER_MODEL_PROJ", "weight", 0),
                                                 (n_embd, n_embd_altup * n_layer))
    model.per_layer_proj_norm = c.create_tensor(tn("PER_LAYER_PROJ_NORM", "weight", 0), (n_embd_altup,))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * hp.n_head(), hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * hp.n_head(), n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,))
        # altup & laurel
        layer.per_layer_inp_gate = c.create_tensor(tn("PER_LAYER_INP_GATE", "weight", i), (n_embd, n_embd_altup))
        layer.per_layer_proj = c.create_tensor(tn("PER_LAYER_PROJ", "weight", i), (n_embd_altup, n_embd))
        layer.per_layer_post_norm = c.create_tensor(tn("PER_LAYER_POST_NORM", "weight", i), (n_embd,))
        layer.altup_correct_coef = c.create_tensor(tn("ALTUP_CORRECT_COEF", "weight", i), (n_altup, n_altup))
        layer.altup_correct_scale = c.create_tensor(tn("ALTUP_CORRECT_SCALE", "weight", i), (n_embd,))
        layer.altup_predict_coef = c.create_tensor(tn("ALTUP_PREDICT_COEF", "weight", i), (n_altup, n_altup * n_altup))
        layer.altup_router = c.create_tensor(tn("ALTUP_ROUTER", "weight", i), (n_embd, n_altup))
        layer.altup_router_norm = c.create_tensor(tn("ALTUP_ROUTER_NORM", "weight", i), (n_embd,))
        layer.laurel_l = c.create_tensor(tn("LAUREL_L", "weight", i), (n_embd, laurel_rank))
        layer.laurel_r = c.create_tensor(tn("LAUREL_R", "weight", i), (laurel_rank, n_embd))
        layer.laurel_post_norm = c.create_tensor(tn("LAUREL_POST_NORM", "weight", i), (n_embd,))


def view_2d_slice(x: Tensor, idx: int) -> Tensor:
    """gemma3n_view_2d_slice: the 2-D slice idx of a 3-D tensor along its third dimension"""
    if not idx < x.ne[2]:
        raise GGMLAbort(f"llama.cpp would abort (gemma3n.cpp GGML_ASSERT(idx < x->ne[2])): slice {idx} of "
                        f"'{x.name}' with {x.ne[2]}")
    return ggml.view(x, (x.ne[0], x.ne[1]), (ggml.row_size(x.type, x.ne[0]),),
                     idx * x.ne[0] * x.ne[1] * ggml.type_size(x.type))


def build(g: GraphContext) -> None:
    """llama_model_gemma3n::graph for a ubatch of tokens"""
    model, hp = g.model, g.hparams
    n_tokens, n_embd, n_altup, i_altup_act = g.ubatch.n_tokens, hp.n_embd, hp.n_altup, hp.i_altup_act
    n_embd_head = hp.n_embd_head_k()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = ggml.scale(inp_l, math.sqrt(n_embd))
    g.cb(inp_l, "inp_scaled", -1)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_per_layer = build_inp_per_layer(g)
    ggml.build_forward_expand(g.gf, inp_per_layer)
    inp_per_layer = project_per_layer_inputs(g, inp_l, inp_per_layer)   # [n_embd_altup, n_tokens, n_layer]

    # the other altups projected from the active one, concatenated along the last dimension
    target_magnitude = calc_magnitude(inp_l)
    inp_repeated = ggml.repeat_4d(inp_l, n_embd, n_tokens, n_altup - 1, 1)
    altup_added = g.mul_mat_no_lora(model.altup_proj, inp_repeated)
    new_magnitude = calc_magnitude(altup_added)
    altup_added = ggml.div(ggml.mul(altup_added, target_magnitude), new_magnitude)
    inp_l = ggml.concat(inp_l, altup_added, 2)   # [n_embd, n_tokens, n_altup]
    g.cb(inp_l, "inp_stacked", -1)

    for il, layer in enumerate(model.layers):
        cur = inp_l
        predictions = altup_predict(g, cur, il)
        active_prediction = view_2d_slice(predictions, i_altup_act)
        cur = active_prediction
        g.cb(cur, "active_prediction", il)
        cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        laurel_out = laurel(g, cur, il)

        if hp.has_kv(il):
            q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
            q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
            k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
            v = ggml.rms_norm(v, hp.f_norm_rms_eps)
            g.cb(q, "Qcur_normed", il)
            g.cb(k, "Kcur_normed", il)
            g.cb(v, "Vcur_normed", il)
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(q, "Qcur_pos", il)
            g.cb(k, "Kcur_pos", il)
            cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, hp.f_attention_scale, il)
        else:   # the K/V of an earlier layer (llama_kv_cache's reuse map)
            if layer.wqkv is not None:
                qkv = g.build_lora_mm(layer.wqkv, cur)
                q = ggml.cont(ggml.view(qkv, (n_embd_head * hp.n_head(), n_tokens), (qkv.nb[1],), 0))
            else:
                q = g.build_lora_mm(layer.wq, cur)
            g.cb(q, "Qcur", il)
            q = ggml.reshape(q, n_embd_head, hp.n_head(), n_tokens)
            q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
            g.cb(q, "Qcur_normed", il)
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(q, "Qcur_pos", il)
            cur = g.build_attn(inp_attn, layer.wo, None, q, None, None, hp.f_attention_scale, il)
        cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_post_norm", il)
        cur = ggml.add(cur, active_prediction)
        g.cb(cur, "attn_gated", il)
        attn_laurel = ggml.scale(ggml.add(cur, laurel_out), 1.0 / math.sqrt(2.0))
        g.cb(attn_laurel, "attn_laurel", il)
        cur = g.build_norm(attn_laurel, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)

        up_proj = g.build_lora_mm(layer.ffn_up, cur)
        gate_proj = g.build_lora_mm(layer.ffn_gate, cur)
        if il < N_LAYER_SPARSITY:
            gate_proj = gaussian_topk(gate_proj)
        gate_proj = ggml.unary(gate_proj, "GELU")
        cur = ggml.mul(up_proj, gate_proj)
        cur = g.build_lora_mm(layer.ffn_down, cur)
        g.cb(cur, "ffn_out", il)
        cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, -1)
        g.cb(cur, "ffn_post_norm", il)
        attn_ffw_laurel_gated = ggml.add(cur, attn_laurel)
        g.cb(attn_ffw_laurel_gated, "attn_ffw_laurel_gated", il)

        corrected = altup_correct(g, predictions, attn_ffw_laurel_gated, il)
        first_prediction = view_2d_slice(corrected, i_altup_act)
        first_prediction = ggml.mul(first_prediction, layer.altup_correct_scale)
        first_prediction = g.build_lora_mm(layer.per_layer_inp_gate, first_prediction)
        first_prediction = ggml.unary(first_prediction, "GELU")
        g.cb(first_prediction, "first_prediction_gated", il)
        inp_this_layer = view_2d_slice(inp_per_layer, il)
        first_prediction = ggml.mul(first_prediction, inp_this_layer)
        g.cb(first_prediction, "first_prediction_scaled", il)
        first_prediction = g.build_lora_mm(layer.per_layer_proj, first_prediction)
        first_prediction = g.build_norm(first_prediction, layer.per_layer_post_norm, None, LLM_NORM_RMS, il)
        g.cb(first_prediction, "first_prediction_out", il)
        # corrected_predictions[1:] += first_prediction
        slice_first = view_2d_slice(corrected, 0)
        row = ggml.row_size(corrected.type, n_embd)
        slice_rest = ggml.view(corrected, (n_embd, n_tokens, n_altup - 1),
                               (row, ggml.row_size(corrected.type, n_embd * n_tokens)),
                               n_embd * n_tokens * ggml.type_size(corrected.type))
        tmp = ggml.add(slice_rest, first_prediction)
        cur = ggml.concat(slice_first, tmp, 2)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    # the altups merged back into one
    cur = inp_l
    target_magnitude = calc_magnitude(view_2d_slice(cur, i_altup_act))
    row = ggml.row_size(cur.type, n_embd)
    alt_slice = ggml.view(cur, (n_embd, n_tokens, n_altup - 1), (row, ggml.row_size(cur.type, n_embd * n_tokens)),
                          n_embd * n_tokens * ggml.type_size(cur.type))
    altup_unembd = g.mul_mat_no_lora(model.altup_unembd_proj, alt_slice)
    new_magnitude = calc_magnitude(altup_unembd)
    altup_unembd = ggml.div(ggml.mul(altup_unembd, target_magnitude), new_magnitude)
    g.cb(altup_unembd, "altup_unembd", -1)
    cur = view_2d_slice(cur, 0)
    for i in range(n_altup - 1):
        cur = ggml.add(cur, view_2d_slice(altup_unembd, i))
    cur = ggml.scale(cur, 1.0 / float(n_altup))
    g.cb(cur, "unembd_merged", -1)

    inp_out_ids = g.build_inp_out_ids()
    cur = ggml.get_rows(cur, inp_out_ids)
    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    cur = ggml.scale(cur, c_reciprocal(hp.f_final_logit_softcapping))
    cur = ggml.unary(cur, "TANH")
    cur = ggml.scale(cur, hp.f_final_logit_softcapping)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


def calc_magnitude(x: Tensor) -> Tensor:
    return ggml.sqrt(ggml.sum_rows(ggml.sqr(x)))


def build_inp_per_layer(g: GraphContext) -> Tensor:
    """graph::build_inp_per_layer for a token batch: [n_embd_altup, n_layer, n_tokens]"""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    tokens = ggml.new_tensor(ggml.T.I32, n_tokens)
    tokens.set_input()
    cur = ggml.get_rows(model.per_layer_tok_embd, tokens)
    cur = ggml.reshape(cur, hp.n_embd_altup, hp.n_layer, n_tokens)
    cur = ggml.scale(cur, math.sqrt(hp.n_embd_altup))
    g.cb(cur, "inp_per_layer_selected", -1)
    return cur


def project_per_layer_inputs(g: GraphContext, inp_batch: Tensor, inp_per_layer: Tensor) -> Tensor:
    """graph::project_per_layer_inputs: [n_embd_altup, n_tokens, n_layer]"""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    proj = g.mul_mat_no_lora(model.per_layer_model_proj, inp_batch)
    proj = ggml.scale(proj, 1.0 / math.sqrt(hp.n_embd))
    proj = ggml.reshape(proj, hp.n_embd_altup, hp.n_layer, n_tokens)
    proj = g.build_norm(proj, model.per_layer_proj_norm, None, LLM_NORM_RMS, -1)
    g.cb(proj, "per_layer_proj", -1)
    cur = ggml.add(proj, inp_per_layer)
    cur = ggml.scale(cur, 1.0 / math.sqrt(2.0))
    g.cb(cur, "inp_per_layer", -1)
    return ggml.cont(ggml.permute(cur, 0, 2, 1, 3))


def laurel(g: GraphContext, cur: Tensor, il: int) -> Tensor:
    layer = g.model.layers[il]
    tmp = g.build_lora_mm(layer.laurel_l, cur)
    tmp = g.build_lora_mm(layer.laurel_r, tmp)
    tmp = g.build_norm(tmp, layer.laurel_post_norm, None, LLM_NORM_RMS, il)
    tmp = ggml.add(tmp, cur)
    g.cb(tmp, "laurel_out", il)
    return tmp


def gaussian_topk(x: Tensor) -> Tensor:
    mean = ggml.mean(x)
    std = ggml.sqrt(ggml.scale(ggml.sum_rows(ggml.sqr(ggml.sub(x, mean))), 1.0 / float(x.ne[0] - 1)))
    cutoff_x = ggml.add(mean, ggml.scale(std, F_SPARSITY_STD_MUL))
    return ggml.unary(ggml.sub(x, cutoff_x), "RELU")


def altup_compute_router_modalities(g: GraphContext, x: Tensor, il: int) -> Tensor:
    layer = g.model.layers[il]
    router_inputs = g.build_norm(x, layer.altup_router_norm, None, LLM_NORM_RMS, il)
    router_inputs = ggml.scale(router_inputs, 1.0 / float(g.hparams.n_embd))
    output = g.mul_mat_no_lora(layer.altup_router, router_inputs)
    return ggml.unary(output, "TANH")


def altup_predict(g: GraphContext, cur: Tensor, il: int) -> Tensor:
    hp, n_tokens = g.hparams, g.ubatch.n_tokens
    activated = view_2d_slice(cur, hp.i_altup_act)
    modalities = altup_compute_router_modalities(g, activated, il)
    g.cb(modalities, "modalities", il)
    all_coefs = g.build_lora_mm(g.model.layers[il].altup_predict_coef, modalities)
    g.cb(all_coefs, "all_coefs", il)
    all_coefs = ggml.reshape(all_coefs, hp.n_altup, hp.n_altup, n_tokens)
    cur_permuted = ggml.cont(ggml.permute(cur, 1, 2, 0, 3))
    predictions = ggml.mul_mat(cur_permuted, all_coefs)
    predictions = ggml.cont(ggml.permute(predictions, 0, 2, 1, 3))
    predictions = ggml.add(predictions, cur)
    g.cb(predictions, "predictions", il)
    return predictions


def altup_correct(g: GraphContext, predictions: Tensor, activated: Tensor, il: int) -> Tensor:
    hp, n_tokens = g.hparams, g.ubatch.n_tokens
    modalities = altup_compute_router_modalities(g, activated, il)
    g.cb(modalities, "modalities", il)
    active_prediction = view_2d_slice(predictions, hp.i_altup_act)
    innovation = ggml.sub(activated, active_prediction)
    g.cb(innovation, "innovation", il)
    all_coefs = g.build_lora_mm(g.model.layers[il].altup_correct_coef, modalities)
    all_coefs = ggml.scale_bias(all_coefs, 1.0, 1.0)
    g.cb(all_coefs, "all_coefs", il)
    all_coefs = ggml.transpose(all_coefs)
    all_coefs = ggml.cont(all_coefs, 1, n_tokens, hp.n_altup)
    innovation = ggml.repeat_4d(innovation, hp.n_embd, n_tokens, hp.n_altup, 1)
    corrected = ggml.mul(innovation, all_coefs)
    corrected = ggml.add(corrected, predictions)
    g.cb(corrected, "corrected", il)
    return corrected
