"""`schedplan reserve` from the command line: the table, --json, --tensors, and one-line errors.

Fast and offline: the bundled tiny-llama header and small generated or damaged copies of it; no
llama.cpp. Most cases go through click's CliRunner (in process); a few run the installed command in
a real subprocess, where click's standalone error handling and the exit status are the real ones.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from schedplan.cli.main import cli
from schedplan.planner.gguf import read_header
from schedplan.planner.models import SUPPORTED_ARCHS

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "fixtures" / "gguf" / "tiny-llama.gguf"
SCHEMA_KEYS = {"schema", "model", "params", "compute_buffers", "graphs", "kv_buffers", "output_buffers",
               "model_buffers"}


def invoke(*args) -> Result:
    return CliRunner().invoke(cli, ["reserve", *map(str, args)])


def schedplan_command() -> list[str]:
    """The installed console script next to this interpreter, else the same entry point through -c."""
    exe = Path(sys.executable).with_name("schedplan")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from schedplan.cli.console import main; sys.argv[0] = 'schedplan'; main()"]


def run_schedplan(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*schedplan_command(), "reserve", *map(str, args)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(exit_code: int, stdout: str, stderr: str, *needles: str) -> str:
    """A non-zero exit, nothing on stdout, exactly one line on stderr starting with "error:", no
    traceback; the line contains every needle (case-insensitive). Returns the line."""
    assert exit_code != 0, stdout
    assert "Traceback" not in stdout + stderr, stderr
    assert stdout == "", stdout
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("error: "), line
    for needle in needles:
        assert needle.lower() in line.lower(), (needle, line)
    return line


def assert_cli_error(res, *needles: str) -> str:
    # an exception other than SystemExit escaped the command: that is a traceback for the user
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    return assert_one_line_error(res.exit_code, res.stdout, res.stderr, *needles)


# ------------------------------------------------------------------------------------------ success

def test_table_on_the_bundled_header():
    res = invoke(TINY, "-c", "512")
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    out = res.stdout
    for text in ("buffer type", "model MiB", "KV MiB", "output MiB", "compute MiB", "total bytes",
                 "n_tokens", "nodes", "splits", "llama, 2 layers"):
        assert text in out, text
    data = json.loads(invoke(TINY, "-c", "512", "--json").stdout)
    total = sum(sum(data[key].values()) for key in ("model_buffers", "kv_buffers", "output_buffers",
                                                     "compute_buffers"))
    total_row = next(line for line in out.splitlines() if line.startswith("total"))
    assert total_row.split()[-1] == f"{total:,}"


def test_json_schema_keys():
    res = invoke(TINY, "-c", "512", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert SCHEMA_KEYS <= set(data)
    assert "tensors" not in data
    assert data["schema"] == "schedplan.reserve/1"
    assert data["model"]["arch"] == "llama" and data["params"]["n_ctx"] == 512
    assert set(data["graphs"]) == {"pp", "tg"}
    for key in ("compute_buffers", "kv_buffers", "output_buffers", "model_buffers"):
        assert data[key] and all(isinstance(v, int) and v > 0 for v in data[key].values()), key


@pytest.mark.parametrize("graph", ["pp", "tg"])
def test_json_tensors_lie_inside_their_compute_buffer(graph):
    res = invoke(TINY, "-c", "512", "--json", "--tensors", "--graph", graph)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert SCHEMA_KEYS | {"tensors"} <= set(data)
    compute = data["compute_buffers"]
    weights = {t.name for t in read_header(TINY).tensors}

    def is_compute(row) -> bool:
        """Allocated by the graph allocator: not a weight, not the KV cache (nor a view of those)."""
        base = row["view_of"] or row["name"]
        return row["buffer"] in compute and base not in weights and not base.startswith("cache_")

    rows = data["tensors"]
    compute_rows = [r for r in rows if is_compute(r)]
    assert len(compute_rows) > 20
    for r in compute_rows:
        assert r["offset"] is not None and r["offset"] >= 0, r
        assert r["offset"] + r["size"] <= compute[r["buffer"]], r
    peak = [r for r in rows if r["at_peak"]]
    assert peak, "no tensor is marked at_peak"
    assert all(is_compute(r) for r in peak)
    if graph == "pp":
        assert max(r["ne"][1] for r in compute_rows) == data["graphs"]["pp"]["n_tokens"]


def test_subprocess_table_and_json():
    proc = run_schedplan(TINY, "-c", "512")
    assert proc.returncode == 0, proc.stderr
    assert "compute MiB" in proc.stdout and "Traceback" not in proc.stderr
    proc = run_schedplan(TINY, "-c", "512", "--json")
    assert proc.returncode == 0, proc.stderr
    assert SCHEMA_KEYS <= set(json.loads(proc.stdout))


def test_the_command_exits_as_click_does_in_process():
    """The console script skips the interpreter's teardown (cli/console.py): its output, status and
    errors are click's in-process ones, the output complete through a pipe, exit handlers run."""
    args = (TINY, "-c", "512", "--device", "none", "--tensors")
    proc = run_schedplan(*args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, invoke(*args).stdout, "")
    proc = run_schedplan(TINY, "-c", "-5")
    in_process = CliRunner().invoke(cli, ["reserve", str(TINY), "-c", "-5"], prog_name="schedplan")
    assert (proc.returncode, proc.stderr) == (2, assert_cli_error(in_process) + "\n")
    handler = ("import atexit, sys; from schedplan.cli.console import main; atexit.register(print, 'handler ran'); "
               f"sys.argv = ['schedplan', 'reserve', {str(TINY)!r}, '--device', 'none']; main()")
    proc = subprocess.run([sys.executable, "-c", handler], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.endswith("\nhandler ran\n"), proc.stdout[-200:]


# ------------------------------------------------------------------------------------------- errors

def _tiny_bytes() -> bytes:
    return TINY.read_bytes()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def write_header(path: Path, arch: str, metadata: dict, tensors: bool = True) -> Path:
    """A small header written with gguf.GGUFWriter (arbitrary architecture and key types):
    metadata maps key -> (value, GGUFValueType), a list value being an array of that type."""
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    writer = GGUFWriter(path, arch)
    for key, (value, vtype) in metadata.items():
        if isinstance(value, list):
            writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=vtype)
        else:
            writer.add_key_value(key, value, vtype)
    if tensors:
        writer.add_tensor_info("token_embd.weight", (1024, 256), np.dtype(np.float32), 1024 * 256 * 4,
                               raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


def _llama_keys(**changes) -> dict:
    from gguf import GGUFValueType as T
    keys = {"llama.block_count": (2, T.UINT32), "llama.context_length": (512, T.UINT32),
            "llama.embedding_length": (256, T.UINT32), "llama.attention.head_count": (4, T.UINT32),
            "llama.feed_forward_length": (512, T.UINT32)}
    keys.update({f"llama.{k.replace('__', '.')}": v for k, v in changes.items()})
    return keys


def test_missing_file(tmp_path):
    assert_cli_error(invoke(tmp_path / "missing.gguf"), "missing.gguf", "no such file")


def test_directory(tmp_path):
    assert_cli_error(invoke(tmp_path), "directory")


def test_empty_file(tmp_path):
    assert_cli_error(invoke(_write(tmp_path / "empty.gguf", b"")), "empty.gguf", "empty")


def test_bad_magic(tmp_path):
    path = _write(tmp_path / "magic.gguf", b"GGML" + _tiny_bytes()[4:])
    assert_cli_error(invoke(path), "magic.gguf", "not a GGUF file")


def test_truncated_header_at_several_points(tmp_path):
    data = _tiny_bytes()
    header = read_header(TINY)
    inside = header.data_offset - header.alignment - 1      # before the end of the tensor infos
    cuts = sorted({1, 3, 4, 6, 8, 12, 16, 20, 24, 40, 200, inside // 4, inside // 2, 3 * inside // 4, inside})
    path = tmp_path / "cut.gguf"
    for n in cuts:
        path.write_bytes(data[:n])
        line = assert_cli_error(invoke(path), "cut.gguf")
        assert any(w in line for w in ("truncated", "does not fit", "not a GGUF", "absurd")), (n, line)


@pytest.mark.parametrize("field,what", [(8, "tensor count"), (16, "key-value count")])
def test_absurd_counts(tmp_path, field, what):
    data = bytearray(_tiny_bytes())
    for count in (1 << 40, (1 << 63) - 1, -1):
        struct.pack_into("<q", data, field, count)
        path = _write(tmp_path / "absurd.gguf", bytes(data))
        assert_cli_error(invoke(path), f"absurd {what}")


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    from gguf import GGUFValueType as T
    path = write_header(tmp_path / "m.gguf", "gpt7", {
        "gpt7.block_count": (12, T.UINT32), "gpt7.context_length": (1024, T.UINT32),
        "gpt7.embedding_length": (768, T.UINT32), "gpt7.attention.head_count": (12, T.UINT32)})
    line = assert_cli_error(invoke(path), "architecture 'gpt7' is not supported: llama.cpp does not know it either")
    for arch in SUPPORTED_ARCHS:
        assert f" {arch}," in line or line.endswith(f" {arch})"), line


def test_every_llama_cpp_architecture_is_planned_or_refused_with_its_reason(tmp_path):
    """LLM_ARCH_NAMES as the vendored llama-arch.cpp holds it: each name is planned, or a file of it
    is refused in one line saying why. Prints the refused ones (pytest -rP shows them)."""
    import re

    from fixtures.llama_build import source
    from gguf import GGUFValueType as T
    from schedplan.planner.arch import LLM_ARCH_NAMES, LLM_ARCH_WITHOUT_MODEL
    text = (source() / "src" / "llama-arch.cpp").read_text()
    table = text[text.index("LLM_ARCH_NAMES = {"):]
    assert LLM_ARCH_NAMES == tuple(re.findall(r'\{\s*LLM_ARCH_\w+,\s*"([^"]+)"\s*\}', table[:table.index("};")]))
    # the names llama_model_mapping builds no model for (its switch's cases, read from the source)
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+),\s*"([^"]+)"\s*\}', table[:table.index("};")]))
    model = (source() / "src" / "llama-model.cpp").read_text()
    mapping = model[model.index("static llama_model * llama_model_mapping("):model.index("llama_model * llama_model_create(")]
    mapped = set(re.findall(r"case (LLM_ARCH_\w+):", mapping))
    assert LLM_ARCH_WITHOUT_MODEL == tuple(n for e, n in names.items() if e not in mapped and e != "LLM_ARCH_UNKNOWN")
    refused = [a for a in LLM_ARCH_NAMES if a not in SUPPORTED_ARCHS]
    for arch in refused:
        path = write_header(tmp_path / "m.gguf", arch, {f"{arch}.block_count": (2, T.UINT32)})
        line = assert_cli_error(invoke(path), f"architecture '{arch}' is not supported: ")
        print(f"{arch:18}", line.split("is not supported: ", 1)[1].split(" (supported:")[0])
    print(f"{len(SUPPORTED_ARCHS)} of {len(LLM_ARCH_NAMES)} planned, {len(refused)} refused")


