"""Devices and layer placement: which backend runs each layer and where each weight lives.

Mirrors src/llama.cpp llama_prepare_model_devices (the device list), llama_context's backends and
backend_buft (src/llama-context.cpp:333-422) and llama_model_base::load_tensors
(src/llama-model.cpp:1500-1615): the layers [i_gpu_start, n_layer] are offloaded (the output layer
counts as layer n_layer) and spread over the devices by the split points; weights take the first
buffer type of their layer's list that supports their op (select_weight_buft).

Simulated local devices come from --device KIND:MEMORY[:KEY=VALUE...] (parse_device):
  cuda:24GiB:cc=8.9             CUDA, compute capability MAJOR.MINOR (required)
  metal:64GiB[:maxbuf=SIZE]     Metal on Apple silicon; maxbuf = maxBufferLength (default: MEMORY)
  vulkan:16GiB[:profile=FILE][:align=N][:mapalign=N][:maxalloc=SIZE]
                                Vulkan; profile = the device's Vulkan profile JSON (`vulkaninfo --json`
                                writes it), align = minStorageBufferOffsetAlignment, mapalign =
                                minMemoryMapAlignment, maxalloc = maxMemoryAllocationSize: a key
                                overrides the profile, and what neither gives is backends/vulkan.py's
                                DEFAULT_DEVICE (a discrete GPU: align 64, mapalign 64, maxalloc 4GiB,
                                storage range 4GiB-1, 32 KiB shared memory, subgroups of 32)
MEMORY is the device's free memory: without -ts, llama.cpp splits the layers in proportion to it
(llama-model.cpp:1557-1571), and so does the plan. Every kind also takes total=SIZE, the total memory
the device reports (default MEMORY; shown beside what a plan uses, as `schedplan devices` reads it).
SIZE is bytes or a number with B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of
1000).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import re
import struct
from dataclasses import dataclass
from fractions import Fraction
from itertools import accumulate
from typing import TYPE_CHECKING, Optional

from ..backends import cpu, rpc
from ..backends.types import Backend, BufferType
from . import ggml
from .ggml import Buffer, Tensor
from .hparams import HParams
from .params import Params

if TYPE_CHECKING:
    from ..backends.vulkan import VulkanDevice


class BadDevices(Exception):
    """Devices that llama.cpp would refuse, or a --device spec that cannot be read, with the reason."""


# --- --device specs -------------------------------------------------------------------------------

# ggml's backend registry order (ggml/src/ggml-backend-reg.cpp:120-133): the order llama.cpp
# enumerates the local GPUs in
DEVICE_KINDS = ("cuda", "metal", "vulkan")
DEVICE_KEYS = {"cuda": {"cc", "total"}, "metal": {"maxbuf", "total"}, "vulkan": {"profile", "align", "mapalign", "maxalloc",
                                                                                  "total"}}
DEVICE_SPEC_HELP = ("A simulated local device, KIND:MEMORY[:KEY=VALUE...] (repeatable): cuda:24GiB:cc=8.9 "
                    "(cc: compute capability), metal:64GiB[:maxbuf=SIZE] (maxBufferLength, default MEMORY), "
                    "vulkan:16GiB[:profile=FILE][:align=N][:mapalign=N][:maxalloc=SIZE] (profile: the device's "
                    "Vulkan profile JSON, as `vulkaninfo --json` writes it; align: minStorageBufferOffsetAlignment, "
                    "mapalign: minMemoryMapAlignment, maxalloc: maxMemoryAllocationSize; a key overrides the "
                    "profile; without either, a discrete GPU with align 64, mapalign 64, maxalloc 4GiB, a 4GiB-1 "
                    "storage buffer range, 32 KiB of shared memory and subgroups of 32). MEMORY is the free "
                    "memory: without -ts, layers are split in proportion to it, as llama.cpp does.")
_UNITS = {"": 1, "B": 1, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4,
          "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}


@dataclass(frozen=True)
class DeviceSpec:
    kind: str
    memory: int                   # free memory, as ggml_backend_dev_memory reports it
    total: Optional[int] = None   # total=SIZE: the total memory it reports (None: MEMORY)
    cc: int = 0                   # cuda: 100 * major + 10 * minor, as ggml_cuda_info stores it
    max_buffer: int = 0           # metal: maxBufferLength
    vulkan: Optional[VulkanDevice] = None   # vulkan: the device's properties


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)", text.strip())
    if not m or m.group(2).upper() not in _UNITS:
        raise BadDevices(f"not a size: {text!r} (e.g. 24GiB, 16GB, 8000MiB)")
    return int(Fraction(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_device(spec: str) -> DeviceSpec:
    """One --device value, KIND:MEMORY[:KEY=VALUE...]."""
    kind, _, rest = spec.partition(":")
    kind = kind.lower()
    if kind not in DEVICE_KINDS or not rest:
        raise BadDevices(f"{spec!r}: expected KIND:MEMORY[:KEY=VALUE...] with KIND one of {', '.join(DEVICE_KINDS)}")
    memory, *items = rest.split(":")
    keys: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in DEVICE_KEYS[kind]:
            raise BadDevices(f"{spec!r}: {item!r} is not one of {', '.join(k + '=...' for k in sorted(DEVICE_KEYS[kind]))}")
        keys[key] = value
    try:
        free = parse_size(memory)
        total = parse_size(keys["total"]) if "total" in keys else None
        if kind == "cuda":
            m = re.fullmatch(r"(\d+)\.(\d)", keys.get("cc", ""))
            if not m:
                raise BadDevices("cuda needs its compute capability, cc=MAJOR.MINOR (e.g. cc=8.9)")
            return DeviceSpec(kind, free, total, cc=100 * int(m.group(1)) + 10 * int(m.group(2)))
        if kind == "metal":
            return DeviceSpec(kind, free, total, max_buffer=parse_size(keys.get("maxbuf", memory)))
        return DeviceSpec(kind, free, total, vulkan=_vulkan_device(keys))
    except BadDevices as e:
        raise BadDevices(f"{spec!r}: {e}") from None


def _vulkan_device(keys: dict[str, str]) -> VulkanDevice:
    """The profile's device (or DEFAULT_DEVICE) with the align=, mapalign= and maxalloc= keys over it."""
    from ..backends import vulkan, vulkan_profile
    try:
        dev = vulkan_profile.read_profile(keys["profile"]) if "profile" in keys else vulkan.DEFAULT_DEVICE
    except vulkan_profile.BadProfile as e:
        raise BadDevices(f"profile={e}") from None
    changes = {}
    for key, field_name in (("align", "min_storage_buffer_offset_alignment"), ("mapalign", "min_memory_map_alignment")):
        if key in keys:
            value = keys[key]
            if not value.isdigit() or int(value) == 0 or int(value) & (int(value) - 1):
                raise BadDevices(f"{key} must be a power of two of bytes (the Vulkan limit), not {value!r}")
            changes[field_name] = int(value)
    if "maxalloc" in keys:
        changes["max_memory_allocation_size"] = parse_size(keys["maxalloc"])
        if changes["max_memory_allocation_size"] == 0:
            raise BadDevices("maxalloc must be a positive size")
    return dataclasses.replace(dev, **changes)


