"""The graph allocator against ggml-alloc.c's arithmetic, worked by hand for small graphs.

Each test states, step by step, what ggml_dyn_tallocr / ggml_gallocr do (line numbers are in
ggml/src/ggml-alloc.c at llama.cpp 0c1e57098). Sizes are F32: 4 bytes per element. "big" is the
open tail block of a chunk (SIZE_MAX/2 when the buffer type has no max_size).
"""
from __future__ import annotations

from schedplan.backends.types import SIZE_MAX, BufferType
from schedplan.planner import ggml
from schedplan.planner.gallocr import (
    Gallocr, TensorAlloc, dyn_tallocr_alloc, dyn_tallocr_free_bytes, dyn_tallocr_new,
)
from schedplan.planner.ggml import FLAG_INPUT, Buffer, Cgraph, Tensor

F32 = int(ggml.T.F32)


def buft(name: str = "CPU", alignment: int = 32, max_size: int = SIZE_MAX, **kw) -> BufferType:
    return BufferType(name, alignment, max_size, **kw)


def leaf(name: str, *ne: int, flags: int = FLAG_INPUT) -> Tensor:
    t = ggml.new_tensor(F32, *ne)
    t.name, t.flags = name, flags
    return t


def weight(name: str, *ne: int) -> Tensor:
    """A tensor with memory of its own (data != NULL in C): gallocr leaves it alone."""
    t = leaf(name, *ne, flags=0)
    t.buffer = Buffer(buft("CPU_Mapped"), "weights")
    return t


def node(name: str, op: str, srcs: list, n: int, flags: int = 0) -> Tensor:
    """A compute node of n F32 elements; only op, srcs, layout and flags matter to the allocator."""
    t = ggml.new_tensor(F32, n)
    t.name, t.op, t.src, t.flags = name, op, list(srcs), flags
    return t


def reserve(bufts: list[BufferType], nodes: list[Tensor], leafs: list[Tensor],
            node_ids: list[int] | None = None, leaf_ids: list[int] | None = None,
            galloc: Gallocr | None = None) -> Gallocr:
    galloc = galloc or Gallocr(bufts)
    galloc.reserve_n(Cgraph(nodes=nodes, leafs=leafs), node_ids or [0] * len(nodes), leaf_ids or [0] * len(leafs))
    return galloc


def at(galloc: Gallocr, t: Tensor) -> tuple[int, int]:
    a = galloc.tensor_alloc(t)
    return (a.chunk, a.offset)


# --- dyn_tallocr on its own -------------------------------------------------------------------

def test_max_chunk_size_is_clamped_to_half_size_max():
    # ggml_dyn_tallocr_new (371): MIN(max_buffer_size, SIZE_MAX/2)
    assert dyn_tallocr_new(32, SIZE_MAX).max_chunk_size == SIZE_MAX // 2
    assert dyn_tallocr_new(32, 4096).max_chunk_size == 4096


def test_last_block_smallest_non_negative_reuse_wins_across_chunks():
    a = dyn_tallocr_new(32, 4096)
    # 4096 -> new chunk 0, block [0,4096) used up and removed (266-268); max0 = 4096
    assert dyn_tallocr_alloc(a, 4096) == (0, 0)
    # 2048: chunk 0 has no free block left -> new chunk 1 of max(2048, 4096); block (2048,2048)
    assert dyn_tallocr_alloc(a, 2048) == (1, 0)
    # 2048: chunk 1's last block, reuse 2048-2048-2048 < 0 -> (1,2048); block removed; max1 = 4096
    assert dyn_tallocr_alloc(a, 2048) == (1, 2048)
    dyn_tallocr_free_bytes(a, 0, 0, 4096)      # chunk 0: [(0,4096)]
    dyn_tallocr_free_bytes(a, 1, 2048, 2048)   # chunk 1: [(2048,2048)]
    # 2048: no non-last blocks. chunk 0: reuse 4096-0-2048 = 2048 (better_reuse, from INT64_MIN);
    # chunk 1: reuse 4096-2048-2048 = 0, better_fit (0 <= 0 < 2048) -> chunk 1
    assert dyn_tallocr_alloc(a, 2048) == (1, 2048)
    assert [c.max_size for c in a.chunks] == [4096, 4096]


