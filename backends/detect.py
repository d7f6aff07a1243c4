"""This machine's devices as llama.cpp sees them, for `schedplan devices` and for plans without
--device/--rpc.

Sources, in order:
1. ggml's own device list, through the libraries of llama-cpp-python (the `run` extra):
   ggml_backend_load_all, then per device its name, description, memory and type, as
   `llama-server --list-devices` prints them (common_print_available_devices), and the numbers
   --fit plans against.
2. Without it, each vendor's tool in its machine-readable form:
   - nvidia-smi --query-gpu=index,name,memory.total,memory.free,compute_cap --format=csv,noheader,nounits:
     CUDA devices, only those CUDA_VISIBLE_DEVICES leaves, in its order;
   - rocm-smi --showproductname --showmeminfo vram --json, else amd-smi metric --mem-usage --json:
     ROCm devices (listed; schedplan does not plan ROCm devices yet);
   - on Apple silicon, sysctl hw.memsize and iogpu.wired_limit_mb: the Metal device;
   - vulkaninfo --summary: Vulkan devices (listed; their free memory only ggml reads).
   A Vulkan device ggml lists is planned with the profile `vulkaninfo --json` writes for it.
3. Always the host's RAM: /proc/meminfo MemTotal and MemAvailable, else the physical pages.

A tool that is missing or fails is one note saying so and how to declare the device instead.
Each device carries the --device spec schedplan plans it as, or why it cannot.
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

MiB = 1024 * 1024
TOOL_TIMEOUT = 10       # seconds for one vendor tool


@dataclass(frozen=True)
class LocalDevice:
    name: str                      # ggml device name: CUDA0, ROCm0, MTL0, Vulkan0
    description: str               # ggml_backend_dev_description
    backend: str                   # its backend registry: CUDA, ROCm, Metal, Vulkan
    free: Optional[int]            # bytes; None when the source does not say
    total: Optional[int]
    spec: Optional[str] = None     # the --device spec schedplan plans it as
    why_not: str = ""              # why it cannot be planned (when spec is None)
    integrated: bool = False       # an IGPU: llama.cpp uses it only when there is no discrete GPU


@dataclass
class Detection:
    devices: list[LocalDevice]
    host_total: int                # physical memory (what ggml's CPU device reports)
    host_available: Optional[int]  # MemAvailable: what the CPU part of a model can really use
    source: str                    # "ggml" or the tools that answered
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)   # what makes planning for this machine impossible

    def model_devices(self) -> list[LocalDevice]:
        """llama_prepare_model_devices' default selection: the GPUs, else the integrated ones."""
        gpus = [d for d in self.devices if not d.integrated]
        return gpus or [d for d in self.devices if d.integrated]


DECLARE = "declare the devices with --device (e.g. --device cuda:24GiB:cc=8.9), or plan for the CPU alone with --device none"


def _device_spec(kind: str, free: int, **keys) -> str:
    return ":".join([kind, str(free)] + [f"{k}={v}" for k, v in keys.items()])


# --- 1. ggml's device list (llama-cpp-python) -----------------------------------------------------

class _Caps(ctypes.Structure):
    _fields_ = [("async_", ctypes.c_bool), ("host_buffer", ctypes.c_bool), ("buffer_from_host_ptr", ctypes.c_bool),
                ("events", ctypes.c_bool), ("mmap_support", ctypes.c_bool)]


class _Props(ctypes.Structure):
    """struct ggml_backend_dev_props (ggml/include/ggml-backend.h)."""
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p), ("memory_free", ctypes.c_size_t),
                ("memory_total", ctypes.c_size_t), ("type", ctypes.c_int), ("device_id", ctypes.c_char_p),
                ("caps", _Caps)]


# enum ggml_backend_dev_type
DEV_CPU, DEV_GPU, DEV_IGPU, DEV_ACCEL = 0, 1, 2, 3


