"""What llama-server allocates after it has created its contexts: the rest of its startup
(tools/server/server-context.cpp load_model: common_speculative_init, then the draft context's
common_context_can_seq_rm decode) and its first request. The startup reservation (what --fit
measures) is left as it is; this is what follows it.

After the contexts exist, llama-server turns on in them what speculative decoding reads
(common/speculative.cpp, each enabled implementation's constructor, in common_speculative_init's
order):
- EAGLE-3: backend top-k(10) samplers on the draft context, one per slot (llama_set_sampler, when
  --spec-draft-backend-sampling is on, the default); the inputs of the target layers it reads
  (llama_set_embeddings_layer_inp on the target; the layer past the last one is the target's last
  hidden state, llama_set_embeddings_nextn unmasked); the draft's own last hidden state, masked.
- MTP (draft-mtp, over the model's NextN block or a Gemma 4 assistant): the draft's samplers, the
  target's last hidden state (unmasked) and the draft's (masked).
- DFlash and DSpark: the draft's samplers, the inputs of the target layers it reads, the draft's
  last hidden state (masked); a DFlash2 drafter (a selector) no samplers and its state unmasked.
- draft-simple and the n-gram types: nothing.
llama_set_sampler and llama_set_embeddings_layer_inp set sched_need_reserve: the context's next decode
reserves its graphs again (sched_reserve builds a new scheduler: the compute buffers are freed and
allocated anew, with the samplers' nodes, with the layer inputs kept as outputs).
llama_set_embeddings_nextn does not; it changes what output_reserve asks for at the next decode.

Then each decode calls output_reserve(n_outputs of the batch), which allocates a larger output buffer
(freeing the old one) when the flags or the outputs ask for more than it holds:
- the draft context: its startup decode (common_context_can_seq_rm: 2 tokens, one output, run on the
  draft because its n_rs_seq is 0) reserves its graphs again and grows its output buffer;
- the target: its first decode of the first request grows its output buffer (and reserves its graphs
  again where layer inputs are extracted); a verify batch carries 1 + the drafted tokens as outputs
  for its slot (planned with a full draft of --spec-draft-n-max tokens: a shorter one asks for less);
- an EAGLE-3 draft encodes the target's features of each prompt chunk (llama_process ENCODE,
  chunks of at most its n_ubatch, output_reserve(n_tokens)); a DFlash draft decodes 1 + n_max
  outputs for its slot.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .ggml import GGMLAbort
from .reserve import output_reserve_size

if TYPE_CHECKING:
    from .fit import ExtraModel
    from .params import Params
    from .reserve import Context
    from .server import SpecParams


# The targets whose graph records the input of each layer (res->t_layer_inp[il] = ... in
# src/models/<arch>.cpp), which llm_graph_result::set_outputs asserts for every extracted layer
# (GGML_ASSERT: layer input tensor is null); these three record the input of layer n_layer too
# (the last layer's output: extract_final_inp)
LAYER_INP_ARCHS = {"llama", "llama-embed", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp",
                   "gemma4", "muse-glimmer", "deepseek4", "nemotron_h", "bailingmoe3", "hunyuan_vl", "gpt-oss", "lfm2",
                   "minimax-01", "minimax-m2", "mimo2", "nanbeige"}
FINAL_LAYER_INP_ARCHS = {"deepseek4", "mimo2", "nemotron_h"}
# those whose graph module here records them too: their graphs with the layer inputs kept as
# outputs are planned (the others' reserved-again compute buffers are not)
PLANNED_LAYER_INP_ARCHS = {"llama", "llama-embed", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "gpt-oss",
                           "minimax-m2", "nanbeige", "hunyuan_vl", "muse-glimmer", "gemma4"}


@dataclass(frozen=True)
class ServerLife:
    """What decides llama-server's allocations after startup: its speculative decoding. (A request
    that asks for backend_sampling gives the target a sampler for its slot (llama_set_sampler): its
    output buffer grows and its graphs are reserved again; not planned, a request's choice. -bs,
    which gives every slot one at the context's creation, is refused: its startup reservation
    holds the samplers' nodes.)"""
    spec: "SpecParams"


@dataclass(frozen=True)
class ContextUse:
    """What llama-server turns on in one context after creating it (llama_context's cparams and
    sampling.samplers)."""
    samplers: bool = False                    # llama_set_sampler on every slot (sampling.samplers not empty)
    embeddings_nextn: Optional[bool] = None   # llama_set_embeddings_nextn(ctx, true, masked): masked; None: off
    layer_inp: tuple[int, ...] = ()           # llama_set_embeddings_layer_inp(ctx, il, true)

    def need_reserve(self) -> bool:
        """sched_need_reserve after llama_set_sampler / llama_set_embeddings_layer_inp."""
        return self.samplers or bool(self.layer_inp)