def local_devices(specs: tuple[str, ...]) -> list[Backend]:
    """The simulated GPUs in the order llama.cpp enumerates them: by backend registry order, then
    in each backend by device index (the order of the --device flags). All CUDA devices share one
    CUDA_Host buffer type and all Vulkan devices Vulkan device 0's Vulkan_Host. `none` (llama.cpp's
    -dev none) names no device."""
    specs = tuple(s for s in specs if s != "none")
    parsed = [parse_device(s) for s in specs]
    if not parsed:
        return []
    # imported only when GPUs are simulated: about 11 ms that CPU and RPC plans do not pay
    from ..backends import cuda, metal, vulkan
    out: list[Backend] = []
    cuda_host = cuda.cuda_host_buft()
    vk_host = None
    for kind in DEVICE_KINDS:
        for index, d in enumerate(d for d in parsed if d.kind == kind):
            if kind == "cuda":
                out.append(cuda.cuda_backend(index, d.cc, d.memory, cuda_host))
            elif kind == "metal":
                out.append(metal.metal_backend(index, d.memory, d.max_buffer))
            else:
                if vk_host is None:
                    vk_host = vulkan.vulkan_host_buft(d.vulkan)
                out.append(vulkan.vulkan_backend(index, d.memory, d.vulkan, vk_host))
            out[-1].memory_total = d.total
    # llama_prepare_model_devices (src/llama.cpp:260-290): integrated GPUs only where no discrete GPU is
    if any(b.dev_type == "GPU" for b in out):
        out = [b for b in out if b.dev_type != "IGPU"]
    return out


# --- devices and layers ----------------------------------------------------------------------------

