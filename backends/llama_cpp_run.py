"""Ground truth: run a configuration in real llama.cpp (llama-cpp-python 0.3.36, commit 0c1e57098)
and report, byte for byte, what it reserved. The planner emits the same schema.

    run(model_path, params, tensors=False) -> dict    # "schedplan.reserve/1"

Where each number comes from (never from the 2-decimal MiB of the log lines alone):
- compute/model/KV bytes per buffer type: llama_get_memory_breakdown(ctx) (src/llama-ext.h, C++),
  read through a small C shim (memory_breakdown.cpp) compiled on first use. Its "context" part is
  llama_memory::memory_breakdown(), i.e. the KV cache only: the output buffer is not in it.
- output buffer: llama_context::output_reserve(n_seq_max) at construction asks the buffer type named
  by the log line "output buffer size = X MiB" for n_vocab * n_seq_max floats (logits only, and
  T5's forced embeddings: no backend samplers, C:2116-2207); what that buffer type makes of the request is
  measured by allocating one such buffer (Vulkan_Host adds 32 bytes) and checked against the line.
- graph nodes/splits, sched copies, effective n_ctx/n_batch/..., FA resolution, K/V types: parsed
  from llama.cpp's own log (sched_reserve, llama_context, llama_kv_cache), or read from the C API.
- tensors (tensors=True): one real decode of the reserve's pp ubatch with an eval callback that
  reads every ggml_tensor (buffer, data pointer) of the scheduler's split graphs.

Each run happens in a fresh child process by default (isolated=True): the ggml backend registry is
process-global (RPC servers registered once stay registered, device names count up: RPC0, RPC1,
...), an RPC server serves one client at a time (a connection left open would block the next
run), and a GGML_ABORT must not take the caller down.
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from ..planner import LLAMA_CPP_COMMIT
from ..planner.ggml import type_by_name
from ..planner.hparams import LLAMA_POOLING_TYPE_UNSPECIFIED, LLAMA_POOLING_TYPES
from ..planner.params import KV_TYPES, KvOverride, Params
from ..planner.kv_cache_msa import N_POS_PAD
from ..planner.reserve import MSA_ARCHS, NO_MEMORY_ARCHS, RESERVE_PP_ONE_SEQ_ARCHS
from ..planner.vocab import RERANK_NO_BOS, RERANK_NO_EOS_SEP_PROMPT
from .llama_cpp_lib import MISSING_MESSAGE, LlamaCppMissing, RunError, available, lib_dir  # noqa: F401 (this module's API)

SCHEMA = "schedplan.reserve/1"
MiB = 1024 * 1024

# include/llama.h
FLASH_ATTN_TYPES = {"auto": -1, "off": 0, "on": 1}
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}
POOLING_TYPES = {"unspecified": LLAMA_POOLING_TYPE_UNSPECIFIED, **LLAMA_POOLING_TYPES}   # enum llama_pooling_type
LLAMA_LOAD_MODE_NONE = 0          # include/llama.h llama_load_mode
# ggml-backend.h enum ggml_backend_buffer_usage
BUFFER_USAGES = {0: "any", 1: "weights", 2: "compute"}
GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_OP_ADD = 2                   # enum ggml_op (ggml.h): NONE, DUP, ADD


# --------------------------------------------------------------------------------------------
# libraries
# --------------------------------------------------------------------------------------------

def import_llama_cpp():
    try:
        import llama_cpp
    except (ImportError, OSError) as e:
        raise LlamaCppMissing(f"{MISSING_MESSAGE} (import llama_cpp failed: {e})") from None
    return llama_cpp


def load_lib(soname: str) -> ctypes.CDLL:
    """A ggml/llama library by its soname's path in llama_cpp/lib: the copy libllama already mapped
    (the unversioned libggml.so is a separate file: loading it maps a second backend registry)."""
    path = lib_dir() / soname
    if not path.exists():
        raise LlamaCppMissing(f"{MISSING_MESSAGE} ({path} is missing)")
    return ctypes.CDLL(str(path))


class GGMLTensor(ctypes.Structure):
    """struct ggml_tensor (ggml/include/ggml.h; sizeof 336 on 64-bit)."""
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


GGML_OBJECT_SIZE = 32   # struct ggml_object (ggml.c): offs, size, next, type, padding[4]


class TensorBuftOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override (include/llama.h)."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _fn(lib: ctypes.CDLL, name: str, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


class Ggml:
    """The ggml functions the instrument needs, from the libraries libllama uses."""

    def __init__(self) -> None:
        base, ggml = load_lib("libggml-base.so.0"), load_lib("libggml.so.0")
        vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        self.buft_name = _fn(base, "ggml_backend_buft_name", cp, vp)
        self.dev_name = _fn(base, "ggml_backend_dev_name", cp, vp)
        self.dev_type = _fn(base, "ggml_backend_dev_type", ctypes.c_int, vp)
        self.dev_buffer_type = _fn(base, "ggml_backend_dev_buffer_type", vp, vp)
        self.buffer_name = _fn(base, "ggml_backend_buffer_name", cp, vp)
        self.buffer_get_base = _fn(base, "ggml_backend_buffer_get_base", vp, vp)
        self.buffer_get_size = _fn(base, "ggml_backend_buffer_get_size", sz, vp)
        self.buffer_get_usage = _fn(base, "ggml_backend_buffer_get_usage", ctypes.c_int, vp)
        self.buffer_get_alignment = _fn(base, "ggml_backend_buffer_get_alignment", sz, vp)
        self.nbytes = _fn(base, "ggml_nbytes", sz, vp)
        self.type_name = _fn(base, "ggml_type_name", cp, ctypes.c_int)
        self.op_name = _fn(base, "ggml_op_name", cp, ctypes.c_int)
        self.tensor_overhead = _fn(base, "ggml_tensor_overhead", sz)
        self.reg_get_proc_address = _fn(base, "ggml_backend_reg_get_proc_address", vp, vp, cp)
        self.reg_by_name = _fn(ggml, "ggml_backend_reg_by_name", vp, cp)
        self.register = _fn(ggml, "ggml_backend_register", None, vp)
        self.dev_count = _fn(ggml, "ggml_backend_dev_count", sz)
        self.dev_get = _fn(ggml, "ggml_backend_dev_get", vp, sz)
        self.dev_by_name = _fn(ggml, "ggml_backend_dev_by_name", vp, cp)
        self.dev_by_type = _fn(ggml, "ggml_backend_dev_by_type", vp, ctypes.c_int)
        self.dev_backend_reg = _fn(base, "ggml_backend_dev_backend_reg", vp, vp)
        self.dev_host_buffer_type = _fn(base, "ggml_backend_dev_host_buffer_type", vp, vp)
        self.buft_alloc_buffer = _fn(base, "ggml_backend_buft_alloc_buffer", vp, vp, sz)
        self.buffer_free = _fn(base, "ggml_backend_buffer_free", None, vp)
        self.reg_name = _fn(base, "ggml_backend_reg_name", cp, vp)
        if self.tensor_overhead() != GGML_OBJECT_SIZE + ctypes.sizeof(GGMLTensor):
            raise RunError(f"struct ggml_tensor layout mismatch: ggml_tensor_overhead() = {self.tensor_overhead()}, "
                           f"expected {GGML_OBJECT_SIZE + ctypes.sizeof(GGMLTensor)}")

    def devices(self) -> list[int]:
        return [self.dev_get(i) for i in range(self.dev_count())]

    def allocated_size(self, buft_name: str, size: int) -> int:
        """ggml_backend_buffer_get_size of a buffer of `size` bytes from the buffer type named so (one of
        the devices' default or host buffer types), allocated and freed: what the buffer type makes of a
        request (Vulkan_Host allocates 32 bytes more, ggml-vulkan.cpp:13080)."""
        for dev in self.devices():
            for buft in (self.dev_buffer_type(dev), self.dev_host_buffer_type(dev)):
                if buft and self.buft_name(buft).decode() == buft_name:
                    buf = self.buft_alloc_buffer(buft, size)
                    if not buf:
                        raise RunError(f"could not allocate {size} bytes of {buft_name} to measure it")
                    try:
                        return self.buffer_get_size(buf)
                    finally:
                        self.buffer_free(buf)
        raise RunError(f"no buffer type {buft_name!r} among this llama.cpp's devices")


# --------------------------------------------------------------------------------------------
# the C++ shim (llama_get_memory_breakdown and friends)
# --------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "schedplan"


def build_shim() -> Path:
    """Compile memory_breakdown.cpp against the installed libllama.so.0 (once per source/library)."""
    src = Path(__file__).with_name("memory_breakdown.cpp")
    libdir = lib_dir()
    libllama = libdir / "libllama.so.0"
    st = libllama.stat()
    key = hashlib.sha256(src.read_bytes() + f"{libllama}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    return compile_shared(src, f"libsp_memory_breakdown-{key}.so", cxx, ["-std=c++17"],
                          [f"-L{libdir}", "-l:libllama.so.0", f"-Wl,-rpath,{libdir}"], "the memory-breakdown shim")


def compile_shared(src: Path, name: str, compiler: Optional[str], flags: list[str], libs: list[str], what: str) -> Path:
    """src compiled once into a shared library in the cache (written under a temporary name, then
    moved: concurrent first uses never load a half-written file)."""
    out = cache_dir() / name
    if out.exists():
        return out
    if not compiler:
        raise RunError(f"a compiler is needed once to build {what}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    proc = subprocess.run([compiler, *flags, "-O2", "-shared", "-fPIC", str(src), "-o", str(tmp), *libs],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RunError(f"building {what} failed: {proc.stderr.strip().splitlines()[-1:]}")
    os.replace(tmp, out)
    return out


class Shim:
    def __init__(self) -> None:
        lib = ctypes.CDLL(str(build_shim()))
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        self.memory_breakdown = _fn(lib, "sp_memory_breakdown", ctypes.c_int, vp, ctypes.c_int,
                                    ctypes.POINTER(vp), ctypes.POINTER(sz), ctypes.POINTER(sz), ctypes.POINTER(sz))
        self.model_devices = _fn(lib, "sp_model_devices", ctypes.c_int, vp, ctypes.c_int, ctypes.POINTER(vp))
        self.model_n_gpu_layers = _fn(lib, "sp_model_n_gpu_layers", ctypes.c_uint32, vp)
        self.lora_buffers_fn = _fn(lib, "sp_lora_buffers", ctypes.c_int, vp, ctypes.c_int, ctypes.POINTER(vp),
                                   ctypes.POINTER(sz), ctypes.POINTER(ctypes.c_float))

    def lora_buffers(self, adapter) -> tuple[list[int], int, float]:
        """(the adapter's buffers, its number of lora_a/lora_b pairs, alpha) from llama_adapter_lora."""
        cap = 64
        bufs, n_pairs, alpha = (ctypes.c_void_p * cap)(), ctypes.c_size_t(), ctypes.c_float()
        n = self.lora_buffers_fn(adapter, cap, bufs, ctypes.byref(n_pairs), ctypes.byref(alpha))
        if n > cap:
            raise RunError(f"more than {cap} buffers in a LoRA adapter")
        return [bufs[i] for i in range(n)], n_pairs.value, alpha.value

    def breakdown(self, ctx) -> list[tuple[int, int, int, int]]:
        """[(buft, model, context, compute)] from llama_get_memory_breakdown."""
        cap = 64
        bufts, m, c, k = (ctypes.c_void_p * cap)(), (ctypes.c_size_t * cap)(), (ctypes.c_size_t * cap)(), \
            (ctypes.c_size_t * cap)()
        n = self.memory_breakdown(ctx, cap, bufts, m, c, k)
        if n > cap:
            raise RunError(f"more than {cap} buffer types in the memory breakdown")
        return [(bufts[i], m[i], c[i], k[i]) for i in range(n)]

    def devices(self, model) -> list[int]:
        cap = 64
        devs = (ctypes.c_void_p * cap)()
        n = self.model_devices(model, cap, devs)
        return [devs[i] for i in range(min(n, cap))]


# --------------------------------------------------------------------------------------------
# the log
# --------------------------------------------------------------------------------------------

class LogCapture:
    """llama_log_set (which also sets ggml's): keeps every message, in order."""

    def __init__(self, llama_cpp) -> None:
        self.parts: list[str] = []

        def callback(level, text, user_data):
            if text:
                self.parts.append(text.decode("utf-8", errors="replace"))

        self._callback = llama_cpp.llama_log_callback(callback)   # keep alive: llama.cpp holds the pointer
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def errors(self) -> str:
        """What llama.cpp said on failing: the refusal of llama_init_from_model or of the model's
        load where it logged one, else the last lines that read like an error."""
        lines = [ln.strip() for ln in self.text.splitlines() if ln.strip()]
        why = [ln for ln in lines if ln.startswith(("llama_init_from_model:", "llama_model_load:"))]
        bad = why or [ln for ln in lines if re.search(r"error|failed|invalid|unknown|not supported|cannot", ln, re.I)]
        return " | ".join((bad or lines)[-3:])


_CTX_RE = re.compile(r"^llama_context: (n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch|n_outputs_max|kv_unified|"
                     r"flash_attn)\s+= (\S+)", re.M)
_GRAPH_RE = re.compile(r"sched_reserve: graph: nodes = (\d+), splits = (\d+)")
_GRAPH2_RE = re.compile(r"sched_reserve: graph \(pp bs=(\d+), tg bs=(\d+)\): nodes = (\d+) / (\d+), "
                        r"splits = (\d+) / (\d+)")
_COPIES_RE = re.compile(r"sched_reserve: reserve took .* sched copies = (\d+)")
_FA_RE = re.compile(r"resolve_fused_ops: Flash Attention (enabled|not supported, set to disabled)")
_CTX_WARN_RE = re.compile(r"llama_context: (n_ctx_seq \(\d+\) > n_ctx_train \(\d+\) -- possible training context overflow)")
_COMPUTE_RE = re.compile(r"^sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB", re.M)
_OUTPUT_RE = re.compile(r"^llama_context:\s+(\S+)  output buffer size =\s+([\d.]+) MiB", re.M)
_MODEL_RE = re.compile(r"^load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB", re.M)
# the context's memory: KV cache buffers and recurrent state (RS) buffers, both in llama_memory's breakdown
_KV_RE = re.compile(r"^(?:llama_kv_cache:\s+(\S+) KV|llama_memory_recurrent:\s+(\S+) RS|"
                    r"llama_dsv4_comp_state:\s+(\S+) DSV4 \w+ state) buffer size =\s+([\d.]+) MiB", re.M)
# the context's memory tensors: KV and recurrent caches, DeepSeek-V4's compressor states
_CACHE_TENSOR_RE = re.compile(r"cache_|dsv4_\w+_state_(kv|score)_l\d")
_KV_TYPES_RE = re.compile(r"^llama_kv_cache: size = .*, K \((\w+)\):.*, V \((\w+)\):", re.M)


def parse_log(text: str) -> dict:
    """What llama.cpp says about the reservation, from its log (src/llama-context.cpp)."""
    out: dict = {"context": {k: v for k, v in _CTX_RE.findall(text)}}
    m = _GRAPH2_RE.search(text)
    if m:
        bs_pp, bs_tg, n_pp, n_tg, s_pp, s_tg = map(int, m.groups())
        out["graphs"] = {"pp": {"bs": bs_pp, "nodes": n_pp, "splits": s_pp},
                         "tg": {"bs": bs_tg, "nodes": n_tg, "splits": s_tg}}
    else:
        m = _GRAPH_RE.search(text)
        if m:
            n, s = map(int, m.groups())
            out["graphs"] = {"pp": {"nodes": n, "splits": s}, "tg": {"nodes": n, "splits": s}}
    m = _COPIES_RE.search(text)
    out["sched_copies"] = int(m.group(1)) if m else None
    m = _FA_RE.search(text)
    out["fa_probe"] = None if not m else m.group(1) == "enabled"
    for key, rx in (("compute", _COMPUTE_RE), ("output", _OUTPUT_RE), ("model", _MODEL_RE)):
        out[key] = [(name, mib) for name, mib in rx.findall(text)]
    out["kv"] = [(kv_name or rs_name or state_name, mib) for kv_name, rs_name, state_name, mib in _KV_RE.findall(text)]
    m = _KV_TYPES_RE.search(text)
    out["kv_types"] = m.groups() if m else None
    return out


def mib2(n: int) -> str:
    """Bytes as llama.cpp logs them: %.2f MiB."""
    return f"{n / MiB:.2f}"


def _log_agrees(logged: list[tuple[str, str]], exact: dict[str, int]) -> bool:
    """Every logged "<buft> ... = X MiB" line matches the exact bytes of that buffer type (summed
    over lines with the same name, e.g. two model buffers of one type)."""
    sums: dict[str, float] = {}
    for name, mib in logged:
        sums[name] = sums.get(name, 0.0) + float(mib)
    if set(sums) != {k for k, v in exact.items() if v > 0}:
        return False
    return all(abs(sums[k] - exact[k] / MiB) <= 0.005 * max(1, sum(1 for n, _ in logged if n == k)) + 1e-9
               for k in sums)


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------

def run(model_path: str, params: Params, tensors: bool = False, *, keep_log: bool = False,
        log_path: Optional[str] = None, isolated: bool = True, timeout: Optional[float] = None,
        no_alloc: bool = False, draft: Optional[tuple[str, Params]] = None) -> dict:
    """Create the real llama.cpp model and context for these params and report what was reserved.

    keep_log: include llama.cpp's whole log under "log"; log_path: also write it to that file.
    no_alloc: load as common/fit.cpp measures (no_alloc, load_mode NONE): nothing is allocated and
    the breakdown holds the sizes --fit works with.
    isolated: run in a fresh child process (see the module docstring); False runs here.
    draft: (path, params) of a draft model, then loaded and given a context as llama-server's
    common_speculative_init_result does: at the model context's n_ctx, with ctx_other = that context
    (reported under "draft").
    """
    path = Path(model_path)
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(model_path))
    if path.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(model_path))
    if not available():
        raise LlamaCppMissing()
    if not isolated:
        return _run_here(str(model_path), params, tensors, keep_log, log_path, no_alloc, draft)
    with tempfile.TemporaryDirectory(prefix="schedplan-run-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(json.dumps({"model_path": str(model_path), "params": dataclasses.asdict(params),
                                       "tensors": tensors, "keep_log": keep_log, "log_path": log_path,
                                       "no_alloc": no_alloc,
                                       "draft": [draft[0], dataclasses.asdict(draft[1])] if draft else None}))
        env = dict(os.environ, GGML_NO_BACKTRACE="1")   # an abort prints its message, not a gdb session
        n_vulkan = sum(1 for name in local_device_names(params.devices) if name.startswith("Vulkan"))
        if n_vulkan and "GGML_VK_VISIBLE_DEVICES" not in env:
            # ggml-vulkan hides CPU-type devices (lavapipe) unless this names them
            env["GGML_VK_VISIBLE_DEVICES"] = ",".join(map(str, range(n_vulkan)))
        try:
            proc = subprocess.run([sys.executable, "-m", "schedplan.backends.llama_cpp_run", str(request), str(result)],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                                  timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise RunError(f"llama.cpp did not finish within {timeout:g} s") from None
        data = json.loads(result.read_text()) if result.exists() else None
    if data is not None and "error" in data:
        if data.get("unsupported"):
            raise NotImplementedError(data["error"])
        cls = LlamaCppMissing if data.get("missing") else RunError
        raise cls(data["error"])
    if proc.returncode != 0 or data is None:
        if "unexpected graph reallocation" in proc.stderr:
            raise RunError("the decode re-planned the compute buffers instead of reusing the reserve's allocation "
                           "(GGML_SCHED_DEBUG_REALLOC caught it): its tensor offsets would not be the reserve's")
        raise RunError(f"llama.cpp exited with status {proc.returncode}: {_crash_message(proc.stderr)}")
    return data


def _crash_message(stderr: str) -> str:
    """The ggml_abort line ("file.cpp:123: message") or a Python traceback's last line, else the tail."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    aborts = [ln for ln in lines if re.search(r"\.(c|cc|cpp|h):\d+: ", ln)]
    if aborts:
        return aborts[-1]
    return " | ".join(lines[-3:]) or "no message"


def params_from_dict(d: dict) -> Params:
    d = dict(d)
    for key in ("tensor_split", "rpc", "devices"):
        d[key] = tuple(d.get(key) or ())
    d["tensor_overrides"] = tuple(tuple(x) for x in d.get("tensor_overrides") or ())
    d["rpc_memory"] = tuple(tuple(x) if x else None for x in d.get("rpc_memory") or ())
    d["kv_overrides"] = tuple(KvOverride(**x) for x in d.get("kv_overrides") or ())
    d["lora"] = tuple((path, scale) for path, scale in d.get("lora") or ())
    d["control_vectors"] = tuple((path, scale) for path, scale in d.get("control_vectors") or ())
    return Params(**d)


_registered_rpc: dict[str, int] = {}   # endpoint -> reg, per process (the registry is process-global)


def register_rpc_servers(ggml: Ggml, endpoints: tuple[str, ...]) -> None:
    """common/arg.cpp add_rpc_devices: RPC reg -> ggml_backend_rpc_add_server(endpoint) -> register."""
    stale = set(_registered_rpc) - set(endpoints)
    if stale:
        raise RunError(f"RPC servers {', '.join(sorted(stale))} stay registered in this process from an earlier "
                       f"in-process run and would be used as devices: run with isolated=True")
    if not endpoints:
        return
    reg = ggml.reg_by_name(b"RPC")
    if not reg:
        raise RunError("this llama-cpp-python has no RPC backend: reinstall it with CMAKE_ARGS=\"-DGGML_RPC=ON\"")
    addr = ggml.reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not addr:
        raise RunError("the RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(addr)
    for endpoint in endpoints:
        if endpoint in _registered_rpc:
            continue
        _check_reachable(endpoint)       # an unreachable server makes ggml-rpc abort the process
        server_reg = add_server(endpoint.encode())
        if not server_reg:
            raise RunError(f"RPC server {endpoint} did not answer (is `python -m schedplan.backends.rpc_server` "
                           f"running there?)")
        ggml.register(server_reg)
        _registered_rpc[endpoint] = server_reg


def _check_reachable(endpoint: str) -> None:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise RunError(f"RPC endpoint {endpoint!r} is not HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise RunError(f"RPC server {endpoint} is not reachable ({e.strerror or e}): start one with "
                       f"`python -m schedplan.backends.rpc_server --port {port}`") from None


# the ggml device names of the --device kinds (ggml-cuda, ggml-metal, ggml-vulkan)
DEVICE_NAMES = {"cuda": "CUDA", "metal": "MTL", "vulkan": "Vulkan"}


def local_device_names(specs: tuple[str, ...]) -> list[str]:
    """The real devices that stand for the simulated --device specs: the i-th spec of a kind is
    that backend's device i (vulkan:... -> Vulkan0, Vulkan1, ...), in the planner's order."""
    seen: dict[str, int] = {}
    names = []
    for spec in specs:
        kind = spec.partition(":")[0].lower()
        names.append(f"{DEVICE_NAMES[kind]}{seen.get(kind, 0)}")
        seen[kind] = seen.get(kind, 0) + 1
    return names


def _device_list(ggml: Ggml, specs: tuple[str, ...]):
    """The model's devices as a NULL-terminated list (llama_model_params.devices): the RPC servers,
    then the real devices standing for the --device specs. Explicit, so that a GPU this llama.cpp
    happens to see is used only when the plan has it (NULL would take every GPU)."""
    rpc = [d for d in ggml.devices() if ggml.reg_name(ggml.dev_backend_reg(d)) == b"RPC"]
    devs = []
    for name in local_device_names(specs):
        dev = ggml.dev_by_name(name.encode())
        if not dev:
            real = [ggml.dev_name(d).decode() for d in ggml.devices()
                    if ggml.dev_type(d) != GGML_BACKEND_DEVICE_TYPE_CPU]
            raise RunError(f"no device {name} in this llama.cpp to run the --device spec on (devices here: "
                           f"{', '.join(real) or 'none'}; a CPU-type Vulkan device such as lavapipe needs "
                           f"GGML_VK_VISIBLE_DEVICES)")
        devs.append(dev)
    devs = rpc + devs
    return (ctypes.c_void_p * (len(devs) + 1))(*devs, None)


def _buft_overrides(ggml: Ggml, overrides: tuple[tuple[str, str], ...]):
    """-ot: common/arg.cpp parse_tensor_buffer_overrides: buffer types by the devices' default
    buffer type names; the patterns go to llama.cpp unchanged (std::regex_search there)."""
    bufts = {}
    for dev in ggml.devices():
        buft = ggml.dev_buffer_type(dev)
        if buft:
            bufts[ggml.buft_name(buft).decode()] = buft
    items = []
    for pattern, name in overrides:
        if name not in bufts:
            raise NotImplementedError(f"-ot {pattern}={name}: no buffer type {name!r} in this llama.cpp "
                                      f"(available: {', '.join(sorted(bufts))})")
        items.append(TensorBuftOverride(pattern.encode(), bufts[name]))
    items.append(TensorBuftOverride(None, None))
    return (TensorBuftOverride * len(items))(*items)


def _kv_overrides(llama_cpp, overrides: tuple[KvOverride, ...]):
    """--override-kv as common/arg.cpp hands it to llama.cpp (common_model_params_to_llama): the
    llama_model_kv_override structs in order, then one with an empty key that ends the list."""
    tags = {"int": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, "float": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT,
            "bool": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL, "str": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR}
    items = (llama_cpp.llama_model_kv_override * (len(overrides) + 1))()
    for item, o in zip(items, overrides):
        item.tag = tags[o.tag]
        item.key = o.key.encode(errors="surrogateescape")
        if o.tag == "int":
            item.value.val_i64 = o.value
        elif o.tag == "float":
            item.value.val_f64 = o.value
        elif o.tag == "bool":
            item.value.val_bool = o.value
        else:
            item.value.val_str = o.value.encode(errors="surrogateescape")
    return items


def _run_here(model_path: str, params: Params, tensors: bool, keep_log: bool, log_path: Optional[str],
              no_alloc: bool = False, draft: Optional[tuple[str, Params]] = None) -> dict:
    llama_cpp = import_llama_cpp()
    log = LogCapture(llama_cpp)
    llama_cpp.llama_backend_init()
    ggml = Ggml()
    shim = Shim()
    keep = []   # ctypes objects referenced by the params structs: alive until the model is loaded

    try:
        register_rpc_servers(ggml, params.rpc)
        model = _load_model(llama_cpp, ggml, log, model_path, params, keep, no_alloc)
        adapters = _load_loras(llama_cpp, log, model, params)
        cp = _context_params(llama_cpp, params)

        recorder = TensorRecorder(ggml) if tensors else None
        # the control vectors' buffers: seen from the graph (llama_adapter_cvec keeps them to itself)
        probe = CvecProbe(ggml, recorder) if params.control_vectors else None
        if recorder is not None or probe is not None:
            cp.cb_eval = probe.callback if probe is not None else recorder.callback
            cp.cb_eval_user_data = None

        ctx = llama_cpp.llama_init_from_model(model, cp)
        if not ctx:
            raise RunError(f"llama.cpp could not create the context: {log.errors()}")

        result = _collect(llama_cpp, ggml, shim, log.text, model_path, model, ctx, params)
        warnings = _override_warnings(log.text) + _CTX_WARN_RE.findall(log.text) + _rerank_warnings(llama_cpp, model, ctx)
        if warnings:
            result["warnings"] = warnings
        # the tensors are read from the first decode after the adapters are applied (the one that
        # reserves again): a decode before it would move the pipeline-parallel copy index on
        replay = recorder is not None and not _unreplayable(result)
        reserved_again = False
        if adapters or params.control_vectors:
            reserved_again = _apply_adapters(llama_cpp, ggml, shim, log, model, ctx, params, adapters, probe,
                                             result, replay)

        if recorder is not None:
            reason = _unreplayable(result)
            if reason:
                result["tensors_unmeasurable"] = reason
            else:
                if not reserved_again:
                    _decode_reserve_ubatch(llama_cpp, ctx, result)
                result["tensors"] = recorder.rows
                _tensor_checks(ggml, shim, ctx, recorder, result)
                if not result["checks"]["decode_same_node_count"]:
                    # e.g. GLM5-Next: a reserve ubatch of at most 16 tokens gathers the indexer's selection
                    # over a full cache, its decode into an empty one masks the cache instead
                    del result["tensors"]
                    result["tensors_unmeasurable"] = (
                        f"the decode of the pp ubatch built a graph of {recorder.n_nodes} nodes, the reserve "
                        f"{result['graphs']['pp']['nodes']}: the allocator re-planned it, so its tensor offsets "
                        f"are not the reservation's")

        if draft is not None:
            result["draft"] = _run_draft(llama_cpp, ggml, shim, log, draft, ctx, keep)

        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    finally:
        if log_path:
            Path(log_path).write_text(log.text)
    if keep_log:
        result["log"] = log.text
    return result


def _load_loras(llama_cpp, log: LogCapture, model, params: Params) -> list:
    """common_init_result: each --lora/--lora-scaled adapter loaded after the model
    (llama_adapter_lora_init), before the context; llama-server stops at the first it cannot load."""
    adapters = []
    for path, scale in params.lora:
        adapter = llama_cpp.llama_adapter_lora_init(model, str(path).encode())
        if not adapter:
            why = [ln.strip() for ln in log.text.splitlines() if "failed to apply lora adapter" in ln or
                   "failed to open" in ln]
            raise RunError(f"llama.cpp could not load the LoRA adapter {path}: {' | '.join(why[-1:]) or log.errors()}")
        adapters.append((adapter, path, scale))
    return adapters


_LORA_RE = re.compile(r"llama_adapter_lora_init_impl:\s+(\S+) LoRA buffer size =\s+([\d.]+) MiB")


def _apply_adapters(llama_cpp, ggml: Ggml, shim: Shim, log: LogCapture, model, ctx, params: Params, adapters: list,
                    probe: Optional["CvecProbe"], result: dict, replay: bool) -> bool:
    """common_init_from_params after the context: the control vectors (common_control_vector_load,
    llama_set_adapter_cvec; where they cannot be applied it returns early: no LoRA applied, no
    warm-up), then common_set_adapter_lora (unless --lora-init-without-apply, or where a context
    pooling by rank cannot rerank: it returned after the warnings), then the warm-up decode (BOS and
    EOS, as common_init_from_params' warm-up; with replay, the reserve's pp ubatch whose tensors are
    read instead), which reserves the graphs again (sched_need_reserve: a new scheduler). The result's
    compute buffers and graphs become that reservation's (llama_get_memory_breakdown and the second
    sched_reserve's log lines); the adapters' buffers are read from llama_adapter_lora::bufs (the
    shim) and checked against their "LoRA buffer size" log lines; the control vectors' from the
    tensors the graph adds to each layer's output (CvecProbe). Returns whether a decode ran.
    Sections "lora" and "control_vector" of the result."""
    before = dict(result["compute_buffers"])
    if adapters:
        out_adapters, total = [], {}
        for adapter, path, scale in adapters:
            bufs, n_pairs, alpha = shim.lora_buffers(adapter)
            sizes: dict[str, int] = {}
            for buf in bufs:
                name = ggml.buffer_name(buf).decode()
                sizes[name] = sizes.get(name, 0) + ggml.buffer_get_size(buf)
                total[name] = total.get(name, 0) + ggml.buffer_get_size(buf)
            out_adapters.append({"path": path, "scale": scale, "alpha": alpha, "n_tensors": 2 * n_pairs,
                                 "buffers": sizes})
        result["checks"]["lora_log_agrees"] = _log_agrees(_LORA_RE.findall(log.text), total)
        result["lora"] = {"adapters": out_adapters, "buffers": total, "applied": False,
                          "compute_buffers_before": before}
    cvec_applied = False
    if params.control_vectors:
        n_layer = llama_cpp.llama_model_n_layer(model)
        start = params.control_vector_layer_start if params.control_vector_layer_start > 0 else 1
        end = params.control_vector_layer_end if params.control_vector_layer_end > 0 else n_layer
        loaded = _control_vector_load(params.control_vectors)
        if loaded is not None:
            n_embd, data = loaded
            arr = (ctypes.c_float * len(data))(*data)
            cvec_applied = llama_cpp.llama_set_adapter_cvec(ctx, arr, len(data), n_embd, start, end) == 0
        result["control_vector"] = {"files": [{"path": p, "scale": sc} for p, sc in params.control_vectors],
                                    "applied": cvec_applied, "layer_range": [start, end] if cvec_applied else None,
                                    "buffers": {}, "compute_buffers_before": before}
        if not cvec_applied:
            return False     # common_init_from_params returns: no LoRA applied, no warm-up
    # common_init_from_params returns after the rerank warnings (the others: the loader's, llama_context's)
    can_rerank = not set(result.get("warnings", ())) & {RERANK_NO_BOS, RERANK_NO_EOS_SEP_PROMPT}
    lora_applied = (bool(adapters) and not params.lora_init_without_apply and can_rerank
                    and any(s != 0.0 for *_, s in adapters))
    if lora_applied:
        n = len(adapters)
        arr = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*[a for a, _, _ in adapters])
        scales = (ctypes.c_float * n)(*[s for *_, s in adapters])
        llama_cpp.llama_set_adapters_lora(ctx, arr, n, scales)
        result["lora"]["applied"] = True
    if not (lora_applied or cvec_applied):
        return False
    start_log = len(log.parts)
    if replay:
        _decode_reserve_ubatch(llama_cpp, ctx, result)
    else:
        _warm_up(llama_cpp, model, ctx)
    parsed = parse_log("".join(log.parts[start_log:]))
    if "graphs" not in parsed:
        raise RunError("no second sched_reserve in llama.cpp's log after applying the adapters")
    compute: dict[str, int] = {}
    for buft, _, _, k in shim.breakdown(ctx):
        if k > 1:
            name = ggml.buft_name(buft).decode()
            compute[name] = compute.get(name, 0) + k
    result["compute_buffers"] = {k: compute[k] for k in result["compute_buffers"] if k in compute}
    result["compute_buffers"].update({k: v for k, v in compute.items() if k not in result["compute_buffers"]})
    for name in ("pp", "tg"):
        result["graphs"][name]["nodes"] = parsed["graphs"][name]["nodes"]
        result["graphs"][name]["splits"] = parsed["graphs"][name]["splits"]
    result["checks"]["compute_log_agrees"] = _log_agrees(parsed["compute"], compute)
    if cvec_applied:
        # measured where the buffers seen hold every layer's tensor: the graphs add only the range's,
        # and a layer's add run on another backend (a CPU layer's offloaded to a GPU for a batch of
        # 32 tokens or more, the last CPU layer's before a GPU output layer) reads a copy of it
        if probe.n_slots(llama_cpp.llama_model_n_embd(model)) == n_layer - 1:
            result["control_vector"]["buffers"] = probe.sizes()
        else:
            del result["control_vector"]["buffers"]
    return True


def _warm_up(llama_cpp, model, ctx) -> None:
    """common_init_from_params' warm-up (common/common.cpp): BOS and EOS encoded first where the model
    has an encoder (a decode before any encode aborts: llama_encode must be called first), then the
    decoder start token (else BOS) or those tokens decoded."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    bos = llama_cpp.llama_vocab_bos(vocab)
    tokens = [t for t in (bos, llama_cpp.llama_vocab_eos(vocab)) if t != llama_cpp.LLAMA_TOKEN_NULL] or [0]

    def run(process, name: str) -> None:
        toks = (llama_cpp.llama_token * len(tokens))(*tokens)
        rc = process(ctx, llama_cpp.llama_batch_get_one(toks, len(tokens)))
        if rc != 0:
            raise RunError(f"the warm-up {name} with the adapters returned {rc}")

    if llama_cpp.llama_model_has_encoder(model):
        run(llama_cpp.llama_encode, "encode")
        start = llama_cpp.llama_model_decoder_start_token(model)
        tokens = [start if start != llama_cpp.LLAMA_TOKEN_NULL else bos]
    if llama_cpp.llama_model_has_decoder(model):
        run(llama_cpp.llama_decode, "decode")
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)


