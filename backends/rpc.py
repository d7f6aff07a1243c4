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

from typing import Optional

from . import cpu
from .types import SIZE_MAX, Backend, BufferType
from ..planner.ggml import Tensor


def rpc_backend(endpoint: str, global_id: int, memory: Optional[tuple[int, int]] = None) -> Backend:
    """memory: the (free, total) the server reports, when known."""
    name = f"RPC0[{endpoint}]"      # one device per server: its index in the server is 0
    buft = BufferType(name, cpu.TENSOR_ALIGNMENT, SIZE_MAX, is_host=False, device=f"RPC{global_id}")

    def supports_op(t: Tensor) -> bool:
        return True

    def supports_buft(b: BufferType) -> bool:
        # an RPC buffer type of this server and device (2223): its name says both. By name, not identity:
        # a second context's devices (a draft's, beside its target's buffers) are planned anew
        return b.name == buft.name

    return Backend(name, "GPU", buft, supports_op, supports_buft, device_name=f"RPC{global_id}",
                   is_async_with_events=True, memory=memory[0] if memory else None,
                   memory_total=memory[1] if memory else None)


# --- the memory a server reports ------------------------------------------------------------------
# ggml-rpc.cpp (protocol 7): a request is | cmd (1 byte) | size (u64) | data |, a reply | size (u64) |
# data |. A connection opens with RPC_CMD_HELLO (negotiate_hello, 346-364); zero capabilities keep
# the plain TCP transport. RPC_CMD_GET_DEVICE_MEMORY answers ggml_backend_dev_memory of the device
# the server serves (rpc_server::get_device_memory, 1800-1812).
RPC_CMD_GET_DEVICE_MEMORY = 11
RPC_CMD_HELLO = 14
RPC_PROTO_MAJOR_VERSION = 7
RPC_CONN_CAPS_SIZE = 24


class RPCUnreachable(Exception):
    """A server that cannot be asked for its memory, with the reason."""


def get_device_memory(endpoint: str, timeout: float = 5.0) -> tuple[int, int]:
    """(free, total) of device 0 of the server at HOST:PORT, as llama.cpp asks for it."""
    import socket
    import struct

    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            hello = _call(sock, RPC_CMD_HELLO, bytes(RPC_CONN_CAPS_SIZE), 4 + RPC_CONN_CAPS_SIZE)
            if hello[0] != RPC_PROTO_MAJOR_VERSION:
                raise RPCUnreachable(f"RPC server {endpoint} speaks protocol {hello[0]}.{hello[1]}.{hello[2]}, "
                                     f"llama.cpp {RPC_PROTO_MAJOR_VERSION}.x")
            free, total = struct.unpack("<QQ", _call(sock, RPC_CMD_GET_DEVICE_MEMORY, struct.pack("<I", 0), 16))
    except (OSError, ValueError) as e:
        raise RPCUnreachable(f"RPC server {endpoint} cannot be reached ({e})") from None
    return free, total


def _call(sock, cmd: int, data: bytes, reply_size: int) -> bytes:
    import struct

    sock.sendall(struct.pack("<BQ", cmd, len(data)) + data)
    (size,) = struct.unpack("<Q", _recv(sock, 8))
    if size != reply_size:
        raise ValueError(f"reply of {size} bytes to command {cmd}, expected {reply_size}")
    return _recv(sock, size)


def _recv(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ValueError("the server closed the connection")
        out += chunk
    return out
