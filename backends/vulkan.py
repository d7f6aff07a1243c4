"""Vulkan devices: ggml/src/ggml-vulkan/ggml-vulkan.cpp of llama.cpp 0c1e57098 ("vk:" lines). The
rules are read from that source and unit-tested against its arithmetic; no GPU has measured them.

- device, backend and buffer type "Vulkan<n>" (vk:16117, 5427); type GPU (an integrated device,
  IGPU, is not modelled: it turns mmap off); caps async + events + host buffer (vk:15285-15291);
- buffer type: alignment minStorageBufferOffsetAlignment (a device parameter, vk:13034), max size the
  suballocation block size (vk:13039): 1 GiB, or maxMemoryAllocationSize when smaller (vk:4210-4218),
  so gallocr splits a bigger compute buffer into chunks of at most that; alloc size ggml_nbytes;
- host buffer type "Vulkan_Host" (vk:13060-13125): alignment minMemoryMapAlignment (a device
  parameter), max size device 0's suballocation block size, the CPU's alloc size, is_host, and
  alloc_buffer asks for 32 bytes more than requested ("behave like the CPU buffer type", vk:13080),
  which ggml_backend_buffer_get_size then reports;
- supports_buft: its own buffer type only (vk:15962); offload_op: batch >= 32 with the CUDA batch
  rule (vk:15973, ggml-vulkan-debug.cpp:766, vk:16111);
- supports_op (vk:15300-15960) for the ops schedplan builds, after the size test: no tensor over
  max_buffer_size (maxMemoryAllocationSize without maintenance4) or maxStorageBufferRange (taken as
  4 GiB - 1, without VK_EXT_shader_64bit_indexing); FLASH_ATTN_EXT assumes subgroup shuffle and
  vote (scalar/coopmat1 path), which desktop drivers have;
- graph_optimize (vk:14663-15040): reorders each split's nodes to group independent work, keeps
  fusion patterns together and pulls ROPE/RMS_NORM -> VIEW -> SET_ROWS and MUL_MAT -> ADD -> ADD
  chains forward.

Not modelled: the graph_optimize rules for ops no planned architecture builds (ARGSORT, TOP_K, SIN,
UNARY, MUL_MAT_ID, ADD_ID, SSM_CONV, DSV4_HC_POST): a split with them raises NotImplementedError.
The use counts of ggml_can_fuse_subgraph_ext are counted over the split's nodes (the C reads the
whole graph's); they differ only for a pulled ROPE/RMS_NORM that is also read outside its split.
"""
from __future__ import annotations

from .cuda import op_batch_size
from .layout import (
    GGML_MAX_SRC, can_fuse_subgraph, is_contiguous, is_contiguous_rows, op_is_empty, op_param, src, tname, use_counts,
)
from .types import Backend, BufferType
from ..planner.ggml import Tensor, blck_size, is_quantized, type_size

GiB = 1024**3
SUBALLOCATION_BLOCK_SIZE = GiB        # vk:4216
MAX_STORAGE_BUFFER_RANGE = 2**32 - 1
OP_OFFLOAD_MIN_BATCH = 32
HOST_BUFFER_EXTRA = 32                # vk:13080

MUL_MAT_TYPES = {"F32", "F16", "BF16", "Q1_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                 "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL",
                 "MXFP4", "NVFP4", "TQ1_0", "TQ2_0"}                                         # vk:15390-15420
GET_ROWS_TYPES = MUL_MAT_TYPES | {"I32"}                                                     # vk:15499-15535
FA_KV_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "IQ4_NL"}     # vk:15471-15485
QUANT_CPY = {"F32", "F16", "BF16", "Q1_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"}  # vk:15567-15600
SET_ROWS_DST = QUANT_CPY                                                                     # vk:15545-15558


def _dim01_contiguous(t: Tensor) -> bool:
    """ggml_vk_dim01_contiguous (vk:6010)"""
    return (t.nb[0] == type_size(t.type) and t.nb[1] == t.nb[0] * t.ne[0] // blck_size(t.type)
            and (t.ne[3] == 1 or t.nb[3] == t.nb[2] * t.ne[2]))


