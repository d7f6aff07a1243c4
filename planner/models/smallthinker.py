"""LLM_ARCH_SMALLTHINKER (src/models/smallthinker.cpp): SmallThinker-4B-A0.6B, SmallThinker-21B-A3B.

With a sliding window in the header: windows of 4096 (whatever the header says) on three layers
in four, the first of each four global and without rope (llama_kv_cache_iswa); else one KV cache
and rope everywhere. The router reads the layer's input before attn_norm; the experts (ReLU,
gating from the header, normalised weights) take those logits, no shared expert.
"""
from __future__ import annotations

import math

from .. import ggml
from ..gguf import UINT32
from ..graph import LLM_FFN_RELU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, LLAMA_SWA_TYPE_NONE, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern, require, require_gating_func, require_head_sizes_equal
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    found_swa = ml.found("%s.attention.sliding_window", UINT32)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window", 0)
    if found_swa and hp.n_swa > 0:
        hp.swa_type = LLAMA_SWA_TYPE_STANDARD
        hp.n_swa = 4096
        load_swa_pattern(ml, hp, 4, dense_first=True)
        hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    else:
        hp.swa_type = LLAMA_SWA_TYPE_NONE
        hp.n_no_rope_layer_step = hp.n_layer
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all, 0)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0)
    require_gating_func(ml, hp)   # build_moe_ffn aborts on NONE, the value where the key is absent
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        n_q = hp.n_embd_head_k(i) * hp.n_head(i)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_v_gqa(i), hp.n_embd_v_gqa(i))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        require(c.ml, n_expert > 0, "n_expert must be > 0 for SMALLTHINKER")
        require(c.ml, hp.n_expert_used() > 0, "n_expert_used must be > 0 for SMALLTHINKER")
        n_ff_exp = hp.n_ff_exp()
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))


def build(g: GraphContext) -> None:
    """llama_model_smallthinker::graph<iswa>"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa() if hp.swa_type == LLAMA_SWA_TYPE_STANDARD else g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        use_rope = hp.n_no_rope_layer_step == hp.n_layer or il % hp.n_no_rope_layer_step != 0
        probs = g.build_lora_mm(layer.ffn_gate_inp, inp_l)   # the router reads the un-normed input
        g.cb(probs, "ffn_moe_logits", il)
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
        if use_rope:
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
            probs = ggml.get_rows(probs, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_moe_ffn(cur, None, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps, None,
                              hp.n_expert, hp.n_expert_used(), LLM_FFN_RELU, True, hp.expert_weights_scale,
                              hp.expert_gating_func, il, probs_in=probs)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