def _ggml_libs() -> Optional[tuple[ctypes.CDLL, ctypes.CDLL]]:
    """libggml-base and libggml from where llama-cpp-python loads them (LLAMA_CPP_LIB_PATH, else its
    lib folder), by the names libllama links (a second copy of libggml would hold a second
    registry); None without llama-cpp-python."""
    from .llama_cpp_lib import LlamaCppMissing, available, lib_dir
    if not available():
        return None
    try:
        lib = lib_dir()
    except LlamaCppMissing:
        return None
    for base, ggml in (("libggml-base.so.0", "libggml.so.0"), ("libggml-base.dylib", "libggml.dylib"),
                       ("ggml-base.dll", "ggml.dll")):
        if (lib / base).exists() and (lib / ggml).exists():
            try:
                return ctypes.CDLL(str(lib / base)), ctypes.CDLL(str(lib / ggml))
            except OSError:
                return None
    return None


# ggml_log_callback (ggml/include/ggml.h): void (*)(enum ggml_log_level, const char *, void *)
_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_QUIET_LOG = _LOG_CALLBACK(lambda *args: None)     # module-level: ggml keeps the pointer


def _fn(lib: ctypes.CDLL, name: str, restype, *argtypes):
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


def ggml_devices() -> Optional[list[LocalDevice]]:
    """The non-CPU devices of ggml's registry, as common_print_available_devices lists them; None
    without llama-cpp-python."""
    libs = _ggml_libs()
    if libs is None:
        return None
    base, ggml = libs
    vp, cp, sz, fn = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, _fn
    load_all = fn(ggml, "ggml_backend_load_all", None)
    dev_count, dev_get = fn(ggml, "ggml_backend_dev_count", sz), fn(ggml, "ggml_backend_dev_get", vp, sz)
    get_props = fn(base, "ggml_backend_dev_get_props", None, vp, ctypes.POINTER(_Props))
    dev_reg, reg_name = fn(base, "ggml_backend_dev_backend_reg", vp, vp), fn(base, "ggml_backend_reg_name", cp, vp)
    dev_buft = fn(base, "ggml_backend_dev_buffer_type", vp, vp)
    buft_max = fn(base, "ggml_backend_buft_get_max_size", sz, vp)
    # the backends log as they load (ggml_vulkan: Found 1 Vulkan devices ...): not the user's output
    _fn(base, "ggml_log_set", None, _LOG_CALLBACK, ctypes.c_void_p)(_QUIET_LOG, None)
    load_all()
    out, n_cuda = [], 0
    for i in range(dev_count()):
        dev = dev_get(i)
        props = _Props()
        get_props(dev, ctypes.byref(props))
        if props.type == DEV_CPU:
            continue
        backend = reg_name(dev_reg(dev)).decode()
        buft = dev_buft(dev)
        d = LocalDevice(props.name.decode(), (props.description or b"").decode(), backend, props.memory_free,
                        props.memory_total, integrated=props.type == DEV_IGPU)
        out.append(_with_spec(d, props.type, n_cuda, buft_max(buft)))
        n_cuda += backend == "CUDA"
    return out


def _with_spec(d: LocalDevice, dev_type: int, cuda_index: int, max_size: int) -> LocalDevice:
    """The --device spec of a device ggml reported, from what its buffer type says."""
    from dataclasses import replace
    if dev_type == DEV_ACCEL:
        return replace(d, why_not=f"{d.backend} is an accelerator beside the CPU, not a model device")
    if d.backend == "CUDA":
        if d.integrated:
            return replace(d, why_not="an integrated CUDA device (unified memory): schedplan plans discrete ones only")
        cc = nvidia_compute_capability(cuda_index, d.description)
        if cc is None:
            return replace(d, why_not="its compute capability is not known (nvidia-smi did not say): declare it "
                                      f"with --device cuda:{d.free}:cc=MAJOR.MINOR")
        return replace(d, spec=_device_spec("cuda", d.free, cc=cc))
    if d.backend == "Metal":
        return replace(d, spec=_device_spec("metal", d.free, maxbuf=max_size))
    if d.backend == "Vulkan":
        profile, why = vulkan_profile(d.description)
        if profile is None:
            return replace(d, why_not=f"{why}: declare it with --device vulkan:{d.free}:profile=FILE, FILE being "
                                      f"what `vulkaninfo --json` writes for it")
        return replace(d, spec=_device_spec("vulkan", d.free, profile=profile, total=d.total))
    return replace(d, why_not=f"schedplan does not plan {d.backend} devices yet")


