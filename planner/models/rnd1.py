"""LLM_ARCH_RND1 (src/models/rnd1.cpp): RND1-Base, Qwen3-30B-A3B converted to a diffusion model.

qwen3moe's loader line for line (its error messages included) and its graph, run non-causally
(load_arch_hparams sets causal_attn false) over the ubatch alone: the model keeps no memory
(create_memory gives none).
"""
from __future__ import annotations

from ..graph import GraphContext
from ..hparams import HParams
from ..model_loader import ModelLoader
from . import qwen3moe
from .qwen3moe import LLAMA_ROPE_TYPE, load_arch_tensors  # noqa: F401  (llama_model_rnd1::load_arch_tensors is qwen3moe's)


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_rnd1::load_arch_hparams"""
    qwen3moe.load_arch_hparams(ml, hp)
    hp.causal_attn = False


def build(g: GraphContext) -> None:
    """llama_model_rnd1::graph"""
    qwen3moe.build(g, diffusion=True)
