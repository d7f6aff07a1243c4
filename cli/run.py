"""`schedplan run`: the same configuration in real llama.cpp (llama-cpp-python), as ground truth."""
from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import TYPE_CHECKING, Optional

import click

from .errors import die, fail_cleanly
from .options import draft_options, model_options, plan_options
from ..planner.download import is_url
from ..planner.params import Params

if TYPE_CHECKING:
    from ..planner.fit import ExtraModel
    from ..planner.server import SpecParams


def local_rpc_option(func):
    return click.option("--local-rpc", "local_rpc", type=click.IntRange(min=0, max=16), default=0,
                        help="Start N ggml RPC servers (CPU backend) on 127.0.0.1 for this run and use them "
                             "as devices, after any --rpc.")(func)


@contextlib.contextmanager
def with_local_rpc(params: Params, n: int):
    """params with n freshly started loopback RPC servers appended to params.rpc."""
    if not n:
        yield params
        return
    from ..backends.rpc_server import rpc_servers
    try:
        servers = rpc_servers(n)
        endpoints = servers.__enter__()
    except RuntimeError as e:
        raise click.ClickException(str(e))
    try:
        yield dataclasses.replace(params, rpc=tuple(params.rpc) + tuple(endpoints))
    finally:
        servers.__exit__(None, None, None)


def local_model(model: str) -> str:
    """The model as llama.cpp loads it here: a local path; a URL (MODEL, -mu, -hf) is refused, not downloaded."""
    if is_url(model):
        command = click.get_current_context().info_name
        die(f"{model}: schedplan {command} runs the model in real llama.cpp, which loads the weights from disk, "
            f"and downloads nothing: download the file (a split: all its parts, side by side) and give its "
            f"path as MODEL; schedplan reserve plans it from the header alone")
    return model


def with_draft(model: str, params: Params, draft: Optional["SpecParams"]) -> tuple[Params, Optional["ExtraModel"]]:
    """The model's parameters and the draft model's (llama-server's speculative_params: the draft's
    own -ngld, -ctkd, -ctvd; one output per slot) for -md, else params as given and no draft."""
    if draft is None:
        return params, None
    from ..planner.server import speculative_params
    return speculative_params(model, params, draft)


def real_run(model: str, params: Params, tensors: bool, log_path: str | None = None,
             draft: Optional["ExtraModel"] = None) -> dict:
    """run() with every failure turned into one line on stderr and a non-zero exit."""
    from ..backends import llama_cpp_run as lcr

    try:
        return lcr.run(model, params, tensors=tensors, log_path=log_path,
                       draft=(draft.path, draft.params) if draft is not None else None)
    except lcr.LlamaCppMissing as e:
        click.echo(str(e), err=True)
        raise SystemExit(2)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        click.echo(f"error: {e.filename}: {e.strerror}", err=True)
        raise SystemExit(2)
    except NotImplementedError as e:
        click.echo(f"error: not supported by schedplan run: {e}", err=True)
        raise SystemExit(2)
    except lcr.RunError as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(1)


def exact_bytes_table(result: dict) -> str:
    """Bytes per buffer type and kind, unrounded (the MiB columns above are rounded)."""
    from tabulate import tabulate

    kinds = [("model", "model_buffers"), ("KV", "kv_buffers"), ("output", "output_buffers"),
             ("compute", "compute_buffers")]
    bufts = sorted({b for _, key in kinds for b in result.get(key, {})})
    rows = [[b, *(f"{result.get(key, {}).get(b, 0):,}" for _, key in kinds)] for b in bufts]
    return tabulate(rows, headers=["buffer type", *(f"{k} bytes" for k, _ in kinds)], disable_numparse=True,
                    colalign=("left",) + ("right",) * len(kinds))


@click.command("run")
@model_options()
@plan_options
@draft_options
@local_rpc_option
@click.option("--tensors", is_flag=True,
              help="Also decode the reserve's pp ubatch once and list every tensor with its buffer and offset.")
@click.option("--json", "as_json", is_flag=True, help="Print the machine-readable result.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="Write llama.cpp's whole log to this file.")
def run(model: str, params: Params, draft, local_rpc: int, tensors: bool, as_json: bool, log_path: str | None) -> None:
    """Run MODEL in real llama.cpp with these flags and report what it reserved, byte for byte.

    Same flags and the same report as `schedplan reserve`, measured instead of planned: compute,
    KV, output and model buffers per buffer type, pp/tg graph nodes and splits, and the effective
    parameters. Needs llama-cpp-python 0.3.36 built with RPC (the `run` extra).

    MODEL must be on disk: llama.cpp loads its weights, and schedplan downloads no model. A model
    given as a URL, by -mu or by -hf stops the run with one line naming the file to download.

    Example: schedplan run model.gguf -c 2048 -ub 512 --local-rpc 1 -ngl 15
    """
    from ..backends import llama_cpp_run as lcr

    model = local_model(model)
    if not lcr.available():
        click.echo(lcr.MISSING_MESSAGE, err=True)
        raise SystemExit(2)
    with with_local_rpc(params, local_rpc) as p:
        with fail_cleanly():
            p, extra = with_draft(model, p, draft)
        result = real_run(model, p, tensors, log_path, extra)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    from .reserve import render
    click.echo(render(result))
    click.echo("")
    click.echo(exact_bytes_table(result))
    failed = [k for k, v in result.get("checks", {}).items() if v is False]
    click.echo("")
    click.echo("instrument checks: " + ("all passed" if not failed else "FAILED: " + ", ".join(failed)))
