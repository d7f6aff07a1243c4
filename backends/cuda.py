"""CUDA devices: ggml/src/ggml-cuda/ggml-cuda.cu and fattn.cu of llama.cpp 0c1e57098 ("cu:" and
"fa:" lines below). The rules are read from that source and unit-tested against its arithmetic;
no GPU has measured them.

- device, backend and buffer type "CUDA<n>"; type GPU (an integrated device, IGPU, is not modelled);
  caps async + events (cu:5123-5129), so two or more devices pipeline;
- buffer type: alignment 128 (cu:897), max size SIZE_MAX (cu:926), get_alloc_size (cu:903-919):
  FLASH_ATTN_EXT takes ggml_cuda_flash_attn_ext_get_alloc_size, and a quantized tensor whose ne0 is
  not a multiple of MATRIX_ROW_PADDING (512) gets the row bytes up to the next multiple;
- host buffer type "CUDA_Host" (cu:1257-1320): the CPU's alignment (32) and alloc size, is_host;
- supports_buft: its own buffer type only (cu:5630; CUDA_Host too on integrated devices);
- offload_op: batch >= 32 (GGML_OP_OFFLOAD_MIN_BATCH's default, cu:5825), the batch being 0 for
  GET_ROWS, ne[1] for MUL_MAT, ne[2] for MUL_MAT_ID/ROPE/ROPE_BACK, else ggml_nrows (cu:5636-5655);
- supports_op (cu:5149-5628): the whole switch, every op. FLASH_ATTN_EXT is supported when
  ggml_cuda_get_best_fattn_kernel finds a kernel (fa:541-720), which depends on the compute
  capability; LIGHTNING_INDEXER as ggml_cuda_lightning_indexer_supported (lightning-indexer.cu:536);
- graph_optimize (cu:4522-4612): allocation dependencies for two MoE fusions, the weighted reduction
  of the experts' outputs (cu:3044) and the top-k gating (cu:2813); the node reorder that follows
  runs only with GGML_CUDA_GRAPH_OPT=1, so it is not modelled;
- no split buffer type in this tree (the reg has no ggml_backend_split_buffer_type, cu:5775-5805),
  so llama.cpp refuses -sm row.

The build is assumed to be the default one for the device's own architecture, with CUDA 11.7 or
later: FlashAttention vector kernels for f16-f16, q4_0-q4_0, q8_0-q8_0 and bf16-bf16
(GGML_CUDA_FA_QUANTS, ggml/CMakeLists.txt:207), ggml_cuda_highest_compiled_arch(cc) == cc, and
GGML_CUDA_USE_CUB (common.cuh:114), so ARGSORT and TOP_K take any row length and the shared memory
per block (smpb), which only the non-CUB ARGSORT reads, decides nothing. Only NVIDIA devices
(cc < 0x100000), no MUSA or HIP branch. GGML_CUDA_DISABLE_FUSION and GGML_OP_OFFLOAD_MIN_BATCH are
taken unset.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import cpu
from .layout import (
    GGML_MAX_SRC, can_fuse_subgraph, is_contiguous, is_contiguous_1, is_contiguous_2, is_contiguous_rows, nrows,
    op_param, same_shape, src, tname,
)
from .types import SIZE_MAX, Backend, BufferType, GraphView
from ..planner import ggml
from ..planner.ggml import (GGML_HINT_SRC0_IS_HADAMARD, PREC_F32, Tensor, blck_size, ggml_assert, is_contiguous_m_n,
                            is_quantized, row_size, type_size)

ALIGNMENT = 128
MATRIX_ROW_PADDING = 512          # common.cuh:186
OP_OFFLOAD_MIN_BATCH = 32
FATTN_KQ_STRIDE = 256             # fattn-common.cuh:9
QK_K = 256
CC_VOLTA, CC_TURING, CC_ADA_LOVELACE = 700, 750, 890   # common.cuh:52-56

# best_fattn_kernel (fa:517)
FATTN_NONE, FATTN_VEC, FATTN_TILE, FATTN_MMA_F16 = 0, 100, 200, 400

# fa:436-494 with the default GGML_CUDA_FA_QUANTS: the compiled vector kernels (K type, V type)
FA_VEC_CASES = {("F16", "F16"), ("Q4_0", "Q4_0"), ("Q8_0", "Q8_0"), ("BF16", "BF16")}
FA_KV_TYPES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}        # fa:525

MUL_MAT_TYPES = {"F32", "F16", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "NVFP4", "Q2_K", "Q3_K",
                 "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S",
                 "IQ3_XXS", "IQ4_NL", "IQ4_XS", "BF16"}                                      # cu:5242-5272
GET_ROWS_TYPES = {"F16", "F32", "BF16", "I32", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                  "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
                  "IQ4_XS"}                                                                  # cu:5279-5310
SET_ROWS_F32_DST = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"}    # cu:5318-5330
CPY_PAIRS = {("F32", "Q8_0"), ("Q8_0", "F32"), ("F32", "Q4_0"), ("Q4_0", "F32"), ("F32", "Q4_1"), ("Q4_1", "F32"),
             ("F32", "Q5_0"), ("Q5_0", "F32"), ("F32", "Q5_1"), ("Q5_1", "F32"), ("F32", "IQ4_NL"),
             ("F32", "I32"), ("I32", "F32"), ("I32", "I32")}                                 # cu:5339-5389
FLOATS = {"F32", "BF16", "F16"}
N_UNARY_OPS = 22            # enum ggml_unary_op: every one is in the switch (cu:5164-5192)
N_GLU_OPS = 7               # enum ggml_glu_op: likewise (cu:5200-5211)
GGML_UNARY_OP_XIELU = 17
GGML_GLU_OP_SWIGLU_OAI, GGML_GLU_OP_SWIGLU_CLAMP = 3, 6
# lightning-indexer.cu:575-587
LIGHTNING_INDEXER_K_TYPES = {"F32", "BF16", "F16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0"}
# the ops supports_op accepts whatever their operands (cu:5395-5401, 5472-5485, 5521-5526, 5552-5555, 5587-5599,
# 5612-5621); ARGSORT and TOP_K because CUDA >= 11.7 defines GGML_CUDA_USE_CUB (common.cuh:114): sorting by CUB
# takes any row length (cu:5562-5580)
ALWAYS = {"NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "ADD_ID", "ADD1", "SQR", "SQRT", "SIN", "COS", "CLAMP",
          "LOG", "DUP", "ARGMAX", "COUNT_EQUAL", "CONT", "DIAG_MASK_INF", "SOFT_MAX", "CONV_TRANSPOSE_2D", "POOL_1D",
          "POOL_2D", "PAD", "UPSCALE", "PAD_REFLECT_1D", "ARANGE", "TIMESTEP_EMBEDDING", "LEAKY_RELU", "RWKV_WKV6",
          "GATED_LINEAR_ATTN", "RWKV_WKV7", "GATED_DELTA_NET", "CROSS_ENTROPY_LOSS", "CROSS_ENTROPY_LOSS_BACK",
          "OPT_STEP_ADAMW", "OPT_STEP_SGD", "FILL", "CUMSUM", "TRI", "DIAG", "SOLVE_TRI", "ARGSORT", "TOP_K"}


# --- FlashAttention kernel choice and its scratch memory (fa:436-756) -----------------------------

def _fa_vec_case(head_size: int, type_k: str, type_v: str) -> bool:
    """ggml_cuda_get_fattn_vec_case (fa:436) != nullptr: an f32 K or V matches the f16 case."""
    if head_size not in (64, 128, 256):
        return False
    return any((type_k == k or (type_k == "F32" and k == "F16")) and (type_v == v or (type_v == "F32" and v == "F16"))
               for k, v in FA_VEC_CASES)


def _shall_use_sparse(cc: int, dst: Tensor, ncols1: int, ncols2: int) -> bool:
    """ggml_cuda_flash_attn_ext_mma_f16_shall_use_sparse (fa:128-150); n_kv_max is op_params[4]."""
    q, k, mask = dst.src[0], dst.src[1], src(dst, 3)
    n_kv_max = op_param(dst, 4)
    n_gather = (min(q.ne[1], 64 // ncols2) if ncols1 == 1 else ncols1) * n_kv_max
    return (cc >= CC_TURING and mask is not None and n_kv_max > 0 and op_param(dst, 1, 0.0) == 0.0
            and op_param(dst, 2, 0.0) == 0.0 and mask.ne[0] == k.ne[1] and mask.ne[1] >= q.ne[1] and mask.ne[2] == 1
            and k.ne[1] >= max(4096, 2 * n_gather))


def _may_use_sparse(dkq: int, dv: int, ncols1: int, ncols2: int) -> bool:
    """fattn-mma-f16.cuh:1797"""
    return ((dkq, dv, ncols1, ncols2) in {(512, 512, 1, 8), (576, 512, 1, 16), (256, 256, 1, 8), (256, 256, 8, 8)})


def best_fattn_kernel(cc: int, dst: Tensor) -> int:
    """ggml_cuda_get_best_fattn_kernel (fa:541-720) for an NVIDIA device of compute capability cc."""
    q, k, v, mask = dst.src[0], dst.src[1], dst.src[2], src(dst, 3)
    ggml_assert(q.ne[2] % k.ne[2] == 0, "fattn.cu:554", "Q->ne[2] % K->ne[2] == 0")
    gqa_ratio = q.ne[2] // k.ne[2]
    max_bias = op_param(dst, 1, 0.0)
    gqa_opt = gqa_ratio >= 2 and mask is not None and max_bias == 0.0 and k.ne[1] % FATTN_KQ_STRIDE == 0
    for t in (q, k, v, mask):
        if t is not None and not is_quantized(t.type) and any(t.nb[i] % 16 for i in (1, 2, 3)):
            gqa_opt = False

    d = k.ne[0]
    if d in (40, 64, 72, 80, 96, 128, 112, 256):
        if v.ne[0] != d:
            return FATTN_NONE
    elif d == 192:
        if v.ne[0] != 128 or not gqa_opt or gqa_ratio % 8 != 0:
            return FATTN_NONE
    elif d == 320:
        if v.ne[0] != 256 or not gqa_opt or gqa_ratio % 32 != 0:
            return FATTN_NONE
    elif d == 512:
        if v.ne[0] != d or not gqa_opt:
            return FATTN_NONE
    elif d == 576:
        if v.ne[0] != 512 or not gqa_opt:
            return FATTN_NONE
    else:
        return FATTN_NONE
    if tname(k) not in FA_KV_TYPES or tname(v) not in FA_KV_TYPES:
        return FATTN_NONE
    if mask is not None and mask.ne[2] != 1:
        return FATTN_NONE

    can_use_vec = q.ne[0] <= 256 and q.ne[0] % 64 == 0 and q.ne[0] != 192 and k.ne[1] % FATTN_KQ_STRIDE == 0
    quantized_kv = is_quantized(k.type) or is_quantized(v.type)
    if cc >= CC_TURING and q.ne[0] not in (40, 72):                               # fa:638-671
        if can_use_vec:
            if not quantized_kv:
                sparse = (gqa_opt and gqa_ratio > 4 and _may_use_sparse(k.ne[0], v.ne[0], 1, 8)
                          and _shall_use_sparse(cc, dst, 1, 8))
                if (not sparse and cc >= CC_ADA_LOVELACE and q.ne[1] == 1 and q.ne[3] == 1
                        and not (gqa_ratio > 4 and (q.ne[0] >= 256 or k.ne[1] >= 8192))):
                    return FATTN_VEC
            elif (cc >= CC_ADA_LOVELACE and q.ne[1] <= 2) or (cc < CC_ADA_LOVELACE and q.ne[1] == 1):
                return FATTN_VEC
            if not gqa_opt and q.ne[1] == 1:
                return FATTN_VEC
        return FATTN_MMA_F16

    ncols2_max = 32 if q.ne[0] == 320 else (16 if q.ne[0] in (576, 192) else 8)
    gqa_ratio_eff = 1
    while gqa_ratio % (2 * gqa_ratio_eff) == 0 and gqa_ratio_eff < ncols2_max:
        gqa_ratio_eff *= 2
    if cc == CC_VOLTA and q.ne[0] not in (40, 72):                                # fa:673-681
        if can_use_vec and q.ne[1] * gqa_ratio_eff <= 2:
            return FATTN_VEC
        return FATTN_TILE if q.ne[1] * gqa_ratio_eff <= 16 else FATTN_MMA_F16
    if can_use_vec:                                                               # fa:705-719
        if not quantized_kv:
            if q.ne[1] == 1 and not gqa_opt:
                return FATTN_VEC
        elif q.ne[1] <= 2:
            return FATTN_VEC
    return FATTN_TILE


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def fattn_alloc_size(cc: int, dst: Tensor) -> int:
    """ggml_cuda_flash_attn_ext_get_alloc_size (fa:722-756): the output, then f16 copies of K and V
    where the chosen kernel needs them (ggml_cuda_flash_attn_ext_get_f16_extra_data,
    fattn-common.cuh:53-82), each at a 128-byte boundary counted from the tensor's data (NULL while
    gallocr measures)."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    kernel = best_fattn_kernel(cc, dst)
    if kernel in (FATTN_TILE, FATTN_MMA_F16):
        need_k = need_v = True
    elif kernel == FATTN_VEC:
        f16_fallback = not _fa_vec_case(q.ne[0], tname(k), tname(v))
        need_k = tname(k) == "F32" or f16_fallback
        need_v = tname(v) == "F32" or f16_fallback
    else:
        need_k = need_v = False
    end = dst.nbytes
    if need_k and tname(k) != "F16":
        end = _pad(end, 128) + k.nelements() * 2
    v_is_k_view = v.view_src is not None and (v.view_src is k or (v.view_src is k.view_src and v.view_offs == k.view_offs))
    if need_v and tname(v) != "F16" and not v_is_k_view:
        end = _pad(end, 128) + v.nelements() * 2
    return end


