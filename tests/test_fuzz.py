"""Hostile headers and flags: whatever the file or the command line holds, `schedplan reserve`
ends in a plan (exit 0) or in one "error:" line (exit 2), never a traceback, a MemoryError or a hang.

- test_hostile_header: Hypothesis damages the header-only fixture of every supported architecture
  (fixtures/fuzz.py: boundary values, changed types, array counts and element types, tensor infos,
  removed and added keys, bit flips, cuts, hostile flag values) and plans it through the CLI entry
  point in a worker process under an address-space limit and a time limit per case. About 25
  examples per fixture here (SCHEDPLAN_FUZZ_EXAMPLES changes it; derandomized, so the run is the
  same every time unless SCHEDPLAN_FUZZ_SEED is set); the long run is `python fixtures/fuzz.py
  --cases 10000`, recorded in fixtures/fuzz-run.txt.
- the regression cases below pin what the fuzzer found, with the refusal's wording.
"""
from __future__ import annotations

import copy
import os

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from fixtures.fuzz import (ARR, BOOL, F32, I32, KV, PLAN_FLAGS, STR, U32, Case, Draw, Header, Worker,
                           classify, fixture_header, fuzz_fixtures, fuzz_projectors, make_case, scalar,
                           string_payload)
from fixtures.golden import DRAFT_PAIRS, FA_OFF, NEEDS_TARGET
from fixtures.make_gguf import header_path, load_config, write_gguf
from schedplan.cli.main import cli
from schedplan.planner.models import SUPPORTED_ARCHS

from test_cli import assert_cli_error

FIXTURES = fuzz_fixtures()
PROJECTORS = fuzz_projectors()
EXAMPLES = int(os.environ.get("SCHEDPLAN_FUZZ_EXAMPLES", "25"))
SEED = os.environ.get("SCHEDPLAN_FUZZ_SEED")


@pytest.fixture(scope="module")
def worker():
    with Worker() as w:
        yield w


@pytest.fixture(scope="module")
def bases() -> dict[str, Header]:
    return {name: Header.parse(header_path(name).read_bytes()) for name in FIXTURES}


def test_every_supported_architecture_has_a_fixture_to_damage():
    missing = set(SUPPORTED_ARCHS) - set(FIXTURES.values())
    assert not missing, f"no fixtures/models/tiny-*.json for {sorted(missing)}: the fuzz test needs one"


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_header_fields_write_back_the_same_bytes(name):
    data = header_path(name).read_bytes()
    assert Header.parse(data).to_bytes() == data


def test_the_flag_sets_reach_the_planner(worker, bases):
    """Undamaged, every fixture plans with the default flags (but those llama.cpp aborts on with
    flash attention, golden.py's FA_OFF: refused in one line as it aborts, and the draft heads it
    creates no context for without their target, NEEDS_TARGET), and every flag set cases
    draw from plans at least one fixture (a configuration the planner does not model yet may be
    refused)."""
    planned = {i: [] for i in range(len(PLAN_FLAGS))}
    for name, base in bases.items():
        for i, flags in enumerate(PLAN_FLAGS):
            out = worker.run(Case(name, "none", "", base.to_bytes(), list(flags)))
            assert out.ok, (name, flags, out.detail)
            if out.outcome == "plan":
                planned[i].append(name)
            else:
                assert flags or name in FA_OFF | NEEDS_TARGET, (name, out.detail)
    assert all(planned.values()), [PLAN_FLAGS[i] for i, names in planned.items() if not names]


def _settings(test):
    test = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(test)
    return seed(int(SEED))(test) if SEED is not None else test


@pytest.mark.parametrize("name", sorted(FIXTURES))
@_settings
@given(data=st.data())
def test_hostile_header(worker, bases, name, data):
    case = make_case(Draw(data), name, bases[name])
    out = worker.run(case)
    assert out.ok, (f"{out.outcome} after {case.kind} ({case.what}) of {name}:\n  {case.command()}\n"
                    f"{out.detail}")


# --- projectors: a damaged mmproj-*.gguf beside its text model (reserve MODEL -mm FILE) ---------------

@pytest.fixture(scope="module")
def projector_bases() -> dict[str, Header]:
    return {name: Header.parse(fixture_header(name).read_bytes()) for name in PROJECTORS}


