"""Planning time: schedplan vs llama.cpp's own metadata-only (no_alloc) path, on one model.

    python bench/bench_reserve.py [--model llama-3.1-8b] [-c 8192] [--repeat 20] [--runs 3]
                                  [--no-llama-cpp] [--no-gguf-reader]

Times, on the fixture's sparse GGUF (fixtures.make_gguf.model_path: the real model's header, the
data section a hole), in one run:

  schedplan, in process   create_context + sched_reserve (FA probe, pp, tg, pp), on the header-only
                          copy (header_path); and sched_reserve alone on a fresh context. Median of
                          --repeat. Target: create_context + sched_reserve < 50 ms.
  schedplan, command      `schedplan reserve MODEL -c N` as a subprocess (interpreter start, imports,
                          plan, table), on the full sparse file. Median of --runs.
  llama.cpp no_alloc      what common/fit.cpp (common_get_device_memory_data_impl) does to learn the
                          memory a configuration needs without allocating it: llama_model_params with
                          no_alloc = true and load_mode = LLAMA_LOAD_MODE_NONE (0 in include/llama.h's
                          enum llama_load_mode; NONE: no mmap, and with no_alloc no tensor data is read),
                          llama_model_load_from_file, then llama_init_from_model with n_ctx N (its
                          constructor runs the same sched_reserve). Every other parameter keeps its
                          default (use_extra_bufts, flash_attn_type auto, n_batch, n_ubatch, ...), as
                          llama-server's defaults are schedplan's. The log goes to a no-op callback
                          (fit.cpp demotes it to debug level too). In process: model + context creation,
                          median of --runs; subprocess: the same in a fresh interpreter, import
                          llama_cpp included, median of --runs.
  header parsing          planner.gguf.read_header vs gguf.GGUFReader (bench/bench_header.py's bench()),
                          on the full sparse file: GGUFReader maps the tensor data too and fails on
                          a header-only copy ("cannot reshape array of size 0").

The subprocess runs of both tools alternate, so background load hits both alike, and cache their
bytecode in a temporary PYTHONPYCACHEPREFIX (a first, uncounted run fills it), as an installed
package would; where PYTHONDONTWRITEBYTECODE is set (an editable install then recompiles schedplan's
sources at every start), the command is also timed that way, in its own row. Ratios are
schedplan / llama.cpp (below 1: schedplan is faster). Nothing here asserts a time: it is a report.
If the no_alloc path fails on this llama-cpp-python, the table says so and keeps schedplan's rows.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tabulate import tabulate  # noqa: E402

import bench_header  # noqa: E402
from fixtures.make_gguf import header_path, model_path  # noqa: E402
from schedplan.planner.params import Params  # noqa: E402
from schedplan.planner.reserve import create_context, reserve, sched_reserve  # noqa: E402

MiB = 1024 * 1024

# The child for llama.cpp's no_alloc path: argv = model path, n_ctx. Prints the compute buffer line
# of llama.cpp's own log on stdout (the bench checks it against schedplan's plan) and exits 1 with
# the reason when llama.cpp returns NULL.
LLAMA_CHILD = r"""
import ctypes, sys
import llama_cpp
log = []
cb = llama_cpp.llama_log_callback(lambda level, text, ud: log.append(text) if text and b"compute buffer size" in text else None)
llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
mp.no_alloc = True
mp.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), mp)
if not model:
    sys.exit("llama_model_load_from_file returned NULL")
cp = llama_cpp.llama_context_default_params()
cp.n_ctx = int(sys.argv[2])
ctx = llama_cpp.llama_init_from_model(model, cp)
if not ctx:
    sys.exit("llama_init_from_model returned NULL")
