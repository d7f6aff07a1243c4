"""LLM_ARCH_GEMMA_EMBEDDING (src/models/gemma-embedding.cpp): EmbeddingGemma 300M.

Gemma 3's layers (gemma3.py's block) without memory: non-causal attention over the ubatch, five
symmetric sliding-window layers to one full by the pattern; the output RMS norm ends the graph
(t_embd, no lm_head). With --sentence-transformers-dense-modules the file holds two dense
projections, which build_dense_out applies after the pooling.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_NORM_RMS, GraphContext, c_reciprocal
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_SYMMETRIC, HParams
from ..model import Model, TensorCreator, load_swa_pattern, require
from ..model_loader import ModelLoader, tn
from .gemma3 import build_block, create_dense, create_layers

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.swa_type = LLAMA_SWA_TYPE_SYMMETRIC
    load_swa_pattern(ml, hp, 6)
    hp.causal_attn = False   # embeddings do not use causal attention
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train_swa)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.dense_2_feat_in = ml.get_u32("%s.dense_2_feat_in", 0)
    hp.dense_2_feat_out = ml.get_u32("%s.dense_2_feat_out", 0)
    hp.dense_3_feat_in = ml.get_u32("%s.dense_3_feat_in", 0)
    hp.dense_3_feat_out = ml.get_u32("%s.dense_3_feat_out", 0)
    require(ml, hp.dense_2_feat_in in (0, hp.n_embd), f"dense_2_feat_in must be equal to n_embd ({hp.dense_2_feat_in})")
    require(ml, hp.dense_3_feat_out in (0, hp.n_embd), f"dense_3_feat_out must be equal to n_embd ({hp.dense_3_feat_out})")
    hp.f_attention_scale = c_reciprocal(math.sqrt(hp.n_embd_head_k()))   # 1/sqrt(0) is inf in C


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (hp.n_embd, hp.n_vocab))
    c.create_output(model, hp.n_embd, hp.n_vocab)
    create_dense(c, model)
    create_layers(c, model)


def build(g: GraphContext) -> None:
    """llama_model_gemma_embedding::graph"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = ggml.scale(inp_l, math.sqrt(hp.n_embd))
    g.cb(inp_l, "inp_scaled", -1)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_no_cache()
    inp_out_ids = g.build_inp_out_ids()
    for il, layer in enumerate(model.layers):
        inp_l = build_block(g, layer, il, inp_l, inp_pos, inp_attn, inp_out_ids, -1)
    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    ggml.build_forward_expand(g.gf, cur)
