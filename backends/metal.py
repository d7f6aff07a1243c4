"""Metal devices: ggml/src/ggml-metal/ of llama.cpp 0c1e57098 ("mt:" ggml-metal.cpp, "dev:"
ggml-metal-device.m, "ops:" ggml-metal-ops.cpp, "fu:" ggml-metal-fusion.cpp, "co:"
ggml-metal-common.cpp). The rules are read from that source and unit-tested against its
arithmetic; no Mac has measured them.

The simulated device is Apple silicon (Apple7 family or later): unified memory, so buffers are
shared (dev:1269) and the default buffer type is "MTL<n>" (mt:307; "MTL<n>_Private" otherwise), with
SIMD-group reduction and matrix multiplication and bfloat (dev:1131-1142; bfloat off only under
GGML_METAL_BF16_DISABLE, or on an M5-class chip whose tensor API fails a bfloat test compile,
dev:1212-1257: not modelled), and maxThreadgroupMemoryLength 32 KiB (dev:1288), what every Apple GPU
family since Apple4 has: it decides only whether the FWHT kernels of widths 1024-8192 exist (all
of them do at 32 KiB).

- type GPU (mt:682), caps async + events + buffer_from_host_ptr, no host buffer type (mt:695-701):
  mmapped weights of a Metal layer are mapped from the file as "MTL<n>_Mapped" (mt:458; llama-model.cpp
  1854: the default buffer type of a device with buffer_from_host_ptr);
- buffer types: alignment 32, max size maxBufferLength (a device parameter, dev:1287), get_alloc_size
  (mt:220-253): FLASH_ATTN_EXT adds its pad, blk, tmp, kv_f16 and idx scratch (ops:3064-3230),
  MUL_MAT_ID its tpe, ids and amax scratch (ops:2650-2673), CUMSUM and ARGSORT double, TOP_K is
  2*4*nelements(src0);
- supports_buft: its own default, private or mapped buffer types (mt:753);
- offload_op: MUL_MAT and MUL_MAT_ID only, batch (ne[1], ne[2]) >= 32 (mt:763-779, dev:1285);
- supports_op (dev:1539-1960): the whole switch, every op;
- graph_optimize (mt:564): allocation dependencies for every raw run of a fusion pattern's ops
  (fu:705-765), then ggml_graph_optimize (co:453-507): nodes are packed into fusion groups by the
  whole fusion table (fu:674-701: norms, add chains, snake, the delta net's cache write, top-k MoE
  routing, the MoE reduction, SSM_CONV + SiLU; fu:1083) and reordered for concurrency by their
  memory ranges (co:264-451). The fusion tests read the whole graph's use counts
  (ggml_node_get_use_count), which the scheduler hands to graph_optimize. The allocation
  dependencies are added whatever GGML_METAL_FUSION_DISABLE says; GGML_METAL_GRAPH_OPTIMIZE_DISABLE
  (ggml-metal-context.m:151) is taken unset.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import Callable

from .layout import (
    GGML_MAX_SRC, can_fuse_subgraph, is_contiguous_1, is_contiguous_rows, is_transposed, op_is_empty,
    op_param, same_layout, same_shape, src, tname,
)
from .types import Backend, BufferType
from ..planner import ggml
from ..planner.ggml import FLAG_OUTPUT, GGML_HINT_SRC0_IS_HADAMARD, Tensor

ALIGNMENT = 32
OP_OFFLOAD_MIN_BATCH = 32
OP_FLASH_ATTN_EXT_NQPSG, OP_FLASH_ATTN_EXT_NCPSG = 8, 64              # ggml-metal-impl.h:126-127
OP_FLASH_ATTN_EXT_VEC_NQPSG, OP_FLASH_ATTN_EXT_VEC_NCPSG = 1, 32      # ggml-metal-impl.h:129-130
N_MM_NPART_AMAX = 256                                                  # ggml-metal-impl.h:17


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


# --- get_alloc_size (mt:220-253) -------------------------------------------------------------------

def _fa_use_vec(t: Tensor) -> bool:
    """ggml_metal_op_flash_attn_ext_use_vec (ops:2949): small batch, head size a multiple of 32."""
    q = t.src[0]
    return q.ne[1] < 20 and q.ne[0] % 32 == 0


def _fa_use_kv_f16(t: Tensor) -> bool:
    """ops:2961: a quantized K is dequantized to f16 for batches of 32 or more."""
    return t.src[0].ne[1] >= 32 and tname(t.src[1]) in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def _fa_v_is_view_of_k(t: Tensor) -> bool:
    """ops:3043"""
    k, v = t.src[1], t.src[2]
    return v.view_src is not None and (v.view_src is k or (v.view_src is k.view_src and v.view_offs == k.view_offs))


def _fa_n_kv_max_sparse(t: Tensor) -> int:
    """ops:2986-3040: op_params[4] where the sparse path exists, else 0."""
    n_kv_max = op_param(t, 4)
    if n_kv_max <= 0 or src(t, 3) is None or n_kv_max > 4096:
        return 0
    dk_dv = (t.src[1].ne[0], t.src[2].ne[0])
    if dk_dv not in {(32, 32), (64, 64), (96, 96), (96, 64), (128, 128), (192, 128), (192, 192), (256, 256),
                     (320, 256), (512, 512), (576, 512)}:
        return 0
    if tname(t.src[1]) not in ("F16", "BF16", "F32", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        return 0
    return n_kv_max


def fa_extra_pad(t: Tensor) -> int:
    """ops:3064-3120: always the non-vec padding, 64 KV rows of K, V and the mask."""
    k, v, mask = t.src[1], t.src[2], src(t, 3)
    nb11, nb21 = k.nb[1], v.nb[1]
    if _fa_use_kv_f16(t):
        nb11 = 2 * k.ne[0]
        nb21 = 2 * (k.ne[0] if _fa_v_is_view_of_k(t) else v.ne[0])
    mask_bytes = 2 * mask.ne[1] * mask.ne[2] * mask.ne[3] if mask is not None else 0
    return OP_FLASH_ATTN_EXT_NCPSG * (nb11 * k.ne[2] * k.ne[3] + nb21 * v.ne[2] * v.ne[3] + mask_bytes)


def fa_extra_blk(t: Tensor) -> int:
    """ops:3122-3159"""
    mask = src(t, 3)
    if mask is None:
        return 0
    vec = _fa_use_vec(t)
    nqptg = OP_FLASH_ATTN_EXT_VEC_NQPSG if vec else OP_FLASH_ATTN_EXT_NQPSG
    ncpsg = OP_FLASH_ATTN_EXT_VEC_NCPSG if vec else OP_FLASH_ATTN_EXT_NCPSG
    ne1 = (t.src[0].ne[1] + nqptg - 1) // nqptg
    ne0 = (mask.ne[0] + ncpsg - 1) // ncpsg
    return _pad(ne0 * ne1 * mask.ne[2] * mask.ne[3], 32)


def fa_extra_tmp(t: Tensor) -> int:
    """ops:3161-3188: 32 workgroups' partial results (V head + S and M) per query, up to 32 queries."""
    q, v = t.src[0], t.src[2]
    return 4 * (min(q.ne[1], 32) * q.ne[2] * q.ne[3] * 32 * (v.ne[0] + 2))