def alloc_size(cc: int, t: Tensor) -> int:
    """ggml_backend_cuda_buffer_type_get_alloc_size (cu:903-919)."""
    size = fattn_alloc_size(cc, t) if t.op == "FLASH_ATTN_EXT" else t.nbytes
    ne0 = t.ne[0]
    if is_quantized(t.type) and ne0 % MATRIX_ROW_PADDING != 0:
        ggml_assert(t.nb[0] == type_size(t.type), "ggml-cuda.cu:914", "tensor->nb[0] == ggml_element_size(tensor)")
        size += row_size(t.type, MATRIX_ROW_PADDING - ne0 % MATRIX_ROW_PADDING)
    return size


# --- offload_op and supports_op ------------------------------------------------------------------

def op_batch_size(t: Tensor) -> int:
    """get_op_batch_size (cu:5636-5649)"""
    if t.op == "GET_ROWS":
        return 0
    if t.op == "MUL_MAT":
        return t.ne[1]
    if t.op in ("MUL_MAT_ID", "ROPE", "ROPE_BACK"):
        return t.ne[2]
    return nrows(t)


def offload_op(t: Tensor) -> bool:
    """ggml_backend_cuda_device_offload_op (cu:5651)"""
    return op_batch_size(t) >= OP_OFFLOAD_MIN_BATCH