def _control_vector_load(infos: tuple[tuple[str, float], ...]) -> Optional[tuple[int, list[float]]]:
    """common/common.cpp common_control_vector_load, with gguf-py: each file's direction.N tensors
    scaled and summed per layer (layer N at [n_embd * (N - 1)]), the files summed; None where
    llama.cpp finds them invalid (the plan's planner/adapter.py says why)."""
    import numpy as np
    from gguf import GGUFReader

    n_embd, data = -1, np.zeros(0, dtype=np.float32)
    for path, strength in infos:
        try:
            reader = GGUFReader(path)
        except (OSError, ValueError):
            return None
        cur_embd, cur = -1, np.zeros(0, dtype=np.float32)
        for t in reader.tensors:
            head, dot, rest = t.name.partition(".")
            m = re.match(r"[ \t\n\v\f\r]*[+-]?[0-9]+", rest) if dot and head == "direction" else None
            layer_idx = int(m.group(0)) if m else -1
            values = np.asarray(t.data, dtype=np.float32).reshape(-1)
            if layer_idx <= 0 or t.tensor_type != 0 or any(d != 1 for d in list(t.shape)[1:]) \
                    or (cur_embd != -1 and values.size != cur_embd):
                return None
            cur_embd = values.size
            if cur.size < cur_embd * layer_idx:
                cur = np.concatenate([cur, np.zeros(cur_embd * layer_idx - cur.size, dtype=np.float32)])
            cur[cur_embd * (layer_idx - 1):cur_embd * layer_idx] += values * strength
        if cur_embd == -1 or (n_embd != -1 and cur_embd != n_embd):
            return None
        n_embd = cur_embd
        if data.size < cur.size:
            data = np.concatenate([data, np.zeros(cur.size - data.size, dtype=np.float32)])
        data[:cur.size] += cur
    return n_embd, data.tolist()


