"""`schedplan fit`: what llama.cpp's --fit will choose, for one model or ranked over many."""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import click
from click.core import ParameterSource
from tabulate import tabulate

from .errors import die, fail_cleanly
from .options import MMPROJ_AUTO, SERVER_NAMES, Int32, fit_target_option, mmproj_options, plan_options, spec_options
from .rank import OFFLOAD_WORDS, FittedJob, Job, rank_key, render_ranking, run_job, run_jobs
from ..planner.devices import BadDevices
from ..planner.download import is_url
from ..planner.params import Params

MiB, GiB = 1024 * 1024, 1024**3
UINT32_MAX = 2**32 - 1
STATUS = {0: "success", 1: "failure", 2: "error"}
# schedplan's own options a `-- llama-server ARGS` command line may come with: the devices it
# declares and the output (llama-server's arguments say the rest)
SERVER_FORM_OPTIONS = {"devices", "rpc", "rpc_memory", "no_header_cache", "host_memory", "as_json"}
# schedplan's own options, which llama-server does not take, the models (each job's command names its
# own), and the ones fit's line sets: left out of the llama-server command fit prints
_NOT_SERVER = {"rpc_memory", "no_header_cache", "devices", "host_memory", "server", "as_json"}
_MODEL = {"model_urls", "hf_repos", "hf_file"}
_FITTED = {"n_ctx", "n_gpu_layers", "tensor_split", "override_tensor", "cpu_moe", "n_cpu_moe", "n_cpu_ffn"}


