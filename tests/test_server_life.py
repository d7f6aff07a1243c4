"""What llama-server allocates after it starts (planner/server_life.py), against every buffer the
real llama-server allocates and frees over its life (backends/buffer_log.c, an LD_PRELOAD library):
the startup reservation per context, then the buffers after the draft's startup decode and after the
first requests."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from click.testing import CliRunner  # noqa: E402

from fixtures.make_gguf import model_path  # noqa: E402
from schedplan.cli.reserve import reserve  # noqa: E402
from schedplan.planner.reserve import create_context, output_reserve_size  # noqa: E402
from schedplan.planner.params import Params  # noqa: E402
from schedplan.planner.server import SpecParams  # noqa: E402
from schedplan.planner.server_life import ServerLife, after_startup, speculative_uses  # noqa: E402


def plan(args: list[str], devices: tuple[str, ...] = ("--device", "none")) -> dict:
    res = CliRunner().invoke(reserve, [*devices, "--json", "--", "llama-server", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# --- unit: llama.cpp's code paths, by hand --------------------------------------------------------

def test_output_reserve_mirrors_llama_context():
    """output_reserve's sum, term by term (llama-context.cpp:2116): tiny-llama, n_vocab 1024,
    n_embd 256, n_batch 2048, 4 slots."""
    ctx = create_context(str(model_path("tiny-llama")), Params(n_ctx=4096, n_seq_max=4))
    hp, cp = ctx.hparams, ctx.cparams
    assert (hp.n_vocab, hp.n_embd, cp.n_batch, cp.n_seq_max) == (1024, 256, 2048, 4)
    logits = 1024 * 4 * 4
    assert output_reserve_size(hp, cp) == logits == ctx.output_buffer_size
    assert output_reserve_size(hp, cp, 1) == logits                    # n_outputs_max = max(n, n_seq_max)
    assert output_reserve_size(hp, cp, 6) == 1024 * 6 * 4
    assert output_reserve_size(hp, cp, 1, embeddings_nextn=True) == logits + 256 * 4 * 4
    assert output_reserve_size(hp, cp, 1, embeddings_nextn=False) == logits + 256 * 2048 * 4
    assert output_reserve_size(hp, cp, 1, layer_inp=(0, 1, 1)) == logits + 2 * 256 * 2048 * 4
    assert output_reserve_size(hp, cp, 1, sampling=True) == logits + 2 * 1024 * 4 * 4 + (1 + 1024) * 4 * 4


def test_speculative_uses_follow_the_implementations():
    """EAGLE-3 reads layers [0, 1, 1] of the 2-layer tiny-llama: the inputs of 0 and 1, no last
    state; the draft gets samplers unless --no-spec-draft-backend-sampling; MTP turns on the target's
    last hidden state unmasked; draft-simple nothing."""
    tgt = create_context(str(model_path("tiny-llama")), Params(n_ctx=4096))
    dft = create_context(str(model_path("tiny-eagle3-shared")), Params(n_ctx=4096), ctx_other=tgt)
    t, d = speculative_uses(SpecParams(types=("draft-eagle3",)), tgt, dft)
    assert (t.layer_inp, t.embeddings_nextn, t.samplers) == ((0, 1, 1), None, False)
    assert (d.samplers, d.embeddings_nextn, d.layer_inp) == (True, True, ())
    t, d = speculative_uses(SpecParams(types=("draft-eagle3",), backend_sampling=False), tgt, dft)
    assert not d.samplers and not d.need_reserve() and t.need_reserve()
    t, d = speculative_uses(SpecParams(types=("draft-mtp",)), tgt, dft)
    assert (t.embeddings_nextn, t.layer_inp, d.embeddings_nextn) == (False, (), True)
    assert speculative_uses(SpecParams(types=("draft-simple",)), tgt, dft) == speculative_uses(SpecParams(), tgt, None)


def test_a_dflash_reading_the_layer_past_the_last_aborts_at_the_first_request():
    """tiny-dflash reads target layers [1, 2] of the 2-layer tiny-qwen3: no graph records the input
    of layer 2 (llm_graph_result::set_outputs asserts), which the live test sees happen."""
    tgt = create_context(str(model_path("tiny-qwen3")), Params(n_ctx=4096))
    dft = create_context(str(model_path("tiny-dflash")), Params(n_ctx=4096), ctx_other=tgt)
    a = after_startup(tgt, dft, ServerLife(SpecParams(types=("draft-dflash",))))
    assert "layer 2" in a["model"]["first_request_aborts"]


def test_dflash2_and_dspark_set_up_their_draft_as_dflash_does():
    """common_speculative_impl_draft_dflash: DSpark as DFlash (samplers, last hidden state masked);
    DFlash2 (a selector) without samplers, its lattice unmasked; both read the target's layer inputs."""
    tgt = create_context(str(model_path("tiny-qwen3")), Params(n_ctx=4096))
    for name, spec_type, samplers, masked in (("tiny-dspark", "draft-dspark", True, True),
                                              ("tiny-dflash2", "draft-dflash", False, False)):
        dft = create_context(str(model_path(name)), Params(n_ctx=4096), ctx_other=tgt)
        t, d = speculative_uses(SpecParams(types=(spec_type,)), tgt, dft)
        assert (t.layer_inp, d.samplers, d.embeddings_nextn) == ((1, 2), samplers, masked), name