@pytest.mark.parametrize("name", sorted(PROJECTORS))
def test_projector_header_fields_write_back_and_plan(worker, projector_bases, name):
    data = fixture_header(name).read_bytes()
    assert projector_bases[name].to_bytes() == data
    out = worker.run(Case(name, "none", "", data, [], str(header_path(PROJECTORS[name]))))
    assert out.outcome == "plan", out.detail


@pytest.mark.parametrize("name", sorted(PROJECTORS))
@_settings
@given(data=st.data())
def test_hostile_projector_header(worker, projector_bases, name, data):
    case = make_case(Draw(data), name, projector_bases[name], model=str(header_path(PROJECTORS[name])))
    out = worker.run(case)
    assert out.ok, (f"{out.outcome} after {case.kind} ({case.what}) of {name}:\n  {case.command()}\n"
                    f"{out.detail}")


# --- draft heads: a damaged draft beside its target (reserve MODEL -md FILE, ctx_other) ----------------

@pytest.fixture(scope="module")
def draft_bases() -> dict[str, Header]:
    return {draft: Header.parse(header_path(draft).read_bytes()) for _, draft in DRAFT_PAIRS.values()}


@pytest.mark.parametrize("model,draft", sorted(DRAFT_PAIRS.values()))
def test_draft_header_plans_beside_its_target(worker, draft_bases, model, draft):
    out = worker.run(Case(draft, "none", "", draft_bases[draft].to_bytes(), [], str(header_path(model)), "-md"))
    assert out.outcome == "plan", out.detail


@pytest.mark.parametrize("model,draft", sorted(DRAFT_PAIRS.values()))
@_settings
@given(data=st.data())
def test_hostile_draft_header(worker, draft_bases, model, draft, data):
    """A draft head that reads its target's tensors (ctx_other), damaged, planned beside its target."""
    case = make_case(Draw(data), draft, draft_bases[draft], model=str(header_path(model)), option="-md")
    out = worker.run(case)
    assert out.ok, (f"{out.outcome} after {case.kind} ({case.what}) of {draft}:\n  {case.command()}\n"
                    f"{out.detail}")


# --- the worker and the verdicts ---------------------------------------------------------------------

class _Result:
    def __init__(self, exit_code=0, stdout="", stderr="", exception=None):
        self.exit_code, self.stdout, self.stderr, self.exception = exit_code, stdout, stderr, exception
        self.exc_info = (type(exception), exception, None) if exception else None


@pytest.mark.parametrize("result,verdict", [
    (_Result(0, "table\n"), "plan"),
    (_Result(2, "", "error: x.gguf: truncated file\n", SystemExit(2)), "refusal"),
    (_Result(2, "", "error: one\nerror: two\n", SystemExit(2)), "bad_output"),
    (_Result(2, "", "error: " + "x" * 3000 + "\n", SystemExit(2)), "bad_output"),
    (_Result(2, "half a table", "error: x\n", SystemExit(2)), "bad_output"),
    (_Result(1, "", "", ZeroDivisionError("float division by zero")), "traceback"),
    (_Result(1, "", "", MemoryError()), "memory_error"),
    (_Result(1, "", "Aborted\n", SystemExit(1)), "bad_output"),
])
def test_classify(result, verdict):
    assert classify(result)[0] == verdict


def test_worker_reports_a_case_out_of_time_and_goes_on(bases):
    name = "tiny-llama"
    case = Case(name, "none", "", bases[name].to_bytes(), [])
    with Worker(case_seconds=0.000001) as w:
        out = w.run(case)
        assert out.outcome == "timeout" and not out.ok
        w.case_seconds = 10.0
        assert w.run(case).outcome == "plan"     # a fresh worker after the failure


def test_worker_runs_under_the_address_space_limit():
    with Worker(address_space=1234 * 1024 * 1024) as w:
        limits = open(f"/proc/{w.proc.pid}/limits").read()
    line = next(x for x in limits.splitlines() if x.startswith("Max address space"))
    assert line.split()[3:5] == [str(1234 * 1024 * 1024)] * 2, line


# --- what the fuzzer found, pinned ---------------------------------------------------------------------

def _damaged(tmp_path, name: str, changes: dict, drop=()) -> str:
    """The fixture with keys set (key -> (gguf type, value); arrays: (ARR, (elem type, [values])))."""
    h = Header.parse(header_path(name).read_bytes())
    for key in drop:
        h.kvs.remove(h.find(key.encode()))
    for key, (vtype, value) in changes.items():
        kv = h.find(key.encode())
        if kv is None:
            kv = KV(key.encode(), vtype, b"")
            h.kvs.append(kv)
        kv.vtype = vtype
        if vtype == ARR:
            kv.etype, values = value
            kv.count = len(values)
            kv.payload = b"".join(scalar(kv.etype, v) for v in values)
        elif vtype == STR:
            kv.payload = string_payload(value)
        else:
            kv.payload = scalar(vtype, value)
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(h.to_bytes())
    return str(path)