def supports_op(cc: int, device: str, t: Tensor) -> bool:
    """ggml_backend_cuda_device_supports_op (cu:5149-5628), every op."""
    for s in t.src[:GGML_MAX_SRC]:   # every source in a CUDA buffer must be on this device (cu:5152-5160)
        buft = s.buffer.buft if s is not None and s.buffer is not None else None
        if buft is not None and is_cuda_buft(buft) and buft.device != device:
            return False
    op, s0, s1 = t.op, src(t, 0), src(t, 1)
    a, dst = tname(s0) if s0 is not None else None, tname(t)
    if op in ALWAYS:
        return True
    if op == "UNARY":                                                                # cu:5163-5196
        unary = op_param(t, 0)
        return 0 <= unary < N_UNARY_OPS and not (unary == GGML_UNARY_OP_XIELU and a == "BF16") and is_contiguous(s0)
    if op == "GLU":                                                                  # cu:5197-5214
        glu = op_param(t, 0)
        if not 0 <= glu < N_GLU_OPS or (a == "BF16" and glu in (GGML_GLU_OP_SWIGLU_OAI, GGML_GLU_OP_SWIGLU_CLAMP)):
            return False
        return is_contiguous_1(s0)
    if op in ("MUL_MAT", "MUL_MAT_ID"):                                              # cu:5215-5274
        if s0.nb[0] != type_size(s0.type) or s1.nb[0] != type_size(s1.type):
            return False
        if tname(s1) == "F16" and a != "F16" and not _mul_mat_use_fwht(t):
            return False
        if op == "MUL_MAT_ID" and op_param(t, 3) == PREC_F32:                       # cu:5226
            return False
        return a in MUL_MAT_TYPES
    if op == "OUT_PROD":
        return dst == "F32" and a == "F32" and tname(s1) == "F32"                    # cu:5275
    if op == "GET_ROWS":                                                             # cu:5277-5313
        if a in ("IQ4_NL", "MXFP4"):
            return s0.ne[0] % QK_K == 0
        return a in GET_ROWS_TYPES
    if op == "GET_ROWS_BACK":
        return dst == "F32" and a == "F32" and t.ne[2] == 1 and t.ne[3] == 1          # cu:5314-5317
    if op == "SET_ROWS":                                                             # cu:5318-5331
        return (((dst in SET_ROWS_F32_DST and a == "F32") or (dst == "F16" and a == "F16"))
                and tname(s1) in ("I64", "I32"))
    if op == "SET":
        return dst in ("F32", "I32") and dst == a == tname(s1)                       # cu:5332-5338
    if op == "CPY":                                                                  # cu:5339-5394
        b = tname(s1)
        if (a in FLOATS and b in FLOATS) or (a, b) in CPY_PAIRS:
            return True
        return a == b and is_contiguous(s0) and is_contiguous(s1)
    if op == "REPEAT":
        return a in ("F32", "F16")                                                   # cu:5402-5407
    if op == "REPEAT_BACK":
        return dst == "F32" and s0.ne[2] * s0.ne[3] <= 1 << 15                       # cu:5408
    if op == "CONCAT":                                                               # cu:5410-5444
        return s0.type == s1.type == t.type and (
            (is_quantized(s0.type) and ((op_param(t, 0) == 3 and is_contiguous(s0) and is_contiguous(s1))
                                        or (op_param(t, 0) != 3 and is_contiguous_m_n(s0, 0, 3)
                                            and is_contiguous_m_n(s1, 0, 3)))
             and s0.ne[0] % blck_size(s0.type) == 0 and s1.ne[0] % blck_size(s0.type) == 0)
            or (not is_quantized(s0.type) and blck_size(s0.type) == 1 and type_size(s0.type) in (1, 2, 4, 8)))
    if op == "CONV_TRANSPOSE_1D":
        return a == "F32" and tname(s1) == "F32"                                     # cu:5445-5453
    if op == "COL2IM_1D":                                                            # cu:5454-5461
        return a in FLOATS and dst == a and is_contiguous(s0) and is_contiguous(t)
    if op == "SILU_BACK":
        return is_contiguous(s0) and a == "F32"                                      # cu:5462
    if op in ("NORM", "RMS_NORM", "L2_NORM"):
        return is_contiguous_rows(s0)                                                # cu:5465-5468
    if op in ("RMS_NORM_BACK", "GROUP_NORM"):
        return is_contiguous(s0)                                                     # cu:5469, 5585
    if op == "SCALE":
        return a in ("F32", "BF16") and dst == a                                     # cu:5486
    if op in ("ADD", "SUB", "MUL", "DIV"):                                           # cu:5488-5498
        b = tname(s1)
        if "BF16" in (a, b, dst):
            return a == "BF16" and dst == "BF16" and b in ("BF16", "F32")
        return a in ("F32", "F16") and b in ("F32", "F16") and dst in ("F32", "F16")
    if op == "SSM_SCAN":                                                             # cu:5499-5516
        if src(t, 3).ne[0] == 1:   # Mamba-2
            return s0.ne[0] in (96, 128, 256) and s0.ne[1] % 16 == 0
        return (op_param(t, 0) <= 1 and s0.ne[0] == 16 and s0.ne[1] == 1 and s0.ne[2] % 128 == 0
                and src(t, 4).ne[1] == 1)
    if op == "SSM_CONV":
        return s0.ne[1] % 128 == 0                                                   # cu:5517-5520
    if op == "SOFT_MAX_BACK":
        return op_param(t, 1, 0.0) == 0.0                                            # cu:5527-5531: max_bias
    if op == "ROLL":
        return a == "F32" and is_contiguous(s0)                                      # cu:5532-5536
    if op in ("ROPE", "ROPE_BACK"):
        return s0.nb[0] == type_size(s0.type) and is_contiguous_2(s0)               # cu:5537-5540
    if op in ("IM2COL", "IM2COL_3D", "CONV_2D"):
        return is_contiguous(s0) and is_contiguous(s1)                               # cu:5541-5544
    if op == "CONV_3D":                                                              # cu:5545-5548
        return (a in ("F16", "F32") and tname(s1) == "F32" and dst == "F32" and is_contiguous(s0)
                and is_contiguous(s1) and is_contiguous(t))
    if op == "CONV_2D_DW":
        return a in ("F16", "F32") and tname(s1) == "F32" and dst == "F32"          # cu:5549-5551
    if op == "ACC":
        return is_contiguous(s0) and is_contiguous(s1)                               # cu:5556-5559
    if op == "SUM":
        return is_contiguous_rows(s0)                                                # cu:5560
    if op in ("SUM_ROWS", "MEAN"):
        return a == "F32" and dst == "F32" and is_contiguous_rows(s0)                # cu:5581-5584
    if op == "DSV4_HC_COMB":                                                         # cu:5600-5602
        return a == "F32" and tname(s1) == "F32" and tname(t.src[2]) == "F32" and dst == "F32"
    if op == "DSV4_HC_PRE":
        return a == "F32" and tname(s1) == "F32" and dst == "F32"                    # cu:5603-5605
    if op == "DSV4_HC_POST":                                                         # cu:5606-5609
        s3 = src(t, 3)
        return (a == "F32" and tname(s1) == "F32" and tname(t.src[2]) == "F32" and (s3 is None or tname(s3) == "F32")
                and dst == "F32")
    if op == "FLASH_ATTN_EXT":
        return best_fattn_kernel(cc, t) != FATTN_NONE                                # cu:5610, fa:775
    if op == "LIGHTNING_INDEXER":
        return lightning_indexer_supported(t)                                        # cu:5622
    return False