class CvecProbe:
    """cb_eval: when the scheduler asks about a layer's output (an ADD named l_out-N whose second
    source is an unnamed leaf with a buffer: llama_adapter_cvec's tensor for that layer), notes
    that tensor's buffer; the recorder, when there is one, sees every call too."""

    def __init__(self, ggml: Ggml, recorder: Optional["TensorRecorder"]) -> None:
        import llama_cpp
        self.ggml = ggml
        self.bufs: dict[int, tuple[str, int]] = {}
        inner = recorder.callback if recorder is not None else None

        def cb(t, ask, user_data):
            if ask:
                try:
                    self.look(t)
                except BaseException:     # never raise through C
                    pass
            return inner(t, ask, user_data) if inner is not None else False

        self.callback = llama_cpp.ggml_backend_sched_eval_callback(cb)

    def look(self, addr: int) -> None:
        t = GGMLTensor.from_address(addr)
        if t.op != GGML_OP_ADD or not t.name.startswith(b"l_out-") or not t.src[1]:
            return
        layer_dir = GGMLTensor.from_address(t.src[1])
        # unnamed: ggml_build_forward_expand names it leaf_<i>
        if layer_dir.op == 0 and re.fullmatch(rb"(leaf_\d+)?", layer_dir.name) and layer_dir.buffer:
            buf = layer_dir.buffer
            self.bufs[buf] = (self.ggml.buffer_name(buf).decode(), self.ggml.buffer_get_size(buf))

    def n_slots(self, n_embd: int) -> int:
        """How many n_embd f32 tensors the buffers seen hold (each padded to its buffer's alignment;
        a buffer's few extra bytes, Vulkan_Host's 32, hold none): llama_adapter_cvec puts all of a
        buffer type's tensors in its one buffer, so a buffer seen once is seen whole."""
        g = self.ggml
        return sum(size // (-(-n_embd * 4 // g.buffer_get_alignment(buf)) * g.buffer_get_alignment(buf))
                   for buf, (_, size) in self.bufs.items())

    def sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, size in self.bufs.values():
            out[name] = out.get(name, 0) + size
        return out