def reserve(*args):
    return CliRunner().invoke(cli, ["reserve", *map(str, args)])


@pytest.mark.parametrize("name,changes,args,needles", [
    # a zero head count: gemma's 1/sqrt(head size) is inf in llama.cpp, a ZeroDivisionError in Python
    ("tiny-gemma2", {"gemma2.attention.head_count": (U32, 0)}, (), ("head_count is 0",)),
    ("tiny-gemma3", {"gemma3.attention.key_length": (U32, 0)}, (), ("head size", "is 0")),
    ("tiny-gemma3", {"gemma3.attention.key_length_swa": (U32, 0)}, (), ("head size", "is 0")),
    # per-layer arrays are uint32_t in llama.cpp: int32 -1 is 4294967295, bools are 0 or 1
    ("tiny-llama", {"llama.attention.head_count_kv": (ARR, (I32, [-1, -1]))}, (), ("head_count_kv is 4294967295",)),
    ("tiny-llama", {"llama.attention.head_count_kv": (ARR, (BOOL, [1, 1]))}, (), ("attn_k.weight' has wrong shape",)),
    ("tiny-llama", {"llama.attention.head_count": (ARR, (F32, [4.0, 4.0]))}, (), ("wrong array element type f32",)),
    # n_ctx is a uint32_t: the training context pads past 2^32 to 0
    ("tiny-llama", {"llama.context_length": (U32, 2**32 - 1)}, (), ("n_ctx_seq == 0", "4294967295", "2^32")),
    ("tiny-llama", {"llama.context_length": (U32, 2**32 - 1)}, ("-kvu",), ("failed to allocate buffer for kv cache",)),
    ("tiny-llama", {"llama.context_length": (U32, 0)}, (), ("cannot both be zero",)),
    # names and values from the file stay on the line
    ("tiny-llama", {"general.architecture": (STR, b"lla\nma\x00" + b"x" * 5000)}, (), ("lla\\nma\\x00", "characters")),
    ("tiny-llama", {"llama.rope.scaling.type": (STR, b"y" * 10**6)}, (), ("rope.scaling.type", "1000000 characters")),
    # kimi-linear: a K row (kv_lora_rank + rope) unlike the cache's (key_length x head_count_kv) is
    # ggml_set_rows' assert; MLA layers without MLA head sizes have MHA-sized Q (or, sized alike, read a
    # null cache input: a crash)
    ("tiny-kimi-linear", {"kimi-linear.attention.key_length": (U32, 96)}, (), ("a->ne[0] == b->ne[0]", "hold 96")),
    ("tiny-kimi-linear", {"kimi-linear.attention.value_length_mla": (U32, 0)}, (), ("attn_q.weight' has wrong shape",)),
    ("tiny-kimi-linear", {"kimi-linear.attention.value_length_mla": (U32, 0), "kimi-linear.attention.key_length": (U32, 64),
                          "kimi-linear.attention.value_length": (U32, 32)}, (), ("blk.1", "null pointer")),
    ("tiny-kimi-linear", {"kimi-linear.kda.head_dim": (U32, 0)}, (), ("kda.head_dim is 0",)),
    # recurrent architectures: llama.cpp divides by wkv.head_size and full_attention_interval, rwkv6's
    # and plamo2's graphs assert on token_shift_count and ssm.group_count, mamba refuses an expansion
    # other than 2
    ("tiny-rwkv6", {"rwkv6.wkv.head_size": (U32, 0)}, (), ("wkv.head_size is 0",)),
    ("tiny-rwkv6", {"rwkv6.token_shift_count": (U32, 1)}, (), ("token_shift_count is 1", "needs 2")),
    ("tiny-minimax-01", {"minimax-01.full_attention_interval": (U32, 0)}, (), ("full_attention_interval is 0",)),
    ("tiny-plamo2", {"plamo2.ssm.group_count": (U32, 1)}, (), ("n_group == 0",)),
    ("tiny-mamba", {"mamba.ssm.inner_size": (U32, 200)}, (), ("inner_size is 200", "expansion factor of 2")),
    # bailingmoe3's GGML_ASSERTs on the KDA gate
    ("tiny-bailingmoe3", {"bailingmoe3.kda.gate_lower_bound": (F32, 0.0)}, (), ("gate_lower_bound is 0.0", "not negative")),
    ("tiny-bailingmoe3", {"bailingmoe3.kda.safe_gate": (BOOL, 0)}, (), ("kda.safe_gate is false",)),
    # afmoe without a window: llama.cpp's graph reads the sliding-window cache it did not create (SIGSEGV)
    ("tiny-afmoe", {"afmoe.attention.sliding_window": (U32, 0)}, (), ("sliding_window is 0", "SIGSEGV")),
    # nanbeige's loops: at least one, and the logical layers within LLAMA_MAX_LAYERS (GGML_ASSERTs)
    ("tiny-nanbeige", {"nanbeige.num_loops": (U32, 0)}, (), ("num_loops is 0",)),
    # gemma3n's layers from 20 on reuse layer 18 (sliding) or 19 (full): a sliding layer 19 leaves full layer 21
    # without K/V to read (a real run aborts in llama-kv-cache.cpp on that assert)
    ("tiny-gemma3n", {"gemma3n.attention.sliding_window_pattern": (ARR, (BOOL, [i % 5 != 4 for i in range(19)]
                                                                           + [True, True, False]))}, (),
     ("layer 21 reuses the K/V of layer 19, which this cache does not hold",)),
    # deepseek2.cpp's OCR branch asserts the rope base (a real run aborts on it)
    ("tiny-deepseek2-ocr", {"deepseek2-ocr.rope.freq_base": (F32, 500000.0)}, (),
     ("GGML_ASSERT(fabs(freq_base - 10000.0) < 1e-4)", "500000.0")),
    ("tiny-nanbeige", {"nanbeige.num_loops": (U32, 200)}, (), ("num_loops 200", "LLAMA_MAX_LAYERS")),
    # hrm_text: stacks and cycles, and as many cache slots as they make (GGML_ASSERTs)
    ("tiny-hrm_text", {"hrm_text.hrm.l_cycles": (U32, 0)}, (), ("l_cycles is 0",)),
    ("tiny-hrm_text", {"hrm_text.hrm.h_cycles": (U32, 1)}, (), ("block_count is 12", "= 6")),
    # granite: a deepstack stream index past the number of distinct streams (llama.cpp throws, checked)
    ("tiny-granite-vision", {"granite.deepstack_mapping": (ARR, (I32, [-1, 1, -1, 3]))}, (),
     ("Invalid deepstack index: 3 > 2",)),
    # granite_swa reads its window pattern with a required get_arr: a scalar period is refused
    ("tiny-granite-swa", {"granite_swa.attention.sliding_window_pattern": (U32, 4)}, (),
     ("array key not found in model: granite_swa.attention.sliding_window_pattern",)),
    # graniteswitch's adapter keys: as load_arch_hparams / load_arch_tensors throw on them
    ("tiny-graniteswitch", {"graniteswitch.adapters.count": (U32, 3)}, (),
     ("adapter token id arrays (2 activate, 2 substitute) do not match adapter count 3",)),
    ("tiny-graniteswitch", {"graniteswitch.adapters.lora_rank": (U32, 4097)}, (), ("invalid lora rank 4097",)),
    ("tiny-graniteswitch", {"graniteswitch.adapters.token_ids_substitute": (ARR, (I32, [5, 1024]))}, (),
     ("substitute token id 1024 out of range [0, 1024)",)),
    ("tiny-graniteswitch", {"graniteswitch.adapters.token_ids_activate": (ARR, (BOOL, [1, 0]))}, (),
     ("token_ids_activate is not a string/float32/uint32/int32/uint64 array",)),
    # qwen4exp: a PLE conv of kernel 1 has no history row, which llama.cpp dereferences (SIGSEGV, checked);
    # the n-gram table's rows are the PLE head size; a hyper-connection count of 1 is refused
    ("tiny-qwen4exp", {"qwen4exp.ple.conv_kernel": (U32, 1)}, (), ("ple.conv_kernel 1", "crash")),
    ("tiny-qwen4exp", {"qwen4exp.embedding_length_per_layer_input": (U32, 32)}, (),
     ("per_layer_token_embd.weight' has wrong shape",)),
    ("tiny-qwen4exp", {"qwen4exp.hyper_connection.count": (U32, 1)}, (), ("must be greater than one, got 1",)),
    # minimax-m3: MSA blocks of 0 positions (llama.cpp asserts against the division by zero)
    ("tiny-minimax-m3", {"minimax-m3.attention.indexer.block_size": (U32, 0)}, (), ("block_size is 0",)),
    # step35: the window pattern must be an array; the SwiGLU limits are floats, one or one per layer
    # (llama.cpp's own words for each, checked)
    ("tiny-step35", {"step35.attention.sliding_window_pattern": (U32, 1)}, (),
     ("array key not found in model: step35.attention.sliding_window_pattern",)),
    ("tiny-step35", {"step35.swiglu_clamp_exp": (ARR, (F32, [7.0]))}, (), ("wrong array length; expected 5, got 1",)),
    ("tiny-step35", {"step35.swiglu_clamp_shexp": (U32, 7)}, (), ("has wrong type u32 but expected type f32",)),
    # mimo2: the value scale is a float; the window pattern fills a LLAMA_MAX_LAYERS array (both llama.cpp's words)
    ("tiny-mimo2", {"mimo2.attention.value_scale": (U32, 1)}, (), ("has wrong type u32 but expected type f32",)),
    ("tiny-mimo2", {"mimo2.attention.sliding_window_pattern": (ARR, (I32, [1] * 600))}, (),
     ("array length 600 for key mimo2.attention.sliding_window_pattern exceeds max 512",)),
    # hy_v3: rope over part of the head is the graph's GGML_ASSERT(n_embd_head == n_rot) (checked: llama.cpp aborts)
    ("tiny-hy_v3", {"hy_v3.rope.dimension_count": (U32, 32)}, (), ("equal head sizes", "rope dimensions (32)")),
    # hy_v4: indexer keys no wider than the rope, a shared indexer on layer 0 (llama.cpp's words, checked)
    ("tiny-hy_v4", {"hy_v4.attention.indexer.key_length": (U32, 32)}, (), ("hy_v4: bad indexer head count / key length",)),
    ("tiny-hy_v4", {"hy_v4.attention.indexer.types": (ARR, (BOOL, [False, True, False, True]))}, (),
     ("hy_v4: layer 0 must own an indexer, nothing precedes it to share",)),
    # laguna: V heads narrower than K heads, the graph's GGML_ASSERT (checked: llama.cpp aborts)
    ("tiny-laguna", {"laguna.attention.value_length": (U32, 32)}, (), ("equal K and V head sizes (K 64, V 32)",)),
])
def test_hostile_values_are_one_line(tmp_path, name, changes, args, needles):
    assert_cli_error(reserve(_damaged(tmp_path, name, changes), *args), *needles)


