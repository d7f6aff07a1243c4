"""LLM_ARCH_JINA_BERT_V3 (src/models/jina-bert-v3.cpp): jina-embeddings-v3 (XLM-RoBERTa with
rotary positions; its task LoRA adapters are separate files).

bert's graph with NEOX rope instead of learned positions, bert's GELU FFN with biases.
"""
from __future__ import annotations

from ..hparams import HParams
from ..model import Model, TensorCreator, require_equal_head_sizes
from ..model_loader import ModelLoader
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
        create_layer_out_norm(c, layer, i, hp)
