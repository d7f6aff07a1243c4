"""LLM_ARCH_LLAMA_EMBED (src/models/llama-embed.cpp): llama-embed-nemotron-8b (LlamaBidirectionalModel).

llama_model_llama's loader and hparams (models.h: llama_model_llama_embed derives from it) and
llama's graph<true>: attention over the ubatch alone (build_attn_inp_no_cache), no lm_head. The
context still keeps a KV cache (create_memory's default), which this graph never reads or writes.
"""
from __future__ import annotations

from ..graph import GraphContext
from . import llama
from .llama import LLAMA_ROPE_TYPE, load_arch_hparams, load_arch_tensors  # noqa: F401


def build(g: GraphContext) -> None:
    """llama_model_llama_embed::build_arch_graph: graph<true>"""
    llama.build(g, embed=True)