def test_chameleon_below_its_image_logits_is_one_line(tmp_path):
    """chameleon.cpp sets -FLT_MAX over the logits 4..8195: with fewer logits a token llama.cpp aborts
    (ggml_set_impl's GGML_ASSERT, seen in a real run of this file)."""
    cfg = copy.deepcopy(load_config("tiny-chameleon"))
    cfg["vocab"]["n_vocab"] = 1024
    path = write_gguf(cfg, tmp_path / "chameleon-1024.gguf")
    assert_cli_error(reserve(path), "GGML_ASSERT(ggml_nelements(a) >= ggml_nelements(b))", "8192 elements")


def test_laguna_gate_of_neither_width_is_one_line(tmp_path):
    """An attn_gate neither one row per head nor one per element: llama.cpp's GGML_ABORT in
    load_arch_tensors (checked on a file with that tensor's shape rewritten as [128, 8])."""
    h = Header.parse(header_path("tiny-laguna").read_bytes())
    gate = next(ti for ti in h.tis if ti.name == b"blk.0.attn_gate.weight")
    gate.ne = [128, 8]
    path = tmp_path / "gate.gguf"
    path.write_bytes(h.to_bytes())
    assert_cli_error(reserve(path), "llama.cpp would abort", "unexpected attention gate width 8 at layer 0",
                     "expected 4 per-head or 256 per-element")


