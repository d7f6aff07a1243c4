"""LLM_ARCH_NOMIC_BERT_MOE (src/models/nomic-bert-moe.cpp): nomic-embed-text-v2-moe.

bert's graph with NEOX rope; every moe_every_n_layers-th layer (from the second) runs softmax-routed
GELU experts without gate, the others bert's GELU FFN with biases.
"""
from __future__ import annotations

from ..hparams import HParams
from ..model import Model, TensorCreator, require_equal_head_sizes
from ..model_loader import ModelLoader, tn
from .bert import (LLAMA_ROPE_TYPE, build, create_attn, create_ffn, create_layer_out_norm, create_tok_embd,  # noqa: F401
                   create_tok_norm)


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    hp.moe_every_n_layers = ml.get_u32("%s.moe_every_n_layers", 0)
    require_equal_head_sizes(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_ff, n_expert = hp.n_embd, hp.n_ff(), hp.n_expert
    create_tok_embd(c, model)
    create_tok_norm(c, model)
    for i, layer in enumerate(model.layers):
        create_attn(c, layer, i, hp)
        if hp.moe_every_n_layers > 0 and i % hp.moe_every_n_layers == 1:
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        else:
            create_ffn(c, layer, i, hp)
        create_layer_out_norm(c, layer, i, hp)