def lightning_indexer_supported(t: Tensor) -> bool:
    """ggml_cuda_lightning_indexer_supported (lightning-indexer.cu:536-588): head size 128, 64 or 32
    heads, 16-byte strides of an unquantized Q and K."""
    q, k = t.src[0], t.src[1]
    if q.ne[0] != 128 or q.ne[1] not in (64, 32):
        return False
    if any(not is_quantized(x.type) and any(x.nb[i] % 16 for i in (1, 2, 3)) for x in (q, k)):
        return False
    return tname(k) in LIGHTNING_INDEXER_K_TYPES


def _mul_mat_use_fwht(t: Tensor) -> bool:
    """ggml_cuda_op_mul_mat_use_fwht (fwht.cu:101): a Hadamard-hinted f32 MUL_MAT."""
    a, b = t.src[0], t.src[1]
    return (t.op == "MUL_MAT" and op_param(t, 1) == GGML_HINT_SRC0_IS_HADAMARD and tname(a) == "F32"
            and tname(t) == "F32" and tname(b) in ("F32", "F16") and is_contiguous(b) and is_contiguous(t)
            and b.ne == t.ne)


# --- graph_optimize (cu:4522-4612): allocation dependencies of the MoE fusions --------------------

MOE_WEIGHTED_REDUCTION_MAX_EXPERTS = 15     # cu:3034