def test_the_mtp_context_is_listed_beside_the_model():
    """--spec-type draft-mtp without -md: the MTP context over the model's NextN block, without
    weights of its own."""
    r = plan(["-m", str(model_path("tiny-qwen35-mtp")), "--spec-type", "draft-mtp", "-fit", "off", "-c", "4096"])
    assert r["draft"]["shares_model"] and r["draft"]["model_buffers"] == {}
    assert r["draft"]["kv_buffers"] and r["draft"]["compute_buffers"]


def test_backend_sampling_for_every_slot_is_refused():
    """-bs: common_init_result hands the context a sampler per slot at creation (cparams.samplers), so
    its startup reservation holds the samplers' nodes (seen: the real llama-server's output buffer is
    already 65552 bytes when it listens, not 16384): not planned, refused in one line."""
    res = CliRunner().invoke(reserve, ["--device", "none", "--", "llama-server", "-m", str(model_path("tiny-llama")),
                                       "-bs"])
    assert res.exit_code == 2 and "samples on the backend" in res.output


def test_the_startup_reservation_is_unchanged():
    """after_startup is beside the startup reservation, never in it: the model's output buffer is
    output_reserve(n_seq_max) with nothing turned on."""
    r = plan(["-m", str(model_path("tiny-llama")), "-md", str(model_path("tiny-eagle3-shared")),
              "--spec-type", "draft-eagle3", "-fit", "off", "-c", "4096"])
    assert r["output_buffers"] == {"CPU": 1024 * 4 * 4} == {"CPU": r["after_startup"]["model"]["output_history"][0]}
    # the target's graphs reserved again with the inputs of layers 0 and 1 kept as outputs: larger
    again = r["after_startup"]["model"]["compute_buffers"]["CPU"]
    assert again > r["compute_buffers"]["CPU"] and "size not planned" not in r["after_startup"]["model"][
        "compute_reserved_again"]


# --- live: the real llama-server's buffer log ------------------------------------------------------

LONG_PROMPT = list(range(1, 601))    # 600 token ids: an EAGLE-3 encoder pass of a full ubatch (512)

LIVE = [
    ("plain", ["-m", "tiny-llama"], {}),
    ("eagle3", ["-m", "tiny-llama", "-md", "tiny-eagle3-shared", "--spec-type", "draft-eagle3"], {}),
    ("eagle3 -ub 32 -np 2", ["-m", "tiny-llama", "-md", "tiny-eagle3-shared", "--spec-type", "draft-eagle3", "-ub", "32",
                             "-np", "2"], {}),
    ("gemma4 assistant", ["-m", "tiny-gemma4", "-md", "tiny-gemma4-assistant", "--spec-type", "draft-mtp"], {}),
    ("qwen35 mtp", ["-m", "tiny-qwen35-mtp", "--spec-type", "draft-mtp"], {}),
    ("qwen35 mtp no draft samplers", ["-m", "tiny-qwen35-mtp", "--spec-type", "draft-mtp",
                                      "--no-spec-draft-backend-sampling"], {}),
    ("draft-simple", ["-m", "tiny-qwen3", "-md", "tiny-qwen3", "--spec-type", "draft-simple"], {}),
    ("eagle3 beside qwen35", ["-m", "tiny-qwen35", "-md", "tiny-eagle3-shared", "--spec-type", "draft-eagle3"], {}),
    *[(f"eagle3 beside {m}", ["-m", m, "-md", "tiny-eagle3-shared", "--spec-type", "draft-eagle3"], {})
      for m in ("tiny-gpt-oss", "tiny-minimax-m2", "tiny-nanbeige", "tiny-hunyuan_vl", "tiny-muse-glimmer",
                "tiny-gemma4")],
    # the LoRA adapter is the target's alone (the draft is created without common_init_from_params);
    # its warm-up re-reserves the target with the adapter, the first request again with the layer inputs
    ("eagle3 beside a LoRA", ["-m", "tiny-llama", "-md", "tiny-eagle3-shared", "--spec-type", "draft-eagle3",
                              "--lora", "lora:tiny-llama"], {}),
    ("dflash aborts", ["-m", "tiny-qwen3", "-md", "tiny-dflash"], {"aborts": True}),
    ("dflash2 aborts", ["-m", "tiny-qwen3", "-md", "tiny-dflash2"], {"aborts": True}),
    ("dspark aborts", ["-m", "tiny-qwen3", "-md", "tiny-dspark"], {"aborts": True}),
    # lavapipe: the draft's samplers offload to Vulkan0 (llama_sampler_backend_support), the output
    # buffers in Vulkan_Host (32 bytes over)
    ("qwen35 mtp on vulkan", ["-m", "tiny-qwen35-mtp", "--spec-type", "draft-mtp", "-ngl", "99"], {"vulkan": True}),
]


