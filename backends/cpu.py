"""The CPU backend: ggml/src/ggml-cpu/ggml-cpu.cpp and ggml-backend.cpp (CPU buffer types).

Buffer types: CPU (host, TENSOR_ALIGNMENT 32, ggml-impl.h:44), CPU_Mapped (weights mmapped from
the file, same rules), CPU_REPACK (extra buffer type, not host; ggml-cpu/repack.cpp).
alloc_size is ggml_nbytes for all of them. The simulated CPU is x86-64 with AVX2 (no AVX-512),
which decides what CPU_REPACK takes.
"""
from __future__ import annotations

from .types import Backend, BufferType
from ..planner.ggml import Tensor, n_dims as n_dims_of, type_name

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


def supports_op(t: Tensor) -> bool:
    """ggml_backend_cpu_device_supports_op for the ops schedplan builds: all of them."""
    return True


def supports_buft(buft: BufferType) -> bool:
    """ggml_backend_cpu_device_supports_buft: host buffers or CPU extra buffer types."""
    return buft.is_host or buft.is_extra


def cpu_backend(buft: BufferType | None = None) -> Backend:
    """The CPU backend; llama.cpp gives it the first device's host buffer type when there is one."""
    return Backend("CPU", "CPU", buft or cpu_buft(), supports_op, supports_buft)
