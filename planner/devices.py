"""Devices and layer placement: which backend runs each layer and where each weight lives.

Mirrors src/llama.cpp (device list: RPC servers first, then GPUs) and llama_model_base::load_tensors
(src/llama-model.cpp:1500-1600): the layers [i_gpu_start, n_layer] are offloaded (the output layer
counts as layer n_layer) and spread over the devices by the split points; weights take the first
buffer type of their layer's list that supports their op (select_weight_buft).
"""
from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from itertools import accumulate

from schedplan.backends import cpu, rpc
from schedplan.backends.types import Backend, BufferType
from schedplan.planner.ggml import Tensor
from schedplan.planner.hparams import HParams
from schedplan.planner.params import Params


class BadDevices(Exception):
    """Devices that llama.cpp would refuse, with the reason."""


@dataclass
class Devices:
    backends: list[Backend]              # llama_context order: model devices, ACCEL, CPU last
    layer_backend: list[Backend]         # dev_layer(il) for il in [0, n_layer); CPU when not offloaded
    output_backend: Backend              # dev_output
    n_gpu_layers: int                    # llama_model::n_gpu_layers(): -1 means n_layer + 1
    pipeline_parallel: bool

    @property
    def cpu(self) -> Backend:
        return self.backends[-1]

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
    if params.devices:
        raise BadDevices("simulated local devices (--device) are not implemented yet")
    model_devices = [rpc.rpc_backend(endpoint, i) for i, endpoint in enumerate(params.rpc)]
    if params.split_mode == "none" and model_devices:
        if params.main_gpu >= len(model_devices):
            raise BadDevices(f"invalid value for main_gpu: {params.main_gpu} (available devices: "
                             f"{len(model_devices)})")
        model_devices = [model_devices[params.main_gpu]]   # llama_model_load: only the main device
    elif params.split_mode == "row":
        raise BadDevices("-sm row needs devices with split buffers (CUDA, SYCL); RPC devices have none")
    cpu_backend = cpu.cpu_backend(_cpu_compute_buft(model_devices))
    n_gpu_layers = params.n_gpu_layers if params.n_gpu_layers >= 0 else hp.n_layer + 1
    layer_of = _layer_assignment(params, hp.n_layer, n_gpu_layers, model_devices, cpu_backend)
    pipeline_parallel = (len(model_devices) > 1 and n_gpu_layers > hp.n_layer and params.split_mode == "layer"
                         and params.offload_kqv and not params.tensor_overrides
                         and all(b.is_async_with_events for b in model_devices))
    return Devices(model_devices + [cpu_backend], [layer_of(il) for il in range(hp.n_layer)], layer_of(hp.n_layer),
                   n_gpu_layers, pipeline_parallel)


def _cpu_compute_buft(model_devices: list[Backend]) -> BufferType | None:
    """llama_context: the CPU backend uses the first model device's host buffer type, if any."""
    return model_devices[0].host_buft if model_devices else None


def _layer_assignment(params: Params, n_layer: int, n_gpu_layers: int, devices: list[Backend], cpu_backend: Backend):
    """get_layer_buft_list (llama-model.cpp:1585): split points from -ts (or, like llama.cpp's
    default by free memory, equal shares: pass -ts to plan other proportions)."""
    n_devices = len(devices)
    splits = list(params.tensor_split[:n_devices]) if params.split_mode != "none" else []
    splits += [0.0] * (n_devices - len(splits))
    if all(x == 0.0 for x in splits):
        splits = [1.0] * n_devices
    points = [_f32(p) for p in accumulate(_f32(x) for x in splits)] if splits else []   # float math, as in C
    points = [_f32(p / points[-1]) for p in points]
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)
    act_gpu_layers = 0 if not devices else min(n_gpu_layers, n_layer + 1)

    def layer_of(il: int) -> Backend:
        if il < i_gpu_start or (il - i_gpu_start) >= act_gpu_layers:
            return cpu_backend
        # std::upper_bound over the float split points, as float(il - i_gpu_start)/act_gpu_layers
        return devices[bisect.bisect_right(points, _f32((il - i_gpu_start) / act_gpu_layers))]

    return layer_of


def _f32(x: float) -> float:
    """Round to a C float."""
    return struct.unpack("f", struct.pack("f", x))[0]


# llm_tensor_info_for (src/llama-arch.cpp): the op that uses each weight decides its buffer type
MUL_MAT_WEIGHTS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                   "ffn_up.weight", "ffn_down.weight", "output.weight")


def weight_op(name: str, il: int, n_layer: int) -> str:
    if name == "token_embd.weight":
        return "MUL_MAT" if il == n_layer else "GET_ROWS"   # a tied output is the duplicate at n_layer
    return "MUL_MAT" if name.endswith(MUL_MAT_WEIGHTS) else "OTHER"


def weight_placement(devices: Devices, params: Params, n_layer: int):
    """select_weight_buft over the layer's buffer type list: a device layer takes its device's
    buffer type (every op is supported there); a CPU layer takes the first of [CPU_REPACK (with
    extra buffer types), CPU] that supports the weight's op. The CPU buffer type is mmapped from
    the file (use_mmap, the default), so it shows as CPU_Mapped."""
    mapped, repack = cpu.cpu_mapped_buft(), cpu.cpu_repack_buft()

    def place(weight: Tensor, name: str, il: int) -> BufferType:
        backend = devices.layer_device(il, n_layer)
        if backend is not devices.cpu and backend.supports_op(weight):
            return backend.buft
        if params.use_extra_bufts and weight_op(name, il, n_layer) == "MUL_MAT" and cpu.repacks(weight):
            return repack
        return mapped

    return place