def fa_extra_kv_f16(t: Tensor) -> int:
    """ops:3190-3212, always reserved: f16 copies of K and (unless V is a view of K) V."""
    k, v = t.src[1], t.src[2]
    k_size = _pad(2 * k.nelements(), 16)
    return k_size if _fa_v_is_view_of_k(t) else k_size + _pad(2 * v.nelements(), 16)


def fa_extra_idx(t: Tensor) -> int:
    """ops:3215-3229: sparse index lists, one per mask row."""
    n_kv_max = _fa_n_kv_max_sparse(t)
    if n_kv_max <= 0:
        return 0
    mask = t.src[3]
    return _pad(4 * _pad(n_kv_max, OP_FLASH_ATTN_EXT_VEC_NCPSG) * mask.ne[1] * mask.ne[2] * mask.ne[3], 16)


def alloc_size(t: Tensor) -> int:
    """ggml_backend_metal_buffer_type_get_alloc_size (mt:220-253)."""
    size = t.nbytes
    if t.op == "MUL_MAT_ID":
        n_expert, n_token = t.src[0].ne[2], t.src[2].ne[1]
        size += 4 * n_expert + 4 * n_expert * n_token + 8 + N_MM_NPART_AMAX * 4    # ops:2650-2673
    elif t.op == "FLASH_ATTN_EXT":
        size += fa_extra_pad(t) + fa_extra_blk(t) + fa_extra_tmp(t) + fa_extra_kv_f16(t) + fa_extra_idx(t)
    elif t.op in ("CUMSUM", "ARGSORT"):
        size *= 2
    elif t.op == "TOP_K":
        size = 2 * 4 * t.src[0].nelements()
    return size


# --- offload_op and supports_op --------------------------------------------------------------------

def offload_op(t: Tensor) -> bool:
    """ggml_backend_metal_device_offload_op (mt:763-779)"""
    if t.op == "MUL_MAT":
        return t.ne[1] >= OP_OFFLOAD_MIN_BATCH
    if t.op == "MUL_MAT_ID":
        return t.ne[2] >= OP_OFFLOAD_MIN_BATCH
    return False


# The device's properties that supports_op reads (dev:1131-1140, 1288), as Apple silicon has them.
MAX_THREADGROUP_MEMORY = 32768          # maxThreadgroupMemoryLength: 32 KiB on every Apple GPU family since Apple4
N_UNARY_OPS = 22                        # enum ggml_unary_op: every one is in the switch (dev:1566-1593)
N_GLU_OPS = 7                           # enum ggml_glu_op: likewise (dev:1602-1614)
FLOAT16_32 = ("F32", "F16")
FA_HEAD_SIZES = {32, 40, 48, 64, 72, 80, 96, 112, 128, 192, 256, 320, 512, 576}             # dev:1729-1742
FA_KV_TYPES = {"F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16"}               # dev:1752-1767
# dev:1621-1647
CONCAT_TYPES = {"F32", "F16", "I8", "I16", "I32", "I64", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}
LIGHTNING_INDEXER_K_TYPES = {"F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16"}  # dev:1789-1800
OP_LIGHTNING_INDEXER_DK, OP_LIGHTNING_INDEXER_NH = 128, 64                                  # ggml-metal-impl.h:132-133
SET_ROWS_F32_DST = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "TQ2_0"}   # dev:1925-1949
_QUANT_SRC = ("Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ2_0")
CPY_DST = {"F32": {"F32", "F16", "BF16", "Q8_0", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "TQ2_0",
                   "I32"},
           "F16": {"F32", "F16"}, "BF16": {"F32", "BF16"}, "I32": {"F32", "I32"},
           **{q: {"F32", "F16"} for q in _QUANT_SRC}}                                     # dev:1860-1921
