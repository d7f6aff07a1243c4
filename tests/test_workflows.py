"""baseline/check, compare, reserve --peak and plot on the bundled GGUF headers (fast, offline)."""
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedplan.cli.check import parse_tolerance
from schedplan.cli.main import cli
from schedplan.planner import LLAMA_CPP_COMMIT
from schedplan.planner.params import Params
from schedplan.planner.reserve import reserve
from schedplan.planner.timeline import alive_at, lifetimes

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "fixtures/gguf/tiny-llama.gguf")
TINYLLAMA = str(ROOT / "fixtures/gguf/tinyllama-1.1b.gguf")
TWO_RPC = ("127.0.0.1:50052", "127.0.0.1:50053")   # planned only: pipeline parallel, 4 sched copies


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_clean_error(r, code: int = 2) -> None:
    """Exit code, one 'error: ...' line on stderr, no traceback."""
    assert r.exit_code == code, r.output
    assert isinstance(r.exception, SystemExit)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr


@pytest.fixture
def base(tmp_path) -> Path:
    """A baseline of tiny-llama at -c 4096."""
    path = tmp_path / "base.json"
    r = run("baseline", TINY, "-c", "4096", "-o", path)
    assert r.exit_code == 0, r.output
    return path


def edit_baseline(path: Path, **figures: int) -> None:
    doc = json.loads(path.read_text())
    for name, value in figures.items():
        name = name.replace("__", ".")
        if value is None:
            del doc["figures"][name]
        else:
            doc["figures"][name] = value
    path.write_text(json.dumps(doc))


def figure_rows(output: str) -> dict[str, list[str]]:
    """check's table rows by figure: [baseline, new, delta, delta %?, verdict...] as printed."""
    rows = {}
    for line in output.splitlines():
        parts = line.split()
        if parts and "." in parts[0] and parts[0].split(".")[0] in (
                "compute_buffers", "kv_buffers", "output_buffers", "model_buffers", "graphs"):
            rows[parts[0]] = parts[1:]
    return rows


# --- baseline ------------------------------------------------------------------------------------

def test_baseline_records_figures_params_commit_model_and_flags(base):
    doc = json.loads(base.read_text())
    plan = reserve(TINY, Params(n_ctx=4096))
    assert doc["schema"] == "schedplan.baseline/1"
    assert doc["llama_cpp"]["commit"] == LLAMA_CPP_COMMIT
    assert doc["model"] == TINY and doc["flags"] == ["-c", "4096"]
    assert doc["params"] == plan["params"]
    assert doc["figures"] == {
        "compute_buffers.CPU": plan["compute_buffers"]["CPU"], "kv_buffers.CPU": plan["kv_buffers"]["CPU"],
        "output_buffers.CPU": plan["output_buffers"]["CPU"],
        "model_buffers.CPU_Mapped": plan["model_buffers"]["CPU_Mapped"],
        "graphs.pp.nodes": plan["graphs"]["pp"]["nodes"], "graphs.pp.splits": plan["graphs"]["pp"]["splits"],
        "graphs.tg.nodes": plan["graphs"]["tg"]["nodes"], "graphs.tg.splits": plan["graphs"]["tg"]["splits"]}


