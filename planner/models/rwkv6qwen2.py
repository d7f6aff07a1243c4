"""LLM_ARCH_RWKV6QWEN2 (src/models/rwkv6qwen2.cpp): QRWKV6 (Qwen2.5 distilled into RWKV-6 time mixing),
attention-free.

RWKV-6 time mix (rwkv6-base.cpp; without time_mix_first, the QRWKV form: GATED_LINEAR_ATTN, a
sigmoid gate, K/V of head_count_kv heads repeated to the wkv heads) and Qwen2's RMS norms and SwiGLU
FFN; one token shift row (the time mix's) and a wkv state per sequence in llama_memory_recurrent.
"""
from __future__ import annotations

from .. import ggml
from ..ggml import GGMLAbort
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .rwkv6 import build_output_norm_b
from .rwkv6_base import build_rwkv6_time_mix, load_rwkv6_hparams

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_rwkv6_hparams(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_head_kv = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_head_kv()
    extra, decay_extra, head_size = hp.time_mix_extra_dim, hp.time_decay_extra_dim, hp.wkv_head_size
    n_embd_kv = n_embd if n_head_kv == 0 or n_embd // head_size == n_head_kv else n_head_kv * head_size
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,), TENSOR_NOT_REQUIRED)
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.time_mix_w1 = c.create_tensor(tn("TIME_MIX_W1", "weight", i), (n_embd, extra * 5))
        layer.time_mix_w2 = c.create_tensor(tn("TIME_MIX_W2", "weight", i), (extra, n_embd, 5))
        layer.time_mix_lerp_x = c.create_tensor(tn("TIME_MIX_LERP_X", "weight", i), (n_embd, 1, 1))
        layer.time_mix_lerp_fused = c.create_tensor(tn("TIME_MIX_LERP_FUSED", "weight", i), (n_embd, 1, 1, 5))
        layer.time_mix_first = c.create_tensor(tn("TIME_MIX_FIRST", "weight", i), (head_size, n_embd // head_size),
                                               TENSOR_NOT_REQUIRED)
        layer.time_mix_decay = c.create_tensor(tn("TIME_MIX_DECAY", "weight", i), (n_embd,))
        layer.time_mix_decay_w1 = c.create_tensor(tn("TIME_MIX_DECAY_W1", "weight", i), (n_embd, decay_extra))
        layer.time_mix_decay_w2 = c.create_tensor(tn("TIME_MIX_DECAY_W2", "weight", i), (decay_extra, n_embd))
        layer.time_mix_key = c.create_tensor(tn("TIME_MIX_KEY", "weight", i), (n_embd, n_embd_kv))
        layer.time_mix_value = c.create_tensor(tn("TIME_MIX_VALUE", "weight", i), (n_embd, n_embd_kv))
        layer.time_mix_receptance = c.create_tensor(tn("TIME_MIX_RECEPTANCE", "weight", i), (n_embd, n_embd))
        layer.time_mix_gate = c.create_tensor(tn("TIME_MIX_GATE", "weight", i), (n_embd, n_embd))
        layer.time_mix_key_b = c.create_tensor(tn("TIME_MIX_KEY", "bias", i), (n_embd_kv,), TENSOR_NOT_REQUIRED)
        layer.time_mix_value_b = c.create_tensor(tn("TIME_MIX_VALUE", "bias", i), (n_embd_kv,), TENSOR_NOT_REQUIRED)
        layer.time_mix_receptance_b = c.create_tensor(tn("TIME_MIX_RECEPTANCE", "bias", i), (n_embd,),
                                                      TENSOR_NOT_REQUIRED)
        layer.time_mix_output = c.create_tensor(tn("TIME_MIX_OUTPUT", "weight", i), (n_embd, n_embd))
        load_ffn_tensors(c, layer, i)
        if layer.time_mix_first is not None:   # rwkv6-base.cpp's RWKV_WKV6 branch then norms with time_mix_ln
            c.ml.fail(f"blk.{i}.time_mix_first.weight: llama.cpp loads it, then its {hp.arch} graph multiplies by "
                      "time_mix_ln, which this architecture never loads (a null tensor: a crash)")


def load_ffn_tensors(c: TensorCreator, layer, i: int) -> None:
    """The Qwen-based RWKV models' SwiGLU FFN (rwkv6qwen2, arwkv7)."""
    n_embd, n_ff = c.hparams.n_embd, c.hparams.n_ff()
    layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
    layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
    layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
    layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_rwkv6qwen2::graph"""
    build_qwen_rwkv(g, lambda rs_inp, att_norm, x_prev, il: build_rwkv6_time_mix(g, rs_inp, att_norm, x_prev, il))


def build_qwen_rwkv(g: GraphContext, time_mix) -> None:
    """The graph rwkv6qwen2.cpp and arwkv7.cpp share: RMS-normed RWKV time mix over one token shift
    row, then Qwen2's RMS-normed SwiGLU FFN. time_mix(rs_inp, att_norm, x_prev, il)."""
    model, hp, ub = g.model, g.hparams, g.ubatch
    n_embd, n_seqs, n_tokens = hp.n_embd, ub.n_seqs, ub.n_tokens
    n_seq_tokens = n_tokens // n_seqs
    if hp.n_embd_r() != n_embd:
        raise GGMLAbort(f"llama.cpp would abort building the {hp.arch} graph (GGML_ASSERT(n_embd == "
                        f"hparams.n_embd_r())): token_shift_count is {hp.token_shift_count}, the graph needs 1")
    inp_l = g.build_inp_embd(model.tok_embd)
    rs_inp = g.build_rs_inp()
    inp_out_ids = g.build_inp_out_ids()
    for il, layer in enumerate(model.layers):
        inp_l = ggml.reshape(inp_l, n_embd, n_seq_tokens, n_seqs)
        token_shift = g.build_rwkv_token_shift_load(rs_inp, il)
        att_norm = g.build_norm(inp_l, layer.attn_norm, layer.attn_norm_b, LLM_NORM_RMS, il)
        g.cb(att_norm, "attn_norm", il)
        x_prev = ggml.concat(token_shift, ggml.view(att_norm, (n_embd, n_seq_tokens - 1, n_seqs),
                                                    (att_norm.nb[1], att_norm.nb[2]), 0), 1)
        cur = time_mix(rs_inp, att_norm, x_prev, il)
        token_shift = ggml.view(att_norm, (n_embd, 1, n_seqs), (att_norm.nb[1], att_norm.nb[2]),
                                (n_seq_tokens - 1) * n_embd * ggml.type_size(att_norm.type))
        ggml.build_forward_expand(g.gf, g.build_rwkv_token_shift_store(token_shift, il))
        ffn_inp = ggml.add(cur, inp_l)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = ggml.reshape(cur, n_embd, n_tokens)
        ffn_inp = ggml.reshape(ffn_inp, n_embd, n_tokens)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            ffn_inp = ggml.get_rows(ffn_inp, inp_out_ids)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur
    build_output_norm_b(g, inp_l, LLM_NORM_RMS)
