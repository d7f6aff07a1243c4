"""LoRA adapters (--lora, --lora-scaled, --lora-init-without-apply) and control vectors
(--control-vector, --control-vector-scaled, --control-vector-layer-range): their buffers as
llama_adapter_lora_init and llama_adapter_cvec allocate them (src/llama-adapter.cpp), the compute
buffers of the graphs reserved again with their matmuls and adds once llama-server applies them, the
refusals of bad adapter files, and the real llama-server's log against `reserve -- llama-server ...`."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures.make_gguf import cvec_path, lora_path, model_path, write_cvec_gguf  # noqa: E402
from schedplan.cli.reserve import reserve as reserve_cmd  # noqa: E402
from schedplan.planner.adapter import AdapterRefused  # noqa: E402
from schedplan.planner.params import Params  # noqa: E402
from schedplan.planner.reserve import reserve  # noqa: E402

MiB = 1024 * 1024


def plan(model: str, *lora: tuple[str, float], **kw) -> dict:
    kw.setdefault("n_ctx", 4096)
    return reserve(str(model_path(model)), Params(lora=tuple(lora), **kw))


def test_adapter_buffers_are_its_tensors_aligned():
    """A rank-8 adapter of tiny-llama's attn_q and attn_v (n_embd 256, attn_v's n_out 128): each
    lora_a (256 x 8) and lora_b (8 x n_out) f32 (sizes multiples of 32: no padding), in the base
    weights' buffer type (CPU_Mapped: the model is mmapped)."""
    path = str(lora_path("tiny-llama", 8, "qv"))
    r = plan("tiny-llama", (path, 1.0))
    a = r["lora"]["adapters"][0]
    assert a["n_tensors"] == 8 and a["alpha"] == 16.0
    # blk.{0,1}.attn_q: 256x8 and 8x256 f32; blk.{0,1}.attn_v: 256x8 and 8x128 f32
    assert a["buffers"] == {"CPU_Mapped": 2 * (256 * 8 * 4 + 8 * 256 * 4) + 2 * (256 * 8 * 4 + 8 * 128 * 4)}
    assert r["lora"]["buffers"] == a["buffers"] and r["lora"]["applied"]


def test_the_reserve_again_replaces_the_compute_buffers():
    """llama_set_adapters_lora -> sched_need_reserve: the warm-up decode reserves the graphs with the
    adapters' matmuls on a new scheduler (4 nodes per adapted weight: 2 mul_mat, scale, add), so the
    compute buffers are that reservation's, the first one's kept under compute_buffers_before."""
    base = plan("tiny-llama")
    r = plan("tiny-llama", (str(lora_path("tiny-llama", 16, "all")), 0.5))
    assert r["lora"]["compute_buffers_before"] == base["compute_buffers"]
    assert r["graphs"]["pp"]["nodes"] == base["graphs"]["pp"]["nodes"] + 4 * 14     # 7 weights x 2 layers
    assert r["compute_buffers"]["CPU"] > base["compute_buffers"]["CPU"]


def test_not_applied_without_a_reserve():
    """--lora-init-without-apply, or every scale 0 (set_adapters_lora keeps none: the set is the same),
    leaves the first reservation; the adapters' buffers are still allocated."""
    base = plan("tiny-llama")
    path = str(lora_path("tiny-llama", 8, "qv"))
    for r in (plan("tiny-llama", (path, 1.0), lora_init_without_apply=True), plan("tiny-llama", (path, 0.0))):
        assert not r["lora"]["applied"]
        assert r["compute_buffers"] == base["compute_buffers"] and r["graphs"]["pp"]["nodes"] == 68
        assert r["lora"]["buffers"] == {"CPU_Mapped": 57344}


def test_experts_in_an_extra_buffer_type_fall_back_to_the_cpu():
    """tiny-qwen3moe's q4_0 weights (attention and experts) are repacked (CPU_REPACK): their adapters go
    to the CPU buffer type ("cannot use buft 'CPU_REPACK', fallback to CPU"); with --no-repack to the
    mapped weights' type."""
    path = str(lora_path("tiny-qwen3moe", 8, "experts"))
    repacked, mapped = plan("tiny-qwen3moe", (path, 1.0)), plan("tiny-qwen3moe", (path, 1.0), use_extra_bufts=False)
    assert set(repacked["lora"]["buffers"]) == {"CPU"} and set(mapped["lora"]["buffers"]) == {"CPU_Mapped"}
    assert repacked["lora"]["buffers"]["CPU"] == mapped["lora"]["buffers"]["CPU_Mapped"]