def test_gptj_is_refused_as_llama_cpp_refuses_it(tmp_path):
    """gptj is in LLM_ARCH_NAMES but llama_model_mapping builds no model for it: real llama.cpp
    refuses such a file before reading its keys ("unsupported model architecture: 'gptj'")."""
    from gguf import GGUFValueType as T
    path = write_header(tmp_path / "gptj.gguf", "gptj", {
        "gptj.block_count": (28, T.UINT32), "gptj.context_length": (2048, T.UINT32),
        "gptj.embedding_length": (4096, T.UINT32), "gptj.attention.head_count": (16, T.UINT32)})
    assert_cli_error(invoke(path), "architecture 'gptj' is not supported", "cannot load it either",
                     "unsupported model architecture: 'gptj'")


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-falcon", "tiny-llama-embed"])
def test_partial_rope_refused_where_llama_cpp_refuses_it(tmp_path, model):
    """llama_model_base::load_hparams throws 'invalid n_rot' for llama (and deci, falcon,
    llama-embed) when rope.dimension_count is not the head size."""
    import copy

    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = copy.deepcopy(load_config(model))
    specs = tensor_specs(config)
    arch = config["metadata"]["general.architecture"]
    config["metadata"][f"{arch}.rope.dimension_count"] = 32
    path = tmp_path / "n_rot.gguf"
    _write_header(config, path, specs)
    assert_cli_error(invoke(path, "-c", "4096"), "invalid n_rot: 32, expected 64")