# --- Vulkan: the device's profile from vulkaninfo ---------------------------------------------------

def vulkaninfo_gpus() -> tuple[Optional[list[tuple[int, str, str]]], str]:
    """(index, deviceName, deviceType) of every physical device `vulkaninfo --summary` lists (in
    the loader's order, lavapipe included), or (None, why not)."""
    out, why = _run(["vulkaninfo", "--summary"])
    if out is None:
        return None, why
    gpus, index = [], None
    fields: dict[str, str] = {}
    for line in out.splitlines() + ["GPU-end:"]:
        m = re.match(r"^GPU(\d+|-end):\s*$", line)
        if m:
            if index is not None and "deviceName" in fields:
                gpus.append((index, fields["deviceName"], fields.get("deviceType", "")))
            index, fields = (int(m.group(1)) if m.group(1).isdigit() else None), {}
            continue
        m = re.match(r"^\s+(deviceName|deviceType)\s*=\s*(.*?)\s*$", line)
        if m and index is not None:
            fields[m.group(1)] = m.group(2)
    return gpus, ""


def vulkan_profile(device_name: str) -> tuple[Optional[str], str]:
    """The Vulkan profile `vulkaninfo --json=N` writes for the device of this name (the first such),
    kept under ~/.cache/schedplan/vulkan/ for the spec to name; or (None, why not)."""
    import hashlib
    import tempfile
    from .llama_cpp_run import cache_dir
    gpus, why = vulkaninfo_gpus()
    if gpus is None:
        return None, why
    index = next((i for i, name, _ in gpus if name == device_name), None)
    if index is None:
        return None, f"vulkaninfo lists no device named {device_name!r}"
    with tempfile.TemporaryDirectory(prefix="schedplan-vulkaninfo-") as tmp:
        try:
            proc = subprocess.run(["vulkaninfo", f"--json={index}"], cwd=tmp, capture_output=True, timeout=TOOL_TIMEOUT,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"vulkaninfo --json failed ({e})"
        written = sorted(Path(tmp).glob("*.json"))
        if proc.returncode != 0 or not written:
            return None, f"vulkaninfo --json={index} wrote no profile (exit {proc.returncode})"
        data = written[0].read_bytes()
    out = cache_dir() / "vulkan" / f"{re.sub(r'[^A-Za-z0-9.-]+', '_', device_name)}-{hashlib.sha256(data).hexdigest()[:12]}.json"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_name(out.name + f".{os.getpid()}.tmp")
        tmp_out.write_bytes(data)
        os.replace(tmp_out, out)
    return str(out), ""


def nvidia_compute_capability(cuda_index: int, name: str) -> Optional[str]:
    """The compute capability nvidia-smi reports for CUDA device cuda_index (the GPUs
    CUDA_VISIBLE_DEVICES leaves, in its order), when nvidia-smi names it as ggml does."""
    gpus, _ = nvidia_smi()
    visible, _ = cuda_visible(gpus or [], os.environ.get("CUDA_VISIBLE_DEVICES"))
    if cuda_index < len(visible) and visible[cuda_index].name == name.split(" (dev ")[0]:
        return visible[cuda_index].compute_cap
    return None


# --- 2. the vendors' tools ------------------------------------------------------------------------

@dataclass(frozen=True)
class NvidiaGPU:
    index: int
    name: str
    total: Optional[int]
    free: Optional[int]
    compute_cap: Optional[str]


NVIDIA_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free,compute_cap",
                "--format=csv,noheader,nounits"]