def _args(args: list[str]) -> list[str]:
    from fixtures.make_gguf import lora_path
    out = []
    for a in args:
        out.append(str(model_path(a)) if a.startswith("tiny-") else
                   str(lora_path(a.split(":")[1], 8)) if a.startswith("lora:") else a)
    return [*out, "-fit", "off", "-c", "4096"]


def _by_owner(alive, ctx: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in alive.values():
        if e.scope.split(".")[0] == ctx:
            owner = "kv" if e.owner == "rs" else e.owner
            out[owner] = out.get(owner, 0) + e.size
    return out


@pytest.mark.live
@pytest.mark.parametrize("name,args,expect", LIVE, ids=[c[0] for c in LIVE])
def test_after_startup_equals_llama_servers_buffers(name, args, expect, request):
    import os

    from fixtures.golden import lavapipe_flags
    from fixtures.llama_build import bin_dir, source
    from schedplan.backends.server_life import build_buffer_log, live_buffers, serve

    binary = bin_dir() / "llama-server"
    if not binary.exists():
        pytest.skip(f"{binary} not built (python fixtures/llama_build.py)")
    env = dict(os.environ)
    env.pop("GGML_VK_VISIBLE_DEVICES", None)       # without it ggml skips lavapipe: the CPU alone
    devices: tuple[str, ...] = ("--device", "none")
    if expect.get("vulkan"):
        request.getfixturevalue("vulkan_device")
        env["GGML_VK_VISIBLE_DEVICES"], devices = "0", tuple(lavapipe_flags(1))
    argv = _args(args)
    r = plan(argv, devices)
    library = build_buffer_log([source() / "include", source() / "ggml" / "include"])
    requests = [{"prompt": LONG_PROMPT, "n_predict": 16}, {"prompt": "Hello there", "n_predict": 8, "n_probs": 5}]
    life = serve(binary, argv, requests, library=library, env=env)
    if expect.get("aborts"):
        assert r["after_startup"]["model"]["first_request_aborts"]
        assert "error" in life.responses[0] and "layer input tensor is null" in life.log
        return
    assert all("error" not in x for x in life.responses), life.log[-3000:]
    contexts = [("ctx0", r, r["after_startup"]["model"])]
    if "draft" in r:
        contexts.append(("ctx1", r["draft"], r["after_startup"]["draft"]))
    created = {e.scope for e in life.events if e.event == "begin" and e.scope.startswith("ctx") and "." not in e.scope}
    assert created == {c for c, _, _ in contexts}
    started, served = live_buffers(life.events, life.listening), live_buffers(life.events, life.served)
    for ctx, startup, after in contexts:
        # the startup reservation: each context's buffers once llama-server listens (a draft's
        # output buffer has grown by then: its startup decode)
        real = _by_owner(started, ctx)
        assert real.get("kv", 0) == sum(startup["kv_buffers"].values()), ctx
        assert real["compute"] == sum(startup["compute_buffers"].values()) or after["compute_reserved_again"], ctx
        history = after["output_history"]
        assert real["output"] == (history[-2] if ctx == "ctx1" else history[0]), ctx
        # after the requests
        assert _by_owner(served, ctx)["output"] == sum(after["output_buffers"].values()), ctx
        # the target's at the first request (a warm-up's re-reserve for its adapters is its startup's);
        # the draft's at its startup decode
        reserved_again = [e for e in life.events if e.event == "alloc" and e.owner == "compute"
                          and e.scope == f"{ctx}.decode" and (ctx == "ctx1" or e.seq > life.listening)]
        assert bool(reserved_again) == bool(after["compute_reserved_again"]), ctx
        if "compute_buffers" in after:      # planned: the graphs with the layer inputs kept as outputs
            assert _by_owner(served, ctx)["compute"] == sum(after["compute_buffers"].values()), ctx
    # nothing else is allocated once the contexts exist: output buffers, and compute buffers where said
    after_created = [e for e in life.events if e.event == "alloc" and "." in e.scope and e.seq <= life.served]
    assert {e.owner for e in after_created} <= {"output", "compute"}


def test_fit_shows_what_the_fitted_server_allocates_after_startup():
    """fit -- llama-server: the same after_startup as reserve plans for the fitted command."""
    from schedplan.cli.fit import fit
    args = ["-m", str(model_path("tiny-llama")), "-md", str(model_path("tiny-eagle3-shared")), "--spec-type",
            "draft-eagle3", "-c", "4096"]
    res = CliRunner().invoke(fit, ["--device", "cuda:64MiB:cc=8.9", "--json", "--", "llama-server", *args])
    assert res.exit_code == 0, res.output
    fitted = json.loads(res.stdout)
    res = CliRunner().invoke(reserve, ["--device", "cuda:64MiB:cc=8.9", "--json", "--", "llama-server", *args])
    assert res.exit_code == 0, res.output
    assert fitted["after_startup"] == json.loads(res.stdout)["after_startup"]
    assert fitted["after_startup"]["model"]["output_history"][-1] == 4210688
