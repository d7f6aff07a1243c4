"""ggml_backend_sched: assign every node of a graph to a backend, split the graph where the backend
changes, copy split inputs across backends, and reserve the compute buffers through gallocr.

Mirrors ggml/src/ggml-backend.cpp of llama.cpp 0c1e57098 (B:761-2120); line numbers below are B's.
The C hash set (hash_id / tensor_backend_id / tensor_id_copy, B:843-846) is a pair of dicts keyed
by the Tensor object itself (identity hash: Tensor is eq=False), which also keeps the keys alive so
that a recycled id() can never inherit a stale assignment.
Not modelled: events, cur_copy rotation (only alloc_graph advances it: reserve always uses copy 0),
the prev_*_backend_ids swap (only alloc_splits reads it), graph uids and the debug printing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from ..backends.layout import use_counts
from ..backends.types import Backend, BufferType, GraphView
from . import ggml
from .ggml import FLAG_INPUT, FLAG_OUTPUT, VIEW_OPS, Cgraph, GGMLAbort, Tensor, ggml_assert

if TYPE_CHECKING:
    from .gallocr import Gallocr, Layout

GGML_SCHED_MAX_BACKENDS = 16
GGML_SCHED_MAX_COPIES = 4
GGML_MAX_SRC = 10   # ggml.h; the graph copy packs alloc-dependency srcs in groups of this size

# graph_optimize(nodes, add_alloc_dep, use_counts): a backend may reorder `nodes` (the split's slice
# of the graph, a GraphView: B:1476 ggml_graph_view, which shares the graph's use counts) in place and call
# add_alloc_dep(tensor, until) to keep `tensor` allocated until the node `until` has been computed
# (ggml_backend_graph_optimize_params).
AddAllocDep = Callable[[Tensor, Tensor], None]
GraphOptimize = Callable[[GraphView, AddAllocDep, dict[Tensor, int]], None]


@dataclass
class Split:
    """ggml_backend_sched_split (B:775): nodes [i_start, i_end) of the graph run on backend_id.

    inputs grows without bound (B:848 ggml_backend_sched_split_inputs_grow doubles the capacity,
    starting at GGML_SCHED_MAX_SPLIT_INPUTS = 30); older ggml started a new split at 30 inputs.
    """
    backend_id: int
    i_start: int
    i_end: int = 0
    inputs: list[Tensor] = field(default_factory=list)


@dataclass(eq=False)
class Splitting:
    """The state split_graph leaves for its graph: the splits, the graph copy, their backends."""
    splits: list[Split]
    graph_inputs: list[Tensor]
    graph: Cgraph
    node_backend_ids: list[int]
    leaf_backend_ids: list[int]


@dataclass(eq=False)
class Reservation:
    """The state a reserve leaves for its graph (Sched.reservation)."""
    split: Splitting
    layout: Layout


class Sched:
    """ggml_backend_sched_new (B:1864): backends in priority order, the CPU last."""

    def __init__(self, backends: list[Backend], bufts: Optional[list[BufferType]] = None,
                 parallel: bool = False, op_offload: bool = True) -> None:
        ggml_assert(len(backends) > 0, "ggml-backend.cpp:1871", "n_backends > 0")
        ggml_assert(len(backends) <= GGML_SCHED_MAX_BACKENDS, "ggml-backend.cpp:1872",
                    "n_backends <= GGML_SCHED_MAX_BACKENDS", f"{len(backends)} backends")
        ggml_assert(backends[-1].dev_type == "CPU", "ggml-backend.cpp:1873", "the last backend is the CPU")
        self.backends = list(backends)
        self.n_backends = len(backends)
        self.bufts = list(bufts) if bufts is not None else [b.buft for b in backends]
        for backend, buft in zip(self.backends, self.bufts):
            ggml_assert(backend.supports_buft(buft), "ggml-backend.cpp:1919", "ggml_backend_supports_buft(backends[b], bufts[b])",
                        f"{backend.name} does not support {buft.name}")
        self.n_copies = GGML_SCHED_MAX_COPIES if parallel else 1
        self.cur_copy = 0
        self.op_offload = op_offload
        # created on the first reserve (C: in sched_new; lazily so split_graph works without it)
        self.galloc: Optional[Gallocr] = None
        self.hv_tensor_backend_ids: dict[Tensor, int] = {}
        self.hv_tensor_copies: dict[tuple[Tensor, int], list[Tensor]] = {}   # (tensor, backend_id) -> copies
        self.splits: list[Split] = []
        self.graph_inputs: list[Tensor] = []
        self.graph = Cgraph()                  # the copy of the graph with split inputs (sched->graph)
        self.node_backend_ids: list[int] = []  # backend of graph.nodes[i]
        self.leaf_backend_ids: list[int] = []  # backend of graph.leafs[i]

    # --- public API --------------------------------------------------------------------------------

    def reset(self) -> None:
        """ggml_backend_sched_reset (B:1965): forget assignments (pins included) and copies.

        The C skips the clearing while is_reset is set, i.e. when the tables are already empty.
        """
        self.hv_tensor_backend_ids.clear()
        self.hv_tensor_copies.clear()

    def set_tensor_backend(self, node: Tensor, backend_id: int) -> None:
        """ggml_backend_sched_set_tensor_backend (B:2104); backend_id = ggml_backend_sched_backend_id."""
        ggml_assert(0 <= backend_id < self.n_backends, "ggml-backend.cpp:2107",
                    "backend_index >= 0 && backend_index < sched->n_backends")
        self.hv_tensor_backend_ids[node] = backend_id

    def get_tensor_backend(self, node: Tensor) -> Optional[Backend]:
        """ggml_backend_sched_get_tensor_backend (B:2113): valid from split_graph until reset.

        reserve ends with a reset, so afterwards use node_backend_ids / leaf_backend_ids, which are
        aligned with graph.nodes / graph.leafs.
        """
        backend_id = self.hv_tensor_backend_ids.get(node, -1)
        return None if backend_id == -1 else self.backends[backend_id]

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    def get_n_splits(self) -> int:
        return self.n_splits

    # the C getters take a backend and look up its index (ggml_backend_sched_backend_id, B:879);
    # here the caller passes the index (the backend's position in `backends`)

    def get_buffer_type(self, backend_id: int) -> BufferType:
        """ggml_backend_sched_get_buffer_type (B:2088)"""
        return self.bufts[backend_id]

    def get_buffer_size(self, backend_id: int) -> int:
        """ggml_backend_sched_get_buffer_size (B:2096): gallocr's buffer size, 0 before any reserve."""
        return 0 if self.galloc is None else self.galloc.buffer_size(backend_id)

    def get_vbuffer_size(self, backend_id: int) -> int:
        """ggml_backend_sched_get_buffer_size as callers see it: ggml_vbuffer_size, the sum of the
        chunks' backend buffer sizes, which a buffer type may make larger than asked (Vulkan_Host:
        32 bytes more)."""
        if not self.get_buffer_size(backend_id):
            return 0
        buft = self.get_buffer_type(backend_id)
        return sum(buft.buffer_size(size) for size in self.galloc.chunk_sizes(backend_id))

    def reserve(self, measure_graph: Cgraph) -> None:
        """ggml_backend_sched_reserve (B:1991): split, gallocr reserve_n on the copy, reset.

        gallocr raises where the C reserve_n returns false (and the reset is then skipped).
        """
        self.split_graph(measure_graph)
        self._gallocr().reserve_n(self.graph, self.node_backend_ids, self.leaf_backend_ids)
        self.reset()

    def splitting(self) -> Splitting:
        """What the last split_graph left."""
        return Splitting(self.splits, self.graph_inputs, self.graph, self.node_backend_ids, self.leaf_backend_ids)

    def reservation(self) -> Reservation:
        """What the last reserve left: the split graph copy and gallocr's layout of it."""
        return Reservation(self.splitting(), self._gallocr().layout())

    def _take_back(self, s: Splitting) -> None:
        self.splits, self.graph_inputs, self.graph = s.splits, s.graph_inputs, s.graph
        self.node_backend_ids, self.leaf_backend_ids = s.node_backend_ids, s.leaf_backend_ids

    def reserve_split(self, s: Splitting) -> None:
        """ggml_backend_sched_reserve of a graph built again as it was when `s` was split: splitting
        depends on the graph alone (it starts from empty assignments; the pre-allocated tensors'
        buffers and the backends' supports_op do not change), so the split is taken back and
        gallocr reserves it."""
        self._take_back(s)
        self._gallocr().reserve_n(self.graph, self.node_backend_ids, self.leaf_backend_ids)
        self.reset()

    def reserve_again(self, r: Reservation) -> None:
        """ggml_backend_sched_reserve of a graph built again as it was when `r` was taken: splitting
        and laying out depend on the graph alone (reserve starts and ends with empty assignments and
        allocators), so the result is taken back and only gallocr's buffer check runs again."""
        self._take_back(r.split)
        self._gallocr().reserve_n_laid_out(r.layout)

    def reserve_size(self, measure_graph: Cgraph) -> list[int]:
        """ggml_backend_sched_reserve_size (B:1977), what a no_alloc context measures: reset first
        (the build's pins are dropped), split, then ggml_gallocr_reserve_n_size: per backend the
        sum of its allocator's chunks, no buffer made (backends sharing a buffer type repeat it)."""
        self.reset()
        self.split_graph(measure_graph)
        return self._gallocr().reserve_n_size(self.graph, self.node_backend_ids, self.leaf_backend_ids)

    def _gallocr(self) -> Gallocr:
        """sched->galloc, made on first use (sched_new makes it; here split_graph works without one)."""
        if self.galloc is None:
            from .gallocr import Gallocr
            self.galloc = Gallocr(self.bufts)
        return self.galloc

    def split_graph(self, graph: Cgraph, optimize: bool = True) -> None:
        """ggml_backend_sched_split_graph (B:1066-1605).

        Like the C it rewrites graph: srcs that cross backends point at their copies (pass 5), INPUT
        leafs gain FLAG_OUTPUT when n_copies > 1 (pass 6), graph_optimize may reorder nodes (unless
        optimize is off: for a caller that reads only the backend assignments).
        """
        optimize = optimize and any(b.graph_optimize for b in self.backends)
        # the graph's use counts as built (ggml_visit_parents), before pass 5 points srcs at copies
        counts = use_counts(graph.nodes) if optimize else {}
        self._assign_from_cur(graph)                          # pass 1
        nodes = graph.nodes
        self._expand(nodes, skip_cpu=True)                    # pass 2: gpu down
        self._expand(reversed(nodes), skip_cpu=True)          #         gpu up
        self._expand(nodes, skip_cpu=False)                   #         rest down
        self._expand(reversed(nodes), skip_cpu=False)         #         rest up
        self._upgrade_or_best(nodes)                          # pass 3
        self._assign_srcs(nodes)                              # pass 4
        self._make_splits(nodes)                              # pass 5
        self._collect_graph_inputs(graph.leafs)               # pass 6
        alloc_deps = self._optimize_splits(graph, counts) if optimize else {}
        self._copy_graph(graph, alloc_deps)

    # --- pass 1: backends from pre-allocated tensors (B:1087-1122) ---------------------------------

    def _assign_from_cur(self, graph: Cgraph) -> None:
        ids = self.hv_tensor_backend_ids
        for t in graph.leafs:
            if ids.get(t, -1) == -1:      # do not overwrite user assignments
                ids[t] = self._backend_id_from_cur(t)
        for t in graph.nodes:
            if ids.get(t, -1) == -1:
                ids[t] = self._backend_id_from_cur(t)

    def _backend_from_buffer(self, tensor: Tensor, op: Tensor) -> int:
        """ggml_backend_sched_backend_from_buffer (B:888): highest prio backend with buft and op."""
        buffer = tensor.view_src.buffer if tensor.view_src is not None else tensor.buffer
        if buffer is None:
            return -1
        for i, backend in enumerate(self.backends):
            if backend.supports_buft(buffer.buft) and backend.supports_op(op):
                return i
        return -1

    def _backend_id_from_cur(self, tensor: Tensor) -> int:
        """ggml_backend_sched_backend_id_from_cur (B:921-985)."""
        buffer = tensor.view_src.buffer if tensor.view_src is not None else tensor.buffer
        if buffer is not None:
            # B:923 "1.dst"; the "1.vsrc" retry (B:929-935) with view_src reads the same buffer
            # (a view_src is always a root) for the same op, so it cannot answer differently
            cur = self._backend_from_buffer(tensor, tensor)
            if cur != -1:
                return cur
            raise GGMLAbort(f"llama.cpp would abort (ggml-backend.cpp:941): pre-allocated tensor ({tensor.name}) "
                            f"in a buffer ({buffer.buft.name}) that cannot run the operation ({tensor.op})")
        if tensor.flags & FLAG_INPUT:
            return self.n_backends - 1    # last backend (assumed CPU)
        # ROPE (freq factors) and FLASH_ATTN_EXT (sinks) are not placed by their small weights (B:955-960)
        if tensor.op == "ROPE" or tensor.op == "FLASH_ATTN_EXT":
            return -1
        for src in tensor.src:
            # src->buffer, not the view_src's: views are never "weights" here (their buffer is NULL)
            if src is None or src.buffer is None or src.buffer.usage != "weights":
                continue
            src_backend_id = self._backend_from_buffer(src, tensor)
            # a higher prio backend may want to run an op whose weight is in host memory (B:969-977)
            if self.op_offload and src_backend_id == self.n_backends - 1 and src.buffer.buft.is_host:
                for b in range(src_backend_id):
                    if self.backends[b].supports_op(tensor) and self.backends[b].offload_op(tensor):
                        return b
            return src_backend_id     # the first weight decides, even when it is -1
        return -1

    # --- pass 2: expand assignments to neighbouring nodes (B:1124-1202) ----------------------------

    def _expand(self, nodes: Iterable[Tensor], skip_cpu: bool) -> None:
        """One sweep: unassigned nodes take the last assigned backend if it supports them.

        With skip_cpu (the two "gpu" sweeps) a CPU node stops the expansion. An unsupported node
        stays unassigned but does not stop it either (cur_backend_id is kept, B:1058).
        """
        ids = self.hv_tensor_backend_ids
        cpu = self.n_backends - 1
        cur = -1
        for node in nodes:
            if node.op in VIEW_OPS:
                continue
            b = ids.get(node, -1)
            if b != -1:
                cur = -1 if skip_cpu and b == cpu else b
            elif cur != -1 and self.backends[cur].supports_op(node):
                ids[node] = cur

    # --- pass 3: upgrades and most supported inputs (B:1204-1263) ----------------------------------

    def _upgrade_or_best(self, nodes: list[Tensor]) -> None:
        ids = self.hv_tensor_backend_ids
        for node in nodes:
            if node.op in VIEW_OPS:
                continue
            b = ids.get(node, -1)
            if b == -1:
                # unassigned: the backend supporting the op with the most inputs in usable buffers;
                # ties go to the higher priority backend
                n_supported_best = -1
                for cand, backend in enumerate(self.backends):
                    if not backend.supports_op(node):
                        continue
                    n_supported = 0
                    for src in node.src:
                        if src is None:
                            continue
                        # C: tensor_backend_id(src->view_src) hashes NULL for non-views: -1 (B:1229)
                        assigned = ids.get(src, -1) != -1 or (
                            src.view_src is not None and ids.get(src.view_src, -1) != -1)
                        if assigned and self._buffer_supported(src, cand):
                            n_supported += 1
                    if n_supported > n_supported_best:
                        n_supported_best = n_supported
                        ids[node] = cand
            else:
                # assigned: move to a higher prio backend with the very same buffer type (BLAS, CPU)
                for cand in range(b):
                    if (self.bufts[cand] is self.bufts[b] and self.backends[cand].supports_op(node)
                            and all(self._buffer_supported(s, cand) for s in node.src if s is not None)):
                        ids[node] = cand
                        break

    def _buffer_supported(self, t: Tensor, backend_id: int) -> bool:
        """ggml_backend_sched_buffer_supported (B:1037): t's buffer type, or its backend's."""
        buf = t.view_src.buffer if t.view_src is not None else t.buffer
        if buf is not None:
            buft = buf.buft
        else:
            ids = self.hv_tensor_backend_ids
            tensor_backend_id = ids.get(t, -1)
            if tensor_backend_id == -1 and t.view_src is not None:
                tensor_backend_id = ids.get(t.view_src, -1)
            if tensor_backend_id == -1:
                return False
            buft = self.bufts[tensor_backend_id]
        return self.backends[backend_id].supports_buft(buft)

    # --- pass 4: views and srcs (B:1265-1295) ------------------------------------------------------

    def _assign_srcs(self, nodes: list[Tensor]) -> None:
        ids = self.hv_tensor_backend_ids
        for node in nodes:     # view ops included
            cur = ids.get(node, -1)
            if node.view_src is not None and cur == -1:
                cur = ids[node] = ids.get(node.view_src, -1)
            for src in node.src:
                if src is None or ids.get(src, -1) != -1:
                    continue
                # views are always on the same backend as their source (which may still be -1)
                ids[src] = ids.get(src.view_src, -1) if src.view_src is not None else cur
            for b, backend in enumerate(self.backends):
                if cur != -1:
                    break
                if backend.supports_op(node):
                    cur = ids[node] = b
            ggml_assert(cur != -1, "ggml-backend.cpp:1294", "*cur_backend_id != -1", f"no backend supports {node.op} ({node.name})")

    # --- pass 5: splits and split inputs (B:1297-1401) ---------------------------------------------

    def _make_splits(self, nodes: list[Tensor]) -> None:
        ids = self.hv_tensor_backend_ids
        copies = self.hv_tensor_copies
        # the backend of the first split is the first non-view node's; with none, the C keeps
        # splits[0].backend_id from the previous graph (0 at first)
        i = next((k for k, node in enumerate(nodes) if node.op not in VIEW_OPS), len(nodes))
        split = Split(ids[nodes[i]] if i < len(nodes) else 0, 0)
        self.splits = [split]
        cur_backend_id = split.backend_id
        for i in range(i, len(nodes)):
            node = nodes[i]
            if node.op in VIEW_OPS:
                continue
            node_backend_id = ids[node]
            ggml_assert(node_backend_id != -1, "ggml-backend.cpp:1322", "node_backend_id != -1", f"{node.name} has no backend")
            # a weight on another, incompatible backend starts a new split so that the memory of
            # previously copied weights can be reused; only once the split has inputs (B:1323-1341)
            need_new_split = False
            if node_backend_id == cur_backend_id and split.inputs:
                for src in node.src:
                    if (src is not None and src.buffer is not None and src.buffer.usage == "weights"
                            and ids.get(src, -1) != cur_backend_id and not self._buffer_supported(src, cur_backend_id)):
                        need_new_split = True
                        break
            if node_backend_id != cur_backend_id or need_new_split:
                split.i_end = i
                split = Split(node_backend_id, i)
                self.splits.append(split)
                cur_backend_id = node_backend_id
            # inputs that are not on this backend get one copy per (tensor, backend), n_copies deep
            for j, src in enumerate(node.src):
                if src is None:
                    continue
                src_backend_id = ids.get(src, -1)
                ggml_assert(src_backend_id != -1, "ggml-backend.cpp:1373", "src_backend_id != -1",
                            f"input {src.name} of {node.name} has no backend")
                if src_backend_id == cur_backend_id or self._buffer_supported(src, cur_backend_id):
                    continue
                key = (src, cur_backend_id)
                if key not in copies:
                    copies[key] = [self._copy_of(src, cur_backend_id, c, self.n_copies > 1)
                                   for c in range(self.n_copies)]
                    split.inputs.append(src)
                node.src[j] = copies[key][self.cur_copy]
        split.i_end = len(nodes)

    def _copy_of(self, t: Tensor, backend_id: int, c: int, input_output: bool) -> Tensor:
        """ggml_dup_tensor_layout named "<backend>#<name>#<copy>" (B:1379-1385, 1429-1434)."""
        cpy = ggml.dup_tensor(t)
        cpy.nb = t.nb
        cpy.name = ggml._fmt(f"{self.backends[backend_id].name}#{t.name}#{c}")
        if input_output:
            cpy.flags |= FLAG_INPUT | FLAG_OUTPUT   # keeps ggml-alloc from overwriting the copy
        return cpy

    # --- pass 6: pipeline-parallel copies of every INPUT leaf (B:1407-1446) ------------------------

    def _collect_graph_inputs(self, leafs: list[Tensor]) -> None:
        """With n_copies > 1 every INPUT leaf (used or not) gets n_copies copies on its backend; the
        current copy is the leaf itself, which so gains FLAG_OUTPUT too (B:1424-1436)."""
        self.graph_inputs = []
        if self.n_copies == 1:
            return
        ids = self.hv_tensor_backend_ids
        for leaf in leafs:
            if not leaf.flags & FLAG_INPUT:
                continue
            leaf_backend_id = ids[leaf]
            key = (leaf, leaf_backend_id)
            if key not in self.hv_tensor_copies:
                cps = [leaf if c == self.cur_copy else self._copy_of(leaf, leaf_backend_id, c, False)
                       for c in range(self.n_copies)]
                for cpy in cps:
                    cpy.flags |= FLAG_INPUT | FLAG_OUTPUT
                self.hv_tensor_copies[key] = cps
            self.graph_inputs.append(leaf)

    # --- per-backend graph_optimize (B:1456-1479) --------------------------------------------------

    def _optimize_splits(self, graph: Cgraph, counts: dict[Tensor, int]) -> dict[Tensor, list[Tensor]]:
        """Each split's backend may reorder its nodes and add allocation deps: {until: [tensors]}."""
        alloc_deps: dict[Tensor, list[Tensor]] = {}

        def add_alloc_dep(tensor: Tensor, until: Tensor) -> None:
            keep = alloc_deps.setdefault(until, [])
            if tensor not in keep:    # identity: Tensor is eq=False
                keep.append(tensor)

        for split in self.splits:
            optimize: Optional[GraphOptimize] = getattr(self.backends[split.backend_id], "graph_optimize", None)
            if optimize is not None:
                # the C passes a view sharing graph->nodes, so a reordering shows in the graph; the
                # later splits' nodes are not reordered yet
                view = GraphView(graph.nodes[split.i_start:split.i_end], graph.nodes[split.i_end:])
                optimize(view, add_alloc_dep, counts)
                graph.nodes[split.i_start:split.i_end] = view
        return alloc_deps

    # --- the graph copy (B:1481-1599) ----------------------------------------------------------

    def _copy_graph(self, graph: Cgraph, alloc_deps: dict[Tensor, list[Tensor]]) -> None:
        ids = self.hv_tensor_backend_ids
        copies = self.hv_tensor_copies
        nodes: list[Tensor] = []
        node_ids: list[int] = []
        n_dep_nodes = sum((len(keep) + GGML_MAX_SRC - 1) // GGML_MAX_SRC for keep in alloc_deps.values())
        n_dep_nodes_added = 0
        for split in self.splits:
            for inp in split.inputs:
                # a dependency on the source, so that it is not freed before the copy is done
                input_dep = ggml.view_tensor(inp)
                input_dep.src = [inp]
                nodes.append(input_dep)
                node_ids.append(ids[inp])
                # the copy itself, so that it is allocated at the start of the split
                nodes.append(copies[(inp, split.backend_id)][self.cur_copy])
                node_ids.append(split.backend_id)
            for j in range(split.i_start, split.i_end):
                node = graph.nodes[j]
                nodes.append(node)
                node_ids.append(ids[node])
                keep = alloc_deps.get(node)
                if keep is None:
                    continue
                # GGML_OP_NONE nodes holding the kept tensors as srcs, GGML_MAX_SRC at a time
                for k in range(0, len(keep), GGML_MAX_SRC):
                    dep = ggml.view_tensor(keep[k])
                    dep.src = keep[k:k + GGML_MAX_SRC]
                    nodes.append(dep)
                    node_ids.append(split.backend_id)
                    n_dep_nodes_added += 1
        # a dep whose `until` is not a node of the optimized graph (B:1561)
        ggml_assert(n_dep_nodes_added == n_dep_nodes, "ggml-backend.cpp:1561", "n_dep_nodes_added == n_dep_nodes")

        leafs: list[Tensor] = []
        leaf_ids: list[int] = []
        if self.n_copies > 1:
            # input copies first, so that they are allocated first: the current copy of an INPUT
            # leaf is the leaf itself, which therefore appears twice in the leafs (B:1563-1599)
            for inp in self.graph_inputs:
                backend_id = ids[inp]
                leafs.extend(copies[(inp, backend_id)])
                leaf_ids.extend([backend_id] * self.n_copies)
            for split in self.splits:
                for inp in split.inputs:
                    leafs.extend(copies[(inp, split.backend_id)])
                    leaf_ids.extend([split.backend_id] * self.n_copies)
        for leaf in graph.leafs:
            leafs.append(leaf)
            leaf_ids.append(ids[leaf])

        self.graph = Cgraph(nodes=nodes, leafs=leafs)
        self.node_backend_ids = node_ids
        self.leaf_backend_ids = leaf_ids
