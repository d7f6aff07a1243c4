"""LLM_ARCH_COGVLM (src/models/cogvlm.cpp): CogVLM (cogvlm-chat-hf), CogVLM2 (text).

Every layer holds the language weights and beside them the vision expert's (vis_attn_qkv,
vis_attn_output, vis_gate/up/down), picked per ubatch: a ubatch of tokens runs the language ones,
one of image embeddings the expert's. The ubatches llama.cpp reserves carry tokens
(llama_batch_allocr::ubatch_reserve), as a text decode does, so the plan's graphs use the language
weights; the expert's are loaded (and placed) all the same. The block: a fused QKV without bias
(views of n_embd each), NORM rope over the head without factors (ggml_rope; optional per-layer
rope_freqs are loaded, unused), a SwiGLU FFN; no output-row selection on the last layer.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_cogvlm::load_arch_hparams"""
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # the graph asserts n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_cogvlm::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab, n_ff = hp.n_embd, hp.n_vocab, hp.n_ff()
    n_q = hp.n_embd_head_k() * hp.n_head()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_q * 3))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
        layer.visexp_attn_wqkv = c.create_tensor(tn("VISEXP_ATTN_QKV", "weight", i), (n_embd, n_q * 3))
        layer.visexp_attn_wo = c.create_tensor(tn("VISEXP_ATTN_OUT", "weight", i), (n_q, n_embd))
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (hp.n_rot() // 2,),
                                           TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.visexp_ffn_gate = c.create_tensor(tn("VISEXP_FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.visexp_ffn_down = c.create_tensor(tn("VISEXP_FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.visexp_ffn_up = c.create_tensor(tn("VISEXP_FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_cogvlm::graph for a ubatch of tokens (is_text: the language weights)"""
    model, hp = g.model, g.hparams
    n_tokens, n_embd = g.ubatch.n_tokens, hp.n_embd
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_sa, layer.attn_norm, None, LLM_NORM_RMS, il)

        qkv = g.build_lora_mm(layer.wqkv, cur)
        row = n_embd_head * 4   # n_embd_head * sizeof(float)
        es = ggml.type_size(qkv.type)
        q = ggml.view(qkv, (n_embd_head, hp.n_head(), n_tokens), (row, qkv.nb[1]), 0)
        k = ggml.view(qkv, (n_embd_head, hp.n_head_kv(), n_tokens), (row, qkv.nb[1]), n_embd * es)
        v = ggml.view(qkv, (n_embd_head, hp.n_head_kv(), n_tokens), (row, qkv.nb[1]), 2 * n_embd * es)
        q = ggml.rope_ext(q, inp_pos, None, n_embd_head, hp.rope_type, 0)   # ggml_rope
        k = ggml.rope_ext(k, inp_pos, None, n_embd_head, hp.rope_type, 0)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        g.cb(cur, "attn_out", il)

        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                          LLM_FFN_PAR, il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
