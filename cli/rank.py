"""Fitting several models at once: one fit per model in a process pool over the cores, ranked.

Each job is what `schedplan fit` does for one model (fit_job: as llama-server when the job says so,
then planner/fit.py's fit_params) and returns the same report; a model that cannot be planned
returns its one-line reason instead. The devices are detected (and RPC servers asked for their
memory) once, before the jobs.
"""
from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import click
from tabulate import tabulate

from .errors import USER_ERRORS, one_line
from ..planner.params import Params

if TYPE_CHECKING:
    from ..planner.fit import ExtraModel, FitResult
    from ..planner.mtmd.mtmd import MmprojParams, MmprojPlan
    from ..planner.server import SpecParams

MiB, GiB = 1024**2, 1024**3
# how a model runs on the devices, best first (the ranking's first key)
OFFLOAD_ORDER = {"full": 0, "partial": 1, "cpu": 2, "none": 3}
OFFLOAD_WORDS = {"full": "all on GPU", "partial": "GPU + CPU", "cpu": "CPU only", "none": "does not fit"}


@dataclass(frozen=True)
class Job:
    label: str                            # how the model was named: a path, a URL, a repo, a preset
    model: str                            # the path or URL fit plans (empty when resolving failed)
    params: Params
    n_ctx_auto: bool
    n_ctx_min: int
    margins: Optional[list[int]]
    host_total: Optional[int]
    host_available: Optional[int]
    command: Optional[list[str]] = None   # llama-server ARGS as given (argv0 first), for the line to paste
    server_given: frozenset = field(default=frozenset())    # the memory flags that command set
    error: str = ""                       # why the job cannot run (found before planning)
    mmproj: Optional["MmprojParams"] = None   # the projector llama-server loads beside the model
    spec: Optional["SpecParams"] = None       # speculative decoding: a draft model, MTP, n-gram drafting
    as_server: bool = False               # fit as llama-server fits (its context; with a projector or a draft)
    n_parallel_given: bool = True         # -np given: else llama-server's "auto" (as_server)
    server_argv: Optional[list[str]] = None   # fit's own flags as llama-server's, the model first, less the fitted


@dataclass
class FittedJob:
    result: "FitResult"
    mmproj: Optional["MmprojPlan"]        # the projector as planned for the fit's targets
    loaded: Optional[dict]                # fitted as llama-server: what llama.cpp then loads


def prepare(job: Job) -> tuple[Params, Optional["ExtraModel"], list[str]]:
    """The model's parameters as the job's program creates its context, the extra model
    common_fit_params fits beside it, and what was changed: llama-server's context (its -np
    default, the output cap; planner/server.py server_params) and speculative decoding's changes
    (speculative_params) for a job fitted as llama-server, else the parameters as given."""
    if not job.as_server:
        return job.params, None, []
    from ..planner.server import SpecParams, draft_types_from_gguf, server_params, speculative_params

    spec = draft_types_from_gguf(job.spec or SpecParams(), job.params.header_cache)
    params, log = server_params(job.params, job.n_parallel_given, spec.n_draft())
    params, extra = speculative_params(job.model, params, spec)
    return params, extra, log


def fit_job(job: Job) -> FittedJob:
    """What `schedplan fit` does for one model: llama-server's context (prepare), the projector's
    memory added to fit's targets as server-context.cpp adds it, then common_fit_params with the
    extra model."""
    from ..planner.fit import fit_params, fit_targets

    params, extra, log = prepare(job)
    margins, mmproj_plan = job.margins, None
    if job.mmproj is not None:
        from ..planner.mtmd.mtmd import mtmd_get_memory_usage
        from ..planner.server import check_mmproj_for_model, mmproj_fit_targets
        mmproj_plan = mtmd_get_memory_usage(params, job.mmproj)
        check_mmproj_for_model(mmproj_plan, job.model, params)
        margins, mmproj_log = mmproj_fit_targets(fit_targets(job.margins), mmproj_plan)
        log += mmproj_log
    result = fit_params(job.model, params, n_ctx_auto=job.n_ctx_auto, margins=margins, n_ctx_min=job.n_ctx_min,
                        host_total=job.host_total, extra=extra)
    result.log[:0] = log
    loaded = None
    if job.as_server:
        from ..planner.server import SpecParams, draft_after_fit, draft_types_from_gguf, loaded_with
        from ..planner.ggml import GGMLAbort
        from ..planner.hparams import UnsupportedModel
        from ..planner.server_life import ServerLife, plan_after_startup
        loaded = loaded_with(job.model, result.params)
        if result.status == 0:    # what the fitted llama-server allocates after its startup reservation
            spec = draft_types_from_gguf(job.spec or SpecParams(), params.header_cache)
            draft = draft_after_fit(extra, result.params) if extra is not None else None
            try:
                loaded["after_startup"] = plan_after_startup(job.model, result.params, draft, ServerLife(spec))
            except (NotImplementedError, UnsupportedModel, GGMLAbort) as e:   # reserve refuses these in one line
                loaded["after_startup"] = {"error": one_line(str(e))}
    return FittedJob(result, mmproj_plan, loaded)


