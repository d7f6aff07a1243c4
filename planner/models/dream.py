"""LLM_ARCH_DREAM (src/models/dream.cpp): Dream-v0-Base/Instruct-7B, a diffusion language model.

qwen2's loader line for line and its block ("copied from qwen2": Q/K/V biases, NEOX rope, SwiGLU
FFN), run non-causally (load_arch_hparams sets causal_attn false) over the ubatch alone: the
model keeps no memory (create_memory gives none). An output bias is loaded where present but
never added.
"""
from __future__ import annotations

from ..graph import GraphContext
from ..hparams import HParams
from ..model_loader import ModelLoader
from . import qwen2
from .qwen2 import LLAMA_ROPE_TYPE, load_arch_tensors  # noqa: F401  (llama_model_dream::load_arch_tensors is qwen2's)


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_dream::load_arch_hparams"""
    qwen2.load_arch_hparams(ml, hp)
    hp.causal_attn = False


def build(g: GraphContext) -> None:
    """llama_model_dream::graph"""
    qwen2.build(g, diffusion=True)