def _run(cmd: list[str]) -> tuple[Optional[str], str]:
    """(stdout, "") of a tool, or (None, why it did not answer)."""
    if shutil.which(cmd[0]) is None:
        return None, f"{cmd[0]} not found"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cmd[0]} failed ({e})"
    if proc.returncode != 0:
        said = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
        return None, f"{' '.join(cmd[:2])} failed (exit {proc.returncode}{': ' + said[0] if said else ''})"
    return proc.stdout, ""


def _mib(field_: str) -> Optional[int]:
    """A memory field in MiB; None for nvidia-smi's [N/A] or [Not Supported]."""
    return int(field_) * MiB if field_.isdigit() else None


def nvidia_smi() -> tuple[Optional[list[NvidiaGPU]], str]:
    """Every GPU nvidia-smi lists (in its order: by PCI bus), or (None, why not)."""
    out, why = _run(NVIDIA_QUERY)
    if out is None:
        return None, why
    gpus = []
    for line in out.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            return None, f"nvidia-smi answered a line that is not index, name, memory...: {line.strip()[:120]!r}"
        # a name holding commas: the fields after it are counted from the end
        name = ", ".join(parts[1:len(parts) - 3])
        total, free, cc = parts[-3:]
        gpus.append(NvidiaGPU(int(parts[0]), name, _mib(total), _mib(free), cc if re.fullmatch(r"\d+\.\d", cc) else None))
    return gpus, ""


