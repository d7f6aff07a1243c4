"""Shared test setup: the repository root is importable (fixtures/ holds the generator and goldens)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest


@pytest.fixture(scope="session")
def rpc_endpoints():
    """Two ggml RPC servers (CPU backend behind each) on 127.0.0.1 for the whole session, as
    endpoints "127.0.0.1:PORT"; stopped at the end. Needs llama-cpp-python built with RPC.
    A server serves one client at a time: schedplan.backends.llama_cpp_run.run() uses them from a
    child process that exits after each run, so tests can share them."""
    from schedplan.backends.llama_cpp_run import available
    from schedplan.backends.rpc_server import rpc_servers

    if not available():
        pytest.skip("llama_cpp (the `run` extra) is not installed")
    with rpc_servers(2) as endpoints:
        yield endpoints
