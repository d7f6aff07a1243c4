"""LLM_ARCH_T5ENCODER (src/models/t5encoder.cpp): the encoder of a T5 alone (sentence-t5, T5 text
encoders of diffusion pipelines).

llama_model_t5's hyperparameters without a decoder block count, its encoder blocks and encoder
output norm, an lm_head (tied unless present) that no graph reads; every graph is T5's encoder
(llama_model_t5encoder::graph is llama_model_t5::graph<true>): attention without a cache over the
ubatch with the relative position bias. create_memory has no case for it, so llama.cpp still
creates the default llama_kv_cache over its layers, which the graph never reads.
"""
from __future__ import annotations

from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn
from .t5 import build_encoder as build  # noqa: F401  (models.h: using graph = llama_model_t5::graph<true>)
from .t5 import load_encoder_tensors

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_rel_attn_bkts = ml.get_u32("%s.attention.relative_buckets_count")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm_enc = c.create_tensor(tn("ENC_OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    load_encoder_tensors(c, model)