# the ops supports_op accepts whatever their operands (dev:1615-1620, 1656-1658, 1695-1697, 1721-1724,
# 1839-1841, 1951-1952); SIMD-group reduction and matrix multiplication are there on Apple7+
ALWAYS = {"NONE", "RESHAPE", "VIEW", "TRANSPOSE", "PERMUTE", "REPEAT", "CONV_TRANSPOSE_1D", "ARGMAX", "ROPE",
          "ROPE_BACK", "ARGSORT", "TOP_K", "ARANGE", "SSM_SCAN", "SSM_CONV", "RWKV_WKV6", "RWKV_WKV7", "DIAG",
          "OPT_STEP_ADAMW", "OPT_STEP_SGD"}


def supports_op(t: Tensor) -> bool:
    """ggml_metal_device_supports_op (dev:1539-1960), every op, on an Apple7+ device: SIMD-group
    reduction and matrix multiplication (has_simdgroup_reduction, has_simdgroup_mm) and bfloat, so
    the !has_bfloat test (dev:1544-1554) never refuses."""
    op, s0, s1 = t.op, src(t, 0), src(t, 1)
    a, dst = tname(s0) if s0 is not None else None, tname(t)
    if op in ALWAYS:
        return True
    if op in ("SCALE", "FILL", "CLAMP", "SQR", "SQRT", "SIN", "COS", "LOG"):
        return is_contiguous_rows(s0) and a in FLOAT16_32                            # dev:1557-1565
    if op == "UNARY":
        return 0 <= op_param(t, 0) < N_UNARY_OPS and is_contiguous_rows(s0) and a in FLOAT16_32   # dev:1566-1593
    if op == "SILU_BACK":                                                            # dev:1594-1601
        return (a == "F32" and tname(s1) == "F32" and dst == "F32" and s0.is_contiguous() and s1.is_contiguous()
                and t.is_contiguous() and same_shape(s0, s1))
    if op == "GLU":
        return 0 <= op_param(t, 0) < N_GLU_OPS and is_contiguous_1(s0) and a in FLOAT16_32   # dev:1602-1614
    if op == "CONCAT":
        return s0.type == s1.type == t.type and a in CONCAT_TYPES                     # dev:1621-1647
    if op in ("ADD", "SUB", "MUL", "DIV", "ADD_ID"):                                 # dev:1648-1653
        return is_contiguous_rows(s0) and is_contiguous_rows(s1) and a in FLOAT16_32 and s0.type == s1.type
    if op == "ACC":
        return is_contiguous_rows(s0) and is_contiguous_rows(s1) and a == "F32"     # dev:1654-1655
    if op == "CONV_TRANSPOSE_2D":                                                    # dev:1659-1663
        return s0.is_contiguous() and s1.is_contiguous() and a in FLOAT16_32 and tname(s1) == "F32" and dst == "F32"
    if op == "COL2IM_1D":                                                            # dev:1664-1668
        return a in ("F32", "F16", "BF16") and dst == a and s0.is_contiguous() and t.is_contiguous()
    if op == "CONV_3D":                                                              # dev:1669-1673
        return s0.is_contiguous() and s1.is_contiguous() and a in FLOAT16_32 and tname(s1) == "F32"
    if op == "SUM":
        return s0.is_contiguous()                                                    # dev:1674-1675
    if op in ("TRI", "SUM_ROWS", "CUMSUM", "MEAN", "SOFT_MAX", "GROUP_NORM", "L2_NORM", "NORM", "RMS_NORM"):
        return is_contiguous_rows(s0)                                                # dev:1676-1694
    if op == "COUNT_EQUAL":
        return a == "I32" and tname(s1) == "I32" and dst == "I64"                    # dev:1685-1689
    if op == "IM2COL":
        return s1.is_contiguous() and tname(s1) == "F32" and dst in FLOAT16_32       # dev:1698-1699
    if op == "CONV_2D":
        return s0.is_contiguous() and tname(s1) == "F32" and dst == "F32" and a in FLOAT16_32   # dev:1700-1704
    if op == "CONV_2D_DW":
        return tname(s1) == "F32" and dst == "F32" and a in FLOAT16_32               # dev:1705-1708
    if op in ("UPSCALE", "POOL_2D", "PAD", "PAD_REFLECT_1D", "TIMESTEP_EMBEDDING"):
        return a == "F32"                                                            # dev:1709-1718
    if op == "POOL_1D":
        return s0.is_contiguous() and a == "F32"                                     # dev:1711-1712
    if op == "LEAKY_RELU":
        return a in FLOAT16_32                                                       # dev:1719-1720
    if op == "ROLL":
        return s0.is_contiguous()                                                    # dev:1725-1726
    if op == "FLASH_ATTN_EXT":                                                       # dev:1727-1771
        k, v = t.src[1], t.src[2]
        if s0.ne[0] not in FA_HEAD_SIZES:
            return False
        if (k.ne[0] == 72 and k.ne[0] != v.ne[0]) or k.ne[0] < v.ne[0] or k.type != v.type:
            return False
        return tname(k) in FA_KV_TYPES
    if op == "LIGHTNING_INDEXER":                                                    # dev:1772-1801
        if s0.ne[0] != OP_LIGHTNING_INDEXER_DK or s0.ne[1] != OP_LIGHTNING_INDEXER_NH:
            return False
        s2, s3 = t.src[2], t.src[3]
        if (a != "F32" or tname(s2) != "F32" or tname(s3) != "F16" or dst != "F32"
                or not all(is_contiguous_rows(x) for x in (s0, s1, s2, s3))):
            return False
        return tname(s1) in LIGHTNING_INDEXER_K_TYPES
    if op == "DSV4_HC_COMB":                                                         # dev:1802-1813
        s2 = t.src[2]
        return (a == tname(s1) == tname(s2) == dst == "F32" and s0.ne[0] == 24 and s1.ne[0] >= 3 and s2.ne[0] == 24
                and all(is_contiguous_rows(x) for x in (s0, s1, s2)))
    if op == "DSV4_HC_PRE":                                                          # dev:1814-1820
        return a == tname(s1) == dst == "F32" and is_contiguous_rows(s0) and is_contiguous_rows(s1)
    if op == "DSV4_HC_POST":                                                         # dev:1821-1834
        s2, s3 = t.src[2], src(t, 3)
        return (a == tname(s1) == tname(s2) == dst == "F32" and (s3 is None or tname(s3) == "F32")
                and s1.ne[1] == 4 and s2.ne[0] == 4 and (s3 is None or (s3.ne[0] == 4 and s3.ne[1] == 4))
                and all(is_contiguous_rows(x) for x in (s0, s1, s2)) and (s3 is None or is_contiguous_rows(s3)))
    if op == "GATED_DELTA_NET":
        return t.src[2].ne[0] % 32 == 0                                              # dev:1842-1843
    if op == "SOLVE_TRI":
        return a == "F32"                                                            # dev:1844-1845
    if op == "MUL_MAT":                                                              # dev:1846-1855
        if a == "F32" and tname(s1) == "F16" and mul_mat_use_fwht(t):
            return True
        return _supports_mul_mat(t, src0_f16_has_mv=True, mm_path=_mul_mat_use_mm(t))
    if op == "MUL_MAT_ID":                                                           # dev:1856-1859
        return _supports_mul_mat(t, src0_f16_has_mv=False, mm_path=_mul_mat_id_use_mm(t))
    if op in ("SET", "CPY", "DUP", "CONT"):                                          # dev:1860-1921
        return dst in CPY_DST.get(a, ())
    if op == "GET_ROWS":
        return a not in ("NVFP4", "TQ1_0")                                           # dev:1922-1924
    if op == "SET_ROWS":                                                             # dev:1925-1950
        if a == "F16":
            return dst == "F16"
        return a == "F32" and dst in SET_ROWS_F32_DST
    return False


