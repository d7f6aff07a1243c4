"""Vulkan devices: ggml/src/ggml-vulkan/ggml-vulkan.cpp of llama.cpp 0c1e57098 ("vk:" lines), measured
against the real backend on Mesa's lavapipe (fixtures/golden, the `vulkan` cases).

- device, backend and buffer type "Vulkan<n>" (vk:16117, 5427); type GPU, or IGPU for an integrated
  device, which turns mmap off (caps.mmap_support, vk:15290; llama-model.cpp:1512) and is used only
  where no discrete GPU is (src/llama.cpp:260-290); caps async + events + host buffer (vk:15285-15291);
- buffer type (vk:13034-13047): alignment minStorageBufferOffsetAlignment, max size the suballocation
  block, 1 GiB or the device's max allocation when smaller (vk:4195-4218), so gallocr splits a bigger
  compute buffer into chunks of at most that; alloc size ggml_nbytes;
- host buffer type "Vulkan_Host" (vk:13060-13125), device 0's: alignment minMemoryMapAlignment, max size
  its suballocation block, the CPU's alloc size, is_host, and alloc_buffer asks for 32 bytes more than
  requested ("behave like the CPU buffer type", vk:13080), which ggml_backend_buffer_get_size reports;
- supports_buft: its own buffer type only (vk:15962); offload_op: ggml_vk_get_op_batch_size >= 32
  (GGML_OP_OFFLOAD_MIN_BATCH's default; ggml-vulkan-debug.cpp:766, vk:15973, 16111);
- supports_op (vk:15300-15960), every op, after the size test (no tensor over max_buffer_size, nor over
  maxStorageBufferRange unless the device has 64-bit indexing);
- graph_optimize (vk:14663-15040): reorders each split's nodes to group independent work, keeps the
  fusion patterns together, pulls fusion partners forward, and keeps the inputs of the TOPK_MOE and
  HC_POST fusions alive (allocation dependencies).

What a device is: VulkanDevice below, from a Vulkan profile (backends/vulkan_profile.py, `profile=`),
from the align=/mapalign=/maxalloc= keys, or else from the defaults DEFAULT_DEVICE documents.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Optional

from .layout import (
    EMPTY_OPS, GGML_MAX_SRC, can_fuse_subgraph, is_contiguous, is_contiguous_1, is_contiguous_rows, nrows, op_is_empty, op_param,
    same_shape, src, tname,
)
from .types import Backend, BufferType
from ..planner.ggml import PREC_F32, Tensor, blck_size, can_repeat, is_quantized, type_size

GiB = 1024**3
SUBALLOCATION_BLOCK_SIZE = GiB        # vk:4216
OP_OFFLOAD_MIN_BATCH = 32             # vk:16111
HOST_BUFFER_EXTRA = 32                # vk:13080
NUM_ARGSORT_PIPELINES = 11            # ggml-vulkan-types.h:501
VENDOR_INTEL = 0x8086


@dataclass(frozen=True)
class VulkanDevice:
    """The properties of a physical device that ggml-vulkan's memory and placement rules read
    (ggml_vk_get_device, vk:3990-4860), as the Vulkan API names them."""
    min_storage_buffer_offset_alignment: int      # limits: the device buffer type's alignment
    min_memory_map_alignment: int                 # limits: Vulkan_Host's alignment
    max_memory_allocation_size: int               # maintenance3
    max_buffer_size: Optional[int]                # maintenance4 (VK_KHR_maintenance4), None without it
    max_storage_buffer_range: int                 # limits: the largest tensor an op may bind
    max_compute_shared_memory_size: int           # limits: MUL_MAT_ID, ARGSORT, TOP_K, SSM_SCAN, SOLVE_TRI
    max_compute_work_group_invocations: int       # limits: ARGSORT, TOP_K, SOLVE_TRI pipelines
    subgroup_size: int
    subgroup_min_size: int                        # VK_EXT_subgroup_size_control, else subgroup_size
    subgroup_size_control: bool
    subgroup_ops: frozenset[str]                  # in compute shaders: BASIC, VOTE, ARITHMETIC, BALLOT, SHUFFLE, ...
    compute_full_subgroups: bool                  # subgroup_require_full_support (ARGSORT, TOP_K, CUMSUM)
    fp16: bool                                    # 16-bit storage + float16_int8 + shaderFloat16
    shader_int64: bool
    buffer_device_address: bool
    vulkan_memory_model: bool
    shader_64bit_indexing: bool                   # VK_EXT_shader_64bit_indexing: no storage-range limit
    cooperative_matrix: bool                      # VK_KHR_cooperative_matrix (tiles taken as 16x16x16)
    cooperative_matrix2: bool                     # VK_NV_cooperative_matrix2
    integrated: bool = False                      # VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU
    vendor_id: int = 0
    name: str = "Vulkan device"

    # --- derived as ggml_vk_get_device derives them (vk:4195-4281) --------------------------------

    @property
    def max_alloc(self) -> int:
        """device->max_memory_allocation_size: maintenance4's maxBufferSize caps it."""
        if self.max_buffer_size is not None:
            return min(self.max_memory_allocation_size, self.max_buffer_size)
        return self.max_memory_allocation_size

    @property
    def buffer_limit(self) -> int:
        """device->max_buffer_size, the size test of supports_op."""
        return self.max_buffer_size if self.max_buffer_size is not None else self.max_alloc

    @cached_property
    def size_limit(self) -> int:
        """The largest tensor supports_op's size test lets an op bind (tensor_size_supported, vk:15307):
        max_buffer_size, and maxStorageBufferRange unless shader64BitIndexing lifts it."""
        if self.shader_64bit_indexing:
            return self.buffer_limit
        return min(self.buffer_limit, self.max_storage_buffer_range)

    @cached_property
    def im2col_size_limit(self) -> int:
        """The same for IM2COL and IM2COL_3D, whose shaders address through buffer device addresses
        (no storage-range limit) where the device has them and int64 (uses_bda, vk:15304)."""
        return self.buffer_limit if self.shader_int64 and self.buffer_device_address else self.size_limit

    @property
    def suballocation_block_size(self) -> int:
        return min(SUBALLOCATION_BLOCK_SIZE, self.max_alloc)

    @property
    def max_workgroup_size_log2(self) -> int:
        return int(math.log2(self.max_compute_work_group_invocations))

    @property
    def subgroup_size_log2(self) -> int:
        return int(math.log2(self.subgroup_size))

    def has(self, subgroup_op: str) -> bool:
        return subgroup_op in self.subgroup_ops