@dataclass
class TopkMoeArgs:
    """struct ggml_cuda_topk_moe_args (topk-moe.cuh:9)"""
    sigmoid: bool = False
    sqrt_softplus: bool = False
    softmax: bool = False
    delayed_softmax: bool = False
    prob_bias: bool = False
    norm: bool = False
    scale: bool = False


def _node(nodes: GraphView, k: int) -> Tensor:
    """cgraph->nodes[k] of a split's graph view, which the fusion tests read past n_nodes unguarded:
    the graph's next nodes there, past the graph's last node memory no node was written to."""
    if k < len(nodes):
        return nodes[k]
    if k - len(nodes) < len(nodes.after):
        return nodes.after[k - len(nodes)]
    raise NotImplementedError("CUDA graph_optimize: a MoE fusion test reading past the graph's last node")


def _split_mul(mul: Tensor) -> Optional[tuple[Tensor, Tensor]]:
    """split_mul (cu:3053-3074): (experts, router weights) of experts * weights, either order."""
    def is_weights(x: Optional[Tensor]) -> bool:
        return (x is not None and tname(x) == "F32" and is_contiguous(x) and x.ne[0] == 1
                and x.ne[1:] == mul.ne[1:])

    def is_experts(x: Optional[Tensor]) -> bool:
        return x is not None and tname(x) == "F32" and is_contiguous(x) and same_shape(x, mul)

    if is_experts(src(mul, 0)) and is_weights(src(mul, 1)):
        return mul.src[0], mul.src[1]
    if is_experts(src(mul, 1)) and is_weights(src(mul, 0)):
        return mul.src[1], mul.src[0]
    return None


