"""--override-kv KEY=TYPE:VALUE: parsed as common/common.cpp string_parse_kv_override and
common/arg.cpp parse_csv_row parse it, applied where src/llama-model-loader.cpp's get_key applies
it (the type the key is read as must be the override's, else validate_override warns and the file's
value stays), refused in one line where llama.cpp refuses it.

The memory these overrides give is checked against llama.cpp by the goldens (fixtures/golden.py
kv_override_matrix, fixtures/fit_golden.py and fixtures/server_fit_golden.py: "override-kv" in
their ids); the messages below are llama.cpp's, from llama-fit-params, llama-server and
llama-cpp-python runs of the same flags."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from fixtures.golden import GOLDEN_DIR
from fixtures.make_gguf import header_path, model_path
from schedplan.cli.llama_server import ServerArgsError, parse, to_params
from schedplan.cli.main import cli
from schedplan.cli.options import parse_params
from schedplan.planner.gguf import read_header
from schedplan.planner.hparams import UnsupportedModel
from schedplan.planner.model_loader import ModelLoader
from schedplan.planner.params import BadKvOverride, KvOverride, parse_csv_row, parse_kv_overrides, string_parse_kv_override
from schedplan.planner.reserve import reserve
from schedplan.planner.params import Params


@pytest.mark.parametrize("item, expected", [
    ("qwen3moe.expert_used_count=int:4", KvOverride("qwen3moe.expert_used_count", "int", 4)),
    ("a=int: -12abc", KvOverride("a", "int", -12)),          # atol: the integer prefix after white space
    ("a=int:abc", KvOverride("a", "int", 0)),
    ("a=int:99999999999999999999", KvOverride("a", "int", 2**63 - 1)),   # strtol clamps to LONG_MAX
    ("a=float:1e5", KvOverride("a", "float", 100000.0)),
    ("a=float:0x1p-2x", KvOverride("a", "float", 0.25)),     # atof: hex floats, a prefix
    ("a=float:-inf", KvOverride("a", "float", -math.inf)),
    ("a=bool:false", KvOverride("a", "bool", False)),
    ("a=str:", KvOverride("a", "str", "")),
    ("a=str:b=c:d", KvOverride("a", "str", "b=c:d")),         # the key ends at the first '='
    ("=int:1", KvOverride("", "int", 1)),                      # an empty key: it ends llama.cpp's list
    ("k" * 127 + "=str:" + "v" * 127, KvOverride("k" * 127, "str", "v" * 127)),
])
def test_string_parse_kv_override(item, expected):
    assert string_parse_kv_override(item) == expected


@pytest.mark.parametrize("item, message", [
    ("foo", "malformed KV override 'foo'"),
    ("k" * 128 + "=int:1", "malformed KV override"),          # the key must fit char key[128]
    ("a=double:1", "invalid type for KV override 'a=double:1'"),
    ("a=INT:1", "invalid type for KV override"),
    ("a=bool:1", "invalid boolean value for KV override 'a=bool:1'"),
    ("a=bool:True", "invalid boolean value"),
    ("a=str:" + "v" * 128, "value cannot exceed 127 chars"),
])
def test_what_string_parse_kv_override_refuses(item, message):
    with pytest.raises(BadKvOverride, match=message):
        string_parse_kv_override(item)


def test_parse_csv_row():
    """Commas split fields unless quoted; a quote opens a quoted field only at the field's start."""
    assert parse_csv_row('a=int:1,b=str:x') == ["a=int:1", "b=str:x"]
    assert parse_csv_row('"a=str:x,y",b=int:2') == ["a=str:x,y", "b=int:2"]
    assert parse_csv_row('a=str:"x,y"') == ['a=str:"x', 'y"']
    assert parse_csv_row('"a=str:say ""hi"""') == ['a=str:say "hi"']
    assert parse_kv_overrides('"t=str:a,b",n=int:3') == [KvOverride("t", "str", "a,b"), KvOverride("n", "int", 3)]