@dataclass
class Devices:
    backends: list[Backend]              # llama_context order: model devices, ACCEL, CPU last
    layer_backend: list[Backend]         # dev_layer(il) for il in [0, n_layer); CPU when not offloaded
    output_backend: Backend              # dev_output
    n_gpu_layers: int                    # llama_model::n_gpu_layers(): -1 means n_layer + 1
    pipeline_parallel: bool
    backend_bufts: list[BufferType]      # llama_context::backend_buft, the scheduler's buffer types
    host_backend: Optional[Backend]      # the device whose host buffer type heads the CPU weight list

    @property
    def cpu(self) -> Backend:
        return self.backends[-1]

    @property
    def output_buft(self) -> BufferType:
        """output_reserve (llama-context.cpp:2194-2201): dev_output's host buffer type, else CPU."""
        return self.output_backend.host_buft or self.cpu.buft

    def model_devices(self) -> list[Backend]:
        return self.backends[:-1]

    def backend_index(self, backend: Backend) -> int:
        return self.backends.index(backend)

    def layer_device(self, il: int, n_layer: int) -> Backend:
        """The backend of layer il; il == n_layer is the output layer, -1 the input layer (CPU)."""
        if il < 0:
            return self.cpu
        return self.output_backend if il == n_layer else self.layer_backend[il]


def plan_devices(params: Params, hp: HParams) -> Devices:
    # llama_prepare_model_devices (src/llama.cpp:186-300): RPC servers first, then the GPUs
    memory = rpc_memory(params)
    model_devices = [rpc.rpc_backend(endpoint, i, memory[i]) for i, endpoint in enumerate(params.rpc)]
    model_devices += local_devices(params.devices)
    if params.split_mode == "none" and model_devices:
        if params.main_gpu < 0:
            model_devices = []
        elif params.main_gpu >= len(model_devices):
            raise BadDevices(f"invalid value for main_gpu: {params.main_gpu} (available devices: "
                             f"{len(model_devices)})")
        else:
            model_devices = [model_devices[params.main_gpu]]   # llama_model_load: only the main device
    elif params.split_mode == "row" and model_devices:
        # make_gpu_buft_list (llama-model.cpp:1140-1165): no backend here has split buffers
        raise BadDevices(f"device {model_devices[0].device_name} does not support split buffers (-sm row)")
    cpu_backend = cpu.cpu_backend()
    # every block is placed, the NextN ones too: n_layer_all (llama-model.cpp:1505-1614)
    n_layer = hp.n_layer_all
    n_gpu_layers = params.n_gpu_layers if params.n_gpu_layers >= 0 else n_layer + 1
    layer_of = _layer_assignment(params, n_layer, n_gpu_layers, model_devices, cpu_backend)
    pipeline_parallel = (len(model_devices) > 1 and n_gpu_layers > n_layer and params.split_mode == "layer"
                         and params.offload_kqv and not params.tensor_overrides
                         and all(b.is_async_with_events for b in model_devices))
    # llama-context.cpp:408-419: the CPU backend computes in the first device's host buffer type
    host = model_devices[0].host_buft if model_devices else None
    backend_bufts = [b.buft for b in model_devices] + [host or cpu_backend.buft]
    # make_cpu_buft_list (llama-model.cpp:1092-1106): the first device with a host buffer type
    host_backend = None if params.no_host else next((b for b in model_devices if b.host_buft), None)
    return Devices(model_devices + [cpu_backend], [layer_of(il) for il in range(n_layer)], layer_of(n_layer),
                   n_gpu_layers, pipeline_parallel, backend_bufts, host_backend)


def rpc_memory(params: Params) -> list[Optional[tuple[int, int]]]:
    """Per --rpc server, the (free, total) it reports when declared, else None."""
    return list(params.rpc_memory) or [None] * len(params.rpc)