@dataclass
class MoeReductionMatch:
    """struct ggml_cuda_moe_weighted_reduction_match (cu:3036-3042)"""
    experts: Tensor
    expert_scale: Optional[Tensor]
    weights: Tensor
    dst: Tensor
    node_count: int


def match_moe_weighted_reduction(nodes: list[Tensor], i: int,
                                 counts: dict[Tensor, int]) -> Optional[MoeReductionMatch]:
    """ggml_cuda_match_moe_weighted_reduction (cu:3044-3174): (experts [* expert_scale]) * router
    weights, one VIEW per used expert and the ADDs summing them."""
    first = nodes[i]
    if first.op != "MUL" or tname(first) != "F32" or not is_contiguous(first):
        return None
    weighted, experts, expert_scale, weights, mul_count = first, None, None, None, 1
    if i + 1 < len(nodes):
        second = nodes[i + 1]
        if second.op == "MUL" and tname(second) == "F32" and is_contiguous(second):
            outer, inner = _split_mul(second), _split_mul(first)
            if outer is not None and outer[0] is first and inner is not None:
                weighted, (experts, expert_scale), weights, mul_count = second, inner, outer[1], 2
    if experts is None:
        pair = _split_mul(first)
        if pair is None:
            return None
        experts, weights = pair
    n_expert_used = weighted.ne[1]
    n_tokens = weighted.ne[2] * weighted.ne[3]
    if n_expert_used < 2 or n_expert_used > MOE_WEIGHTED_REDUCTION_MAX_EXPERTS or n_tokens <= 0:
        return None
    node_count = 2 * n_expert_used + mul_count - 1
    if i + node_count > len(nodes):
        return None
    ops = ["MUL"] * mul_count
    views: list[Tensor] = []
    previous: Optional[Tensor] = None
    n_adds = 0
    for offset in range(mul_count, node_count):
        c = nodes[i + offset]
        ops.append(c.op)
        if c.op == "VIEW":
            expert = len(views)
            if (expert >= n_expert_used or c.src[0] is not weighted or c.view_src is not weighted or tname(c) != "F32"
                    or c.ne != (weighted.ne[0], n_tokens, 1, 1) or c.nb[0] != weighted.nb[0]
                    or c.nb[1] != weighted.nb[2] or c.view_offs != expert * weighted.nb[1]):
                return None
            views.append(c)
            continue
        if c.op != "ADD" or len(views) < 2 or n_adds + 1 >= len(views):
            return None
        lhs = views[0] if n_adds == 0 else previous
        if src(c, 0) is not lhs or src(c, 1) is not views[n_adds + 1] or tname(c) != "F32":
            return None
        previous = c
        n_adds += 1
    if len(views) != n_expert_used or n_adds != n_expert_used - 1 or previous is None:
        return None
    if not is_contiguous(previous) or previous.ne != (weighted.ne[0], n_tokens, 1, 1):
        return None
    idxs = list(range(i, i + node_count))
    if not can_fuse_subgraph(nodes, idxs, ops, [idxs[-1]], counts):
        return None
    return MoeReductionMatch(experts, expert_scale, weights, nodes[idxs[-1]], node_count)