class _KeepArgs(click.Command):
    """Keeps the command line as given (ctx.meta["argv"]): the server's arguments are printed from it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["argv"] = list(args)
        return super().parse_args(ctx, args)


@click.command(cls=_KeepArgs)
@click.argument("models", nargs=-1, type=click.UNPROCESSED, metavar="[MODEL|DIR]... [-- llama-server ARGS]")
@click.option("-mu", "--model-url", "model_urls", multiple=True, metavar="URL",
              help="A model as an http(s) URL (repeatable): only its header is fetched, by range requests.")
@click.option("-hf", "-hfr", "--hf-repo", "hf_repos", multiple=True, metavar="<user>/<model>[:quant]",
              help="A model as a Hugging Face repository (repeatable): the file llama.cpp's -hf picks, planned "
                   "from its header (with the repository's projector, unless --no-mmproj, -mm or -mmu). HF_TOKEN "
                   "authorizes, MODEL_ENDPOINT or HF_ENDPOINT replaces the Hub.")
@click.option("-hff", "--hf-file", "hf_file", metavar="FILE", help="The file of the (one) -hf repository to plan.")
@plan_options
@mmproj_options
@spec_options
@fit_target_option("Memory to leave free on each device, in MiB (one value: every device)  [default: 1024]")
@click.option("-fitc", "--fit-ctx", "fit_ctx", type=Int32(), default=4096, show_default=True,
              help="The smallest context fit may reduce an unset -c to.")
@click.option("--host-memory", "host_memory", metavar="SIZE", default=None,
              help="The CPU's memory (default: this machine's physical memory, as ggml's CPU backend reports it; "
                   "and for the RAM verdict, what /proc/meminfo says is available).")
@click.option("--server", "server", is_flag=True,
              help="Fit as llama-server does, whose context differs from llama-fit-params': -np unset is 4 slots "
                   "over a unified KV cache, and a batch keeps at most one output per slot (1 + the drafted tokens "
                   "with speculative decoding). On with a projector, a draft model, --spec-type, --embedding, --rerank or --pooling, and for "
                   "`-- llama-server ARGS`.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the machine-readable result (schema schedplan.fit/1; for several models a list of them).")
def fit(models: tuple[str, ...], model_urls: tuple[str, ...], hf_repos: tuple[str, ...], hf_file: Optional[str],
        params: Params, mmproj, spec, fit_target: list[int] | None, fit_ctx: int, host_memory: str | None,
        server: bool, as_json: bool) -> None:
    """What llama.cpp's --fit (on by default in llama-server and llama-cli) will choose for a model
    on these devices: the flags llama-fit-params prints, ready to paste after `llama-server -m MODEL`.

    MODEL is a GGUF file, a split's first part, an http(s) URL (-mu) or a Hugging Face repository
    (-hf USER/MODEL[:QUANT]): only headers are read.

    \b
    Devices: without --device and --rpc, this machine's (see `schedplan devices`); else the
    declared ones: --device KIND:MEMORY, or --rpc HOST:PORT (a running server is asked for its
    memory as llama.cpp asks it; declare one that is not running with --rpc-memory);
    `--device none`: the CPU alone.

    With a multimodal projector (-mm, -mmu, or the mmproj-*.gguf -hf picks unless --no-mmproj)
    does what llama-server does first: the projector's memory per device (its weights and warm-up
    compute buffers, mtmd_get_memory_usage) is added to the target of the device at that index in
    ggml's device registry, then the model is fitted. With a draft model (-md, -hfd and the draft
    flags -ngld, -ctkd, -ctvd, -otd, -cmoed, -ncmoed) the draft and its context, at the model's
    context size, are added to every measurement, as common_fit_params fits its extra model; with
    --spec-type draft-mtp (Qwen3.5) the model's NextN block is loaded and an MTP context over it is
    fitted the same way. A draft head that reads its target's tensors (an EAGLE-3 head without its
    own embedding and head, a Gemma 4 assistant, a DFlash drafter) cannot be measured alone, and is
    left out as common_fit_params leaves it out. These, and --embedding, --rerank and --pooling (which
    llama-fit-params does not take), fit as llama-server fits (--server), and then print
    llama-server's command line too.

    \b
    A llama-server command line as it is:  schedplan fit -- llama-server -m MODEL -c 32768 ...
    llama-server's whole argument set is read as llama-server reads it (with the LLAMA_ARG_*
    variables, ~/.config/llama.cpp/config.ini, and its defaults) and fitted as --server fits:
    memory flags are planned (the projector's and the speculative decoding's flags included), other
    flags accepted and ignored, unknown ones refused. The answer is that command with what fit
    adds. Router mode (--models-dir, --models-preset) fits each model, with its projector and
    draft, as the router would start it.

    \b
    Several models: MODELs, a DIR (its .gguf files and subfolders, as llama-server's --models-dir
    reads them; their projectors and drafts count in router mode), several -hf, or router mode.
    The projector, draft and speculative flags apply to each (a projector whose output is not a
    model's embedding size is that model's error, as llama-server refuses it). Each is fitted in a
    process pool over the cores, then ranked: all on the GPUs, GPU + CPU, CPU only, does not fit
    (nor when the CPU part exceeds the host's available RAM, which llama.cpp's fit does not check),
    larger models first. --json prints a list: per model what --json prints for it alone, or its
    `model` and `error`.

    Mirrors common/fit.cpp step by step on planned memory. Only what llama.cpp would change is
    changed: -c when not given (down to -fitc), then -ngl, -ts and, for mixture-of-experts models,
    -ot patterns that keep experts on the CPU. A flag you set (-ngl, -ts, -ot, -cmoe) stays.

    Exit status, one model: 0 it fits, 1 it cannot fit (common_params_fit_status), 2 an error.
    Several: 0 when at least one fits, else 1.

    Example: schedplan fit model.gguf --device cuda:24GiB:cc=8.9 -fitt 512
    """
    from ..planner.devices import parse_size

    ctx = click.get_current_context()
    is_server = bool(models) and Path(models[0]).name in SERVER_NAMES
    with fail_cleanly():
        host_total = parse_size(host_memory) if host_memory else None
        if is_server:
            extra = given_options(SERVER_FORM_OPTIONS)
            if extra:
                raise click.UsageError("with `-- llama-server ARGS`, give the model, plan and fit flags after "
                                       "llama-server, as llama-server takes them; before it only --device, --rpc, "
                                       f"--rpc-memory, --host-memory and --json (got {' '.join(extra)})")
            jobs, single = server_jobs(models[0], list(models[1:]), params, host_total)
        else:
            c_given = ctx.get_parameter_source("n_ctx") == ParameterSource.COMMANDLINE
            # -c 0 asks for the full training context: fit may not reduce it (common/arg.cpp, --ctx-size)
            n_ctx_min = UINT32_MAX if c_given and params.n_ctx == 0 else fit_ctx & UINT32_MAX
            params, available = machine_params(params, host_total)
            # llama-fit-params takes neither --embedding, --rerank nor --pooling (common/arg.cpp gives them
            # to LLAMA_EXAMPLE_SERVER, not FIT_PARAMS): a context computing embeddings is llama-server's
            as_server = server or mmproj is not None or spec.draft_path is not None or spec.types != ("none",) \
                or params.embeddings or params.pooling_type != "unspecified"
            base = Job("", "", params, params.n_ctx == 0, n_ctx_min, fit_target, host_total, available,
                       mmproj=mmproj, spec=spec, as_server=as_server,
                       n_parallel_given=ctx.get_parameter_source("n_seq_max") == ParameterSource.COMMANDLINE,
                       server_argv=server_flags(ctx.command, ctx.meta.get("argv", [])))
            jobs = model_jobs(base, models, model_urls, hf_repos, hf_file, ctx.meta.get(MMPROJ_AUTO))
            single = len(models) + len(model_urls) + len(hf_repos) == 1 and not (models and Path(models[0]).is_dir())
    if not jobs:
        die("no model to fit: give MODEL, a DIR holding .gguf files, -mu or -hf, or llama-server's -m, -mu, -hf, "
            "--models-dir or --models-preset")
    if single:
        report = run_job(jobs[0])
        if "error" in report:
            die(report["error"])
        click.echo(json.dumps(report, indent=1) if as_json else render(report))
        raise SystemExit(0 if report["status"] == "success" else 1)
    reports = sorted(run_jobs(jobs, progress=sys.stderr.isatty() and not as_json), key=rank_key)
    click.echo(json.dumps(reports, indent=1) if as_json else render_ranking(reports))
    raise SystemExit(0 if any(r.get("status") == "success" and r["host_ram"]["fits"] is not False
                              for r in reports) else 1)


def given_options(allowed: set[str]) -> list[str]:
    """The options given on the command line other than the allowed ones (their first flags)."""
    ctx = click.get_current_context()
    return [p.opts[0] for p in ctx.command.params if isinstance(p, click.Option) and p.name not in allowed
            and ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]


# --- the models and their parameters ----------------------------------------------------------------

def host_available() -> Optional[int]:
    from ..backends.detect import host_memory
    return host_memory()[1]


def ask_rpc_servers(params: Params) -> Params:
    """The memory of each --rpc server not declared with --rpc-memory, asked as llama.cpp asks it."""
    from ..backends.rpc import RPCUnreachable, get_device_memory
    from ..planner.devices import rpc_memory

    memory = rpc_memory(params)
    for i, endpoint in enumerate(params.rpc):
        if memory[i] is None:
            try:
                memory[i] = get_device_memory(endpoint)
            except RPCUnreachable as e:
                raise BadDevices(f"{e}; declare its memory with --rpc-memory {endpoint}=FREE[/TOTAL]") from None
    return dataclasses.replace(params, rpc_memory=tuple(memory))


def machine_params(params: Params, host_total: Optional[int], beside_rpc: bool = False) -> tuple[Params, Optional[int]]:
    """Params with this machine's devices unless declared, the RPC servers' memory, and the host
    memory available to the CPU part (--host-memory, else MemAvailable)."""
    from .devices import for_this_machine

    params, found = for_this_machine(params, beside_rpc)
    params = ask_rpc_servers(params)
    if host_total is not None:
        return params, host_total
    return params, found.host_available if found else host_available()


def server_flags(command: click.Command, argv: list[str]) -> list[str]:
    """fit's flags as llama-server takes them, as given and in their order (llama.cpp applies them
    in it: -mmdev must follow --rpc), less schedplan's own, the models and those fit's line sets."""
    options = {}
    for p in command.params:
        if isinstance(p, click.Option):
            for o in [*p.opts, *p.secondary_opts]:
                options[o] = (p.name, not p.is_flag)
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok == "--":
            break                       # models only from here
        if tok == "-" or not tok.startswith("-"):
            continue                    # a model
        name, takes_value = options.get(tok.split("=", 1)[0], (None, False))
        value = [] if "=" in tok or not takes_value or i >= len(argv) else [argv[i]]
        i += len(value)
        if name not in _NOT_SERVER | _MODEL | _FITTED:
            out += [tok, *value]
    return out


def named(base: Job, label: str, model: str, model_flags: list[str], error: str = "") -> Job:
    """The job of one model, and for fit's own flags the llama-server command naming it."""
    argv = None if base.server_argv is None else [*model_flags, *base.server_argv]
    return dataclasses.replace(base, label=label, model=model, error=error, server_argv=argv)