def supports_op(max_buffer_size: int, t: Tensor) -> bool:
    """ggml_backend_vk_device_supports_op (vk:15300-15960) for the ops schedplan builds."""
    for x in [*(s for s in t.src[:GGML_MAX_SRC] if s is not None), t]:                 # vk:15307-15328
        if x.nbytes > max_buffer_size or x.nbytes > MAX_STORAGE_BUFFER_RANGE:
            return False
    op, s0, s1 = t.op, src(t, 0), src(t, 1)
    if op in ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "RMS_NORM"):
        return True                                                                  # vk:15633-15640
    if op == "GLU":                                                                  # vk:15361-15376
        return (op_param(t, 0) in range(7) and tname(s0) in ("F32", "F16") and t.type == s0.type
                and (s1 is None or s1.type == s0.type))
    if op == "MUL_MAT":                                                              # vk:15377-15450
        a, b = s0, s1
        if tname(a) not in MUL_MAT_TYPES or a.ne[3] != b.ne[3]:
            return False
        if (not (_dim01_contiguous(a) or tname(a) in ("F32", "F16", "BF16"))
                or not (_dim01_contiguous(b) or tname(b) in ("F32", "F16"))):
            return False
        if tname(a) == "BF16" and tname(b) == "F16":
            return False
        return not (tname(b) == "BF16" and tname(a) != "BF16")
    if op == "FLASH_ATTN_EXT":                                                       # vk:15451-15498
        k, v, mask, sinks = t.src[1], t.src[2], src(t, 3), src(t, 4)
        if k.ne[0] % 8 or v.ne[0] % 8:
            return False
        if (sinks is not None and tname(sinks) != "F32") or tname(s0) != "F32" or tname(t) != "F32":
            return False
        if mask is not None and tname(mask) != "F16":
            return False
        if tname(k) not in FA_KV_TYPES or tname(v) not in FA_KV_TYPES:
            return False
        return (tname(k) == "BF16") == (tname(v) == "BF16")
    if op == "GET_ROWS":
        return tname(s0) in GET_ROWS_TYPES
    if op == "SET_ROWS":                                                             # vk:15538-15560
        return tname(s0) in ("F32", "F16") and tname(s1) in ("I32", "I64") and tname(t) in SET_ROWS_DST
    if op in ("CONT", "CPY"):                                                        # vk:15561-15623
        a = tname(s0)
        b = tname(s1) if s1 is not None else a
        if (a == "F32" and b in QUANT_CPY) or (b == "F32" and a in QUANT_CPY - {"F32"}):
            return True
        if (a, b) in (("F16", "F16"), ("F32", "I32"), ("I32", "F32")):
            return True
        return (a == b and (not is_quantized(s0.type) or (is_contiguous(s0) and is_contiguous(t)))
                and type_size(s0.type) % 2 == 0)
    if op == "ROPE":
        return is_contiguous_rows(t) and is_contiguous_rows(s0)                     # vk:15631
    if op == "NORM":
        return tname(s0) == "F32" and tname(t) == "F32"                              # vk:15643-15645
    if op in ("ADD", "MUL"):
        return all(tname(x) in ("F32", "F16") for x in (s0, s1, t))                 # vk:15646-15652
    if op == "SCALE":
        return is_contiguous(s0) and tname(s0) == "F32"                              # vk:15727
    if op == "SOFT_MAX":                                                             # vk:15735-15737
        return is_contiguous(s0) and tname(s0) == "F32" and (s1 is None or tname(s1) in ("F32", "F16"))
    raise NotImplementedError(f"Vulkan supports_op: {op} is not modelled")


def offload_op(t: Tensor) -> bool:
    """ggml_backend_vk_device_offload_op (vk:15973)"""
    return op_batch_size(t) >= OP_OFFLOAD_MIN_BATCH


# --- graph_optimize (vk:14663-15040) -----------------------------------------------------------------