def cuda_visible(gpus: list[NvidiaGPU], value: Optional[str]) -> tuple[list[NvidiaGPU], list[str]]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves, in its order, read up to the first entry that names no
    GPU (or one named before), as the CUDA runtime reads it. GPU-UUID entries are not read (the
    query has no uuid): a note says so."""
    if value is None:
        return gpus, []
    out, notes = [], []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            notes.append(f"CUDA_VISIBLE_DEVICES={value}: {entry!r} is a UUID, which schedplan does not match to "
                         f"nvidia-smi's GPUs: give indices, or declare the devices with --device")
            break
        match = [g for g in gpus if entry.isdigit() and g.index == int(entry)]
        if not match or match[0] in out:
            if entry:
                notes.append(f"CUDA_VISIBLE_DEVICES={value}: {entry!r} names no GPU (or one named before): CUDA "
                             f"ignores it and the entries after it")
            break
        out.append(match[0])
    return out, notes


def nvidia_devices(environ: dict[str, str]) -> tuple[list[LocalDevice], list[str], list[str]]:
    """(devices, notes, errors): a missing nvidia-smi is a note (no NVIDIA GPU), a failing one an
    error (there may be GPUs it could not list)."""
    gpus, why = nvidia_smi()
    if gpus is None:
        if why.endswith("not found"):
            return [], [f"{why}: no NVIDIA GPU listed (declare one with --device cuda:SIZE:cc=MAJOR.MINOR)"], []
        return [], [], [f"{why}: {DECLARE}"]
    visible, notes = cuda_visible(gpus, environ.get("CUDA_VISIBLE_DEVICES"))
    errors = [n for n in notes if "is a UUID" in n]
    notes = [n for n in notes if n not in errors]
    if len({(g.name, g.compute_cap) for g in visible}) > 1 and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        notes.append("these GPUs differ: nvidia-smi lists them by PCI bus, the CUDA runtime fastest first unless "
                     "CUDA_DEVICE_ORDER=PCI_BUS_ID (set it for llama.cpp too, or the CUDA0, CUDA1, ... order may differ)")
    out = []
    for i, g in enumerate(visible):
        name = f"CUDA{i}"
        if g.free is None or g.total is None:
            out.append(LocalDevice(name, g.name, "CUDA", None, None, integrated=True,
                                   why_not="nvidia-smi reports no memory of its own ([N/A]: unified memory): an "
                                           "integrated device, which schedplan does not plan"))
        elif g.compute_cap is None:
            out.append(LocalDevice(name, g.name, "CUDA", g.free, g.total,
                                   why_not=f"nvidia-smi did not report its compute capability: declare it with "
                                           f"--device cuda:{g.free}:cc=MAJOR.MINOR"))
        else:
            out.append(LocalDevice(name, g.name, "CUDA", g.free, g.total, _device_spec("cuda", g.free, cc=g.compute_cap)))
    return out, notes, errors


ROCM_NOT_PLANNED = "schedplan does not plan ROCm devices yet"
ROCM_SMI = ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"]
AMD_SMI = ["amd-smi", "metric", "--mem-usage", "--json"]


def rocm_devices(environ: dict[str, str]) -> tuple[list[LocalDevice], list[str], list[str]]:
    """rocm-smi's cards (card0, card1, ...), else amd-smi's GPUs; HIP_VISIBLE_DEVICES (indices)
    keeps those it names, in its order."""
    out, why = _run(ROCM_SMI)
    cards: list[tuple[str, Optional[int], Optional[int]]] = []
    notes: list[str] = []
    if out is not None:
        try:
            doc = json.loads(out)
            for key in sorted((k for k in doc if re.fullmatch(r"card\d+", k)), key=lambda k: int(k[4:])):
                c = doc[key]
                total, used = c.get("VRAM Total Memory (B)"), c.get("VRAM Total Used Memory (B)")
                known = str(total).isdigit() and str(used).isdigit()
                cards.append((c.get("Card Series") or c.get("Card series") or key,
                              int(total) - int(used) if known else None, int(total) if known else None))
        except (ValueError, AttributeError) as e:
            return [], [], [f"rocm-smi answered something that is not its JSON ({e}): {DECLARE}"]
    else:
        out2, why2 = _run(AMD_SMI)
        if out2 is None:
            missing = why.endswith("not found") and why2.endswith("not found")
            line = f"{why}, {why2}: no AMD GPU listed ({ROCM_NOT_PLANNED})"
            return ([], [line], []) if missing else ([], [], [f"{line}; {DECLARE}"])
        try:
            doc = json.loads(out2[out2.index("["):] if not out2.lstrip().startswith(("[", "{")) else out2)
            rows = doc["gpu_data"] if isinstance(doc, dict) else doc
            for row in rows:
                mem = row["mem_usage"]

                def value(k: str) -> Optional[int]:
                    v = mem.get(k)
                    v = v.get("value") if isinstance(v, dict) else v
                    return int(v) * MiB if str(v).isdigit() else None    # amd-smi's "MB" are MiB
                total, used, free = value("total_vram"), value("used_vram"), value("free_vram")
                if free is None and total is not None and used is not None:
                    free = total - used
                cards.append((f"AMD GPU {row['gpu']}", free, total))
        except (ValueError, KeyError, TypeError) as e:
            return [], [], [f"amd-smi answered something that is not its JSON ({e}): {DECLARE}"]
    visible = environ.get("HIP_VISIBLE_DEVICES")
    if visible is not None:
        order = [int(x) for x in visible.split(",") if x.strip().isdigit() and int(x) < len(cards)]
        cards = [cards[i] for i in order]
    return [LocalDevice(f"ROCm{i}", name, "ROCm", free, total, why_not=ROCM_NOT_PLANNED)
            for i, (name, free, total) in enumerate(cards)], notes, []


def sysctl(name: str) -> Optional[str]:
    out, _ = _run(["sysctl", "-n", name])
    return out.strip() if out is not None else None


def apple_devices() -> tuple[list[LocalDevice], list[str], list[str]]:
    """The Metal device of Apple silicon: its memory is the host's; llama.cpp's free memory is
    Metal's recommendedMaxWorkingSetSize, which `sysctl iogpu.wired_limit_mb` sets when it is not 0."""
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return [], [], []
    memsize = sysctl("hw.memsize")
    if memsize is None or not memsize.isdigit():
        return [], [], [f"sysctl hw.memsize did not answer: {DECLARE}"]
    name = sysctl("machdep.cpu.brand_string") or "Apple silicon"
    limit = sysctl("iogpu.wired_limit_mb")
    if limit and limit.isdigit() and int(limit) > 0:
        free = int(limit) * MiB
        return [LocalDevice("MTL0", name, "Metal", free, free, _device_spec("metal", free))], [], []
    return [LocalDevice("MTL0", name, "Metal", None, int(memsize),
                        why_not="Metal's working-set limit (recommendedMaxWorkingSetSize) is macOS's default, which "
                                "only Metal reports: install the run extra, set iogpu.wired_limit_mb, or declare it "
                                "with --device metal:SIZE")], [], []