def _layer_assignment(params: Params, n_layer: int, n_gpu_layers: int, devices: list[Backend], cpu_backend: Backend):
    """get_layer_buft_list (llama-model.cpp:1591): split points from -ts or, when it is all zero, from
    the devices' free memory (llama-model.cpp:1557-1571). RPC servers' memory is not known: they
    take equal shares, and mixing them with --device devices needs -ts."""
    n_devices = len(devices)
    splits = list(params.tensor_split[:n_devices]) if params.split_mode != "none" else []
    splits += [0.0] * (n_devices - len(splits))
    if all(x == 0.0 for x in splits):
        known = [b.memory for b in devices if b.memory is not None]
        if known and len(known) < n_devices:
            raise BadDevices("the RPC servers' free memory is not known: give -ts to split the layers between "
                             "RPC servers and --device devices")
        splits = [float(m) for m in known] if known else [1.0] * n_devices
    points = [_f32(p) for p in accumulate(_f32(x) for x in splits)] if splits else []   # float math, as in C
    points = [_f32(_fdiv(p, points[-1])) for p in points]
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)
    act_gpu_layers = 0 if not devices else min(n_gpu_layers, n_layer + 1)

    def layer_of(il: int) -> Backend:
        if il < i_gpu_start or (il - i_gpu_start) >= act_gpu_layers:
            return cpu_backend
        # std::upper_bound over the float split points, as float(il - i_gpu_start)/act_gpu_layers
        i = bisect.bisect_right(points, _f32((il - i_gpu_start) / act_gpu_layers))
        if i >= n_devices:      # NaN or infinite -ts proportions: devices.at() throws std::out_of_range
            raise BadDevices(f"-ts {','.join(f'{x:g}' for x in params.tensor_split)}: layer {il} falls past the last "
                             f"split point ({', '.join(f'{p:g}' for p in points)}); llama.cpp would fail to load "
                             f"the model (devices.at({i}) is out of range)")
        return devices[i]

    return layer_of


def _f32(x: float) -> float:
    """Round to a C float (beyond its range: an infinity, as a C cast gives)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _fdiv(a: float, b: float) -> float:
    """a / b as C floats divide: by zero, an infinity or NaN (Python raises)."""
    if b == 0.0:
        return math.nan if a == 0.0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


# --- weights ----------------------------------------------------------------------------------------

def weight_probe(weight: Tensor, op: str, hp: HParams) -> Tensor:
    """The op weight_buft_supported (llama-model-loader.cpp:927-1064) asks the device about."""
    if op == "GET_ROWS":
        return ggml.get_rows(weight, ggml.new_tensor(ggml.T.I32, 512))
    if op == "MUL_MAT":
        return ggml.mul_mat(weight, ggml.new_tensor(ggml.T.F32, weight.ne[0], 512, weight.ne[2], weight.ne[3]))
    if op == "MUL_MAT_ID":   # expert routing, or one embedded adapter per token (a router layer)
        n_used = 1 if hp.router_layer >= 0 else hp.n_expert_used_max()
        b = ggml.new_tensor(ggml.T.F32, weight.ne[0], n_used, 512)
        return ggml.mul_mat_id(weight, b, ggml.new_tensor(ggml.T.I32, n_used, 512))
    if op == "ADD_ID":
        n_used = hp.n_expert_used_max()
        a = ggml.new_tensor(ggml.T.F32, weight.ne[0], n_used, 512)
        return ggml.add_id(a, weight, ggml.new_tensor(ggml.T.I32, n_used, 512))
    if op == "ADD":
        return ggml.add(ggml.new_tensor(ggml.T.F32, *weight.ne), weight)
    if op == "MUL":
        return ggml.mul(ggml.new_tensor(ggml.T.F32, *weight.ne), weight)
    if op == "DIV":
        return ggml.div(ggml.new_tensor(ggml.T.F32, weight.ne[0]), weight)
    if op == "SCALE":
        return ggml.scale(weight, 1.0)
    if op == "IM2COL":
        b = ggml.new_tensor(ggml.T.F32, hp.n_embd_inp(), weight.ne[1], 1, 1)
        return ggml.im2col(weight, b, 1, 0, 0, 0, 1, 0, False, ggml.T.F16)
    if op == "SSM_CONV":
        return ggml.ssm_conv(ggml.new_tensor(ggml.T.F32, weight.ne[0] - 1 + 512, weight.ne[1], 3), weight)
    if op == "SSM_SCAN":   # w is ssm_a: [1, n_head] for Mamba-2, [d_state, n_head] for Mamba-1
        d_state = hp.ssm_d_state if weight.ne[0] == 1 else weight.ne[0]
        n_head = weight.ne[1]
        head_dim, n_group = hp.ssm_d_inner // n_head, hp.ssm_n_group or 1
        f32 = ggml.T.F32
        return ggml.ssm_scan(ggml.new_tensor(f32, d_state, head_dim, n_head, 3), ggml.new_tensor(f32, head_dim, n_head, 512, 3),
                             ggml.new_tensor(f32, n_head, 512, 3), weight, ggml.new_tensor(f32, d_state, n_group, 512, 3),
                             ggml.new_tensor(f32, d_state, n_group, 512, 3), ggml.new_tensor(ggml.T.I32, 3), 1)
    if op == "RWKV_WKV6":   # time_mix_first, with llama-model-loader.cpp's placeholder sizes ("FIXME")
        f32, n = ggml.T.F32, 123
        k, v, r, td = (ggml.new_tensor(f32, n, n, n) for _ in range(4))
        return ggml.rwkv_wkv6(k, v, r, weight, td, ggml.new_tensor(f32, n, n, n, n))
    if op != "ROPE":
        raise NotImplementedError(f"no weight_buft_supported probe for a weight used by {op}")
    a = ggml.new_tensor(ggml.T.F32, hp.n_embd_head_v(), hp.n_head(), 512)
    return ggml.rope_ext(a, ggml.new_tensor(ggml.T.I32, 512), weight, 0, 0, 0)


def _supports(backend: Backend, buft: BufferType, weight: Tensor, op: str, hp: HParams) -> bool:
    """weight_buft_supported: the device's supports_op with the weight in a dummy buffer of buft."""
    weight.buffer = Buffer(buft, "weights")
    try:
        return backend.supports_op(weight_probe(weight, op, hp))
    finally:
        weight.buffer = None


