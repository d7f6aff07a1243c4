"""LLM_ARCH_PLM (src/models/plm.cpp): PLM-1.8B (PLM-Team).

Multi-head latent attention run as plain MHA, as MiniCPM3 does but with a plain Q projection: K
and V decompressed per head from a normed latent (wkv_b) beside one shared roped key (k_pe)
repeated over the heads; rope over the trailing n_rot values of each head (ggml_rope_set_offset:
an op parameter, no node); a full KV cache of key_length-wide K heads. An ungated squared-ReLU
FFN; the output is always tied to the token embedding.

Under flash attention llama.cpp aborts for any batch of more than one token: the flat V
[n_embd_head_v * n_head, n_tokens] reaches cpy_v, whose ggml_set_rows asserts (tests/test_cli.py);
the plan says so in one line (ggml.set_rows raises the same GGMLAbort in the cache copy).
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_RELU_SQR, LLM_FFN_SEQ, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_plm::load_arch_hparams"""
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_plm::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_head = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_head()
    n_embd_head_k, n_embd_head_v = hp.n_embd_head_k(), hp.n_embd_head_v()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k - n_embd_head_qk_rope
    kv_lora_rank = hp.n_lora_kv
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd, n_embd_head_k * n_head))
        layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + n_embd_head_qk_rope))
        layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,))
        layer.wkv_b = c.create_tensor(tn("ATTN_KV_B", "weight", i),
                                      (kv_lora_rank, n_head * (n_embd_head_qk_nope + n_embd_head_v)))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_v, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_plm::graph"""
    model, hp = g.model, g.hparams
    n_tokens, n_head = g.ubatch.n_tokens, hp.n_head()
    n_embd_head_k, n_embd_head_v = hp.n_embd_head_k(), hp.n_embd_head_v()
    kq_scale = 1.0 / math.sqrt(n_embd_head_k)
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k - n_embd_head_qk_rope
    kv_lora_rank = hp.n_lora_kv
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        q = g.mul_mat_no_lora(layer.wq, cur)
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
        v_states = ggml.view(v_states, (n_embd_head_v * n_head, n_tokens),
                             (ggml.row_size(kv.type, n_embd_head_v * n_head),), 0)
        g.cb(v_states, "v_states", il)

        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "q_rope", il)
        k_pe = ggml.rope_ext(k_pe, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(k_pe, "k_pe", il)
        g.cb(q, "q_states", il)
        k_states = ggml.concat(k_nope, ggml.repeat_4d(k_pe, n_embd_head_qk_rope, n_head, n_tokens, 1), 0)
        g.cb(k_states, "k_states", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k_states, v_states, kq_scale, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, None, None, layer.ffn_down, None, LLM_FFN_RELU_SQR, LLM_FFN_SEQ, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