def model_jobs(base: Job, models: tuple[str, ...], urls: tuple[str, ...], repos: tuple[str, ...],
               hf_file: Optional[str], mmproj_auto=None) -> list[Job]:
    """One job per model: each MODEL, each .gguf a DIR holds (llama-server's --models-dir rules),
    each URL and each -hf repository (resolved to its file here, with its projector for
    mmproj_auto's settings; one that does not resolve is a row with the reason)."""
    from .llama_server import models_dir_presets

    if hf_file and len(repos) != 1:
        raise click.UsageError("-hff names a file of one -hf repository: give exactly one -hf with it")
    jobs = []
    for m in models:
        if Path(m).is_dir():
            for preset in models_dir_presets(m).values():
                path = preset.options["-m"][1]
                jobs.append(named(base, path, path, ["-m", path]))
        else:
            jobs.append(named(base, m, m, ["-mu" if is_url(m) else "-m", m]))
    for url in urls:
        error = "" if is_url(url) else f"{url!r} is not an http(s) URL"
        jobs.append(named(base, url, url, ["-mu", url], error))
    for repo in repos:
        jobs.append(hf_job(base, repo, hf_file or "", mmproj_auto))
    return jobs


def hf_job(base: Job, repo: str, hf_file: str, mmproj_auto=None) -> Job:
    """The job of an -hf repository: the file llama.cpp's -hf picks, and with mmproj_auto (the
    projector's settings, when -hf may pick one) the projector it picks beside it."""
    from ..planner.download import RemoteError
    from ..planner.hf import common_download_get_hf_plan

    flags = ["-hf", repo, *(["-hff", hf_file] if hf_file else [])]
    try:
        plan = common_download_get_hf_plan(repo, hf_file, download_mmproj=mmproj_auto is not None)
    except (RemoteError, OSError) as e:
        return named(base, repo, "", flags, str(e))
    job = named(base, repo, plan.primary.url, flags)
    if plan.mmproj is not None:
        job = dataclasses.replace(job, mmproj=dataclasses.replace(mmproj_auto, path=plan.mmproj.url), as_server=True)
    return job