def _bad_adapter(tmp_path: Path, **changes) -> str:
    """tiny-llama's q/v adapter written again with one thing changed (keys or tensors)."""
    from gguf import GGUFValueType, GGUFWriter
    from schedplan.planner.gguf import read_header

    src = read_header(str(lora_path("tiny-llama", 8, "qv")))
    path = tmp_path / "bad.gguf"
    w = GGUFWriter(path, changes.get("arch", "llama"))
    w.add_type(changes.get("general_type", "adapter"))
    w.add_key_value("adapter.type", changes.get("adapter_type", "lora"), GGUFValueType.STRING)
    w.add_key_value("adapter.lora.alpha", 16.0, GGUFValueType.FLOAT32)
    import numpy as np
    for t in src.tensors:
        name, ne = changes.get("rename", {}).get(t.name, t.name), changes.get("shapes", {}).get(t.name, t.ne)
        if name is None:
            continue
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), 4 * int(np.prod(ne)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size + 32 + 4 * sum(int(np.prod(t.ne)) for t in src.tensors))
    return str(path)


@pytest.mark.parametrize("changes,message", [
    ({"general_type": "model"}, "expect general.type to be 'adapter', but got: model"),
    ({"arch": "qwen3"}, "model arch and LoRA arch mismatch"),
    ({"adapter_type": "cvec"}, "expect adapter.type to be 'lora', but got: cvec"),
    ({"rename": {"blk.0.attn_q.weight.lora_b": None}}, "LoRA tensor pair for 'blk.0.attn_q.weight' is missing one"),
    ({"rename": {"blk.0.attn_q.weight.lora_a": "blk.0.attn_q.weight.lora_c"}},
     "LoRA tensor 'blk.0.attn_q.weight.lora_c' has unexpected suffix"),
    ({"rename": {"blk.0.attn_q.weight.lora_a": "blk.9.attn_q.weight.lora_a",
                 "blk.0.attn_q.weight.lora_b": "blk.9.attn_q.weight.lora_b"}},
     "LoRA tensor 'blk.9.attn_q.weight' does not exist in base model"),
    ({"shapes": {"blk.0.attn_q.weight.lora_b": (8, 128)}}, "tensor 'blk.0.attn_q.weight' has incorrect shape"),
    ({"shapes": {"blk.0.attn_q.weight.lora_a": (256, 4)}}, "lora_a tensor is not transposed"),
])
def test_bad_adapters_are_refused_as_llama_cpp_refuses_them(tmp_path, changes, message):
    """llama_adapter_lora_init_impl's checks, each one line naming the file."""
    path = _bad_adapter(tmp_path, **changes)
    with pytest.raises(AdapterRefused) as e:
        plan("tiny-llama", (path, 1.0))
    assert message in str(e.value) and str(e.value).startswith(path)


def test_bad_adapters_are_refused_by_llama_cpp_too(tmp_path):
    """The same refusal in real llama.cpp (llama_adapter_lora_init returns NULL with its reason)."""
    from schedplan.backends.llama_cpp_run import RunError, available, run
    if not available():
        pytest.skip("llama-cpp-python is not installed")
    path = _bad_adapter(tmp_path, shapes={"blk.0.attn_q.weight.lora_b": (8, 128)})
    with pytest.raises(RunError, match="tensor 'blk.0.attn_q.weight' has incorrect shape"):
        run(str(model_path("tiny-llama")), Params(n_ctx=4096, lora=((path, 1.0),)))


def test_lora_flags_in_command_line_order():
    """--lora and --lora-scaled push adapters in command-line order, comma-separated lists included
    (common/arg.cpp), on schedplan's flags and on a llama-server command line alike."""
    from schedplan.cli.llama_server import ServerArgsError, parse
    from schedplan.cli.options import parse_params

    p = parse_params(["--lora-scaled", "a.gguf:0.5,b.gguf:2", "--lora", "c.gguf", "--lora-init-without-apply"])
    assert p.lora == (("a.gguf", 0.5), ("b.gguf", 2.0), ("c.gguf", 1.0)) and p.lora_init_without_apply
    server = parse(["-m", "m.gguf", "--lora", "c.gguf,d.gguf", "--lora-scaled", "a.gguf:0.25"], environ={})
    assert server.params.lora == [("c.gguf", 1.0), ("d.gguf", 1.0), ("a.gguf", 0.25)]
    with pytest.raises(ServerArgsError, match="lora-scaled format: FNAME:SCALE"):
        parse(["-m", "m.gguf", "--lora-scaled", "a.gguf"], environ={})


