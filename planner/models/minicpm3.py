"""LLM_ARCH_MINICPM3 (src/models/minicpm3.cpp): MiniCPM3-4B.

Multi-head latent attention run as plain MHA: Q through a LoRA pair (wq_a, norm, wq_b), K and V
decompressed per head from a normed latent (wkv_b) beside one shared roped key (k_pe) repeated over
the heads; rope over the trailing n_rot values of each head (ggml_rope_set_offset: an op
parameter, no node); a full KV cache of key_length / n_embd / heads wide heads. MiniCPM's scales are
constants in the graph: embeddings x12, residuals x1.4/sqrt(layers), the normed output x256/n_embd.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX
N_EMBD_BASE, SCALE_EMBD, SCALE_DEPTH = 256, 12.0, 1.4   # the graph's constants


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_head = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_head()
    n_embd_head_k, n_embd_head_v = hp.n_embd_head_k(), hp.n_embd_head_v()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k - n_embd_head_qk_rope
    q_lora_rank, kv_lora_rank = hp.n_lora_q, hp.n_lora_kv
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,))
        layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,))
        layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank))
        layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head * n_embd_head_k))
        layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + n_embd_head_qk_rope))
        layer.wkv_b = c.create_tensor(tn("ATTN_KV_B", "weight", i),
                                      (kv_lora_rank, n_head * (n_embd_head_qk_nope + n_embd_head_v)))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_v, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        flags = TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0)
        layer.rope_long = c.create_tensor(tn("ROPE_FACTORS_LONG", "weight", i), (n_embd_head_qk_rope // 2,), flags)
        layer.rope_short = c.create_tensor(tn("ROPE_FACTORS_SHORT", "weight", i), (n_embd_head_qk_rope // 2,), flags)


def build(g: GraphContext) -> None:
    """llama_model_minicpm3::graph"""
    model, hp = g.model, g.hparams
    n_tokens, n_head = g.ubatch.n_tokens, hp.n_head()
    n_embd_head_k, n_embd_head_v = hp.n_embd_head_k(), hp.n_embd_head_v()
    kq_scale = 1.0 / math.sqrt(n_embd_head_k)
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k - n_embd_head_qk_rope
    kv_lora_rank = hp.n_lora_kv
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = ggml.scale(inp_l, SCALE_EMBD)
    g.cb(inp_l, "inp_scaled", -1)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        q = g.mul_mat_no_lora(layer.wq_a, cur)
        g.cb(q, "q", il)
        q = g.build_norm(q, layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "q", il)
        q = g.mul_mat_no_lora(layer.wq_b, q)
        g.cb(q, "q", il)
        q = ggml.reshape(q, n_embd_head_k, n_head, n_tokens)
        g.cb(q, "q", il)

        kv_pe_compressed = g.mul_mat_no_lora(layer.wkv_a_mqa, cur)
        g.cb(kv_pe_compressed, "kv_pe_compresseed", il)
        kv_compressed = ggml.view(kv_pe_compressed, (kv_lora_rank, n_tokens), (kv_pe_compressed.nb[1],), 0)
        g.cb(kv_compressed, "kv_compressed", il)
        k_pe = ggml.view(kv_pe_compressed, (n_embd_head_qk_rope, 1, n_tokens),
                         (kv_pe_compressed.nb[1], kv_pe_compressed.nb[1]),
                         ggml.row_size(kv_pe_compressed.type, kv_lora_rank))
        g.cb(k_pe, "k_pe", il)
        kv_compressed = g.build_norm(kv_compressed, layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)
        g.cb(kv_compressed, "kv_compressed", il)
        kv = g.mul_mat_no_lora(layer.wkv_b, kv_compressed)
        g.cb(kv, "kv", il)
        row = ggml.row_size(kv.type, n_embd_head_qk_nope + n_embd_head_v)
        k_nope = ggml.view(kv, (n_embd_head_qk_nope, n_head, n_tokens), (row, row * n_head), 0)
        g.cb(k_nope, "k_nope", il)
        v_states = ggml.view(kv, (n_embd_head_v, n_head, n_tokens), (row, row * n_head),
                             ggml.row_size(kv.type, n_embd_head_qk_nope))
        g.cb(v_states, "v_states", il)
        v_states = ggml.cont(v_states)
        g.cb(v_states, "v_states", il)

        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "q_rope", il)
        k_pe = ggml.rope_ext(k_pe, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(k_pe, "k_pe", il)
        g.cb(q, "q_states", il)
        k_states = ggml.concat(k_nope, ggml.repeat_4d(k_pe, n_embd_head_qk_rope, n_head, n_tokens, 1), 0)
        g.cb(k_states, "k_states", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k_states, v_states, kq_scale, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        scale_res = SCALE_DEPTH / math.sqrt(hp.n_layer)
        cur = ggml.scale(cur, scale_res)
        g.cb(cur, "hidden_scaled", il)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.scale(cur, scale_res)
        g.cb(cur, "hidden_scaled_ffn", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = ggml.scale(cur, N_EMBD_BASE / hp.n_embd)
    g.cb(cur, "lmhead_scaling", -1)
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