# A device neither a profile nor a key describes: a current discrete desktop GPU, with the limits
# ggml-vulkan's rules read set as follows (documented in `schedplan reserve --help`).
DEFAULT_DEVICE = VulkanDevice(
    min_storage_buffer_offset_alignment=64, min_memory_map_alignment=64, max_memory_allocation_size=4 * GiB,
    max_buffer_size=None, max_storage_buffer_range=2**32 - 1, max_compute_shared_memory_size=32768,
    max_compute_work_group_invocations=1024, subgroup_size=32, subgroup_min_size=32, subgroup_size_control=False,
    subgroup_ops=frozenset({"BASIC", "VOTE", "ARITHMETIC", "BALLOT", "SHUFFLE", "SHUFFLE_RELATIVE", "CLUSTERED",
                            "QUAD"}),
    compute_full_subgroups=True, fp16=True, shader_int64=True, buffer_device_address=True, vulkan_memory_model=True,
    shader_64bit_indexing=False, cooperative_matrix=False, cooperative_matrix2=False)


# --- shader pipelines that exist on a device (vk:1418-1480, 3509-3596, 4740-4840) --------------------

IQ_LUT_SIZE = {"IQ1_S": 2 * 2048, "IQ1_M": 2 * 2048, "IQ2_XXS": 8 * 256, "IQ2_XS": 8 * 512, "IQ2_S": 8 * 1024,
               "IQ3_XXS": 4 * 256, "IQ3_S": 4 * 512, "IQ4_NL": 4 * 16, "IQ4_XS": 4 * 16, "MXFP4": 4 * 16,
               "NVFP4": 4 * 16 + 128 * 4}
COOPMAT_TILE = 16


