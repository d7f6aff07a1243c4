"""The `schedplan` console script (pyproject's [project.scripts]): the click group, plus what only a
process of its own can do for speed."""
import sys

from . import detection


def main() -> None:
    # a command that will plan for this machine's devices starts detecting them now, before click
    # and the planner import (cli/detection.py)
    if detection.may_plan_for_this_machine(sys.argv[1:]):
        detection.start()
    from .main import cli
    cli()