def test_t5_decoder_longer_than_encoder_refused_as_llama_cpp_refuses_it(tmp_path):
    """llama_model_t5 places each decoder block by pimpl->dev_layer.at(bid), sized by block_count:
    a t5.decoder_block_count above it fails the load (seen: 'vector::_M_range_check: __n (which is
    4) >= this->size() (which is 4)' with tiny-t5's 4 blocks and 5 decoder blocks)."""
    import copy

    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = copy.deepcopy(load_config("tiny-t5"))
    config["metadata"]["t5.decoder_block_count"] = 4
    specs = tensor_specs(config)
    config["metadata"]["t5.decoder_block_count"] = 5
    path = tmp_path / "t5-dec5.gguf"
    _write_header(config, path, specs)
    assert_cli_error(invoke(path, "-c", "4096"), "t5.decoder_block_count is 5, more than the 4 blocks",
                     "fails to load")


@pytest.mark.parametrize("model", ["tiny-t5", "tiny-t5encoder"])
def test_t5_without_relative_position_bias_refused_as_llama_cpp_crashes(tmp_path, model):
    """attn_rel_b is optional at load, but build_pos_bias reads layer 0's when a layer has none:
    without any, real llama.cpp dies of SIGSEGV building the reserve graph (seen, tiny-t5)."""
    import copy

    from fixtures.make_gguf import load_config, write_gguf
    config = copy.deepcopy(load_config(model))
    config["optional_tensors"] = [g for g in config["optional_tensors"] if "attn_rel_b" not in g]
    path = write_gguf(config, tmp_path / "no-rel-b.gguf", header_only=True)
    assert_cli_error(invoke(path, "-c", "4096"), "llama.cpp would crash", "layer 0 has no relative position bias")