def mul_mat_id_supported(dev: VulkanDevice, src0_type: str) -> bool:
    """mul_mat_id_s[type]: the small MUL_MAT_ID tile fits the shared memory (ggml_vk_matmul_shmem_support
    of s_warptile_mmqid, vk:1418-1475, 1833, 4868-4874); without it no tile size is left (vk:15380)."""
    if dev.cooperative_matrix2:
        return True       # the coopmat2 tiles are sized for the devices that have it (vk:1767)
    sg = dev.subgroup_min_size if (dev.vendor_id == VENDOR_INTEL and dev.subgroup_size_control) else dev.subgroup_size
    block_size, bm, bn, bk = max(sg, 32), 32, 32, 32
    warp = max(sg, 8)
    tm = tn = COOPMAT_TILE if dev.cooperative_matrix else 2
    bank_conflict_offset = 8 if dev.cooperative_matrix else 1
    elem = 2 if dev.fp16 else 4
    warps = block_size // warp
    total = ((bm + bn) * (bk + bank_conflict_offset) * elem + bn * 2 * 2
             + (tm * tn // warps * 4 if dev.cooperative_matrix else 0) + IQ_LUT_SIZE.get(src0_type, 0) + warps * 4 * 4)
    return total <= dev.max_compute_shared_memory_size


def dsv4_hc_comb_pipeline(dev: VulkanDevice) -> bool:
    """pipeline_dsv4_hc_comb_f32 exists (vk:3589)."""
    return dev.has("BASIC") and dev.has("SHUFFLE") and dev.compute_full_subgroups and dev.subgroup_size >= 16


# --- supports_op (vk:15300-15960) ----------------------------------------------------------------------

WEIGHT_TYPES = {"F32", "F16", "BF16", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS",
                "IQ4_NL", "MXFP4", "NVFP4", "TQ1_0", "TQ2_0"}                       # vk:15389-15418, 15499-15529
GET_ROWS_TYPES = WEIGHT_TYPES | {"I32"}
FA_KV_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "IQ4_NL"}      # vk:15471-15485
QUANT_CPY = {"F32", "F16", "BF16", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"}   # vk:15567-15600
LIGHTNING_INDEXER_K_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "IQ4_NL"}   # types.h:664
FLOAT16_32 = ("F32", "F16")
N_UNARY_OPS = 22            # enum ggml_unary_op: every one has a Vulkan shader (vk:15332-15354)
N_GLU_OPS = 7               # enum ggml_glu_op: likewise (vk:15361-15370)
SCALE_FLAG_ANTIALIAS, SCALE_MODE_BILINEAR = 1 << 8, 1     # ggml.h


def _dim01_contiguous(t: Tensor) -> bool:
    """ggml_vk_dim01_contiguous (vk:6010)"""
    return (t.nb[0] == type_size(t.type) and t.nb[1] == t.nb[0] * t.ne[0] // blck_size(t.type)
            and (t.ne[3] == 1 or t.nb[3] == t.nb[2] * t.ne[2]))


# the ops supports_op takes whenever their tensors pass the size test (vk:15633-15640, 15828-15830)
ALWAYS_SUPPORTED = frozenset({"ROPE_BACK", "NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "RMS_NORM", "RWKV_WKV6",
                              "RWKV_WKV7"})


def supports_op(dev: VulkanDevice, t: Tensor) -> bool:
    """ggml_backend_vk_device_supports_op (vk:15300-15960)."""
    op = t.op
    # tensor_size_supported of every src and of the node (the device's size_limit)
    limit = dev.im2col_size_limit if op in ("IM2COL", "IM2COL_3D") else dev.size_limit
    if t.nbytes > limit:
        return False
    for x in t.src[:GGML_MAX_SRC]:
        if x is not None and x.nbytes > limit:
            return False
    if op in ALWAYS_SUPPORTED:
        return True
    s0, s1 = src(t, 0), src(t, 1)
    a, dst = tname(s0) if s0 is not None else None, tname(t)
    if op == "UNARY":
        return op_param(t, 0) < N_UNARY_OPS and a in FLOAT16_32 and a == dst
    if op == "GLU":
        return op_param(t, 0) < N_GLU_OPS and a in FLOAT16_32 and a == dst and (s1 is None or tname(s1) == a)
    if op in ("MUL_MAT", "MUL_MAT_ID"):
        if op == "MUL_MAT_ID" and (not mul_mat_id_supported(dev, a) or op_param(t, 3) == PREC_F32):   # vk:15380-15386
            return False
        if a not in WEIGHT_TYPES:
            return False
        x = s0 if op == "MUL_MAT" else t.src[2]
        if x.ne[3] != s1.ne[3]:
            return False
        if (not (_dim01_contiguous(s0) or a in ("F32", "F16", "BF16"))
                or not (_dim01_contiguous(s1) or tname(s1) in FLOAT16_32)):
            return False
        return not (a == "BF16" and tname(s1) == "F16") and not (tname(s1) == "BF16" and a != "BF16")
    if op == "FLASH_ATTN_EXT":
        k, v, mask, sinks = t.src[1], t.src[2], src(t, 3), src(t, 4)
        if k.ne[0] % 8 or v.ne[0] % 8:
            return False
        if (sinks is not None and tname(sinks) != "F32") or a != "F32" or dst != "F32":
            return False
        if mask is not None and tname(mask) != "F16":
            return False
        if tname(k) not in FA_KV_TYPES or tname(v) not in FA_KV_TYPES or (tname(k) == "BF16") != (tname(v) == "BF16"):
            return False
        return dev.cooperative_matrix2 or (dev.has("SHUFFLE") and dev.has("VOTE"))
    if op == "GET_ROWS":
        return a in GET_ROWS_TYPES
    if op == "SET_ROWS":
        return a in FLOAT16_32 and tname(s1) in ("I32", "I64") and dst in QUANT_CPY
    if op in ("CONT", "CPY", "DUP"):
        b = tname(s1) if s1 is not None else a
        if (a == "F32" and b in QUANT_CPY) or (b == "F32" and a in QUANT_CPY - {"F32"}):
            return True
        if (a, b) in (("F16", "F16"), ("F32", "I32"), ("I32", "F32")):
            return True
        return (a == b and (not is_quantized(s0.type) or (is_contiguous(s0) and is_contiguous(t)))
                and type_size(s0.type) % 2 == 0)
    if op == "REPEAT":
        return type_size(t.type) == type_size(s0.type) and type_size(t.type) in (2, 4)
    if op in ("REPEAT_BACK", "GET_ROWS_BACK"):
        return dst == "F32" and a == "F32"
    if op == "ROPE":
        return is_contiguous_rows(t) and is_contiguous_rows(s0)
    if op == "GROUP_NORM":
        return is_contiguous(s0)
    if op in ("NORM", "L2_NORM"):
        return a == "F32" and dst == "F32"
    if op in ("ADD", "SUB", "MUL", "DIV"):
        return a in FLOAT16_32 and tname(s1) in FLOAT16_32 and dst in FLOAT16_32
    if op == "ADD_ID":
        return a == "F32" and tname(s1) == "F32" and tname(t.src[2]) == "I32" and dst == "F32"
    if op in ("SILU_BACK", "RMS_NORM_BACK", "OPT_STEP_ADAMW", "OPT_STEP_SGD", "DIAG_MASK_INF", "SCALE", "ARGMAX"):
        return is_contiguous(s0) and a == "F32"
    if op in ("SQR", "SQRT", "SIN", "COS", "CLAMP", "LEAKY_RELU", "LOG", "TRI", "DIAG"):
        return a in FLOAT16_32 and dst == a
    if op == "OUT_PROD":
        return is_contiguous(s0) and a == "F32" and is_contiguous(s1) and tname(s1) == "F32" and dst == "F32"
    if op == "ARGSORT":
        if not is_contiguous(t) or not is_contiguous(s0):
            return False
        return dev.vulkan_memory_model or t.ne[0] <= 1 << min(dev.max_workgroup_size_log2, NUM_ARGSORT_PIPELINES - 1)
    if op == "TOP_K":
        if not is_contiguous(t) or not is_contiguous(s0):
            return False
        return True     # a k no pipeline_topk_f32 covers falls back to radix select, always built (vk:3541-3545)
    if op == "UPSCALE":
        mode = op_param(t, 0)
        return (not mode & SCALE_FLAG_ANTIALIAS or (mode & 0xFF) == SCALE_MODE_BILINEAR) and a == "F32"
    if op == "ACC":
        return a == "F32" and tname(s1) == "F32" and dst == "F32"
    if op == "SET":
        return a == tname(s1) == dst and a in ("F32", "I32")
    if op == "CONCAT":
        return _concat_supported(s0, s1, t)
    if op == "ADD1":
        return (a, tname(s1)) in (("F32", "F32"), ("F16", "F32"), ("F16", "F16"))
    if op == "ARANGE":
        return dst == "F32"
    if op == "FILL":
        return dst in FLOAT16_32
    if op in ("PAD", "PAD_REFLECT_1D", "ROLL", "TIMESTEP_EMBEDDING", "SSM_CONV"):
        return a == "F32"
    if op == "SOFT_MAX":
        return is_contiguous(s0) and a == "F32" and (s1 is None or tname(s1) in FLOAT16_32)
    if op == "SOFT_MAX_BACK":
        return is_contiguous(s0) and a == "F32" and is_contiguous(s1) and tname(s1) == "F32"
    if op in ("SUM", "SUM_ROWS", "MEAN"):
        return a == "F32" and is_contiguous_rows(s0)
    if op == "CUMSUM":
        return dev.has("ARITHMETIC") and dev.compute_full_subgroups and a == "F32" and is_contiguous_rows(s0)
    if op in ("DSV4_HC_COMB", "DSV4_HC_PRE", "DSV4_HC_POST"):
        if dst != "F32" or any(x is not None and tname(x) != "F32" for x in t.src[:GGML_MAX_SRC]):
            return False
        if (op == "DSV4_HC_PRE" and s0.ne[1] != 4) or (op == "DSV4_HC_POST" and s1.ne[1] != 4):
            return False
        return op != "DSV4_HC_COMB" or dsv4_hc_comb_pipeline(dev)
    if op == "SOLVE_TRI":
        if dst != "F32" or a != "F32":
            return False
        n, k = s0.ne[0], s1.ne[0]
        return k <= 1 << dev.max_workgroup_size_log2 and dev.max_compute_shared_memory_size // ((n + k) * 4) > 0
    if op == "CROSS_ENTROPY_LOSS":
        return (is_contiguous(s0) and a == "F32" and is_contiguous(s1) and tname(s1) == "F32" and same_shape(s0, s1)
                and is_contiguous(t) and t.ne == (1, 1, 1, 1) and dst == "F32")
    if op == "CROSS_ENTROPY_LOSS_BACK":
        s2 = t.src[2]
        return (is_contiguous(s0) and a == "F32" and s0.ne == (1, 1, 1, 1) and is_contiguous(s1) and tname(s1) == "F32"
                and is_contiguous(s2) and tname(s2) == "F32" and same_shape(s1, s2) and same_shape(s1, t)
                and is_contiguous(t) and dst == "F32")
    if op == "COUNT_EQUAL":
        return is_contiguous(s0) and a == "I32" and is_contiguous(s1) and tname(s1) == "I32"
    if op == "IM2COL":
        return is_contiguous(s1) and tname(s1) == "F32" and dst in FLOAT16_32
    if op == "IM2COL_3D":
        return tname(s1) == "F32" and dst in FLOAT16_32
    if op == "CONV_2D_DW":
        return a in FLOAT16_32 and tname(s1) == "F32"
    if op in ("POOL_1D", "POOL_2D"):
        return is_contiguous(s0) and a == "F32"
    if op == "GATED_LINEAR_ATTN":
        return a == "F32" and dst == "F32" and s0.ne[0] == 64
    if op == "LIGHTNING_INDEXER":
        return _lightning_indexer_supported(dev, t)
    if op == "GATED_DELTA_NET":
        return (t.src[2].ne[0] in (16, 32, 64, 128) and all(src(t, i) is not None and tname(t.src[i]) == "F32"
                                                           for i in range(6)) and dst == "F32")
    if op == "SSM_SCAN":
        return _ssm_scan_supported(dev, t)
    if op == "CONV_TRANSPOSE_1D":
        return a == "F32" and tname(s1) == "F32"
    if op == "COL2IM_1D":
        return a in ("F32", "F16", "BF16") and dst == a and is_contiguous(s0) and is_contiguous(t)
    if op in ("CONV_2D", "CONV_TRANSPOSE_2D"):
        transpose = op == "CONV_TRANSPOSE_2D"
        cout, cin = (s0.ne[2], s0.ne[3]) if transpose else (s0.ne[3], s0.ne[2])
        return (a in FLOAT16_32 and s0.nb[0] in (2, 4) and tname(s1) == "F32" and dst == "F32" and cout == t.ne[2]
                and cin == s1.ne[2] and is_contiguous(s0) and is_contiguous(s1) and is_contiguous(t))
    if op == "CONV_3D":
        return (a in FLOAT16_32 and tname(s1) == "F32" and dst == "F32" and is_contiguous(s0) and is_contiguous(s1)
                and is_contiguous(t))
    return False


def _concat_supported(s0: Tensor, s1: Tensor, dst: Tensor) -> bool:
    """ggml_vk_concat_supported (vk:321)"""
    if s0.type != s1.type or s0.type != dst.type:
        return False
    if not is_quantized(s0.type):
        return type_size(s0.type) in (1, 2, 4, 8)
    return is_contiguous_rows(s0) and is_contiguous_rows(s1) and is_contiguous_rows(dst)


def _lightning_indexer_supported(dev: VulkanDevice, t: Tensor) -> bool:
    """vk:15812-15843. Every tensor's offset must be a multiple of minStorageBufferOffsetAlignment: the
    buffers place tensors at multiples of their alignment, so what is tested here is the view offset."""
    q, k = t.src[0], t.src[1]
    if tname(k) not in LIGHTNING_INDEXER_K_TYPES or not dev.fp16 or q.ne[0] != 128:
        return False
    for x in (*t.src[:4], t):
        ts = type_size(x.type)
        if x.nb[0] != ts or x.view_offs % dev.min_storage_buffer_offset_alignment:
            return False
        if any(x.nb[i] % ts for i in range(1, 4)):
            return False
    return True


def _ssm_scan_supported(dev: VulkanDevice, t: Tensor) -> bool:
    """vk:15857-15893: Mamba-2 only (A of one value per head), d_state 128 or 256."""
    if any(src(t, i) is not None and is_quantized(t.src[i].type) for i in range(6)):
        return False
    if src(t, 6) is not None and tname(t.src[6]) != "I32":
        return False
    s0 = t.src[0]
    if tname(s0) != "F32" or tname(t) != "F32":
        return False
    if not (src(t, 3) is not None and t.src[3].nb[1] == 4):
        return False
    d_state, head_dim = s0.ne[0], s0.ne[1]
    if d_state not in (128, 256) or head_dim % 16:
        return False
    return d_state * 4 <= dev.max_compute_shared_memory_size and dev.has("BASIC")


def op_batch_size(t: Tensor) -> int:
    """ggml_vk_get_op_batch_size (ggml-vulkan-debug.cpp:766)"""
    if t.op == "GET_ROWS":
        return 0
    if t.op == "MUL_MAT":
        return t.ne[1]
    if t.op in ("MUL_MAT_ID", "ROPE", "ROPE_BACK"):
        return t.ne[2]
    return nrows(t)


def offload_op(t: Tensor) -> bool:
    """ggml_backend_vk_device_offload_op (vk:15973)"""
    return op_batch_size(t) >= OP_OFFLOAD_MIN_BATCH


# --- graph_optimize (vk:14663-15040) -------------------------------------------------------------------

# ggml-vulkan-types.h:506-559, in the order graph_optimize tries them
TOPK_MOE_PATTERNS = [
    ("SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"),
    ("UNARY", "RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"),
    ("UNARY", "SQRT", "RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV",
     "RESHAPE"),
    ("SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS"),
    ("ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SOFT_MAX", "RESHAPE"),
]
SNAKE = ("MUL", "SIN", "SQR", "MUL", "ADD")
TOPK_QSA = ("GET_ROWS", "PERMUTE", "CONT", "CPY", "RESHAPE", "ADD", "TOP_K")
KEEP_PATTERNS = [
    ("RMS_NORM", "MUL", "ADD", "MUL"),
    ("RMS_NORM", "MUL", "ADD"),
    ("RMS_NORM", "MUL", "ROPE", "VIEW", "SET_ROWS"),
    ("RMS_NORM", "VIEW", "SET_ROWS"),
    ("ROPE", "VIEW", "SET_ROWS"),
]
HC_POST_GATE = ("SCALE", "UNARY", "SCALE", "DSV4_HC_POST")
# every pattern a node may start, which the first pass then leaves for its own turn (vk:14850-14863)
PATTERNS_BY_FIRST_OP: dict[str, list[tuple[str, ...]]] = {}
for _p in [*TOPK_MOE_PATTERNS, SNAKE, TOPK_QSA, *KEEP_PATTERNS, HC_POST_GATE]:
    PATTERNS_BY_FIRST_OP.setdefault(_p[0], []).append(_p)
NUM_TO_CHECK = 20
# (earlier op, later op) that may read the earlier one in one set, when it is next (vk:14866-14878)
FUSED_NEXT = {("MUL_MAT", "ADD"), ("MUL_MAT_ID", "ADD_ID"), ("MUL_MAT_ID", "MUL"), ("ADD", "ADD"),
              ("SSM_CONV", "ADD"), ("SSM_CONV", "UNARY")}
UNARY_MUL_OPS = {8, 7, 10, 15}      # GELU, SIGMOID, SILU, SOFTPLUS: ggml_vk_unary_mul_op_index >= 0 (vk:9953)


def _earlier_reads(nodes: list[Tensor]) -> tuple[list[set[int]], list[list[int]]]:
    """is_src_of (vk:14676-14698) over a split's nodes, by index: for each j, the set of c < j such
    that node j reads node c, or their storage may overlap (a view of one reads what the other
    writes, or both view one tensor). graph_optimize asks it of every pair in a window of 20 nodes;
    the sets are found in one pass, through the earlier nodes indexed by their storage roots,
    instead of pair by pair. Also the converse: for each c, the j > c whose sets hold it."""
    index: dict[Tensor, int] = {}
    of_root: dict[Tensor, list[int]] = {}            # storage root -> the nodes of that root
    nonempty_of_root: dict[Tensor, list[int]] = {}   # the same, the non-empty nodes only
    readers: dict[Tensor, list[int]] = {}            # storage root -> the non-empty nodes reading it
    earlier: list[set[int]] = []
    later: list[list[int]] = [[] for _ in nodes]
    for j, t in enumerate(nodes):
        root = t if t.view_src is None else t.view_src
        cands = set(of_root.get(root, ()))                      # base(dst) == base(src)
        if t.op in EMPTY_OPS:
            for x in t.src:
                if x is not None and x in index:                # dst->src[s] == src
                    cands.add(index[x])
        else:
            cands.update(readers.get(root, ()))                 # base(dst) == base(src->src[s])
            for x in t.src:
                if x is None:
                    continue
                if x in index:                                  # dst->src[s] == src
                    cands.add(index[x])
                r = x if x.view_src is None else x.view_src
                cands.update(nonempty_of_root.get(r, ()))       # base(dst->src[s]) == base(src)
                readers.setdefault(r, []).append(j)
            nonempty_of_root.setdefault(root, []).append(j)
        of_root.setdefault(root, []).append(j)
        index[t] = j
        earlier.append(cands)
        for c in cands:
            later[c].append(j)
    return earlier, later


def _can_fuse_unary_mul(nodes: list[Tensor], u: int, m: int) -> bool:
    """ggml_vk_can_fuse_unary_mul (vk:13422-13450)"""
    unary, mul = nodes[u], nodes[m]
    if op_param(unary, 0) not in UNARY_MUL_OPS or tname(unary) not in FLOAT16_32 or unary.type != mul.type:
        return False
    if src(mul, 0) is not unary and src(mul, 1) is not unary:
        return False
    other = mul.src[1] if mul.src[0] is unary else mul.src[0]
    if other is None or other.type != unary.type or not is_contiguous_1(other) or not is_contiguous_1(unary.src[0]):
        return False
    return can_repeat(other, unary) if mul.src[0] is unary else can_repeat(unary, mul.src[0])


def graph_optimize(nodes: list[Tensor], add_alloc_dep, counts: dict[Tensor, int]) -> None:
    """ggml_vk_graph_optimize (vk:14663-15040), in place. counts: the whole graph's use counts
    (cgraph->use_counts, which a split's graph view shares)."""
    n = len(nodes)
    ops = [t.op for t in nodes]
    empty = [op in EMPTY_OPS for op in ops]
    # is_src_of(nodes[j], nodes[c]) for c < j; the C asks it of the c in [first_unused, j) that are
    # unused, and every c before first_unused is used, so "unused" alone selects them here
    earlier, later = _earlier_reads(nodes)
    used = [False] * n
    pending = [len(cs) for cs in earlier]     # per j, how many of earlier[j] are still unused
    new_order: list[Tensor] = []
    done: set[Tensor] = set()       # used_node_set
    first_unused = 0

    # the patterns whose ops start at each index (the nodes must still be unused to match)
    at: list[list[tuple[str, ...]]] = [
        [p for p in PATTERNS_BY_FIRST_OP[op] if tuple(ops[i:i + len(p)]) == p] if op in PATTERNS_BY_FIRST_OP else []
        for i, op in enumerate(ops)]

    def match(pattern, start: int) -> bool:
        return pattern in at[start] and not any(used[start:start + len(pattern)])

    def settled_between(lo: int, hi: int) -> bool:
        """empty_or_scheduled_between (vk:14705)"""
        return all(used[v] or op_is_empty(nodes[v].op) for v in range(lo, hi))

    def mark_used(i: int) -> None:
        if not used[i]:
            used[i] = True
            for j in later[i]:
                pending[j] -= 1

    def take(idxs) -> None:
        nonlocal first_unused
        for i in idxs:
            new_order.append(nodes[i])
            done.add(nodes[i])
            mark_used(i)
        while first_unused < n and used[first_unused]:
            first_unused += 1

    def keep_alive(pattern, last: int) -> None:
        """add_pattern_alloc_deps (vk:14756-14770): the pattern's outside inputs live through `last`."""
        seen: set[Tensor] = set()
        for j in range(len(pattern)):
            node = nodes[first_unused + j]
            for s in node.src[:GGML_MAX_SRC]:
                if s is not None and s not in seen:
                    seen.add(s)
                    add_alloc_dep(s, nodes[last])
            seen.add(node)

    qsa_covering: dict[int, list[int]] = {}      # index -> the QSA pattern starts whose span holds it
    for i, pats in enumerate(at):
        if TOPK_QSA in pats:
            for o in range(len(TOPK_QSA)):
                qsa_covering.setdefault(i + o, []).append(i)

    may_be_protected = [bool(at[i]) or i in qsa_covering for i in range(n)]

    def protected(j: int) -> bool:
        """j starts a pattern, or lies inside a QSA one (vk:14841-14863)"""
        return (any(match(p, j) for p in at[j] if p is not TOPK_QSA)
                or any(match(TOPK_QSA, i) for i in qsa_covering.get(j, ())))

    while first_unused < n:
        if at[first_unused]:      # a pattern starts at first_unused (none can where `at` lists none)
            pattern = next((p for p in TOPK_MOE_PATTERNS if match(p, first_unused)), None)     # vk:14772-14796
            if pattern is not None:
                last = first_unused + len(pattern) - 1
                if last + 1 < n and nodes[last + 1].op == "SCALE":     # a trailing scale fused too
                    last += 1
                keep_alive(pattern, last)
                take(range(first_unused, first_unused + len(pattern)))
                continue
            pattern = next((p for p in (SNAKE, TOPK_QSA, *KEEP_PATTERNS) if match(p, first_unused)), None)
            if pattern is not None:
                take(range(first_unused, first_unused + len(pattern)))
                continue
            if match(HC_POST_GATE, first_unused):
                keep_alive(HC_POST_GATE, first_unused + len(HC_POST_GATE) - 1)
                take(range(first_unused, first_unused + len(HC_POST_GATE)))
                continue

        current = [first_unused]
        window = range(first_unused + 1, min(first_unused + NUM_TO_CHECK, n))
        for j in window:
            if used[j] or empty[j] or (may_be_protected[j] and protected(j)):
                continue
            if pending[j]:
                # j may join only if its one unused dependency is the set's last node and they fuse
                last = current[-1]
                if pending[j] > 1 or used[last] or last not in earlier[j]:
                    continue
                if not _may_follow(nodes, last, j, settled_between):
                    continue
            current.append(j)
            _pull_forward(nodes, j, current, used, mark_used, done, counts, earlier)
        # second pass: views, unless that would split ADD -> ADD or ADD -> RMS_NORM (vk:15005-15027)
        if ops[current[-1]] != "ADD":
            for j in window:
                if used[j] or not empty[j]:
                    continue
                if pending[j]:      # every dependency not yet scheduled must be in the set
                    for c in earlier[j]:
                        if not used[c] and c not in current:
                            break
                    else:
                        current.append(j)
                else:
                    current.append(j)
        take(current)
    nodes[:] = new_order


def _may_follow(nodes: list[Tensor], c: int, j: int, settled_between) -> bool:
    """The dependencies that let j join the set whose last node c is (vk:14866-14878): the pair fuses."""
    a, b = nodes[c].op, nodes[j].op
    if b == "MUL" and a in ("RMS_NORM", "UNARY"):
        return settled_between(c + 1, j)
    return j == c + 1 and (a, b) in FUSED_NEXT


def _pull_forward(nodes: list[Tensor], j: int, current: list[int], used: list[bool], mark_used, done: set[Tensor],
                  counts: dict[Tensor, int], earlier: list[set[int]]) -> None:
    """After taking node j, pull its fusion partners into the set (vk:14880-14995)."""
    n = len(nodes)

    def pull_first(k_range, pred) -> None:
        for k in k_range:
            if pred(nodes[k]):
                current.append(k)
                mark_used(k)
                return

    def ready(t: Tensor) -> bool:     # a weight, or computed already
        return t.op == "NONE" or t in done

    rope_idx = j
    if j > 0 and nodes[j].op == "MUL" and nodes[j - 1].op == "RMS_NORM":
        for k in range(j + 1, min(j + 15, n)):      # RMS_NORM + MUL: the ROPE that reads it
            r = nodes[k]
            if (r.op == "ROPE" and r.src[0] is nodes[j] and r.src[1].op == "NONE"
                    and (src(r, 2) is None or r.src[2].op == "NONE")):
                rope_idx = k
                current.append(k)
                mark_used(k)
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
            if any(rope_idx < c and not used[c] and c != view_idx and not op_is_empty(nodes[c].op)
                   for c in earlier[set_rows_idx]):
                can_pull = False
            if can_pull:
                current += [view_idx, set_rows_idx]
                mark_used(view_idx)
                mark_used(set_rows_idx)
    window = range(j + 1, min(j + 15, n))
    if j > 0 and nodes[j].op == "ADD_ID" and nodes[j - 1].op == "MUL_MAT_ID":      # MUL_MAT_ID + ADD_ID + MUL
        pull_first(window, lambda k: k.op == "MUL" and k.src[0] is nodes[j] and ready(k.src[1]))
    if j > 0 and nodes[j].op == "ADD" and nodes[j - 1].op == "MUL_MAT":            # MUL_MAT + ADD + ADD
        pull_first(window, lambda k: k.op == "ADD" and k.src[0] is nodes[j] and ready(k.src[1]))
    if j > 0 and nodes[j].op == "ADD" and nodes[j - 1].op == "SSM_CONV":           # SSM_CONV + ADD + UNARY
        pull_first(window, lambda k: k.op == "UNARY" and k.src[0] is nodes[j])
    if j > 0 and nodes[j].op == "UNARY":                                           # UNARY + MUL
        for k in window:
            mul = nodes[k]
            if mul.op != "MUL" or (src(mul, 0) is not nodes[j] and src(mul, 1) is not nodes[j]):
                continue
            if not ready(mul.src[1] if mul.src[0] is nodes[j] else mul.src[0]):
                continue
            if not _can_fuse_unary_mul(nodes, j, k):
                continue
            current.append(k)
            mark_used(k)
            break


# --- the device ---------------------------------------------------------------------------------------

def vulkan_host_buft(dev0: VulkanDevice) -> BufferType:
    """ggml_backend_vk_host_buffer_type (vk:13093-13125), of device 0."""
    return BufferType("Vulkan_Host", dev0.min_memory_map_alignment, dev0.suballocation_block_size, is_host=True,
                      device="Vulkan0", buffer_extra=HOST_BUFFER_EXTRA)


def vulkan_backend(index: int, memory: int, dev: VulkanDevice, host_buft: BufferType) -> Backend:
    """Device Vulkan<index> with `memory` bytes free. All Vulkan devices share device 0's Vulkan_Host."""
    name = f"Vulkan{index}"
    buft = BufferType(name, dev.min_storage_buffer_offset_alignment, dev.suballocation_block_size, device=name)
    return Backend(name, "IGPU" if dev.integrated else "GPU", buft, supports_op=partial(supports_op, dev),
                   supports_buft=lambda b: b.name == buft.name, offload_op=offload_op, host_buft=host_buft,
                   is_async_with_events=True, device_name=name, memory=memory, graph_optimize=graph_optimize,
                   mmap_support=not dev.integrated)
