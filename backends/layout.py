"""ggml's layout predicates, as the backends' supports_op and graph_optimize read them.

ggml/src/ggml.c (llama.cpp 0c1e57098): ggml_nrows 1292, ggml_is_transposed 1470,
ggml_is_contiguous_m_n 1474-1508, ggml_is_contiguous_rows 1539, ggml_are_same_shape 1564;
ggml/src/ggml-impl.h: ggml_are_same_layout 75, ggml_op_is_empty 90.
"""
from __future__ import annotations

from ..planner.ggml import FLAG_OUTPUT, T, Tensor, blck_size, is_contiguous_m_n, type_name, type_size

GGML_MAX_SRC = 10
EMPTY_OPS = frozenset({"NONE", "RESHAPE", "TRANSPOSE", "VIEW", "PERMUTE"})


_UPPER_NAMES = {int(t): type_name(t).upper() for t in T}


def tname(t: Tensor) -> str:
    """The ggml type name in upper case ("F32", "Q4_0"), as the C switches spell it."""
    return _UPPER_NAMES[t.type]


def op_is_empty(op: str) -> bool:
    return op in EMPTY_OPS


def nrows(t: Tensor) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def is_transposed(t: Tensor) -> bool:
    return t.nb[0] > t.nb[1]


def is_contiguous(t: Tensor) -> bool:
    return is_contiguous_m_n(t, 0)


def is_contiguous_1(t: Tensor) -> bool:
    return is_contiguous_m_n(t, 1)


def is_contiguous_2(t: Tensor) -> bool:
    return is_contiguous_m_n(t, 2)


def is_contiguous_rows(t: Tensor) -> bool:
    return t.ne[0] == blck_size(t.type) or t.nb[0] == type_size(t.type)


def same_shape(a: Tensor, b: Tensor) -> bool:
    return a.ne == b.ne


def same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def src(t: Tensor, i: int):
    """t->src[i]: NULL beyond the sources the constructor set."""
    return t.src[i] if i < len(t.src) else None


def op_param(t: Tensor, i: int, default=0):
    """op_params[i]: 0 where the constructor left it unset."""
    return t.op_params[i] if i < len(t.op_params) else default


def use_counts(nodes: list[Tensor]) -> dict[Tensor, int]:
    """cgraph->use_counts (ggml.c:7285) of a graph's nodes, as built: how many src slots name each
    tensor. A split's graph view shares its graph's counts (ggml_graph_view, ggml.c:7544)."""
    counts: dict[Tensor, int] = {}
    for node in nodes:
        for s in node.src:
            if s is not None:
                counts[s] = counts.get(s, 0) + 1
    return counts


def can_fuse_subgraph(nodes: list[Tensor], idxs: list[int], ops: list[str], outputs: list[int],
                      counts: dict[Tensor, int]) -> bool:
    """ggml_can_fuse_subgraph_ext (ggml.c:7769): every non-output node of the subgraph is used only
    inside it, is no graph output, and views only tensors of the subgraph or weights.
    Every node of a schedplan graph has the COMPUTE flag (only the unselected inp_embd lacks it,
    and it is a leaf), so that test always passes."""
    members = [nodes[i] for i in idxs]
    for k, i in enumerate(idxs):
        node = nodes[i]
        if node.op != ops[k]:
            return False
        if i in outputs:
            continue
        if node.flags & FLAG_OUTPUT:
            return False
        uses = sum(1 for other in members[k + 1:] for s in other.src if s is node)
        if uses != counts.get(node, 0):
            return False
        view_src = node.view_src
        if view_src is not None and not any(m is view_src for m in members) and not _is_constant(view_src):
            return False
    return True


def _is_constant(t: Tensor) -> bool:
    """ggml_is_constant (ggml.c:7765): a weight."""
    return t.buffer is not None and t.buffer.usage == "weights"
