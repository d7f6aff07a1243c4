"""planner/vocab.py: the BOS/EOS/SEP ids llama_vocab::impl::load settles on, and the warnings
common_init_from_params gives a context pooling by rank (--rerank) whose vocabulary cannot rerank.

llama.cpp does not refuse such a context: its `return res` after the warnings still hands the model
and the context to llama-server, which listens (it only skips the LoRA adapters and the warm-up), so
the plan is made and carries the warnings. Checked against llama.cpp itself (llama-cpp-python: the
`run` side asks llama_vocab_bos/eos/sep and llama_model_chat_template) and against the real
llama-server's log."""
from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from fixtures.make_gguf import load_config, write_gguf
from schedplan.cli.main import cli
from schedplan.planner.gguf import read_header
from schedplan.planner.model_loader import ModelLoader
from schedplan.planner.hparams import UnsupportedModel
from schedplan.planner.vocab import LLAMA_TOKEN_NULL as NULL, RERANK_NO_BOS, RERANK_NO_EOS_SEP_PROMPT, load_vocab

SEP = "tokenizer.ggml.seperator_token_id"
TEMPLATE = "tokenizer.chat_template.rerank"
BPE = {"tokenizer.ggml.merges": ["t 2"]}

# name: (tokenizer model, bos key, eos key, other keys) -> (bos, eos, sep) and the warnings. The ids
# are the defaults of llama_vocab::impl::load per tokenizer model unless a key in range replaces them
VARIANTS = {
    "llama": (("llama", 1, 2, {}), (1, 2, NULL), []),
    "llama-no-keys": (("llama", None, None, {}), (1, 2, NULL), []),
    "t5": (("t5", None, None, {}), (NULL, 1, NULL), [RERANK_NO_BOS]),
    "t5-bos": (("t5", 1, None, {}), (1, 1, NULL), []),
    "test": (("test", None, None, {}), (NULL, NULL, NULL), [RERANK_NO_BOS, RERANK_NO_EOS_SEP_PROMPT]),
    "test-bos": (("test", 1, None, {}), (1, NULL, NULL), [RERANK_NO_EOS_SEP_PROMPT]),
    "test-bos-eos": (("test", 1, 2, {}), (1, 2, NULL), []),
    "test-bos-sep": (("test", 1, None, {SEP: 3}), (1, NULL, 3), []),
    "test-bos-template": (("test", 1, None, {TEMPLATE: "{query}{document}"}), (1, NULL, NULL), []),
    "test-eos-sep": (("test", None, 2, {SEP: 3}), (NULL, 2, 3), [RERANK_NO_BOS]),
    # an id beyond the vocabulary: "bad special token", the default (none) stays
    "test-bos-eos-out-of-range": (("test", 1, 5000, {}), (1, NULL, NULL), [RERANK_NO_EOS_SEP_PROMPT]),
    # no vocabulary: every id none, no key read
    "none": (("none", None, None, {}), (NULL, NULL, NULL), [RERANK_NO_BOS, RERANK_NO_EOS_SEP_PROMPT]),
    "none-template": (("none", None, None, {TEMPLATE: "x"}), (NULL, NULL, NULL), [RERANK_NO_BOS]),
    # BPE: BOS = EOS = 11, but the GLM pre-tokenizers drop the BOS
    "gpt2-qwen2": (("gpt2", None, None, {"tokenizer.ggml.pre": "qwen2", **BPE}), (11, 11, NULL), []),
    "gpt2-glm4": (("gpt2", None, None, {"tokenizer.ggml.pre": "glm4", **BPE}), (NULL, 11, NULL), [RERANK_NO_BOS]),
}


def config(name: str) -> dict:
    """tiny-bert-rerank (no pooling type of its own) with the variant's vocabulary."""
    (model, bos, eos, keys), _, _ = VARIANTS[name]
    c = copy.deepcopy(load_config("tiny-bert-rerank"))
    c["metadata"].update(keys)
    if model == "none":
        c["vocab"] = {"model": "none", "n_vocab": 1024}
        c["metadata"]["bert.vocab_size"] = 1024
    else:
        c["vocab"].update(model=model, bos_token_id=bos, eos_token_id=eos, unknown_token_id=None)
    return c


def variant(tmp_path, name: str, header_only: bool = True) -> str:
    return str(write_gguf(config(name), tmp_path / f"{name}.gguf", header_only=header_only))