def _run_draft(llama_cpp, ggml: Ggml, shim: Shim, log: LogCapture, draft: tuple[str, Params], ctx_tgt,
               keep: list) -> dict:
    """common_speculative_init_result: the draft model loaded after the target's context, its context
    at the target's n_ctx with ctx_other = the target's; the sections of its result from its own log
    lines (those after the target's)."""
    path, params = draft
    start = len(log.parts)
    model = _load_model(llama_cpp, ggml, log, path, params, keep)
    cp = _context_params(llama_cpp, params)
    cp.n_ctx = llama_cpp.llama_n_ctx(ctx_tgt)
    cp.ctx_other = ctx_tgt
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        raise RunError(f"llama.cpp could not create the draft context: {log.errors()}")
    result = _collect(llama_cpp, ggml, shim, "".join(log.parts[start:]), path, model, ctx, params)
    out = {k: result[k] for k in ("model", "params", "compute_buffers", "graphs", "kv_buffers", "output_buffers",
                                  "model_buffers", "checks")}
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return out


def _load_model(llama_cpp, ggml: Ggml, log: LogCapture, model_path: str, params: Params, keep: list,
                no_alloc: bool = False):
    """llama_model_load_from_file with the model parameters of params (keep holds the ctypes arrays)."""
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = params.n_gpu_layers
    if params.split_mode not in SPLIT_MODES:
        raise RunError(f"unknown split mode {params.split_mode!r}")
    mp.split_mode = SPLIT_MODES[params.split_mode]
    mp.main_gpu = params.main_gpu
    mp.use_extra_bufts = params.use_extra_bufts
    mp.no_host = params.no_host
    mp.load_mtp = params.load_mtp
    if no_alloc:     # common_get_device_memory_data_impl (common/fit.cpp)
        mp.no_alloc = True
        mp.load_mode = LLAMA_LOAD_MODE_NONE
    if params.tensor_split:
        n_max = llama_cpp.llama_max_devices()
        if len(params.tensor_split) > n_max:
            raise RunError(f"--tensor-split has {len(params.tensor_split)} values, llama.cpp takes at most {n_max}")
        ts = (ctypes.c_float * n_max)(*params.tensor_split)
        keep.append(ts)
        mp.tensor_split = ts
    devs = _device_list(ggml, params.devices)
    keep.append(devs)
    mp.devices = ctypes.cast(devs, ctypes.c_void_p)
    if params.tensor_overrides:
        ovr = _buft_overrides(ggml, params.tensor_overrides)
        keep.append(ovr)
        mp.tensor_buft_overrides = ctypes.cast(ovr, ctypes.c_void_p)
    if params.kv_overrides:
        kvo = _kv_overrides(llama_cpp, params.kv_overrides)
        keep.append(kvo)
        mp.kv_overrides = ctypes.cast(kvo, ctypes.POINTER(llama_cpp.llama_model_kv_override))

    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise RunError(f"llama.cpp could not load {model_path}: {log.errors()}")
    return model


