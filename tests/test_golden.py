"""Golden tests: the plan must equal what real llama.cpp recorded, byte for byte.

The goldens under fixtures/golden/ were recorded by `python fixtures/golden.py record` from real
runs (llama-cpp-python 0.3.36); the planner reads only the GGUF header, so these tests run on
header-only copies of the fixtures and need no llama.cpp.
"""
from __future__ import annotations

import functools

import pytest

from fixtures.golden import ADAPTER_REFUSED, canonical_endpoint, lavapipe_flags, load_goldens, lora_flags
from fixtures.make_gguf import header_path
from schedplan.cli.options import parse_params
from schedplan.planner.reserve import reserve
from schedplan.planner.server import SpecParams, draft_types_from_gguf, speculative_params

ALL = load_goldens()
GOLDENS = [g for g in ALL if "refused" not in g["result"]]
REFUSED = [g for g in ALL if "refused" in g["result"]]
FIELDS = ["compute_buffers", "kv_buffers", "output_buffers", "model_buffers"]

@pytest.fixture(params=GOLDENS, ids=[g["case"]["id"] for g in GOLDENS])
def golden(request):
    return request.param


def _plan(g: dict) -> dict:
    return _plan_case(g["case"]["id"])


@functools.lru_cache(maxsize=None)
def _plan_case(case_id: str) -> dict:
    """One plan per golden, shared by the tests that compare its parts; a draft model's context
    (-md) planned beside the model's, with the draft's parameters as llama-server derives them."""
    case = next(g["case"] for g in GOLDENS if g["case"]["id"] == case_id)
    model, params, draft = str(header_path(case["model"])), parse_params(_flags(case)), None
    if case.get("draft"):
        spec = draft_types_from_gguf(SpecParams(draft_path=str(header_path(case["draft"]))))
        params, draft = speculative_params(model, params, spec)
    return reserve(model, params, draft=draft)


def _flags(case: dict) -> list[str]:
    """The case's flags with its LoRA adapters, RPC servers and lavapipe devices, as recorded."""
    return (list(case["flags"]) + lora_flags(case["model"], tuple(tuple(x) for x in case.get("lora", ())),
                                             case.get("cvec", ""))
            + [x for i in range(case["n_rpc"]) for x in ("--rpc", canonical_endpoint(i))]
            + lavapipe_flags(case.get("n_vulkan", 0)))


def _contexts(golden) -> list[tuple[str, dict, dict]]:
    """(name, plan, real) of the model's context, and of the draft's where the case has one."""
    plan, real = _plan(golden), golden["result"]
    out = [("model", plan, real)]
    if golden["case"].get("draft"):
        out.append(("draft", plan["draft"], real["draft"]))
    return out


def test_buffers_equal_llama_cpp(golden):
    for ctx, plan, real in _contexts(golden):
        for field in FIELDS:
            assert plan[field] == real[field], f"{ctx}: {field}"


def test_graphs_equal_llama_cpp(golden):
    for ctx, plan, real in _contexts(golden):
        for name in ("pp", "tg"):
            for key in ("nodes", "splits"):
                assert plan["graphs"][name][key] == real["graphs"][name][key], f"{ctx}: {name}.{key}"


def test_effective_params_equal_llama_cpp(golden):
    for ctx, plan, real in _contexts(golden):
        for key in ("n_ctx", "n_ctx_seq", "n_batch", "n_ubatch", "flash_attn", "sched_copies"):
            assert plan["params"][key] == real["params"][key], f"{ctx}: {key}"


LORA_GOLDENS = [g for g in GOLDENS if g["case"].get("lora")]


@pytest.mark.parametrize("golden", LORA_GOLDENS, ids=[g["case"]["id"] for g in LORA_GOLDENS])
def test_lora_equals_llama_cpp(golden):
    """The LoRA adapters' buffers (per adapter and buffer type, read from llama_adapter_lora::bufs),
    whether they were applied, and the first reservation's compute buffers the re-reserve replaced."""
    plan, real = _plan(golden)["lora"], golden["result"]["lora"]
    assert [{k: v for k, v in a.items() if k != "path"} for a in plan["adapters"]] == \
        [{k: v for k, v in a.items() if k != "path"} for a in real["adapters"]]
    for key in ("buffers", "applied", "compute_buffers_before"):
        assert plan[key] == real[key], key


CVEC_GOLDENS = [g for g in GOLDENS if g["case"].get("cvec")]


@pytest.mark.parametrize("golden", CVEC_GOLDENS, ids=[g["case"]["id"] for g in CVEC_GOLDENS])
def test_control_vector_equals_llama_cpp(golden):
    """The control vector's buffers (read from the tensors the graph adds; absent where a layer
    range leaves some unseen), its layer range, and the compute buffers the re-reserve replaced."""
    plan, real = _plan(golden)["control_vector"], golden["result"]["control_vector"]
    for key in ("applied", "layer_range", "compute_buffers_before", "buffers"):
        if key in real:
            assert plan[key] == real[key], key
    assert [f["scale"] for f in plan["files"]] == [f["scale"] for f in real["files"]]


def test_goldens_exist():
    assert len(GOLDENS) >= 100, "record the goldens: python fixtures/golden.py record"


@pytest.mark.parametrize("golden", REFUSED, ids=[g["case"]["id"] for g in REFUSED])
def test_refused_where_llama_cpp_refuses(golden):
    """Configurations llama.cpp could not create a context for (recorded with its reason): the plan
    refuses them too, in one line and exit 2, never a plan."""
    from click.testing import CliRunner

    from schedplan.cli.main import cli
    case = golden["case"]
    draft = ["-md", str(header_path(case["draft"]))] if case.get("draft") else []
    r = CliRunner().invoke(cli, ["reserve", str(header_path(case["model"])), *_flags(case), *draft])
    assert r.exit_code == 2 and r.output.startswith("error: ") and r.output.count("\n") == 1, \
        (golden["result"]["refused"], r.output)
    reason = golden["result"]["refused"].partition(ADAPTER_REFUSED)[2]
    assert reason in r.output, (reason, r.output)      # an adapter's: llama.cpp's reason, word for word