def test_mpt_qk_norm_aborts_as_llama_cpp_does(tmp_path):
    """mpt.cpp reshapes Q and K, views of the fused QKV product, to 2-D before their LayerNorms:
    ggml_reshape_2d's GGML_ASSERT(ggml_is_contiguous(a)) aborts real llama.cpp on a file with
    attn_q_norm (seen: ggml.c:3738 with this file; mpt.cpp's FIXME says so too)."""
    import copy

    from fixtures.make_gguf import load_config, write_gguf
    config = copy.deepcopy(load_config("tiny-mpt"))
    config["optional_tensors"] += ["blk.*.attn_q_norm.weight", "blk.*.attn_k_norm.weight"]
    config["metadata"]["mpt.attention.head_count_kv"] = 4
    path = write_gguf(config, tmp_path / "mpt-qk-norm.gguf", header_only=True)
    assert_cli_error(invoke(path, "-c", "4096"), "llama.cpp would abort", "ggml_is_contiguous", "Qcur-0")


def test_plm_flash_attention_aborts_as_llama_cpp_does():
    """plm.cpp hands build_attn its V as a flat [n_embd_head_v * n_head, n_tokens] view; the
    untransposed (flash attention) cache copy, cpy_v, reads that as n_tokens heads of one token and
    flattens it to a single row, and ggml_set_rows' GGML_ASSERT(a->ne[0] == b->ne[0]) aborts real
    llama.cpp for any batch of more than one token (seen: ggml.c:4014 on tiny-plm at -c 4096 with
    flash attention auto, the default, and on). With -fa off it builds (fixtures/golden.py FA_OFF)."""
    from fixtures.make_gguf import header_path
    path = header_path("tiny-plm")
    for flags in [(), ("-fa", "on")]:
        assert_cli_error(invoke(path, "-c", "4096", *flags), "llama.cpp would abort",
                         "GGML_ASSERT(a->ne[0] == b->ne[0])", "rows of 131072 values from 'v_states-0 (view)'", "'cache_v_l0', whose rows hold 256")
    assert invoke(path, "-c", "4096", "-fa", "off").exit_code == 0


@pytest.mark.parametrize("change,needles", [
    ({"block_count": ("two", "str")}, ("llama.block_count", "wrong type str", "u32")),
    ({"embedding_length": ([256, 256], "u32")}, ("llama.embedding_length", "wrong type arr", "u32")),
    ({"attention__head_count": (["a", "b"], "str")}, ("llama.attention.head_count", "element type str")),
    ({"rope__freq_base": ("x", "str")}, ("llama.rope.freq_base", "wrong type str", "f32")),
    ({"block_count": (0, "u32")}, ("block_count", "is 0", "1..512")),
])
def test_malformed_hyperparameters(tmp_path, change, needles):
    from gguf import GGUFValueType as T
    types = {"str": T.STRING, "u32": T.UINT32}
    path = write_header(tmp_path / "bad.gguf", "llama",
                        _llama_keys(**{k: (v, types[t]) for k, (v, t) in change.items()}))
    assert_cli_error(invoke(path), *needles)


def test_quantized_v_cache_without_flash_attention():
    assert_cli_error(invoke(TINY, "-fa", "off", "-ctv", "q8_0"), "q8_0", "flash attention", "-fa")


def test_too_many_sequences():
    assert_cli_error(invoke(TINY, "-np", "300"), "300", "256")


def test_unknown_option_is_one_line():
    assert_cli_error(invoke(TINY, "--no-such-flag"), "--no-such-flag", "--help")


@pytest.mark.parametrize("make,args,needles", [
    (lambda tmp: tmp / "missing.gguf", (), ("missing.gguf",)),
    (lambda tmp: tmp, (), ("directory",)),
    (lambda tmp: _write(tmp / "magic.gguf", b"GGML" + _tiny_bytes()[4:]), (), ("not a GGUF file",)),
    (lambda tmp: TINY, ("-np", "300"), ("300",)),
    (lambda tmp: TINY, ("-fa", "off", "-ctv", "q8_0"), ("q8_0",)),
])
def test_subprocess_errors(tmp_path, make, args, needles):
    proc = run_schedplan(make(tmp_path), *args)
    assert proc.returncode == 2
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, *needles)


def test_expert_layer_without_an_expert_size(tmp_path):
    """nemotron_h_moe sizes a layer's experts by expert_feed_forward_length or n_ff / n_expert_used:
    with neither (a per-layer used count of 0), llama.cpp divides by zero; we refuse in one line."""
    import copy

    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = load_config("tiny-nemotron-h-moe")
    bad = copy.deepcopy(config)
    del bad["metadata"]["nemotron_h_moe.expert_feed_forward_length"]
    bad["metadata"]["nemotron_h_moe.expert_used_count"] = [2, 0, 2, 2, 2]
    path = tmp_path / "bad.gguf"
    _write_header(bad, path, tensor_specs(config))
    assert_cli_error(invoke(path), "layer 1 declares neither expert_feed_forward_length nor expert_used_count")


