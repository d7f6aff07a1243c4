"""What llama.cpp's --fit chooses, offline: common/fit.cpp (common_fit_params) step by step.

llama.cpp measures each candidate by loading the model and creating a context with no_alloc
(common_get_device_memory_data_impl): per device the model, context and compute bytes of
llama_get_memory_breakdown. Here each measurement is a plan of the same configuration
(get_device_memory_data), so fit needs neither the model's weights nor the devices.

  1. the user's parameters: if every device keeps its target margin free, nothing changes;
  2. an unset context (-c absent) shrinks towards -fitc by linear interpolation, aligned to 256;
  3. layers fill the devices back to front (false position on the bytes per layer); for MoE
     models first only the dense parts, the experts overflowing to the CPU;
  4. MoE: where the dense parts fit, whole layers fill the devices front to back, the first
     partial layer of each device overflowing part of its FFN to the next device or the CPU.
The result is what llama-fit-params prints: -c, -ngl, -ts and -ot.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from .download import read_model_header
from .gguf import GGUFHeader
from .params import Params
from .reserve import Context, create_context, memory_breakdown, sched_reserve_no_alloc

MiB = 1024 * 1024
UINT32_MAX = 2**32 - 1
LLAMA_MAX_DEVICES = 16                   # llama_max_devices (src/llama.cpp)
LLAMA_MAX_TENSOR_BUFT_OVERRIDES = 4096   # llama_max_tensor_buft_overrides
DEFAULT_MARGIN = 1024 * MiB              # common_params::fit_params_target
DEFAULT_N_CTX_MIN = 4096                 # common_params::fit_params_min_ctx

# common_layer_fraction_t: the part of a layer that stays on its device when it overflows
LAYER_FRACTION_ATTN = 1   # attention
LAYER_FRACTION_UP = 2     # attention + up
LAYER_FRACTION_GATE = 3   # attention + up + gate
LAYER_FRACTION_MOE = 4    # everything but the sparse MoE weights
FRACTION_KEEPS = {LAYER_FRACTION_ATTN: "its attention", LAYER_FRACTION_UP: "its attention and FFN up",
                  LAYER_FRACTION_GATE: "its attention and FFN up and gate",
                  LAYER_FRACTION_MOE: "all but its experts"}

# common_params_fit_status
FIT_SUCCESS, FIT_FAILURE, FIT_ERROR = 0, 1, 2


class FitFailure(Exception):
    """common_params_fit_exception: fit gives up, and says why (status 1)."""


@dataclass
class DeviceMemoryData:
    """llama_device_memory_data: a device's free/total memory and what the model would use there."""
    free: int = 0
    total: int = 0
    model: int = 0
    context: int = 0
    compute: int = 0

    def used(self) -> int:
        """llama_memory_breakdown_data::total"""
        return self.model + self.context + self.compute


@dataclass
class Measurement:
    dmds: list[DeviceMemoryData]     # one per device, then the host
    devs: list[str]                  # the devices' names (llama_model_get_device)
    dev_bufts: list[str]             # their buffer types' names (ggml_backend_dev_buffer_type)
    hp_ngl: int                      # layers (hparams.n_layer)
    hp_nct: int                      # n_ctx_train
    hp_nex: int                      # n_expert
    layer_devices: list[str] = field(default_factory=list)   # per layer, then the output layer: its device
    arch: str = ""                   # general.architecture
    model_bytes: int = 0             # every weight buffer, wherever it is (CPU_REPACK included)


