"""What llama-server does around --fit that llama-fit-params does not (tools/server/server-context.cpp
server_context::load_model, common/common.cpp common_init_result).

With a projector (-mm, -mmu, or the one -hf picks) and --fit on, the server asks
mtmd_get_memory_usage for the projector's bytes per device and adds each to fit_params_target[i],
where i is that device's index in ggml's device registry (ggml_backend_dev_get(i)), before fitting
the model. common_fit_params reads margin i for the model's device i: where the registry and the
model list the devices alike (CUDA, Metal, Vulkan devices alone) the projector's memory is kept free
on its device; RPC servers come after the CPU in the registry ([CPU, RPC0, RPC1]) but first among
the model's devices ([RPC0, RPC1]), so with RPC servers the bytes of RPC0 raise the margin of the
model's second device, and a projector on the CPU raises the first one's. The server then loads the
projector with the text model, which must take its embedding size (mtmd_context).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from .fit import ExtraModel
from .model import load_hparams
from .model_loader import ModelLoader
from .download import read_model_header
from .mtmd.mtmd import MmprojPlan, check_n_embd
from .params import Params

MiB = 1024 * 1024


# common_speculative_type_from_name_map, and each type's n_max with llama.cpp's defaults
# (common_speculative_n_max: a draft type drafts --spec-draft-n-max tokens; the n-gram types their
# size_m (48), ngram-mod its n_max (64), ngram-cache 8)
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
SPEC_DRAFT_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
SPEC_NGRAM_N_MAX = {"ngram-simple": 48, "ngram-map-k": 48, "ngram-map-k4v": 48, "ngram-mod": 64, "ngram-cache": 8}
N_PARALLEL_AUTO = 4     # server.cpp: -np unset (-1, "auto") is 4 slots over a unified KV cache


@dataclass(frozen=True)
class SpecParams:
    """common_params_speculative: --spec-type (appended to the default ["none"]), a draft model
    (-md, or the file -hfd picks) and its flags (-ngld, -ctkd, -ctvd, -otd/-cmoed/-ncmoed,
    --spec-draft-n-max), and the n-gram types' draft lengths (--spec-ngram-*-size-m,
    --spec-ngram-mod-n-max)."""
    types: tuple[str, ...] = ("none",)
    draft_path: Optional[str] = None
    n_gpu_layers: int = -1
    type_k: str = "f16"
    type_v: str = "f16"
    tensor_overrides: tuple[tuple[str, str], ...] = ()
    n_max: int = 3
    ngram_n_max: tuple[tuple[str, int], ...] = tuple(SPEC_NGRAM_N_MAX.items())
    backend_sampling: bool = True     # --spec-draft-backend-sampling: the draft's samplers on the backend (default on)

    def n_draft(self) -> int:
        """common_speculative_n_max: the most tokens any of the types drafts."""
        ngram = dict(self.ngram_n_max)
        return max([max(0, self.n_max) if t in SPEC_DRAFT_TYPES else ngram.get(t, 0) for t in self.types] + [0])


def spec_types_from_names(names: list[str]) -> list[str]:
    """common_speculative_types_from_names: the types of one --spec-type value, in order; "none"
    ends the list as ["none"]; an unknown name before it is refused."""
    types = []
    for name in names:
        if name not in SPEC_TYPES:
            raise ValueError(f"unknown speculative type: {name} (one of {', '.join(SPEC_TYPES)})")
        if name == "none":
            return ["none"]
        types.append(name)
    return types


# common_speculative_init_result loads the draft (llama_model_load_from_file) and creates its context
# (llama_init_from_model) directly, not through common_init_from_params: no LoRA adapter or control
# vector reaches it (the real llama-server serves an EAGLE-3 head beside a --lora'd llama)
NO_ADAPTERS = {"lora": (), "lora_init_without_apply": False, "control_vectors": ()}


def speculative_params(model_path: str, params: Params, spec: SpecParams) -> tuple[Params, Optional[ExtraModel]]:
    """The main model's parameters with speculative decoding (common_model_params_to_llama,
    common_context_params_to_llama) and the extra model common_init_result fits beside it
    (common/common.cpp). MTP drafting loads the main model's NextN blocks (load_mtp, which -ngl
    then counts) and keeps --spec-draft-n-max recurrent-state snapshots per sequence (n_rs_seq);
    its extra model is an MTP context over the main model's own weights (shares_model), with the
    main context's parameters as they were before fitting. A draft model has its own model
    parameters (common_base_params_to_speculative: -ngld, -otd, -ctkd/-ctvd); both contexts keep
    one output per slot (n_outputs_max = n_parallel; an EAGLE-3 head, an encoder model, n_batch).
    EAGLE-3 and DFlash/DSpark drafting keep the snapshots too; the head is measured alone, as
    common_fit_params measures it (a head that needs its target's token_embd or output fails there
    and is left out).
    MTP drafting from a draft model (-md, a Gemma 4 assistant) measures an MTP context of the draft
    alone; an assistant, which reads its target's embedding and cache, fails there and is left out.
    Neither draft nor MTP context computes embeddings (common_base_params_to_speculative: embedding
    false, pooling unspecified)."""
    # need_n_rs_seq: draft-mtp, draft-eagle3, draft-dflash and draft-dspark keep draft.n_max rollback snapshots
    if any(t in spec.types for t in ("draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark")):
        params = dataclasses.replace(params, n_rs_seq=max(0, spec.n_max))
    mtp = "draft-mtp" in spec.types
    if mtp:   # common_model_params_to_llama: load_mtp follows the types, for the model and a draft alike
        params = dataclasses.replace(params, load_mtp=True)
    if mtp and spec.draft_path is None:
        ctx = dataclasses.replace(params, type_k=spec.type_k, type_v=spec.type_v, n_outputs_max=params.n_seq_max,
                                  ctx_type="mtp", n_rs_seq=0,
                                  embeddings=False, pooling_type="unspecified", **NO_ADAPTERS)
        return params, ExtraModel(model_path, ctx, shares_model=True)
    if spec.draft_path is None:
        return params, None
    # a draft model with draft-mtp (a Gemma 4 assistant): an MTP context over the draft's own weights
    dft = dataclasses.replace(params, n_gpu_layers=spec.n_gpu_layers, tensor_overrides=spec.tensor_overrides,
                              type_k=spec.type_k, type_v=spec.type_v, n_outputs_max=params.n_seq_max, n_rs_seq=0,
                              ctx_type="mtp" if mtp else params.ctx_type, embeddings=False, pooling_type="unspecified",
                              **NO_ADAPTERS)
    return params, ExtraModel(spec.draft_path, dft, shares_model=False)


def draft_after_fit(draft: ExtraModel, fitted: Params) -> ExtraModel:
    """The draft llama-server creates after --fit: a draft model takes the fitted tensor split
    (common_fit_params writes it into common_params::tensor_split, which
    common_base_params_to_speculative copies); the MTP context over the model's own NextN block is
    created over the fitted model with the fitted context parameters (common_fit_params measured it
    with the parameters as they were before fitting)."""
    d = draft.params
    if draft.shares_model:
        return dataclasses.replace(draft, params=dataclasses.replace(
            fitted, type_k=d.type_k, type_v=d.type_v, n_outputs_max=d.n_outputs_max, ctx_type=d.ctx_type,
            n_rs_seq=d.n_rs_seq, embeddings=d.embeddings, pooling_type=d.pooling_type))
    return dataclasses.replace(draft, params=dataclasses.replace(d, tensor_split=fitted.tensor_split))


def draft_types_from_gguf(spec: SpecParams, header_cache: bool = True) -> SpecParams:
    """common_speculative_types_from_gguf, when no --spec-type is given: a draft GGUF whose last
    block has a NextN eh_proj is an MTP head (draft-mtp), a "dflash" one a DFlash/DSpark drafter;
    other drafts leave the types as they are."""
    if spec.types != ("none",) or spec.draft_path is None:
        return spec
    header = read_model_header(spec.draft_path, header_cache)
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        return spec
    if arch == "dflash":
        return dataclasses.replace(spec, types=("draft-dspark" if header.tensor("markov_w1.weight") else "draft-dflash",))
    block_count = header.get(f"{arch}.block_count")
    if isinstance(block_count, int) and header.tensor(f"blk.{block_count - 1}.nextn.eh_proj.weight") is not None:
        return dataclasses.replace(spec, types=("draft-mtp",))
    return spec


def server_params(params: Params, n_parallel_given: bool, n_draft: int = 0) -> tuple[Params, list[str]]:
    """The context llama-server fits and creates, where it differs from llama-fit-params': -np
    unset is "auto", 4 slots over a unified KV cache (server.cpp), and a batch's outputs are
    capped at n_parallel * (1 + the most tokens a speculative type drafts) (server_output_limits),
    not n_batch; with embeddings, or a pooling other than none, every token of a batch is an
    output (n_outputs_max = n_batch)."""
    log = []
    if not n_parallel_given:
        params = dataclasses.replace(params, n_seq_max=N_PARALLEL_AUTO, kv_unified=True)
        log.append("llama-server: -np unset (auto): 4 slots, unified KV cache")
    if params.embeddings or params.pooling_type not in ("unspecified", "none"):
        n_outputs = params.n_batch
    else:
        n_outputs = max(1, min(params.n_batch, params.n_seq_max * (1 + max(0, n_draft))))
    log.append(f"llama-server: at most {n_outputs} outputs per batch (n_outputs_max)")
    return dataclasses.replace(params, n_outputs_max=n_outputs), log


def mmproj_fit_targets(targets: list[int], plan: MmprojPlan) -> tuple[list[int], list[str]]:
    """fit_params_target after the server adds the projector's memory (server-context.cpp:1046-1067),
    and what it logged (SRV_DBG), device by device."""
    out = list(targets)
    log = []
    names = [d.device_name for d in plan.devices]
    for dev, size in plan.memory_usage().items():
        i = names.index(dev)
        if i < len(out):
            out[i] += size
            log.append(f"projector: adding {size / MiB:.2f} MiB to fit_params_target for device {dev} "
                       f"(registry index {i})")
    return out, log


def check_mmproj_for_model(plan: MmprojPlan, model_path: str, params: Params) -> None:
    """The embedding-size check llama-server's projector load makes against the text model (as loaded,
    with its --override-kv)."""
    hp = load_hparams(ModelLoader(read_model_header(model_path, params.header_cache), params.header_cache,
                                  params.kv_overrides))
    check_n_embd(plan, model_path, hp.n_embd_inp())


def loaded_with(model_path: str, params: Params) -> dict:
    """What the model is then loaded with, as llama.cpp logs it: the context size (and its slots,
    batch sizes and output cap), each layer's
    device (the output layer last), and the weights an -ot pattern matched with the buffer type
    that picked for them (the CPU list's choice, before mmap maps it: CPU, CPU_REPACK, ...)."""
    import re

    from .cparams import derive_cparams
    from .devices import lazy_read_buft, plan_devices, weight_placement
    from .model import load_tensors
    from .vocab import load_vocab, rerank_warnings

    ml = ModelLoader(read_model_header(model_path, params.header_cache), params.header_cache, params.kv_overrides)
    hp = load_hparams(ml)
    devices = plan_devices(params, hp)
    unmapped = dataclasses.replace(params, use_mmap=False)
    place = weight_placement(devices, unmapped, hp)
    patterns = [re.compile(p) for p, _ in params.tensor_overrides]
    overrides = {}

    def placed(weight, name, op, il):
        buft = place(weight, name, op, il)
        if any(p.search(name) for p in patterns):
            overrides[name] = buft.name
        return buft

    vocab = load_vocab(ml)
    load_tensors(ml, hp, placed, lazy_read_buft(unmapped), load_mtp=params.load_mtp)
    cp = derive_cparams(params, hp)
    loaded = {"n_ctx_loaded": cp.n_ctx,
              "context_loaded": {"n_seq_max": cp.n_seq_max, "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch,
                                 "n_outputs_max": cp.n_outputs_max},
              "layer_devices": [b.device_name for b in devices.layer_backend] + [devices.output_backend.device_name],
              "overrides": overrides}
    warnings = ml.warnings + rerank_warnings(ml, vocab, cp.pooling_type)    # common_init_from_params, after the context
    if warnings:
        loaded["warnings"] = warnings
    return loaded
