"""Bad input becomes one clear line on stderr and a non-zero exit, never a traceback.

Two paths lead there:
- errors found while planning (unreadable file, bad GGUF, unsupported model, impossible parameters)
  raise one of USER_ERRORS; the command body runs inside fail_cleanly(), which prints
  "error: <message>" and exits with status 2;
- errors click finds while parsing the command line (a directory for MODEL, -np 300, an unknown
  option) never reach the command body: click prints its usage, a hint and "Error: ..." on three
  lines. For schedplan's commands, click_usage_error_one_line() (installed below, on import of this
  module, which every command imports) prints them the same way: "error: <message> (see
  'schedplan reserve --help')", exit status 2 (click's usage-error status) unchanged.
"""
from __future__ import annotations

import contextlib
from typing import NoReturn

import click

from ..planner.cparams import BadParams
from ..planner.devices import BadDevices
from ..planner.ggml import GGMLAbort
from ..planner.gguf import GGUFError, shown
from ..planner.hparams import UnsupportedModel

# NotImplementedError: a configuration schedplan does not model yet (it says which), never a guess
# OSError: a file that cannot be opened, read or written (missing, a directory, no permission, a
# name too long, a symlink loop, ...)
USER_ERRORS = (GGUFError, UnsupportedModel, BadParams, BadDevices, GGMLAbort, NotImplementedError, OSError)


MAX_MESSAGE = 2000       # characters of one error line


def one_line(message: str) -> str:
    """A message as one line of a readable length: names and values read from a file may hold
    newlines, control characters or a megabyte of text."""
    return shown(message, MAX_MESSAGE)


def die(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2."""
    click.echo(f"error: {one_line(message)}", err=True)
    raise SystemExit(2)


@contextlib.contextmanager
def fail_cleanly():
    try:
        yield
    except USER_ERRORS as e:
        if isinstance(e, OSError) and e.filename:
            die(f"{e.filename}: {e.strerror}")
        if isinstance(e, NotImplementedError):
            die(f"the planner does not support this yet: {e}")
        die(str(e))


def _is_schedplan_command(ctx: click.Context | None) -> bool:
    """Whether the command line being parsed is schedplan's (the root command is defined in schedplan)."""
    if ctx is None:
        return False
    callback = ctx.find_root().command.callback
    return getattr(callback, "__module__", "").startswith("schedplan.")


_click_usage_error_show = click.exceptions.UsageError.show


def click_usage_error_one_line(self: click.exceptions.UsageError, file=None) -> None:
    """UsageError.show for schedplan's commands: one "error:" line on stderr; other click programs
    in the same process keep click's own output."""
    if not _is_schedplan_command(self.ctx):
        return _click_usage_error_show(self, file)
    message = one_line(self.format_message().replace("\n", " ").strip())
    ctx = self.ctx
    if ctx.command.get_help_option(ctx) is not None:
        message += f" (see '{ctx.command_path} --help')"
    click.echo(f"error: {message}", file=file, err=file is None, color=ctx.color)


click.exceptions.UsageError.show = click_usage_error_one_line
