"""Live differential tests: the plan and a real llama.cpp run side by side, every field and every
tensor of the pp graph (buffer, offset, size). RPC cases use servers the tests start on loopback.
"""
from __future__ import annotations


import pytest

pytest.importorskip("llama_cpp", reason="live tests need llama-cpp-python (the `run` extra)")

from fixtures.make_gguf import header_path, model_path  # noqa: E402
from schedplan.backends.llama_cpp_run import run  # noqa: E402
from schedplan.cli.options import parse_params  # noqa: E402
from schedplan.planner.diff import diff, first_tensor_mismatch, tensor_summary  # noqa: E402
from schedplan.planner.reserve import reserve  # noqa: E402

pytestmark = pytest.mark.live

SMOLLM2 = "smollm2-135m-instruct-q4_1"


def _assert_plan_equals_real(plan_model: str, real_model: str, flags: list[str]) -> dict:
    params = parse_params(flags)
    real = run(real_model, params, tensors=True)
    plan = reserve(plan_model, params, tensors=True)
    unequal = [r for r in diff(plan, real) if not r.ok]
    assert unequal == [], unequal
    assert first_tensor_mismatch(plan, real) is None, first_tensor_mismatch(plan, real)
    summary = tensor_summary(plan, real)
    assert summary["matched"] == summary["real"] == summary["equal"] > 0, summary
    return summary


def test_smollm2_defaults_every_tensor():
    """The engine issue's bar: every tensor offset of SmolLM2's pp graph at the defaults."""
    path = str(model_path(SMOLLM2))
    summary = _assert_plan_equals_real(path, path, [])
    assert summary["real"] >= 1000


@pytest.mark.parametrize("flags", [["-c", "1000", "-ub", "256", "-np", "4", "-fa", "off"],
                                   ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"]])
def test_repacked_fixture(flags):
    """A Q4_0 fixture (CPU_REPACK weights), planned from its header alone."""
    _assert_plan_equals_real(str(header_path("tiny-llama-untied")), str(model_path("tiny-llama-untied")), flags)


def test_one_rpc_server(rpc_endpoints):
    path = str(model_path(SMOLLM2))
    _assert_plan_equals_real(path, path, ["-c", "2048", "-ngl", "15", "--rpc", rpc_endpoints[0]])


def test_two_rpc_servers_pipeline_parallel(rpc_endpoints):
    path = str(model_path(SMOLLM2))
    flags = ["-c", "2048", "-ngl", "99", "--rpc", rpc_endpoints[0], "--rpc", rpc_endpoints[1]]
    _assert_plan_equals_real(path, path, flags)
    assert reserve(path, parse_params(flags))["params"]["sched_copies"] == 4