def test_sixteenth_chunk_is_virtually_endless():
    a = dyn_tallocr_new(32, 1024)
    # each 1024 fills a fresh chunk of max(1024, 1024); the 16th (index 15) gets SIZE_MAX/2 (172-174)
    for c in range(16):
        assert dyn_tallocr_alloc(a, 1024) == (c, 0)
    assert a.chunks[15].free_blocks[0].size == SIZE_MAX // 2 - 1024
    # the 17th lands in chunk 15's tail (reuse 1024-1024-1024 < 0) instead of a 17th chunk
    assert dyn_tallocr_alloc(a, 1024) == (15, 1024)
    assert len(a.chunks) == 16


def test_free_merges_with_both_neighbours():
    a = dyn_tallocr_new(32, SIZE_MAX)
    assert [dyn_tallocr_alloc(a, 100) for _ in range(3)] == [(0, 0), (0, 128), (0, 256)]   # 100 -> 128
    dyn_tallocr_free_bytes(a, 0, 0, 100)       # no neighbour: insert -> [(0,128), (384,big)]
    dyn_tallocr_free_bytes(a, 0, 256, 100)     # ends at 384: offset 256 -> [(0,128), (256,big)]
    dyn_tallocr_free_bytes(a, 0, 128, 100)     # after (0,128), and then (256,...) follows: one block
    assert [(b.offset, b.size) for b in a.chunks[0].free_blocks] == [(0, SIZE_MAX // 2)]


# --- gallocr -----------------------------------------------------------------------------------

def matmul_chain(n_tok: int = 8):
    """x[64,n] -> h1 = w1 x [128,n] -> h2 = w2 h1 [64,n] -> h3 = w1 h2 [128,n]; weights external."""
    w1, w2 = weight("w1", 64, 128), weight("w2", 128, 64)
    x = leaf("x", 64, n_tok)
    h1 = ggml.mul_mat(w1, x)
    h2 = ggml.mul_mat(w2, h1)
    h3 = ggml.mul_mat(w1, h2)
    h3.set_output()
    return [h1, h2, h3], [w1, w2, x]


def test_matmul_chain():
    nodes, leafs = matmul_chain()
    h1, h2, h3 = nodes
    w1, w2, x = leafs
    g = reserve([buft()], nodes, leafs)
    # leafs: w1, w2 have memory (skipped); x (2048) -> new chunk, (0,0); tail (2048,big)
    # h1 (4096): only the tail; reuse 2048-2048-4096 < 0 -> 2048; max 6144. x freed -> [(0,2048),(6144,big)]
    # h2 (2048): best fit among non-last blocks: (0,2048), exact -> 0, block removed.
    #   h1 freed: 2048+4096 == 6144, the tail starts there -> tail becomes (2048,big)
    # h3 (4096): tail, reuse 6144-2048-4096 = 0 -> 2048. h2 freed -> [(0,2048),(6144,big)]
    assert [at(g, t) for t in (x, h1, h2, h3)] == [(0, 0), (0, 2048), (0, 0), (0, 2048)]
    assert g.tensor_alloc(h3) == TensorAlloc(0, 0, 2048, 4096)
    assert g.tensor_alloc(w1) is None and g.tensor_alloc(w2) is None
    assert g.buffer_size(0) == 6144 and g.chunk_sizes(0) == [6144]
    # the buffer last grew with h1 (node 0), while x and h1 held memory
    p = g.peak(0)
    assert (p.node, p.size, p.tensors) == (0, 6144, [x, h1])


def test_alignment_32_vs_128():
    def graph():
        w = weight("w", 100, 100)
        x = leaf("x", 100)                  # 400 bytes
        a = ggml.mul_mat(w, x)              # 400
        b = ggml.mul_mat(w, a)              # 400
        return [a, b], [w, x]

    # align 32: 400 -> 416. x 0; a 416 (tail), x freed -> (0,416) hole; b fits the hole -> 0
    nodes, leafs = graph()
    g = reserve([buft(alignment=32)], nodes, leafs)
    assert [at(g, t) for t in (leafs[1], *nodes)] == [(0, 0), (0, 416), (0, 0)]
    assert g.buffer_size(0) == 832
    assert g.tensor_alloc(nodes[0]).size_max == 400   # the unpadded alloc size (868)
    # align 128: 400 -> 512, same walk
    nodes, leafs = graph()
    g = reserve([buft(alignment=128)], nodes, leafs)
    assert [at(g, t) for t in (leafs[1], *nodes)] == [(0, 0), (0, 512), (0, 0)]
    assert g.buffer_size(0) == 1024


def test_inplace_chain_with_one_child():
    x = leaf("x", 100)                      # 416 after padding
    a = ggml.scale(x, 2.0)
    b = ggml.scale(a, 2.0)
    g = reserve([buft()], [a, b], [x])
    # a: SCALE can be in place, x is own, not OUTPUT, same layout, 1 child, 0 views -> x's address;
    # b likewise on a. Nothing else is ever allocated.
    assert [at(g, t) for t in (x, a, b)] == [(0, 0)] * 3
    assert g.buffer_size(0) == 416
    # the peak was x's allocation (leaf phase); b owns that memory now, but the snapshot is x
    p = g.peak(0)
    assert (p.node, p.tensors) == (-1, [x])


def test_inplace_needs_exactly_one_remaining_child():
    x = leaf("x", 100)
    a = ggml.scale(x, 2.0)
    b = ggml.scale(x, 3.0)
    g = reserve([buft()], [a, b], [x])
    # a: x has 2 children -> no reuse; a gets the tail: 416. x's count drops to 1.
    # b: x now has 1 child (657 reads the remaining count) -> in place at 0
    assert [at(g, t) for t in (x, a, b)] == [(0, 0), (0, 416), (0, 0)]
    assert g.buffer_size(0) == 832


def test_inplace_on_a_parent_whose_other_child_already_ran():
    x = leaf("x", 100)
    a = ggml.scale(x, 2.0)                  # in place on x: 0
    b = ggml.scale(a, 2.0)                  # a has 2 children (b, c): new, 416; a -> 1 child
    c = ggml.add(a, b)                      # a has 1 child left: in place on a -> 0
    g = reserve([buft()], [a, b, c], [x])
    # after c: a is not freed (its allocated flag went to c), b is freed and merges with the tail
    assert [at(g, t) for t in (x, a, b, c)] == [(0, 0), (0, 0), (0, 416), (0, 0)]
    assert g.buffer_size(0) == 832


def test_inplace_frees_the_parents_extra_space():
    # a buffer type whose alloc size pads op-less tensors (allowed for ggml_op_is_empty ops)
    pad = buft(alloc_size_fn=lambda t: t.nbytes + (64 if t.op == "NONE" else 0))
    x = leaf("x", 100)                      # 464 -> 480
    a = ggml.scale(x, 2.0)                  # 400 -> 416
    b = node("b", "MUL_MAT", [a], 100)      # 416
    g = reserve([pad], [a, b], [x])
    # a in place on x; free_extra_space (600-621) frees [416,480): it touches the tail (480,big) -> (416,big)
    # b: tail, reuse 480-416-416 < 0 -> 416; max 832 (without the extra free: 480+416 = 896)
    assert [at(g, t) for t in (x, a, b)] == [(0, 0), (0, 0), (0, 416)]
    assert g.tensor_alloc(x).size_max == 464 and g.tensor_alloc(a).size_max == 400
    assert g.buffer_size(0) == 832


def test_output_is_never_freed_nor_reused_in_place():
    def graph(output: bool):
        w = weight("w", 64, 64)
        x = leaf("x", 64, 8)                # 2048
        a = ggml.mul_mat(w, x)              # 2048
        if output:
            a.set_output()
        b = ggml.scale(a, 2.0)              # 2048, in-place candidate on a
        c = ggml.mul_mat(w, b)              # 2048
        return [a, b, c], [w, x]

    # OUTPUT a: x 0; a 2048 (max 4096); x freed -> [(0,2048),(4096,big)]
    #   b: a is OUTPUT (646) -> allocates: hole (0,2048) -> 0. a's children reach 0 but free_node
    #   returns for outputs (693). c: tail (4096,big), reuse 4096-4096-2048 < 0 -> 4096; max 6144
    nodes, leafs = graph(output=True)
    g = reserve([buft()], nodes, leafs)
    assert [at(g, t) for t in nodes] == [(0, 2048), (0, 0), (0, 4096)]
    assert g.buffer_size(0) == 6144
    # without OUTPUT: b in place on a (2048); a's memory passes to b; c takes x's hole at 0
    nodes, leafs = graph(output=False)
    g = reserve([buft()], nodes, leafs)
    assert [at(g, t) for t in nodes] == [(0, 2048), (0, 2048), (0, 0)]
    assert g.buffer_size(0) == 4096


def test_views_and_reshapes_take_their_sources_memory():
    x = leaf("x", 64, 8)                    # 2048
    r = ggml.reshape(x, 512)                # view of x (op RESHAPE): x.n_views = 1
    a = ggml.scale(r, 2.0)                  # 2048, not a view
    v = ggml.view(a, (128,), (), 1024)      # view of a at +1024: a.n_views = 1
    c = ggml.cont(v)                        # 512
    g = reserve([buft()], [r, a, v, c], [x])
    # x: 0. r: skipped (view); x's children reach 0 but it has a view -> kept.
    # a: SCALE, but its parent r is a view, never own -> no reuse; tail -> 2048; max 4096.
    #   r's children reach 0 -> x.n_views 0, x.n_children 0 -> x freed: [(0,2048),(4096,big)]
    # v: skipped; a's children reach 0, views 1 -> kept.
    # c (512): best fit (0,2048) -> 0, block (512,1536). v's children reach 0 -> a freed:
    #   (512,1536) ends at 2048 -> (512,3584), which now ends at 4096 = tail -> one block (512,big)
    assert g.tensor_alloc(x) == TensorAlloc(0, 0, 0, 2048)
    assert g.tensor_alloc(r) == TensorAlloc(0, 0, 0, 0)
    assert g.tensor_alloc(a) == TensorAlloc(0, 0, 2048, 2048)
    assert g.tensor_alloc(v) == TensorAlloc(0, 0, 3072, 0)
    assert g.tensor_alloc(c) == TensorAlloc(0, 0, 0, 512)
    assert g.buffer_size(0) == 4096
    assert [(b.offset, b.size) for b in g.buf_tallocs[0].chunks[0].free_blocks] == [(512, SIZE_MAX // 2 - 512)]


def test_views_of_tensors_with_memory_are_not_placed():
    kv = weight("cache_k", 128, 16)
    k = ggml.view(kv, (128, 4), (512,), 0)
    q = leaf("q", 128)
    s = ggml.mul_mat(k, q)
    g = reserve([buft()], [k, s], [kv, q])
    assert g.tensor_alloc(kv) is None and g.tensor_alloc(k) is None
    assert at(g, q) == (0, 0) and at(g, s) == (0, 512)


def test_input_nodes_are_allocated_before_the_walk():
    def graph(input_flag: int):
        w = weight("w", 256, 256)
        x = leaf("x", 256)                                  # 1024
        n0 = ggml.mul_mat(w, x)                             # 1024
        n1 = node("n1", "CONT", [], 256, flags=input_flag)  # 1024
        n2 = ggml.add(n0, n1)
        return [n0, n1, n2], [w, x]

    # INPUT n1 is allocated while children are counted (744-746), before n0: x 0, n1 1024, n0 2048;
    # n2 in place on n0. Then n1 is freed and merges with x's hole: [(0,2048),(3072,big)]
    nodes, leafs = graph(FLAG_INPUT)
    g = reserve([buft()], nodes, leafs)
    assert [at(g, t) for t in nodes] == [(0, 2048), (0, 1024), (0, 2048)]
    assert g.buffer_size(0) == 3072
    # without the flag: n0 1024 (x freed after), n1 in x's hole at 0, n2 in place on n0
    nodes, leafs = graph(0)
    g = reserve([buft()], nodes, leafs)
    assert [at(g, t) for t in nodes] == [(0, 1024), (0, 0), (0, 1024)]
    assert g.buffer_size(0) == 2048


def test_unused_leafs_are_allocated_and_kept():
    w = weight("w", 256, 256)
    u = leaf("inp_embd", 256)               # in the graph, used by nothing
    x = leaf("x", 256)
    h = ggml.mul_mat(w, x)
    g = reserve([buft()], [h], [w, u, x])
    # every leaf is allocated first (725-728): u 0, x 1024; h 2048; only x is freed
    assert [at(g, t) for t in (u, x, h)] == [(0, 0), (0, 1024), (0, 2048)]
    assert g.buffer_size(0) == 3072


def test_best_fit_ties_go_to_the_later_block():
    p, q, r, s, t = (leaf(n, 256) for n in "pqrst")    # 1024 each: 0, 1024, 2048, 3072, 4096
    n0 = node("n0", "MUL_MAT", [p, r], 8)              # 32: tail -> 5120
    n1 = node("n1", "MUL_MAT", [q, s, t], 256)         # 1024
    g = reserve([buft()], [n0, n1], [p, q, r, s, t])
    # after n0, p and r are freed: [(0,1024), (2048,1024), (5152,big)]
    # n1: both holes fit with size 1024; `<=` (218) moves the choice to the later one -> 2048
    assert at(g, n0) == (0, 5120)
    assert at(g, n1) == (0, 2048)
    assert g.buffer_size(0) == 5152


def test_best_fit_restarts_in_each_chunk():
    A, B = leaf("A", 256), leaf("B", 256)              # 1024 each
    G = leaf("G", 512)                                 # 2048
    D = leaf("D", 512)                                 # 2048
    E, F = leaf("E", 256), leaf("F", 256)              # 1024 each
    n0 = node("n0", "MUL_MAT", [A, G, D, F], 8)        # 32
    n1 = node("n1", "MUL_MAT", [B, E], 256)            # 1024
    g = reserve([buft(max_size=4096)], [n0, n1], [A, B, G, D, E, F])
    # chunk 0 (4096): A 0, B 1024, G 2048 (fills it). chunk 1 (4096): D 0, E 2048, F 3072.
    # n0: no free block anywhere -> chunk 2: (2,0). Then A, G, D, F freed:
    #   chunk 0 [(0,1024),(2048,2048)], chunk 1 [(0,2048),(3072,1024)], chunk 2 [(32,4064)]
    # n1 (1024): chunk 0's exact hole (0,1024) is found, but best_fit_size restarts at SIZE_MAX for
    #   chunk 1 (214), whose non-last (0,2048) also fits -> (1,0)
    assert [at(g, t) for t in (A, B, G, D, E, F)] == [(0, 0), (0, 1024), (0, 2048), (1, 0), (1, 2048), (1, 3072)]
    assert at(g, n0) == (2, 0)
    assert at(g, n1) == (1, 0)
    assert g.chunk_sizes(0) == [4096, 4096, 32]


def chunked_chain():
    x = leaf("x", 512)                                 # 2048
    a = node("a", "MUL_MAT", [x], 512)                 # 2048
    b = node("b", "MUL_MAT", [a], 1024)                # 4096
    c = node("c", "MUL_MAT", [b], 1536)                # 6144 > max_size
    d = node("d", "MUL_MAT", [c], 512)                 # 2048
    return [a, b, c, d], [x]


def test_small_max_size_forces_chunks():
    nodes, leafs = chunked_chain()
    g = reserve([buft(max_size=4096)], nodes, leafs)
    # x: chunk 0 of max(2048, 4096); a: chunk 0's tail (2048,2048) (reuse -2048) -> (0,2048), chunk 0 full.
    #   x freed -> chunk 0 [(0,2048)]: its only, hence "last", block.
    # b (4096): that block is too small -> chunk 1 of 4096 -> (1,0). a freed -> chunk 0 [(0,4096)]
    # c (6144): nothing fits -> chunk 2 of max(6144, 4096) = 6144 (171) -> (2,0). b freed -> chunk 1 [(0,4096)]
    # d (2048): last blocks only. chunk 0: reuse 4096-0-2048 = 2048; chunk 1: also 2048, not
    #   smaller -> stays chunk 0 -> (0,0)
    assert [at(g, t) for t in (*leafs, *nodes)] == [(0, 0), (0, 2048), (1, 0), (2, 0), (0, 0)]
    assert g.chunk_sizes(0) == [4096, 4096, 6144]
    assert g.buffer_size(0) == 14336


def test_buffers_grow_across_reserves_but_do_not_shrink_for_smaller_graphs():
    g = reserve([buft()], *matmul_chain(8))
    assert g.buffer_size(0) == 6144
    # 16 tokens: x 4096 at 0, h1 8192 at 4096 -> 12288 > 6144: reallocated (921)
    g = reserve([buft()], *matmul_chain(16), galloc=g)
    assert g.buffer_size(0) == 12288
    # 8 tokens again: 6144 <= 12288 -> the buffer is kept; offsets are the new graph's
    nodes, leafs = matmul_chain(8)
    g = reserve([buft()], nodes, leafs, galloc=g)
    assert g.buffer_size(0) == 12288 and g.chunk_sizes(0) == [12288]
    assert at(g, nodes[0]) == (0, 2048)
    # the peak is the last graph's own: h1 (node 0) with x, 6144 bytes, below the buffer's 12288
    p = g.peak(0)
    assert (p.node, p.size, p.tensors) == (0, 6144, [leafs[2], nodes[0]])


def test_a_reallocation_takes_the_new_layout_even_when_smaller():
    b = buft(max_size=4096)
    g = reserve([b], *chunked_chain())
    assert g.chunk_sizes(0) == [4096, 4096, 6144]
    # one 8192-byte tensor: chunk 0 of max(8192, 4096) = 8192 > 4096 -> reallocate (921-923) with
    # the new layout only: [8192], smaller in total than 14336
    g = reserve([b], [], [leaf("big", 2048)], galloc=g)
    assert g.chunk_sizes(0) == [8192] and g.buffer_size(0) == 8192
    # 2048 bytes: chunk 0 needs 2048 <= 8192 -> no reallocation
    g = reserve([b], [], [leaf("small", 512)], galloc=g)
    assert g.chunk_sizes(0) == [8192]


def test_backends_sharing_a_buffer_type_share_one_allocator_and_buffer():
    cpu, gpu, other = buft("CPU", 32), buft("GPU", 256), buft("Other", 32)
    w = weight("w", 256, 256)
    x = leaf("x", 256)                                  # 1024, backend 0 (CPU)
    n0 = node("n0", "MUL_MAT", [w, x], 100)             # 400 -> 512 with alignment 256, backend 1
    n1 = node("n1", "MUL_MAT", [w, n0], 256)            # 1024, backend 2 (CPU again)
    g = reserve([cpu, gpu, cpu, other], [n0, n1], [w, x], node_ids=[1, 2], leaf_ids=[0, 0])
    assert g.buf_tallocs[0] is g.buf_tallocs[2]
    # CPU: x (0,0); n0 goes to GPU (0,0); x freed -> CPU tail back to (0,big); n1 on backend 2
    # uses the CPU allocator: tail, reuse 1024-0-1024 = 0 -> (0,0). CPU max stays 1024.
    assert g.tensor_alloc(x) == TensorAlloc(0, 0, 0, 1024)
    assert g.tensor_alloc(n0) == TensorAlloc(1, 0, 0, 400)
    assert g.tensor_alloc(n1) == TensorAlloc(2, 0, 0, 1024)
    # ggml_gallocr_get_buffer_size: the shared buffer counts once, under its lowest id (1107-1113);
    # a buffer type with no tensors still gets a (zero-sized) buffer (914-915)
    assert [g.buffer_size(i) for i in range(4)] == [1024, 512, 0, 0]
    assert g.chunk_sizes(2) == [1024] and g.chunk_sizes(3) == []


def test_no_buffer_before_the_first_reserve():
    g = Gallocr([buft()])
    assert g.buffer_size(0) == 0 and g.chunk_sizes(0) == [] and g.peak(0) is None


def test_view_node_with_op_none_is_not_counted_so_its_source_is_never_freed():
    def graph(view_op: str):
        w = weight("w", 512, 512)
        x = leaf("x", 512)                                  # 2048
        a = ggml.mul_mat(w, x)                              # 2048
        d = ggml.view_tensor(a)                             # view of a, no src (a sched dependency)
        d.op = view_op
        b = node("b", "MUL_MAT", [d], 512)                  # 2048
        c = node("c", "MUL_MAT", [b], 512)                  # 2048
        return [a, d, b, c], [w, x]

    # VIEW: a.n_views = 1 (739). x 0; a 2048 (max 4096); x freed -> [(0,2048),(4096,big)]; d skipped;
    #   b takes the hole at 0; d's children reach 0 -> a.n_views 0 -> a freed (809-814), merging into
    #   the tail (2048,big); c: reuse 4096-2048-2048 = 0 -> 2048
    nodes, leafs = graph("VIEW")
    g = reserve([buft()], nodes, leafs)
    assert [at(g, t) for t in nodes] == [(0, 2048), (0, 2048), (0, 0), (0, 2048)]
    assert g.buffer_size(0) == 4096
    # NONE: not counted, but still decremented at 809: a.n_views = -1, a is never freed; c -> 4096
    nodes, leafs = graph("NONE")
    g = reserve([buft()], nodes, leafs)
    assert [at(g, t) for t in nodes] == [(0, 2048), (0, 2048), (0, 0), (0, 4096)]
    assert g.buffer_size(0) == 6144
