"""`schedplan devices`: this machine's devices as llama.cpp sees them, and what plans use them as."""
from __future__ import annotations

import dataclasses
import json
from typing import Callable, Optional

import click

from . import detection
from ..backends.detect import DECLARE, Detection, LocalDevice, detect
from ..planner.devices import BadDevices
from ..planner.params import Params

MiB = 1024 * 1024


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the machine-readable result (schema schedplan.devices/1).")
def devices(as_json: bool) -> None:
    """This machine's devices as llama.cpp sees them: what `llama-server --list-devices` prints
    (name, description, total and free memory), then the host's RAM and the --device spec each
    device is planned as. Without --device and --rpc, `reserve` and `fit` plan for these devices.

    \b
    Sources, in order:
      ggml's own device list through llama-cpp-python (the `run` extra): the numbers --fit uses;
      else nvidia-smi (CUDA_VISIBLE_DEVICES honoured), rocm-smi or amd-smi, and on Apple silicon
      sysctl (hw.memsize, iogpu.wired_limit_mb);
      always the host's RAM (/proc/meminfo MemAvailable).
    nvidia-smi's free memory is read before llama.cpp creates its CUDA context, which takes a few
    hundred MiB of it; with the `run` extra the numbers are ggml's own.
    """
    found = detect()
    click.echo(json.dumps(devices_report(found), indent=1) if as_json else render(found))


def devices_report(found: Detection) -> dict:
    return {"schema": "schedplan.devices/1", "source": found.source,
            "devices": [dataclasses.asdict(d) | {"planned": d in found.model_devices() and d.spec is not None}
                        for d in found.devices],
            "host": {"total": found.host_total, "available": found.host_available}, "notes": found.notes,
            "errors": found.errors}


def _mib(n: Optional[int]) -> str:
    return "?" if n is None else str(n // MiB)


def render(found: Detection) -> str:
    # common_print_available_devices
    out = ["Available devices:"]
    out += [f"  {d.name}: {d.description} ({_mib(d.total)} MiB, {_mib(d.free)} MiB free)" for d in found.devices]
    if not found.devices:
        out.append("  (none)")
    available = f", {_mib(found.host_available)} MiB available" if found.host_available is not None else ""
    out += ["", f"Host: {_mib(found.host_total)} MiB of RAM{available}", f"Source: {found.source}"]
    used = found.model_devices()
    for d in found.devices:
        if d not in used:
            out.append(f"{d.name}: not used: llama.cpp takes integrated GPUs only when there is no other GPU")
        elif d.spec is None:
            out.append(f"{d.name}: cannot be planned: {d.why_not}")
    specs = [d.spec for d in used if d.spec]
    if specs:
        out.append("Planned as: " + " ".join(f"--device {s}" for s in specs))
    out += [f"error: {e}" for e in found.errors] + [f"note: {n}" for n in found.notes]
    return "\n".join(out)


def device_spec(d: LocalDevice) -> str:
    """The spec with the device's total memory."""
    return f"{d.spec}:total={d.total}" if d.total is not None else d.spec


def needs_detection(params: Params, beside_rpc: bool = False) -> bool:
    """No devices declared (--device, `--device none`, or --rpc unless beside_rpc: a llama-server
    command's --rpc servers come before the local GPUs)."""
    return not params.devices and not (params.rpc and not beside_rpc)


def for_this_machine(params: Params, beside_rpc: bool = False,
                     detector: Callable[[], Detection] = detection.detect_once) -> tuple[Params, Optional[Detection]]:
    """Params for this machine's devices when none were declared (needs_detection): the devices
    llama.cpp would use (the GPUs, else the integrated ones). A device that cannot be planned is
    one line saying why and how to declare the devices instead. Also returns what was detected,
    for the host's RAM (None when the devices were declared)."""
    if not needs_detection(params, beside_rpc):
        return params, None
    found = detector()
    if found.errors:
        raise BadDevices(f"this machine's devices cannot be read: {found.errors[0]}")
    used = found.model_devices()
    for d in used:
        if d.spec is None:
            raise BadDevices(f"this machine's {d.name} ({d.description}) cannot be planned: {d.why_not}; or {DECLARE}")
    return dataclasses.replace(params, devices=tuple(device_spec(d) for d in used)), found