def test_a_key_with_a_newline_is_one_line(tmp_path):
    h = Header.parse(header_path("tiny-llama").read_bytes())
    h.kvs.append(replace_key(h.find(b"llama.block_count"), b"llama.block\ncount"))
    h.kvs.append(replace_key(h.find(b"llama.block_count"), b"llama.block\ncount"))
    path = tmp_path / "nl.gguf"
    path.write_bytes(h.to_bytes())
    assert_cli_error(reserve(path), "duplicate key 'llama.block\\ncount'")


def replace_key(kv: KV, key: bytes) -> KV:
    return KV(key, kv.vtype, kv.payload, kv.etype, kv.count)


TINY = header_path("tiny-llama")
CUDA = ("--device", "cuda:8GiB:cc=8.9")


@pytest.mark.parametrize("args,needles", [
    # values llama.cpp reads into a 32-bit int (std::stoi)
    (("-c", "1000000000000"), ("-c", "1000000000000", "32-bit")),
    (("-c", "2147483648"), ("2147483648", "32-bit")),
    (("-b", "4294967296"), ("-b", "32-bit")),
    (("-ub", "99999999999999999999999"), ("-ub", "32-bit")),
    (("-ngl", "2147483648"), ("-ngl", "32-bit")),
    (("-ngl", "-2147483649"), ("-ngl", "32-bit")),
    (("-mg", "4294967295"), ("-mg", "32-bit")),
    (("-ncmoe", "2147483648"), ("-ncmoe", "32-bit")),
    (("-np", "257"), ("257", "1..256")),
    (("-c", "1_000"), ("'1_000' is not an integer",)),
    (("-c", "12abc"), ("'12abc' is not an integer",)),
    (("-c", "\u0663"), ("is not an integer",)),
    # -ts as common/arg.cpp reads it
    (("-ts", ",".join(["1"] * 16)), ("16 proportions", "at most 15")),
    (("-ts", "1e39", *CUDA), ("1e39", "out of the range of a float")),
    (("-ts", "1e-40", *CUDA), ("1e-40", "out of the range of a float")),
    (("-ts", "abc", *CUDA), ("'abc' is not a number",)),
    (("-ts", "nan", *CUDA), ("-ts nan", "devices.at(1) is out of range")),
    (("-ts", "1,-1", *CUDA, *CUDA), ("-ts 1,-1", "llama.cpp would fail to load")),
    (("-ts", "inf,1", *CUDA, *CUDA), ("llama.cpp would fail to load",)),
])
def test_hostile_flags_are_one_line(args, needles):
    assert_cli_error(reserve(TINY, *args), *needles)