def _supports_mul_mat(t: Tensor, src0_f16_has_mv: bool, mm_path: bool) -> bool:
    """ggml_metal_supports_mul_mat_op (dev:1513-1537)"""
    a, b = tname(t.src[0]), tname(t.src[1])
    if a in ("NVFP4", "TQ1_0"):
        return False
    if b != "F16":
        return True
    if a == "BF16":
        return False
    if src0_f16_has_mv and a == "F16":
        return True
    return mm_path


def _mul_mat_use_mm(t: Tensor) -> bool:
    """ggml_metal_op_mul_mat_use_mm (co:35-42)"""
    a, b = t.src[0], t.src[1]
    return not is_transposed(a) and not is_transposed(b) and a.ne[0] >= 64 and b.ne[1] > 8


def _mul_mat_id_use_mm(t: Tensor) -> bool:
    """ggml_metal_op_mul_mat_id_use_mm (co:44-49): ids' ne[1] is the token count."""
    return t.src[0].ne[0] >= 64 and t.src[2].ne[1] >= 32


def mul_mat_use_fwht(t: Tensor) -> bool:
    """ggml_metal_op_mul_mat_use_fwht (co:25-33) with ggml_metal_fwht_supported_size (co:10-22): the
    widths up to 512 need no threadgroup memory, 1024-8192 need 4 bytes per value of it."""
    b = t.src[1]
    if not (op_param(t, 1) == GGML_HINT_SRC0_IS_HADAMARD and tname(t) == "F32" and tname(b) in FLOAT16_32
            and b.is_contiguous() and t.is_contiguous() and same_shape(b, t)):
        return False
    n = b.ne[0]
    return n in (64, 128, 256, 512) or (n in (1024, 2048, 4096, 8192) and n * 4 <= MAX_THREADGROUP_MEMORY)


# --- graph_optimize (mt:564-574) ---------------------------------------------------------------------

