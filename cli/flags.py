"""The plan flags a command was given, as llama.cpp-style arguments that parse_params reads back."""
from __future__ import annotations

import shlex
import click
from click.core import ParameterSource

from .options import POOLING_ORDER, plan_options

PLAN_OPTIONS = [p for p in click.command()(plan_options(lambda params: None)).params if isinstance(p, click.Option)]


def given_flags() -> list[str]:
    """The plan flags on the current command line (short names, in plan_options' order; --pooling and
    --rerank each time given, in the order given, where --pooling stands: the later one's pooling wins)."""
    ctx = click.get_current_context()
    out: list[str] = []
    for option in PLAN_OPTIONS:
        if option.name == "pooling_type":
            for name, value in ctx.meta.get(POOLING_ORDER, []):
                out += ["--rerank"] if name == "rerank" else ["--pooling", value]
            continue
        if option.name == "rerank" or ctx.get_parameter_source(option.name) is not ParameterSource.COMMANDLINE:
            continue
        value, flag = ctx.params[option.name], option.opts[0]
        if option.is_flag:
            out.append(flag)
        elif option.multiple:
            for v in value:
                out += [flag, v]
        else:
            out += [flag, str(value)]
    return out


def label(model: str, flags: list[str]) -> str:
    return shlex.join([model, *flags])
