"""Context parameters as llama_context's constructor derives them (src/llama-context.cpp:84-478)."""
from __future__ import annotations

from dataclasses import dataclass

from . import ggml
from .hparams import LLAMA_POOLING_TYPE_NONE, LLAMA_POOLING_TYPE_UNSPECIFIED, LLAMA_POOLING_TYPES, HParams
from .params import Params

LLAMA_MAX_SEQ = 256
UINT32_MAX = 2**32 - 1


class BadParams(Exception):
    """An impossible parameter, with llama.cpp's reason."""


def pad(x: int, n: int) -> int:
    """GGML_PAD"""
    return (x + n - 1) // n * n


@dataclass
class CParams:
    n_ctx: int
    n_ctx_seq: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_outputs_max: int
    kv_unified: bool
    flash_attn: bool        # resolved by the auto probe in sched_reserve
    auto_fa: bool
    offload_kqv: bool
    op_offload: bool
    type_k: int
    type_v: int
    swa_full: bool
    # DeepSeek-V4's fused hyper-connection ops: on until the probes of sched_reserve turn one off
    fused_dsv4_hc_pre: bool = True
    fused_dsv4_hc_comb: bool = True
    fused_dsv4_hc_post: bool = True
    auto_fhc: bool = True
    n_rs_seq: int = 0       # recurrent-state snapshots per sequence for rollback (0: the arch has none)
    mtp: bool = False       # LLAMA_CONTEXT_TYPE_MTP: the NextN draft head's context
    embeddings: bool = False
    pooling_type: int = LLAMA_POOLING_TYPE_NONE
    # llama_set_embeddings_layer_inp: the layers whose input a drafter reads (llama-server sets them
    # after the context's creation; planner/server_life.py)
    embeddings_layer_inp: tuple[int, ...] = ()


def pad_u32(x: int, n: int) -> int:
    """GGML_PAD of a uint32_t: past 2^32 it wraps, as in C."""
    return pad(x, n) & UINT32_MAX


# llm_arch_supports_rs_rollback (src/llama-arch.cpp), for the planned architectures: the others
# get n_rs_seq 0 ("n_rs_seq > 0 is not supported by this arch", llama-context.cpp:106)
RS_ROLLBACK_ARCHS = frozenset({"kimi-k3", "qwen35", "qwen35moe", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe",
                               "lfm2", "lfm2moe"})


def llama_model_has_encoder(arch: str) -> bool:
    """llama_model_has_encoder (llama-model.cpp): such a context keeps n_batch outputs whatever
    n_outputs_max asks."""
    return arch in ("t5", "t5encoder", "eagle3", "dflash")