@dataclass(frozen=True)
class Fusion:
    """struct ggml_metal_fusion (fu:26-65): the raw op sequence, the extra outputs (relative to the
    non-empty ops), whether the generic chain tests are skipped, and the pattern's own check."""
    name: str
    ops_all: tuple[str, ...]
    check: Callable[..., bool]   # check(fusion, nodes, graph, idxs, idx, counts), structural mode
    outs: tuple[int, ...] = ()
    unsafe: bool = False

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for op in self.ops_all if not op_is_empty(op))


def _check_norm(fusion: Fusion, nodes: list[Tensor], *_) -> bool:
    """ggml_metal_fusion_check_norm (fu:92-139)"""
    if fusion.name == "NORM_SCALE":
        scale = nodes[1]
        return scale.op == "SCALE" and scale.src[0] is nodes[0] and src(scale, 1) is None and tname(scale) == "F32"
    for j in range(1, len(fusion.ops)):
        w = nodes[j].src[1]
        if (nodes[j].src[0] is not nodes[j - 1] or w.ne[0] != nodes[0].ne[0] or not is_contiguous_rows(w)
                or tname(nodes[j]) != "F32"):
            return False
    return True


def _check_ssm_conv_silu(fusion: Fusion, nodes: list[Tensor], *_) -> bool:
    """ggml_metal_fusion_check_ssm_conv_silu (fu:142-171)"""
    conv, un = nodes[0], nodes[1]
    if conv.op != "SSM_CONV" or un.op != "UNARY" or un.src[0] is not conv or src(un, 1) is not None:
        return False
    if op_param(un, 0) != ggml.UNARY_OPS["SILU"]:
        return False
    return tname(conv) == "F32" and tname(un) == "F32" and is_contiguous_rows(un)


def _check_add_chain(fusion: Fusion, nodes: list[Tensor], *_) -> bool:
    """ggml_metal_fusion_check_add_chain (fu:175-204); the same-buffer test is FULL mode's only."""
    return all(nodes[j].src[0] is nodes[j - 1] and same_layout(nodes[j].src[1], nodes[j - 1].src[1])
               for j in range(1, len(fusion.ops)))


def _check_gdn_cache(fusion: Fusion, nodes: list[Tensor], *_) -> bool:
    """ggml_metal_fusion_check_gdn_cache (fu:211-270): the CPY writes the delta net's state snapshots
    (the tail of its result) into the recurrent cache."""
    gdn, cpy = nodes[0], nodes[1]
    if tname(gdn) != "F32" or gdn.flags & FLAG_OUTPUT or cpy.op != "CPY" or cpy.flags & FLAG_OUTPUT:
        return False
    s_v, h, n_tokens, n_seqs = gdn.src[2].ne
    d = s_v * s_v * h
    n_written = min(n_tokens, op_param(gdn, 0))
    tail, cache = cpy.src[0], cpy.src[1]
    if (tail.op != "VIEW" or tail.view_src is not gdn or tail.view_offs != 4 * s_v * h * n_tokens * n_seqs
            or not tail.is_contiguous()):
        return False
    return tname(cache) == "F32" and cache.ne == (d, n_seqs, n_written, 1) and cache.nb[0] == 4 and cache.nb[1] == 4 * d


def _check_snake(fusion: Fusion, nodes: list[Tensor], *_) -> bool:
    """ggml_metal_fusion_check_snake (fu:273-325): x + sin(a*x)^2 * inv_b"""
    mul0, sin, sqr, mul1, add = nodes
    x = mul0.src[0] if same_shape(mul0, mul0.src[0]) else mul0.src[1]
    a = mul0.src[1] if x is mul0.src[0] else mul0.src[0]
    inv_b = mul1.src[1] if mul1.src[0] is sqr else mul1.src[0]
    x_in_add = add.src[1] if add.src[0] is mul1 else add.src[0]
    types_ok = (tname(x) in ("F32", "F16", "BF16") and tname(a) == "F32" and tname(inv_b) == "F32"
                and all(n.type == x.type for n in nodes))
    shape_ok = same_shape(a, inv_b) and a.ne[0] == 1 and a.ne[1] == x.ne[1]
    dim_ok = all(t.ne[2] == 1 and t.ne[3] == 1 for t in (x, add, a, inv_b))
    contig_ok = all(t.is_contiguous() for t in (x, add, a, inv_b))
    return types_ok and shape_ok and dim_ok and contig_ok and x_in_add is x


GGML_METAL_TOPK_MOE_MAX_EXPERTS = 1024      # fu:327