UNMODELLED_REORDER_OPS = {"ARGSORT", "TOP_K", "SIN", "UNARY", "MUL_MAT_ID", "ADD_ID", "SSM_CONV", "DSV4_HC_POST"}
# the fusion patterns whose ops the planned graphs can have (ggml-vulkan-types.h:549-557), in the
# order graph_optimize tries them
KEEP_PATTERNS = [
    ("RMS_NORM", "MUL", "ADD", "MUL"),
    ("RMS_NORM", "MUL", "ADD"),
    ("RMS_NORM", "MUL", "ROPE", "VIEW", "SET_ROWS"),
    ("RMS_NORM", "VIEW", "SET_ROWS"),
    ("ROPE", "VIEW", "SET_ROWS"),
]
NUM_TO_CHECK = 20


def _base(t: Tensor) -> Tensor:
    return t.view_src if t.view_src is not None else t


def _is_src_of(dst: Tensor, s: Tensor) -> bool:
    """is_src_of (vk:14676-14698): dst reads s, or their storage may overlap."""
    for i in range(GGML_MAX_SRC):
        d = src(dst, i)
        if d is s:
            return True
        if op_is_empty(dst.op) or op_is_empty(s.op):
            continue
        if d is not None and _base(d) is _base(s):
            return True
        ss = src(s, i)
        if ss is not None and _base(dst) is _base(ss):
            return True
    return _base(dst) is _base(s)


def graph_optimize(nodes: list[Tensor], add_alloc_dep) -> None:
    """ggml_vk_graph_optimize (vk:14663-15040), in place; adds no allocation dependencies for the
    modelled patterns (only the TOPK_MOE and HC_POST ones add them)."""
    for node in nodes:
        if node.op in UNMODELLED_REORDER_OPS:
            raise NotImplementedError(f"Vulkan graph_optimize: the rules around {node.op} are not modelled")
    n = len(nodes)
    counts = use_counts(nodes)
    used = [False] * n
    new_order: list[Tensor] = []
    done: set[int] = set()    # used_node_set: ids of the nodes already in new_order
    first_unused = 0

    def match(pattern, start: int) -> bool:
        return start + len(pattern) <= n and all(nodes[start + j].op == op and not used[start + j]
                                                 for j, op in enumerate(pattern))

    def settled_between(lo: int, hi: int) -> bool:
        """empty_or_scheduled_between (vk:14705)"""
        return all(used[v] or op_is_empty(nodes[v].op) for v in range(lo, hi))

    def take(idxs) -> None:
        nonlocal first_unused
        for i in idxs:
            new_order.append(nodes[i])
            done.add(id(nodes[i]))
            used[i] = True
        while first_unused < n and used[first_unused]:
            first_unused += 1

    while first_unused < n:
        pattern = next((p for p in KEEP_PATTERNS if match(p, first_unused)), None)    # vk:14781-14816
        if pattern is not None:
            take(range(first_unused, first_unused + len(pattern)))
            continue
        current = [first_unused]
        for j in range(first_unused + 1, min(first_unused + NUM_TO_CHECK, n)):
            if used[j] or op_is_empty(nodes[j].op) or any(match(p, j) for p in KEEP_PATTERNS):
                continue
            if any(not used[c] and _is_src_of(nodes[j], nodes[c]) and not _fusable_pair(nodes, c, j, current[-1],
                                                                                          settled_between)
                   for c in range(first_unused, j)):
                continue
            current.append(j)
            _pull_forward(nodes, j, current, used, done, counts)
        # second pass: views, unless that would split ADD -> ADD or ADD -> RMS_NORM (vk:15005-15027)
        if nodes[current[-1]].op != "ADD":
            for j in range(first_unused + 1, min(first_unused + NUM_TO_CHECK, n)):
                if used[j] or not op_is_empty(nodes[j].op):
                    continue
                if not any(not used[c] and _is_src_of(nodes[j], nodes[c]) and c not in current
                           for c in range(first_unused, j)):
                    current.append(j)
        take(current)
    nodes[:] = new_order