def derive_cparams(params: Params, hp: HParams) -> CParams:
    if params.n_ctx == 0 and hp.n_ctx_train == 0:   # llama_init_from_model
        raise BadParams("-c 0 takes the model's training context, which is 0: llama.cpp refuses the context "
                        "(n_ctx and n_ctx_train cannot both be zero)")
    if params.n_seq_max > LLAMA_MAX_SEQ:
        raise BadParams(f"-np {params.n_seq_max}: llama.cpp allows at most {LLAMA_MAX_SEQ} sequences (n_seq_max)")
    n_seq_max = max(1, params.n_seq_max)
    n_ctx = hp.n_ctx_train if params.n_ctx == 0 else params.n_ctx
    n_batch = min(n_ctx, params.n_batch) if hp.causal_attn else params.n_batch
    n_ubatch = min(n_batch, params.n_batch if params.n_ubatch == 0 else params.n_ubatch)
    n_outputs_max = n_batch if params.n_outputs_max == 0 or llama_model_has_encoder(hp.arch) else params.n_outputs_max
    asked = f"-c {params.n_ctx}" + (f" (the training context, {hp.n_ctx_train})" if params.n_ctx == 0 else "")
    n_ctx = pad_u32(n_ctx, 256)                     # cparams.n_ctx is a uint32_t
    if params.kv_unified:
        n_ctx_seq = n_ctx
        if n_ctx == 0:   # a KV cache of 0 cells: no buffer to allocate
            raise BadParams(f"{asked} rounds up to a multiple of 256 past 2^32, to 0 in llama.cpp's 32-bit n_ctx: "
                            f"llama.cpp would fail to create the context (failed to allocate buffer for kv cache)")
    else:
        n_ctx_seq = pad_u32(n_ctx // n_seq_max, 256)
        if n_ctx_seq == 0:
            raise BadParams(f"empty context per sequence (n_ctx_seq == 0): {asked} over -np {n_seq_max}"
                            + (", rounded up to a multiple of 256 past 2^32 (0 in llama.cpp's 32-bit n_ctx)"
                               if n_ctx == 0 else ""))
        n_ctx = (n_ctx_seq * n_seq_max) & UINT32_MAX
    type_k = ggml.type_by_name(params.type_k)
    type_v = ggml.type_by_name(params.type_v)
    flash_attn = params.flash_attn
    if hp.arch == "grok":   # llama_init_from_model: "flash_attn is not compatible with Grok - forcing off"
        flash_attn = "off"
    # llama_init_from_model: V is read from the K cache (DeepSeek-V4's caches are K-only too)
    if (hp.is_mla() or hp.arch == "deepseek4") and type_k != type_v:
        what = "DeepSeek-V4's K-only caches" if hp.arch == "deepseek4" else "multi-head latent attention"
        raise BadParams(f"-ctk {params.type_k} -ctv {params.type_v}: this model ({what}) needs the same K and V "
                        f"cache types")
    # llama_init_from_model: a quantized V cache needs flash attention; "auto" becomes "on"
    if ggml.is_quantized(type_v) and flash_attn != "on":
        if flash_attn == "off":
            raise BadParams(f"-ctv {params.type_v}: a quantized V cache requires flash attention, "
                            + ("which llama.cpp turns off for Grok" if hp.arch == "grok"
                               else "but -fa is off (use -fa on or -fa auto)"))
        flash_attn = "on"
    if flash_attn != "off":
        for t, head_of, which in ((type_k, hp.n_embd_head_k, "K"), (type_v, hp.n_embd_head_v, "V")):
            for il in range(hp.n_layer):
                if ggml.is_quantized(t) and head_of(il) % ggml.blck_size(t) != 0:
                    raise BadParams(f"{which} cache type {ggml.type_name(t)} with block size {ggml.blck_size(t)} "
                                    f"does not divide n_embd_head_{which.lower()}={head_of(il)}")
    n_rs_seq = params.n_rs_seq if hp.arch in RS_ROLLBACK_ARCHS else 0
    if n_rs_seq and hp.arch not in ("qwen35", "qwen35moe"):
        # mamba-base.cpp, lfm2.cpp, kimi-k3's, deepseek4's and glm5-next's rollback snapshots: not modelled
        raise NotImplementedError(f"recurrent-state rollback snapshots (n_rs_seq {n_rs_seq}, with MTP drafting) of a "
                                  f"{hp.arch} model are not planned (planned: qwen35, qwen35moe)")
    return CParams(
        n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
        n_outputs_max=n_outputs_max, kv_unified=params.kv_unified,
        flash_attn=flash_attn != "off", auto_fa=flash_attn == "auto",
        offload_kqv=params.offload_kqv, op_offload=params.op_offload,
        type_k=type_k, type_v=type_v, swa_full=params.swa_full,
        n_rs_seq=n_rs_seq, mtp=params.ctx_type == "mtp",
        embeddings=params.embeddings, pooling_type=pooling_type(params, hp),
    )


def pooling_type(params: Params, hp: HParams) -> int:
    """The context's pooling: --pooling, else the model's, else none (llama_context's constructor)."""
    if params.pooling_type != "unspecified":
        return LLAMA_POOLING_TYPES[params.pooling_type]
    return LLAMA_POOLING_TYPE_NONE if hp.pooling_type == LLAMA_POOLING_TYPE_UNSPECIFIED else hp.pooling_type