@pytest.mark.parametrize("endpoint", [":", "host", "host:", "host:x", "host:99999999999", "a:1,b"])
def test_rpc_endpoint_that_ggml_rpc_cannot_parse(endpoint):
    assert_cli_error(invoke(TINY, "--rpc", endpoint), "--rpc", "is not HOST:PORT")


def test_rpc_takes_llama_cpps_comma_separated_servers():
    one_flag = json.loads(invoke(TINY, "-ngl", "99", "--rpc", "127.0.0.1:1,127.0.0.1:2", "--json").output)
    two_flags = json.loads(invoke(TINY, "-ngl", "99", "--rpc", "127.0.0.1:1", "--rpc", "127.0.0.1:2", "--json").output)
    assert one_flag == two_flags
    assert {"RPC0[127.0.0.1:1]", "RPC0[127.0.0.1:2]"} <= set(one_flag["model_buffers"])


def test_graph_assert_llama_cpp_would_hit_is_one_line(tmp_path):
    """olmoe's K norm spans n_embd, so a GQA header loads but llama.cpp's graph aborts on
    GGML_ASSERT(ggml_can_repeat(b, a)) (seen with real llama.cpp): the plan refuses it in one line."""
    import copy

    from fixtures.make_gguf import load_config, write_gguf
    config = copy.deepcopy(load_config("tiny-olmoe"))
    config["metadata"]["olmoe.attention.head_count_kv"] = 2
    path = write_gguf(config, tmp_path / "gqa.gguf", header_only=True)
    assert_cli_error(invoke(path), "ggml_can_repeat", "blk.0.attn_k_norm.weight")


def test_exaone_converted_with_todays_key_is_refused_in_one_line(tmp_path):
    """Today's conversion/exaone.py writes attention.layer_norm_epsilon where llama_model_exaone
    requires attention.layer_norm_rms_epsilon: llama.cpp refuses such a file (seen), so does the plan."""
    import copy

    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = copy.deepcopy(load_config("tiny-exaone"))
    specs = tensor_specs(config)
    md = config["metadata"]
    md["exaone.attention.layer_norm_epsilon"] = md.pop("exaone.attention.layer_norm_rms_epsilon")
    path = tmp_path / "exaone.gguf"
    _write_header(config, path, specs)
    assert_cli_error(invoke(path), "key not found in model: exaone.attention.layer_norm_rms_epsilon")


def test_qwen_converted_with_todays_keys_is_refused_in_one_line(tmp_path):
    """conversion/qwen.py's QwenModel no longer writes its own keys: TextModel's defaults give
    attention.layer_norm_epsilon (from Qwen's layer_norm_epsilon) where llama_model_qwen requires
    attention.layer_norm_rms_epsilon: llama.cpp refuses such a file (seen), so does the plan."""
    import copy

    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = copy.deepcopy(load_config("tiny-qwen"))
    specs = tensor_specs(config)
    md = config["metadata"]
    md["qwen.attention.layer_norm_epsilon"] = md.pop("qwen.attention.layer_norm_rms_epsilon")
    del md["qwen.rope.dimension_count"]
    path = tmp_path / "qwen.gguf"
    _write_header(config, path, specs)
    assert_cli_error(invoke(path), "key not found in model: qwen.attention.layer_norm_rms_epsilon")


def test_quantized_cache_no_block_of_which_divides_the_heads_is_refused_in_one_line():
    """phi-2's heads of 80: llama_init_from_model refuses a q8_0 cache under flash attention (auto
    turns it on for a quantized V cache; seen with real llama.cpp), so does the plan."""
    from fixtures.make_gguf import header_path
    assert_cli_error(invoke(header_path("phi-2"), "-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"),
                     "K cache type q8_0 with block size 32 does not divide n_embd_head_k=80")


def test_reshape_llama_cpp_would_abort_on_is_one_line(tmp_path):
    """gemma's build_qkv reshapes Q, K and V to heads of value_length: a header whose key_length
    differs loads, then llama.cpp aborts on ggml_reshape_3d's GGML_ASSERT on the element count
    (seen with real llama.cpp): the plan refuses it in one line."""
    import copy

    from fixtures.make_gguf import load_config, write_gguf
    config = copy.deepcopy(load_config("tiny-gemma"))
    config["metadata"]["gemma.attention.value_length"] = 64
    path = write_gguf(config, tmp_path / "kv.gguf", header_only=True)
    assert_cli_error(invoke(path), "ggml_nelements(a) == ne0*ne1", "'Qcur-0' of [384, 512, 1, 1]", "[64, 4, 512]")


