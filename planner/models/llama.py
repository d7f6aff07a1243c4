"""The llama architecture graph: llama_model_llama::graph<false> (src/models/llama.cpp).

Llama 2/3/3.1, Mistral, TinyLlama, SmolLM2: dense FFN, KV cache, optional rope_freqs.
"""
from __future__ import annotations

from schedplan.planner import ggml
from schedplan.planner.graph import GraphContext, kq_scale_for

LLAMA_ROPE_TYPE_NORM = 0


def build(g: GraphContext) -> None:
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    kq_scale = kq_scale_for(hp, n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    for il in range(hp.n_layer):
        layer = model.layers[il]
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, il)
        g.cb(cur, "attn_norm", il)

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head[il], hp.n_head_kv[il], il)
        q = ggml.rope_ext(q, inp_pos, layer.rope_freqs, hp.n_rot, LLAMA_ROPE_TYPE_NORM, g.cparams.n_ctx)
        k = ggml.rope_ext(k, inp_pos, layer.rope_freqs, hp.n_rot, LLAMA_ROPE_TYPE_NORM, g.cparams.n_ctx)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.wo_b, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn_silu_par(layer, cur, il)
        g.cb(cur, "ffn_out", il)

        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        g.cb(cur, "l_out", il)   # build_cvec returns cur without control vectors
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
