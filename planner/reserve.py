"""The reservation llama_context performs: context construction, then sched_reserve
(src/llama-context.cpp:615-767): fused-op probes, pp, tg, pp again; buffers grow to the running maximum.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from . import LLAMA_CPP_COMMIT, ggml, models
from .cparams import BadParams, CParams, derive_cparams
from .devices import Devices, lazy_read_buft, plan_devices, weight_placement
from .download import read_model_header
from .ggml import GGMLAbort
from .gguf import GGUFHeader
from .graph import (LLM_FUSED_OP_DSV4_HC_COMB, LLM_FUSED_OP_DSV4_HC_POST, LLM_FUSED_OP_DSV4_HC_PRE,
                    LLM_FUSED_OP_FLASH_ATTN, GraphContext, Ubatch)
from .hparams import LLAMA_SWA_TYPE_NONE, HParams, UnsupportedModel
from .kv_cache import KVCache, create_kv_cache
from .kv_cache_dsa import KVCacheDSA, KVCacheDSAISWA, create_kv_cache_dsa, create_kv_cache_dsa_iswa
from .kv_cache_dsv4 import KVCacheDSV4, create_kv_cache_dsv4
from .kv_cache_iswa import KVCacheISWA, create_kv_cache_iswa
from .kv_cache_msa import KVCacheMSA, create_kv_cache_msa
from .memory_hybrid_idx import create_memory_hybrid_idx
from .memory_recurrent import MemoryHybrid, MemoryRecurrent, create_memory_recurrent
from .adapter import (ControlVector, LoraAdapter, common_control_vector_load, llama_adapter_cvec_init,
                      llama_adapter_lora_init)
from .model import Model, load_hparams, load_tensors
from .model_loader import ModelLoader
from .params import Params
from .sched import Sched, Splitting
from .vocab import LLAMA_TOKEN_NULL, RERANK_NO_BOS, RERANK_NO_EOS_SEP_PROMPT, Vocab, load_vocab, rerank_warnings

if TYPE_CHECKING:
    from .fit import ExtraModel
    from .server_life import ServerLife
    from .mtmd.mtmd import MmprojParams, MmprojPlan

SCHEMA = "schedplan.reserve/1"


@dataclass
class GraphStats:
    n_tokens: int
    n_seqs: int
    n_outputs: int
    nodes: int
    splits: int
    buffers: dict[str, int]      # what this graph alone needs per buffer type
    split_list: list[dict]       # the scheduler's splits: backend, node range, inputs
    peaks: dict[str, dict]       # per buffer type, where this graph's allocation peaked


def split_list(ctx: Context, nodes: list[ggml.Tensor]) -> list[dict]:
    """The splits of the last scheduled graph: backend, node range [i_start, i_end) of the graph
    (`nodes`, as ggml_backend_sched_split indexes it), and the inputs copied in from other
    backends with their sizes."""
    sched = ctx.sched
    out = []
    for i, split in enumerate(sched.splits[:sched.n_splits]):
        out.append({"index": i, "backend": ctx.devices.backends[split.backend_id].name,
                    "nodes": [split.i_start, split.i_end],
                    "first": nodes[split.i_start].name if split.i_end > split.i_start else None,
                    "last": nodes[split.i_end - 1].name if split.i_end > split.i_start else None,
                    "inputs": [{"name": t.name, "size": t.nbytes} for t in split.inputs]})
    return out


@dataclass
class Context:
    """What llama_context holds after construction."""
    path: str
    hparams: HParams
    cparams: CParams
    devices: Devices
    model: Model
    kv: Union[KVCache, KVCacheISWA, KVCacheDSA, KVCacheDSAISWA, KVCacheDSV4, KVCacheMSA, MemoryRecurrent, MemoryHybrid,
              None]     # llama_context::memory: None where the model keeps none
    sched: Sched
    output_buffer_size: int
    graph_renames_persistent: bool = False   # a built graph renamed a weight or a cache tensor
    ctx_other: Optional["Context"] = None    # cparams.ctx_other: the target context a draft head reads
    warnings: list[str] = dataclasses.field(default_factory=list)   # what llama.cpp warns of this context
    lora_adapters: list[tuple[LoraAdapter, float]] = dataclasses.field(default_factory=list)   # loaded, with scales
    loras: list[tuple[LoraAdapter, float]] = dataclasses.field(default_factory=list)   # llama_context::loras
    cvec: Optional[ControlVector] = None      # llama_context::cvec, once control vectors are applied
    vocab: Optional[Vocab] = None             # the model's special tokens (llama-server's warm-up runs BOS, EOS)


def create_context(model_path: str, params: Params, header: Optional[GGUFHeader] = None,
                   ctx_other: Optional[Context] = None) -> Context:
    """header: the model's header when the caller already read it (fit measures a model many times).
    ctx_other: the target's context, for a draft head that reads the target's tensors
    (llama_context_params.ctx_other, which llama-server sets for every draft context)."""
    ml = ModelLoader(header or read_model_header(model_path, params.header_cache), params.header_cache,
                     params.kv_overrides)
    hp = load_hparams(ml)
    vocab = load_vocab(ml)
    cp = derive_cparams(params, hp)
    devices = plan_devices(params, hp)
    model = load_tensors(ml, hp, weight_placement(devices, params, hp), lazy_read_buft(params),
                         load_mtp=params.load_mtp)
    # common_init_result: the adapters are loaded after the model, before the context
    lora_adapters = [(llama_adapter_lora_init(model, path, devices.cpu.buft), scale) for path, scale in params.lora]
    if cp.mtp:
        check_mtp_context(ml, hp)
    ctx_other = check_ctx_other(ml, model, ctx_other)   # llama_context's constructor, first
    if cp.mtp and not hasattr(models.module(hp.arch), "build_mtp"):
        raise NotImplementedError(f"MTP drafting (--spec-type draft-mtp) of a {hp.arch} model is not planned "
                                  f"(planned: qwen35, qwen35moe)")
    # the cache is created before the FA probe: "auto" still counts as on (v_trans = !flash_attn)
    kv = create_memory(hp, cp, devices, ctx_other)
    output_size = output_reserve_size(hp, cp)
    sched = new_sched(devices, cp)
    # the loader's warnings, llama_context's, then common_init_from_params' where the vocabulary cannot rerank
    return Context(str(model_path), hp, cp, devices, model, kv, sched, output_size, ctx_other=ctx_other,
                   warnings=ml.warnings + context_warnings(hp, cp) + rerank_warnings(ml, vocab, cp.pooling_type),
                   lora_adapters=lora_adapters, vocab=vocab)


def new_sched(devices: Devices, cp: CParams) -> Sched:
    """ggml_backend_sched_new over the context's backends (llama_context's constructor, and
    sched_reserve when sched_need_reserve makes a new one)."""
    return Sched(devices.backends, devices.backend_bufts, parallel=devices.pipeline_parallel, op_offload=cp.op_offload)


def context_warnings(hp: HParams, cp: CParams) -> list[str]:
    """What llama_context's constructor warns of (LLAMA_LOG_WARN, llama-context.cpp:327): a sequence
    longer than the training context (models with learned positions then index past their table)."""
    if cp.n_ctx_seq > hp.n_ctx_train:
        return [f"n_ctx_seq ({cp.n_ctx_seq}) > n_ctx_train ({hp.n_ctx_train}) -- possible training context overflow"]
    return []


def output_reserve_size(hp: HParams, cp: CParams, n_outputs: int = 0, embeddings_nextn: Optional[bool] = None,
                       layer_inp: tuple[int, ...] = (), sampling: bool = False) -> int:
    """llama_context::output_reserve(n_outputs): the bytes its output buffer needs (C:2116). At
    construction output_reserve(n_seq_max): f32 logits for n_seq_max outputs, and as many embeddings
    (n_embd_out wide) when the context computes them, which T5 always does ("TODO: hacky enc-dec
    support"). What llama-server turns on later grows it (planner/server_life.py): the last hidden
    states (llama_set_embeddings_nextn: embeddings_nextn is its `masked`, None while off; unmasked,
    one row per token of n_batch), the inputs of the layers in layer_inp (n_embd x n_batch each), and
    backend samplers (logits and probs, the sampled token and the candidates, per output)."""
    n_outputs_max = max(n_outputs, cp.n_seq_max)
    has_embd = cp.embeddings or hp.arch == "t5"
    n_floats = (hp.n_vocab + (hp.n_embd_out() if has_embd else 0)) * n_outputs_max
    if embeddings_nextn is not None:
        n_floats += hp.n_embd_out() * (n_outputs_max if embeddings_nextn else cp.n_batch)
    n_floats += len(set(layer_inp)) * hp.n_embd * cp.n_batch
    n_tokens = 0
    if sampling:
        n_floats += 2 * hp.n_vocab * n_outputs_max
        n_tokens = (1 + hp.n_vocab) * n_outputs_max
    return n_floats * 4 + n_tokens * 4


class ContextRefused(UnsupportedModel):
    """A draft head llama.cpp loads and creates a context for only beside its target (ctx_other):
    common_fit_params, which measures its extra model alone, fails there and fits the main model
    alone, and llama-server then creates the head's context beside the target. (A context llama.cpp
    refuses for other reasons also leaves fit without its extra model, but the server then fails to
    create it: the plan refuses those.)"""


def check_ctx_other(ml: ModelLoader, model: Model, ctx_other: Optional[Context]) -> Optional[Context]:
    """llama_context's constructor: cparams.ctx_other, which a Gemma 4 assistant always needs and a
    draft head without its own token_embd or output needs to read the target's; only speculative
    decoding sets it (common_fit_params measures the draft without it, fails, and fits the main model
    alone). Other models ignore it (None)."""
    arch = model.hparams.arch
    if arch == "gemma4-assistant":
        if ctx_other is None:
            raise ContextRefused(f"{ml.header.path}: Gemma4Assistant requires ctx_other to be set: llama.cpp creates "
                                 f"the context of a Gemma 4 assistant only beside its target model, whose token_embd "
                                 f"and K/V cache it reads (llama-server --spec-type draft-mtp -md FILE)")
        return ctx_other
    if arch == "dflash" and model.tok_embd is not None and model.output is not None:
        raise NotImplementedError("a DFlash drafter with its own token_embd and output (which llama.cpp runs alone) "
                                  "is not planned")
    if arch in ("eagle3", "dflash") and (model.tok_embd is None or model.output is None):
        if ctx_other is None:
            raise ContextRefused(f"{ml.header.path}: {arch} requires ctx_other to be set: llama.cpp creates the "
                                 f"context of a head without its own token_embd and output only beside its target "
                                 f"model (llama-server --spec-type draft-{arch} -md FILE)")
        return ctx_other
    return None


def check_mtp_context(ml: ModelLoader, hp: HParams) -> None:
    """An MTP context (LLAMA_CONTEXT_TYPE_MTP, --spec-type draft-mtp): llama_init_from_model
    refuses it without NextN layers (its graph is planned for the architectures with a build_mtp)."""
    if hp.n_layer_nextn == 0:
        ml.fail("--spec-type draft-mtp: the model has no multi-token-prediction (NextN) layers "
                "(nextn_predict_layers is 0): llama.cpp cannot create the MTP context")


# llm_arch_is_recurrent, llm_arch_is_hybrid (src/llama-arch.cpp), for the planned architectures
RECURRENT_ARCHS = frozenset({"arwkv7", "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7"})
HYBRID_ARCHS = frozenset({"bailingmoe3", "falcon-h1", "glm5-next", "granitehybrid", "jamba", "kimi-k3", "kimi-linear",
                          "lfm2", "lfm2moe", "minimax-01", "nemotron_h", "nemotron_h_moe", "plamo2", "qwen3next", "qwen35",
                          "qwen35moe", "qwen4exp"})


# the architectures llama_model::create_memory gives no memory (res = nullptr): their attention runs
# over the ubatch alone (build_attn_inp_no_cache)
NO_MEMORY_ARCHS = frozenset({"bert", "dream", "eurobert", "gemma-embedding", "jina-bert-v2", "jina-bert-v3", "llada",
                             "llada-moe", "modern-bert", "neo-bert", "nomic-bert", "nomic-bert-moe", "rnd1",
                             "wavtokenizer-dec"})

# the architectures with MiniMax sparse attention over llama_kv_cache_msa
MSA_ARCHS = frozenset({"minimax-m3"})

# the architectures whose final pp reserve runs one sequence (sched_reserve's switch on model.arch)
RESERVE_PP_ONE_SEQ_ARCHS = frozenset({"kimi-linear", "minimax-01"})


def create_memory(hp: HParams, cp: CParams, devices: Devices,
                  ctx_other: Optional[Context] = None) -> Union[KVCache, KVCacheISWA, KVCacheDSA, KVCacheDSAISWA,
                                                                KVCacheDSV4, KVCacheMSA, MemoryRecurrent, MemoryHybrid,
                                                                None]:
    """llama_model::create_memory: llama_memory_recurrent (r/s states in f32, one cell per
    sequence and cp.n_rs_seq rollback snapshots of it), llama_memory_hybrid (the
    attention layers in a llama_kv_cache, or a llama_kv_cache_iswa for llama_memory_hybrid_iswa
    when the model has sliding-window layers, the recurrent ones in recurrent state, by the arch's
    layer filters; with an indexer cache beside, llama_memory_hybrid_idx), llama_kv_cache_dsa for
    DeepSeek sparse attention (llama_kv_cache_dsa_iswa beside sliding-window layers), llama_kv_cache_msa
    for MiniMax sparse attention, llama_kv_cache_dsv4 for DeepSeek-V4, llama_kv_cache, or
    llama_kv_cache_iswa when the model has sliding-window layers (a Gemma 4 assistant's over the
    target's: every layer shares its K/V); None for the architectures that keep no memory."""
    def kv_buft(il: int):
        # the layer's device buffer type with offload_kqv, else the CPU buffer type
        return devices.layer_backend[il].buft if cp.offload_kqv else devices.cpu.buft

    if hp.arch in NO_MEMORY_ARCHS:
        return None
    v_trans = not cp.flash_attn
    rs_size = max(1, cp.n_seq_max)
    if cp.mtp and hp.arch in ("qwen35", "qwen35moe"):
        # mtp_on_hybrid_qwen: the MTP head's plain KV cache of the NextN layers alone
        return create_kv_cache(hp, cp.type_k, cp.type_v, v_trans, cp.n_ctx_seq, cp.n_seq_max, cp.kv_unified,
                               kv_buft, lambda il: il >= hp.n_layer)
    if hp.arch in RECURRENT_ARCHS:
        return create_memory_recurrent(hp, ggml.T.F32, ggml.T.F32, rs_size, cp.n_rs_seq, kv_buft)
    if hp.arch in HYBRID_ARCHS:
        if hp.arch == "falcon-h1":
            # attention and Mamba-2 run side by side in every layer: every layer is in both
            def filter_attn(il): return True
            def filter_recr(il): return True
        elif hp.arch in ("nemotron_h", "nemotron_h_moe"):
            # attention and recurrent layers are those without an FFN; the FFN-only layers hold no memory
            def filter_attn(il): return not hp.is_recr(il) and hp.n_ff(il) == 0
            def filter_recr(il): return hp.is_recr(il) and hp.n_ff(il) == 0
        elif hp.arch in ("qwen3next", "qwen35", "qwen35moe", "glm5-next", "minimax-01", "qwen4exp"):
            # the trunk's layers only, never the NextN ones
            def filter_attn(il): return il < hp.n_layer and not hp.is_recr(il)
            def filter_recr(il): return il < hp.n_layer and hp.is_recr(il)
        else:
            # llama_memory_hybrid's defaults
            def filter_attn(il): return not hp.is_recr(il)
            def filter_recr(il): return hp.is_recr(il)
        if hp.swa_type != LLAMA_SWA_TYPE_NONE:   # llama_memory_hybrid_iswa
            attn = create_kv_cache_iswa(hp, cp, v_trans, kv_buft, filter_attn)
        else:
            attn = create_kv_cache(hp, cp.type_k, cp.type_v, v_trans, cp.n_ctx_seq, cp.n_seq_max, cp.kv_unified,
                                   kv_buft, filter_attn)
        recr = create_memory_recurrent(hp, ggml.T.F32, ggml.T.F32, rs_size, cp.n_rs_seq, kv_buft, filter_recr)
        if hp.arch == "glm5-next":
            # llama_memory_hybrid_idx: and the k-pool indexer's cache of the trunk's full indexer layers
            def filter_idx(il): return il < hp.n_layer and not hp.is_recr(il) and hp.is_indexer_full(il)
            return create_memory_hybrid_idx(hp, cp, v_trans, kv_buft, attn, recr, filter_idx)
        if hp.arch == "qwen4exp":
            # llama_memory_hybrid_idx: QSA's indexer keys of the attention layers (no k-pools)
            return create_memory_hybrid_idx(hp, cp, v_trans, kv_buft, attn, recr, filter_attn)
        return MemoryHybrid(attn, recr)
    if hp.arch in MSA_ARCHS:
        return create_kv_cache_msa(hp, cp, v_trans, kv_buft)
    # with NextN layers (and a trunk) the main context's cache holds the trunk's layers only
    def trunk(il): return il < hp.n_layer
    if hp.arch == "deepseek4":
        # llama_kv_cache_dsv4: a raw window cache, compressed caches and compressor states (derive_cparams
        # refuses n_rs_seq > 0 for it: its rollback planes are not modelled)
        if hp.swa_type == LLAMA_SWA_TYPE_NONE:
            raise GGMLAbort("llama.cpp would abort creating the KV cache (llama-model.cpp GGML_ASSERT(swa_type != "
                            "LLAMA_SWA_TYPE_NONE))")
        return create_kv_cache_dsv4(hp, cp, v_trans, kv_buft, cp.n_rs_seq)
    if hp.arch in ("deepseek32", "glm-dsa"):
        # llama_kv_cache_dsa: the MLA cache, and the indexer's of the trunk layers (glm-dsa: its full indexer layers)
        def filter_lid(il): return il < hp.n_layer and (hp.arch != "glm-dsa" or hp.is_indexer_full(il))
        return create_kv_cache_dsa(hp, cp, v_trans, kv_buft, trunk if hp.n_layer_nextn > 0 else None, filter_lid)
    if hp.arch == "hy_v4" and hp.indexer_top_k > 0:
        # llama_kv_cache_dsa over every layer, the indexer keys of the full indexer layers only (a full-
        # attention checkpoint, without indexer keys, has the plain cache below)
        def filter_lid(il):
            if il >= hp.n_layer:
                raise GGMLAbort(f"llama.cpp would abort creating the KV cache (llama-hparams.cpp is_indexer_full: "
                                f"GGML_ABORT il ({il}) out of bounds (n_layer: {hp.n_layer}))")
            return hp.is_indexer_full(il)
        return create_kv_cache_dsa(hp, cp, v_trans, kv_buft, None, filter_lid)
    if hp.arch == "dots3note":
        # llama_kv_cache_dsa_iswa: the DSA caches for the trunk's full layers (the indexer keys of its
        # full indexer layers), a window-sized cache for the sliding ones
        def filter_lid(il): return il < hp.n_layer and hp.is_indexer_full(il)
        return create_kv_cache_dsa_iswa(hp, cp, v_trans, kv_buft, trunk if hp.n_layer_nextn > 0 else None, filter_lid)
    # not where n_layer_nextn stands for a router layer the trunk attends (graniteswitch), nor for hy_v4
    # (its own case in create_memory: no layer filter)
    layer_filter = (trunk if hp.n_layer_nextn > 0 and hp.n_layer > 0 and hp.router_layer < 0 and hp.arch != "hy_v4"
                    else None)
    reuse = None
    if hp.arch in ("gemma3n", "gemma4"):
        def reuse(il: int) -> int:
            # the layers past n_layer_kv_from_start read the K/V of the last earlier layer of their kind
            if hp.n_layer_kv_from_start < 2:
                raise GGMLAbort(f"llama.cpp would abort creating the KV cache (llama-model.cpp GGML_ASSERT("
                                f"n_layer_kv_from_start >= 2)): {hp.n_layer_kv_from_start} layers keep their own K/V")
            if il >= hp.n_layer_kv_from_start:
                return hp.n_layer_kv_from_start - (2 if hp.is_swa(il) else 1)
            return -1
    if hp.swa_type != LLAMA_SWA_TYPE_NONE:
        if not hp.is_swa_any():
            raise GGMLAbort("llama.cpp would abort creating the KV cache (llama-model.cpp GGML_ASSERT(is_swa_any())): "
                            "sliding-window attention without a sliding-window layer")
        if hp.arch == "gemma4-assistant":
            return create_kv_cache_iswa(hp, cp, v_trans, kv_buft, layer_filter, reuse,
                                        mem_other=gemma4_assistant_mem_other(ctx_other), share=gemma4_assistant_share(hp, ctx_other))
        return create_kv_cache_iswa(hp, cp, v_trans, kv_buft, layer_filter, reuse)
    return create_kv_cache(hp, cp.type_k, cp.type_v, v_trans, cp.n_ctx_seq, cp.n_seq_max, cp.kv_unified, kv_buft,
                           layer_filter)


def gemma4_assistant_mem_other(ctx_other: Context) -> KVCacheISWA:
    """llama_get_memory(cparams.ctx_other), which llama_kv_cache_iswa casts to an iswa cache."""
    if not isinstance(ctx_other.kv, KVCacheISWA):
        raise GGMLAbort(f"llama.cpp would crash creating the Gemma 4 assistant's KV cache: it reads its target's "
                        f"cache as a sliding-window (iswa) cache, and the target ({ctx_other.hparams.arch}) keeps "
                        f"{'none' if ctx_other.kv is None else 'another kind'}")
    return ctx_other.kv


def gemma4_assistant_share(hp: HParams, ctx_other: Context):
    """create_memory's share for LLM_ARCH_GEMMA4_ASSISTANT: a sliding-window layer reads the K/V of the
    target's last but one layer, a full one its last layer (llama_model_n_layer(model_other) - 2 / - 1)."""
    n_layer_other = ctx_other.hparams.n_layer

    def share(il: int) -> int:
        return n_layer_other - 2 if hp.is_swa(il) else n_layer_other - 1
    return share


def build_graph(ctx: Context, ubatch: Ubatch) -> GraphContext:
    """llama_model::build_graph for the reserve ubatch, with graph_get_cb's pins."""
    sched, devices = ctx.sched, ctx.devices
    full_offload = devices.n_gpu_layers > ctx.hparams.n_layer_all

    def pin(t: ggml.Tensor, il: int) -> None:
        if ubatch.n_tokens < 32 or full_offload:
            backend = devices.layer_backend[il]
            if backend.supports_op(t):
                sched.set_tensor_backend(t, devices.backend_index(backend))

    def pin_cpu(t: ggml.Tensor) -> None:
        sched.set_tensor_backend(t, devices.backend_index(devices.cpu))

    g = GraphContext(ctx.model, ctx.cparams, ctx.kv, ubatch, pin=pin, pin_cpu=pin_cpu,
                     model_other=ctx.ctx_other.model if ctx.ctx_other is not None else None, loras=ctx.loras,
                     cvec=ctx.cvec)
    module = models.module(ctx.hparams.arch)
    (module.build_mtp if ctx.cparams.mtp else module.build)(g)
    g.build_pooling()
    g.build_dense_out()
    g.set_outputs()
    if ctx.loras:
        g.check_loras()
    ctx.graph_renames_persistent |= g.renamed_persistent
    return g


def graph_reserve(ctx: Context, n_tokens: int, n_seqs: int, n_outputs: int, split_only: bool = False,
                  sizes: Optional[list[int]] = None, optimize: bool = True) -> GraphContext:
    """llama_context::graph_reserve; with split_only and sizes, the no_alloc measurement into sizes.
    optimize=False: a split_only probe that reads only which backend each node got leaves out the
    backends' graph_optimize, which reorders nodes within their splits and changes no assignment."""
    if n_tokens % n_seqs != 0:
        n_tokens = (n_tokens + n_seqs - 1) // n_seqs * n_seqs
    ctx.sched.reset()
    g = build_graph(ctx, Ubatch(n_tokens, n_seqs, n_seqs, n_outputs))
    if split_only and sizes is not None:
        sizes[:] = ctx.sched.reserve_size(g.gf)
    elif split_only:
        ctx.sched.split_graph(g.gf, optimize=optimize)
    else:
        ctx.sched.reserve(g.gf)
    return g


# the architectures whose graphs add fused DeepSeek-V4 hyper-connection nodes: the probes of the
# others find none and leave the ops on, so their probe graphs need not be built
DSV4_HC_ARCHS = frozenset({"deepseek4", "glm5-next", "qwen4exp"})


@dataclass(eq=False)
class Probe:
    """A probe graph built with the fused ops as they were resolved, and how the scheduler split it."""
    g: GraphContext
    split: Splitting


def resolve_fused_ops(ctx: Context, keep_tg: bool) -> Optional[Probe]:
    """llama_context::resolve_fused_ops (llama-context.cpp:507): per fused op left "auto", a
    split-only probe graph of one token per sequence; the op stays on only if every fused node of
    its kind runs on its layer's device. Flash attention is probed for -fa auto; the three DeepSeek-V4
    hyper-connection ops are probed for every model (auto_fhc is always set); the fused gated delta
    net and lightning indexer are on without a probe.

    The last probe's ubatch is the tg graph's (n_seqs tokens, sequences and outputs): where its op
    stays on, nothing changed after it was built: with keep_tg it is returned, split as reserve
    splits (with graph_optimize), for sched_reserve to take back as its tg graph."""
    cp = ctx.cparams
    n_seqs = cp.n_seq_max
    probes = [(LLM_FUSED_OP_FLASH_ATTN, "flash_attn")] if cp.auto_fa else []
    if cp.auto_fhc and ctx.hparams.arch in DSV4_HC_ARCHS:
        probes += [(LLM_FUSED_OP_DSV4_HC_PRE, "fused_dsv4_hc_pre"), (LLM_FUSED_OP_DSV4_HC_COMB, "fused_dsv4_hc_comb"),
                   (LLM_FUSED_OP_DSV4_HC_POST, "fused_dsv4_hc_post")]
    probe = None
    for k, (op, flag) in enumerate(probes):
        # one backend runs every node and every layer: the probe cannot find a mismatch
        if not getattr(cp, flag) or len(ctx.devices.backends) == 1:
            continue
        last = keep_tg and k == len(probes) - 1
        g = graph_reserve(ctx, n_seqs, n_seqs, n_seqs, split_only=True, optimize=last)
        kept = all(ctx.sched.get_tensor_backend(node) is ctx.devices.layer_backend[il]
                   for kind, node, il in g.fused_nodes if kind == op)
        setattr(cp, flag, kept)
        probe = Probe(g, ctx.sched.splitting()) if kept and last else None
        if op == LLM_FUSED_OP_FLASH_ATTN and not kept and ggml.is_quantized(cp.type_v):
            raise BadParams("quantized V cache was requested, but this requires Flash Attention")
    cp.auto_fa = cp.auto_fhc = False
    return probe


@contextlib.contextmanager
def gc_paused():
    """Planning allocates tens of thousands of tensors without reference cycles; the cyclic
    collector's scans of them cost about a fifth of the planning time (bench/bench_reserve.py)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def sched_reserve(ctx: Context) -> dict[str, GraphStats]:
    with gc_paused():
        return _sched_reserve(ctx)


def _sched_reserve(ctx: Context) -> dict[str, GraphStats]:
    cp = ctx.cparams
    n_seqs = cp.n_seq_max
    n_tokens = min(cp.n_ctx, cp.n_ubatch)
    probe = resolve_fused_ops(ctx, keep_tg=True)
    pp = (n_tokens, n_seqs, min(n_tokens, cp.n_outputs_max))
    stats = {"pp": _reserve_stats(ctx, *pp)}
    pp_reserved = ctx.sched.reservation()
    # tg builds the last probe's graph again (same ubatch, same flags): its split is taken back,
    # unless building renamed a weight or cache tensor since (the rebuilt graph shows the new name)
    stats["tg"] = _reserve_stats(ctx, n_seqs, n_seqs, n_seqs, None if ctx.graph_renames_persistent else probe)
    stats["tg"].peaks = graph_peaks(ctx)
    # pp again, the final reservation (kimi-linear's with one sequence: llama-context.cpp:714). The
    # same ubatch as the first builds the same graph, which splits and lays out as the first did, so
    # that reservation is taken back and only the buffer check runs (tests/test_sched.py); unless
    # building renamed a weight or cache tensor, which the rebuilt graph then shows by its new name
    final = (n_tokens, 1, pp[2]) if ctx.hparams.arch in RESERVE_PP_ONE_SEQ_ARCHS else pp
    if final == pp and not ctx.graph_renames_persistent:
        ctx.sched.reserve_again(pp_reserved)
    else:
        graph_reserve(ctx, *final)
    stats["pp"].peaks = graph_peaks(ctx)
    return stats


def common_init_adapters(ctx: Context, params: Params) -> Optional[dict[str, GraphStats]]:
    """common_init_from_params after the context, in its order:
    - control vectors (--control-vector*): common_control_vector_load, then llama_set_adapter_cvec
      (the layer range defaults to 1..n_layer), which allocates one n_embd tensor per layer 1..n_layer-1
      (llama_adapter_cvec::init) and sets sched_need_reserve. Invalid files or a width other than
      n_embd: llama.cpp logs why and returns early (no LoRA applied, no warm-up), and llama-server
      runs without them: warnings, not a refusal;
    - where a context pooling by rank cannot rerank, it returns after those warnings;
    - common_set_adapter_lora (unless --lora-init-without-apply) -> llama_context::set_adapters_lora,
      which keeps the adapters of non-zero scale and, when that changes the set, sets sched_need_reserve.
    The next decode (llama-server's warm-up, else the first request) then runs sched_reserve again,
    which makes a new scheduler (ggml_backend_sched_new: the first one's compute buffers are freed)
    and reserves pp, tg and pp with the control vectors' adds and the adapters' matmuls. Returns those
    graphs' stats, None when nothing changed the graphs.

    The adapters are iterated as std::unordered_map<llama_adapter_lora *, float> holds them: with
    libstdc++ one or two adapters are in reverse order of insertion (two buckets, both pointers in
    the first); with three or more the order depends on the adapters' heap addresses (the plan keeps
    reverse order)."""
    hp = ctx.hparams
    # common_init_from_params returns after the rerank warnings (the others: the loader's, llama_context's)
    can_rerank = not any(w in (RERANK_NO_BOS, RERANK_NO_EOS_SEP_PROMPT) for w in ctx.warnings)
    if params.control_vectors:
        n_embd, _, errors = common_control_vector_load(params.control_vectors)
        if n_embd == -1:
            ctx.warnings += errors
            return None
        if n_embd != hp.n_embd:
            ctx.warnings.append("control vector n_embd does not match model")
            return None     # no tensors: the re-reserve at the first request builds the same graphs
        start = params.control_vector_layer_start if params.control_vector_layer_start > 0 else 1
        end = params.control_vector_layer_end if params.control_vector_layer_end > 0 else hp.n_layer
        ctx.cvec = llama_adapter_cvec_init(ctx.model, lambda il: cvec_buft(ctx, il), start, end)
    if can_rerank and not params.lora_init_without_apply:
        ctx.loras = [(a, scale) for a, scale in reversed(ctx.lora_adapters) if scale != 0.0]
    if ctx.cvec is None and not ctx.loras:   # adapters_lora_are_same: the empty set again
        return None
    check_warm_up(ctx)
    ctx.sched = new_sched(ctx.devices, ctx.cparams)
    ctx.graph_renames_persistent = False
    return sched_reserve(ctx)


def check_warm_up(ctx: Context) -> None:
    """common_init_from_params' warm-up, which runs the adapters' re-reserve: BOS and EOS (else token
    0) in one batch through llama_encode where the model has an encoder (t5, t5encoder), else
    llama_decode, which encodes in a context without memory. An encode of more tokens than n_ubatch
    aborts first (llama_context::encode GGML_ASSERT "encoder requires n_ubatch >= n_tokens"); so
    would a first request of as many tokens without the warm-up."""
    v = ctx.vocab
    n_tokens = sum(t != LLAMA_TOKEN_NULL for t in (v.special_bos_id, v.special_eos_id)) or 1
    if (ctx.hparams.arch in ("t5", "t5encoder") or ctx.kv is None) and n_tokens > ctx.cparams.n_ubatch:
        raise ggml.GGMLAbort(f"llama.cpp would abort at llama-server's warm-up with the adapters (llama-context.cpp "
                             f"GGML_ASSERT \"encoder requires n_ubatch >= n_tokens\"): it encodes {n_tokens} tokens "
                             f"in one ubatch of {ctx.cparams.n_ubatch} (-ub)")


def cvec_buft(ctx: Context, il: int):
    """llama_model::select_buft(il): the first buffer type of the layer's list whose device supports
    ggml_add of two n_embd f32 vectors with one of them in it: the layer's device's, else the CPU
    list's (the first device's host buffer type unless --no-host; CPU_REPACK never adds; CPU)."""
    devices, n_embd = ctx.devices, ctx.hparams.n_embd

    def supports(backend, buft) -> bool:
        layer_dir = ggml.new_tensor(ggml.T.F32, n_embd)
        layer_dir.buffer = ggml.Buffer(buft, "weights")
        return backend.supports_op(ggml.add(ggml.new_tensor(ggml.T.F32, n_embd), layer_dir))

    backend = devices.layer_device(il, ctx.hparams.n_layer_all)
    if backend is not devices.cpu and supports(backend, backend.buft):
        return backend.buft
    host = devices.host_backend
    if host is not None and supports(host, host.host_buft):
        return host.host_buft
    return devices.cpu.buft


def cvec_section(ctx: Context, params: Params, before: dict[str, int]) -> dict:
    """The plan's "control_vector" section: the files, the layer range applied, the tensors' buffers
    per buffer type (none where llama.cpp did not apply them), and the compute buffers of the
    context's first reservation."""
    c = ctx.cvec
    return {"files": [{"path": path, "scale": scale} for path, scale in params.control_vectors],
            "applied": c is not None, "layer_range": [c.layer_start, c.layer_end] if c else None,
            "buffers": c.buffers() if c else {}, "compute_buffers_before": before}


def lora_section(ctx: Context, before: dict[str, int]) -> dict:
    """The plan's "lora" section: each adapter's buffers per buffer type (as llama_adapter_lora_init
    logs "LoRA buffer size"), their sum, whether they were applied, and the compute buffers of the
    context's first reservation (without the adapters), which the re-reserve replaced."""
    total: dict[str, int] = {}
    for a, _ in ctx.lora_adapters:
        for name, size in a.buffers().items():
            total[name] = total.get(name, 0) + size
    return {"adapters": [{"path": a.path, "scale": scale, "alpha": a.alpha, "n_tensors": 2 * len(a.ab_map),
                          "buffers": a.buffers()} for a, scale in ctx.lora_adapters],
            "buffers": total, "applied": bool(ctx.loras), "compute_buffers_before": before}


def sched_reserve_no_alloc(ctx: Context) -> list[int]:
    """sched_reserve in a no_alloc context (llama-context.cpp:672-676): the per-backend compute sizes
    come from the first pp graph alone (the tg and second pp graphs are only split)."""
    cp = ctx.cparams
    n_tokens = min(cp.n_ctx, cp.n_ubatch)
    with gc_paused():
        resolve_fused_ops(ctx, keep_tg=False)   # no tg graph follows
        sizes: list[int] = []
        graph_reserve(ctx, n_tokens, cp.n_seq_max, min(n_tokens, cp.n_outputs_max), split_only=True, sizes=sizes)
    return sizes


def _reserve_stats(ctx: Context, n_tokens: int, n_seqs: int, n_outputs: int, built: Optional[Probe] = None) -> GraphStats:
    """graph_reserve, and what llama.cpp reports of it (peaks are taken by the caller); `built`:
    this ubatch's graph as a probe built and split it."""
    if built is None:
        g = graph_reserve(ctx, n_tokens, n_seqs, n_outputs)
    else:
        g = built.g
        ctx.sched.reserve_split(built.split)
    g.check_decode_inputs()
    return GraphStats(g.ubatch.n_tokens, n_seqs, n_outputs, len(g.gf.nodes), ctx.sched.n_splits,
                      _buffer_sizes(ctx, _graph_alone_sizes(ctx)), split_list(ctx, g.gf.nodes), {})


def graph_peaks(ctx: Context) -> dict[str, dict]:
    """Per buffer type (as _buffer_sizes counts them), the last reserved graph's allocation peak:
    the node being allocated when the buffer last grew (index in the scheduler's graph; -1 while
    leafs and inputs are allocated), the size then, and the tensors holding memory then."""
    sched, galloc = ctx.sched, ctx.sched.galloc
    out = {}
    for i, size in enumerate(_graph_alone_sizes(ctx)):
        if size <= 1:
            continue
        peak = galloc.peak(i)
        node = sched.graph.nodes[peak.node] if peak.node >= 0 else None
        tensors = sorted(({"name": t.name, "op": t.op, "offset": galloc.tensor_alloc(t).offset, "size": t.nbytes}
                          for t in peak.tensors), key=lambda t: t["offset"])
        out[sched.get_buffer_type(i).name] = {"node": peak.node, "node_name": node.name if node else None,
                                              "node_op": node.op if node else None, "size": peak.size,
                                              "tensors": tensors}
    return out


def _graph_alone_sizes(ctx: Context) -> list[int]:
    """What the last reserved graph needs per backend (its allocator's chunks), before buffers
    keep the running maximum; 0 for a backend whose buffer type an earlier backend already counts."""
    tallocs = ctx.sched.galloc.buf_tallocs
    return [0 if any(tallocs[j] is t for j in range(i)) else t.size for i, t in enumerate(tallocs)]


def _buffer_sizes(ctx: Context, per_backend: list[int]) -> dict[str, int]:
    """Per buffer type name, the sizes llama.cpp would log (only those > 1 byte)."""
    out: dict[str, int] = {}
    for i, size in enumerate(per_backend):
        if size > 1:
            out[ctx.sched.get_buffer_type(i).name] = size
    return out


def reserve(model_path: str, params: Params, tensors: bool = False, graph: str = "pp",
            margins: Optional[list[int]] = None, mmproj: Optional["MmprojParams"] = None,
            header: Optional[GGUFHeader] = None, draft: Optional["ExtraModel"] = None,
            server: Optional["ServerLife"] = None) -> dict:
    """Plan everything llama.cpp reserves for this model and these parameters, as a JSON-able dict.
    margins: the free memory to keep per device (-fitt), for the verdict on devices of known memory.
    mmproj: a multimodal projector loaded beside the model, as llama-server loads it ("projector":
    its encoders' weights and warm-up compute buffers per buffer type, and per device).
    header: the model's header when the caller already read it.
    draft: a draft model llama-server loads after the model, with its context ("draft", see
    reserve_draft), or the MTP context over the model's own NextN block (shares_model).
    server: the context is llama-server's: what it allocates after startup ("after_startup",
    planner/server_life.py)."""
    projector = None
    if mmproj is not None:
        from .mtmd.mtmd import mtmd_get_memory_usage
        from .server import check_mmproj_for_model
        projector = mtmd_get_memory_usage(params, mmproj)
        check_mmproj_for_model(projector, model_path, params)
    ctx = create_context(model_path, params, header)
    stats = sched_reserve(ctx)
    lora = cvec = None
    if ctx.lora_adapters or params.control_vectors:
        before = compute_buffers(ctx)
        stats = common_init_adapters(ctx, params) or stats
        lora = lora_section(ctx, before) if ctx.lora_adapters else None
        cvec = cvec_section(ctx, params, before) if params.control_vectors else None
    result = {"schema": SCHEMA, "source": "plan", "llama_cpp": {"commit": LLAMA_CPP_COMMIT},
              **context_sections(ctx, stats),
              "splits": {name: s.split_list for name, s in stats.items()},
              "peaks": {name: s.peaks for name, s in stats.items()}}
    if ctx.warnings:
        result["warnings"] = ctx.warnings
    if lora is not None:
        result["lora"] = lora
    if cvec is not None:
        result["control_vector"] = cvec
    if projector is not None:
        result["projector"] = projector.summary()
    ctx_dft = None
    if draft is not None:
        ctx_dft, stats_dft = reserve_draft(ctx, draft)
        result["draft"] = context_sections(ctx_dft, stats_dft)
        if draft.shares_model:     # the MTP context runs the model's own weights (llama_init_from_model(model_tgt))
            result["draft"]["model_buffers"] = {}
            result["draft"]["shares_model"] = True
    if server is not None:
        from .server_life import after_startup
        result["after_startup"] = after_startup(ctx, ctx_dft, server, params)
    if ctx.devices.model_devices() and all(b.memory is not None for b in ctx.devices.model_devices()):
        result["device_memory"] = device_memory_verdict(ctx, margins, projector, ctx_dft,
                                                        draft is not None and draft.shares_model)
    if tensors:
        if graph == "tg":
            n_seqs = ctx.cparams.n_seq_max
            graph_reserve(ctx, n_seqs, n_seqs, n_seqs)
        result["tensors"] = tensor_listing(ctx)
    return result


def reserve_draft(ctx_tgt: Context, draft: "ExtraModel") -> tuple[Context, dict[str, GraphStats]]:
    """common_speculative_init_result (common/speculative.cpp): after the target's context, the draft
    model is loaded with its own model parameters and its context created at the target's context
    size (llama_n_ctx(ctx_tgt)) with ctx_other = ctx_tgt, which a Gemma 4 assistant reads (the
    target's token_embd and K/V cache: its cache holds no tensor of its own), a DFlash drafter or an
    EAGLE-3 head without its own embedding and head reads (the target's token_embd and output), and
    other drafts ignore. The draft's context, reserved."""
    params = dataclasses.replace(draft.params, n_ctx=ctx_tgt.cparams.n_ctx)
    ctx = create_context(draft.path, params, ctx_other=ctx_tgt)
    return ctx, sched_reserve(ctx)


def compute_buffers(ctx: Context) -> dict[str, int]:
    """A reserved context's compute buffers per buffer type."""
    return _buffer_sizes(ctx, [ctx.sched.get_vbuffer_size(i) for i in range(len(ctx.devices.backends))])


def context_sections(ctx: Context, stats: dict[str, GraphStats]) -> dict:
    """A reserved context's model, effective parameters, graphs and buffers per buffer type."""
    return {"model": model_summary(ctx), "params": effective_params(ctx),
            "compute_buffers": compute_buffers(ctx),
            "graphs": {name: {k: v for k, v in vars(s).items() if k not in ("split_list", "peaks")}
                       for name, s in stats.items()},
            "kv_buffers": memory_breakdown(ctx),
            "output_buffers": {ctx.devices.output_buft.name: ctx.devices.output_buft.buffer_size(ctx.output_buffer_size)},
            "model_buffers": _sum_by_buft(ctx.model.buffers)}


def memory_breakdown(ctx: Context) -> dict[str, int]:
    """The memory module's buffers per buffer type (none without memory)."""
    return ctx.kv.memory_breakdown() if ctx.kv is not None else {}


def device_memory_verdict(ctx: Context, margins: Optional[list[int]], projector: Optional["MmprojPlan"] = None,
                          ctx_dft: Optional[Context] = None, dft_shares_model: bool = False) -> list[dict]:
    """Per device of known memory, what this plan uses there (model, context, compute: what --fit
    counts; a projector's weights and warm-up buffers on that device, its gen-audio weights
    included; a draft model's weights, context and compute buffers (an MTP context's without the
    weights it shares with the model), and the LoRA adapters' and control vectors' buffers, which
    llama-server allocates after fitting) against its free memory and the margin --fit keeps (-fitt,
    default 1024 MiB)."""
    from .fit import device_memory, fit_targets

    def usage_of(c: Context) -> dict[str, int]:
        sizes = [c.sched.get_vbuffer_size(i) for i in range(len(c.devices.backends))]
        dmds = device_memory(c, sizes, 0)    # the host's row is not part of the verdict
        return {b.device_name: d.used() - (d.model if dft_shares_model else 0)
                for b, d in zip(c.devices.model_devices(), dmds)}

    sizes = [ctx.sched.get_vbuffer_size(i) for i in range(len(ctx.devices.backends))]
    dmds = device_memory(ctx, sizes, 0)
    targets = fit_targets(margins)
    usage = projector.allocated() if projector is not None else {}
    draft = usage_of(ctx_dft) if ctx_dft is not None else {}
    adapters: dict[str, int] = {}     # the LoRA adapters' and control vectors' buffers on the devices
    for buf in [b for a, _ in ctx.lora_adapters for b in a.bufs] + (ctx.cvec.bufs if ctx.cvec else []):
        if not buf.buft.is_host:
            adapters[buf.buft.device] = adapters.get(buf.buft.device, 0) + buf.size
    out = []
    for i, b in enumerate(ctx.devices.model_devices()):
        d = dmds[i]
        used = d.used() + usage.get(b.device_name, 0) + draft.get(b.device_name, 0) + adapters.get(b.device_name, 0)
        out.append({"device": b.device_name, "free": d.free, "total": d.total, "model": d.model,
                    "context": d.context, "compute": d.compute, "projector": usage.get(b.device_name, 0),
                    "draft": draft.get(b.device_name, 0), "adapters": adapters.get(b.device_name, 0),
                    "projected_free": d.free - used, "target": targets[i], "fits": d.free - used >= targets[i]})
    return out


def _sum_by_buft(buffers) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in buffers:
        out[b.buft.name] = out.get(b.buft.name, 0) + b.size
    return out


def model_summary(ctx: Context) -> dict:
    """What llama_model_n_layer, _n_embd, ... return: n_ctx_train, a uint32_t (--override-kv can set
    any), as the int32_t llama_model_n_ctx_train returns."""
    hp = ctx.hparams
    return {"path": ctx.path, "arch": hp.arch, "n_layer": hp.n_layer, "n_embd": hp.n_embd,
            "n_head": hp.n_head(), "n_head_kv": hp.n_head_kv(), "n_vocab": hp.n_vocab,
            "n_ctx_train": hp.n_ctx_train - (1 << 32) if hp.n_ctx_train >= 1 << 31 else hp.n_ctx_train}


def effective_params(ctx: Context) -> dict:
    cp = ctx.cparams
    return {"n_ctx": cp.n_ctx, "n_ctx_seq": cp.n_ctx_seq, "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch,
            "n_seq_max": cp.n_seq_max, "n_outputs_max": cp.n_outputs_max, "kv_unified": cp.kv_unified,
            "flash_attn": cp.flash_attn, "type_k": ggml.type_name(cp.type_k), "type_v": ggml.type_name(cp.type_v),
            "n_gpu_layers": ctx.devices.n_gpu_layers, "sched_copies": ctx.sched.n_copies,
            "devices": [b.device_name for b in ctx.devices.model_devices()]}


def tensor_listing(ctx: Context) -> list[dict]:
    """Every tensor of the scheduler's copy of the last reserved graph (nodes, then leafs), with
    its backend, buffer and offset; `at_peak` marks the tensors alive at their buffer's peak;
    `compute`: the graph allocator placed it (in a compute buffer); `srcs`, `view_src` and
    `same_as` (a tensor listed again, e.g. a split input that is a node and a leaf) are positions
    in this list, of a tensor's first row; `flags`: "input", "output"; `lifetime`: the first and
    last node at which a compute tensor holds memory of its own, as gallocr recorded it."""
    sched, galloc = ctx.sched, ctx.sched.galloc
    at_peak = set()
    for i in range(len(ctx.devices.backends)):
        peak = galloc.peak(i)
        if peak is not None:
            at_peak.update(id(t) for t in peak.tensors)
    graph = [("node", sched.graph.nodes, sched.node_backend_ids), ("leaf", sched.graph.leafs, sched.leaf_backend_ids)]
    position: dict[int, int] = {}
    for p, t in enumerate(t for _, tensors, _ in graph for t in tensors):
        position.setdefault(id(t), p)
    rows = []
    for kind, tensors, backend_ids in graph:
        for i, (t, backend_id) in enumerate(zip(tensors, backend_ids)):
            first_row = position[id(t)]
            buffer, offset = tensor_location(ctx, t)
            rows.append({"index": i, "kind": kind, "name": t.name, "op": t.op, "ne": list(t.ne),
                         "type": ggml.type_name(t.type),
                         "backend": ctx.devices.backends[backend_id].name if backend_id >= 0 else None,
                         "buffer": buffer, "offset": offset, "size": t.nbytes,
                         "view_of": t.view_src.name if t.view_src is not None else None,
                         "at_peak": id(t) in at_peak, "compute": galloc.tensor_alloc(t) is not None,
                         "srcs": [position[id(s)] for s in t.src if s is not None],
                         "view_src": position.get(id(t.view_src)),
                         "same_as": first_row if first_row != len(rows) else None,
                         "lifetime": galloc.lifetime(t),
                         "flags": [f for f, bit in (("input", ggml.FLAG_INPUT), ("output", ggml.FLAG_OUTPUT))
                                   if t.flags & bit]})
    return rows


def tensor_location(ctx: Context, t: ggml.Tensor) -> tuple[Optional[str], Optional[int]]:
    """(buffer type name, offset): from gallocr for compute tensors, else the tensor's own buffer."""
    alloc = ctx.sched.galloc.tensor_alloc(t)
    if alloc is not None:
        return ctx.sched.get_buffer_type(alloc.buffer_id).name, alloc.offset
    base = t.view_src if t.view_src is not None else t
    if base.buffer is None:
        return None, None
    return base.buffer.buft.name, base.offset + (t.view_offs if t.view_src is not None else 0)
