"""LLM_ARCH_NOMIC_BERT (src/models/nomic-bert.cpp): nomic-embed-text v1, v1.5.

bert's graph (llama_model_bert::graph) with NEOX rope instead of learned positions and a SwiGLU
FFN without biases (ffn_gate beside ffn_up); no classification head.
"""
from __future__ import annotations

from ..hparams import HParams
from ..model import Model, TensorCreator, require_equal_head_sizes
from ..model_loader import ModelLoader, tn
from .bert import (LLAMA_ROPE_TYPE, build, create_attn, create_ffn, create_layer_out_norm, create_tok_embd,  # noqa: F401
                   create_tok_norm)


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    require_equal_head_sizes(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    create_tok_embd(c, model)
    create_tok_norm(c, model)
    for i, layer in enumerate(model.layers):
        create_attn(c, layer, i, hp)
        create_ffn(c, layer, i, hp)
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (hp.n_embd, hp.n_ff()))
        create_layer_out_norm(c, layer, i, hp)