def host_memory() -> int:
    """ggml_backend_cpu_device_get_memory: physical memory, all of it counted as free."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def get_device_memory_data(model_path: str, params: Params, host_total: int,
                           header: Optional[GGUFHeader] = None) -> Measurement:
    """common_get_device_memory_data_impl: a no_alloc load (load_mode none: nothing mapped), then
    llama_get_memory_breakdown summed per device; host buffer types count for the host."""
    ctx = create_context(model_path, dataclasses.replace(params, use_mmap=False), header)
    dmds = device_memory(ctx, sched_reserve_no_alloc(ctx), host_total)
    devices = ctx.devices.model_devices()
    hp = ctx.hparams
    # hp_ngl: llama_model_n_layer, plus the NextN blocks when they are loaded (load_mtp)
    hp_ngl = hp.n_layer + (hp.n_layer_nextn if params.load_mtp else 0)
    return Measurement(dmds, [b.device_name for b in devices], [b.buft.name for b in devices], hp_ngl,
                       hp.n_ctx_train, hp.n_expert,
                       [b.device_name for b in ctx.devices.layer_backend] + [ctx.devices.output_backend.device_name],
                       hp.arch, sum(b.size for b in ctx.model.buffers))


def device_memory(ctx: Context, compute_sizes: list[int], host_total: int) -> list[DeviceMemoryData]:
    """llama_get_memory_breakdown summed per device as common/fit.cpp sums it, the host last;
    compute_sizes: per scheduler backend."""
    devices = ctx.devices.model_devices()
    dmds = [DeviceMemoryData() for _ in range(len(devices) + 1)]
    index = {b.device_name: i for i, b in enumerate(devices)}
    bufts = {b.buft.name: b.buft for b in ctx.model.buffers}
    bufts.update((b.name, b) for b in ctx.sched.bufts)
    bufts.update((b.buft.name, b.buft) for b in ctx.devices.backends)

    def add(name: str, kind: str, size: int) -> None:
        buft = bufts[name]
        i = len(devices) if buft.is_host else index.get(buft.device)
        if i is not None:
            setattr(dmds[i], kind, getattr(dmds[i], kind) + size)

    for b in ctx.model.buffers:
        add(b.buft.name, "model", b.size)
    for name, size in memory_breakdown(ctx).items():
        add(name, "context", size)
    for buft, size in zip(ctx.sched.bufts, compute_sizes):
        add(buft.name, "compute", size)

    dmds[-1].free = dmds[-1].total = host_total
    for dmd, b in zip(dmds, devices):
        if b.memory is None:
            raise FitFailure(f"the free memory of {b.device_name} is not known")
        dmd.free = b.memory
        dmd.total = b.memory_total if b.memory_total is not None else b.memory
    return dmds


@dataclass
class NglT:
    """ngl_t: layers on a device, how many of them partial, and how the first partial one overflows."""
    n_layer: int = 0
    n_part: int = 0
    overflow_type: int = LAYER_FRACTION_MOE

    def n_full(self) -> int:
        # uint32_t arithmetic; the C assert(n_layer >= n_part) is compiled out of release builds
        return _u32(self.n_layer - self.n_part)


@dataclass
class FitResult:
    status: int
    params: Params                   # the fitted parameters (the user's where fit changed nothing; -c in n_ctx)
    args: str                        # llama-fit-params' line
    message: str = ""                # why fit failed
    margins: list[int] = field(default_factory=list)   # the free memory to leave, per device
    log: list[str] = field(default_factory=list)    # what fit did, in order
    initial: Optional[Measurement] = None           # the user's parameters, measured
    final: Optional[Measurement] = None             # the fitted parameters, measured
    offload_ctx: Optional[int] = None               # largest_offload_ctx


def get_overflow_pattern(il: int, lf: int) -> str:
    """get_overflow_pattern in common_params_fit_impl: the tensors of layer il that overflow."""
    if il >= 1000:
        raise RuntimeError("at most 1000 model layers are supported")
    return {LAYER_FRACTION_ATTN: f"blk\\.{il}\\.ffn_(gate|up|gate_up|down).*",
            LAYER_FRACTION_UP: f"blk\\.{il}\\.ffn_(gate|gate_up|down).*",
            LAYER_FRACTION_GATE: f"blk\\.{il}\\.ffn_down.*",
            LAYER_FRACTION_MOE: f"blk\\.{il}\\.ffn_(up|down|gate_up|gate)_(ch|)exps"}[lf]


PATTERN_MOE_ALL = "blk\\.\\d+\\.ffn_(up|down|gate_up|gate)_(ch|)exps"


@dataclass(frozen=True)
class ExtraModel:
    """common_fit_extra_model: a second model on the main model's devices (a draft model), its
    context following the main one's n_ctx; shares_model: its weights are the main model's (MTP)."""
    path: str
    params: Params
    shares_model: bool = False


class Fit:
    """common_params_fit_impl's state: the parameters being fitted and how each trial measures."""

    def __init__(self, model_path: str, params: Params, n_ctx_auto: bool, margins: list[int], n_ctx_min: int,
                 host_total: int, extra: Optional[ExtraModel] = None) -> None:
        self.model_path, self.params, self.n_ctx_auto = model_path, params, n_ctx_auto
        self.user_params = params
        self.margins_s, self.n_ctx_min, self.host_total = margins, n_ctx_min, host_total
        self.extra = extra
        # the extra model's memory on the main model's devices, by the context it was measured at
        self.dmds_extra: dict[int, list[DeviceMemoryData]] = {}
        self.log: list[str] = []
        # the header is read once, and a configuration measured once (the final one is often a trial's)
        self.header = read_model_header(model_path, params.header_cache)
        self.measured: dict[Params, Measurement] = {}

    def measure(self, params: Params, with_extra: bool = True) -> Measurement:
        """The configuration's measurement (memoised), with the extra model's memory added unless
        with_extra is off."""
        if params not in self.measured:
            self.measured[params] = get_device_memory_data(self.model_path, params, self.host_total, self.header)
        m = self.measured[params]
        return self.add_extra_memory(m, params.n_ctx) if with_extra else m

    def add_extra_memory(self, m: Measurement, n_ctx: int) -> Measurement:
        """add_extra_memory in common_params_fit_impl: the extra model measured at the main context's
        n_ctx (again whenever it changes), laid out on the main model's devices by device, its host
        part on the host; without its weights when it shares the main model's. The sum is a copy:
        m may be a memoised measurement."""
        if self.extra is None:
            return m
        if n_ctx not in self.dmds_extra:
            self.trc(f"getting device memory data for the extra model at a context size of {n_ctx}")
            measured = get_device_memory_data(self.extra.path, dataclasses.replace(self.extra.params, n_ctx=n_ctx),
                                              self.host_total)
            dmds = [DeviceMemoryData() for _ in m.dmds]
            dmds[-1].model, dmds[-1].context, dmds[-1].compute = (measured.dmds[-1].model, measured.dmds[-1].context,
                                                                  measured.dmds[-1].compute)
            for je, dev in enumerate(measured.devs):
                if dev in m.devs:
                    d = dmds[m.devs.index(dev)]
                    d.model += measured.dmds[je].model
                    d.context += measured.dmds[je].context
                    d.compute += measured.dmds[je].compute
            if self.extra.shares_model:
                for d in dmds:
                    d.model = 0
            self.dmds_extra[n_ctx] = dmds
        m = dataclasses.replace(m, dmds=[dataclasses.replace(d) for d in m.dmds])
        for d, e in zip(m.dmds, self.dmds_extra[n_ctx]):
            d.model += e.model
            d.context += e.context
            d.compute += e.compute
        return m

    def trc(self, line: str) -> None:
        self.log.append(line)

    def run(self) -> None:
        """common_params_fit_impl: self.params is updated in place of mparams/cparams."""
        p = self.params
        # with a non-unified cache the context is per stream (-np of them); -sm tensor, which fit
        # refuses, is not a split mode schedplan takes
        n_streams = self.n_streams = 1 if p.kv_unified else max(1, p.n_seq_max)

        # step 1: the user's parameters
        m = self.initial = self.measure(p, with_extra=False)
        n_ctx_max = min(m.hp_nct * n_streams, UINT32_MAX)
        n_ctx_min_total = min(self.n_ctx_min * n_streams, UINT32_MAX)
        if self.n_ctx_auto:
            p = self.params = dataclasses.replace(p, n_ctx=n_ctx_max)
            if n_streams > 1:
                self.trc(f"context size unset and KV cache not unified -> using {n_ctx_max} for {n_streams} sequences")
                m = self.initial = self.measure(p, with_extra=False)
        m = self.initial = self.add_extra_memory(m, p.n_ctx)   # the extra model follows the resolved context
        dmds_full = m.dmds
        nd = len(m.devs)
        margins = [self.margins_s[0]] if nd == 0 else [self.margins_s[i] for i in range(nd)]

        sum_free = sum_projected_free = sum_projected_used = sum_projected_model = 0
        if nd == 0:
            sum_projected_used = dmds_full[-1].used()
            sum_free = dmds_full[-1].total
            sum_projected_free = sum_free - sum_projected_used
            self.trc(f"projected to use {mib(sum_projected_used)} MiB of host memory vs. {mib(sum_free)} MiB "
                     f"of total host memory")
            if sum_projected_free >= margins[0]:
                self.trc(f"will leave {mib(sum_projected_free)} >= {mib(margins[0])} MiB of system memory, "
                         f"no changes needed")
                return
        else:
            projected_free_per_device = []
            for i in range(nd):
                dmd = dmds_full[i]
                projected_free = dmd.free - dmd.used()
                projected_free_per_device.append(projected_free)
                sum_free += dmd.free
                sum_projected_used += dmd.used()
                sum_projected_free += projected_free
                sum_projected_model += dmd.model
            self.trc(f"projected to use {mib(sum_projected_used)} MiB of device memory vs. {mib(sum_free)} MiB "
                     f"of free device memory")
            if all(projected_free_per_device[i] >= margins[i] for i in range(nd)):
                self.trc("targets for free memory can be met on all devices, no changes needed")
                return

        # step 2: a smaller context
        global_surplus = sum_projected_free - sum(margins)
        if global_surplus < 0:
            self.trc(f"cannot meet free memory targets, need to use {mib(-global_surplus)} MiB less in total")
            if not self.n_ctx_auto:
                self.trc(f"context size set by user to {p.n_ctx} -> no change")
            elif n_ctx_max <= n_ctx_min_total:
                self.trc(f"user has requested full context size of {n_ctx_max} -> no change"
                         if self.n_ctx_min == UINT32_MAX else
                         f"default model context size is {n_ctx_max} which is <= the min. context size of "
                         f"{n_ctx_min_total} -> no change")
            elif self.reduce_context(m, n_ctx_max, n_ctx_min_total, sum_free, sum_projected_used,
                                     sum_projected_model, margins) and nd <= 1:
                return
            p = self.params
        if nd == 0:
            raise FitFailure("was unable to fit model into system memory by reducing context, abort")

        if p.n_gpu_layers != -1:
            raise FitFailure(f"n_gpu_layers already set by user to {p.n_gpu_layers}, abort")
        if nd > 1:
            if any(x != 0.0 for x in p.tensor_split[:nd]):
                raise FitFailure("model_params::tensor_split already set by user, abort")
            if p.split_mode == "row":
                raise FitFailure("changing weight allocation for LLAMA_SPLIT_MODE_ROW not implemented, abort")
        if p.tensor_overrides:
            raise FitFailure("model_params::tensor_buft_overrides already set by user, abort")
        self.fill_layers(m, dmds_full, margins)

    def reduce_context(self, m: Measurement, n_ctx_max: int, n_ctx_min_total: int, sum_free: int,
                       sum_projected_used: int, sum_projected_model: int, margins: list[int]) -> bool:
        """Step 2: the context by linear interpolation between -fitc and the full context; True if
        the reduction alone should be enough."""
        nd = len(m.devs)
        sum_used_target = sum_free - sum(margins)
        if nd > 1:
            # whole layers (dense) or whole tensors (MoE, ~1/3 layer) go to devices: half of one wasted per device
            n_layers = min(_u32(self.params.n_gpu_layers), m.hp_ngl)
            if n_layers == 0:
                raise RuntimeError("-ngl 0 with several devices: llama.cpp's fit divides by zero here and crashes")
            model_per_layer = _cdiv(sum_projected_model, n_layers)
            sum_used_target -= _cdiv((nd + 1) * model_per_layer, 2 if m.hp_nex == 0 else 6)
        self.params = dataclasses.replace(self.params, n_ctx=n_ctx_min_total)
        dmds_min_ctx = self.measure(self.params).dmds
        used_min_ctx = dmds_min_ctx[-1].used() if nd == 0 else sum(d.used() for d in dmds_min_ctx[:nd])
        if sum_used_target > used_min_ctx:
            n_ctx = _u32(n_ctx_min_total + _cdiv((n_ctx_max - n_ctx_min_total) * (sum_used_target - used_min_ctx),
                                                 sum_projected_used - used_min_ctx))
            align = 256 * self.n_streams
            n_ctx = max(_u32(n_ctx - n_ctx % align), n_ctx_min_total)
            self.params = dataclasses.replace(self.params, n_ctx=n_ctx)
            bytes_per_ctx = _cdiv(sum_projected_used - used_min_ctx, n_ctx_max - n_ctx_min_total)
            self.trc(f"context size reduced from {n_ctx_max} to {n_ctx} -> need "
                     f"{mib((n_ctx_max - n_ctx) * bytes_per_ctx)} MiB less memory in total")
            self.trc("entire model can be fit by reducing context" if nd <= 1 else
                     "entire model should be fit across devices by reducing context")
            return True
        self.trc(f"context size reduced from {n_ctx_max} to {self.params.n_ctx} -> need "
                 f"{mib(sum_projected_used - used_min_ctx)} MiB less memory in total")
        return False

    # --- steps 3 and 4: layers per device ----------------------------------------------------------

    def set_ngl_tensor_split_tbo(self, m: Measurement, ngl_per_device: list[NglT],
                                 overflow_bufts: list[str], p: Params) -> Params:
        """set_ngl_tensor_split_tbo: -ngl, -ts and the overflow -ot patterns of a layer assignment."""
        nd = len(m.devs)
        # uint32_t sums stored in the int32_t n_gpu_layers; il0 and its bounds wrap as uint32_t do
        n_gpu_layers = _i32(_u32(sum(n.n_layer for n in ngl_per_device)))
        tensor_split = tuple(float(n.n_layer) for n in ngl_per_device) if nd > 1 else p.tensor_split
        il0 = _u32(m.hp_ngl + 1 - n_gpu_layers)
        overrides = []
        for i in range(nd):
            il0 = _u32(il0 + ngl_per_device[i].n_full())
            for il in range(il0, _u32(il0 + ngl_per_device[i].n_part)):
                if len(overrides) + 1 >= LLAMA_MAX_TENSOR_BUFT_OVERRIDES:
                    raise FitFailure(f"llama_max_tensor_buft_overrides() == {LLAMA_MAX_TENSOR_BUFT_OVERRIDES} is "
                                     f"insufficient for model")
                first = il == il0
                overrides.append((get_overflow_pattern(il, ngl_per_device[i].overflow_type if first
                                                       else LAYER_FRACTION_MOE),
                                  overflow_bufts[i] if first else "CPU"))
            il0 = _u32(il0 + ngl_per_device[i].n_part)
        return dataclasses.replace(p, n_gpu_layers=n_gpu_layers, tensor_split=tensor_split,
                                   tensor_overrides=tuple(overrides))

    def get_memory_for_layers(self, m: Measurement, ngl_per_device: list[NglT], overflow_bufts: list[str]) -> list[int]:
        trial = self.set_ngl_tensor_split_tbo(m, ngl_per_device, overflow_bufts, self.params)
        dmds = self.measure(trial).dmds
        return [dmds[i].used() for i in range(len(m.devs))]

    def fill_layers(self, m: Measurement, dmds_full: list[DeviceMemoryData], margins: list[int]) -> None:
        nd, hp_ngl, hp_nex = len(m.devs), m.hp_ngl, m.hp_nex
        global_surplus_cpu_moe = 0
        if hp_nex > 0:
            dmds_cpu_moe = self.measure(dataclasses.replace(self.params,
                                                            tensor_overrides=((PATTERN_MOE_ALL, "CPU"),))).dmds
            global_surplus_cpu_moe = sum(dmds_cpu_moe[i].free - dmds_cpu_moe[i].used() - margins[i] for i in range(nd))
            self.trc(f"with only dense weights in device memory there is a total surplus of "
                     f"{mib(global_surplus_cpu_moe)} MiB" if global_surplus_cpu_moe > 0 else
                     f"with only dense weights in device memory there is still a total deficit of "
                     f"{mib(-global_surplus_cpu_moe)} MiB")

        targets = [dmds_full[i].free - margins[i] for i in range(nd)]
        overflow_bufts = ["CPU"] * nd
        ngl_per_device = [NglT() for _ in range(nd)]
        mem = self.get_memory_for_layers(m, ngl_per_device, overflow_bufts)

        # step 3: back to front, false position on the memory per layer (the last device holds the
        # output layer, which cannot be partial)
        self.trc("filling dense layers back-to-front" if hp_nex == 0 else "filling dense-only layers back-to-front")
        for i in range(nd - 1, -1, -1):
            n_unassigned = hp_ngl + 1 - sum(ngl_per_device[j].n_layer for j in range(i + 1, nd))
            high = _copy(ngl_per_device)
            high[i].n_layer = n_unassigned
            if hp_nex > 0:
                high[i].n_part = high[i].n_layer if i < nd - 1 else high[i].n_layer - 1
            if high[i].n_layer > 0:
                mem_high = self.get_memory_for_layers(m, high, overflow_bufts)
                if mem_high[i] > targets[i]:
                    delta = _u32(high[i].n_layer - ngl_per_device[i].n_layer)
                    while delta > 1:
                        step_size = _step(delta, targets[i] - mem[i], mem_high[i] - mem[i])
                        test = _copy(ngl_per_device)
                        test[i].n_layer += step_size
                        if hp_nex:
                            # the first layer is the output layer, which must always be full
                            test[i].n_part += step_size - 1 if i == nd - 1 and test[i].n_part == 0 else step_size
                        mem_test = self.get_memory_for_layers(m, test, overflow_bufts)
                        if mem_test[i] <= targets[i]:
                            ngl_per_device, mem = test, mem_test
                        else:
                            high, mem_high = test, mem_test
                        delta = _u32(high[i].n_layer - ngl_per_device[i].n_layer)
                else:
                    ngl_per_device, mem = high, mem_high
            self.trc(f"{m.devs[i]}: {ngl_per_device[i].n_layer} layers, {mib(mem[i])} MiB used, "
                     f"{mib(dmds_full[i].free - mem[i])} MiB free")
        if hp_nex == 0 or global_surplus_cpu_moe <= 0:
            self.params = self.set_ngl_tensor_split_tbo(m, ngl_per_device, overflow_bufts, self.params)
            return
        self.fill_moe_layers(m, dmds_full, targets, ngl_per_device, overflow_bufts, mem)

    def fill_moe_layers(self, m: Measurement, dmds_full: list[DeviceMemoryData], targets: list[int],
                        ngl_per_device: list[NglT], overflow_bufts: list[str], mem: list[int]) -> None:
        """Step 4: the dense-only layers at the back become full layers at the front, device by
        device, then each device tries part of one more layer (its FFN overflowing)."""
        nd = len(m.devs)
        id_dense_start = nd
        for i in range(nd - 1, -1, -1):
            if ngl_per_device[i].n_layer == 0:
                break
            id_dense_start = i
        # C's assert(id_dense_start < nd) is compiled out: with no device holding a layer the loop below
        # does not run and fit goes on with ngl 0 (llama-fit-params prints -ngl 0)

        self.trc("converting dense-only layers to full layers and filling them front-to-back with overflow to "
                 "next device/system memory")
        i = 0
        while i <= id_dense_start and id_dense_start < nd:
            high = _copy(ngl_per_device)
            for j in range(id_dense_start, nd):
                n_layer_move = high[j].n_layer if j < nd - 1 else high[j].n_layer - 1
                high[i].n_layer += n_layer_move
                high[j].n_layer -= n_layer_move
                high[j].n_part = 0
            id_dense_start_high = nd - 1
            mem_high = self.get_memory_for_layers(m, high, overflow_bufts)

            if mem_high[i] > targets[i]:
                delta = _u32(high[i].n_full() - ngl_per_device[i].n_full())
                while delta > 1:
                    step_size = _step(delta, targets[i] - mem[i], mem_high[i] - mem[i])
                    test = _copy(ngl_per_device)
                    id_dense_start_test = id_dense_start
                    n_converted_test = 0
                    while id_dense_start_test < nd:
                        n_convert = min(step_size - n_converted_test, test[id_dense_start_test].n_part)
                        test[id_dense_start_test].n_layer -= n_convert
                        test[id_dense_start_test].n_part -= n_convert
                        test[i].n_layer += n_convert
                        n_converted_test += n_convert
                        if test[id_dense_start_test].n_part > 0:
                            break
                        id_dense_start_test += 1
                    mem_test = self.get_memory_for_layers(m, test, overflow_bufts)
                    if mem_test[i] <= targets[i]:
                        ngl_per_device, mem, id_dense_start = test, mem_test, id_dense_start_test
                    else:
                        high, mem_high, id_dense_start_high = test, mem_test, id_dense_start_test
                    delta = _u32(high[i].n_full() - ngl_per_device[i].n_full())
            else:
                ngl_per_device, mem, id_dense_start = high, mem_high, id_dense_start_high

            # try to fit at least part of one more layer
            if ngl_per_device[id_dense_start].n_layer > (0 if i < nd - 1 else 1):
                test = _copy(ngl_per_device)
                id_dense_start_test = id_dense_start
                test[id_dense_start_test].n_layer = _u32(test[id_dense_start_test].n_layer - 1)
                test[id_dense_start_test].n_part = _u32(test[id_dense_start_test].n_part - 1)
                test[i].n_layer += 1
                test[i].n_part += 1
                if test[id_dense_start_test].n_part == 0:
                    id_dense_start_test += 1
                test[i].overflow_type = LAYER_FRACTION_UP
                overflow_bufts_test = list(overflow_bufts)
                if i < nd - 1:
                    overflow_bufts_test[i] = m.dev_bufts[i + 1]

                def fits(mem_test: list[int]) -> bool:
                    return mem_test[i] < targets[i] and (i + 1 == nd or mem_test[i + 1] < targets[i + 1])

                mem_test = self.get_memory_for_layers(m, test, overflow_bufts_test)
                if fits(mem_test):
                    ngl_per_device, overflow_bufts, mem, id_dense_start = \
                        _copy(test), overflow_bufts_test, mem_test, id_dense_start_test
                    test[i].overflow_type = LAYER_FRACTION_GATE
                    mem_test = self.get_memory_for_layers(m, test, overflow_bufts_test)
                    if fits(mem_test):
                        ngl_per_device, overflow_bufts, mem, id_dense_start = \
                            _copy(test), overflow_bufts_test, mem_test, id_dense_start_test
                else:
                    test[i].overflow_type = LAYER_FRACTION_ATTN
                    mem_test = self.get_memory_for_layers(m, test, overflow_bufts_test)
                    if fits(mem_test):
                        ngl_per_device, overflow_bufts, mem, id_dense_start = \
                            _copy(test), overflow_bufts_test, mem_test, id_dense_start_test
            n = ngl_per_device[i]
            self.trc(f"{m.devs[i]}: {n.n_layer} layers ({n.n_part} partial"
                     f"{', the first keeping ' + FRACTION_KEEPS[n.overflow_type] if n.n_part else ''}), "
                     f"{mib(mem[i])} MiB used, {mib(dmds_full[i].free - mem[i])} MiB free")
            i += 1
        for j in range(id_dense_start + 1, nd):
            self.trc(f"{m.devs[j]}: {ngl_per_device[j].n_layer} layers ({ngl_per_device[j].n_part} partial), "
                     f"{mib(mem[j])} MiB used, {mib(dmds_full[j].free - mem[j])} MiB free")
        self.params = self.set_ngl_tensor_split_tbo(m, ngl_per_device, overflow_bufts, self.params)


