"""The CPU backend: ggml/src/ggml-cpu/ggml-cpu.cpp and ggml-backend.cpp (CPU buffer types).

Buffer types: CPU (host, TENSOR_ALIGNMENT 32, ggml-impl.h:44), CPU_Mapped (weights mmapped from
the file, same rules), CPU_REPACK (extra buffer type, not host; ggml-cpu/repack.cpp).
alloc_size is ggml_nbytes for all of them.
"""
from __future__ import annotations

from schedplan.backends.types import Backend, BufferType
from schedplan.planner.ggml import Tensor

TENSOR_ALIGNMENT = 32


def cpu_buft() -> BufferType:
    return BufferType("CPU", TENSOR_ALIGNMENT, is_host=True, device="CPU")


def cpu_mapped_buft() -> BufferType:
    return BufferType("CPU_Mapped", TENSOR_ALIGNMENT, is_host=True, device="CPU")


def cpu_repack_buft() -> BufferType:
    return BufferType("CPU_REPACK", TENSOR_ALIGNMENT, is_host=False, device="CPU", is_extra=True)


def supports_op(t: Tensor) -> bool:
    """ggml_backend_cpu_device_supports_op for the ops schedplan builds: all of them."""
    return True


def supports_buft(buft: BufferType) -> bool:
    """ggml_backend_cpu_device_supports_buft: host buffers or CPU extra buffer types."""
    return buft.is_host or buft.is_extra


def cpu_backend(buft: BufferType | None = None) -> Backend:
    """The CPU backend; llama.cpp gives it the first device's host buffer type when there is one."""
    return Backend("CPU", "CPU", buft or cpu_buft(), supports_op, supports_buft)
