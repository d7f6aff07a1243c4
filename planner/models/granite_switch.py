"""LLM_ARCH_GRANITE_SWITCH (src/models/granite-switch.cpp): Granite Switch (Granite 4.1 with embedded,
token-activated LoRA adapters).

Granite's dense block with a fused attn_qkv, each projection plus a per-token LoRA delta from the
adapter slot (mul_mat_id over the slots' A and B). The slot comes from an in-graph router: an extra
single-head attention layer past the trunk (n_layer_nextn repurposed: it is in the KV cache, never
roped) attends over signals of the adapter-activating tokens; its first channel, clamped and
rounded, is the slot. The tokens are embedded through their substitutes.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_NORM_RMS, GraphContext, kq_scale_for
from ..hparams import LLAMA_MAX_LAYERS, LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM
MAX_ADAPTERS = MAX_LORA_RANK = 4096   # load_arch_hparams' bounds on the counts that size tensors


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_logit_scale = ml.get_f32("%s.logit_scale")
    hp.f_residual_scale = ml.get_f32("%s.residual_scale", 0.0)
    hp.f_embedding_scale = ml.get_f32("%s.embedding_scale", 0.0)
    hp.f_attention_scale = ml.get_f32("%s.attention.scale", 0.0)
    rope_finetuned = ml.get_bool("%s.rope.scaling.finetuned", True)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.n_adapters = ml.get_u32("%s.adapters.count")
    hp.max_lora_rank = ml.get_u32("%s.adapters.lora_rank")
    if hp.n_adapters > MAX_ADAPTERS:
        ml.fail(f"graniteswitch: invalid adapter count {hp.n_adapters}")
    if hp.max_lora_rank > MAX_LORA_RANK:
        ml.fail(f"graniteswitch: invalid lora rank {hp.max_lora_rank}")
    token_ids = ml.get_arr_i32("%s.adapters.token_ids_activate")
    substitute_ids = ml.get_arr_i32("%s.adapters.token_ids_substitute")
    if len(token_ids) != hp.n_adapters or len(substitute_ids) != hp.n_adapters:
        ml.fail(f"graniteswitch: adapter token id arrays ({len(token_ids)} activate, {len(substitute_ids)} "
                f"substitute) do not match adapter count {hp.n_adapters}")
    # adapter_token_to_substitute: a map, so a repeated activating token keeps its last substitute
    hp.adapter_substitutes = tuple(dict(zip(token_ids, substitute_ids)).values())
    # the router's K/V lives in an extra single-head layer past the trunk (index n_real)
    n_real = hp.n_layer
    if n_real >= LLAMA_MAX_LAYERS:
        ml.fail(f"graniteswitch: block count {n_real} exceeds LLAMA_MAX_LAYERS")
    hp.router_layer = n_real
    hp.n_layer_all, hp.n_layer_nextn = n_real + 1, 1
    hp.n_head_arr = hp.n_head_arr[:n_real] + (1,)
    hp.n_head_kv_arr = hp.n_head_kv_arr[:n_real] + (1,)
    hp.n_ff_arr = hp.n_ff_arr[:n_real] + (0,)
    hp.n_expert_used_arr = hp.n_expert_used_arr[:n_real] + (0,)
    hp.is_swa_arr = hp.is_swa_arr[:n_real] + (False,)
    hp.rope_pattern = (rope_finetuned,) * hp.n_layer_all
    # the graph asserts n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff = hp.n_embd, hp.n_vocab, hp.n_ff()
    n_slots, n_rank = hp.n_adapters + 1, hp.max_lora_rank    # slot 0: the base (a zero delta)
    n_embd_q, n_embd_kv = hp.n_embd_head_k() * hp.n_head(), hp.n_embd_k_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    for sub in hp.adapter_substitutes:   # they index token_embd's rows
        if not 0 <= sub < n_vocab:
            c.ml.fail(f"graniteswitch: substitute token id {sub} out of range [0, {n_vocab})")
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_embd_q + 2 * n_embd_kv))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        sl = layer.switch_lora
        for name, tensor, n_in, n_out in (("q", "ATTN_Q", n_embd, n_embd_q), ("k", "ATTN_K", n_embd, n_embd_kv),
                                          ("v", "ATTN_V", n_embd, n_embd_kv), ("o", "ATTN_OUT", n_embd_q, n_embd),
                                          ("gate", "FFN_GATE", n_embd, n_ff), ("up", "FFN_UP", n_embd, n_ff),
                                          ("down", "FFN_DOWN", n_ff, n_embd)):
            setattr(sl, f"a_{name}", c.create_tensor(tn(tensor, "lora_a", i), (n_in, n_rank, n_slots)))
            setattr(sl, f"b_{name}", c.create_tensor(tn(tensor, "lora_b", i), (n_rank, n_out, n_slots)))


def build(g: GraphContext) -> None:
    """llama_model_granite_switch::graph (token input, as llama.cpp asserts)"""
    model, hp = g.model, g.hparams
    n_embd_head, n_tokens = hp.n_embd_head_v(), g.ubatch.n_tokens
    # llm_graph_input_switch: substituted token ids and the router's Q, K and V signals, unnamed
    sub_tokens = ggml.new_tensor(ggml.T.I32, n_tokens)
    router_ksig = ggml.new_tensor(ggml.T.F32, n_tokens)
    router_vval = ggml.new_tensor(ggml.T.F32, n_tokens)
    router_q = ggml.new_tensor(ggml.T.F32, n_tokens)
    for t in (sub_tokens, router_ksig, router_vval, router_q):
        t.set_input()

    inp_l = ggml.get_rows(model.tok_embd, sub_tokens)
    if hp.f_embedding_scale != 0.0:
        inp_l = ggml.scale(inp_l, hp.f_embedding_scale)
    g.cb(inp_l, "inp_embd", -1)
    inp_pos = g.build_inp_pos() if hp.has_rope(0) else None
    inp_attn = g.build_attn_inp_kv()

    # a single causal head at the router layer: only channel 0 carries signal, the rest is padding
    R = hp.router_layer

    def router_lane(sig):
        return ggml.pad(ggml.reshape(sig, 1, 1, n_tokens), n_embd_head - 1, 0, 0, 0)
    q_r = router_lane(router_q)
    k_r = router_lane(router_ksig)
    v_r = router_lane(router_vval)
    router_out = g.build_attn(inp_attn, None, None, q_r, k_r, v_r, 1.0, R)
    g.cb(router_out, "router_out", R)
    # channel 0 of each token's output is its adapter slot: clamped, rounded, an I32 index
    slot_f = ggml.cont(ggml.view(router_out, (1, n_tokens), (router_out.nb[1],), 0))
    slot_f = ggml.reshape(slot_f, n_tokens)
    slot_f = ggml.clamp(slot_f, 0.0, float(hp.n_adapters))
    slot_f = ggml.unary(slot_f, "ROUND")
    adapter_ids = ggml.cast(slot_f, ggml.T.I32)
    g.cb(adapter_ids, "adapter_ids", -1)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        cur = build_attention_layer(g, cur, inp_pos, adapter_ids, inp_attn, n_embd_head, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
            # keep adapter_ids aligned with the kept rows (a 2-D round trip for get_rows)
            n_out = inp_out_ids.ne[0]
            adapter_ids = ggml.get_rows(ggml.reshape(adapter_ids, 1, adapter_ids.ne[0]), inp_out_ids)
            adapter_ids = ggml.reshape(adapter_ids, n_out)
        inp_l = build_layer_ffn(g, cur, inp_sa, adapter_ids, il)

    g.build_output(inp_l, logit_scale=hp.f_logit_scale)


def build_switched_lora_delta(lora_a, lora_b, cur, ids):
    """B_a * (A_a * x) with the adapter a chosen per token: {n_in, n_tokens} -> {n_out, n_tokens}"""
    n_in, n_tokens = cur.ne[0], cur.ne[1]
    x = ggml.reshape(cur, n_in, 1, n_tokens)
    ids2 = ggml.reshape(ids, 1, n_tokens)
    a = ggml.mul_mat_id(lora_a, x, ids2)
    d = ggml.mul_mat_id(lora_b, a, ids2)
    return ggml.reshape(d, d.ne[0], n_tokens)


def build_switched_lora_mm(g: GraphContext, w, lora_a, lora_b, cur, ids):
    base = g.mul_mat_no_lora(w, cur)
    return ggml.add(base, build_switched_lora_delta(lora_a, lora_b, cur, ids))


def build_attention_layer(g: GraphContext, cur, inp_pos, adapter_ids, inp_attn, n_embd_head: int, il: int):
    """llama_model_granite_switch::graph::build_attention_layer: the fused QKV sliced into
    contiguous Q, K, V, each plus its switched delta; the output projection switched after the
    attention (build_attn without wo)."""
    hp, layer = g.hparams, g.model.layers[il]
    sl, n_tokens = layer.switch_lora, g.ubatch.n_tokens
    n_head, n_head_kv = hp.n_head(il), hp.n_head_kv(il)
    qkv = g.mul_mat_no_lora(layer.wqkv, cur)
    g.cb(qkv, "wqkv", il)
    n_embd_q, n_embd_kv = n_embd_head * n_head, n_embd_head * n_head_kv
    esize = ggml.type_size(qkv.type)
    q = ggml.cont(ggml.view(qkv, (n_embd_q, qkv.ne[1]), (qkv.nb[1],), 0))
    k = ggml.cont(ggml.view(qkv, (n_embd_kv, qkv.ne[1]), (qkv.nb[1],), n_embd_q * esize))
    v = ggml.cont(ggml.view(qkv, (n_embd_kv, qkv.ne[1]), (qkv.nb[1],), (n_embd_q + n_embd_kv) * esize))
    q = ggml.add(q, build_switched_lora_delta(sl.a_q, sl.b_q, cur, adapter_ids))
    k = ggml.add(k, build_switched_lora_delta(sl.a_k, sl.b_k, cur, adapter_ids))
    v = ggml.add(v, build_switched_lora_delta(sl.a_v, sl.b_v, cur, adapter_ids))
    q = ggml.reshape(q, n_embd_head, n_head, n_tokens)
    k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
    v = ggml.reshape(v, n_embd_head, n_head_kv, n_tokens)
    if hp.has_rope(il):
        rope_factors = g.model.get_rope_factors(g.cparams.n_ctx_seq, il)   # none loaded: null
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q, "Qcur", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    attn = g.build_attn(inp_attn, None, None, q, k, v, kq_scale_for(hp, n_embd_head), il)
    g.cb(attn, "attn_pre_o", il)
    cur = build_switched_lora_mm(g, layer.wo, sl.a_o, sl.b_o, attn, adapter_ids)
    g.cb(cur, "attn_out", il)
    return cur


def build_layer_ffn(g: GraphContext, cur, inp_sa, adapter_ids, il: int):
    """llama_model_granite_switch::graph::build_layer_ffn: a SwiGLU FFN of switched projections."""
    hp, layer = g.hparams, g.model.layers[il]
    sl = layer.switch_lora
    if hp.f_residual_scale:
        cur = ggml.scale(cur, hp.f_residual_scale)
    ffn_inp = ggml.add(cur, inp_sa)
    g.cb(ffn_inp, "ffn_inp", il)
    cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
    g.cb(cur, "ffn_norm", il)
    gate = build_switched_lora_mm(g, layer.ffn_gate, sl.a_gate, sl.b_gate, cur, adapter_ids)
    up = build_switched_lora_mm(g, layer.ffn_up, sl.a_up, sl.b_up, cur, adapter_ids)
    gate = ggml.unary(gate, "SILU")
    gu = ggml.mul(gate, up)
    cur = build_switched_lora_mm(g, layer.ffn_down, sl.a_down, sl.b_down, gu, adapter_ids)
    g.cb(cur, "ffn_out", il)
    if hp.f_residual_scale:
        cur = ggml.scale(cur, hp.f_residual_scale)
    cur = ggml.add(cur, ffn_inp)
    cur = g.build_cvec(cur, il)
    g.cb(cur, "l_out", il)
    return cur