def test_the_flag_is_repeatable_and_comma_separated():
    p = parse_params(["--override-kv", "a=int:1,b=float:0.5", "--override-kv", "a=int:2"])
    assert p.kv_overrides == (KvOverride("a", "int", 1), KvOverride("b", "float", 0.5), KvOverride("a", "int", 2))


@pytest.mark.parametrize("value", ["foo", "a=bool:1", "a=double:1", "a=int:1,oops"])
def test_bad_overrides_are_one_line_exit_2(value):
    """llama-fit-params and llama-server refuse each of these: 'error while handling argument
    "--override-kv": error: Invalid type for KV override: ITEM', exit status 1."""
    r = CliRunner().invoke(cli, ["reserve", str(header_path("tiny-qwen3moe")), "--device", "none",
                                 "--override-kv", value])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Invalid type for KV override" in lines[0]


def test_llama_server_command_lines(monkeypatch):
    monkeypatch.delenv("LLAMA_ARG_OVERRIDE_KV", raising=False)
    cmd = parse(["-m", "m.gguf", "--override-kv", "a=int:1,b=str:x", "--override-kv", "c=bool:true"], environ={})
    assert to_params(cmd.params, ("none",)).kv_overrides == (
        KvOverride("a", "int", 1), KvOverride("b", "str", "x"), KvOverride("c", "bool", True))
    with pytest.raises(ServerArgsError, match="invalid boolean value for KV override 'c=bool:yes'"):
        parse(["-m", "m.gguf", "--override-kv", "c=bool:yes"], environ={})
    r = CliRunner().invoke(cli, ["reserve", "--device", "none", "--", "llama-server", "-m",
                                 str(header_path("tiny-qwen3moe")), "--override-kv", "x"])
    assert r.exit_code == 2 and "Invalid type for KV override" in r.output


def _loader(*overrides: KvOverride) -> ModelLoader:
    return ModelLoader(read_header(header_path("tiny-qwen3moe")), kv_overrides=overrides)


def test_get_key_takes_an_override_of_the_type_it_reads():
    ml = _loader(KvOverride("qwen3moe.expert_used_count", "int", 4),
                 KvOverride("qwen3moe.expert_used_count", "int", 6),          # the first of a key stays
                 KvOverride("qwen3moe.rope.freq_base", "float", 0.1),
                 KvOverride("qwen3moe.attention.key_length", "int", -1),      # a key the file lacks
                 KvOverride("", "int", 0),                                    # the list ends here
                 KvOverride("qwen3moe.block_count", "int", 1))
    assert ml.get_u32("%s.expert_used_count") == 4
    assert ml.get_f32("%s.rope.freq_base") == 0.10000000149011612            # the double as a float
    assert ml.get_u32("%s.attention.key_length", 0) == 0xFFFFFFFF            # val_i64 into a uint32_t
    assert ml.get_u32("%s.block_count") == 2
    assert ml.warnings == []


def test_an_override_of_another_type_is_ignored_with_llama_cpps_warning():
    ml = _loader(KvOverride("qwen3moe.expert_used_count", "float", 4.0),
                 KvOverride("qwen3moe.expert_shared_count", "str", "1"))
    assert ml.get_u32("%s.expert_used_count") == 2
    assert ml.get_u32("%s.expert_shared_count", 0) == 0
    with pytest.raises(UnsupportedModel, match="key not found in model: qwen3moe.expert_shared_count"):
        ml.get_u32("%s.expert_shared_count")
    assert ml.warnings == [
        "Bad metadata override type for key 'qwen3moe.expert_used_count', expected int but got float",
        "Bad metadata override type for key 'qwen3moe.expert_shared_count', expected int but got str"]


def test_get_key_or_arr_consults_overrides_only_for_a_scalar_in_the_file():
    ml = _loader(KvOverride("qwen3moe.feed_forward_length", "int", 64),
                 KvOverride("qwen3moe.attention.sliding_window_pattern", "int", 1))
    assert ml.get_key_or_arr("%s.feed_forward_length", 2) == (64, 64)
    # get_key_or_arr returns before get_key where the file has no such key
    assert ml.get_key_or_arr("%s.attention.sliding_window_pattern", 2, 7) == (7, 7)