def _serve_and_plan(args: list[str], n_rpc: int) -> tuple[str, dict]:
    """The real llama-server's log for llama-server ARGS (-v, on n_rpc loopback RPC servers), and what
    `reserve -- llama-server ARGS` plans of the same command."""
    from fixtures.llama_build import bin_dir
    from fixtures.server_fit_golden import run_server
    from schedplan.backends.rpc_server import rpc_servers

    binary = bin_dir() / "llama-server"
    if not binary.exists():
        pytest.skip(f"{binary} not built (python fixtures/llama_build.py)")
    with rpc_servers(n_rpc) as endpoints:
        rpc = ["--rpc", ",".join(endpoints)] if endpoints else []
        text = run_server([str(binary), *args, *rpc, "-v", "--host", "127.0.0.1", "--port", "0"])
        res = CliRunner().invoke(reserve_cmd, ["--device", "none", "--json", "--", "llama-server", *args, *rpc])
    assert "llama_server: listening on" in text, text[-2000:]
    assert res.exit_code == 0, res.output
    return text, json.loads(res.stdout)


def _server_log(text: str) -> dict:
    """llama-server's LoRA buffer lines (buffer type, MiB; one per adapter and buffer type), and the two
    reservations: the context's, then the warm-up's with the adapters (compute buffers in MiB as
    logged, graph nodes and splits)."""
    lora = sorted(re.findall(r"llama_adapter_lora_init_impl:\s+(\S+) LoRA buffer size =\s+([\d.]+) MiB", text))
    reservations = []
    for part in text.split("sched_reserve: reserving ...")[1:]:
        compute = dict(re.findall(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB", part))
        m = re.search(r"sched_reserve: graph: nodes = (\d+), splits = (\d+)", part)
        reservations.append((compute, (int(m.group(1)), int(m.group(2)))))
    return {"lora": lora, "reservations": reservations}


@pytest.mark.live
@pytest.mark.parametrize("model,adapters,n_rpc,flags", [
    ("tiny-llama", [("qv", 8, None), ("all", 16, "0.5")], 0, ["-c", "4096", "-np", "1"]),
    ("tiny-llama", [("all", 16, None)], 1, ["-c", "4096", "-ngl", "2", "-fa", "off"]),
    ("tiny-qwen3moe", [("experts", 8, None), ("qv", 4, "2")], 2, ["-c", "2048", "-ngl", "99", "-ts", "3,1"]),
    ("tiny-gemma3", [("all", 8, None)], 0, ["-c", "4096", "-ub", "64"]),
])
def test_the_adapters_equal_llama_servers(model, adapters, n_rpc, flags):
    """The real llama-server with --lora/--lora-scaled (-fit off): the adapters' buffers it logs, its
    context's reservation and the warm-up's reservation with the adapters applied equal what
    `reserve -- llama-server ...` plans (MiB to two decimals as logged; the bytes are verify's)."""
    args = ["-m", str(model_path(model)), "-fit", "off", *flags]
    for targets, rank, scale in adapters:
        path = str(lora_path(model, rank, targets))
        args += ["--lora", path] if scale is None else ["--lora-scaled", f"{path}:{scale}"]
    text, r = _serve_and_plan(args, n_rpc)
    real = _server_log(text)
    assert sorted((k, f"{v / MiB:.2f}") for a in r["lora"]["adapters"] for k, v in a["buffers"].items()) == real["lora"]
    (before, graph_before), (after, graph_after) = real["reservations"]
    assert {k: f"{v / MiB:.2f}" for k, v in r["lora"]["compute_buffers_before"].items()} == before
    assert {k: f"{v / MiB:.2f}" for k, v in r["compute_buffers"].items()} == after
    assert (r["graphs"]["pp"]["nodes"], r["graphs"]["pp"]["splits"]) == graph_after
    assert graph_after[0] > graph_before[0]


def test_control_vector_tensors_per_layer():
    """llama_adapter_cvec::init: one n_embd f32 tensor for each layer but the first, in the layer's
    buffer type (all CPU here: tiny-gemma3 has 6 layers of n_embd 256); the graphs add those of the
    layer range to each layer's output (one ADD per layer), reserved again."""
    base = plan("tiny-gemma3")
    r = plan("tiny-gemma3", control_vectors=((str(cvec_path("tiny-gemma3")), 1.0),))
    c = r["control_vector"]
    assert c["applied"] and c["layer_range"] == [1, 6] and c["buffers"] == {"CPU": 5 * 256 * 4}
    assert r["graphs"]["pp"]["nodes"] == base["graphs"]["pp"]["nodes"] + 5
    r = plan("tiny-gemma3", control_vectors=((str(cvec_path("tiny-gemma3")), 1.0),), control_vector_layer_start=2,
             control_vector_layer_end=3)
    assert r["control_vector"]["buffers"] == {"CPU": 5 * 256 * 4}      # every layer's tensor, whatever the range
    assert r["graphs"]["pp"]["nodes"] == base["graphs"]["pp"]["nodes"] + 2


def test_control_vectors_on_the_host_buffer_type_of_the_cpu_layers():
    """select_buft(il): a layer on the GPU keeps its vector in the GPU's buffer type; a CPU layer in
    the first device's host buffer type (CUDA_Host), which supports the add, before the CPU's."""
    r = plan("tiny-gemma3", control_vectors=((str(cvec_path("tiny-gemma3")), 1.0),), n_gpu_layers=3,
             devices=("cuda:1GiB:cc=8.9",))
    assert r["control_vector"]["buffers"] == {"CUDA0": 2 * 1024, "CUDA_Host": 3 * 1024}


def test_control_vectors_llama_cpp_cannot_apply_are_warnings(tmp_path):
    """A vector of another width: llama_set_adapter_cvec logs "control vector n_embd does not match
    model" and common_init_from_params returns (no LoRA applied, no warm-up): the server runs without
    them, as the real llama-server does (test_the_adapters_equal_llama_servers)."""
    bad = str(write_cvec_gguf("tiny-gemma3", tmp_path / "bad.gguf", n_embd=128))
    lora = str(lora_path("tiny-gemma3", 4, "qv"))
    r = plan("tiny-gemma3", (lora, 1.0), control_vectors=((bad, 1.0),))
    assert r["warnings"] == ["control vector n_embd does not match model"]
    assert not r["control_vector"]["applied"] and not r["lora"]["applied"]
    assert r["compute_buffers"] == plan("tiny-gemma3")["compute_buffers"]


@pytest.mark.live
@pytest.mark.parametrize("model,n_rpc,flags", [
    ("tiny-gemma3", 0, ["-c", "4096", "-np", "1"]),
    ("tiny-llama", 1, ["-c", "4096", "-ngl", "1", "--control-vector-layer-range", "1", "1"]),
    ("tiny-qwen3moe", 2, ["-c", "2048", "-ngl", "99", "-ts", "3,1", "--lora", "LORA"]),
])
def test_the_control_vectors_equal_llama_servers(model, n_rpc, flags):
    """The real llama-server with --control-vector-scaled (-fit off): its context's reservation and
    the warm-up's with the vectors (and an adapter) added equal `reserve -- llama-server ...`."""
    flags = [str(lora_path(model, 4, "qv")) if f == "LORA" else f for f in flags]
    args = ["-m", str(model_path(model)), "-fit", "off", *flags, "--control-vector-scaled",
            f"{cvec_path(model)}:0.8"]
    text, r = _serve_and_plan(args, n_rpc)
    real = _server_log(text)
    assert r["control_vector"]["applied"]
    (before, graph_before), (after, graph_after) = real["reservations"][:2]
    assert {k: f"{v / MiB:.2f}" for k, v in r["control_vector"]["compute_buffers_before"].items()} == before
    assert {k: f"{v / MiB:.2f}" for k, v in r["compute_buffers"].items()} == after
    assert (r["graphs"]["pp"]["nodes"], r["graphs"]["pp"]["splits"]) == graph_after


def test_an_output_head_llama_cpp_multiplies_plainly_takes_no_adapter(tmp_path):
    """deepseek2.cpp (and deepseek32, bailingmoe3, dots3note, kimi-linear) multiply the lm_head with a
    plain ggml_mul_mat: an adapter of output.weight is loaded (its buffer) but never in the graphs, so
    nothing is reserved again for it (verified against llama.cpp on tiny-deepseek3, with attn_output
    and ffn_up adapters beside: equal)."""
    from fixtures.make_gguf import write_lora_gguf
    path = str(write_lora_gguf("tiny-deepseek3", tmp_path / "out.gguf", 8, ("output.weight",), 16.0))
    base, r = plan("tiny-deepseek3"), plan("tiny-deepseek3", (path, 1.0))
    assert r["lora"]["applied"] and r["lora"]["adapters"][0]["n_tensors"] == 2
    assert r["graphs"]["pp"]["nodes"] == base["graphs"]["pp"]["nodes"]
    assert r["compute_buffers"] == base["compute_buffers"]


def test_an_adapter_of_a_weight_multiplied_plainly_and_undeclared_is_refused(tmp_path, monkeypatch):
    """A builder's plain matmul of a weight that does not say llama.cpp multiplies it plainly too
    (GraphContext.mul_mat_no_lora) may be a build_lora_mm in llama.cpp: with an adapter of that
    weight the plan is refused in one line, never a guess. (deepseek2's attn_q_a is declared, and
    its goldens show llama.cpp reads no adapter there: planned.)"""
    from fixtures.make_gguf import write_lora_gguf
    from schedplan.planner import ggml
    from schedplan.planner.graph import GraphContext
    path = str(write_lora_gguf("tiny-deepseek3", tmp_path / "q.gguf", 8, ("blk.*.attn_q_a.weight",), 16.0))
    assert plan("tiny-deepseek3", (path, 1.0))["lora"]["applied"]
    monkeypatch.setattr(GraphContext, "mul_mat_no_lora", lambda self, w, cur: ggml.mul_mat(w, cur))
    with pytest.raises(NotImplementedError, match="LoRA adapter of blk.0.attn_q_a.weight on a deepseek2 model"):
        plan("tiny-deepseek3", (path, 1.0))


@pytest.mark.parametrize("model", ["tiny-t5", "tiny-bert"])
def test_an_encoders_warm_up_past_its_ubatch_aborts_as_in_llama_cpp(model):
    """The warm-up that runs the adapters' re-reserve encodes BOS and EOS in one ubatch (t5 through
    llama_encode, a context without memory through llama_decode): with -ub 1 llama.cpp aborts
    (GGML_ASSERT "encoder requires n_ubatch >= n_tokens"), and so the plan says, in one line."""
    from schedplan.backends.llama_cpp_run import RunError, available, run
    from schedplan.planner.ggml import GGMLAbort
    params = Params(n_ctx=512, n_ubatch=1, lora=((str(lora_path(model, 8, "blocks")), 1.0),))
    with pytest.raises(GGMLAbort, match="encodes 2 tokens in one ubatch of 1"):
        reserve(str(model_path(model)), params)
    assert plan(model, (str(lora_path(model, 8, "blocks")), 1.0), n_ubatch=2)["lora"]["applied"]
    if available():
        with pytest.raises(RunError, match="encoder requires n_ubatch >= n_tokens"):
            run(str(model_path(model)), params)


def test_a_control_vector_cut_short_is_a_warning(tmp_path):
    """common_control_vector_load reads the file with its data (gguf_init_from_file, no_alloc false):
    a file whose data section is cut short fails there ("failed to load control vector file"), so
    llama-server runs without it (the executor's gguf-py read fails alike: not applied)."""
    data = cvec_path("tiny-gemma3").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:-1])
    r = plan("tiny-gemma3", control_vectors=((str(path), 1.0),))
    assert r["warnings"] == [f"failed to load control vector file from {path}", "no valid control vector files passed"]
    assert not r["control_vector"]["applied"]
    assert r["graphs"]["pp"]["nodes"] == plan("tiny-gemma3")["graphs"]["pp"]["nodes"]


def test_fit_counts_no_adapter():
    """common_fit_params knows no adapters (common/fit.cpp) and llama-server fits before loading them:
    `fit` with --lora and --control-vector picks what it picks without them (here: -ngl 5, tiny-gemma3's
    layers 2..5 and its output layer on a 24 MiB device)."""
    from schedplan.cli.fit import fit

    model = str(model_path("tiny-gemma3"))
    args = [model, "-c", "4096", "--device", "cuda:24MiB:cc=8.9", "-fitt", "0", "--json"]
    plain = json.loads(CliRunner().invoke(fit, args).stdout)
    adapted = json.loads(CliRunner().invoke(fit, args + ["--lora", str(lora_path("tiny-gemma3", 8, "all")),
                                                         "--control-vector", str(cvec_path("tiny-gemma3"))]).stdout)
    assert plain["args"] == "-c 4096 -ngl 5"
    # the host's available RAM moves between two runs
    assert {k: v for k, v in adapted.items() if k != "host_ram"} == {k: v for k, v in plain.items() if k != "host_ram"}
    assert adapted["host_ram"]["needed"] == plain["host_ram"]["needed"]