def _context_params(llama_cpp, params: Params):
    """llama_context_params of params."""
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = params.n_ctx
    cp.n_batch = params.n_batch
    cp.n_ubatch = params.n_ubatch
    cp.n_seq_max = params.n_seq_max
    cp.n_outputs_max = params.n_outputs_max      # 0: n_batch (llama-server sets n_parallel outputs)
    cp.n_rs_seq = params.n_rs_seq
    cp.ctx_type = {"default": 0, "mtp": 1}[params.ctx_type]     # LLAMA_CONTEXT_TYPE_DEFAULT, _MTP
    if params.flash_attn not in FLASH_ATTN_TYPES:
        raise RunError(f"unknown flash attention mode {params.flash_attn!r}")
    cp.flash_attn_type = FLASH_ATTN_TYPES[params.flash_attn]
    for key in ("type_k", "type_v"):
        value = getattr(params, key)
        if value not in KV_TYPES:
            raise RunError(f"unsupported cache type {value!r}")
        setattr(cp, key, type_by_name(value))
    cp.kv_unified = params.kv_unified
    cp.swa_full = params.swa_full
    cp.embeddings = params.embeddings
    cp.pooling_type = POOLING_TYPES[params.pooling_type]
    cp.offload_kqv = params.offload_kqv
    cp.op_offload = params.op_offload
    cp.n_threads = cp.n_threads_batch = max(1, os.cpu_count() or 1)
    return cp