@pytest.mark.parametrize("key,value,needles", [
    ("block_count", 3, ("first decode", "inp_attn_scale")),
    ("attention.sliding_window", 0, ("first decode", "f_attn_temp_scale", "sliding_window is 0")),
])
def test_llama4_that_aborts_on_the_first_decode_is_refused_in_one_line(tmp_path, key, value, needles):
    """llama.cpp reserves these llama4 headers, then aborts on the first decode setting the attention
    temperature (seen with real llama.cpp): under 4 layers no layer goes without rope, so the input
    is unallocated; with sliding_window 0 the last layer goes without rope but no temperature scale
    is set. The plan refuses both in one line."""
    import copy

    from fixtures.make_gguf import load_config, write_gguf
    config = copy.deepcopy(load_config("tiny-llama4"))
    config["metadata"][f"llama4.{key}"] = value
    path = write_gguf(config, tmp_path / "l4.gguf", header_only=True)
    assert_cli_error(invoke(path), *needles)


@pytest.mark.parametrize("model,changes,needles", [
    ("tiny-gemma-embedding", {"block_count": 1}, ("llm_graph_input_attn_no_cache::set_input", "self_kq_mask")),
    ("tiny-jamba", {"attention.head_count_kv": [0, 0, 0, 0]}, ("llm_graph_input_mem_hybrid::set_input", "attn_inp_k_idxs")),
    ("tiny-jamba", {"attention.head_count_kv": [2, 2, 2, 2]}, ("llm_graph_input_mem_hybrid::set_input", "rs_s_copy")),
    ("tiny-lfm2-swa", {"attention.head_count_kv": [2, 2, 2, 2]}, ("mem_hybrid_iswa::set_input", "rs_s_copy")),
    ("tiny-lfm2-swa", {"attention.head_count_kv": [0, 0, 0, 0]}, ("llm_graph_input_pos::set_input", "inp_pos")),
])
def test_an_input_in_no_graph_aborts_at_the_first_decode_in_one_line(tmp_path, model, changes, needles):
    """llama.cpp creates these contexts, then aborts at the first decode (GGML_ASSERT(buffer), each
    seen with real llama.cpp): every layer of the one-block gemma-embedding slides, so the full mask
    is in no graph; a hybrid of one kind of layer leaves the other half's input unused; a model of
    convolution layers only never reads its positions. The plan refuses each in one line."""
    import copy

    from fixtures.make_gguf import load_config, write_gguf
    config = copy.deepcopy(load_config(model))
    arch = config["metadata"]["general.architecture"]
    config["metadata"].update({f"{arch}.{k}": v for k, v in changes.items()})
    path = write_gguf(config, tmp_path / "m.gguf", header_only=True)
    assert_cli_error(invoke(path, "-c", "2048"), "first decode", *needles)


@pytest.mark.parametrize("changes,needles", [
    ({"block_count": 7, "posnet.block_count": 7}, ("unknown posnet layer 6",)),
    ({"posnet.block_count": 7}, ("posnet.block_count (7)", "block_count (6)")),
    ({"convnext.embedding_length": 96}, ("posnet width (128)", "convnext width (96)")),
])
def test_wavtokenizer_dec_posnet_llama_cpp_aborts_on_is_refused_in_one_line(tmp_path, changes, needles):
    """llama_model_wavtokenizer_dec::load_arch_tensors GGML_ABORTs on a posnet block past the sixth and
    asserts equal posnet and convnext widths; load_hparams asserts the posnet and convnext block
    counts are at most block_count: the plan refuses each in one line."""
    import copy

    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = copy.deepcopy(load_config("tiny-wavtokenizer-dec"))
    specs = tensor_specs(config)
    for key, value in changes.items():
        config["metadata"][f"wavtokenizer-dec.{key}"] = value
    path = tmp_path / "wt.gguf"
    _write_header(config, path, specs)
    assert_cli_error(invoke(path), "llama.cpp would abort", *needles)


def test_qwen3tts_with_a_vocabulary_below_its_codec_head_is_refused_in_one_line(tmp_path):
    """qwen3tts's lm_head is always 3072 rows (llama_model_qwen3vl::load_arch_tensors); a vocabulary
    smaller than that loads, then qwen3vl.cpp's graph aborts ("invalid case", seen with real
    llama.cpp at context creation): the plan refuses it in one line."""
    import copy

    from fixtures.make_gguf import load_config, write_gguf
    config = copy.deepcopy(load_config("tiny-qwen3tts"))
    config["vocab"]["n_vocab"] = 1024
    path = write_gguf(config, tmp_path / "tts.gguf", header_only=True)
    assert_cli_error(invoke(path), "invalid case", "3072 rows", "token_embd's 1024")


@pytest.mark.parametrize("name", ["tiny-glm4moe", "tiny-qwen35-mtp", "tiny-qwen35moe-mtp", "tiny-qwen3next-mtp",
                                  "tiny-deepseek3-mtp", "tiny-nemotron-h-moe-mtp"])
