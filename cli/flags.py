"""The plan flags a command was given, as llama.cpp-style arguments that parse_params reads back."""
from __future__ import annotations

import shlex
import click
from click.core import ParameterSource

from .options import plan_options

PLAN_OPTIONS = [p for p in click.command()(plan_options(lambda params: None)).params if isinstance(p, click.Option)]


def given_flags() -> list[str]:
    """The plan flags on the current command line (short names, in plan_options' order)."""
    ctx = click.get_current_context()
    out: list[str] = []
    for option in PLAN_OPTIONS:
        if ctx.get_parameter_source(option.name) is not ParameterSource.COMMANDLINE:
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
