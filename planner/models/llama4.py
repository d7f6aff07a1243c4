"""LLM_ARCH_LLAMA4 (src/models/llama4.cpp): Llama 4 Scout 17B-16E, Maverick 17B-128E.

Chunked attention (chunks of 8192) on three layers in four, in a sliding-window cache beside the
base one (llama_kv_cache_iswa); the fourth layer has no rope and scales Q by the per-token
temperature (inp_attn_scale). Rope layers L2-normalise Q and K (not Maverick). Experts every
interleave_moe_layer_step layers, sigmoid-routed with the weight applied to the FFN's input, plus
a shared expert; dense FFN layers between them.
"""
from __future__ import annotations

from .. import ggml
from ..ggml import GGMLAbort
from ..gguf import UINT32
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext, kq_scale_for
from ..hparams import LLAMA_ROPE_TYPE_NORM, LLAMA_SWA_TYPE_CHUNKED, LLAMA_SWA_TYPE_NONE, HParams
from ..model import Model, TensorCreator, load_swa_pattern, require_head_sizes_equal
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM
LLM_TYPE_17B_128E_EXPERTS = 128   # Maverick: no QK norm


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer)
    hp.n_moe_layer_step = ml.get_u32("%s.interleave_moe_layer_step")
    found_swa = ml.found("%s.attention.sliding_window", UINT32)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window", 0)
    if found_swa and hp.n_swa == 0:
        hp.swa_type = LLAMA_SWA_TYPE_NONE
        hp.n_no_rope_layer_step = hp.n_layer   # "always use rope": the graph still skips it on the last layer
    else:
        hp.swa_type = LLAMA_SWA_TYPE_CHUNKED
        hp.n_swa = 8192   # whatever the header says: the attention chunk size
        hp.f_attn_temp_scale = 0.1
        load_swa_pattern(ml, hp, 4)   # 3 chunked, 1 full
        hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    hp.use_kq_norm = hp.n_expert != LLM_TYPE_17B_128E_EXPERTS
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff()
    n_q = hp.n_embd_head_k() * hp.n_head()
    if n_expert == 0:
        c.ml.fail(f"{c.ml.arch} model cannot have zero experts")
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        is_moe_layer = hp.n_moe_layer_step > 0 and (i + 1) % hp.n_moe_layer_step == 0
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (hp.n_rot() // 2,),
                                           TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0))
        if is_moe_layer:
            n_ff_exp = hp.n_ff_exp()
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_exp))
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_exp, n_embd))
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_exp))
        else:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_llama4::graph<iswa>: iswa unless the header turns the chunked layers off."""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn_scale = g.build_inp_attn_scale()   # temperature tuning
    inp_attn = g.build_attn_inp_kv() if hp.swa_type == LLAMA_SWA_TYPE_NONE else g.build_attn_inp_kv_iswa()
    kq_scale = kq_scale_for(hp, n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    # llm_graph_input_attn_temp::set_input fills inp_attn_scale at every decode (reserving never does)
    if all(use_rope(hp, il) for il in range(hp.n_layer)):
        raise GGMLAbort("llama.cpp would abort at the first decode (ggml-backend.cpp GGML_ASSERT: tensor buffer "
                        f"not set): each of the {hp.n_layer} layers has rope (only every {hp.n_no_rope_layer_step}th "
                        "has none), so the attention temperature input inp_attn_scale is in no graph")
    if hp.f_attn_temp_scale == 0.0:
        raise GGMLAbort("llama.cpp would abort at the first decode (llama-graph.cpp GGML_ASSERT(f_attn_temp_scale != "
                        f"0.0f)): {hp.arch}.attention.sliding_window is 0, which leaves the attention temperature "
                        f"unset while layer {hp.n_layer - 1} still goes without rope")

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        if use_rope(hp, il):
            q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        else:
            q = ggml.mul(q, inp_attn_scale)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        if use_rope(hp, il) and hp.use_kq_norm:   # Llama4TextL2Norm
            q = ggml.rms_norm(q, hp.f_norm_rms_eps)
            k = ggml.rms_norm(k, hp.f_norm_rms_eps)
            g.cb(q, "Qcur_normed", il)
            g.cb(k, "Kcur_normed", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        if layer.ffn_gate_inp is None:
            cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "ffn_norm", il)
            cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b, layer.ffn_down,
                              layer.ffn_down_b, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            ffn_inp_normed = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "ffn_norm", il)   # sic: names the attention output, as llama4.cpp does
            moe_out = g.build_moe_ffn(ffn_inp_normed, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, False,
                                      hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, il)
            shexp_out = g.build_ffn(ffn_inp_normed, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None,
                                    layer.ffn_down_shexp, None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(shexp_out, "ffn_moe_shexp", il)
            cur = ggml.add(moe_out, shexp_out)
            g.cb(cur, "ffn_moe_out_merged", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)


def use_rope(hp: HParams, il: int) -> bool:
    """Every n_no_rope_layer_step-th layer has no rope (this overlaps with the chunked layers)."""
    return hp.n_no_rope_layer_step > 0 and (il + 1) % hp.n_no_rope_layer_step != 0