def topk_moe_fusion(nodes: GraphView, i: int) -> Optional[TopkMoeArgs]:
    """ggml_cuda_topk_moe_fusion (cu:2813-2965): the gating ops from node i that the top-k MoE
    kernel fuses, or None."""
    n = len(nodes)
    args = TopkMoeArgs(softmax=nodes[i].op == "SOFT_MAX")
    if nodes[i].op == "UNARY":
        unary = op_param(nodes[i], 0)
        if unary == ggml.UNARY_OPS["SIGMOID"]:
            args.sigmoid = True
        elif (unary == ggml.UNARY_OPS["SOFTPLUS"] and i + 1 < n and nodes[i + 1].op == "SQRT"
              and nodes[i + 1].src[0] is nodes[i]):
            args.sqrt_softplus = True      # sqrt(softplus(x)) scoring (DeepSeek-V4)
            i += 1
        else:
            return None
    args.delayed_softmax = nodes[i].op == "ARGSORT"
    i += 1

    def at(k: int, op: str) -> bool:
        return k < n and nodes[k].op == op

    if args.sigmoid or args.sqrt_softplus or args.softmax:
        if not at(i, "RESHAPE") or nodes[i].src[0] is not nodes[i - 1]:
            return None
        probs_reshaped = nodes[i]
        i += 1
        if i >= n:
            return None
        if nodes[i].op == "ADD" and nodes[i].src[0] is nodes[i - 2]:    # the bias reads the unreshaped probs
            args.prob_bias = True
            i += 1
        if not at(i, "ARGSORT") or nodes[i].src[0] is not nodes[i - (1 if args.prob_bias else 2)]:
            return None
        i += 1
        if not at(i, "VIEW") or nodes[i].src[0] is not nodes[i - 1]:
            return None
        i += 1
        if not at(i, "GET_ROWS") or nodes[i].src[0] is not probs_reshaped or nodes[i].src[1] is not nodes[i - 1]:
            return None
        i += 1
    elif args.delayed_softmax:
        if i - 2 < 0:
            return None
        probs_reshaped = nodes[i - 2]
        if not at(i, "VIEW") or nodes[i].src[0] is not nodes[i - 1]:
            return None
        i += 1
        if i >= n or src(nodes[i], 1) is not nodes[i - 1] or src(nodes[i], 0) is not probs_reshaped:
            return None
        i += 1
        for op in ("RESHAPE", "SOFT_MAX", "RESHAPE"):
            if not at(i, op) or nodes[i].src[0] is not nodes[i - 1]:
                return None
            i += 1
    if i >= n:
        return args
    if nodes[i].op == "RESHAPE":    # RESHAPE -> SUM_ROWS -> CLAMP -> DIV -> RESHAPE
        for op in ("RESHAPE", "SUM_ROWS", "CLAMP"):
            if _node(nodes, i).op != op or _node(nodes, i).src[0] is not _node(nodes, i - 1):
                return args
            i += 1
        div = _node(nodes, i)
        if div.op != "DIV" or src(div, 1) is not _node(nodes, i - 1) or div.src[0] is not _node(nodes, i - 3):
            return args
        i += 1
        if _node(nodes, i).op != "RESHAPE" or _node(nodes, i).src[0] is not _node(nodes, i - 1):
            return args
        args.norm = True
        i += 1
    if _node(nodes, i).op == "SCALE" and _node(nodes, i).src[0] is _node(nodes, i - 1):
        args.scale = True
    return args