def server_jobs(argv0: str, argv: list[str], declared: Params, host_total: Optional[int],
                for_fit: bool = True) -> tuple[list[Job], bool]:
    """The jobs of a llama-server command line: its model, or in router mode (no model, with
    --models-dir or --models-preset) each model as the router would start it. True: one model.
    for_fit: a command with --fit off is refused (it would not fit)."""
    from . import llama_server as ls

    cmd = ls.parse(argv)
    p = cmd.params
    if p.model or p.model_url or p.hf_repo:
        return [server_job(argv0, argv, cmd, declared, host_total, for_fit)], True
    if not (p.models_dir or p.models_preset):
        return [], True
    jobs = []
    for name, child_argv in ls.router_children(argv, p).items():
        try:
            child = ls.parse(child_argv)
        except BadDevices as e:
            jobs.append(Job(name, "", declared, False, 0, None, host_total, None, error=str(e)))
            continue
        try:
            job = server_job(argv0, child_argv, child, declared, host_total, for_fit)
        except BadDevices as e:
            jobs.append(Job(name, "", declared, False, 0, None, host_total, None, error=str(e)))
            continue
        jobs.append(dataclasses.replace(job, label=f"{name}: {job.label}" if job.label != name else name))
    return jobs, False


def server_job(argv0: str, argv: list[str], cmd, declared: Params, host_total: Optional[int],
               for_fit: bool = True) -> Job:
    """A job for one llama-server command: its model, its memory flags as Params on this machine's
    devices (or the declared ones), filtered by its -dev, with its --rpc servers; its projector and
    speculative decoding; fitted as llama-server fits (its -np default among them)."""
    import os

    from . import llama_server as ls
    from ..planner.download import RemoteError

    p = cmd.params
    if for_fit and not p.fit:
        raise BadDevices("llama-server runs these flags as given (--fit off): `schedplan reserve -- llama-server "
                         "...` shows what they use on each device")
    if p.hf_token:
        os.environ["HF_TOKEN"] = p.hf_token       # -hft: the token llama.cpp sends with -hf
    if declared.rpc and list(declared.rpc) != p.rpc:
        raise BadDevices(f"--rpc {','.join(declared.rpc)} before llama-server declares other servers than its own "
                         f"--rpc {','.join(p.rpc) or '(none)'}")
    params = dataclasses.replace(ls.to_params(p, declared.devices), rpc_memory=declared.rpc_memory if declared.rpc
                                 else (), header_cache=declared.header_cache)
    params, available = machine_params(params, host_total, beside_rpc=True)
    params = ls.select_devices(params, p.devices)
    mmproj, mmproj_auto = ls.to_mmproj(p)
    draft, error = p.draft_model or None, ""
    if p.draft_hf_repo:
        from ..planner.hf import common_download_get_hf_plan
        try:
            draft = common_download_get_hf_plan(p.draft_hf_repo, p.draft_model).primary.url
        except (RemoteError, OSError) as e:
            error = f"-hfd {p.draft_hf_repo}: {e}"
    base = Job("", "", params, p.n_ctx == 0, p.fit_min_ctx, p.fit_targets, host_total, available,
               command=[argv0, *argv], server_given=frozenset(p.given) | ({"-c"} if p.n_ctx_set else set()),
               mmproj=mmproj, spec=ls.to_spec(p, draft), as_server=True, n_parallel_given=p.n_parallel >= 0)
    if p.model:
        return dataclasses.replace(base, label=p.model, model=p.model, error=error)
    if p.model_url:
        error = error or ("" if is_url(p.model_url) else f"-mu {p.model_url!r} is not an http(s) URL")
        return dataclasses.replace(base, label=p.model_url, model=p.model_url, error=error)
    job = hf_job(base, p.hf_repo, p.hf_file, mmproj_auto)
    return dataclasses.replace(job, error=job.error or error)


