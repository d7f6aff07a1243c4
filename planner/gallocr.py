"""The graph allocator: ggml/src/ggml-alloc.c (llama.cpp 0c1e57098), offsets only.

ggml_dyn_tallocr hands out (chunk, offset) addresses from free lists; ggml_gallocr walks a graph,
allocating each tensor before its first use and freeing it after its last, and sizes one virtual
buffer (a list of chunks) per buffer id. Backend buffers are assumed to be exactly the size asked
for (ggml_backend_buffer_init stores `size` as given for the CPU, CUDA and RPC buffer types).
Line numbers refer to ggml-alloc.c.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from ..backends.types import SIZE_MAX, BufferType
from .ggml import FLAG_INPUT, FLAG_OUTPUT, Buffer, Cgraph, Tensor

MAX_FREE_BLOCKS = 256
GGML_VBUFFER_MAX_CHUNKS = 16
INT64_MIN = -2**63

# ggml_op_can_inplace (1-51)
CAN_INPLACE = frozenset({
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV",
    "SQR", "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK",
    "CLAMP", "SOFT_MAX", "SOFT_MAX_BACK",
})


def aligned_size(size: int, alignment: int) -> int:
    """aligned_offset(NULL, size, alignment): size rounded up to the alignment."""
    return size + (-size) % alignment


# --- ggml_dyn_tallocr ---------------------------------------------------------------------------

@dataclass(slots=True)
class FreeBlock:
    offset: int
    size: int


@dataclass(slots=True)
class TallocrChunk:
    free_blocks: list[FreeBlock]   # sorted by offset
    max_size: int = 0              # highest end ever allocated: the chunk's buffer size


@dataclass(eq=False)
class Peak:
    """The moment a dyn_tallocr's size (sum of its chunks' max_size) last grew."""
    node: int               # index in graph.nodes; -1 while leafs and inputs are allocated
    size: int
    tensors: list[Tensor]   # tensors holding memory in the allocator then (in-place: the last owner)


@dataclass(eq=False)
class DynTallocr:
    alignment: int
    max_chunk_size: int
    chunks: list[TallocrChunk] = field(default_factory=list)
    size: int = 0                                              # sum of chunks' max_size
    live: dict[Tensor, None] = field(default_factory=dict)     # in order, like GGML_ALLOCATOR_DEBUG's allocated_tensors
    peak: Optional[Peak] = None


def dyn_tallocr_new(alignment: int, max_buffer_size: int) -> DynTallocr:
    return DynTallocr(alignment, min(max_buffer_size, SIZE_MAX // 2))


def dyn_tallocr_reset(alloc: DynTallocr) -> None:
    alloc.chunks = []
    alloc.size = 0
    alloc.live = {}
    alloc.peak = None


def dyn_tallocr_insert_block(chunk: TallocrChunk, offset: int, size: int) -> None:
    blocks = chunk.free_blocks
    if len(blocks) >= MAX_FREE_BLOCKS:
        raise RuntimeError("ggml_dyn_tallocr_insert_block: out of free blocks")
    pos = 0
    while pos < len(blocks) and blocks[pos].offset < offset:
        pos += 1
    blocks.insert(pos, FreeBlock(offset, size))


def dyn_tallocr_new_chunk(alloc: DynTallocr, min_size: int) -> int:
    """ggml_dyn_tallocr_new_chunk (160-178): the 16th chunk is virtually endless (SIZE_MAX/2)."""
    n = len(alloc.chunks)
    if n >= GGML_VBUFFER_MAX_CHUNKS:
        return -1
    size = SIZE_MAX // 2 if n == GGML_VBUFFER_MAX_CHUNKS - 1 else max(min_size, alloc.max_chunk_size)
    alloc.chunks.append(TallocrChunk([FreeBlock(0, size)]))
    return n


def dyn_tallocr_alloc(alloc: DynTallocr, size: int) -> tuple[int, int]:
    """ggml_dyn_tallocr_alloc (202-309); returns (chunk, offset).

    1. Best fit over every chunk's free blocks except its last; best_fit_size restarts at SIZE_MAX
       for each chunk (214) and the test is `<=` (218), so ties, and any fit in a later chunk, win.
    2. Else the last block of each chunk that is big enough, by reuse factor max_size - offset - size:
       the smallest non-negative one, else the largest negative one (grows the chunk least); on
       equal factors the earlier chunk stays.
    3. Else a new chunk.
    """
    size = aligned_size(size, alloc.alignment)
    chunks = alloc.chunks
    best_chunk = best_block = -1
    for c, chunk in enumerate(chunks):
        blocks = chunk.free_blocks
        best_fit_size = SIZE_MAX
        for i in range(len(blocks) - 1):
            bsize = blocks[i].size
            if size <= bsize <= best_fit_size:
                best_chunk, best_block, best_fit_size = c, i, bsize

    if best_block == -1:
        best_reuse = INT64_MIN
        for c, chunk in enumerate(chunks):
            blocks = chunk.free_blocks
            if blocks:
                block = blocks[-1]
                reuse = chunk.max_size - block.offset - size
                better_reuse = best_reuse < 0 and reuse > best_reuse
                better_fit = 0 <= reuse < best_reuse
                if block.size >= size and (better_reuse or better_fit):
                    best_chunk, best_block, best_reuse = c, len(blocks) - 1, reuse

    if best_block == -1:
        best_chunk = dyn_tallocr_new_chunk(alloc, size)
        best_block = 0
    if best_chunk == -1:
        raise RuntimeError(f"graph allocation: failed to reserve memory ({size} bytes)")

    chunk = chunks[best_chunk]
    block = chunk.free_blocks[best_block]
    offset = block.offset
    block.offset += size
    block.size -= size
    if block.size == 0:
        del chunk.free_blocks[best_block]
    end = offset + size
    if end > chunk.max_size:
        alloc.size += end - chunk.max_size
        chunk.max_size = end
    return best_chunk, offset


def dyn_tallocr_free_bytes(alloc: DynTallocr, chunk_id: int, offset: int, size: int) -> None:
    """ggml_dyn_tallocr_free_bytes (312-350): merge with the block ending at offset (and then the
    next one), or the block starting at its end, else insert a new block.

    The C's second merge, with the block before one that starts at our end (338-344), cannot
    happen: that previous block would end at `offset` and have matched the first test already.
    """
    size = aligned_size(size, alloc.alignment)
    chunk = alloc.chunks[chunk_id]
    blocks = chunk.free_blocks
    for i, block in enumerate(blocks):
        if block.offset + block.size == offset:
            block.size += size
            if i < len(blocks) - 1:
                nxt = blocks[i + 1]
                if block.offset + block.size == nxt.offset:
                    block.size += nxt.size
                    del blocks[i + 1]
            return
        if offset + size == block.offset:
            block.offset = offset
            block.size += size
            return
    dyn_tallocr_insert_block(chunk, offset, size)


# --- ggml_gallocr -------------------------------------------------------------------------------

@dataclass(slots=True)
class HashNode:
    """struct hash_node, plus `size`: the alloc size under bufts[buffer_id], cached."""
    n_children: int = 0
    n_views: int = 0
    buffer_id: int = 0
    chunk: int = 0
    offset: int = 0
    size: int = 0
    allocated: bool = False
    first: int = -1              # node index at which it got memory (-1: before the first node)
    last: Optional[int] = None   # last node index at which it held memory; None: never freed


@dataclass
class TensorAlloc:
    buffer_id: int
    chunk: int
    offset: int
    size_max: int   # alloc size; 0 for views (C: "0 = pre-allocated, unused, or view")


@dataclass(eq=False)
class Layout:
    """What reserve_layout leaves: the graph's hash nodes, and per allocator its chunks, size, live
    tensors and peak (reset replaces each of these objects rather than mutating it)."""
    hash: dict[Tensor, HashNode]
    tallocs: list[tuple[list[TallocrChunk], int, dict[Tensor, None], Optional[Peak]]]


@dataclass(eq=False)
class Vbuffer:
    """struct vbuffer: the backend buffers (chunks) of one buffer id, by size."""
    chunks: list[int]


class Gallocr:
    def __init__(self, bufts: list[BufferType]):
        """ggml_gallocr_new_n (498-532): one dyn_tallocr per distinct buffer type."""
        self.bufts = list(bufts)
        self.buf_tallocs: list[DynTallocr] = []
        for i, buft in enumerate(self.bufts):
            shared = next((self.buf_tallocs[j] for j in range(i) if self.bufts[j] is buft), None)
            self.buf_tallocs.append(shared or dyn_tallocr_new(buft.alignment, buft.max_size))
        self.buffers: list[Optional[Vbuffer]] = [None] * len(self.bufts)
        self.hash: defaultdict[Tensor, HashNode] = defaultdict(HashNode)
        self.node_index = -1                  # the node being allocated, for Peak

    # ggml_gallocr_allocate_node (623-689)
    def allocate_node(self, node: Tensor, buffer_id: int) -> None:
        # is_allocated (593-597): data or buffer set externally, or already own; views never
        if node.buffer is not None or node.view_src is not None:
            return
        hn = self.hash[node]
        if hn.allocated:
            return
        hn.allocated = True
        if node.op in CAN_INPLACE and self.reuse_parent(node, hn):
            return
        alloc = self.buf_tallocs[buffer_id]
        hn.buffer_id = buffer_id
        hn.size = self.bufts[buffer_id].alloc_size(node)
        before = alloc.size
        hn.chunk, hn.offset = dyn_tallocr_alloc(alloc, hn.size)
        hn.first = self.node_index
        alloc.live[node] = None
        if alloc.size > before:
            alloc.peak = Peak(self.node_index, alloc.size, list(alloc.live))

    def reuse_parent(self, node: Tensor, hn: HashNode) -> bool:
        """The in-place branch of ggml_gallocr_allocate_node (632-681): the first parent that is
        own, not OUTPUT, of the same type/ne/nb, with one child and no views.

        Views are never own (allocate_node skips them), so the C's view-parent branch (658-670)
        and its view_src OUTPUT test (646) never apply.
        """
        for parent in node.src:
            if parent is None:
                continue
            p_hn = self.hash[parent]
            if not p_hn.allocated or parent.flags & FLAG_OUTPUT:
                continue
            if parent.type != node.type or parent.ne != node.ne or parent.nb != node.nb:
                continue   # ggml_are_same_layout
            if p_hn.n_children == 1 and p_hn.n_views == 0:
                hn.buffer_id = p_hn.buffer_id
                hn.chunk, hn.offset = p_hn.chunk, p_hn.offset
                hn.size = self.bufts[hn.buffer_id].alloc_size(node)
                hn.first = self.node_index
                p_hn.allocated = False
                p_hn.last = self.node_index - 1   # the node holds the memory from here on
                live = self.buf_tallocs[p_hn.buffer_id].live
                del live[parent]
                live[node] = None
                self.free_extra_space(hn, p_hn)
                return True
        return False

    def free_extra_space(self, hn: HashNode, p_hn: HashNode) -> None:
        """ggml_gallocr_free_extra_space (600-621): give back the parent's tail beyond the node."""
        if p_hn.size < hn.size:
            raise AssertionError("free_extra_space: parent_size >= node_size")
        p_alloc = self.buf_tallocs[p_hn.buffer_id]
        parent_size = aligned_size(p_hn.size, p_alloc.alignment)
        node_size = aligned_size(hn.size, p_alloc.alignment)
        if parent_size > node_size:
            dyn_tallocr_free_bytes(p_alloc, p_hn.chunk, p_hn.offset + node_size, parent_size - node_size)

    def free_node(self, node: Tensor) -> None:
        """ggml_gallocr_free_node (691-712): graph outputs are never freed."""
        if node.flags & FLAG_OUTPUT:
            return
        hn = self.hash[node]
        alloc = self.buf_tallocs[hn.buffer_id]
        dyn_tallocr_free_bytes(alloc, hn.chunk, hn.offset, hn.size)
        del alloc.live[node]
        hn.allocated = False
        hn.last = self.node_index

    def alloc_graph_impl(self, graph: Cgraph, node_buffer_ids: list[int], leaf_buffer_ids: list[int]) -> None:
        """ggml_gallocr_alloc_graph_impl (718-823)."""
        self.hash = hash_ = defaultdict(HashNode)
        allocate_node = self.allocate_node
        self.node_index = -1

        # every leaf, used or not
        for leaf, buffer_id in zip(graph.leafs, leaf_buffer_ids, strict=True):
            allocate_node(leaf, buffer_id)

        # count children and views (view nodes with op NONE are sched dependencies, not counted);
        # INPUT nodes and INPUT srcs, with the buffer id of the node that uses them. Srcs with memory
        # of their own (weights, KV cache) and views of them are left out: the C counts their uses
        # too, but they are never allocated, so their counts never free anything
        parents_of = []   # per node: (src, its hash node) for each src gallocr may allocate
        for node, buffer_id in zip(graph.nodes, node_buffer_ids, strict=True):
            if node.view_src is not None and node.op != "NONE":
                hash_[node.view_src].n_views += 1
            if node.flags & FLAG_INPUT:
                allocate_node(node, buffer_id)
            parents = []
            for src in node.src:
                if src is None or (src.view_src or src).buffer is not None:
                    continue
                p_hn = hash_[src]
                p_hn.n_children += 1
                if src.flags & FLAG_INPUT:
                    allocate_node(src, buffer_id)
                parents.append((src, p_hn))
            parents_of.append(parents)

        free_node = self.free_node
        for i, (node, buffer_id, parents) in enumerate(zip(graph.nodes, node_buffer_ids, parents_of)):
            self.node_index = i
            for parent, p_hn in parents:
                if not p_hn.allocated and parent.view_src is None:   # views never get memory of their own
                    allocate_node(parent, buffer_id)
            if node.view_src is None:
                allocate_node(node, buffer_id)
            for parent, p_hn in parents:
                p_hn.n_children -= 1
                if p_hn.n_children == 0 and p_hn.n_views == 0:
                    view_src = parent.view_src
                    if view_src is not None:
                        # n_views can go below zero here for views with op NONE (never counted)
                        vs_hn = hash_[view_src]
                        vs_hn.n_views -= 1
                        if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                            free_node(view_src)
                    elif p_hn.allocated:
                        free_node(parent)

    def reserve_layout(self, graph: Cgraph, node_buffer_ids: list[int], leaf_buffer_ids: list[int]) -> None:
        """ggml_gallocr_reserve_n_impl (825-903): reset the allocators, lay the graph out."""
        for alloc in self.buf_tallocs:
            dyn_tallocr_reset(alloc)
        self.alloc_graph_impl(graph, node_buffer_ids, leaf_buffer_ids)

    def reserve_n(self, graph: Cgraph, node_buffer_ids: list[int], leaf_buffer_ids: list[int]) -> None:
        """ggml_gallocr_reserve_n (825-949 with no_alloc = false)."""
        self.reserve_layout(graph, node_buffer_ids, leaf_buffer_ids)
        self.realloc_buffers()

    def layout(self) -> Layout:
        """The last reserve's layout, which the next reserve replaces (buffers excluded)."""
        return Layout(self.hash, [(a.chunks, a.size, a.live, a.peak) for a in self.buf_tallocs])

    def reserve_n_laid_out(self, layout: Layout) -> None:
        """ggml_gallocr_reserve_n of a graph whose layout is already known: laying out depends on the
        graph and its buffer ids alone (the allocators start empty), so the layout is taken back and
        only the buffer check runs."""
        self.hash = layout.hash
        for alloc, (chunks, size, live, peak) in zip(self.buf_tallocs, layout.tallocs):
            alloc.chunks, alloc.size, alloc.live, alloc.peak = chunks, size, live, peak
        self.realloc_buffers()

    def realloc_buffers(self) -> None:
        """Reallocate buffers if needed (904-946): when there is no buffer yet, or some chunk of the
        new layout is bigger than the same chunk of the current buffer. The new buffer then takes
        the new layout as it is, so other chunks, and the total, can shrink."""
        for i, alloc in enumerate(self.buf_tallocs):
            for j in range(i):
                if self.buf_tallocs[j] is alloc:
                    self.buffers[i] = self.buffers[j]
                    break
            buf = self.buffers[i]
            realloc = buf is None
            for c, chunk in enumerate(alloc.chunks):
                cur = buf.chunks[c] if buf is not None and c < len(buf.chunks) else 0
                if chunk.max_size > cur:
                    realloc = True
            if realloc:
                self.buffers[i] = Vbuffer([chunk.max_size for chunk in alloc.chunks])

    def reserve_n_size(self, graph: Cgraph, node_buffer_ids: list[int], leaf_buffer_ids: list[int]) -> list[int]:
        """ggml_gallocr_reserve_n_size (951-960): the layout only; per buffer id, its chunks' sizes summed."""
        self.reserve_layout(graph, node_buffer_ids, leaf_buffer_ids)
        return [sum(chunk.max_size for chunk in alloc.chunks) for alloc in self.buf_tallocs]

    def buffer_size(self, buffer_id: int) -> int:
        """ggml_gallocr_get_buffer_size (1100-1116): 0 without a buffer, 0 for a buffer already
        counted under a lower id (same buffer type), else the sum of its chunks."""
        buf = self.buffers[buffer_id]
        if buf is None or any(self.buffers[i] is buf for i in range(buffer_id)):
            return 0
        return sum(buf.chunks)

    def chunk_sizes(self, buffer_id: int) -> list[int]:
        buf = self.buffers[buffer_id]
        return list(buf.chunks) if buf is not None else []

    def peak(self, buffer_id: int) -> Optional[Peak]:
        """Where this buffer id's allocator stood when it last grew during the last reserve (its
        size is that graph's own need, which the buffer may exceed); None if it holds nothing."""
        return self.buf_tallocs[buffer_id].peak

    def lifetime(self, t: Tensor) -> Optional[tuple[int, Optional[int]]]:
        """(first, last) node indexes in which the last reserve gave t memory of its own (last None:
        never freed); None for views and tensors with memory of their own (weights, KV)."""
        if t.view_src is not None or t.buffer is not None:
            return None
        hn = self.hash.get(t)
        return (hn.first, hn.last) if hn is not None and hn.size else None

    def tensor_alloc(self, t: Tensor) -> Optional[TensorAlloc]:
        """Where the last reserve put t; None for tensors with memory of their own (weights, KV)
        and views of them. A view lies at its view_src's address plus view_offs."""
        base = t.view_src if t.view_src is not None else t
        if base.buffer is not None:
            return None
        hn = self.hash.get(base)
        if hn is None:
            return None
        if t.view_src is not None:
            return TensorAlloc(hn.buffer_id, hn.chunk, hn.offset + t.view_offs, 0)
        return TensorAlloc(hn.buffer_id, hn.chunk, hn.offset, hn.size)


def alloc_ctx_tensors(buft: BufferType, tensors: list[Tensor], usage: str) -> Buffer:
    """ggml_backend_alloc_ctx_tensors_from_buft for tensors that fit one buffer: in creation order,
    each padded to the buffer type's alignment (weights, KV cache)."""
    buf = Buffer(buft, usage)
    offset = 0
    for t in tensors:
        t.buffer, t.offset = buf, offset
        offset += aligned_size(buft.alloc_size(t), buft.alignment)
    buf.size = offset
    return buf
