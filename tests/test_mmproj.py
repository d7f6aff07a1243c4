"""Projectors (planner/mtmd) against the goldens recorded from real llama.cpp's mtmd_get_memory_usage
(fixtures/mmproj_golden.py), and the projector's parts of reserve and fit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures.golden import canonical_endpoint  # noqa: E402
from fixtures.make_gguf import model_path  # noqa: E402
from fixtures.make_mmproj import mmproj_path  # noqa: E402
from fixtures.mmproj_golden import GOLDEN_DIR  # noqa: E402
from schedplan.cli.options import parse_params_mmproj  # noqa: E402
from schedplan.planner.hf import HfFile, find_best_sibling  # noqa: E402
from schedplan.planner.mtmd.mtmd import mtmd_get_memory_usage  # noqa: E402

GOLDENS = sorted(GOLDEN_DIR.glob("*.json"))
MiB = 1024 * 1024


def plan_case(case: dict):
    path = str(mmproj_path(case["projector"]))
    rpc = [x for i in range(case["n_rpc"]) for x in ("--rpc", canonical_endpoint(i))]
    params, mmproj = parse_params_mmproj([*case["flags"], "-mm", path, *rpc])
    return mtmd_get_memory_usage(params, mmproj)


@pytest.mark.parametrize("golden", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_golden(golden: Path):
    data = json.loads(golden.read_text())
    plan = plan_case(data["case"])
    real = data["result"]
    assert plan.memory_usage() == real["memory_usage"]
    assert [d.device_name for d in plan.devices] == real["registry"]
    # clip_init logs the gen-audio context too (loaded, never warmed up, not in memory_usage)
    contexts = plan.contexts + ([("gen.audio", plan.ctx_gen_a)] if plan.ctx_gen_a is not None else [])
    for (modality, ctx), logged in zip(contexts, real["log"]["contexts"], strict=True):
        assert ctx.backend.name == logged["backend"]
        if "warmup_size" in logged:
            assert [ctx.model.hparams.warmup_image_size] * 2 == logged["warmup_size"]
        elif modality == "gen.audio":
            assert "warmup_frames" not in logged and not logged["compute_mib"] and not ctx.compute_buffers
        else:
            assert ctx.model.hparams.warmup_audio_size == logged["warmup_frames"]
        if "nodes" in logged:      # a warm-up ran
            assert (ctx.n_nodes, ctx.n_splits, ctx.flash_attn_type == 1) == \
                (logged["nodes"], logged["splits"], logged["flash_attn"])
            assert {b: f"{size / MiB:.2f}" for b, size in ctx.compute_buffers.items()} == logged["compute_mib"]


def test_goldens_cover_every_projector():
    names = {json.loads(p.read_text())["case"]["projector"] for p in GOLDENS}
    assert names == {p.stem for p in (REPO / "fixtures" / "projectors").glob("*.json")}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from schedplan.cli.main import cli; sys.argv[0] = 'schedplan'; cli()", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_reserve_shows_the_projector():
    proj = str(mmproj_path("tiny-mmproj-gemma3"))
    out = run_cli("reserve", str(model_path("tiny-gemma3")), "-c", "4096", "-mm", proj, "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    (enc,) = result["projector"]["encoders"]
    golden = json.loads((GOLDEN_DIR / "tiny-mmproj-gemma3__defaults.json").read_text())["result"]
    assert result["projector"]["memory_usage"] == golden["memory_usage"]
    assert enc["projector_type"] == "gemma3" and enc["device"] == "CPU" and enc["nodes"] == 90
    assert sum(enc["weights"].values()) + sum(enc["compute_buffers"].values()) == golden["memory_usage"]["CPU"]


def test_fit_raises_the_targets_by_registry_index():
    """llama-server adds the projector's bytes on device i of ggml's registry to fit target i:
    RPC servers come after the CPU there, so RPC0's bytes raise the model's second device's target
    and the CPU's bytes the first one's."""
    proj = str(mmproj_path("tiny-mmproj-gemma3"))
    rpc = ["--rpc", "127.0.0.1:50052", "--rpc-memory", "127.0.0.1:50052=40MiB",
           "--rpc", "127.0.0.1:50053", "--rpc-memory", "127.0.0.1:50053=40MiB"]
    out = run_cli("fit", str(model_path("tiny-gemma3")), *rpc, "-fitt", "10", "-mm", proj, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    usage = report["projector"]["memory_usage"]
    targets = [d["target"] for d in report["devices"] if "target" in d]
    assert targets == [10 * MiB + usage["CPU"], 10 * MiB + usage["RPC0"]]


def test_projector_of_another_model_is_refused():
    out = run_cli("fit", str(model_path("tiny-gemma3")), "-mm", str(mmproj_path("tiny-mmproj-qwen3vl")))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "mismatch between text model (n_embd = 256) and mmproj (n_embd = 768)" in out.stderr


def test_gen_audio_part_of_another_model_is_refused(tmp_path):
    """mtmd_context checks the gen-audio context's output (the code predictor's codec embedding) against
    the text model too, after the vision / audio one."""
    from fixtures.make_mmproj import load_config, write_mmproj
    config = load_config("tiny-mmproj-qwen3tts")
    config["metadata"]["clip.gen.audio.projection_dim"] = 128    # the layout's out_embd width
    path = write_mmproj(config, tmp_path / "gen-128.gguf", header_only=True)
    out = run_cli("reserve", str(model_path("tiny-qwen3tts")), "-mm", str(path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "mismatch between text model (n_embd = 256) and gen-audio mmproj (n_embd = 128)" in out.stderr


@pytest.mark.parametrize("model, projector, encoder, gen", [("tiny-qwen3tts", "tiny-mmproj-qwen3tts", "qwen3tts_spkenc", "qwen3tts_gen"),
                                                           ("tiny-pockettts", "tiny-mmproj-pockettts", "pockettts_spkenc", "pockettts_gen")])
def test_gen_audio_weights_are_loaded_but_not_in_memory_usage(model, projector, encoder, gen):
    """clip_init loads the gen-audio context's weights (no warm-up): reserve shows them beside the
    speaker encoder, and only mtmd_get_memory_usage's vision + audio sum is the projector's usage."""
    from fixtures.make_mmproj import tensor_specs
    from fixtures.make_gguf import tensor_nbytes
    out = run_cli("reserve", str(model_path(model)), "-mm", str(mmproj_path(projector)), "--json")
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)["projector"]
    golden = json.loads((GOLDEN_DIR / f"{projector}__defaults.json").read_text())["result"]
    assert planned["memory_usage"] == golden["memory_usage"]
    weights = sum(tensor_nbytes(ne, t) for name, ne, t in tensor_specs(projector) if name.startswith("a.gen."))
    assert planned["gen_audio"]["weights"] == {"CPU": weights} and planned["gen_audio"]["projector_type"] == gen
    assert [e["projector_type"] for e in planned["encoders"]] == [encoder]


def test_every_known_type_is_planned_and_unknown_ones_are_refused(tmp_path):
    from fixtures.make_mmproj import load_config, write_mmproj
    from schedplan.planner.mtmd.clip import GEN_AUDIO_TYPES, GRAPH_BUILDERS, NO_HPARAMS_TYPES, PROJECTOR_TYPE_NAMES
    # clip-impl.h's PROJECTOR_TYPE_NAMES: each planned (a warm-up graph, or gen-audio weights without
    # one), refused as llama.cpp refuses it (NO_HPARAMS_TYPES), or the legacy qwen2.5o renamed on load
    assert set(PROJECTOR_TYPE_NAMES) - set(GRAPH_BUILDERS) - GEN_AUDIO_TYPES - NO_HPARAMS_TYPES == {"qwen2.5o"}
    # gemma3na: a type llama.cpp knows but load_hparams has no case for (real llama.cpp's
    # mtmd_get_memory_usage fails on it: no estimate)
    for base, proj_type, message in (
            ("tiny-mmproj-gemma3", "no-such-type", "unknown projector type: no-such-type"),
            ("tiny-mmproj-ultravox", "gemma3na", "load_hparams: unknown vision projector type gemma3na")):
        config = load_config(base)
        config["metadata"]["clip.projector_type"] = proj_type
        path = write_mmproj(config, tmp_path / f"{proj_type}.gguf", header_only=True)
        out = run_cli("reserve", str(model_path("tiny-gemma3")), "-mm", str(path))
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


def test_minicpmv_version_without_a_template_is_refused(tmp_path):
    """mtmd_context::init_vision has a slice template for MiniCPM-V versions 2-6 and 100045 only
    (llama.cpp's mtmd_get_memory_usage returns nothing for version 1)."""
    from fixtures.make_mmproj import load_config, write_mmproj
    config = load_config("tiny-mmproj-minicpmv")
    config["metadata"]["clip.minicpmv_version"] = 1
    path = write_mmproj(config, tmp_path / "minicpmv1.gguf", header_only=True)
    out = run_cli("reserve", str(model_path("tiny-qwen2")), "-mm", str(path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "unsupported minicpmv version: 1" in out.stderr


@pytest.mark.parametrize("files, model, expected", [
    # the model's folder beats the root; then the closest quantization bits to the model file's
    (["mmproj-F16.gguf", "q4/mmproj-F32.gguf", "q4/m-Q4_K_M.gguf"], "q4/m-Q4_K_M.gguf", "q4/mmproj-F32.gguf"),
    (["mmproj-model-f32.gguf", "mmproj-model-f16.gguf", "m-Q8_0.gguf"], "m-Q8_0.gguf", "mmproj-model-f16.gguf"),
    (["mmproj-BF16.gguf", "mmproj-F16.gguf"], "m-Q4_K_M.gguf", "mmproj-BF16.gguf"),   # a tie: the first listed
    (["other/mmproj-F16.gguf"], "q4/m-Q4_K_M.gguf", None),                            # not above the model's folder
    (["mmproj-F16.gguf.part"], "m.gguf", None),
])
def test_find_best_mmproj(files, model, expected):
    best = find_best_sibling([HfFile(p, "") for p in files], model, "mmproj")
    assert (best.path if best else None) == expected


@pytest.mark.live
def test_damaged_projectors_plan_or_fail_as_llama_cpp_does(tmp_path):
    """Damaged projector headers (fixtures/fuzz.py's mutations), each planned and given to real
    llama.cpp's mtmd_get_memory_usage: the same bytes per device where the plan succeeds, and a
    failure of llama.cpp (no estimate, or an abort) where the plan refuses in one line."""
    pytest.importorskip("llama_cpp")
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    from fixtures.fuzz import STRUCTURAL, Draw, Header, fixture_header, fuzz_projectors, make_case
    from schedplan.backends.llama_cpp_run import RunError
    from schedplan.backends.mtmd_run import run_mmproj
    from schedplan.cli.errors import USER_ERRORS
    from schedplan.planner.mtmd.mtmd import MmprojParams
    from schedplan.planner.params import Params

    path = str(tmp_path / "damaged.gguf")
    outcomes = []
    for i, name in enumerate(sorted(fuzz_projectors())):
        base = Header.parse(fixture_header(name).read_bytes())

        @seed(1000 + i)
        @settings(max_examples=4, phases=[Phase.generate], deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.data())
        def one(data):
            d = Draw(data)
            case = make_case(d, name, base, kind=d.pick(sorted(STRUCTURAL) + ["byte_flip", "mixed"]))
            with open(path, "wb") as f:
                f.write(case.data)
            try:
                plan = mtmd_get_memory_usage(Params(), MmprojParams(path)).memory_usage()
            except NotImplementedError:
                return
            except USER_ERRORS as e:
                if "not planned by schedplan" in str(e):
                    return
                plan = None
            try:
                real = run_mmproj(path, Params(), MmprojParams(path), timeout=120)["memory_usage"]
            except RunError:
                real = None
            assert plan == real if plan is not None else not real, (name, case.kind, case.what, plan, real)
            outcomes.append(plan is not None)

        one()
    assert True in outcomes and False in outcomes


def _projector_with(tmp_path, name: str, change) -> str:
    from fixtures.fuzz import Header, fixture_header
    h = Header.parse(fixture_header(name).read_bytes())
    change(h)
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(h.to_bytes())
    return str(path)


@pytest.mark.parametrize("name, change, needle", [
    # the loader's log reads general.name as a string: another type is gguf.cpp's GGML_ASSERT
    ("tiny-mmproj-gemma3", lambda h: setattr(h.find(b"general.name"), "vtype", 5) or
     setattr(h.find(b"general.name"), "payload", b"\0\0\0\0"), "general.name is i32"),
    # the merger's last bias (the file's last tensor) of another width: ggml_add's GGML_ASSERT(ggml_can_repeat(b, a))
    ("tiny-mmproj-qwen25vl", lambda h: h.tis[-1].ne.__setitem__(0, 96), "ggml_can_repeat"),
    # an embedding size the patch kernel does not have: ggml_reshape's element count
    ("tiny-mmproj-gemma3", lambda h: setattr(h.find(b"clip.vision.embedding_length"), "payload", (48).to_bytes(4, "little")),
     "ggml_nelements(a)"),
    # a weight a builder reads unconditionally, renamed away: a null pointer
    ("tiny-mmproj-qwen2vl", lambda h: setattr(next(t for t in h.tis if t.name == b"v.blk.1.attn_q.bias"), "name", b"x"),
     "null pointer"),
    # a required tensor missing: clip.cpp's "unable to find tensor"
    ("tiny-mmproj-gemma3", lambda h: setattr(next(t for t in h.tis if t.name == b"mm.soft_emb_norm.weight"), "name", b"y"),
     "unable to find tensor mm.soft_emb_norm.weight"),
    # Parakeet's audio preprocessor takes its window from the file: mtmd-audio.cpp's GGML_ASSERT on its size
    ("tiny-mmproj-parakeet", lambda h: setattr(next(t for t in h.tis if t.name == b"a.window"), "name", b"z"),
     "a window of 0 for 400"),
    # gemma4a loads its output projection as optional, clip_n_mmproj_embd reads it regardless
    ("tiny-mmproj-gemma4a", lambda h: setattr(next(t for t in h.tis if t.name == b"mm.a.input_projection.weight"),
                                              "name", b"z"), "no mm.a.input_projection.weight"),
])
def test_damaged_projectors_are_one_line(tmp_path, name, change, needle):
    from fixtures.fuzz import PROJECTOR_MODEL_DEFAULT, PROJECTOR_MODELS
    model = str(model_path(PROJECTOR_MODELS.get(name, PROJECTOR_MODEL_DEFAULT)))
    out = run_cli("reserve", model, "-mm", _projector_with(tmp_path, name, change))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and needle in out.stderr, out.stderr