def speculative_uses(spec: "SpecParams", ctx_tgt: "Context", ctx_dft: Optional["Context"]) -> tuple[ContextUse, ContextUse]:
    """common_speculative_init: (target, draft) after each enabled implementation's constructor.
    The draft types need a draft context (params.draft.ctx_dft); DSpark and DFlash2 are refused
    earlier (not planned)."""
    tgt, dft = ContextUse(), ContextUse()
    if ctx_dft is None:
        return tgt, dft
    n_layer_tgt = ctx_tgt.hparams.n_layer
    ids = ctx_dft.hparams.target_layer_ids
    # llama_set_sampler offloads the top-k(10) chain where the output device supports its ops
    # (llama_sampler_backend_support: the CPU always); planned as offloaded
    samplers = spec.backend_sampling
    dflash2 = ctx_dft.hparams.dflash_selector_top_k > 0
    for t in ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"):   # common_speculative_init's order
        if t not in spec.types:
            continue
        if t == "draft-eagle3":
            for il in ids:
                if il > n_layer_tgt:
                    raise GGMLAbort(f"EAGLE3: target layer id {il} exceeds target n_layer {n_layer_tgt}: llama-server "
                                    f"aborts when it starts speculative decoding")
            inp = tuple(il for il in ids if il < n_layer_tgt)
            tgt = dataclasses.replace(tgt, layer_inp=tgt.layer_inp + inp,
                                      embeddings_nextn=False if n_layer_tgt in ids else tgt.embeddings_nextn)
        elif t == "draft-mtp":
            tgt = dataclasses.replace(tgt, embeddings_nextn=False)
        else:
            for il in ids:
                if il > n_layer_tgt:    # llama_context::set_embeddings_layer_inp
                    raise GGMLAbort(f"DFlash: the drafter reads target layer {il} of {n_layer_tgt}: llama-server aborts "
                                    f"when it starts speculative decoding (GGML_ASSERT(lid <= n_layer))")
            tgt = dataclasses.replace(tgt, layer_inp=tgt.layer_inp + tuple(ids))
            # DFlash2 samples from its selector's lattice (h_nextn, unmasked): no backend samplers
            dft = dataclasses.replace(dft, samplers=dft.samplers or (samplers and not dflash2),
                                      embeddings_nextn=not dflash2)
            continue
        dft = dataclasses.replace(dft, samplers=dft.samplers or samplers, embeddings_nextn=True)
    return tgt, dft


def after_startup(ctx_tgt: "Context", ctx_dft: Optional["Context"], server: ServerLife,
                  params: Optional["Params"] = None) -> dict:
    """The buffers that change after the startup reservation, per context ("model", "draft"):
    the output buffer after the draft's startup decode and after the first request, and whether the
    compute buffers are reserved again (their new size is not planned: the graphs with the
    samplers' nodes are not built here; the target's graphs with its layer inputs kept as outputs
    are, for the architectures whose graphs record them here, given the target's params)."""
    spec = server.spec
    tgt_use, dft_use = speculative_uses(spec, ctx_tgt, ctx_dft)
    drafting = ctx_dft is not None and any(t in spec.types for t in ("draft-simple", "draft-eagle3", "draft-mtp",
                                                                       "draft-dflash", "draft-dspark"))
    # a batch keeps one output per slot, 1 + the drafted tokens for a slot verifying a draft; with
    # embeddings every token of a batch is an output (server_output_limits: n_outputs_max = n_batch)
    embeddings = ctx_tgt.cparams.embeddings
    n_outputs = ctx_tgt.cparams.n_outputs_max if embeddings else 1 + spec.n_max if drafting else 1
    out = {"model": _context_after(ctx_tgt, tgt_use, [n_outputs], "the first decode of the first request")}
    if embeddings:
        out["model"]["note"] = (f"every token of a batch is an output: planned for a prompt of at least {n_outputs} "
                                f"tokens; a shorter prompt asks for fewer")
    arch, n_layer = ctx_tgt.hparams.arch, ctx_tgt.hparams.n_layer
    missing = [il for il in tgt_use.layer_inp if arch not in LAYER_INP_ARCHS
               or (il == n_layer and arch not in FINAL_LAYER_INP_ARCHS)]
    if missing:
        out["model"]["first_request_aborts"] = (f"the {arch} target's graph does not record the input of layer "
                                                f"{missing[0]} the drafter reads (GGML_ASSERT: layer input tensor "
                                                f"is null)")
    elif tgt_use.layer_inp and params is not None and arch in PLANNED_LAYER_INP_ARCHS and not tgt_use.samplers:
        out["model"]["compute_buffers"] = reserve_again(ctx_tgt.path, params, tgt_use.layer_inp)
        out["model"]["compute_reserved_again"] = out["model"]["compute_reserved_again"].replace(
            ": size not planned", "")
    if ctx_dft is not None:
        n_outputs = 1
        if "draft-eagle3" in spec.types:
            # the encoder pass over each prompt chunk: output_reserve(n_tokens), n_tokens <= n_ubatch
            n_outputs = min(ctx_dft.cparams.n_ubatch, ctx_tgt.cparams.n_batch)
        elif "draft-dflash" in spec.types or "draft-dspark" in spec.types:
            n_outputs = 1 + spec.n_max      # a block: the anchor and n_max masks
        # the startup decode (one output), then the first request
        out["draft"] = _context_after(ctx_dft, dft_use, [1, n_outputs], "its startup decode (common_context_can_seq_rm)")
        if "draft-eagle3" in spec.types:
            out["draft"]["note"] = ("the encoder pass reserves outputs for each prompt chunk: planned for a prompt "
                                    f"of at least {n_outputs} tokens; a shorter prompt asks for fewer")
    return out


