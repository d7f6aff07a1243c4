"""The `schedplan` console script (pyproject's [project.scripts]): the click group, plus what only a
process of its own can do for speed."""
import atexit
import os
import sys
from typing import NoReturn, Optional, Union

from . import detection


def main() -> None:
    # a command that will plan for this machine's devices starts detecting them now, before click
    # and the planner import (cli/detection.py)
    if detection.may_plan_for_this_machine(sys.argv[1:]):
        detection.start()
    from .main import cli
    try:
        cli()
    except SystemExit as e:
        exit_without_teardown(e.code)


def exit_without_teardown(code: Optional[Union[int, str]]) -> NoReturn:
    """Exit with the command's status, less the interpreter's teardown: freeing every module and
    the plan's graphs (tens of thousands of objects) is about a tenth of a plan's wall time
    (bench/README.md). Exit handlers run and the output is flushed first; a status that is a
    message, or output that cannot be flushed (a closed pipe), exits as Python exits. No command
    leaves a thread of its own running (rank's process pool ends with its with-block; detection's
    thread is a daemon)."""
    if code is not None and not isinstance(code, int):
        raise SystemExit(code)
    atexit._run_exitfuncs()     # what the interpreter's exit runs first (no public call does it)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(code) from None
    os._exit(code or 0)