@pytest.mark.parametrize("args", [
    ("-c", "2147483647"), ("-c", " 512 "), ("-c", "+512"), ("-ngl", "-2147483648"),
    ("-ts", "3,,1", *CUDA, *CUDA), ("-ts", "3/1/", *CUDA, *CUDA), ("-ts", "0x1p1,1", *CUDA, *CUDA),
    ("-ts", "nan"),                         # no device: the split points are never looked at
])
def test_edge_flags_that_llama_cpp_accepts_plan(args):
    res = reserve(TINY, *args)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("path", ["afile/x.gguf", "a" * 5000])
def test_unopenable_paths_are_one_line(tmp_path, path):
    (tmp_path / "afile").write_bytes(b"")
    assert_cli_error(reserve(tmp_path / path))


def test_symlink_loop_is_one_line(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert_cli_error(reserve(tmp_path / "a"), "symbolic links")


# --- adapters: a damaged LoRA adapter or control vector beside its model (reserve MODEL --lora FILE) ----

ADAPTERS = {"lora tiny-llama": ("tiny-llama", "--lora"), "lora tiny-qwen3moe": ("tiny-qwen3moe", "--lora"),
            "cvec tiny-gemma3": ("tiny-gemma3", "--control-vector")}


@pytest.fixture(scope="module")
def adapter_bases() -> dict[str, Header]:
    from fixtures.make_gguf import cvec_path, lora_path
    files = {"lora tiny-llama": lora_path("tiny-llama", 8, "qv"),
             "lora tiny-qwen3moe": lora_path("tiny-qwen3moe", 8, "experts"), "cvec tiny-gemma3": cvec_path("tiny-gemma3")}
    return {name: Header.parse(path.read_bytes()) for name, path in files.items()}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
@_settings
@given(data=st.data())
def test_hostile_adapter_header(worker, adapter_bases, name, data):
    """A LoRA adapter or a control vector, damaged (its header alone: an undamaged one then fails
    llama.cpp's data bounds check), planned beside its model: a plan, warnings or one line."""
    model, option = ADAPTERS[name]
    case = make_case(Draw(data), name, adapter_bases[name], model=str(header_path(model)), option=option)
    out = worker.run(case)
    assert out.ok, f"{out.outcome} after {case.kind} ({case.what}) of {name}:\n  {case.command()}\n{out.detail}"
