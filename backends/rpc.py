"""ggml RPC devices (ggml/src/ggml-rpc/ggml-rpc.cpp), one per server, each with a CPU behind it.

- device name "RPC<n>" counting across servers (ggml_backend_rpc_add_server, 2351-2356); backend and
  buffer type name "RPC<device in server>[endpoint]" (1092, 1120);
- type GPU, caps async + events + mmap, no host buffer, no buffer_from_host_ptr (get_props, 2186);
- supports_op: every op (2216); offload_op: none;
- alignment and max_size as the server's backend reports them: a CPU server says 32 and SIZE_MAX;
- get_alloc_size asks the server only for quantized rows not a multiple of 512 and for ops whose size
  may expand (846); a CPU server answers ggml_nbytes, so the size is ggml_nbytes.
"""
from __future__ import annotations

from . import cpu
from .types import SIZE_MAX, Backend, BufferType
from ..planner.ggml import Tensor


def rpc_backend(endpoint: str, global_id: int) -> Backend:
    name = f"RPC0[{endpoint}]"      # one device per server: its index in the server is 0
    buft = BufferType(name, cpu.TENSOR_ALIGNMENT, SIZE_MAX, is_host=False, device=f"RPC{global_id}")

    def supports_op(t: Tensor) -> bool:
        return True

    def supports_buft(b: BufferType) -> bool:
        return b is buft

    return Backend(name, "GPU", buft, supports_op, supports_buft, device_name=f"RPC{global_id}",
                   is_async_with_events=True)