def _override_warnings(log_text: str) -> list[str]:
    """validate_override's warnings (src/llama-model-loader.cpp) of an --override-kv whose type is not
    the one the key is read as, once each."""
    out = []
    for m in re.finditer(r"validate_override: Warning: (Bad metadata override type for key .*)", log_text):
        if m.group(1) not in out:
            out.append(m.group(1))
    return out


def _rerank_warnings(llama_cpp, model, ctx) -> list[str]:
    """What common_init_from_params (common/common.cpp), which llama-server creates its context with,
    warns of a context pooling by rank whose vocabulary has no BOS, or none of EOS, SEP and a rerank
    chat template: asked of llama.cpp itself (planner/vocab.py answers it from the header)."""
    if llama_cpp.llama_pooling_type(ctx) != llama_cpp.LLAMA_POOLING_TYPE_RANK:
        return []
    vocab = llama_cpp.llama_model_get_vocab(model)
    warnings = []
    if llama_cpp.llama_vocab_bos(vocab) == llama_cpp.LLAMA_TOKEN_NULL:
        warnings.append(RERANK_NO_BOS)
    if (llama_cpp.llama_vocab_eos(vocab) == llama_cpp.LLAMA_TOKEN_NULL
            and llama_cpp.llama_vocab_sep(vocab) == llama_cpp.LLAMA_TOKEN_NULL
            and not llama_cpp.llama_model_chat_template(model, b"rerank")):
        warnings.append(RERANK_NO_EOS_SEP_PROMPT)
    return warnings


