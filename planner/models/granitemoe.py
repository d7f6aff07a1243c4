"""LLM_ARCH_GRANITE_MOE (src/models/granite-moe.cpp): Granite 3.0/3.1 MoE (1B-A400M, 3B-A800M),
Granite MoE Shared.

The llama block and loader (softmax-routed experts, optional rope factors and attention output
bias) under Granite's scales: embeddings, residuals, attention and logits; a shared expert when
expert_shared_feed_forward_length is set. The graph is llama_model_granite::graph.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import ModelLoader, tn
from .granitehybrid import build_attention_layer, build_layer_ffn, load_shexp_tensors
from .llama import load_layer_tensors

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_logit_scale = ml.get_f32("%s.logit_scale")
    hp.f_residual_scale = ml.get_f32("%s.residual_scale", 0.0)
    hp.f_embedding_scale = ml.get_f32("%s.embedding_scale", 0.0)
    hp.f_attention_scale = ml.get_f32("%s.attention.scale", 0.0)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (hp.n_embd, hp.n_vocab))
    c.create_output(model, hp.n_embd, hp.n_vocab)
    for i, layer in enumerate(model.layers):
        load_layer_tensors(c, layer, i, hp)
        if hp.n_expert > 0:
            load_shexp_tensors(c, layer, i, hp)


def build(g: GraphContext) -> None:
    """llama_model_granite::graph (no deepstack inputs: granitemoe headers map none)"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()   # has_rope(0): granitemoe leaves rope_pattern all on
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        cur = build_attention_layer(g, cur, inp_pos, inp_attn, n_embd_head, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        inp_l = build_layer_ffn(g, cur, inp_sa, il)

    g.build_output(inp_l, logit_scale=hp.f_logit_scale)   # scaled even by a zero logit_scale (1/0: inf)