def _copy(ngl: list[NglT]) -> list[NglT]:
    return [dataclasses.replace(n) for n in ngl]


def _cdiv(a: int, b: int) -> int:
    """C's int64 division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def mib(x: int) -> int:
    """x/MiB as common/fit.cpp logs an int64_t: a margin of -0.5 MiB prints 0."""
    return _cdiv(x, MiB)


def _u32(x: int) -> int:
    return x & UINT32_MAX


def _i32(x: int) -> int:
    """A value stored in a C int32_t (two's complement wrap)."""
    return (x + 2**31) % 2**32 - 2**31


def _step(delta: int, num: int, den: int) -> int:
    """step_size = int64(delta) * num / den stored in a uint32, clamped to [1, delta - 1]."""
    step_size = _u32(_cdiv(delta * num, den))
    return min(max(step_size, 1), delta - 1)


OVERFLOW_PARTS = {LAYER_FRACTION_ATTN: "its FFN", LAYER_FRACTION_UP: "its FFN gate and down",
                  LAYER_FRACTION_GATE: "its FFN down", LAYER_FRACTION_MOE: "its experts"}


def describe_placement(m: Measurement, overrides: tuple[tuple[str, str], ...]) -> list[str]:
    """In words: which layers each device holds, and what of which layers the -ot patterns move."""
    out = []
    ranges: list[tuple[str, int, int]] = []
    for il, dev in enumerate(m.layer_devices):
        if ranges and ranges[-1][0] == dev and ranges[-1][2] == il - 1:
            ranges[-1] = (dev, ranges[-1][1], il)
        else:
            ranges.append((dev, il, il))
    n_layer = len(m.layer_devices) - 1
    for dev, first, last in ranges:
        output = last == n_layer
        last -= output
        span = "" if first > last else f"layer {first}" if first == last else f"layers {first}..{last}"
        out.append(f"{dev}: {span}{' and ' if span and output else ''}{'the output layer' if output else ''}")
    moved: list[tuple[str, str, int, int]] = []     # (what, where, first layer, last layer)
    device_of = dict(zip(m.dev_bufts, m.devs))
    for pattern, buft in overrides:
        match = next(((il, lf) for il in _layer_of(pattern) for lf in OVERFLOW_PARTS
                      if get_overflow_pattern(il, lf) == pattern), None)
        if match is None:
            out.append(f"-ot {pattern}={buft}")
            continue
        il, lf = match
        if il >= n_layer:
            continue        # fit counts the output layer as layer n_layer: its pattern matches no tensor
        buft = device_of.get(buft, buft)
        what = OVERFLOW_PARTS[lf]
        if moved and moved[-1][:2] == (what, buft) and moved[-1][3] == il - 1:
            moved[-1] = (what, buft, moved[-1][2], il)
        else:
            moved.append((what, buft, il, il))
    for what, buft, first, last in moved:
        layers = f"layer {first}" if first == last else f"layers {first}..{last}"
        out.append(f"{layers}: {what} in {buft}" if what != "its experts" else f"{layers}: experts in {buft}")
    return out


def _layer_of(pattern: str) -> list[int]:
    m = re.match(r"blk\\\.(\d+)\\\.", pattern)
    return [int(m.group(1))] if m and int(m.group(1)) < 1000 else []


def fit_args(p: Params) -> str:
    """The line llama-fit-params prints (tools/fit-params/fit-params.cpp)."""
    out = f"-c {p.n_ctx} -ngl {p.n_gpu_layers}"
    ts = list(p.tensor_split[:LLAMA_MAX_DEVICES]) + [0.0] * (LLAMA_MAX_DEVICES - len(p.tensor_split))
    nd = LLAMA_MAX_DEVICES
    while nd > 1 and ts[nd - 1] == 0.0:
        nd -= 1
    if nd > 1:
        out += " -ts " + ",".join(str(_u32(int(x))) for x in ts[:nd])
    if p.tensor_overrides:
        out += ' -ot "' + ",".join(f"{pattern}={buft}" for pattern, buft in p.tensor_overrides) + '"'
    return out


def fit_targets(values: Optional[list[int]]) -> list[int]:
    """common_params::fit_params_target after -fitt: one value for every device, else one per
    device in order, the rest at the default."""
    if not values:
        return [DEFAULT_MARGIN] * LLAMA_MAX_DEVICES
    if len(values) == 1:
        return values * LLAMA_MAX_DEVICES
    return values + [DEFAULT_MARGIN] * (LLAMA_MAX_DEVICES - len(values))


def fit_params(model_path: str, params: Params, *, n_ctx_auto: bool, margins: Optional[list[int]] = None,
               n_ctx_min: int = DEFAULT_N_CTX_MIN, host_total: Optional[int] = None,
               extra: Optional[ExtraModel] = None) -> FitResult:
    """common_fit_params: the status, the fitted parameters and llama-fit-params' line."""
    margins = fit_targets(margins)
    fit = Fit(model_path, params, n_ctx_auto, margins, n_ctx_min, host_total or host_memory(), extra)
    status, message = FIT_SUCCESS, ""
    try:
        fit.run()
        fit.trc("successfully fit params to free device memory")
    except FitFailure as e:
        status, message = FIT_FAILURE, str(e)
    p = fit.params
    m = fit.initial
    n_nextn = len(m.layer_devices) - 1 - m.hp_ngl if m else 0
    if status == FIT_SUCCESS and n_nextn and 0 < p.n_gpu_layers <= m.hp_ngl + n_nextn:
        last = m.hp_ngl + n_nextn - p.n_gpu_layers
        fit.trc(f"note: fit counts the {m.hp_ngl} trunk layers (llama_model_n_layer), but llama.cpp places the "
                f"{n_nextn} multi-token-prediction block(s) as layers too: -ngl {p.n_gpu_layers} leaves "
                f"{'layer 0' if last == 0 else f'layers 0..{last}'} on the CPU")
    if status == FIT_SUCCESS and 1 < len(p.tensor_split) and p.tensor_split[-1] == 0.0:
        fit.trc("note: the line leaves out -ts for the last devices, which get no layers: pasted into llama.cpp "
                "with --fit off, the layers would be split over all devices by their free memory instead")
    log = list(fit.log)     # what fit did: the measurements below are schedplan's own
    final = fit.measure(p) if status == FIT_SUCCESS else None
    return FitResult(status, p, fit_args(p), message, margins, log, fit.initial, final, largest_offload_ctx(fit, final))


def largest_offload_ctx(fit: Fit, final: Optional[Measurement]) -> Optional[int]:
    """Not llama.cpp's: when the fitted flags keep every layer and weight on the devices, the largest
    context (-c) they still fit with: the same -ngl and -ts, no device using more than its free
    memory less its target, or than it uses at fit's own -c where that is more (fit measures its
    trials with -ot patterns, which turn pipeline parallelism off: the flags it prints can use more
    than a trial did). Among the multiples of 256 per KV stream up to the training context, and that
    context itself; None when fit failed or left weights on the CPU. Memory only grows with the
    context: a search over plans, each guess interpolated from the bracket's measured bytes."""
    p = fit.params
    if final is None or not final.devs or p.tensor_overrides or "CPU" in final.layer_devices:
        return None
    nd = len(final.devs)
    room = [max(final.dmds[i].free - fit.margins_s[i], final.dmds[i].used()) for i in range(nd)]
    streams = 1 if p.kv_unified else max(1, p.n_seq_max)
    step = 256 * streams
    hi = min(final.hp_nct * streams, UINT32_MAX)
    lo = p.n_ctx or hi

    def used(n_ctx: int) -> list[int]:
        dmds = fit.measure(dataclasses.replace(p, n_ctx=n_ctx)).dmds
        return [dmds[i].used() for i in range(nd)]

    def fits(u: list[int]) -> bool:
        return all(u[i] <= room[i] for i in range(nd))

    u_lo = [final.dmds[i].used() for i in range(nd)]
    if lo >= hi:
        return lo
    u_hi = used(hi)
    if fits(u_hi):
        return hi
    # lo fits, hi does not: search the grid between them (hi may be off the grid)
    lo_k, hi_k = lo // step, -(-hi // step)
    best = lo
    while hi_k - lo_k > 1:
        span = hi_k * step - lo_k * step
        guesses = [lo_k * step + (room[i] - u_lo[i]) * span // (u_hi[i] - u_lo[i])
                   for i in range(nd) if u_hi[i] > u_lo[i]]
        k = min(max(min(guesses) // step if guesses else (lo_k + hi_k) // 2, lo_k + 1), hi_k - 1)
        u = used(k * step)
        if fits(u):
            lo_k, u_lo, best = k, u, k * step
        else:
            hi_k, u_hi = k, u
    return best