def _fusable_pair(nodes: list[Tensor], c: int, j: int, last: int, settled_between) -> bool:
    """The dependencies graph_optimize lets j follow c in one set (vk:14853-14862)."""
    a, b = nodes[c].op, nodes[j].op
    if c != last:
        return False
    if a == "RMS_NORM" and b == "MUL":
        return settled_between(c + 1, j)
    return j == c + 1 and (a, b) in (("MUL_MAT", "ADD"), ("ADD", "ADD"))


def _pull_forward(nodes: list[Tensor], j: int, current: list[int], used: list[bool], done: set[int],
                  counts: dict[int, int]) -> None:
    """After taking node j, pull its fusion partners into the set (vk:14866-14960)."""
    n = len(nodes)
    rope_idx = j
    if j > 0 and nodes[j].op == "MUL" and nodes[j - 1].op == "RMS_NORM":
        for k in range(j + 1, min(j + 15, n)):      # RMS_NORM + MUL: the ROPE that reads it
            r = nodes[k]
            if (r.op == "ROPE" and r.src[0] is nodes[j] and r.src[1].op == "NONE"
                    and (src(r, 2) is None or r.src[2].op == "NONE")):
                rope_idx = k
                current.append(k)
                used[k] = True
                break
    if nodes[rope_idx].op in ("ROPE", "RMS_NORM"):  # ROPE/RMS_NORM + VIEW + SET_ROWS, made consecutive
        view_idx = set_rows_idx = -1
        for k in range(rope_idx + 1, min(rope_idx + 15, n)):
            if used[k]:
                continue
            if view_idx == -1 and nodes[k].op == "VIEW" and nodes[k].src[0] is nodes[rope_idx]:
                view_idx = k
                continue
            if view_idx != -1 and nodes[k].op == "SET_ROWS" and nodes[k].src[0] is nodes[view_idx]:
                set_rows_idx = k
                break
        if set_rows_idx != -1:
            idxs = [rope_idx, view_idx, set_rows_idx]
            can_pull = can_fuse_subgraph(nodes, idxs, [nodes[rope_idx].op, "VIEW", "SET_ROWS"], [set_rows_idx], counts)
            for c in range(rope_idx + 1, set_rows_idx):
                if (can_pull and not used[c] and c != view_idx and not op_is_empty(nodes[c].op)
                        and _is_src_of(nodes[set_rows_idx], nodes[c])):
                    can_pull = False
            if can_pull:
                current += [view_idx, set_rows_idx]
                used[view_idx] = used[set_rows_idx] = True
    if j > 0 and nodes[j].op == "ADD" and nodes[j - 1].op == "MUL_MAT":
        for k in range(j + 1, min(j + 15, n)):      # MUL_MAT + ADD + ADD
            a = nodes[k]
            if a.op == "ADD" and a.src[0] is nodes[j] and (a.src[1].op == "NONE" or id(a.src[1]) in done):
                current.append(k)
                used[k] = True
                break


# --- the device ---------------------------------------------------------------------------------------

def vulkan_host_buft(map_alignment: int, max_size: int) -> BufferType:
    """ggml_backend_vk_host_buffer_type (vk:13105-13125), of device 0."""
    return BufferType("Vulkan_Host", map_alignment, max_size, is_host=True, device="Vulkan0",
                      buffer_extra=HOST_BUFFER_EXTRA)


def suballocation_block_size(max_allocation: int) -> int:
    """vk:4210-4218"""
    return min(SUBALLOCATION_BLOCK_SIZE, max_allocation)


def vulkan_backend(index: int, memory: int, alignment: int, max_allocation: int, host_buft: BufferType) -> Backend:
    """Device Vulkan<index>: `memory` bytes free, minStorageBufferOffsetAlignment `alignment`,
    maxMemoryAllocationSize `max_allocation`. All Vulkan devices share device 0's Vulkan_Host."""
    name = f"Vulkan{index}"
    buft = BufferType(name, alignment, suballocation_block_size(max_allocation), device=name)
    return Backend(name, "GPU", buft, supports_op=lambda t: supports_op(max_allocation, t),
                   supports_buft=lambda b: b is buft, offload_op=offload_op, host_buft=host_buft,
                   is_async_with_events=True, device_name=name, memory=memory, graph_optimize=graph_optimize)
