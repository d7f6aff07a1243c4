"""`schedplan fit` with a projector or a draft model against what the real llama-server chose
(fixtures/server_fit_golden.py): the projector's bytes added to fit's targets (by ggml's registry
index), the targets fit then worked with, whether it fit, and the context and layer placement the
model was loaded with."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures.fit_golden import canonical_endpoint  # noqa: E402
from fixtures.make_gguf import model_path  # noqa: E402
from fixtures.make_mmproj import mmproj_path  # noqa: E402
from fixtures.server_fit_golden import GOLDEN_DIR  # noqa: E402
from schedplan.cli.fit import fit  # noqa: E402
from schedplan.planner.fit import mib  # noqa: E402
from click.testing import CliRunner  # noqa: E402

GOLDENS = sorted(GOLDEN_DIR.glob("*.json"))
MiB = 1024 * 1024


def schedplan_fit(case: dict) -> dict:
    rpc = []
    for i, free in enumerate(case["devices"]):
        e = canonical_endpoint(i)
        rpc += ["--rpc", e, "--rpc-memory", f"{e}={free}MiB/{free + 2048}MiB"]
    args = [str(model_path(case["model"])), *rpc, *case["flags"], "--json"]
    if case["projector"]:
        args += ["-mm", str(mmproj_path(case["projector"]))]
    if case.get("draft"):
        args += ["-md", str(model_path(case["draft"]))]
    res = CliRunner().invoke(fit, args)
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout)


def check(report: dict, real: dict, case: dict) -> None:
    assert report["status"] == real["fit"]
    assert report["message"] == real["failure"]
    added = {m.group(2): m.group(1) for line in report["log"]
             if (m := re.match(r"projector: adding ([\d.]+) MiB to fit_params_target for device (\S+)", line))}
    assert added == real["mmproj_added"]
    devices = [d for d in report["devices"] if "target" in d]
    if real["targets_mib"]:     # fit logs its targets (int64_t / MiB) only when it has to change something
        assert {str(i): str(mib(d["free"] - d["target"])) for i, d in enumerate(devices)} == real["targets_mib"]
    # the load after fitting: its context, each layer's device, the tensors moved by -ot
    assert report["n_ctx_loaded"] == real["n_ctx"]
    assert report["layer_devices"] == real["layer_devices"]
    assert report["overrides"] == real["overrides"]
    if "context" in real:       # recorded since the embedding cases: the context's sizes and compute buffers
        assert report["context_loaded"] == real["context"]
    if "compute_mib" in real and not case["projector"] and not case.get("draft"):
        # the model's context alone (a projector's or draft's compute counts in the report's devices);
        # llama.cpp logs the buffers over 1 byte by buffer type name: RPC<i> is RPC0[<its endpoint>]
        buft = {d["name"]: "CPU" if d["name"] == "Host" else f"RPC0[{canonical_endpoint(int(d['name'][3:]))}]"
                for d in report["devices"]}
        assert {buft[d["name"]]: f"{d['compute'] / MiB:.2f}" for d in report["devices"] if d["compute"] > 1} == \
            real["compute_mib"]


@pytest.mark.parametrize("golden", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_server_fit(golden: Path):
    data = json.loads(golden.read_text())
    check(schedplan_fit(data["case"]), data["result"], data["case"])


@pytest.mark.parametrize("golden", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_server_fit_of_the_llama_server_command(golden: Path):
    """The same cases as the llama-server command lines the goldens ran (`fit -- llama-server
    ARGS`: -mm, -md and the speculative flags read from the server's own arguments)."""
    data = json.loads(golden.read_text())
    case = data["case"]
    endpoints = [canonical_endpoint(i) for i in range(len(case["devices"]))]
    declared = [x for e, free in zip(endpoints, case["devices"])
                for x in ("--rpc", e, "--rpc-memory", f"{e}={free}MiB/{free + 2048}MiB")]
    argv = ["--rpc", ",".join(endpoints), "-m", str(model_path(case["model"]))]
    if case["projector"]:
        argv += ["-mm", str(mmproj_path(case["projector"]))]
    if case.get("draft"):
        argv += ["-md", str(model_path(case["draft"]))]
    res = CliRunner().invoke(fit, [*declared, "--device", "none", "--json", "--", "llama-server", *argv, *case["flags"]])
    assert res.exit_code in (0, 1), res.output
    check(json.loads(res.stdout), data["result"], case)


@pytest.mark.parametrize("model, needle", [
    ("tiny-qwen3next-mtp", "MTP drafting (--spec-type draft-mtp) of a qwen3next model is not planned"),
    ("tiny-deepseek3-mtp", "MTP drafting (--spec-type draft-mtp) of a deepseek2 model is not planned"),
    ("tiny-nemotron-h-moe-mtp", "rollback snapshots (n_rs_seq 3, with MTP drafting) of a nemotron_h_moe model"),
    ("tiny-qwen35", "the model has no multi-token-prediction (NextN) layers"),
])
def test_unplanned_mtp_drafting_is_one_line(model, needle):
    res = CliRunner().invoke(fit, [str(model_path(model)), "--spec-type", "draft-mtp", "--host-memory", "8GiB"])
    assert res.exit_code == 2 and needle in res.stderr and res.stderr.count("\n") == 1, res.stderr


@pytest.mark.live
def test_mtp_contexts_equal_llama_cpp():
    """The two contexts MTP drafting fits, planned and created by real llama.cpp (llama-cpp-python,
    no_alloc): the main one with the NextN blocks loaded and n_rs_seq snapshots, and the MTP context
    (LLAMA_CONTEXT_TYPE_MTP) over the same weights; every measured field equal."""
    pytest.importorskip("llama_cpp")
    import dataclasses

    from schedplan.backends.llama_cpp_run import run
    from schedplan.cli.options import parse_params
    from schedplan.planner.diff import diff
    from schedplan.planner.reserve import reserve

    for name in ("tiny-qwen35-mtp", "tiny-qwen35moe-mtp"):
        path = str(model_path(name))
        for flags, kw in ((["-c", "4096", "-np", "4", "-kvu"], dict(n_rs_seq=3, n_outputs_max=16)),
                          (["-c", "8192", "-np", "1", "-fa", "off"], dict(n_rs_seq=8, n_outputs_max=9)),
                          (["-c", "4096", "-np", "4", "-kvu"], dict(ctx_type="mtp", n_outputs_max=4)),
                          (["-c", "8192", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0"], dict(ctx_type="mtp", n_outputs_max=1))):
            params = dataclasses.replace(parse_params(flags), load_mtp=True, **kw)
            unequal = [r for r in diff(reserve(path, params), run(path, params)) if not r.ok]
            assert unequal == [], (name, flags, kw, unequal)


def test_an_unknown_speculative_type_is_refused():
    res = CliRunner().invoke(fit, [str(model_path("tiny-llama")), "--spec-type", "draft-magic"])
    assert res.exit_code == 2 and "unknown speculative type: draft-magic" in res.stderr


SERVER_CASES = [p for p in GOLDENS if json.loads(p.read_text())["result"]["fit"] == "success"]


def loads_as_fitted(golden: Path, fitted_command) -> None:
    """fitted_command(case, endpoints): the llama-server command fit gives for the case, run (the
    real llama-server, against RPC servers reporting the golden's memory): it starts, and loads the
    model as the golden's llama-server --fit chose (context, each layer's device, the tensors moved)."""
    from fixtures.llama_build import bin_dir
    from fixtures.server_fit_golden import parse_log, run_server
    from schedplan.backends.rpc_server import rpc_servers

    binary = bin_dir() / "llama-server"
    if not binary.exists():
        pytest.skip(f"{binary} not built (python fixtures/llama_build.py)")
    data = json.loads(golden.read_text())
    case, real = data["case"], data["result"]
    memory = [(d * MiB, (d + 2048) * MiB) for d in case["devices"]]
    with rpc_servers(len(case["devices"]), memory=memory) as endpoints:
        command = fitted_command(case, endpoints)
        assert command[0] == "llama-server"
        text = run_server([str(binary), *command[1:], "-v", "--host", "127.0.0.1", "--port", "0"])
    for i, endpoint in enumerate(endpoints):     # device names as the golden's recorder wrote them
        text = text.replace(endpoint, canonical_endpoint(i))
    assert "llama_server: listening on" in text, text[-2000:]
    loaded = parse_log(text)
    assert (loaded["n_ctx"], loaded["layer_devices"], loaded["overrides"]) == \
        (real["n_ctx"], real["layer_devices"], real["overrides"])


def model_args(case: dict) -> list[str]:
    args = ["-m", str(model_path(case["model"]))]
    if case["projector"]:
        args += ["-mm", str(mmproj_path(case["projector"]))]
    if case.get("draft"):
        args += ["-md", str(model_path(case["draft"]))]
    return args


@pytest.mark.live
@pytest.mark.parametrize("golden", SERVER_CASES, ids=[p.stem for p in SERVER_CASES])
def test_the_printed_server_command_loads_as_fitted(golden: Path):
    """The llama-server command line fit prints (its second line), run as printed."""
    import shlex

    def printed(case: dict, endpoints: list[str]) -> list[str]:
        model, *projector_draft = model_args(case)[1:]
        res = CliRunner().invoke(fit, [model, *(x for e in endpoints for x in ("--rpc", e)), *case["flags"],
                                       *projector_draft])
        assert res.exit_code == 0, res.output
        return shlex.split(res.stdout.splitlines()[1])

    loads_as_fitted(golden, printed)


@pytest.mark.live
@pytest.mark.parametrize("golden", SERVER_CASES, ids=[p.stem for p in SERVER_CASES])
def test_the_fitted_llama_server_command_loads_as_fitted(golden: Path):
    """`fit -- llama-server ARGS`'s command to paste (the command given, then the fitted flags), run."""
    def fitted(case: dict, endpoints: list[str]) -> list[str]:
        res = CliRunner().invoke(fit, ["--device", "none", "--json", "--", "llama-server", "--rpc", ",".join(endpoints),
                                       *model_args(case), *case["flags"]])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["command"]

    loads_as_fitted(golden, fitted)


def _draft_context_log(text: str) -> dict:
    """What llama-server logged of its draft context's creation (common_speculative_init_result),
    up to its first reservation (llama_init_from_model; the speculative decoder may reserve it again
    later for backend samplers): buffers per type in MiB as logged, and the pp and tg graphs' nodes and
    splits."""
    draft = text.split("common_speculative_init_result: loading draft model", 1)[1]
    draft = draft.split("sched_reserve: reserve took", 1)[0]
    out: dict = {"model_buffers": {}, "output_buffers": {}, "kv_buffers": {}, "compute_buffers": {}}
    for key, rx in (("model_buffers", r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB"),
                    ("output_buffers", r"llama_context:\s+(\S+)  output buffer size =\s+([\d.]+) MiB"),
                    ("kv_buffers", r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB"),
                    ("compute_buffers", r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")):
        for m in re.finditer(rx, draft):
            out[key][m.group(1)] = m.group(2)
    # one count where the pp and tg graphs agree, else "pp / tg" (sched_reserve's diff)
    m = re.search(r"sched_reserve: graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?, "
                  r"splits = (\d+)(?: / (\d+))?", draft)
    nodes_pp, nodes_tg, splits_pp, splits_tg = m.groups()
    out["graph"] = {"pp": (int(nodes_pp), int(splits_pp)), "tg": (int(nodes_tg or nodes_pp), int(splits_tg or splits_pp))}
    return out


@pytest.mark.live
@pytest.mark.parametrize("model,draft,n_rpc,flags", [
    ("tiny-gemma4", "tiny-gemma4-assistant", 0, ["--spec-type", "draft-mtp", "-c", "4096"]),
    ("tiny-gemma4", "tiny-gemma4-assistant", 0, ["--spec-type", "draft-mtp", "-c", "8192", "-np", "2", "-fa", "off",
                                                 "-ub", "256"]),
    ("tiny-gemma4", "tiny-gemma4-assistant", 1, ["--spec-type", "draft-mtp", "-c", "4096", "-ngl", "99", "-ctk", "q8_0",
                                                 "-ctv", "q8_0"]),
    ("tiny-gemma4", "tiny-gemma4-assistant", 2, ["--spec-type", "draft-mtp", "-c", "2048", "-ngl", "99", "-ts", "3,1",
                                                 "-ngld", "1"]),
    ("tiny-qwen3", "tiny-dflash", 0, ["-c", "4096"]),
    ("tiny-qwen3", "tiny-dflash", 0, ["-c", "4096", "-np", "3", "-fa", "off", "-ctkd", "q8_0"]),
    ("tiny-qwen3", "tiny-dflash", 2, ["-c", "2048", "-ngl", "99", "-ts", "1,1", "-ngld", "2"]),
    ("tiny-qwen3", "tiny-dflash2", 0, ["--spec-type", "draft-dflash", "-c", "4096"]),
    ("tiny-qwen3", "tiny-dflash2", 2, ["-c", "2048", "-np", "2", "-ngl", "99", "-ts", "3,1", "-fa", "off"]),
    ("tiny-qwen3", "tiny-dspark", 0, ["--spec-type", "draft-dspark", "-c", "4096", "-ub", "32"]),
    ("tiny-qwen3", "tiny-dspark", 1, ["-c", "2048", "-np", "2", "-ngl", "99", "-ctkd", "q8_0", "-ctvd", "q8_0"]),
    ("tiny-qwen3", "tiny-dspark-bonus", 0, ["-c", "4096", "-np", "2", "-ub", "32"]),
    ("tiny-llama", "tiny-eagle3-shared", 0, ["--spec-type", "draft-eagle3", "-c", "4096", "-np", "2"]),
    ("tiny-llama", "tiny-eagle3-shared", 1, ["--spec-type", "draft-eagle3", "-c", "2048", "-ngl", "1", "-fa", "off"]),
])
def test_the_draft_context_equals_llama_servers(model, draft, n_rpc, flags):
    """A Gemma 4 assistant's context beside tiny-gemma4 (ctx_other: no KV buffer of its own), a
    DFlash, DFlash2 and DSpark drafter's beside tiny-qwen3 (the speculative type given, or read from
    the file; -ub 32 reserves DSpark's whole Markov chain) and an EAGLE-3
    head's without its own embedding and head beside tiny-llama, as the real
    llama-server creates them after the model's: `reserve -- llama-server ...` plans the same buffers
    and graph as it logs (MiB to two decimals; the bytes are the goldens' business), -fit off."""
    from fixtures.llama_build import bin_dir
    from fixtures.server_fit_golden import run_server
    from schedplan.backends.rpc_server import rpc_servers
    from schedplan.cli.reserve import reserve

    binary = bin_dir() / "llama-server"
    if not binary.exists():
        pytest.skip(f"{binary} not built (python fixtures/llama_build.py)")
    args = ["-m", str(model_path(model)), "-md", str(model_path(draft)), "-fit", "off", *flags]
    with rpc_servers(n_rpc) as endpoints:
        rpc = ["--rpc", ",".join(endpoints)] if endpoints else []
        text = run_server([str(binary), *args, *rpc, "-v", "--host", "127.0.0.1", "--port", "0"])
        res = CliRunner().invoke(reserve, ["--device", "none", "--json", "--", "llama-server", *args, *rpc])
    _check_draft_context(res, text)


@pytest.mark.live
@pytest.mark.parametrize("model,draft,free_mib,flags", [
    ("tiny-gemma4", "tiny-gemma4-assistant", [1040, 1040], ["--spec-type", "draft-mtp", "-c", "4096"]),
    ("tiny-gemma4", "tiny-gemma4-assistant", [1060, 1033], ["--spec-type", "draft-mtp", "-c", "4096"]),
    ("tiny-qwen3", "tiny-dflash", [1034, 1030], ["-c", "4096", "-np", "2"]),
])
def test_the_draft_context_after_fit_equals_llama_servers(model, draft, free_mib, flags):
    """With --fit on RPC servers short of memory: llama-server fits the model alone (the draft cannot be
    measured alone), then creates the draft's context with the fitted tensor split, which
    common_fit_params wrote into the parameters the draft copies; `reserve -- llama-server` plans it so."""
    from fixtures.llama_build import bin_dir
    from fixtures.server_fit_golden import run_server
    from schedplan.backends.rpc_server import rpc_servers
    from schedplan.cli.reserve import reserve

    binary = bin_dir() / "llama-server"
    if not binary.exists():
        pytest.skip(f"{binary} not built (python fixtures/llama_build.py)")
    args = ["-m", str(model_path(model)), "-md", str(model_path(draft)), *flags]
    memory = [(f * MiB, (f + 2048) * MiB) for f in free_mib]
    with rpc_servers(len(memory), memory=memory) as endpoints:
        rpc = ["--rpc", ",".join(endpoints)]
        text = run_server([str(binary), *args, *rpc, "-v", "--host", "127.0.0.1", "--port", "0"])
        declared = [x for e, (free, total) in zip(endpoints, memory)
                    for x in ("--rpc", e, "--rpc-memory", f"{e}={free}/{total}")]
        res = CliRunner().invoke(reserve, [*declared, "--json", "--", "llama-server", *args, *rpc])
    assert "successfully fit params to free device memory" in text, text[-2000:]
    _check_draft_context(res, text)


def _check_draft_context(res, text: str) -> None:
    assert "llama_server: listening on" in text, text[-2000:]
    assert res.exit_code == 0, res.output
    plan, real = json.loads(res.stdout)["draft"], _draft_context_log(text)
    for key in ("model_buffers", "output_buffers", "kv_buffers", "compute_buffers"):
        assert {k: f"{v / MiB:.2f}" for k, v in plan[key].items() if v} == real[key], key
    assert {g: (plan["graphs"][g]["nodes"], plan["graphs"][g]["splits"]) for g in ("pp", "tg")} == real["graph"]