# --- the report -------------------------------------------------------------------------------------

def server_fit_args(result) -> str:
    """The fitted flags for llama-server's command line: llama-fit-params' line, but with -ts over
    every device of the model. llama-fit-params drops the trailing zeros of -ts, and with none left
    prints no -ts at all: pasted, "-ngl N" alone splits the layers over all devices by their memory,
    not as fit placed them."""
    from ..planner.fit import fit_args

    p, m = result.params, result.final or result.initial
    nd = len(m.devs) if m else 0
    if nd < 2 or not p.tensor_split or any(p.tensor_split[nd:]):
        return result.args
    line = fit_args(dataclasses.replace(p, tensor_split=()))
    ts = " -ts " + ",".join(str(int(x)) for x in (list(p.tensor_split[:nd]) + [0.0] * nd)[:nd])
    head, sep, tail = line.partition(' -ot "')
    return head + ts + (sep + tail if sep else "")


def fit_report(fitted: FittedJob, job: Job) -> dict:
    """The JSON-able result: the line, the status and the fitted parameters' memory per device; then
    how the model runs (all on the GPUs, GPU + CPU, CPU, not at all), the largest context with
    everything on the GPUs, and whether the host's RAM holds the CPU part. Fitted as llama-server:
    the command to paste, the projector, and what the model is then loaded with."""
    from ..planner.fit import describe_placement

    result = fitted.result
    m = result.final or result.initial
    devices = []
    margins = result.margins
    for i, name in enumerate(m.devs + ["Host"]):
        d = m.dmds[i]
        row = {"name": name, "total": d.total, "free": d.free, "model": d.model, "context": d.context,
               "compute": d.compute, "projected_free": d.free - d.used()}
        if i < len(m.devs):
            row["target"] = margins[i]
        devices.append(row)
    # the CPU part: every weight not on a device (CPU_REPACK included), the host's context and compute
    host = m.dmds[-1]
    needed = m.model_bytes - sum(d.model for d in m.dmds[:-1]) + host.context + host.compute
    available = job.host_available
    if result.status != 0:
        offload = "none"
    elif not m.devs or all(d == "CPU" for d in m.layer_devices):
        offload = "cpu"
    elif "CPU" in m.layer_devices or result.params.tensor_overrides or not result.params.offload_kqv:
        offload = "partial"
    else:
        offload = "full"
    report = {"schema": "schedplan.fit/1", "model": job.label, "arch": m.arch, "model_bytes": m.model_bytes,
              "status": STATUS[result.status], "args": result.args if result.status == 0 else None,
              "message": result.message or None, "n_ctx": result.params.n_ctx, "devices": devices,
              "placement": describe_placement(m, result.params.tensor_overrides) if result.final else [],
              "log": result.log, "measured_for": "fitted parameters" if result.final else "initial parameters",
              "offload": offload, "max_ctx_full_offload": result.offload_ctx,
              "host_ram": {"needed": needed, "available": available,
                           "fits": None if available is None else needed <= available}}
    if fitted.mmproj is not None:
        report["projector"] = fitted.mmproj.summary()
    if job.command is not None:
        from .llama_server import fitted_command
        report["command"] = fitted_command(job.command, server_fit_args(result), job.server_given) \
            if result.status == 0 else None
    elif job.as_server and job.server_argv is not None and result.status == 0:
        report["server_args"] = shlex.join(["llama-server", *job.server_argv]) + " " + server_fit_args(result)
    if fitted.loaded is not None:
        report.update(fitted.loaded)
    return report


