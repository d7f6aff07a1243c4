"""LLM_ARCH_WAVTOKENIZER_DEC (src/models/wavtokenizer-dec.cpp): WavTokenizer's decoder (OuteTTS).

Not a transformer: audio codes are embedded (n_embd = features_length), a 1-D convolution lifts
them to the posnet width, the posnet runs resnet blocks (group norm, swish, convolutions), one
single-head attention block made of 1-wide convolutions and a final group norm, then ConvNeXt
blocks (depthwise convolution, LayerNorm, GELU FFN, gamma), an output LayerNorm and a biased head
of embedding_length values per token (the spectrogram frame, t_embd; no logits). It keeps no
memory (llama_model::create_memory returns nullptr) and its attention is non-causal.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_GELU, LLM_FFN_SEQ, LLM_NORM, LLM_NORM_GROUP, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    hp.f_norm_group_eps = ml.get_f32("%s.attention.group_norm_epsilon")
    hp.n_norm_groups = ml.get_u32("%s.attention.group_norm_groups")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (hp.n_embd, hp.n_vocab))
    model.conv1d = c.create_tensor(tn("CONV1D", "weight", 0), (7, hp.n_embd, hp.posnet_n_embd))
    model.conv1d_b = c.create_tensor(tn("CONV1D", "bias", 0), (1, hp.posnet_n_embd))

    n_embd = hp.posnet_n_embd
    for i in range(hp.posnet_n_layer):
        layer = model.layers[i].posnet
        # resnet, resnet, attention, resnet, resnet, norm
        if i in (0, 1, 3, 4):
            layer.norm1 = c.create_tensor(tn("POS_NET_NORM1", "weight", i), (1, n_embd))
            layer.norm1_b = c.create_tensor(tn("POS_NET_NORM1", "bias", i), (1, n_embd))
            layer.conv1 = c.create_tensor(tn("POS_NET_CONV1", "weight", i), (3, n_embd, n_embd))
            layer.conv1_b = c.create_tensor(tn("POS_NET_CONV1", "bias", i), (1, n_embd))
            layer.norm2 = c.create_tensor(tn("POS_NET_NORM2", "weight", i), (1, n_embd))
            layer.norm2_b = c.create_tensor(tn("POS_NET_NORM2", "bias", i), (1, n_embd))
            layer.conv2 = c.create_tensor(tn("POS_NET_CONV2", "weight", i), (3, n_embd, n_embd))
            layer.conv2_b = c.create_tensor(tn("POS_NET_CONV2", "bias", i), (1, n_embd))
        elif i == 2:
            layer.attn_norm = c.create_tensor(tn("POS_NET_ATTN_NORM", "weight", i), (1, n_embd))
            layer.attn_norm_b = c.create_tensor(tn("POS_NET_ATTN_NORM", "bias", i), (1, n_embd))
            layer.attn_q = c.create_tensor(tn("POS_NET_ATTN_Q", "weight", i), (1, n_embd, n_embd))
            layer.attn_q_b = c.create_tensor(tn("POS_NET_ATTN_Q", "bias", i), (1, n_embd))
            layer.attn_k = c.create_tensor(tn("POS_NET_ATTN_K", "weight", i), (1, n_embd, n_embd))
            layer.attn_k_b = c.create_tensor(tn("POS_NET_ATTN_K", "bias", i), (1, n_embd))
            layer.attn_v = c.create_tensor(tn("POS_NET_ATTN_V", "weight", i), (1, n_embd, n_embd))
            layer.attn_v_b = c.create_tensor(tn("POS_NET_ATTN_V", "bias", i), (1, n_embd))
            layer.attn_o = c.create_tensor(tn("POS_NET_ATTN_OUT", "weight", i), (1, n_embd, n_embd))
            layer.attn_o_b = c.create_tensor(tn("POS_NET_ATTN_OUT", "bias", i), (1, n_embd))
        elif i == 5:
            layer.norm = c.create_tensor(tn("POS_NET_ATTN_NORM", "weight", i), (1, n_embd))
            layer.norm_b = c.create_tensor(tn("POS_NET_ATTN_NORM", "bias", i), (1, n_embd))
        else:
            require(c.ml, False, f"unknown posnet layer {i} (GGML_ABORT: a posnet has at most 6 blocks)")

    require(c.ml, hp.posnet_n_embd == hp.convnext_n_embd,
            f"the posnet width ({hp.posnet_n_embd}) must equal the convnext width ({hp.convnext_n_embd})")
    model.tok_norm = c.create_tensor(tn("TOKEN_EMBD_NORM", "weight", 0), (hp.posnet_n_embd,))
    model.tok_norm_b = c.create_tensor(tn("TOKEN_EMBD_NORM", "bias", 0), (hp.posnet_n_embd,))

    n_embd, n_ff = hp.convnext_n_embd, hp.n_ff()
    for i in range(hp.convnext_n_layer):
        layer = model.layers[i].convnext
        layer.dw = c.create_tensor(tn("CONVNEXT_DW", "weight", i), (7, 1, n_embd))
        layer.dw_b = c.create_tensor(tn("CONVNEXT_DW", "bias", i), (1, n_embd))
        layer.norm = c.create_tensor(tn("CONVNEXT_NORM", "weight", i), (n_embd,))
        layer.norm_b = c.create_tensor(tn("CONVNEXT_NORM", "bias", i), (n_embd,))
        layer.pw1 = c.create_tensor(tn("CONVNEXT_PW1", "weight", i), (n_embd, n_ff))
        layer.pw1_b = c.create_tensor(tn("CONVNEXT_PW1", "bias", i), (n_ff,))
        layer.pw2 = c.create_tensor(tn("CONVNEXT_PW2", "weight", i), (n_ff, n_embd))
        layer.pw2_b = c.create_tensor(tn("CONVNEXT_PW2", "bias", i), (n_embd,))
        layer.gamma = c.create_tensor(tn("CONVNEXT_GAMMA", "weight", i), (n_embd,))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,))

    model.output = c.create_tensor(tn("OUTPUT", "weight"), (hp.convnext_n_embd, hp.n_embd_out()))
    model.output_b = c.create_tensor(tn("OUTPUT", "bias"), (hp.n_embd_out(),))


def build(g: GraphContext) -> None:
    """llama_model_wavtokenizer_dec::graph"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)

    cur = ggml.cont(ggml.transpose(inp_l))
    cur = ggml.conv_1d_ph(model.conv1d, cur, 1, 1)
    cur = ggml.add(cur, model.conv1d_b)

    for il in range(hp.posnet_n_layer):
        layer = model.layers[il].posnet
        inp_l = cur
        if il in (0, 1, 3, 4):
            cur = g.build_norm(cur, layer.norm1, layer.norm1_b, LLM_NORM_GROUP, 0)
            cur = ggml.mul(ggml.unary(cur, "SIGMOID"), cur)
            cur = ggml.conv_1d_ph(layer.conv1, cur, 1, 1)
            cur = ggml.add(cur, layer.conv1_b)
            cur = g.build_norm(cur, layer.norm2, layer.norm2_b, LLM_NORM_GROUP, 0)
            cur = ggml.mul(ggml.unary(cur, "SIGMOID"), cur)
            cur = ggml.conv_1d_ph(layer.conv2, cur, 1, 1)
            cur = ggml.add(cur, layer.conv2_b)
            cur = ggml.add(cur, inp_l)
        elif il == 2:
            cur = g.build_norm(cur, layer.attn_norm, layer.attn_norm_b, LLM_NORM_GROUP, 0)
            q = ggml.conv_1d_ph(layer.attn_q, cur, 1, 1)
            k = ggml.conv_1d_ph(layer.attn_k, cur, 1, 1)
            v = ggml.conv_1d_ph(layer.attn_v, cur, 1, 1)
            q = ggml.add(q, layer.attn_q_b)
            k = ggml.add(k, layer.attn_k_b)
            v = ggml.add(v, layer.attn_v_b)
            q = ggml.cont(ggml.transpose(q))
            k = ggml.cont(ggml.transpose(k))
            kq = ggml.mul_mat(k, q)
            kq = ggml.soft_max_ext(kq, None, 1.0 / math.sqrt(float(hp.posnet_n_embd)), 0.0)
            cur = ggml.mul_mat(kq, v)
            cur = ggml.conv_1d_ph(layer.attn_o, cur, 1, 1)
            cur = ggml.add(cur, layer.attn_o_b)
            cur = ggml.add(cur, inp_l)
        else:
            cur = g.build_norm(cur, layer.norm, layer.norm_b, LLM_NORM_GROUP, 0)

    cur = ggml.cont(ggml.transpose(cur))
    cur = g.build_norm(cur, model.tok_norm, model.tok_norm_b, LLM_NORM, 0)
    cur = ggml.cont(ggml.transpose(cur))
    inp_l = cur

    for il in range(hp.convnext_n_layer):
        layer = model.layers[il].convnext
        cur = inp_l
        cur = ggml.conv_1d_dw_ph(layer.dw, cur, 1, 1)
        cur = ggml.add(cur, layer.dw_b)
        cur = ggml.cont(ggml.transpose(cur))
        cur = g.build_norm(cur, layer.norm, layer.norm_b, LLM_NORM, -1)
        cur = g.build_ffn(cur, layer.pw1, layer.pw1_b, None, None, layer.pw2, layer.pw2_b,
                          LLM_FFN_GELU, LLM_FFN_SEQ, il)
        cur = ggml.mul(cur, layer.gamma)
        cur = ggml.cont(ggml.transpose(cur))
        inp_l = ggml.add(cur, inp_l)
    cur = inp_l

    cur = ggml.cont(ggml.transpose(cur))
    cur = g.build_norm(cur, model.output_norm, model.output_norm_b, LLM_NORM, -1)
    cur = g.build_lora_mm(model.output, cur)
    cur = ggml.add(cur, model.output_b)
    g.cb(cur, "result_embd", -1)
    g.t_embd = cur
    ggml.build_forward_expand(g.gf, cur)
