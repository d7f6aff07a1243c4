"""Bad input becomes one clear line on stderr and a non-zero exit, never a traceback."""
from __future__ import annotations

import contextlib

import click

from schedplan.planner.cparams import BadParams
from schedplan.planner.devices import BadDevices
from schedplan.planner.gguf import GGUFError
from schedplan.planner.hparams import UnsupportedModel

USER_ERRORS = (GGUFError, UnsupportedModel, BadParams, BadDevices, FileNotFoundError, IsADirectoryError,
               PermissionError)


@contextlib.contextmanager
def fail_cleanly():
    try:
        yield
    except USER_ERRORS as e:
        message = str(e)
        if isinstance(e, OSError) and e.filename:
            message = f"{e.filename}: {e.strerror}"
        click.echo(f"error: {message}", err=True)
        raise SystemExit(2)