sys.stdout.write(b"".join(log).decode())
llama_cpp.llama_free(ctx)
llama_cpp.llama_model_free(model)
"""


median_ms = bench_header.median_ms


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, load average {load}")


# -- schedplan -----------------------------------------------------------------------------------------

def schedplan_in_process(header: Path, params: Params, repeat: int) -> dict[str, float]:
    sched_reserve(create_context(header, params))       # warm-up: imports, page cache
    full = median_ms(lambda: sched_reserve(create_context(header, params)), repeat)
    alone = []
    for _ in range(repeat):
        ctx = create_context(header, params)
        t = time.perf_counter()
        sched_reserve(ctx)
        alone.append(time.perf_counter() - t)
    create = median_ms(lambda: create_context(header, params), repeat)
    return {"create+reserve": full, "sched_reserve": statistics.median(alone) * 1e3, "create_context": create}


def schedplan_command(model: Path, n_ctx: int) -> list[str]:
    exe = Path(sys.executable).with_name("schedplan")
    if not exe.exists():
        exe = shutil.which("schedplan")
        if exe is None:
            raise SystemExit("the schedplan command is not installed (pip install -e .)")
    return [str(exe), "reserve", str(model), "-c", str(n_ctx)]


# -- llama.cpp's no_alloc path -----------------------------------------------------------------------

class LlamaCpp:
    """llama.cpp's metadata-only path in this process (see LLAMA_CHILD for the same in a child)."""

    def __init__(self) -> None:
        import llama_cpp
        self.lib = llama_cpp
        self.log: list[bytes] = []
        self.keep_log = False

        def on_log(level, text, user_data):
            if self.keep_log and text:
                self.log.append(text)

        self._cb = llama_cpp.llama_log_callback(on_log)   # kept alive: llama.cpp holds the pointer
        llama_cpp.llama_log_set(self._cb, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()

    def load(self, model: Path, n_ctx: int) -> tuple[float, float]:
        """(model load s, context creation s); raises RuntimeError with llama.cpp's reason on NULL."""
        lib = self.lib
        mp = lib.llama_model_default_params()
        mp.no_alloc = True
        mp.load_mode = lib.LLAMA_LOAD_MODE_NONE
        t0 = time.perf_counter()
        m = lib.llama_model_load_from_file(str(model).encode(), mp)
        t1 = time.perf_counter()
        if not m:
            raise RuntimeError(f"llama_model_load_from_file returned NULL: {self.errors()}")
        cp = lib.llama_context_default_params()
        cp.n_ctx = n_ctx
        ctx = lib.llama_init_from_model(m, cp)
        t2 = time.perf_counter()
        if not ctx:
            lib.llama_model_free(m)
            raise RuntimeError(f"llama_init_from_model returned NULL: {self.errors()}")
        lib.llama_free(ctx)
        lib.llama_model_free(m)
        return t1 - t0, t2 - t1

    def errors(self) -> str:
        lines = [ln.strip() for ln in b"".join(self.log).decode(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-3:]) or "no log (run once with the log kept to see it)"

    def compute_lines(self, model: Path, n_ctx: int) -> list[str]:
        """One run with the log kept: llama.cpp's "X compute buffer size = Y MiB" lines."""
        self.log.clear()
        self.keep_log = True
        try:
            self.load(model, n_ctx)
        finally:
            self.keep_log = False
        text = b"".join(self.log).decode(errors="replace")
        return [ln.strip() for ln in text.splitlines() if "compute buffer size" in ln]


def llama_child_command(model: Path, n_ctx: int) -> list[str]:
    return [sys.executable, "-c", LLAMA_CHILD, str(model), str(n_ctx)]


# -- subprocess walls --------------------------------------------------------------------------------

def child_env(pycache: str | None) -> dict[str, str]:
    """The children's environment. With `pycache`, bytecode is cached there (PYTHONPYCACHEPREFIX) even
    where PYTHONDONTWRITEBYTECODE is set: as after a normal install, no run recompiles its sources
    (an editable install under PYTHONDONTWRITEBYTECODE=1 recompiles schedplan's on every start)."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def wall(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, env=env)
    return time.perf_counter() - t, proc


def alternate_walls(cmds: dict[str, tuple[list[str], dict[str, str]]], runs: int) -> dict[str, float | str]:
    """Median wall (ms) per command, the commands alternating; a failing command gives its stderr tail."""
    times: dict[str, list[float]] = {k: [] for k in cmds}
    failed: dict[str, str] = {}
    for i in range(runs + 1):                  # run 0 warms the page and bytecode caches, not counted
        for key, (cmd, env) in cmds.items():
            if key in failed:
                continue
            dt, proc = wall(cmd, env)
            if proc.returncode != 0:
                tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
                failed[key] = f"exit {proc.returncode}: {tail[0]}"
            elif i:
                times[key].append(dt)
    return {k: failed.get(k) or statistics.median(v) * 1e3 for k, v in times.items()}


# -- main ----------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b", help="fixture name (fixtures/models/NAME.json)")
    ap.add_argument("-c", "--ctx-size", dest="n_ctx", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=20, help="in-process schedplan runs (median)")
    ap.add_argument("--runs", type=int, default=3, help="subprocess and in-process llama.cpp runs (median)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp's no_alloc path")
    ap.add_argument("--no-gguf-reader", action="store_true", help="skip gguf.GGUFReader (about 10 s on 8B)")
    args = ap.parse_args()

    model, header = model_path(args.model), header_path(args.model)
    params = Params(n_ctx=args.n_ctx)
    print(f"machine: {machine()}")
    print(f"model:   {model} ({model.stat().st_size / 1e9:.2f} GB sparse), header copy "
          f"{header.stat().st_size / MiB:.1f} MiB; -c {args.n_ctx}, other flags at their defaults")

    plan = reserve(header, params)
    sp = schedplan_in_process(header, params, args.repeat)

    llama_error = None
    lc_model = lc_ctx = None
    lc_lines: list[str] = []
    pycache = tempfile.mkdtemp(prefix="schedplan-bench-pycache-")
    cached = child_env(pycache)
    cmds = {"schedplan": (schedplan_command(model, args.n_ctx), cached)}
    no_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    if no_bytecode:
        cmds["schedplan, no bytecode cache"] = (schedplan_command(model, args.n_ctx), child_env(None))
    if args.no_llama_cpp:
        llama_error = "skipped (--no-llama-cpp)"
    else:
        try:
            lc = LlamaCpp()
        except (ImportError, OSError) as e:
            llama_error = f"llama_cpp cannot be imported: {e}"
        else:
            try:
                lc_lines = lc.compute_lines(model, args.n_ctx)
                loads = [lc.load(model, args.n_ctx) for _ in range(args.runs)]
                lc_model = statistics.median(m for m, _ in loads) * 1e3
                lc_ctx = statistics.median(c for _, c in loads) * 1e3
                lc_both = statistics.median(m + c for m, c in loads) * 1e3
            except RuntimeError as e:
                llama_error = str(e)
        if llama_error is None:
            cmds["llama.cpp"] = (llama_child_command(model, args.n_ctx), cached)
    try:
        walls = alternate_walls(cmds, args.runs)
    finally:
        shutil.rmtree(pycache, ignore_errors=True)

    def ms(x) -> str:
        return f"{x:.1f}" if isinstance(x, float) else str(x)

    rows = [
        ["schedplan in process: create_context + sched_reserve", ms(sp["create+reserve"]), args.repeat],
        ["- create_context (header, hparams, weights, KV)", ms(sp["create_context"]), args.repeat],
        ["- sched_reserve (FA probe, pp, tg, pp)", ms(sp["sched_reserve"]), args.repeat],
        [f"schedplan command: schedplan reserve MODEL -c {args.n_ctx}", ms(walls["schedplan"]), args.runs],
    ]
    if no_bytecode:
        rows.append(["- same, PYTHONDONTWRITEBYTECODE=1 as here (sources compiled each start)",
                     ms(walls["schedplan, no bytecode cache"]), args.runs])
    if llama_error is None:
        rows += [
            ["llama.cpp no_alloc in process: model + context", ms(lc_both), args.runs],
            ["- llama_model_load_from_file (no_alloc, LOAD_MODE_NONE)", ms(lc_model), args.runs],
            [f"- llama_init_from_model (n_ctx {args.n_ctx})", ms(lc_ctx), args.runs],
            ["llama.cpp no_alloc subprocess (python, import llama_cpp, model + context)",
             ms(walls["llama.cpp"]), args.runs],
        ]
    else:
        rows.append(["llama.cpp no_alloc path", f"failed: {llama_error}", ""])
    print()
    print(tabulate(rows, headers=["planning", "median ms", "n"], disable_numparse=True,
                   colalign=("left", "right", "right")))

    print()
    compute = ", ".join(f"{k} {v / MiB:.2f} MiB" for k, v in plan["compute_buffers"].items())
    print(f"schedplan plans compute: {compute}")
    if lc_lines:
        print("llama.cpp no_alloc logs: " + "; ".join(ln.split(":", 1)[-1].strip() for ln in lc_lines))

    target_in = 50.0
    print()
    # the engine issue's target is the planning of pp+tg+pp (sched_reserve); creating the context
    # (reading the header, weights and KV layout) is reported above, apart from it
    print(f"planning pp+tg+pp target < {target_in:.0f} ms: {sp['sched_reserve']:.1f} ms "
          f"({'met' if sp['sched_reserve'] < target_in else 'NOT met'})")
    if llama_error is None:
        ratio_in = sp["create+reserve"] / lc_both
        print(f"ratio in process (schedplan create+reserve / llama.cpp model+context): {ratio_in:.2f}")
        if isinstance(walls["schedplan"], float) and isinstance(walls["llama.cpp"], float):
            ratio_wall = walls["schedplan"] / walls["llama.cpp"]
            print(f"ratio wall (schedplan reserve command / llama.cpp no_alloc subprocess): {ratio_wall:.2f} "
                  f"(target < 0.50: {'met' if ratio_wall < 0.5 else 'NOT met'})")

    if args.no_gguf_reader:
        return
    print()
    rows = bench_header.bench(model, max(3, args.repeat // 2), with_reader=True)
    base = rows[0][1]
    print(f"header parsing, {model.name} (header {plan_header_mib(model):.1f} MiB)")
    print(tabulate([[name, f"{t:.1f}", f"{t / base:.1f}"] for name, t in rows],
                   headers=["reader", "median ms", "x read_header"], disable_numparse=True,
                   colalign=("left", "right", "right")))


def plan_header_mib(path: Path) -> float:
    from schedplan.planner.gguf import read_header
    return read_header(path).data_offset / MiB


if __name__ == "__main__":
    main()
