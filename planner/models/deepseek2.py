"""LLM_ARCH_DEEPSEEK2 (src/models/deepseek2.cpp): DeepSeek V2/V2.5/V3/R1, Kimi K2, GigaChat3.

Multi-head latent attention with the absorption optimisation (MQA over a K-only cache of
kv_lora_rank + rope values, V read from it and decompressed by attn_v_b), leading dense layers,
routed experts with a selection bias and group-limited routing, shared experts.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_ROPE_TYPE_NORM, HParams
from ..ggml import GGMLAbort, Tensor
from ..model import Layer, Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    n_vocab = ml.get_u32("%s.vocab_size", 0) or ml.n_tokens()
    # lite variants (DeepSeek-V2-Lite, GigaChat3-10B-A1.8B, Kanana-2-30B-A3B) have no Q LoRA
    is_lite = hp.n_layer in (26, 27) or (hp.n_layer == 48 and n_vocab == 128256)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    if not is_lite:
        hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla", 0)
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla", 0)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0)
    if hp.expert_gating_func == 0:   # DeepSeek V2/V2.5 GGUFs predate the key
        hp.expert_gating_func = 2 if hp.n_layer in (47, 48) and n_vocab == 154880 else 1   # GLM 4.7 Lite: sigmoid
    require_gating_func(ml, hp)
    hp.f_attn_temp_scale = ml.get_f32("%s.attention.temperature_scale", 0.0)
    require(ml, hp.n_embd_head_k_mla() > hp.n_rot(),
            f"key_length_mla {hp.n_embd_head_k_mla()} must exceed the rope dimensions {hp.n_rot()}")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    n_embd_head_k_mla, n_embd_head_v_mla = hp.n_embd_head_k_mla(), hp.n_embd_head_v_mla()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k_mla - n_embd_head_qk_rope
    q_lora_rank, kv_lora_rank = hp.n_lora_q, hp.n_lora_kv
    n_ff_exp, n_expert_shared = hp.n_ff_exp(), hp.n_expert_shared
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    # a file of the MTP block alone, or of the trunk alone (llama_model_deepseek2::load_arch_tensors)
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    mtp_flags = (TENSOR_NOT_REQUIRED if c.trunk_only() else 0) | TENSOR_SKIP    # load_mtp is off
    for i, layer in enumerate(model.layers + model.layers_nextn):
        flags = trunk_flags if i < hp.n_layer else mtp_flags
        n_head = hp.n_head(i)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        if q_lora_rank > 0:
            layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,), flags)
        layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,), flags)
        if q_lora_rank > 0:
            layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank), flags)
            layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head * n_embd_head_k_mla), flags)
        else:
            layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd, n_head * n_embd_head_k_mla), flags)
        layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + n_embd_head_qk_rope),
                                          flags)
        if hp.is_mla():
            layer.wk_b = c.create_tensor(tn("ATTN_K_B", "weight", i), (n_embd_head_qk_nope, kv_lora_rank, n_head), flags)
            layer.wv_b = c.create_tensor(tn("ATTN_V_B", "weight", i), (kv_lora_rank, n_embd_head_v_mla, n_head), flags)
        else:   # only old GGUFs have the unsplit wkv_b
            layer.wkv_b = c.create_tensor(tn("ATTN_KV_B", "weight", i),
                                          (kv_lora_rank, n_head * (n_embd_head_qk_nope + n_embd_head_v_mla)), flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_v_mla, n_embd), flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        if i < hp.n_layer_dense_lead:
            n_ff = hp.n_ff(i)
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), flags)
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), flags)
        else:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,),
                                                    TENSOR_NOT_REQUIRED | flags)
            require(c.ml, n_expert > 0 and hp.n_expert_used() > 0, "n_expert and n_expert_used must be > 0")
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert), flags)
            c.create_tensor_gate_up_exps(layer, i, n_embd, n_ff_exp, n_expert, flags)
            n_ff_shexp = n_ff_exp * n_expert_shared
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        if i >= hp.n_layer:
            c.create_nextn(i, flags)


def build(g: GraphContext) -> None:
    """llama_model_deepseek2::graph: MLA with the absorption over a K-only cache, or, for legacy
    GGUFs without the attn_k_b/attn_v_b split, MHA over K and V decompressed by attn_kv_b; for
    deepseek2-ocr (is_ocr) plain MHA over Q/K/V projections, NEOX-roped over the whole head. kq_scale
    carries YaRN's mscale in llama.cpp; it is an op parameter only and leaves memory as it is."""
    model, hp = g.model, g.hparams
    is_ocr = hp.arch == "deepseek2-ocr"
    n_tokens = g.ubatch.n_tokens
    n_embd_head_k = hp.n_embd_head_k_mla()    # the head sizes as MHA (after decompression for MLA)
    n_embd_head_v = hp.n_embd_head_v_mla()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k - n_embd_head_qk_rope
    kv_lora_rank = hp.n_lora_kv
    kq_scale = 1.0 / math.sqrt(n_embd_head_k)
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_attn_scale = g.build_inp_attn_scale() if hp.f_attn_temp_scale != 0.0 else None
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_k() if hp.is_mla() else g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        n_head = hp.n_head(il)
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        if is_ocr:
            n_embed_head = hp.n_embd // hp.n_head()
            if not n_embed_head == n_embd_head_k == n_embd_head_v:
                raise GGMLAbort(f"llama.cpp would abort (deepseek2.cpp GGML_ASSERT(n_embed_head == n_embd_head_k && "
                                f"n_embed_head == n_embd_head_v)): n_embd / n_head {n_embed_head}, K {n_embd_head_k}, "
                                f"V {n_embd_head_v}")
            q_cur, k_cur, v_cur = g.build_qkv(layer, cur, n_embed_head, n_head, n_head, il)
            g.cb(q_cur, "q", il)
            g.cb(k_cur, "k", il)
            g.cb(v_cur, "v", il)
            if not abs(hp.rope_freq_base_train - 10000.0) < 1e-4:
                raise GGMLAbort(f"llama.cpp would abort (deepseek2.cpp GGML_ASSERT(fabs(freq_base - 10000.0) < 1e-4)): "
                                f"rope.freq_base is {hp.rope_freq_base_train}")
            # NEOX over the whole head, no YaRN (n_ctx_orig 0)
            q_cur = ggml.rope_ext(q_cur, inp_pos, None, n_embed_head, LLAMA_ROPE_TYPE_NEOX, 0)
            k_cur = ggml.rope_ext(k_cur, inp_pos, None, n_embed_head, LLAMA_ROPE_TYPE_NEOX, 0)
            g.cb(q_cur, "q_pe", il)
            g.cb(k_cur, "k_pe", il)
            cur = g.build_attn(inp_attn, layer.wo, None, q_cur, k_cur, v_cur, kq_scale, il)
            g.cb(cur, "attn_out", il)
        else:
            if layer.wq is None:
                q = g.mul_mat_no_lora(layer.wq_a, cur)
                g.cb(q, "q", il)
                q = g.build_norm(q, layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
                g.cb(q, "q", il)
                q = g.mul_mat_no_lora(layer.wq_b, q)
            else:
                q = g.mul_mat_no_lora(layer.wq, cur)
            g.cb(q, "q", il)
            q = ggml.reshape(q, n_embd_head_k, n_head, n_tokens)
            g.cb(q, "q", il)

            kv_cmpr_pe = g.mul_mat_no_lora(layer.wkv_a_mqa, cur)
            g.cb(kv_cmpr_pe, "kv_cmpr_pe", il)
            row = ggml.row_size(kv_cmpr_pe.type, kv_lora_rank + n_embd_head_qk_rope)
            kv_cmpr = ggml.view(kv_cmpr_pe, (kv_lora_rank, n_tokens), (row,), 0)
            g.cb(kv_cmpr, "kv_cmpr", il)
            k_pe = ggml.view(kv_cmpr_pe, (n_embd_head_qk_rope, 1, n_tokens), (row, row),
                             ggml.row_size(kv_cmpr_pe.type, kv_lora_rank))
            g.cb(k_pe, "k_pe", il)
            k_pe = ggml.rope_ext(k_pe, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(k_pe, "k_pe", il)
            kv_cmpr = g.build_norm(kv_cmpr, layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)
            g.cb(kv_cmpr, "kv_cmpr", il)

            if hp.is_mla():
                q_nope = ggml.view(q, (n_embd_head_qk_nope, n_head, n_tokens), (q.nb[1], q.nb[2]), 0)
                g.cb(q_nope, "q_nope", il)
                q_pe = ggml.view(q, (n_embd_head_qk_rope, n_head, n_tokens), (q.nb[1], q.nb[2]),
                                 ggml.row_size(q.type, n_embd_head_qk_nope))
                g.cb(q_pe, "q_pe", il)
                q_pe = ggml.rope_ext(q_pe, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
                g.cb(q_pe, "q_pe", il)
                q_cur, k_cur, v_cur = build_mla_absorbed(g, layer, q_nope, q_pe, kv_cmpr, k_pe, il)
                if inp_attn_scale is not None:
                    q_cur = ggml.mul(q_cur, inp_attn_scale)
                    g.cb(q_cur, "Qcur_attn_temp_scaled", il)
                cur = g.build_attn(inp_attn, layer.wo, None, q_cur, k_cur, v_cur, kq_scale, il, v_mla=layer.wv_b)
            else:   # MLA without the absorption: MHA over K and V decompressed by wkv_b
                kv = g.mul_mat_no_lora(layer.wkv_b, kv_cmpr)
                g.cb(kv, "kv", il)
                row_kv = ggml.row_size(kv.type, n_embd_head_qk_nope + n_embd_head_v)
                k_nope = ggml.view(kv, (n_embd_head_qk_nope, n_head, n_tokens), (row_kv, row_kv * n_head), 0)
                g.cb(k_nope, "k_nope_view", il)
                v_cur = ggml.view(kv, (n_embd_head_v, n_head, n_tokens), (row_kv, row_kv * n_head),
                                  ggml.row_size(kv.type, n_embd_head_qk_nope))
                g.cb(v_cur, "Vcur_view", il)
                v_cur = ggml.cont(v_cur)
                g.cb(v_cur, "Vcur_cont", il)
                # rope on the trailing dims only (ggml_rope_set_offset: an op parameter)
                q_cur = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
                g.cb(q_cur, "Qcur", il)
                k_cur = ggml.concat(k_nope, ggml.repeat_4d(k_pe, n_embd_head_qk_rope, n_head, n_tokens, 1), 0)
                g.cb(k_cur, "Kcur", il)
                if inp_attn_scale is not None:
                    q_cur = ggml.mul(q_cur, inp_attn_scale)
                    g.cb(q_cur, "Qcur_attn_temp_scaled", il)
                cur = g.build_attn(inp_attn, layer.wo, None, q_cur, k_cur, v_cur, kq_scale, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = build_ffn_dense_or_moe(g, layer, ffn_inp, hp.expert_weights_norm, il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, h_nextn=True, lora=False)


def build_ffn_dense_or_moe(g: GraphContext, layer: Layer, ffn_inp: Tensor, norm_w: bool, il: int,
                           type_op: str = LLM_FFN_SILU) -> Tensor:
    """The FFN half of deepseek2.cpp's layer, which deepseek32.cpp, kimi-linear.cpp and minimax-m3.cpp
    (with swigluoai, type_op) repeat: RMS norm, then a dense FFN on the leading layers, else the routed
    experts plus the shared ones."""
    hp = g.hparams
    cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
    g.cb(cur, "ffn_norm", il)
    if il < hp.n_layer_dense_lead:
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          type_op, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        return cur
    moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                              layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                              type_op, norm_w, hp.expert_weights_scale,
                              hp.expert_gating_func, il, gate_up_exps=layer.ffn_gate_up_exps)
    g.cb(moe_out, "ffn_moe_out", il)
    ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                            None, type_op, LLM_FFN_PAR, il)
    g.cb(ffn_shexp, "ffn_shexp", il)
    cur = ggml.add(moe_out, ffn_shexp)
    g.cb(cur, "ffn_out", il)
    return cur


def build_mla_absorbed(g: GraphContext, layer: Layer, q_nope: Tensor, q_pe: Tensor, kv_cmpr: Tensor, k_pe: Tensor,
                       il: int) -> tuple[Tensor, Tensor, Tensor]:
    """deepseek2.cpp's MLA with the absorption (deepseek32.cpp and kimi-linear.cpp repeat it): Q's no-rope
    part through wk_b beside its rope part, K the normed latent beside k_pe, V the latent itself."""
    kv_lora_rank, n_tokens = kv_cmpr.ne[0], kv_cmpr.ne[1]
    q_nope = ggml.permute(q_nope, 0, 2, 1, 3)
    g.cb(q_nope, "q_nope_perm", il)
    q_nope_absorbed = g.mul_mat_no_lora(layer.wk_b, q_nope)
    g.cb(q_nope_absorbed, "q_nope_absorbed", il)
    q_nope_absorbed = ggml.permute(q_nope_absorbed, 0, 2, 1, 3)
    g.cb(q_nope_absorbed, "q_nope_absorbed_perm", il)
    q_cur = ggml.concat(q_nope_absorbed, q_pe, 0)   # rope last: build_rope_shift works in place
    g.cb(q_cur, "Qcur", il)
    kv_cmpr = ggml.reshape(kv_cmpr, kv_lora_rank, 1, n_tokens)
    g.cb(kv_cmpr, "kv_cmpr_reshape", il)
    k_cur = ggml.concat(kv_cmpr, k_pe, 0)
    g.cb(k_cur, "Kcur", il)
    g.cb(kv_cmpr, "Vcur", il)
    return q_cur, k_cur, kv_cmpr