def test_a_file_of_the_mtp_blocks_alone_is_refused_in_one_line(tmp_path, name):
    """convert_hf_to_gguf.py --mtp writes the NextN blocks with the embeddings and the head only:
    the loaders take it (trunk tensors turn optional) and real llama.cpp then segfaults building
    the main graph (seen): the plan refuses it in one line instead of tracing back on a missing weight."""
    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = load_config(name)
    mtp_block = f"blk.{config['metadata'][config['metadata']['general.architecture'] + '.block_count'] - 1}."
    path = tmp_path / "mtp.gguf"
    _write_header(config, path, [s for s in tensor_specs(config) if s[0].startswith(mtp_block)
                                 or not s[0].startswith("blk.")])
    assert_cli_error(invoke(path), "only the multi-token-prediction blocks", "draft model")


@pytest.mark.parametrize("name,needles", [
    ("tiny-eagle3-shared", ("eagle3 requires ctx_other to be set", "--spec-type draft-eagle3 -md FILE")),
    ("tiny-gemma4-assistant", ("Gemma4Assistant requires ctx_other to be set", "--spec-type draft-mtp -md FILE")),
    ("tiny-dflash", ("dflash requires ctx_other to be set", "--spec-type draft-dflash -md FILE")),
])
def test_a_draft_head_that_reads_its_target_is_refused_alone_in_one_line(name, needles):
    """An EAGLE-3 head or a DFlash drafter without token_embd and output, and a Gemma 4 assistant, read their target's
    tensors (and the assistant its K/V cache) through ctx_other: real llama.cpp loads them and refuses
    their context alone ("... requires ctx_other to be set", seen: tests/test_fixtures.py and the
    assistant's refused goldens); the plan refuses it in one line naming the speculative decoding it
    needs."""
    from fixtures.make_gguf import header_path
    assert_cli_error(invoke(header_path(name), "-c", "4096"), *needles)


@pytest.mark.parametrize("key,value,needles", [
    ("attention.compress_ratios", [0, 0, 128, 128, 0, 0], ("SIGFPE", "build_input_k_rot")),
    ("attention.compress_ratios", [0, 0, 4, 128], ("compress_ratios is shorter than block_count",)),
    ("attention.compress_ratios", [0, 0, 4, 64, 4, 0], ("compression ratios 0, 4, and 128",)),
    ("expert_gating_func", 2, ("expects sqrtsoftplus",)),
    ("attention.output_group_count", 0, ("division by zero",)),
    ("hyper_connection.count", 3, ("GGML_ASSERT(hc == 4)",)),
])
def test_deepseek4_headers_llama_cpp_refuses_or_crashes_on_are_one_line(tmp_path, key, value, needles):
    """DeepSeek-V4 headers llama.cpp's loader refuses, or whose graph it cannot build: a model
    without a ratio-4 layer crashes it with a SIGFPE (seen with real llama.cpp: the indexer's empty
    cache still gets a K rotation, whose size search divides by zero), hc_mult other than 4 aborts
    it. The plan refuses each in one line."""
    import copy

    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    from schedplan.planner.hparams import UnsupportedModel
    config = load_config("tiny-deepseek4")
    bad = copy.deepcopy(config)
    bad["metadata"][f"deepseek4.{key}"] = value
    try:
        specs = tensor_specs(bad)
    except (ValueError, UnsupportedModel):   # refused keys: the valid file's tensors (layer 3's ape sized by its ratio)
        specs = [(name, (ne[0], 64) if name == "blk.3.attn_compressor_ape.weight" else ne, t)
                 for name, ne, t in tensor_specs(config)]
    path = tmp_path / "dsv4.gguf"
    _write_header(bad, path, specs)
    assert_cli_error(invoke(path), *needles)


@pytest.mark.parametrize("drop,add,needles", [
    (("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"),
     ("blk.0.attn_qkv.weight", (256, 3 * 128)), ("null pointer", "attn_qkv")),
    (("blk.3.attn_k_b.weight", "blk.3.attn_v_b.weight"), ("blk.3.attn_kv_b.weight", (96, 4 * 64)),
     ("null pointer", "attn_kv_b")),
    ((), ("blk.3.attn_kv_b.weight", (96, 4 * 64)), ("wrong number of tensors", "blk.3.attn_k_b.weight")),
])
def test_kimi_k3_files_llama_cpp_crashes_on_or_refuses_are_one_line(tmp_path, drop, add, needles):
    """Kimi-K3 tensor layouts its converter does not write: a fused attn_qkv on a KDA layer and an
    unsplit attn_kv_b on an MLA layer crash llama.cpp's graph (SIGSEGV, seen: the KDA layer reads
    attn_q, the MHA path a K/V cache input the K-only cache does not build); attn_kv_b beside
    attn_k_b/attn_v_b leaves those unused, which the loader refuses. The plan refuses each in one line."""
    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = load_config("tiny-kimi-k3")
    specs = [s for s in tensor_specs(config) if s[0] not in drop] + [(add[0], add[1], "Q8_0")]
    path = tmp_path / "k3.gguf"
    _write_header(config, path, specs)
    assert_cli_error(invoke(path), *needles)