def render(report: dict) -> str:
    if report["status"] != "success":
        first = [f"fit failed: {report['message']}"]
    elif report.get("command"):
        first = [shlex.join(report["command"])]
    else:
        first = [report["args"]] + ([report["server_args"]] if report.get("server_args") else [])
    out = [*first, *(f"llama.cpp warns: {w}" for w in report.get("warnings", [])), ""]
    rows = [[d["name"], d["total"] // MiB, d["free"] // MiB, d["model"] // MiB, d["context"] // MiB,
             d["compute"] // MiB, d["projected_free"] // MiB, d["target"] // MiB if "target" in d else ""]
            for d in report["devices"]]
    out.append(f"memory [MiB], {report['measured_for']}:")
    out.append(tabulate(rows, headers=["device", "total", "free", "model", "context", "compute", "projected free",
                                       "target"], disable_numparse=True, stralign="right"))
    if report["placement"]:
        out += ["", "where the weights go:"] + [f"  - {line}" for line in report["placement"]]
    out += ["", "what fit did:"] + [f"  - {line}" for line in report["log"]]
    ram = report["host_ram"]
    ctx = report["max_ctx_full_offload"]
    out += ["", f"runs: {OFFLOAD_WORDS[report['offload']]}"
            + (f"; all on the GPUs up to -c {ctx} with these flags" if ctx is not None else "")]
    if ram["available"] is not None:
        verdict = "fits" if ram["fits"] else "does NOT fit (llama.cpp's fit does not check the host's RAM)"
        out.append(f"host RAM: the CPU part needs {ram['needed'] // MiB} MiB of {ram['available'] // MiB} MiB "
                   f"available: {verdict}")
    if "after_startup" in report:
        from .reserve import after_startup_section
        a = report["after_startup"]
        out += ["", f"after startup: not planned: {a['error']}" if "error" in a else after_startup_section(a)]
    return "\n".join(out)