def should_use_topk_moe(gating: Tensor, logits: Tensor, weights: Tensor, ids: Tensor) -> bool:
    """ggml_cuda_should_use_topk_moe (topk-moe.cu:403-447): an instantiated expert count, contiguous
    logits and weights, a plain softmax or a sigmoid/softplus."""
    n_expert = ids.nb[1] // ids.nb[0]
    if (n_expert & (n_expert - 1) or n_expert > 512) and n_expert not in (288, 576):
        return False
    if not is_contiguous(weights) or not is_contiguous(logits):
        return False
    if gating.op == "SOFT_MAX":
        if not is_contiguous(gating.src[0]) or op_param(gating, 0, 1.0) != 1.0 or op_param(gating, 1, 0.0) != 0.0:
            return False
        return src(gating, 1) is None and src(gating, 2) is None     # no mask, no sinks
    if gating.op == "UNARY":
        return op_param(gating, 0) in (ggml.UNARY_OPS["SIGMOID"], ggml.UNARY_OPS["SOFTPLUS"])
    return True


def graph_optimize(nodes: GraphView, add_alloc_dep, counts: dict[Tensor, int]) -> None:
    """ggml_backend_cuda_graph_optimize (cu:4522-4612): the fused MoE weighted reduction keeps its
    experts, expert scale and router weights alive until its last ADD; a fused top-k gating keeps
    its nodes and their sources alive until the node after it. The reorder that follows runs only
    with GGML_CUDA_GRAPH_OPT=1 (cu:4622-4629), not by default."""
    n = len(nodes)
    i = 0
    while i < n:
        match = match_moe_weighted_reduction(nodes, i, counts)
        if match is not None:
            for kept in (match.experts, match.weights, match.expert_scale):
                if kept is not None:
                    add_alloc_dep(kept, match.dst)
            i += match.node_count - 1
        node = nodes[i]
        if node.op in ("UNARY", "SOFT_MAX", "ARGSORT"):
            args = topk_moe_fusion(nodes, i)
            if args is not None and not args.delayed_softmax:
                ops = ["UNARY"] if args.sigmoid else ["UNARY", "SQRT"] if args.sqrt_softplus else ["SOFT_MAX"]
                i_probs = i + len(ops) - 1
                if args.prob_bias:
                    ops += ["RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS"]
                    out_ids = i_probs + 4
                else:
                    ops += ["RESHAPE", "ARGSORT", "VIEW", "GET_ROWS"]
                    out_ids = i_probs + 3
                if args.norm:
                    ops += ["RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"]
                if args.scale:
                    ops.append("SCALE")
                out_weights = i + len(ops) - 1
                idxs = list(range(i, i + len(ops)))
                if (i + len(ops) <= n and can_fuse_subgraph(nodes, idxs, ops, [out_ids, out_weights], counts)
                        and should_use_topk_moe(node, node.src[0], nodes[out_weights], nodes[out_ids])):
                    # add_alloc_deps(i, i + ops.size()): until the node after the last, maybe the next split's
                    until = _node(nodes, i + len(ops))
                    for k in idxs:
                        add_alloc_dep(nodes[k], until)
                        for s in nodes[k].src[:GGML_MAX_SRC]:
                            if s is not None:
                                add_alloc_dep(s, until)
                    i += len(ops) - 1
        i += 1


def is_cuda_buft(buft: BufferType) -> bool:
    """ggml_backend_buft_is_cuda: a device buffer type "CUDA<n>" (not CUDA_Host)."""
    return buft.name.startswith("CUDA") and buft.name[4:].isdigit()


# --- the device -----------------------------------------------------------------------------------

def cuda_host_buft() -> BufferType:
    """ggml_backend_cuda_host_buffer_type (cu:1304-1320): pinned host memory with the CPU's rules;
    its device is the CUDA reg's device 0."""
    return BufferType("CUDA_Host", cpu.TENSOR_ALIGNMENT, SIZE_MAX, is_host=True, device="CUDA0")


def cuda_backend(index: int, cc: int, memory: int, host_buft: BufferType) -> Backend:
    """Device CUDA<index> of compute capability cc (major*100 + minor*10) with `memory` bytes free.
    All CUDA devices share the one CUDA_Host buffer type."""
    name = f"CUDA{index}"
    buft = BufferType(name, ALIGNMENT, SIZE_MAX, alloc_size_fn=lambda t: alloc_size(cc, t), device=name)
    return Backend(name, "GPU", buft, supports_op=lambda t: supports_op(cc, name, t),
                   supports_buft=lambda b: b.name == buft.name, offload_op=offload_op, host_buft=host_buft,
                   is_async_with_events=True, device_name=name, memory=memory, graph_optimize=graph_optimize)
