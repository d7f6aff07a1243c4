"""Devices and layer placement: which backend runs each layer and where each weight lives.

Mirrors src/llama.cpp (device list) and llama_model::load_tensors (src/llama-model.cpp:1500-1600):
the layers [i_gpu_start, n_layer] are offloaded (the output layer counts as layer n_layer); weights
go to their layer's device buffer type, or to CPU_Mapped (mmap) / CPU_REPACK on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from schedplan.backends import cpu
from schedplan.backends.types import Backend, BufferType
from schedplan.planner.hparams import HParams
from schedplan.planner.params import Params


class BadDevices(Exception):
    """Devices that llama.cpp would refuse, with the reason."""


@dataclass
class Devices:
    backends: list[Backend]              # llama_context order: model devices, ACCEL, CPU last
    layer_backend: list[Backend]         # dev_layer(il) for il in [0, n_layer); CPU when not offloaded
    output_backend: Backend              # dev_output
    n_gpu_layers: int

    @property
    def cpu(self) -> Backend:
        return self.backends[-1]

    def model_devices(self) -> list[Backend]:
        return self.backends[:-1]

    def backend_index(self, backend: Backend) -> int:
        return self.backends.index(backend)


def plan_devices(params: Params, hp: HParams) -> Devices:
    """CPU only for now: every layer and the output run on the CPU backend."""
    if params.rpc or params.devices:
        raise BadDevices("multi-device plans (--rpc, --device) are not implemented yet")
    cpu_backend = cpu.cpu_backend()
    n_gpu_layers = params.n_gpu_layers if params.n_gpu_layers >= 0 else hp.n_layer + 1
    return Devices([cpu_backend], [cpu_backend] * hp.n_layer, cpu_backend, n_gpu_layers)


# llm_tensor_info_for (src/llama-arch.cpp): the op that uses each weight decides its buffer type
MUL_MAT_WEIGHTS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                   "ffn_up.weight", "ffn_down.weight", "output.weight")


def weight_op(name: str, il: int, n_layer: int) -> str:
    if name == "token_embd.weight":
        return "MUL_MAT" if il == n_layer else "GET_ROWS"   # a tied output is the duplicate at n_layer
    return "MUL_MAT" if name.endswith(MUL_MAT_WEIGHTS) else "OTHER"


def weight_placement(devices: Devices, params: Params, n_layer: int):
    """The buffer type of each weight on the CPU (select_weight_buft, llama-model.cpp): the first of
    [CPU_REPACK (with extra buffer types), CPU] that supports the weight's op; the CPU buffer type
    is mmapped from the file (use_mmap, the default), so it shows as CPU_Mapped."""
    mapped, repack = cpu.cpu_mapped_buft(), cpu.cpu_repack_buft()

    def place(weight, name: str, il: int) -> BufferType:
        if params.use_extra_bufts and weight_op(name, il, n_layer) == "MUL_MAT" and cpu.repacks(weight):
            return repack
        return mapped

    return place