def _check_topk_moe(fusion: Fusion, nodes: list[Tensor], graph: list[Tensor], idxs: list[int], idx: int,
                    counts: dict[Tensor, int]) -> bool:
    """ggml_metal_fusion_check_topk_moe (fu:347-482): softmax routing, top-k ids and their weights
    (normalised, scaled), over the raw nodes the fused kernel elides."""
    n_ops = len(fusion.ops)
    with_norm, with_scale = n_ops >= 6, n_ops in (4, 7)
    raw_start, raw_end = idxs[idx], idxs[idx + n_ops - 1]
    if with_norm and not with_scale:    # the trailing RESHAPE, filtered out of the non-empty ops
        if raw_end + 1 >= len(graph):
            return False
        trailing = graph[raw_end + 1]
        if trailing.op != "RESHAPE" or trailing.src[0] is not graph[raw_end]:
            return False
        raw_end += 1
    raw_idxs = list(range(raw_start, raw_end + 1))
    if len(raw_idxs) != len(fusion.ops_all) or any(graph[i].op != op for i, op in zip(raw_idxs, fusion.ops_all)):
        return False
    softmax, probs_reshaped, argsort, ids, get_rows = (graph[raw_start + k] for k in range(5))
    out, logits = graph[raw_end], softmax.src[0]
    if op_param(softmax, 0, 1.0) != 1.0 or op_param(softmax, 1, 0.0) != 0.0:
        return False
    if src(softmax, 1) is not None or src(softmax, 2) is not None:
        return False
    if tname(logits) != "F32" or tname(softmax) != "F32" or tname(out) != "F32" or tname(ids) != "I32":
        return False
    n_expert, n_tokens, n_expert_used = logits.ne[0], logits.ne[1], ids.ne[0]
    if (n_expert <= 0 or n_expert_used <= 0 or n_expert_used > n_expert or n_expert > GGML_METAL_TOPK_MOE_MAX_EXPERTS
            or n_expert_used > GGML_METAL_TOPK_MOE_MAX_EXPERTS):
        return False
    if (logits.ne[2:] != (1, 1) or ids.ne[1:] != (n_tokens, 1, 1) or out.ne != (1, n_expert_used, n_tokens, 1)):
        return False
    if not logits.is_contiguous() or not out.is_contiguous() or ids.nb[0] != 4 or ids.nb[1] != 4 * n_expert:
        return False
    if (probs_reshaped.src[0] is not softmax or argsort.src[0] is not softmax or ids.src[0] is not argsort
            or get_rows.src[0] is not probs_reshaped or get_rows.src[1] is not ids):
        return False
    if with_norm:
        weights_reshaped, sum_rows, clamp, div, out_reshaped = (graph[raw_start + k] for k in range(5, 10))
        if (weights_reshaped.src[0] is not get_rows or sum_rows.src[0] is not weights_reshaped
                or clamp.src[0] is not sum_rows or div.src[0] is not weights_reshaped or div.src[1] is not clamp
                or out_reshaped.src[0] is not div):
            return False
        if with_scale and graph[raw_start + 10].src[0] is not out_reshaped:
            return False
    elif with_scale and graph[raw_start + 5].src[0] is not get_rows:
        return False
    return can_fuse_subgraph(graph, raw_idxs, list(fusion.ops_all), [raw_start + 3, raw_end], counts)


GGML_METAL_MOE_REDUCE_MAX_EXPERTS = 8       # fu:484


def _match_moe_reduce(graph: list[Tensor], i: int, ops_all: tuple[str, ...], counts: dict[Tensor, int]):
    """ggml_metal_fusion_match_moe_reduce (fu:493-591): MUL of the experts' outputs by their weights,
    one VIEW per used expert, the ADDs summing them; (experts, node count) or None."""
    raw_count = len(ops_all)
    if i + raw_count > len(graph):
        return None
    mul = graph[i]
    if mul.op != "MUL" or tname(mul) != "F32":
        return None
    n_expert_used = raw_count // 2
    if n_expert_used < 2 or n_expert_used > GGML_METAL_MOE_REDUCE_MAX_EXPERTS or raw_count != 2 * n_expert_used:
        return None
    n_views = 0
    while i + 1 + n_views < len(graph) and graph[i + 1 + n_views].op == "VIEW":
        n_views += 1
    if n_views != n_expert_used:
        return None
    raw_idxs = list(range(i, i + raw_count))
    if any(graph[k].op != op for k, op in zip(raw_idxs, ops_all)):    # the ADDs, then the whole sequence
        return None
    experts, weights, dst = mul.src[0], mul.src[1], graph[raw_idxs[-1]]
    if tname(experts) != "F32" or tname(weights) != "F32" or tname(dst) != "F32":
        return None
    n_embd, n_tokens = experts.ne[0], experts.ne[2]
    if (n_embd <= 0 or experts.ne[1] != n_expert_used or experts.ne[3] != 1
            or weights.ne != (1, n_expert_used, n_tokens, 1) or dst.ne != (n_embd, n_tokens, 1, 1)):
        return None
    if not experts.is_contiguous() or not weights.is_contiguous() or not dst.is_contiguous():
        return None
    for k in range(1, n_expert_used + 1):
        view = graph[i + k]
        if (view.view_src is not mul or view.src[0] is not mul or view.view_offs != (k - 1) * mul.nb[1]
                or view.ne[0] != n_embd or view.ne[1] != n_tokens or view.nb[1] != mul.nb[2]):
            return None
    prev_add = None
    for j in range(1, n_expert_used):
        add = graph[i + n_expert_used + j]
        lhs = graph[i + 1] if j == 1 else prev_add
        if add.src[0] is not lhs or add.src[1] is not graph[i + j + 1]:
            return None
        prev_add = add
    if not can_fuse_subgraph(graph, raw_idxs, list(ops_all), [raw_idxs[-1]], counts):
        return None
    return experts, raw_count


def _check_moe_reduce(fusion: Fusion, nodes: list[Tensor], graph: list[Tensor], idxs: list[int], idx: int,
                      counts: dict[Tensor, int]) -> bool:
    """ggml_metal_fusion_check_moe_reduce (fu:593-623)"""
    match = _match_moe_reduce(graph, idxs[idx], fusion.ops_all, counts)
    if match is None:
        return False
    experts, node_count = match
    if len(fusion.ops) != experts.ne[1]:
        return False
    return idxs[idx + len(fusion.ops) - 1] == idxs[idx] + node_count - 1