def test_baseline_records_flags_as_given_in_short_form(tmp_path):
    path = tmp_path / "b.json"
    r = run("baseline", TINY, "--ctx-size", "2048", "-fa", "off", "--no-repack", "-ot", "a=CPU", "-ot", "b=CPU",
            "-o", path, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc == json.loads(path.read_text())
    assert doc["flags"] == ["-c", "2048", "-fa", "off", "--no-repack", "-ot", "a=CPU", "-ot", "b=CPU"]


def test_baseline_errors(tmp_path):
    assert_clean_error(run("baseline", tmp_path / "missing.gguf", "-o", tmp_path / "b.json"))
    assert_clean_error(run("baseline", TINY, "-o", tmp_path / "no" / "such" / "dir.json"))


# --- check: exit codes and verdicts --------------------------------------------------------------

def test_check_same_plan_passes(base):
    r = run("check", TINY, "-c", "4096", "--baseline", base)
    assert r.exit_code == 0, r.output
    rows = figure_rows(r.stdout)
    assert len(rows) == 8 and all(row[-1] == "same" for row in rows.values())
    assert "PASS" in r.stdout


def test_check_growth_is_a_regression_shrinking_is_not(base):
    a, b = reserve(TINY, Params(n_ctx=4096)), reserve(TINY, Params(n_ctx=8192))
    r = run("check", TINY, "-c", "8192", "--baseline", base, "--tolerance", "1%")
    assert r.exit_code == 1, r.output
    rows = figure_rows(r.stdout)
    assert rows["kv_buffers.CPU"][:3] == [f"{a['kv_buffers']['CPU']:,}", f"{b['kv_buffers']['CPU']:,}",
                                          f"+{b['kv_buffers']['CPU'] - a['kv_buffers']['CPU']:,}"]
    assert rows["kv_buffers.CPU"][-1] == "REGRESSION" and rows["compute_buffers.CPU"][-1] == "REGRESSION"
    assert rows["model_buffers.CPU_Mapped"][-1] == "same"
    assert "FAIL: 2 of 8 figures regressed" in r.stdout
    assert "n_ctx 4096 -> 8192" in r.stdout   # the note on effective parameters

    r = run("check", TINY, "-c", "2048", "--baseline", base)
    assert r.exit_code == 0, r.output
    rows = figure_rows(r.stdout)
    assert rows["kv_buffers.CPU"][-1] == "shrank" and rows["compute_buffers.CPU"][-1] == "shrank"
    assert "2 shrank" in r.stdout


def test_check_percent_tolerance_exactly_at_the_limit(base):
    kv = reserve(TINY, Params(n_ctx=4096))["kv_buffers"]["CPU"]
    assert kv == 2 ** 22
    edit_baseline(base, kv_buffers__CPU=kv * 100 // 128)   # the plan is exactly 28% above this baseline
    assert run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", "28%").exit_code == 0
    assert run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", "28.0%").exit_code == 0
    r = run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", "27.9999%")
    assert r.exit_code == 1 and figure_rows(r.stdout)["kv_buffers.CPU"][-1] == "REGRESSION"
    r = run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", "50%")
    assert r.exit_code == 0 and figure_rows(r.stdout)["kv_buffers.CPU"][-2:] == ["within", "tolerance"]


def test_check_byte_tolerance_exactly_at_the_limit(base):
    compute = reserve(TINY, Params(n_ctx=4096))["compute_buffers"]["CPU"]
    edit_baseline(base, compute_buffers__CPU=compute - 2 ** 20)   # the plan is exactly 1 MiB above
    for ok in ("1MiB", "1mib", "1024KiB", "1048576", "1048576B", "1048576.9", "2MiB"):
        assert run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", ok).exit_code == 0, ok
    for regressed in ("1048575", "1023KiB", "0.99MiB", "0", "1%"):
        r = run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", regressed)
        assert r.exit_code == 1, regressed
        assert figure_rows(r.stdout)["compute_buffers.CPU"][-1] == "REGRESSION"


def test_parse_tolerance():
    assert parse_tolerance("1%").allowed(1000) == 10
    assert parse_tolerance("0.5%").allowed(1001) * 1000 == 5005
    assert parse_tolerance("4MiB").nbytes == 4 * 2 ** 20
    assert parse_tolerance("1.5GiB").nbytes == 3 * 2 ** 29
    assert parse_tolerance("512 KiB").nbytes == 2 ** 19
    assert parse_tolerance("4096").nbytes == 4096
    for bad in ("4MB", "-1%", "1 %%", "MiB", "", "1e3"):
        with pytest.raises(ValueError):
            parse_tolerance(bad)


def test_check_bad_tolerance_is_a_usage_error(base):
    r = run("check", TINY, "--baseline", base, "--tolerance", "4MB")
    assert r.exit_code == 2 and "4MB" in r.stderr and "Traceback" not in r.output


def test_check_new_buffer_type_counts_as_growth_from_zero(base):
    edit_baseline(base, output_buffers__CPU=None)   # the 4096-byte output buffer is new since the baseline
    r = run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", "50%")
    assert r.exit_code == 1 and figure_rows(r.stdout)["output_buffers.CPU"] == ["-", "4,096", "+4,096", "new",
                                                                                 "REGRESSION"]
    assert run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", "4KiB").exit_code == 0


def test_check_vanished_buffer_type_is_a_shrink(base):
    edit_baseline(base, model_buffers__CPU_REPACK=1000)
    r = run("check", TINY, "-c", "4096", "--baseline", base)
    assert r.exit_code == 0 and figure_rows(r.stdout)["model_buffers.CPU_REPACK"][:3] == ["1,000", "-", "-1,000"]


def test_check_changed_nodes_or_splits_fail_whatever_the_tolerance(base):
    edit_baseline(base, graphs__pp__nodes=67)
    r = run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", "100%")
    assert r.exit_code == 1 and figure_rows(r.stdout)["graphs.pp.nodes"][-1] == "CHANGED"
    edit_baseline(base, graphs__pp__nodes=68, graphs__tg__splits=2)   # fewer splits is a change too
    r = run("check", TINY, "-c", "4096", "--baseline", base, "--tolerance", "100%")
    assert r.exit_code == 1 and figure_rows(r.stdout)["graphs.tg.splits"][-1] == "CHANGED"


def test_check_errors_exit_2(base, tmp_path):
    assert_clean_error(run("check", TINY, "--baseline", tmp_path / "missing.json"))
    (tmp_path / "not.json").write_text("{")
    assert_clean_error(run("check", TINY, "--baseline", tmp_path / "not.json"))
    (tmp_path / "other.json").write_text(json.dumps({"schema": "schedplan.reserve/1"}))
    assert_clean_error(run("check", TINY, "--baseline", tmp_path / "other.json"))
    edit_baseline(base, kv_buffers__CPU="4 MiB")
    assert_clean_error(run("check", TINY, "--baseline", base))
    edit_baseline(base, kv_buffers__CPU=4)
    doc = json.loads(base.read_text())
    base.write_text(json.dumps({**doc, "llama_cpp": "0c1e57098"}))
    assert_clean_error(run("check", TINY, "--baseline", base))
    assert_clean_error(run("check", tmp_path / "missing.gguf", "--baseline", base))
    assert_clean_error(run("check", ROOT / "README.md", "--baseline", base))   # not a GGUF
    assert_clean_error(run("check", TINY))                                     # no --baseline
    assert_clean_error(run("check", "--manifest", tmp_path / "m.json", "--baseline", base))


def test_check_json(base):
    r = run("check", TINY, "-c", "8192", "--baseline", base, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["status"] == "fail" and doc["tolerance"] == "0"
    [c] = doc["configs"]
    assert (c["model"], c["flags"], c["status"], c["error"]) == (TINY, ["-c", "8192"], "fail", None)
    kv = next(f for f in c["figures"] if f["figure"] == "kv_buffers.CPU")
    assert kv == {"figure": "kv_buffers.CPU", "baseline": 2 ** 22, "new": 2 ** 23, "delta": 2 ** 22,
                  "verdict": "REGRESSION", "ok": False}
    r = run("check", TINY, "-c", "4096", "--baseline", base, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["status"] == "pass"


def test_check_notes_a_baseline_from_another_llama_cpp(base):
    doc = json.loads(base.read_text())
    doc["llama_cpp"]["commit"] = "1234567"
    base.write_text(json.dumps(doc))
    r = run("check", TINY, "-c", "4096", "--baseline", base)
    assert r.exit_code == 0 and f"planned for llama.cpp 1234567, this plan for {LLAMA_CPP_COMMIT}" in r.stdout


# --- manifests and JUnit -------------------------------------------------------------------------

@pytest.fixture
def manifest_dir(tmp_path) -> Path:
    """Two baselines next to a manifest: tiny-llama -c 4096 and TinyLlama -c 2048."""
    for model, flags, name in ((TINY, ["-c", "4096"], "tiny.json"), (TINYLLAMA, ["-c", "2048"], "tl.json")):
        assert run("baseline", model, *flags, "-o", tmp_path / name).exit_code == 0
    return tmp_path


def test_manifest_json_relative_paths_all_pass(manifest_dir):
    (manifest_dir / "models").symlink_to(ROOT / "fixtures/gguf")
    m = manifest_dir / "memory.json"
    m.write_text(json.dumps([{"model": "models/tiny-llama.gguf", "flags": "-c 4096", "baseline": "tiny.json"},
                             {"model": "models/tinyllama-1.1b.gguf", "flags": ["-c", "2048"],
                              "baseline": "tl.json"}]))
    r = run("check", "--manifest", m)
    assert r.exit_code == 0, r.output
    assert "2 configurations: 2 passed, 0 failed, 0 could not be checked" in r.stdout
    assert r.stdout.count("PASS") == 2


def test_manifest_toml_with_a_regression_and_junit(manifest_dir):
    m = manifest_dir / "memory.toml"
    m.write_text(f'[[check]]\nmodel = "{TINY}"\nflags = "-c 4096"\nbaseline = "tiny.json"\n\n'
                 f'[[check]]\nmodel = "{TINYLLAMA}"\nflags = "-c 4096"\nbaseline = "tl.json"\n')
    junit = manifest_dir / "out.xml"
    r = run("check", "--manifest", m, "--tolerance", "1%", "--junit", junit)
    assert r.exit_code == 1, r.output
    assert "2 configurations: 1 passed, 1 failed" in r.stdout

    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [f"{TINY} -c 4096", f"{TINYLLAMA} -c 4096"]
    cases = [c for s in suites for c in s.findall("testcase")]
    assert len(cases) == 8 + 9 == int(root.get("tests"))   # one per figure (TinyLlama has CPU_REPACK weights)
    failed = {c.get("name"): c.find("failure").get("message") for c in cases if c.find("failure") is not None}
    assert list(failed) == ["kv_buffers.CPU"]   # TinyLlama's KV at -c 2048 -> 4096; its compute peak is the output
    kv = reserve(TINYLLAMA, Params(n_ctx=2048))["kv_buffers"]["CPU"]
    assert failed["kv_buffers.CPU"] == (f"REGRESSION: baseline {kv:,}, new {2 * kv:,}, delta +{kv:,} +100.00%, "
                                        "tolerance 1% of each baseline figure")
    assert root.get("failures") == "1" and root.get("errors") == "0"
    assert suites[0].get("failures") == "0" and suites[1].get("failures") == "1"


def test_manifest_error_in_one_configuration_exits_2_and_is_a_junit_error(manifest_dir):
    m = manifest_dir / "memory.json"
    m.write_text(json.dumps([{"model": TINY, "flags": ["-c", "4096"], "baseline": "tiny.json"},
                             {"model": "missing.gguf", "baseline": "tiny.json"},
                             {"model": TINY, "flags": "-c nope", "baseline": "tiny.json"}]))
    junit = manifest_dir / "out.xml"
    r = run("check", "--manifest", m, "--junit", junit, "--json")
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["status"] == "error"
    assert [c["status"] for c in doc["configs"]] == ["pass", "error", "error"]
    assert "missing.gguf: No such file or directory" in doc["configs"][1]["error"]
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 2 and errors[0].startswith(f"error: {m}, entry 2: ")
    assert errors[1].startswith(f"error: {m}, entry 3: ") and "nope" in errors[1]
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "2" and root.get("failures") == "0"
    assert [c.get("name") for c in root.iter("testcase") if c.find("error") is not None] == ["plan", "plan"]


@pytest.mark.parametrize("name, text", [
    ("m.json", "{"), ("m.json", "{}"), ("m.json", "[]"), ("m.json", '[{"model": "x"}]'),
    ("m.json", '[{"model": "x", "baseline": "y", "flag": "-c 1"}]'),
    ("m.json", '[{"model": "x", "baseline": "y", "flags": 4096}]'),
    ("m.json", '[{"model": "x", "baseline": "y", "flags": "-c \'4096"}]'),
    ("m.toml", "[[check]\n"), ("m.toml", 'model = "x"\n'), ("m.json", b"\xff\xfe["),
])
def test_bad_manifest_exits_2(tmp_path, name, text):
    (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_clean_error(run("check", "--manifest", tmp_path / name))


def test_missing_manifest_exits_2(tmp_path):
    assert_clean_error(run("check", "--manifest", tmp_path / "none.toml"))


# --- compare -------------------------------------------------------------------------------------

def test_compare_two_context_sizes_kv_doubles():
    a, b = reserve(TINY, Params(n_ctx=4096)), reserve(TINY, Params(n_ctx=8192))
    assert b["kv_buffers"]["CPU"] == 2 * a["kv_buffers"]["CPU"] == 2 ** 23

    r = run("compare", TINY, "--a", "-c 4096", "--b", "-c 8192", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {(x["buffer_type"], x["kind"]): x for x in doc["buffers"]}
    assert (rows[("CPU", "KV")]["a"], rows[("CPU", "KV")]["b"]) == (a["kv_buffers"]["CPU"], b["kv_buffers"]["CPU"])
    assert rows[("CPU", "compute")]["delta"] == b["compute_buffers"]["CPU"] - a["compute_buffers"]["CPU"]
    assert rows[("CPU_Mapped", "model")]["delta"] == 0
    assert doc["a"]["params"]["n_ctx"] == 4096 and doc["b"]["params"]["n_ctx"] == 8192
    # the compute peak: same node, the KQ mask doubled (it spans n_kv)
    assert doc["a"]["peaks"]["CPU"]["node"] == doc["b"]["peaks"]["CPU"]["node"] == a["peaks"]["pp"]["CPU"]["node"]
    assert doc["b"]["peaks"]["CPU"]["size"] == b["compute_buffers"]["CPU"]
    mask = next(t for t in doc["peak_tensors"]["CPU"] if t["name"] == "attn_inp_kq_mask")
    assert mask["b"] == 2 * mask["a"] and doc["peak_tensors"]["CPU"][0] == mask   # largest first

    text = run("compare", TINY, "--a", "-c 4096", "--b", "-c 8192").stdout
    assert f"A: {TINY} -c 4096" in text and f"B: {TINY} -c 8192" in text
    kv_line = next(line for line in text.splitlines() if line.split()[:2] == ["CPU", "KV"])
    assert kv_line.split()[-2:] == [f"+{2 ** 22:,}", "+100.0%"]
    assert "effective parameters: n_ctx 4096 -> 8192" in text
    assert "attn_inp_kq_mask" in text


def test_compare_shared_flags_apply_to_both_sides_and_side_flags_win():
    doc = json.loads(run("compare", TINY, "-c", "4096", "-fa", "off", "--b", "-c 8192", "--json").stdout)
    assert doc["a"]["label"] == f"{TINY} -c 4096 -fa off" and doc["b"]["label"] == f"{TINY} -c 4096 -fa off -c 8192"
    assert doc["a"]["params"]["flash_attn"] is doc["b"]["params"]["flash_attn"] is False
    assert (doc["a"]["params"]["n_ctx"], doc["b"]["params"]["n_ctx"]) == (4096, 8192)


def test_compare_two_models():
    a, b = reserve(TINY, Params(n_ctx=2048)), reserve(TINYLLAMA, Params(n_ctx=2048))
    doc = json.loads(run("compare", TINY, TINYLLAMA, "-c", "2048", "--json").stdout)
    rows = {(x["buffer_type"], x["kind"]): (x["a"], x["b"]) for x in doc["buffers"]}
    assert rows[("CPU", "compute")] == (a["compute_buffers"]["CPU"], b["compute_buffers"]["CPU"])
    assert rows[("CPU_REPACK", "model")] == (0, b["model_buffers"]["CPU_REPACK"])
    graphs = {g["name"]: (g["a"], g["b"]) for g in doc["graphs"]}
    assert graphs["pp nodes"] == (a["graphs"]["pp"]["nodes"], b["graphs"]["pp"]["nodes"])
    assert doc["b"]["peaks"]["CPU"]["node_name"] == b["peaks"]["pp"]["CPU"]["node_name"]


def test_compare_pp_vs_tg():
    plan = reserve(TINYLLAMA, Params(n_ctx=4096, rpc=TWO_RPC[:1]))
    r = run("compare", TINYLLAMA, "-c", "4096", "--rpc", TWO_RPC[0], "--pp-vs-tg", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {x["buffer_type"]: (x["kind"], x["a"], x["b"]) for x in doc["buffers"]}
    assert rows == {buft: ("compute", plan["graphs"]["pp"]["buffers"][buft], plan["graphs"]["tg"]["buffers"][buft])
                    for buft in plan["compute_buffers"]}
    graphs = {g["name"]: (g["a"], g["b"]) for g in doc["graphs"]}
    assert graphs["n_tokens"] == (512, 1) and graphs["nodes"] == (688, 688)
    for buft in plan["compute_buffers"]:
        assert doc["a"]["peaks"][buft]["graph"] == "pp" and doc["b"]["peaks"][buft]["graph"] == "tg"
        assert doc["b"]["peaks"][buft]["size"] == plan["peaks"]["tg"][buft]["size"]
    text = run("compare", TINYLLAMA, "-c", "4096", "--pp-vs-tg").stdout
    assert "pp graph (512 tokens)" in text and "tg graph (1 token)" in text


def test_compare_usage_errors():
    assert_clean_error(run("compare", TINY))
    assert_clean_error(run("compare", TINY, "--pp-vs-tg", "--a", "-c 4096"))
    assert_clean_error(run("compare", TINY, "--a", "-c '4096"))
    assert_clean_error(run("compare", TINY, "missing.gguf"))


# --- reserve --peak and the result's peaks -------------------------------------------------------

def test_reserve_json_peaks_for_pp_and_tg():
    plan = reserve(TINY, Params(n_ctx=4096), tensors=True)
    pp = plan["peaks"]["pp"]["CPU"]
    assert pp["size"] == plan["compute_buffers"]["CPU"] == plan["graphs"]["pp"]["buffers"]["CPU"]
    assert plan["peaks"]["tg"]["CPU"]["size"] == plan["graphs"]["tg"]["buffers"]["CPU"]
    node = next(t for t in plan["tensors"] if t["kind"] == "node" and t["index"] == pp["node"])
    assert (pp["node_name"], pp["node_op"]) == (node["name"], node["op"]) == ("ffn_up-0", "MUL_MAT")
    at_peak = {(t["name"], t["offset"]) for t in plan["tensors"] if t["at_peak"]}
    assert {(t["name"], t["offset"]) for t in pp["tensors"]} == at_peak
    assert [t["offset"] for t in pp["tensors"]] == sorted(t["offset"] for t in pp["tensors"])
    top = max(t["offset"] + t["size"] for t in pp["tensors"])
    assert top == pp["size"]   # the tensor allocated at the peak ends where the buffer does


def test_reserve_peak_table():
    r = run("reserve", TINY, "-c", "4096", "--peak")
    assert r.exit_code == 0
    assert ("CPU compute buffer, pp graph: peak 8.01 MiB (8,402,944 bytes) at node 28 ffn_up-0 (MUL_MAT), "
            "10 tensors hold memory:") in r.stdout
    assert "attn_inp_kq_mask" in r.stdout
    r = run("reserve", TINY, "-c", "4096", "--peak", "--graph", "tg")
    assert "CPU compute buffer, tg graph: peak" in r.stdout
    assert "compute buffer, pp graph: peak" not in run("reserve", TINY, "-c", "4096").stdout   # only with --peak


# --- lifetimes and plot --------------------------------------------------------------------------

@pytest.mark.parametrize("model, params", [
    (TINY, Params(n_ctx=4096)), (TINY, Params(n_ctx=1000, flash_attn="off")),
    (TINYLLAMA, Params(n_ctx=2048, n_seq_max=4, n_ubatch=256)),
    (TINY, Params(rpc=TWO_RPC)),          # split inputs listed twice (node and leaf)
    (TINYLLAMA, Params(rpc=TWO_RPC[:1], n_gpu_layers=1)),
])
@pytest.mark.parametrize("graph", ["pp", "tg"])
def test_lifetimes_replay_the_allocator(model, params, graph):
    """The tensors alive at the peak node are exactly gallocr's, tensors alive at the same node
    never share memory (in-place handovers included), and the highest end is the peak size."""
    plan = reserve(model, params, tensors=True, graph=graph)
    spans = lifetimes(plan["tensors"])
    rows = plan["tensors"]
    assert len(spans) == sum(t["compute"] and t["view_src"] is None and t["same_as"] is None for t in rows)
    for buft, peak in plan["peaks"][graph].items():
        mine = [s for s in spans if s.buffer == buft]
        assert {(s.name, s.offset) for s in alive_at(mine, peak["node"])} == \
            {(t["name"], t["offset"]) for t in peak["tensors"]}
        assert max(s.offset + s.size for s in mine) == peak["size"]
        events = sorted(mine, key=lambda s: s.offset)
        for i, a in enumerate(events):
            for b in events[i + 1:]:
                if b.offset >= a.offset + a.size:
                    break
                assert a.size == 0 or b.size == 0 or a.last < b.first or b.last < a.first, (a, b)


def test_plot_png_content(tmp_path):
    pytest.importorskip("matplotlib")
    from schedplan.cli.plot import draw

    plan = reserve(TINY, Params(n_ctx=4096), tensors=True)
    out = tmp_path / "t.png"
    [drawn] = draw(plan, "pp", "title", str(out))
    compute = [t for t in plan["tensors"] if t["compute"] and t["view_src"] is None and t["same_as"] is None]
    assert drawn.buffer == "CPU" and drawn.rectangles == len(compute) == 47
    assert drawn.peak_size == plan["peaks"]["pp"]["CPU"]["size"] == plan["compute_buffers"]["CPU"]
    assert drawn.peak_node == 28
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread
    pixels = imread(str(out))
    assert pixels.shape[0] > 400 and pixels.shape[1] > 1000
    orange = ((abs(pixels[..., 0] - 0xe8 / 255) < 0.02) & (abs(pixels[..., 1] - 0x71 / 255) < 0.02)).sum()
    assert orange > 10000   # the tensors alive at the peak are drawn


def test_plot_svg_content_every_buffer(tmp_path):
    pytest.importorskip("matplotlib")
    from schedplan.cli.plot import draw

    plan = reserve(TINY, Params(rpc=TWO_RPC), tensors=True, graph="tg")
    out = tmp_path / "t.svg"
    drawn = draw(plan, "tg", "title", str(out))
    assert [d.buffer for d in drawn] == list(plan["peaks"]["tg"]) and len(drawn) == 3
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    for k, d in enumerate(drawn):
        n = sum(t["compute"] and t["view_src"] is None and t["same_as"] is None and t["buffer"] == d.buffer
                for t in plan["tensors"])
        assert d.rectangles == n
        group = root.find(f".//{{http://www.w3.org/2000/svg}}g[@id='tensors-{k}']")
        assert len(group.findall(".//{http://www.w3.org/2000/svg}path")) == n
        assert d.peak_size == plan["peaks"]["tg"][d.buffer]["size"]


def test_plot_command(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    r = run("plot", TINYLLAMA, "-c", "4096", "-o", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == (f"{out}: CPU compute buffer, 387 tensors, peak 70.50 MiB (73,926,656 bytes) "
                                "at node 687 result_output (MUL_MAT)")
    assert out.read_bytes()[:4] == b"\x89PNG"
    doc = json.loads(run("plot", TINY, "-o", tmp_path / "t.svg", "--graph", "tg", "--json").stdout)
    assert doc["graph"] == "tg" and len(doc["buffers"]["CPU"]["tensors"]) == 47
    assert_clean_error(run("plot", TINY, "-o", tmp_path / "t.pdf"))
    assert_clean_error(run("plot", tmp_path / "missing.gguf", "-o", out))


def test_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib raises ImportError
    r = run("plot", TINY, "-o", tmp_path / "t.png")
    assert_clean_error(r)
    assert "pip install 'schedplan[plot]'" in r.stderr
    assert not (tmp_path / "t.png").exists()


def test_readme_lists_every_supported_architecture():
    """The README's table of architectures names exactly the ones the planner accepts."""
    import re

    from schedplan.planner.models import SUPPORTED_ARCHS

    rows = re.findall(r"^\| `([^`]+)` \|", (ROOT / "README.md").read_text(), re.M)
    assert sorted(rows) == sorted(SUPPORTED_ARCHS)
