"""The CPU backend: ggml/src/ggml-cpu/ggml-cpu.cpp and ggml-backend.cpp (CPU buffer types).

Buffer types: CPU (host, TENSOR_ALIGNMENT 32, ggml-impl.h:44), CPU_Mapped (weights mmapped from
the file, same rules), CPU_REPACK (extra buffer type, not host; ggml-cpu/repack.cpp).
alloc_size is ggml_nbytes for all of them. The simulated CPU is x86-64 with AVX2 (no AVX-512),
which decides what CPU_REPACK takes.
"""
from __future__ import annotations

from .types import Backend, BufferType
from ..planner.ggml import GGML_HINT_SRC0_IS_HADAMARD, T, Tensor, is_quantized, n_dims as n_dims_of, type_name

TENSOR_ALIGNMENT = 32


def cpu_buft() -> BufferType:
    return BufferType("CPU", TENSOR_ALIGNMENT, is_host=True, device="CPU")


def cpu_mapped_buft() -> BufferType:
    return BufferType("CPU_Mapped", TENSOR_ALIGNMENT, is_host=True, device="CPU")


def cpu_repack_buft() -> BufferType:
    return BufferType("CPU_REPACK", TENSOR_ALIGNMENT, is_host=False, device="CPU", is_extra=True)


# ggml_repack_get_optimal_repack_type (ggml-cpu/repack.cpp:4925) on x86 with AVX2 (AVX-512 adds
# Q2_K): the weight types that get a repacked layout, and the row multiple each needs.
REPACK_X86_AVX2 = {"Q4_0": 8, "Q4_K": 8, "IQ4_NL": 8, "MXFP4": 8}


def repacks(weight: Tensor, op: str) -> bool:
    """Whether CPU_REPACK takes this weight (extra_buffer_type::supports_op, repack.cpp:5191): a
    2-D MUL_MAT matrix or a 3-D MUL_MAT_ID stack of experts, of a repackable type and row count."""
    rows = REPACK_X86_AVX2.get(type_name(weight.type).upper())
    n_dims = n_dims_of(weight)
    return rows is not None and weight.ne[1] % rows == 0 and (
        (op == "MUL_MAT" and n_dims == 2) or (op == "MUL_MAT_ID" and n_dims == 3))


def repack_supports_op(op: Tensor) -> bool:
    """extra_buffer_type::supports_op of CPU_REPACK (repack.cpp:5191): a MUL_MAT over a 2-D repacked
    matrix or a MUL_MAT_ID over a 3-D stack, with an F32 src1 in no device (non-host) buffer."""
    src0, src1 = op.src[0], op.src[1]
    if (op.op in ("MUL_MAT", "MUL_MAT_ID") and src0.buffer is not None and src0.buffer.buft.name == "CPU_REPACK"
            and repacks(src0, op.op)):
        if src1.buffer is not None and not src1.buffer.buft.is_host:
            return False
        return src1.type == T.F32
    return False


# type_traits_cpu[].vec_dot_type (ggml-cpu/ggml-cpu.c): the type MUL_MAT brings src1 to; a type with no
# entry there (Q8_K, the integer types, F64) reads 0, F32
VEC_DOT_TYPE = {
    T.F16: T.F16, T.BF16: T.BF16,
    **dict.fromkeys((T.Q1_0, T.Q2_0, T.Q4_0, T.Q5_0, T.Q8_0, T.MXFP4, T.NVFP4, T.IQ4_NL), T.Q8_0),
    **dict.fromkeys((T.Q4_1, T.Q5_1, T.Q8_1), T.Q8_1),
    **dict.fromkeys((T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ3_S, T.IQ2_S,
                     T.IQ1_S, T.IQ1_M, T.IQ4_XS, T.TQ1_0, T.TQ2_0), T.Q8_K),
}
# the types without type_traits.from_float, which CPY and SET_ROWS cannot write
_NO_FROM_FLOAT = frozenset({T.IQ3_XXS, T.IQ3_S, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_S, T.IQ1_M})


def supports_op(t: Tensor) -> bool:
    """ggml_backend_cpu_device_supports_op (ggml-cpu.cpp:424): an op with one of its first four sources in
    an extra buffer type (CPU_REPACK) is that buffer type's to take; then the per-op rules."""
    if t.op in ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"):
        return True
    for src in t.src[:4]:
        # ggml reads src->buffer: a view has none until it is allocated
        if src is not None and src.buffer is not None and src.buffer.buft.is_extra:
            return repack_supports_op(t)
    src0, src1 = (t.src + [None, None])[:2]
    if t.op in ("CPY", "SET_ROWS"):
        return t.type not in _NO_FROM_FLOAT
    if t.op == "MUL_MAT":
        if len(t.op_params) > 1 and t.op_params[1] == GGML_HINT_SRC0_IS_HADAMARD and src0.type == T.F32 \
                and t.type == T.F32:
            return src1.type in (T.F32, T.F16)
        vec_dot_type = VEC_DOT_TYPE.get(src0.type, T.F32)
        # BF16 in src1 is widened into the F32 work buffer
        return src1.type in (T.F32, vec_dot_type) or (src1.type == T.BF16 and vec_dot_type == T.F32)
    if t.op == "SOFT_MAX_BACK":
        return src0.type == T.F32 and src1.type == T.F32 and t.op_params[1] == 0.0   # max_bias
    if t.op == "IM2COL_BACK":
        return src0.type == T.F32 and src1.type in (T.F32, T.F16)
    if t.op == "GET_ROWS_BACK":
        return src0.type in (T.F32, T.F16)
    if t.op == "OUT_PROD":
        return (src0.type == T.F32 or ((src0.type == T.F16 or is_quantized(src0.type))
                                       and src0.ne[2] == src1.ne[2] and src0.ne[3] == src1.ne[3])) \
            and src1.type == T.F32 and t.type == T.F32
    if t.op == "CONV_2D":
        return src0.is_contiguous()
    if t.op == "SSM_SCAN":
        return t.op_params[0] == 1 or t.src[3].ne[0] == 1
    return True


def supports_buft(buft: BufferType) -> bool:
    """ggml_backend_cpu_device_supports_buft: host buffers or CPU extra buffer types."""
    return buft.is_host or buft.is_extra


def cpu_backend(buft: BufferType | None = None) -> Backend:
    """The CPU backend; llama.cpp gives it the first device's host buffer type when there is one."""
    return Backend("CPU", "CPU", buft or cpu_buft(), supports_op, supports_buft)