_TOPK_MOE = ("SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS")
_NORM = ("RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE")

# the table ggml_metal_fusions (fu:674-701), in its order
FUSIONS = [
    Fusion("NORM_MUL", ("NORM", "MUL"), _check_norm),
    Fusion("NORM_MUL_ADD", ("NORM", "MUL", "ADD"), _check_norm),
    Fusion("NORM_SCALE", ("NORM", "SCALE"), _check_norm),
    Fusion("NORM_MUL", ("RMS_NORM", "MUL"), _check_norm),
    Fusion("NORM_MUL_ADD", ("RMS_NORM", "MUL", "ADD"), _check_norm),
    Fusion("NORM_SCALE", ("RMS_NORM", "SCALE"), _check_norm),
    *(Fusion("ADD_CHAIN", ("ADD",) * n, _check_add_chain) for n in range(2, 8)),
    Fusion("SNAKE", ("MUL", "SIN", "SQR", "MUL", "ADD"), _check_snake),
    Fusion("GDN_CACHE", ("GATED_DELTA_NET", "CPY"), _check_gdn_cache, unsafe=True),
    Fusion("TOPK_MOE", _TOPK_MOE, _check_topk_moe, (1,), True),
    Fusion("TOPK_MOE", _TOPK_MOE + ("SCALE",), _check_topk_moe, (1,), True),
    Fusion("TOPK_MOE", _TOPK_MOE + _NORM, _check_topk_moe, (1,), True),
    Fusion("TOPK_MOE", _TOPK_MOE + _NORM + ("SCALE",), _check_topk_moe, (1,), True),
    *(Fusion("MOE_REDUCE", ("MUL",) + ("VIEW",) * n + ("ADD",) * (n - 1), _check_moe_reduce, unsafe=True)
      for n in range(2, 9)),
    Fusion("SSM_CONV_SILU", ("SSM_CONV", "UNARY"), _check_ssm_conv_silu),
]
GGML_METAL_FUSION_MAX = 16


def _fusion_next(graph: list[Tensor], idxs: list[int], idx: int, counts: dict[Tensor, int]) -> int:
    """ggml_metal_fusion_next (fu:988-1077) in GGML_METAL_FUSION_STRUCTURAL mode: the length of the
    longest pattern at idxs[idx] (the first of equal length wins), 0 if none."""
    best = 1
    found = False
    for fusion in FUSIONS:
        ops = fusion.ops
        n_ops = len(ops)
        if n_ops <= best or idx + n_ops > len(idxs):
            continue
        nodes = [graph[idxs[idx + j]] for j in range(n_ops)]
        if any(node.op != op for node, op in zip(nodes, ops)):
            continue
        if not fusion.unsafe:
            # each node reads the previous one, all of one shape; the nodes but the outputs elidable
            if any((src(nodes[j], 0) is not nodes[j - 1] and src(nodes[j], 1) is not nodes[j - 1])
                   or not same_shape(nodes[j], nodes[j - 1]) for j in range(1, n_ops)):
                continue
            sub = idxs[idx:idx + n_ops]
            outputs = [sub[-1]] + [sub[o] for o in fusion.outs]
            if not can_fuse_subgraph(graph, sub, list(ops), outputs, counts):
                continue
        if not fusion.check(fusion, nodes, graph, idxs, idx, counts):
            continue
        best, found = n_ops, True
    return best if found else 0


def fusion_max(graph: list[Tensor], idx: int, counts: dict[Tensor, int]) -> int:
    """ggml_metal_fusion_max (fu:1083-1122): how many raw nodes from idx one fusion group packs."""
    if op_is_empty(graph[idx].op):
        return 1
    idxs = list(islice((i for i in range(idx, len(graph)) if not op_is_empty(graph[i].op)), GGML_METAL_FUSION_MAX))
    total = i_f = 0
    while i_f < len(idxs) and total < GGML_METAL_FUSION_MAX:
        n = _fusion_next(graph, idxs, i_f, counts)
        if n == 0 or total + n > GGML_METAL_FUSION_MAX:
            break
        total += n
        i_f += n
    if i_f == 0:
        return 1
    return min(GGML_METAL_FUSION_MAX, idxs[i_f - 1] - idx + 1)


def add_fusion_alloc_deps(graph: list[Tensor], add_alloc_dep) -> None:
    """ggml_metal_fusion_add_alloc_deps (fu:705-765): at each raw run of a pattern's ops (longest
    first, no other test), keep every external source alive until the run's last node."""
    i = 0
    while i < len(graph):
        best = max((f for f in FUSIONS if tuple(n.op for n in graph[i:i + len(f.ops_all)]) == f.ops_all),
                   key=lambda f: len(f.ops_all), default=None)
        if best is not None:
            last = graph[i + len(best.ops_all) - 1]
            seen: list[Tensor] = []
            for node in graph[i:i + len(best.ops_all)]:
                for s in node.src[:GGML_MAX_SRC]:
                    if s is not None and not any(s is x for x in seen):
                        seen.append(s)
                        add_alloc_dep(s, last)
                seen.append(node)
            i += len(best.ops_all)
        else:
            i += 1