def plan(*args: str) -> tuple[int, dict]:
    r = CliRunner().invoke(cli, ["reserve", *args, "--device", "none", "--json"])
    return r.exit_code, json.loads(r.stdout) if r.exit_code == 0 else r.output


@pytest.mark.parametrize("name", VARIANTS)
def test_special_token_ids(tmp_path, name):
    _, ids, _ = VARIANTS[name]
    vocab = load_vocab(ModelLoader(read_header(variant(tmp_path, name))))
    assert (vocab.special_bos_id, vocab.special_eos_id, vocab.special_sep_id) == ids


@pytest.mark.parametrize("name", VARIANTS)
def test_rerank_warnings_are_planned_not_refused(tmp_path, name):
    _, _, warnings = VARIANTS[name]
    path = variant(tmp_path, name)
    for flags in (["--rerank"], ["--embedding", "--pooling", "rank"]):
        code, result = plan(path, *flags)
        assert code == 0, result
        assert result.get("warnings", []) == warnings
    code, result = plan(path, "--embedding")     # pooling none: nothing to warn of
    assert code == 0 and "warnings" not in result
    # fit fits as llama-server and reports what it loads, the warnings included
    fitted = CliRunner().invoke(cli, ["fit", path, "--rerank", "--device", "cuda:64MiB:cc=8.9", "--json"])
    assert fitted.exit_code == 0 and json.loads(fitted.stdout).get("warnings", []) == warnings
    for command in (["reserve", path, "--rerank", "--device", "none"], ["fit", path, "--rerank", "--device", "none"]):
        r = CliRunner().invoke(cli, command)
        assert [f"llama.cpp warns: {w}" for w in warnings] == \
            [line for line in r.output.splitlines() if line.startswith("llama.cpp warns")]


def test_unknown_tokenizer_is_refused(tmp_path):
    c = config("llama")
    c["vocab"]["model"] = "sentencepiece"
    path = write_gguf(c, tmp_path / "unknown.gguf", header_only=True)
    with pytest.raises(UnsupportedModel, match="unknown tokenizer: 'sentencepiece'"):
        load_vocab(ModelLoader(read_header(path)))
    code, output = plan(str(path))
    assert code == 2 and "unknown tokenizer: 'sentencepiece'" in output and output.count("\n") == 1


def test_a_special_token_id_of_another_type_is_refused(tmp_path):
    """get_key into a uint32_t: another type is "wrong type", a load failure."""
    c = config("llama")
    c["metadata"][SEP] = 3
    c["metadata_types"] = {SEP: "int32"}
    path = write_gguf(c, tmp_path / "int32-sep.gguf", header_only=True)
    code, output = plan(str(path))
    assert code == 2 and f"key {SEP} has wrong type" in output


@pytest.mark.live
@pytest.mark.parametrize("name", VARIANTS)
def test_warnings_equal_llama_cpp(tmp_path, name):
    """The same warnings from llama.cpp's own vocabulary (schedplan run), and the plan equal to it."""
    pytest.importorskip("llama_cpp")
    from schedplan.backends.llama_cpp_run import run
    from schedplan.cli.options import parse_params
    from schedplan.planner.diff import diff
    from schedplan.planner.reserve import reserve

    path = variant(tmp_path, name, header_only=False)
    params = parse_params(["--rerank", "-c", "512", "-np", "1"])
    planned, real = reserve(path, params), run(path, params)
    assert real.get("warnings", []) == planned.get("warnings", []) == VARIANTS[name][2]
    assert [r for r in diff(planned, real) if not r.ok] == []


@pytest.mark.live
def test_llama_server_warns_and_listens(tmp_path):
    """The real llama-server --rerank: the same warnings in its log (common_init_), and it listens."""
    from fixtures.llama_build import bin_dir
    from fixtures.server_fit_golden import run_server

    binary = bin_dir() / "llama-server"
    if not binary.exists():
        pytest.skip(f"{binary} not built (python fixtures/llama_build.py)")
    for name, (_, _, warnings) in VARIANTS.items():
        path = variant(tmp_path, name, header_only=False)
        text = run_server([str(binary), "-m", path, "--rerank", "-c", "512", "-np", "1", "-fit", "off",
                           "--host", "127.0.0.1", "--port", "0"], timeout=120)
        logged = [line.split("common_init_: ", 1)[1].rstrip() for line in text.splitlines() if "common_init_: " in line
                  and "rerank" in line.lower()]
        assert logged == warnings, (name, text[-2000:])
        assert "listening on" in text, (name, text[-2000:])