def vulkan_devices(environ: dict[str, str]) -> tuple[list[LocalDevice], list[str], list[str]]:
    """The Vulkan devices vulkaninfo lists, as ggml-vulkan would name them (it leaves out CPU-type
    devices such as lavapipe unless GGML_VK_VISIBLE_DEVICES names them). Listed, not planned: their
    free memory is what ggml-vulkan reads through VK_EXT_memory_budget, which no tool prints."""
    gpus, why = vulkaninfo_gpus()
    if gpus is None:
        return [], ([] if why.endswith("not found") else [f"{why}: no Vulkan device listed"]), []
    visible = environ.get("GGML_VK_VISIBLE_DEVICES")
    if visible is not None:
        order = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        gpus = [g for i in order for g in gpus if g[0] == i]
    else:
        gpus = [g for g in gpus if g[2] != "PHYSICAL_DEVICE_TYPE_CPU"]
    return [LocalDevice(f"Vulkan{i}", name, "Vulkan", None, None, integrated=kind == "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU",
                        why_not="its free memory is what ggml-vulkan reads (VK_EXT_memory_budget): install the run "
                                "extra with a Vulkan build of llama.cpp, or declare it with --device vulkan:SIZE:"
                                "profile=FILE (vulkaninfo --json writes FILE)")
            for i, (_, name, kind) in enumerate(gpus)], [], []


def system_devices(environ: dict[str, str]) -> tuple[list[LocalDevice], list[str], list[str], list[str]]:
    """(devices, notes, errors, the tools that answered), in ggml's registry order: CUDA, then ROCm
    (both built from ggml-cuda, never together), then Metal, then Vulkan."""
    devices, notes, errors, sources = [], [], [], []
    nv = nvidia_devices(environ)
    for (found, found_notes, found_errors), tool in ((nv, "nvidia-smi"),
                                                     (([], [], []) if nv[0] else rocm_devices(environ), "rocm-smi/amd-smi"),
                                                     (apple_devices(), "sysctl"), (vulkan_devices(environ), "vulkaninfo")):
        devices += found
        notes += found_notes
        errors += found_errors
        if found:
            sources.append(tool)
    return devices, notes, errors, sources


# --- 3. the host ----------------------------------------------------------------------------------

def host_memory(meminfo: Path = Path("/proc/meminfo")) -> tuple[int, Optional[int]]:
    """(physical memory as ggml's CPU device reports it, available memory): the physical pages, and
    /proc/meminfo's MemAvailable where there is one."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 0
    try:
        return total, int(re.search(r"^MemAvailable:\s+(\d+) kB", meminfo.read_text(), re.MULTILINE).group(1)) * 1024
    except (OSError, AttributeError, ValueError):
        return total, None


def detect(environ: Optional[dict[str, str]] = None) -> Detection:
    environ = dict(os.environ) if environ is None else environ
    total, available = host_memory()
    found = ggml_devices()
    if found:
        return Detection(found, total, available, "ggml")
    devices, notes, errors, sources = system_devices(environ)
    if found is not None:
        notes.insert(0, "llama-cpp-python's ggml lists no GPU (a build without GPU backends): asked the vendors' tools")
    if not devices and not errors:
        notes.append(f"no GPU found: {DECLARE}")
    return Detection(devices, total, available, ", ".join(sources) or "none", notes, errors)