def run_job(job: Job) -> dict:
    """One model's fit report (cli/fit.py fit_report), or {"model", "error"}."""
    from .fit import fit_report

    if job.error:
        return {"model": job.label, "error": job.error}
    try:
        fitted = fit_job(job)
    except RuntimeError as e:     # common_fit_params' std::runtime_error
        return {"model": job.label, "error": one_line(str(e))}
    except USER_ERRORS as e:
        if isinstance(e, OSError) and e.filename:
            return {"model": job.label, "error": one_line(f"{e.filename}: {e.strerror}")}
        return {"model": job.label, "error": one_line(str(e))}
    return fit_report(fitted, job)


def run_jobs(jobs: list[Job], progress: bool) -> list[dict]:
    """The reports in the jobs' order, planned over the cores; a progress bar on stderr when asked."""
    workers = min(len(jobs), os.cpu_count() or 1)
    reports: list[Optional[dict]] = [None] * len(jobs)
    bar = click.progressbar(length=len(jobs), label="fitting", file=sys.stderr) if progress else None
    if bar is not None:
        bar.__enter__()
    try:
        if workers <= 1:
            for i, job in enumerate(jobs):
                reports[i] = run_job(job)
                if bar is not None:
                    bar.update(1)
        else:
            from ..planner import fit  # noqa: F401  (imported once here: the forked workers share it)
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(run_job, job): i for i, job in enumerate(jobs)}
                for future in as_completed(futures):
                    reports[futures[future]] = future.result()
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    return reports


def rank_key(report: dict) -> tuple:
    """Errors last; then how the model runs (all on the GPUs, GPU + CPU, CPU, not at all; a CPU part
    the host's RAM cannot hold counts as not at all), larger models first, then by name."""
    if "error" in report:
        return (5, 0, report["model"])
    order = OFFLOAD_ORDER[report["offload"]]
    if report["host_ram"]["fits"] is False:
        order = OFFLOAD_ORDER["none"]
    return (order, -report["model_bytes"], report["model"])


def _gib(n: Optional[int]) -> str:
    return "?" if n is None else f"{n / GiB:.1f}"


def render_ranking(reports: list[dict]) -> str:
    """The ranked reports as a table, one row per model."""
    rows = []
    for r in reports:
        if "error" in r:
            rows.append([r["model"], "", "", "error", "", r["error"], "", ""])
            continue
        verdict = OFFLOAD_WORDS[r["offload"]]
        ram = r["host_ram"]
        if ram["fits"] is False:
            verdict += " (RAM short)" if r["offload"] != "none" else ""
        devices = ", ".join(f"{d['name']} {_gib(d['model'] + d['context'] + d['compute'])}/{_gib(d['free'])}"
                            for d in r["devices"] if d["name"] != "Host")
        line = r["args"] or r["message"]
        rows.append([r["model"], r["arch"], _gib(r["model_bytes"]), verdict,
                     r["max_ctx_full_offload"] if r["max_ctx_full_offload"] is not None else "-", line,
                     devices, f"{_gib(ram['needed'])}/{_gib(ram['available'])}"])
    return tabulate(rows, headers=["model", "arch", "GiB", "runs", "max ctx on GPU", "flags fit picks (or why not)",
                                   "GPU used/free GiB", "RAM needed/avail GiB"], disable_numparse=True)
