"""LLM_ARCH_RWKV7 (src/models/rwkv7.cpp): RWKV-7 "Goose" 0.1B to 14B, attention-free.

rwkv6's block shape (LN0, LayerNorms with biases, two token shift rows per layer) around the
RWKV-7 time mix and channel mix of rwkv7-base.cpp; the first layer's value feeds every later
layer's value residual. llama_memory_recurrent holds the token shift rows and the wkv state.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator
from ..model_loader import ModelLoader, tn
from .rwkv6 import build_output_norm_b, build_token_shift_block, require_token_shift_count
from .rwkv7_base import (build_rwkv7_channel_mix, build_rwkv7_time_mix, load_kv_tensors, load_lora_tensors,
                         load_rwkv7_hparams)

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_rwkv7_hparams(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, ffn_size = hp.n_embd, hp.n_vocab, hp.n_ff_arr[0]
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.tok_norm = c.create_tensor(tn("TOKEN_EMBD_NORM", "weight", 0), (n_embd,))
    model.tok_norm_b = c.create_tensor(tn("TOKEN_EMBD_NORM", "bias", 0), (n_embd,))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_b = c.create_tensor(tn("ATTN_NORM", "bias", i), (n_embd,))
        layer.attn_norm_2 = c.create_tensor(tn("ATTN_NORM_2", "weight", i), (n_embd,))
        layer.attn_norm_2_b = c.create_tensor(tn("ATTN_NORM_2", "bias", i), (n_embd,))
        load_lora_tensors(c, layer, i)
        layer.time_mix_g1 = c.create_tensor(tn("TIME_MIX_G1", "weight", i), (n_embd, hp.n_lora_gate))
        layer.time_mix_g2 = c.create_tensor(tn("TIME_MIX_G2", "weight", i), (hp.n_lora_gate, n_embd))
        layer.time_mix_lerp_fused = c.create_tensor(tn("TIME_MIX_LERP_FUSED", "weight", i), (n_embd, 1, 1, 6))
        load_kv_tensors(c, layer, i)
        layer.time_mix_ln = c.create_tensor(tn("TIME_MIX_LN", "weight", i), (n_embd,))
        layer.time_mix_ln_b = c.create_tensor(tn("TIME_MIX_LN", "bias", i), (n_embd,))
        layer.time_mix_output = c.create_tensor(tn("TIME_MIX_OUTPUT", "weight", i), (n_embd, n_embd))
        layer.channel_mix_lerp_k = c.create_tensor(tn("CHANNEL_MIX_LERP_K", "weight", i), (n_embd, 1, 1))
        layer.channel_mix_key = c.create_tensor(tn("CHANNEL_MIX_KEY", "weight", i), (n_embd, ffn_size))
        layer.channel_mix_value = c.create_tensor(tn("CHANNEL_MIX_VALUE", "weight", i), (ffn_size, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_rwkv7::graph"""
    model, hp, ub = g.model, g.hparams, g.ubatch
    require_token_shift_count(g, 2)
    n_embd, n_seqs = hp.n_embd, ub.n_seqs
    n_seq_tokens = ub.n_tokens // n_seqs
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = g.build_norm(inp_l, model.tok_norm, model.tok_norm_b, LLM_NORM, 0)
    rs_inp = g.build_rs_inp()
    inp_out_ids = g.build_inp_out_ids()
    v_first = None
    for il, layer in enumerate(model.layers):
        inp_l = ggml.reshape(inp_l, n_embd, n_seq_tokens, n_seqs)

        def time_mix(att_norm, x_prev):
            nonlocal v_first
            cur, v_first = build_rwkv7_time_mix(g, rs_inp, att_norm, x_prev, v_first, il)
            return cur

        ffn_inp, ffn_norm, x_prev = build_token_shift_block(g, rs_inp, inp_l, il, time_mix)
        if il == hp.n_layer - 1:
            ffn_inp = ggml.get_rows(ffn_inp, inp_out_ids)
            ffn_norm = ggml.get_rows(ffn_norm, inp_out_ids)
            x_prev = ggml.get_rows(x_prev, inp_out_ids)
        cur = build_rwkv7_channel_mix(g, layer, ffn_norm, x_prev)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur
    build_output_norm_b(g, inp_l, LLM_NORM)
