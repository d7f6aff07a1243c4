"""Compute tensors' lifetimes, from a reserve result's tensor listing (reserve(..., tensors=True)).

The graph allocator (planner/gallocr.py, ggml-alloc.c) allocates leafs and inputs before the first
node, every other tensor at the node that produces it, and frees a tensor after its last consumer
(counting the consumers of its views), never a graph output; an in-place op takes its parent's
memory over at its own node. This replays that walk on the listing's `srcs`, `view_src` and
`flags`, so each compute tensor gets the node range in which it owns its memory.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from schedplan.planner.gallocr import CAN_INPLACE


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
    def ref(p: int) -> int:   # a tensor listed twice is the same tensor (srcs name its first row)
        same = tensors[p]["same_as"]
        return p if same is None else same

    nodes = [p for p, t in enumerate(tensors) if t["kind"] == "node"]
    own = {p for p, t in enumerate(tensors) if t["compute"] and t["view_src"] is None and t["same_as"] is None}
    first: dict[int, int] = {}
    last: dict[int, int] = {}

    for p, t in enumerate(tensors):
        if t["kind"] == "leaf" and ref(p) in own:
            first[ref(p)] = -1
    children: Counter[int] = Counter()
    views: Counter[int] = Counter()
    for p in nodes:
        t = tensors[p]
        if t["view_src"] is not None and t["op"] != "NONE":
            views[t["view_src"]] += 1
        for q in [ref(p), *t["srcs"]]:
            if q in own and "input" in tensors[q]["flags"]:
                first.setdefault(q, -1)
        for s in t["srcs"]:
            children[s] += 1

    def alive(q: int) -> bool:
        return q in first and q not in last

    def free(q: int, i: int) -> None:
        if "output" not in tensors[q]["flags"]:
            last[q] = i

    for i, p in enumerate(nodes):
        t = tensors[p]
        for q in [*t["srcs"], ref(p)]:
            if q in own and q not in first:
                first[q] = i
                if q == ref(p) and t["op"] in CAN_INPLACE:
                    for s in t["srcs"]:   # in place: the buffer and offset of a live parent
                        if s in own and alive(s) and (tensors[s]["buffer"], tensors[s]["offset"]) == \
                                (t["buffer"], t["offset"]):
                            last[s] = i - 1
                            break
        for s in t["srcs"]:
            children[s] -= 1
            if children[s] == 0 and views[s] == 0:
                base = tensors[s]["view_src"]
                if base is not None:
                    views[base] -= 1
                    if views[base] == 0 and children[base] == 0 and base in own and alive(base):
                        free(base, i)
                elif s in own and alive(s):
                    free(s, i)

    end = len(nodes) - 1
    return [Lifetime(p, tensors[p]["name"], tensors[p]["buffer"], tensors[p]["offset"], tensors[p]["size"],
                     first[p], last.get(p, end)) for p in sorted(own)]


def alive_at(spans: list[Lifetime], node: int) -> list[Lifetime]:
    return [s for s in spans if s.first <= node <= s.last]