@pytest.mark.parametrize("kv,needles", [([0] * 6, ("first decode", "no MLA layer")),
                                        ([1] * 6, ("first decode", "no KDA layer"))])
def test_kimi_k3_with_one_kind_of_layer_is_one_line(tmp_path, kv, needles):
    """A Kimi-K3 of KDA layers only, or MLA layers only, loads and reserves in llama.cpp but asserts
    at its first decode (GGML_ASSERT(buffer): the hybrid input fills the other half's unused input,
    which no graph allocated; seen with 1 KDA layer and with 2 MLA layers). The plan refuses it."""
    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    config = load_config("tiny-kimi-k3")
    config["metadata"]["kimi-k3.attention.head_count_kv"] = kv
    path = tmp_path / "k3.gguf"
    _write_header(config, path, tensor_specs(config))
    assert_cli_error(invoke(path), *needles)


@pytest.mark.parametrize("changes,needles", [
    ({"attention.head_count_kv": [0, 0, 0, 0, 0, 0, 1]}, ("first decode", "no DSA layer")),
    ({"attention.head_count_kv": [1] * 7}, ("first decode", "no KDA layer")),
    ({"attention.indexer.types": [True, False, True, False, True, True]}, ("shared indexer layer", "layer 1")),
    ({"rope.dimension_count": 32, "attention.key_length": 128}, ("nope-only", "32 rope dimensions")),
    ({"attention.indexer.kpool": 3}, ("indexer_kpool", "kpool 3, top-k 16")),
    ({"hyper_connection.count": 2}, ("dsv4_hc_mult == 4", "2 hyper-connection streams")),
])
def test_glm5_next_headers_llama_cpp_aborts_on_are_one_line(tmp_path, changes, needles):
    """GLM5-Next headers real llama.cpp aborts on (each seen): only KDA or only DSA layers (at the
    first decode, GGML_ASSERT(buffer)), a shared indexer layer before any full one, rope dimensions
    on its nope-only MLA (graph asserts), a top-k not a multiple of kpool, hc_mult != 4 (load
    asserts). The plan refuses each in one line."""
    from fixtures.make_gguf import _write_header, load_config, tensor_specs
    base = load_config("tiny-glm5-next")
    config = load_config("tiny-glm5-next")
    config["metadata"].update({f"glm5-next.{k}": v for k, v in changes.items()})
    load_time = {"attention.indexer.kpool", "hyper_connection.count"} & changes.keys()
    path = tmp_path / "g5.gguf"
    _write_header(config, path, tensor_specs(base if load_time else config))
    assert_cli_error(invoke(path), *needles)


def test_a_gemma4_assistant_beside_a_target_without_an_iswa_cache_is_one_line():
    """The assistant's cache casts its target's memory to llama_kv_cache_iswa (llama-kv-cache-iswa.cpp):
    beside a target without sliding-window layers real llama.cpp crashes (seen: `schedplan run
    tiny-llama -md tiny-gemma4-assistant` exits with SIGSEGV); the plan refuses it in one line."""
    from fixtures.make_gguf import header_path
    assert_cli_error(invoke(header_path("tiny-llama"), "-c", "4096", "-md", str(header_path("tiny-gemma4-assistant"))),
                     "would crash", "iswa")


def test_the_device_verdict_counts_the_draft_context():
    """llama-server allocates the draft model and its context after fitting, on the model's devices:
    the verdict of `reserve MODEL -md DRAFT` counts the draft's weights, KV and compute buffers per
    device, as real llama.cpp allocated them (the golden of the two-server case, recorded by
    fixtures/golden.py), beside the model's."""
    import json

    from fixtures.golden import GOLDEN_DIR, canonical_endpoint
    from fixtures.make_gguf import header_path
    golden = json.loads((GOLDEN_DIR / "tiny-gemma4+tiny-gemma4-assistant__rpc2_c_2048_ngl_99.json").read_text())
    real = golden["result"]["draft"]
    endpoints = [canonical_endpoint(i) for i in range(2)]
    res = invoke(header_path("tiny-gemma4"), *golden["case"]["flags"], "-md", header_path("tiny-gemma4-assistant"),
                 *(x for e in endpoints for x in ("--rpc", e, "--rpc-memory", f"{e}=8GiB")), "--json")
    assert res.exit_code == 0, res.output
    verdict = {d["device"]: d for d in json.loads(res.stdout)["device_memory"]}
    for i, endpoint in enumerate(endpoints):
        buft = f"RPC0[{endpoint}]"
        expected = sum(real[key].get(buft, 0) for key in ("model_buffers", "kv_buffers", "compute_buffers"))
        d = verdict[f"RPC{i}"]
        assert expected > 0 and d["draft"] == expected, (i, d, expected)
        assert d["projected_free"] == d["free"] - (d["model"] + d["context"] + d["compute"] + d["draft"])
