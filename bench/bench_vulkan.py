"""What planning for a Vulkan device costs against planning for the CPU alone, on the same model.

    python bench/bench_vulkan.py [--model llama-3.1-8b] [-c 8192] [--repeat 20]

Two measures, each with the CPU alone and with every layer on a lavapipe Vulkan device (fixtures/
vulkan's profile), interleaved so that load hits both alike:
  in process   create_context + sched_reserve (FA probe, pp, tg, pp) on the header-only copy, median
               of --repeat: the Vulkan plan adds supports_op on every node, the Vulkan_Host/Vulkan0
               split and graph_optimize's reordering of each Vulkan split;
  command      `schedplan reserve MODEL -c N [--device vulkan:...]` as a subprocess on the full sparse
               file, median wall and CPU time (user + system) of --runs: interpreter, imports,
               header, the profile's JSON, plan and table (bytecode cached, as bench_reserve.py).
Ratios: Vulkan / CPU (the issue's target: at most 1). Then where the Vulkan plan's extra time goes,
from --repeat more Vulkan plans with three of its parts timed (medians per plan): the flash attention
probe (resolve_fused_ops: llama_context builds and splits one more graph when -fa is auto and more
than one backend exists; a CPU plan skips it; the plan takes it back as its tg graph, so tg then
only reserves), graph_optimize of the pp and tg splits, and the
device's supports_op (every call: weight placement probes, the scheduler's passes, the probe's
included). A report, not a test.
"""
from __future__ import annotations

import argparse
import resource
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

from bench_reserve import child_env, machine  # noqa: E402
from fixtures.golden import lavapipe_flags  # noqa: E402
from fixtures.make_gguf import header_path, model_path  # noqa: E402
from schedplan.backends import vulkan  # noqa: E402
from schedplan.cli.options import parse_params  # noqa: E402
from schedplan.planner import reserve  # noqa: E402
from schedplan.planner.reserve import create_context, sched_reserve  # noqa: E402


def plan_ms(header: Path, flags: list[str]) -> float:
    params = parse_params(flags)
    t = time.perf_counter()
    sched_reserve(create_context(header, params))
    return (time.perf_counter() - t) * 1e3


def vulkan_parts(header: Path, flags: list[str], repeat: int) -> tuple[dict[str, float], int]:
    """Median ms per plan spent in the flash attention probe, graph_optimize and supports_op, and
    the number of supports_op calls per plan (the module functions are wrapped while planning)."""
    spent: dict[str, float] = {}
    calls = 0

    def timed(name, fn, count=False):
        def wrapper(*args, **kwargs):
            nonlocal calls
            calls += count
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    parts = {"flash attention probe = tg graph (resolve_fused_ops)": (reserve, "resolve_fused_ops", False),
             "graph_optimize (pp and tg)": (vulkan, "graph_optimize", False),
             "supports_op (all calls)": (vulkan, "supports_op", True)}
    originals = {name: getattr(mod, attr) for name, (mod, attr, _) in parts.items()}
    for name, (mod, attr, count) in parts.items():
        setattr(mod, attr, timed(name, originals[name], count))
    per_plan: dict[str, list[float]] = {name: [] for name in parts}
    try:
        for _ in range(repeat):
            spent.clear()
            calls = 0
            sched_reserve(create_context(header, parse_params(flags)))
            for name in parts:
                per_plan[name].append(spent.get(name, 0.0) * 1e3)
    finally:
        for name, (mod, attr, _) in parts.items():
            setattr(mod, attr, originals[name])
    return {name: statistics.median(v) for name, v in per_plan.items()}, calls


def command_times(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, user + system CPU) seconds of one run of cmd."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("-c", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    header = header_path(args.model)
    cpu = ["-c", str(args.c)]
    vk = cpu + ["-ngl", "99", *lavapipe_flags(1)]
    plan_ms(header, cpu), plan_ms(header, vk)     # warm-up: imports, page cache
    times: dict[str, list[float]] = {"CPU": [], "Vulkan (lavapipe)": []}
    for _ in range(args.repeat):
        times["CPU"].append(plan_ms(header, cpu))
        times["Vulkan (lavapipe)"].append(plan_ms(header, vk))
    med = {k: statistics.median(v) for k, v in times.items()}
    exe = str(Path(sys.executable).with_name("schedplan"))
    model = str(model_path(args.model))
    commands = {"CPU": [exe, "reserve", model, *cpu], "Vulkan (lavapipe)": [exe, "reserve", model, *vk]}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
    env = child_env(tempfile.mkdtemp(prefix="schedplan-bench-pycache-"))    # bytecode cached, as installed
    for _ in range(args.runs + 1):            # the first round fills the page and bytecode caches: not counted
        for k, cmd in commands.items():
            runs[k].append(command_times(cmd, env))
    wall = {k: statistics.median(w for w, _ in v[1:]) for k, v in runs.items()}
    cpu_s = {k: statistics.median(c for _, c in v[1:]) for k, v in runs.items()}
    print(f"machine: {machine()}")
    print(f"model:   {args.model}, -c {args.c}; in process: median of {args.repeat}, command: median of {args.runs}")
    rows = [[k, f"{med[k]:.1f}", f"{wall[k] * 1e3:.0f}", f"{cpu_s[k] * 1e3:.0f}"] for k in med]
    print(tabulate(rows, headers=["plan for", "in process ms", "command wall ms", "command CPU ms"],
                   disable_numparse=True))
    vk_name = "Vulkan (lavapipe)"
    print(f"ratio Vulkan / CPU: in process {med[vk_name] / med['CPU']:.2f}, command wall {wall[vk_name] / wall['CPU']:.2f}, "
          f"command CPU {cpu_s[vk_name] / cpu_s['CPU']:.2f}")
    parts, n_calls = vulkan_parts(header, vk, args.repeat)
    print(f"\nwhere the Vulkan plan's extra {med[vk_name] - med['CPU']:.1f} ms go (in process, median ms per plan of "
          f"{args.repeat}; supports_op: {n_calls} calls, some inside the probe):")
    print(tabulate([[name, f"{ms:.1f}"] for name, ms in parts.items()], headers=["part", "ms"], disable_numparse=True))


if __name__ == "__main__":
    main()
