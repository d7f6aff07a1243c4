"""Compute tensors' lifetimes, from a reserve result's tensor listing (reserve(..., tensors=True)).

The graph allocator (planner/gallocr.py, ggml-alloc.c) records for each tensor the node at which it
got memory (-1: leafs and inputs, before the first node) and the last node at which it held it: its
last consumer, the node before an in-place op took it over, or the graph's end for outputs.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lifetime:
    position: int   # in the listing
    name: str
    buffer: str     # buffer type
    offset: int
    size: int
    first: int      # first node at which it holds memory; -1: allocated before the first node
    last: int       # last node at which it holds memory (the last node for never-freed tensors)


def lifetimes(tensors: list[dict]) -> list[Lifetime]:
    """One Lifetime per compute tensor with memory of its own (not a view, not a repeated row),
    in listing order."""
    end = sum(t["kind"] == "node" for t in tensors) - 1
    return [Lifetime(p, t["name"], t["buffer"], t["offset"], t["size"], t["lifetime"][0],
                     end if t["lifetime"][1] is None else t["lifetime"][1])
            for p, t in enumerate(tensors) if t["lifetime"] is not None and t["same_as"] is None]


def alive_at(spans: list[Lifetime], node: int) -> list[Lifetime]:
    return [s for s in spans if s.first <= node <= s.last]