def _golden(case_id: str) -> dict:
    return json.loads((GOLDEN_DIR / f"{case_id}.json").read_text())["result"]


def test_the_plan_warns_as_llama_cpp_warned():
    """The golden's warnings are what llama.cpp logged (validate_override) for the same flags."""
    real = _golden("tiny-qwen3moe__c_256_override-kv_qwen3moe.expert_used_count=float-4")
    plan = reserve(str(model_path("tiny-qwen3moe")),
                   Params(n_ctx=256, devices=("none",), kv_overrides=(KvOverride("qwen3moe.expert_used_count", "float", 4.0),)))
    assert plan["warnings"] == real["warnings"] == [
        "Bad metadata override type for key 'qwen3moe.expert_used_count', expected int but got float"]
    assert plan["compute_buffers"] == real["compute_buffers"] == {"CPU": 1_711_104}


def test_a_tokenizer_override_reaches_the_vocabulary():
    """tokenizer.ggml.model t5 and a BOS id out of range: llama.cpp's vocabulary has no BOS, and a
    reranking context warns (llama-cpp-python's run of the same flags gave the same warning)."""
    r = CliRunner().invoke(cli, ["reserve", str(header_path("tiny-bert-rerank")), "--device", "none", "--rerank",
                                 "-c", "512", "--override-kv",
                                 "tokenizer.ggml.model=str:t5,tokenizer.ggml.bos_token_id=int:-1"])
    assert r.exit_code == 0, r.output
    assert "llama.cpp warns: vocab does not have a  BOS token, reranking will not work" in r.output


# what llama.cpp said loading tiny-qwen3moe with each override (schedplan run, llama-cpp-python 0.3.36)
LOAD_REFUSALS = {
    "qwen3moe.block_count=int:1": "wrong number of tensors; expected 27, got 15",
    "qwen3moe.block_count=int:3": "tensor 'blk.2.attn_norm.weight' not found",
    "general.architecture=str:qwen3": "key not found in model: qwen3.context_length",
    "tokenizer.ggml.model=str:gpt2": "cannot find tokenizer merges in model file",
    "qwen3moe.expert_used_count=int:9": "above qwen3moe.expert_count (8)",   # GGML_ASSERT(n_expert_used_max <= n_expert)
}


@pytest.mark.parametrize("kv", LOAD_REFUSALS)
def test_the_plan_refuses_what_llama_cpp_refuses_to_load(kv):
    r = CliRunner().invoke(cli, ["reserve", str(header_path("tiny-qwen3moe")), "--device", "none", "-c", "256",
                                 "--override-kv", kv])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert LOAD_REFUSALS[kv] in r.output


def test_the_executor_hands_llama_cpp_a_terminated_array():
    llama_cpp = pytest.importorskip("llama_cpp")
    from schedplan.backends.llama_cpp_run import _kv_overrides

    items = _kv_overrides(llama_cpp, (KvOverride("a", "int", -3), KvOverride("b", "float", 0.5),
                                      KvOverride("c", "bool", True), KvOverride("d", "str", "x")))
    assert [(i.tag, i.key) for i in items] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (0, b"")]
    assert (items[0].value.val_i64, items[1].value.val_f64, items[2].value.val_bool, items[3].value.val_str) == \
        (-3, 0.5, True, b"x")


def test_the_printed_fit_command_keeps_the_overrides():
    """fit's llama-server line (--server) and the command to paste (`fit -- llama-server ...`)."""
    m = str(model_path("tiny-qwen3moe"))
    r = CliRunner().invoke(cli, ["fit", m, "--server", "--device", "none", "--override-kv",
                                 "qwen3moe.expert_used_count=int:4"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[1] == f"llama-server -m {m} --override-kv qwen3moe.expert_used_count=int:4 -c 4096 -ngl -1"
    r = CliRunner().invoke(cli, ["fit", "--device", "none", "--", "llama-server", "-m", m, "--override-kv",
                                 "qwen3moe.expert_used_count=int:4"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == f"llama-server -m {m} --override-kv qwen3moe.expert_used_count=int:4 -c 4096 -ngl -1"
