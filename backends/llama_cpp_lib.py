"""Where llama-cpp-python is and where it loads llama.cpp's libraries from, without importing it
(nor the executor, llama_cpp_run.py): device detection asks this on every plan."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

MISSING_MESSAGE = ("schedplan run needs the 'run' extra: "
                   "CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install 'schedplan[run]'")


class RunError(Exception):
    """llama.cpp refused or failed to run the configuration (one line, for the user)."""


class LlamaCppMissing(RunError):
    def __init__(self, message: str = MISSING_MESSAGE):
        super().__init__(message)


def available() -> bool:
    """Whether llama_cpp (llama-cpp-python) is installed; does not import it."""
    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        return False


def lib_dir() -> Path:
    """Where llama_cpp loads libllama.so.0 and libggml*.so.0 from: LLAMA_CPP_LIB_PATH when set (a
    llama.cpp build of one's own, as llama_cpp/llama_cpp.py reads it), else the package's llama_cpp/lib."""
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        return Path(os.environ["LLAMA_CPP_LIB_PATH"])
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        raise LlamaCppMissing()
    return Path(spec.origin).parent / "lib"