def weight_placement(devices: Devices, params: Params, hp: HParams):
    """select_weight_buft over the layer's buffer type list (llama-model-loader.cpp:1067-1278).

    A device layer's list is [the device's buffer type, then the CPU list]; the CPU list is
    [the first device's host buffer type (unless --no-host), CPU_REPACK (with extra buffer types),
    CPU]. Files are mmapped (use_mmap, the default), so a host buffer type pick becomes the CPU
    buffer type (llama-model-loader.cpp:1268-1276), and the CPU buffer type and the default buffer
    type of a device with buffer_from_host_ptr (Metal) map the file: CPU_Mapped, MTL0_Mapped
    (llama-model.cpp:1854)."""
    repack = cpu.cpu_repack_buft()
    # without mmap (load_mode none, as --fit measures, or a device without mmap support such as an
    # integrated GPU, llama-model.cpp:1512-1520) nothing is mapped and host picks stay
    use_mmap = params.use_mmap and all(b.mmap_support for b in devices.model_devices())
    mapped = cpu.cpu_mapped_buft() if use_mmap else devices.cpu.buft
    host = devices.host_backend
    n_layer = hp.n_layer_all
    overrides = _tensor_overrides(devices, params)

    def on_cpu(weight: Tensor, op: str) -> BufferType:
        if host is not None and _supports(host, host.host_buft, weight, op, hp):
            return mapped if use_mmap else host.host_buft
        if params.use_extra_bufts and cpu.repacks(weight, op):
            return repack
        return mapped

    def on_device(backend: Backend) -> BufferType:
        return backend.mapped_buft if backend.mapped_buft and use_mmap else backend.buft

    def place(weight: Tensor, name: str, op: str, il: int) -> BufferType:
        for pattern, target in overrides:
            if pattern.search(name):
                # an override to the CPU still picks among the CPU list (CPU_REPACK, ...)
                return on_cpu(weight, op) if target is devices.cpu else on_device(target)
        backend = devices.layer_device(il, n_layer)
        if backend is not devices.cpu and _supports(backend, backend.buft, weight, op, hp):
            return on_device(backend)
        return on_cpu(weight, op)

    return place


def lazy_read_buft(params: Params) -> BufferType:
    """Where a lazily read weight (TENSOR_READ_LAZY above 4 GiB) lives: the CPU device's buffer
    type (llama_model_loader::lazy_read::buft), mapped from the file whatever the load mode, except
    in the no_alloc pass that --fit measures with, which maps nothing (llama-model.cpp:1851); that
    pass is the one planned without mmap."""
    return cpu.cpu_mapped_buft() if params.use_mmap else cpu.cpu_buft()


def _tensor_overrides(devices: Devices, params: Params) -> list[tuple[re.Pattern, Backend]]:
    """-ot REGEX=BUFTYPE (common/arg.cpp parse_tensor_buffer_overrides): BUFTYPE names a device's
    default buffer type; the first pattern that matches a weight's name wins (create_tensor)."""
    by_name = {b.buft.name if b is not devices.cpu else "CPU": b for b in devices.backends}
    out = []
    for pattern, buft_name in params.tensor_overrides:
        if buft_name not in by_name:
            raise BadDevices(f"-ot {pattern}={buft_name}: unknown buffer type (available: {', '.join(by_name)})")
        try:
            out.append((re.compile(pattern), by_name[buft_name]))
        except re.error as e:
            raise BadDevices(f"-ot {pattern}={buft_name}: bad regular expression ({e})") from None
    return out