@dataclass
class _NodeInfo:
    """struct node_info (co:230-262): a node and the nodes fused after it."""
    node: Tensor
    fused: list[Tensor] = field(default_factory=list)

    def is_output(self, t: Tensor) -> bool:
        return t is self.node or any(t is f for f in self.fused)

    def tensors(self) -> list[Tensor]:
        return [self.node, *self.fused]


SRC, DST = 0, 1


def _mem_range(t: Tensor, kind: int) -> tuple:
    """ggml_mem_range_from_tensor (co:91-123): the base tensor's bytes in its buffer, or, while not
    allocated, a dummy range [0, 1024) keyed by the tensor."""
    base = t.view_src if t.view_src is not None else t
    if base.buffer is not None:
        return (id(base.buffer), base.offset, base.offset + base.buffer.buft.alloc_size(base), kind)
    return (id(base), 0, 1024, kind)


def _conflicts(ranges: list[tuple], mr: tuple) -> bool:
    """not ggml_mem_ranges_check (co:167-193): overlapping ranges of one buffer, one of them written."""
    for cmp in ranges:
        if mr[0] != cmp[0] or (mr[3] == SRC and cmp[3] == SRC):
            continue
        if mr[1] < cmp[2] and mr[2] >= cmp[1]:
            return True
    return False


def _ranges_of(info: _NodeInfo) -> list[tuple]:
    """h_add's ranges (co:266-299): external sources, then every tensor the group writes."""
    out = [_mem_range(s, SRC) for t in info.tensors() for s in t.src[:GGML_MAX_SRC]
           if s is not None and not info.is_output(s)]
    return out + [_mem_range(t, DST) for t in info.tensors()]


def _concurrent(ranges: list[tuple], info: _NodeInfo) -> bool:
    """h_check (co:302-333)"""
    return not any(_conflicts(ranges, mr) for mr in _ranges_of(info))


# ops across which the reorder may move nodes (co:337-369)
REORDER_SAFE = frozenset({"MUL_MAT", "MUL_MAT_ID", "ROPE", "NORM", "RMS_NORM", "GROUP_NORM", "L2_NORM", "SUM_ROWS",
                          "SSM_CONV", "SSM_SCAN", "CLAMP", "TRI", "DIAG", "MUL", "ADD", "SUB", "DIV", "GLU", "SCALE",
                          "UNARY", "GET_ROWS", "SET_ROWS", "SET", "CPY", "CONT", "REPEAT"})
N_FORWARD = 64


def reorder(infos: list[_NodeInfo]) -> list[int]:
    """ggml_metal_graph_optimize_reorder (co:264-451): when a node cannot run with the current
    concurrent set, pull forward up to 63 later nodes that can, then start a new set."""
    res: list[int] = []
    used = [False] * len(infos)
    mrs0: list[tuple] = []
    for i0, node0 in enumerate(infos):
        if used[i0]:
            continue
        if not op_is_empty(node0.node.op) and not _concurrent(mrs0, node0):
            mrs1 = _ranges_of(node0)
            for i1 in range(i0 + 1, min(i0 + N_FORWARD, len(infos))):
                if used[i1]:
                    continue
                node1 = infos[i1]
                if node1.node.op not in REORDER_SAFE and not op_is_empty(node1.node.op):
                    break
                if (op_is_empty(node1.node.op) or _concurrent(mrs0, node1)) and _concurrent(mrs1, node1):
                    mrs0 += _ranges_of(node1)
                    res.append(i1)
                    used[i1] = True
                else:
                    mrs1 += _ranges_of(node1)
            mrs0 = []
        mrs0 += _ranges_of(node0)
        res.append(i0)
    return res


def graph_optimize(nodes: list[Tensor], add_alloc_dep, counts: dict[Tensor, int]) -> None:
    """ggml_backend_metal_graph_optimize (mt:564-574): fusion alloc deps, then ggml_graph_optimize
    (co:453-507), in place. counts: the whole graph's use counts."""
    add_fusion_alloc_deps(nodes, add_alloc_dep)
    infos: list[_NodeInfo] = []
    i = 0
    while i < len(nodes):
        f = fusion_max(nodes, i, counts)
        infos.append(_NodeInfo(nodes[i], nodes[i + 1:i + f]))
        i += f
    nodes[:] = [t for k in reorder(infos) for t in infos[k].tensors()]


# --- the device -------------------------------------------------------------------------------------

def metal_backend(index: int, memory: int, max_buffer_size: int) -> Backend:
    """Device MTL<index> with `memory` bytes free (recommendedMaxWorkingSetSize) and maxBufferLength."""
    name = f"MTL{index}"
    buft = BufferType(name, ALIGNMENT, max_buffer_size, alloc_size_fn=alloc_size, device=name)
    mapped = BufferType(f"{name}_Mapped", ALIGNMENT, max_buffer_size, alloc_size_fn=alloc_size, device=name)
    return Backend(name, "GPU", buft, supports_op=supports_op, supports_buft=lambda b: b.name in (buft.name, mapped.name),
                   offload_op=offload_op, is_async_with_events=True, device_name=name, mapped_buft=mapped,
                   memory=memory, graph_optimize=graph_optimize)