def reserve_again(model_path: str, params: "Params", layer_inp: tuple[int, ...]) -> dict[str, int]:
    """sched_reserve at the decode after llama_set_embeddings_layer_inp: a new scheduler, the pp,
    tg and pp graphs reserved again with those layers' inputs kept as outputs. The compute buffers
    per buffer type."""
    from .reserve import common_init_adapters, compute_buffers, create_context, sched_reserve
    ctx = create_context(model_path, params)
    ctx.cparams = dataclasses.replace(ctx.cparams, embeddings_layer_inp=tuple(sorted(set(layer_inp))))
    # the graphs hold the control vectors and LoRA adapters common_init_from_params set, too
    if common_init_adapters(ctx, params) is None:
        sched_reserve(ctx)
    return compute_buffers(ctx)


def output_after(ctx: "Context", use: ContextUse, decodes: list[int]) -> list[int]:
    """The output buffer's size after construction and after each decode of decodes (its outputs):
    output_reserve allocates anew only when the buffer holds less than the decode asks for."""
    buft = ctx.devices.output_buft
    sizes = [buft.buffer_size(ctx.output_buffer_size)]
    for n_outputs in decodes:
        new = output_reserve_size(ctx.hparams, ctx.cparams, n_outputs, use.embeddings_nextn, use.layer_inp,
                                  use.samplers)
        sizes.append(buft.buffer_size(new) if sizes[-1] < new else sizes[-1])
    return sizes


def _context_after(ctx: "Context", use: ContextUse, decodes: list[int], when: str) -> dict:
    reasons = []
    if use.samplers:
        reasons.append("backend samplers (llama_set_sampler)")
    if use.layer_inp:
        reasons.append(f"the inputs of layers {', '.join(map(str, sorted(set(use.layer_inp))))} kept as outputs "
                       f"(llama_set_embeddings_layer_inp)")
    sizes = output_after(ctx, use, decodes)
    name = ctx.devices.output_buft.name
    return {"output_buffers": {name: sizes[-1]}, "output_history": sizes, "n_outputs": decodes,
            "n_outputs_reserved": max(max(decodes), ctx.cparams.n_seq_max),
            "embeddings_nextn": None if use.embeddings_nextn is None else
            ("masked" if use.embeddings_nextn else "unmasked"),
            "layer_inp": sorted(set(use.layer_inp)), "samplers": use.samplers,
            "compute_reserved_again": f"at {when}, with " + " and ".join(reasons) + ": size not planned"
            if use.need_reserve() else None}


def plan_after_startup(model_path: str, params: "Params", draft: Optional["ExtraModel"], server: ServerLife) -> dict:
    """after_startup of llama-server's contexts as created with these parameters (after --fit: the
    fitted ones, the draft's from draft_after_fit): the contexts are created, not reserved (what
    follows the startup reservation does not depend on its compute buffers)."""
    from .reserve import create_context
    ctx = create_context(model_path, params)
    ctx_dft = None
    if draft is not None:
        ctx_dft = create_context(draft.path, dataclasses.replace(draft.params, n_ctx=ctx.cparams.n_ctx), ctx_other=ctx)
    return after_startup(ctx, ctx_dft, server, params)