def _collect(llama_cpp, ggml: Ggml, shim: Shim, log_text: str, model_path: str, model, ctx, params: Params) -> dict:
    parsed = parse_log(log_text)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buf, ctypes.sizeof(buf))
    arch = buf.value.decode() if n >= 0 else None

    model_info = {"path": model_path, "arch": arch, "n_layer": llama_cpp.llama_model_n_layer(model),
                  "n_embd": llama_cpp.llama_model_n_embd(model), "n_head": llama_cpp.llama_model_n_head(model),
                  "n_head_kv": llama_cpp.llama_model_n_head_kv(model), "n_vocab": n_vocab,
                  "n_ctx_train": llama_cpp.llama_model_n_ctx_train(model)}

    c = parsed["context"]
    n_ctx, n_ctx_seq = llama_cpp.llama_n_ctx(ctx), llama_cpp.llama_n_ctx_seq(ctx)
    n_batch, n_ubatch, n_seq_max = llama_cpp.llama_n_batch(ctx), llama_cpp.llama_n_ubatch(ctx), \
        llama_cpp.llama_n_seq_max(ctx)
    if "n_outputs_max" not in c or "kv_unified" not in c:
        raise RunError("llama.cpp's log has no llama_context parameter lines: log format changed?")
    n_outputs_max = int(c["n_outputs_max"])
    # flash attention as resolved: "llama_context: flash_attn = ..." logs the mode llama_init_from_model
    # left (Grok's forced off; "auto" turned "on" for a quantized V cache), and "auto" follows the probe (C:507-560)
    if c.get("flash_attn") == "auto":
        flash_attn = parsed["fa_probe"]
        if flash_attn is None:
            raise RunError("no 'Flash Attention enabled/disabled' line in llama.cpp's log for -fa auto")
    elif c.get("flash_attn") in ("enabled", "disabled"):
        flash_attn = c["flash_attn"] == "enabled"
    else:
        raise RunError("no 'llama_context: flash_attn' line in llama.cpp's log: log format changed?")
    type_k, type_v = parsed["kv_types"] or (params.type_k, params.type_v)
    model_devs = shim.devices(model)
    devices = [ggml.dev_name(d).decode() for d in model_devs]
    if parsed.get("sched_copies") is None or "graphs" not in parsed:
        raise RunError("no sched_reserve graph/copies lines in llama.cpp's log: log format changed?")

    eff = {"n_ctx": n_ctx, "n_ctx_seq": n_ctx_seq, "n_batch": n_batch, "n_ubatch": n_ubatch, "n_seq_max": n_seq_max,
           "n_outputs_max": n_outputs_max, "kv_unified": c["kv_unified"] == "true", "flash_attn": flash_attn,
           "type_k": type_k, "type_v": type_v, "n_gpu_layers": shim.model_n_gpu_layers(model),
           "sched_copies": parsed["sched_copies"], "devices": devices}

    # buffer types in llama.cpp's backend order (model devices, then CPU), then the others by name
    order = [ggml.buft_name(ggml.dev_buffer_type(d)).decode() for d in model_devs] + ["CPU"]
    rank = {name: i for i, name in reversed(list(enumerate(order)))}
    entries = [(ggml.buft_name(buft).decode(), m, c, k) for buft, m, c, k in shim.breakdown(ctx)]
    entries.sort(key=lambda e: (rank.get(e[0], len(order)), e[0]))
    compute, kv, weights = {}, {}, {}
    for name, m, ctx_bytes, k in entries:
        if k > 1:            # sched_reserve logs (and so reports) a compute buffer only when > 1 byte
            compute[name] = compute.get(name, 0) + k
        if ctx_bytes:
            kv[name] = kv.get(name, 0) + ctx_bytes
        if m:
            weights[name] = weights.get(name, 0) + m

    # the output buffer: output_reserve(n_seq_max) at construction: logits, and embeddings when the
    # context computes them (C:2116-2207)
    if len(parsed["output"]) != 1:
        raise RunError(f"expected one 'output buffer size' line in llama.cpp's log, found {len(parsed['output'])}")
    out_name, out_mib = parsed["output"][0]
    # T5 keeps embeddings whether asked or not ("hacky enc-dec support", C:2131)
    has_embd = params.embeddings or arch == "t5"
    n_embd_out = llama_cpp.llama_model_n_embd_out(model) if has_embd else 0
    out_bytes = ggml.allocated_size(out_name, (n_vocab + n_embd_out) * n_seq_max * 4)
    if mib2(out_bytes) != out_mib:
        raise RunError(f"output buffer: expected {out_bytes} bytes ({mib2(out_bytes)} MiB) for (n_vocab {n_vocab} + "
                       f"n_embd_out {n_embd_out}) x n_seq_max {n_seq_max} floats, llama.cpp logged {out_mib} MiB")
    output = {out_name: out_bytes}

    # the reserve's ubatches (graph_reserve rounds n_tokens up to a multiple of n_seqs)
    n_tokens = min(n_ctx, n_ubatch)
    n_tokens_pp = -(-n_tokens // n_seq_max) * n_seq_max
    g = parsed["graphs"]
    if "bs" in g["pp"] and (g["pp"]["bs"] != n_tokens or g["tg"]["bs"] != n_seq_max):
        raise RunError(f"sched_reserve logged pp bs={g['pp']['bs']}, tg bs={g['tg']['bs']}; expected {n_tokens}, "
                       f"{n_seq_max}")
    graphs = {
        "pp": {"n_tokens": n_tokens_pp, "n_seqs": n_seq_max, "n_outputs": min(n_tokens, n_outputs_max),
               "nodes": g["pp"]["nodes"], "splits": g["pp"]["splits"]},
        "tg": {"n_tokens": n_seq_max, "n_seqs": n_seq_max, "n_outputs": n_seq_max,
               "nodes": g["tg"]["nodes"], "splits": g["tg"]["splits"]},
    }

    checks = {
        "compute_log_agrees": _log_agrees(parsed["compute"], compute),
        "model_log_agrees": _log_agrees(parsed["model"], weights),
        "kv_log_agrees": _log_agrees(parsed["kv"], kv),
    }
    return {
        "schema": SCHEMA,
        "source": "llama.cpp",
        "llama_cpp": {"commit": LLAMA_CPP_COMMIT, "llama_cpp_python": llama_cpp.__version__},
        "model": model_info,
        "params": eff,
        "compute_buffers": compute,
        "graphs": graphs,
        "kv_buffers": kv,
        "output_buffers": output,
        "model_buffers": weights,
        "checks": checks,
    }


# --------------------------------------------------------------------------------------------
# tensors: one decode of the reserve's pp ubatch, read through the scheduler's eval callback
# --------------------------------------------------------------------------------------------

class TensorRecorder:
    """cb_eval: answers "yes" to every node, then reads it (and every src/view_src reachable from
    it that was not seen yet) when the scheduler hands it over after computing it."""

    def __init__(self, ggml: Ggml) -> None:
        import llama_cpp
        self.ggml = ggml
        self.rows: list[dict] = []
        self.seen: dict[int, int] = {}          # tensor address -> row
        self.row_buffer: list[Optional[int]] = []   # ggml_backend_buffer_t of each row
        self.n_nodes = 0
        self.buffers: dict[int, tuple[str, str, int, int]] = {}   # buffer -> (name, usage, base, size)
        self.error: Optional[BaseException] = None

        def cb(t, ask, user_data):
            if ask:
                return True
            try:
                self.node(t)
            except BaseException as e:          # never raise through C
                self.error = self.error or e
            return True

        self.callback = llama_cpp.ggml_backend_sched_eval_callback(cb)

    def _buffer(self, buf: int) -> tuple[str, str, int, int]:
        info = self.buffers.get(buf)
        if info is None:
            g = self.ggml
            info = (g.buffer_name(buf).decode(), BUFFER_USAGES.get(g.buffer_get_usage(buf), "?"),
                    g.buffer_get_base(buf) or 0, g.buffer_get_size(buf))
            self.buffers[buf] = info
        return info

    def _row(self, addr: int, index: Optional[int], kind: str) -> dict:
        g = self.ggml
        t = GGMLTensor.from_address(addr)
        buffer = offset = usage = None
        if t.buffer:
            buffer, usage, base, _ = self._buffer(t.buffer)
            if t.data is not None:
                offset = t.data - base
        view_of = GGMLTensor.from_address(t.view_src).name.decode(errors="replace") if t.view_src else None
        return {"index": index, "kind": kind, "name": t.name.decode(errors="replace"), "op": g.op_name(t.op).decode(),
                "ne": list(t.ne), "type": g.type_name(t.type).decode(), "buffer": buffer, "usage": usage,
                "offset": offset, "size": g.nbytes(addr), "view_of": view_of}

    def node(self, addr: int) -> None:
        index = self.n_nodes
        self.n_nodes += 1
        if addr in self.seen:        # met before as a src: it is a node after all
            self.rows[self.seen[addr]].update(self._row(addr, index, "node"))
        else:
            self._add(addr, index, "node")
        self._srcs(addr)

    def _srcs(self, addr: int) -> None:
        t = GGMLTensor.from_address(addr)
        for s in [*t.src, t.view_src]:
            if s and s not in self.seen:
                self._add(s, None, "leaf")
                self._srcs(s)

    def _add(self, addr: int, index: Optional[int], kind: str) -> None:
        self.seen[addr] = len(self.rows)
        self.rows.append(self._row(addr, index, kind))
        self.row_buffer.append(GGMLTensor.from_address(addr).buffer)


def _unreplayable(result: dict) -> Optional[str]:
    """Why no real decode can reproduce the reserve's pp ubatch, if none can: graph_reserve rounds
    n_tokens up to a multiple of n_seq_max (C:2528), and a decode splits a batch into ubatches of
    at most n_ubatch tokens, so a rounded-up ubatch larger than n_ubatch is never computed."""
    (n_tokens, n_seqs), params = _final_pp_ubatch(result), result["params"]
    if n_tokens > params["n_ubatch"]:
        return (f"the pp reservation has {n_tokens} tokens (rounded up to a multiple of "
                f"n_seq_max {params['n_seq_max']}), more than n_ubatch {params['n_ubatch']}: no decode "
                f"computes that ubatch, so its tensor offsets cannot be measured")
    n_outputs = result["graphs"]["pp"]["n_outputs"]
    if result["model"]["arch"] in NO_MEMORY_ARCHS and n_outputs < n_tokens:
        return (f"a model without memory decodes through llama_context::encode, which outputs every token "
                f"({n_tokens}), where the pp reservation outputs {n_outputs} (its n_tokens before rounding up to a "
                f"multiple of n_seq_max {params['n_seq_max']}): no decode builds the reserved graph, so its tensor "
                f"offsets cannot be measured")
    if result["model"]["arch"] == "t5encoder" and n_seqs > 1 and not params["kv_unified"]:
        return ("a decode of several sequences over a non-unified cache splits the batch into equal "
                "sequences, on which T5's encoder position buckets abort (llama-graph.cpp:181 "
                "GGML_ASSERT(!ubatch->equal_seqs())): the reserve's tensor offsets cannot be measured")
    if result["model"]["arch"] == "t5":
        return ("T5's decoder reads the encoder output: a decode without llama_encode aborts (GGML_ASSERT "
                "'llama_encode must be called first'), and an encode first runs the encoder graph through the "
                "same scheduler, which re-plans the reserved compute buffers, so the reserve's tensor offsets "
                "cannot be measured")
    # MiniMax sparse attention sizes its inputs by the positions in the cache: the reserve sees an
    # empty one (N_POS_PAD positions), a decode of more positions per sequence a larger graph, for
    # which llama.cpp grows the compute buffer past the reservation
    msa = (result["model"]["arch"] in MSA_ARCHS and params["flash_attn"]
           and (params["n_seq_max"] == 1 or not params["kv_unified"]))
    if msa and n_tokens // n_seqs > N_POS_PAD:
        return (f"MiniMax sparse attention reserves for {N_POS_PAD} cached positions (an empty cache); a "
                f"decode of {n_tokens // n_seqs} positions per sequence builds a larger graph and llama.cpp grows "
                f"the compute buffer for it, so the reserve's tensor offsets cannot be measured (use at most "
                f"{N_POS_PAD} tokens per sequence: -ub or -np)")
    return None


def _final_pp_ubatch(result: dict) -> tuple[int, int]:
    """(n_tokens, n_seqs) of sched_reserve's last pp reservation, whose offsets a decode reuses: the
    first pp's, or one sequence of min(n_ctx, n_ubatch) tokens for the architectures that reserve
    it so (RESERVE_PP_ONE_SEQ_ARCHS, llama-context.cpp:714)."""
    if result["model"]["arch"] in RESERVE_PP_ONE_SEQ_ARCHS:
        return min(result["params"]["n_ctx"], result["params"]["n_ubatch"]), 1
    return result["graphs"]["pp"]["n_tokens"], result["graphs"]["pp"]["n_seqs"]


def _decode_reserve_ubatch(llama_cpp, ctx, result: dict) -> None:
    """Decode the reserve's pp ubatch for real: n_tokens = min(n_ctx, n_ubatch) tokens, the first
    n_outputs_pp of them with logits (the reserve's n_outputs: min(n_tokens, n_outputs_max), fewer
    than n_tokens where rounding n_tokens up to a multiple of n_seq_max passed n_outputs_max), split evenly over the reservation's sequences (_final_pp_ubatch; seq s: positions
    0..n_tokens/n_seqs-1) as balloc.ubatch_reserve lays them out; with one sequence: seq 0,
    positions 0..n_tokens-1.

    This decode reuses the offsets of the final pp reservation: ggml_gallocr_alloc_graph only
    re-plans when ggml_gallocr_needs_realloc finds a different node/leaf count or a tensor larger than
    its reserved slot (ggml-alloc.c). Tensors whose shape depends on n_kv (the KQ mask, the K/V cache
    views, kq, ...) are smaller here than at reserve time (n_kv = the used cells, padded, instead of
    the whole cache), so they fit their slots; their "size" is the decode's, not the reserve's.
    """
    n_tokens, n_seqs = _final_pp_ubatch(result)
    n_outputs = result["graphs"]["pp"]["n_outputs"]
    per_seq = n_tokens // n_seqs
    n_vocab = result["model"]["n_vocab"]
    batch = llama_cpp.llama_batch_init(n_tokens, 0, 1)
    try:
        for i in range(n_tokens):
            batch.token[i] = 1 + (i * 7919) % (n_vocab - 1)
            batch.pos[i] = i % per_seq
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = i // per_seq
            batch.logits[i] = int(i < n_outputs)
        batch.n_tokens = n_tokens
        rc = llama_cpp.llama_decode(ctx, batch)
    finally:
        llama_cpp.llama_batch_free(batch)
    if rc != 0:
        raise RunError(f"llama_decode of the {n_tokens}-token reserve ubatch returned {rc}")


def _tensor_checks(ggml: Ggml, shim: Shim, ctx, rec: TensorRecorder, result: dict) -> None:
    if rec.error is not None:
        raise RunError(f"reading tensors in the eval callback failed: {rec.error!r}")
    checks = result["checks"]
    checks["decode_nodes"] = rec.n_nodes
    # set by the child process (isolated runs): a re-allocation would have aborted the decode
    checks["decode_realloc_guard"] = True if os.environ.get("GGML_SCHED_DEBUG_REALLOC") == "2" else None
    # compute buffers seen by the decode: same sizes as reserved (the allocator did not grow them)
    seen_compute: dict[str, int] = {}
    for name, usage, base, size in rec.buffers.values():
        if usage == "compute":
            seen_compute[name] = seen_compute.get(name, 0) + size
    after = {}
    for buft, m, c, k in shim.breakdown(ctx):
        if k > 1:
            after[ggml.buft_name(buft).decode()] = k
    checks["decode_same_compute_buffers"] = after == result["compute_buffers"]
    checks["decode_compute_buffers_seen"] = seen_compute
    checks["decode_same_node_count"] = rec.n_nodes == result["graphs"]["pp"]["nodes"]
    # the KV cache buffers, from the cache tensors the graph reads (cache_k_l0, cache_v_l0, ...,
    # dsv4_csa_state_kv_l2, ...)
    kv_seen: dict[str, int] = {}
    kv_bufs = {rec.row_buffer[i] for i, row in enumerate(rec.rows)
               if _CACHE_TENSOR_RE.match(row["name"]) and row["view_of"] is None and rec.row_buffer[i]}
    for b in kv_bufs:
        name, _, _, size = rec.buffers[b]
        kv_seen[name] = kv_seen.get(name, 0) + size
    checks["kv_buffers_from_cache_tensors"] = kv_seen == result["kv_buffers"] if kv_seen else None


def _child(request_path: str, result_path: str) -> int:
    req = json.loads(Path(request_path).read_text())
    if req["tensors"]:
        # ggml_backend_sched_new reads it (ggml-backend.cpp): > 1 aborts on any re-allocation in
        # ggml_backend_sched_alloc_splits, so a finished decode proves the reserve's plan was reused
        os.environ["GGML_SCHED_DEBUG_REALLOC"] = "2"
    try:
        draft = req.get("draft")
        data = _run_here(req["model_path"], params_from_dict(req["params"]), req["tensors"], req["keep_log"],
                         req.get("log_path"), req.get("no_alloc", False),
                         (draft[0], params_from_dict(draft[1])) if draft else None)
        rc = 0
    except LlamaCppMissing as e:
        data, rc = {"error": str(e), "missing": True}, 2
    except NotImplementedError as e:
        data, rc = {"error": str(e), "unsupported": True}, 2
    except (RunError, OSError) as e:
        data, rc = {"error": str(e)}, 1
    tmp = result_path + ".tmp"
    Path(tmp).write_text(json.dumps(data))
    os.replace(tmp, result_path)
    sys.stdout.flush()
    # skip interpreter teardown: llama.cpp's static destructors (RPC dispatchers, ...) are not needed
    os._exit(rc)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
