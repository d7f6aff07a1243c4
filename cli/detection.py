"""This machine's devices, detected once per process in a thread started as early as it can be.

Detecting runs vendor tools in processes of their own (vulkaninfo, nvidia-smi: 30 ms or more
each), which can run while click and the planner import and the header is read. This module
imports nothing heavy, so the console script (cli/console.py) starts the thread before click.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..backends.detect import Detection

_detection: Optional[tuple[Optional[threading.Thread], list[Detection]]] = None

# the commands that plan for this machine's devices unless a word declares devices (--device,
# --rpc, --rpc-memory, with =VALUE or not) or the command is llama-server's (after `--`) or help
PLANNING_COMMANDS = ("reserve", "fit")
DECLARING = ("--device", "--rpc")


def may_plan_for_this_machine(argv: list[str]) -> bool:
    """A cheap look at the words of a command line before click parses them: whether it may plan
    for this machine's devices. It decides only when detection starts: a command detects when its
    parsed parameters need it (cli/devices.needs_detection) and ignores a detection they do not."""
    return (bool(argv) and argv[0] in PLANNING_COMMANDS and "--" not in argv and "--help" not in argv
            and not any(word.startswith(DECLARING) for word in argv[1:]))


def start() -> None:
    """Detect in a thread, once per process."""
    global _detection
    if _detection is not None:
        return
    found: list[Detection] = []

    def run() -> None:
        from ..backends.detect import detect
        try:
            found.append(detect())
        except Exception:    # detect_once runs it again in the caller, where the error is reported
            pass

    thread = threading.Thread(target=run, name="schedplan-detect", daemon=True)
    thread.start()
    _detection = (thread, found)


def detect_once() -> Detection:
    """This machine's devices, detected once per process (router mode fits many models)."""
    from ..backends.detect import detect
    global _detection
    if _detection is None:
        _detection = (None, [detect()])
    thread, found = _detection
    if thread is not None:
        thread.join()
    if not found:
        found.append(detect())
    return found[0]


def forget() -> None:
    """Detect again at the next detect_once (tests change the machine between calls)."""
    global _detection
    _detection = None
