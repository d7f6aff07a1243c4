"""llm_graph_context: the shared graph builders of src/llama-graph.cpp used by the supported archs.

Each builder creates tensors in the same order, with the same names (cb: "%s-%d"), srcs and
build_forward_expand calls as llama.cpp, because node order decides the allocator's offsets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Union

from . import ggml
from .cparams import CParams
from .ggml import Cgraph, GGMLAbort, Tensor
from .hparams import (LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_LAST, LLAMA_POOLING_TYPE_MEAN, LLAMA_POOLING_TYPE_NONE,
                      LLAMA_POOLING_TYPE_RANK, LLAMA_SWA_TYPE_NONE)
from .kv_cache import KVCache
from .kv_cache_dsa import KVCacheDSA, KVCacheDSAISWA
from .kv_cache_dsv4 import DSV4_CSA_RATIO, DSV4_HCA_RATIO, CompPlan, KVCacheDSV4, reserve_comp_plan
from .kv_cache_iswa import KVCacheISWA
from .memory_recurrent import MemoryHybrid, MemoryRecurrent
from .adapter import ControlVector, LoraAdapter, LoraWeight
from .model import Model



def set_name(t: Tensor, name: str) -> None:
    """ggml_set_name / ggml_format_name"""
    t.name = ggml._fmt(name)


@dataclass(frozen=True)
class Ubatch:
    """The parts of llama_ubatch that shape a graph (llama_batch_allocr::ubatch_reserve)."""
    n_tokens: int
    n_seqs: int
    n_seqs_unq: int
    n_outputs: int


@dataclass
class AttnInput:
    """llm_graph_input_attn_kv: one cache's indices, mask and rotations"""
    kv: KVCache
    k_idxs: Tensor
    v_idxs: Tensor
    kq_mask: Tensor
    k_rot: Optional[Tensor]
    v_rot: Optional[Tensor]


@dataclass
class AttnInputNoCache:
    """llm_graph_input_attn_no_cache: no memory, the keys are the ubatch's own tokens"""
    kq_mask: Tensor
    kq_mask_swa: Optional[Tensor]


@dataclass
class AttnInputCross:
    """llm_graph_input_attn_cross: the decoder's mask over the encoder output."""
    kq_mask: Tensor


@dataclass
class AttnInputMSA(AttnInput):
    """llm_graph_input_attn_kv_msa: the base cache's inputs, and the indexer cache's K indices
    when MSA runs"""
    k_idxs_idx: Optional[Tensor] = None


@dataclass
class AttnInputISWA:
    """llm_graph_input_attn_kv_iswa"""
    base: AttnInput
    swa: AttnInput


@dataclass
class AttnInputK:
    """llm_graph_input_attn_k: a K-only cache (multi-head latent attention)"""
    kv: KVCache
    k_idxs: Tensor
    kq_mask: Tensor


@dataclass
class AttnInputKDSA:
    """llm_graph_input_attn_k_dsa: the MLA cache's K indices and mask, the lightning indexer
    cache's K indices, mask and key rotation"""
    kv: KVCacheDSA
    k_idxs_mla: Tensor
    kq_mask_mla: Tensor
    k_idxs_lid: Tensor
    kq_mask_lid: Tensor
    k_rot_lid: Optional[Tensor]


@dataclass
class AttnInputKDSAISWA:
    """llm_graph_input_attn_k_dsa_iswa: the DSA caches' inputs, then the SWA cache's K indices and mask"""
    dsa: AttnInputKDSA
    swa: AttnInputK


@dataclass
class RSInput:
    """llm_graph_input_rs: which cells' states each sequence reads (s_copy, split into the
    sequences' rows and the extra ones)"""
    mem: MemoryRecurrent
    s_copy: Tensor
    s_copy_main: Tensor
    s_copy_extra: Tensor


@dataclass
class MemHybridInput:
    """llm_graph_input_mem_hybrid (llm_graph_input_mem_hybrid_k: attn is K-only;
    llm_graph_input_mem_hybrid_iswa: attn is the base and SWA caches' inputs)"""
    attn: Union[AttnInput, AttnInputK, AttnInputISWA]
    rs: RSInput


@dataclass
class DSV4CompInput:
    """llm_graph_input_dsv4::comp_input: one compressor's index inputs (None where the reserve plan
    sizes them 0), its compressed rows' mask and key rotation"""
    state_pos: Optional[Tensor]
    state_persist_src_idxs: Optional[Tensor]
    state_persist_dst_idxs: Optional[Tensor]
    state_restore_src_idxs: Optional[Tensor]
    state_restore_dst_idxs: Optional[Tensor]
    state_snapshot_src_idxs: Optional[Tensor]
    state_snapshot_dst_idxs: Optional[Tensor]
    state_read_idxs: Optional[Tensor]
    state_write_idxs: Optional[Tensor]
    state_write_pos: Optional[Tensor]
    kq_mask: Optional[Tensor]
    k_rot: Optional[Tensor] = None


@dataclass
class DSV4Input:
    """llm_graph_input_dsv4: the raw window cache's inputs (llm_graph_input_dsv4_raw), then the
    CSA, HCA and lightning indexer compressors'"""
    kv: KVCacheDSV4
    k_idxs: Tensor
    kq_mask: Tensor
    k_rot: Optional[Tensor]
    csa: DSV4CompInput
    hca: DSV4CompInput
    lid: DSV4CompInput


# llm_norm_type, llm_ffn_op_type, llm_ffn_gate_type
LLM_NORM, LLM_NORM_RMS, LLM_NORM_GROUP = "NORM", "RMS_NORM", "GROUP_NORM"
LLM_FFN_SILU, LLM_FFN_GELU, LLM_FFN_RELU, LLM_FFN_RELU_SQR = "SILU", "GELU", "RELU", "RELU_SQR"
LLM_FFN_SWIGLU, LLM_FFN_GEGLU, LLM_FFN_REGLU = "SWIGLU", "GEGLU", "REGLU"     # gate and up fused in ffn_up's rows
LLM_FFN_SWIGLU_OAI_MOE = "SWIGLU_OAI_MOE"
LLM_FFN_SITU = "SITU"
# llama_expert_gating_func_type
LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID = 1, 2
LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS = 3, 4
LLM_FFN_SEQ, LLM_FFN_PAR = "SEQ", "PAR"
# llm_fused_op: the fused nodes resolve_fused_ops probes
LLM_FUSED_OP_FLASH_ATTN = "FLASH_ATTN"
LLM_FUSED_OP_DSV4_HC_PRE, LLM_FUSED_OP_DSV4_HC_COMB = "DSV4_HC_PRE", "DSV4_HC_COMB"
LLM_FUSED_OP_DSV4_HC_POST = "DSV4_HC_POST"
SWIGLU_LIMIT_EPS = 1e-6   # a swiglu_clamp limit at or below this is no limit (llama-graph.cpp)


@dataclass
class GraphContext:
    model: Model
    cparams: CParams
    kv: Union[KVCache, KVCacheISWA, KVCacheDSA, KVCacheDSAISWA, KVCacheDSV4, MemoryRecurrent, MemoryHybrid, None]
    ubatch: Ubatch
    # graph_get_cb's backend pinning: pin(tensor, il) for "norm" and "l_last" (llama-context.cpp:2635)
    pin: Callable[[Tensor, int], None]
    # build_attn_mha without offload_kqv: ggml_backend_sched_set_tensor_backend(cur, backend_cpu)
    pin_cpu: Callable[[Tensor], None]
    gf: Cgraph = field(default_factory=Cgraph)
    t_logits: Optional[Tensor] = None
    t_embd: Optional[Tensor] = None
    t_embd_pooled: Optional[Tensor] = None
    t_inp_embd: Optional[Tensor] = None  # res->t_inp_embd: the input rows (n_embd of each when n_embd_inp is wider)
    t_h_nextn: Optional[Tensor] = None   # the last hidden state, kept for multi-token prediction
    t_layer_inp: dict[int, Tensor] = field(default_factory=dict)   # res->t_layer_inp: each layer's input
    t_inp_tokens: Optional[Tensor] = None  # res->t_inp_tokens
    model_other: Optional[Model] = None  # llama_get_model(cparams.ctx_other): the target a draft head reads
    fused_nodes: list[tuple[str, Tensor, int]] = field(default_factory=list)   # res->add_fused_node: (op, node, il)
    renamed_persistent: bool = False     # cb() named a weight or a cache tensor: later graphs see the name
    # (input, its set_input) for the inputs every decode writes without asking whether they have a
    # buffer, in the order llm_graph_result::set_inputs writes them (check_decode_inputs)
    decode_inputs: list[tuple[Tensor, str]] = field(default_factory=list)
    # llama_context::loras (llama_adapter_loras): the applied LoRA adapters and their scales
    loras: list[tuple[LoraAdapter, float]] = field(default_factory=list)
    # the adapted weights whose matmuls were built as llama.cpp builds them: with the adapters' branch,
    # or plain where llama.cpp multiplies without build_lora_mm (build_output's lora=False)
    lora_handled: set[str] = field(default_factory=set)
    cvec: Optional[ControlVector] = None   # llama_context::cvec once control vectors are applied

    @property
    def hparams(self):
        return self.model.hparams

    def written_at_decode(self, t: Tensor, set_input: str) -> Tensor:
        self.decode_inputs.append((t, set_input))
        return t

    def check_decode_inputs(self) -> None:
        """llm_graph_result::set_inputs at every decode: an input its set_input writes without a
        buffer check (ggml_backend_tensor_set, ggml_backend_buffer_is_host) must have a buffer, and
        only the graph's tensors get one; reserving sets no input, so llama.cpp creates the context
        and aborts at the first decode (ggml-backend.cpp GGML_ASSERT(buffer))."""
        in_graph = set(self.gf.leafs)
        for t, set_input in self.decode_inputs:
            if t not in in_graph:
                raise ggml.GGMLAbort(f"llama.cpp would abort at the first decode (ggml-backend.cpp GGML_ASSERT(buffer) "
                                     f"in {set_input}): its input {t.name or 'tensor'} is in no graph, so no buffer "
                                     f"holds it")

    def build_cvec(self, cur: Tensor, il: int) -> Tensor:
        """build_cvec: llama_adapter_cvec::apply_to adds the layer's control vector, where it has one."""
        layer_dir = self.cvec.tensor_for(il) if self.cvec is not None else None
        return ggml.add(cur, layer_dir) if layer_dir is not None else cur

    def check_loras(self) -> None:
        """Every adapted weight the graph multiplies was multiplied as llama.cpp multiplies it:
        through build_lora_mm (the adapters' branch), or plain where the builder says llama.cpp does
        (lora_handled). A weight that is the first source of a plain MUL_MAT/MUL_MAT_ID here, which
        llama.cpp may or may not run through build_lora_mm, is not planned with adapters: refused.
        A weight read otherwise (a convolution, a norm, get_rows, a view or reshape first) is read so
        in llama.cpp too, whose build_lora_mm(_id) finds the adapter by the weight's own name: its
        adapter tensors are loaded and never read."""
        adapted = {name for adapter, _ in self.loras for name in adapter.ab_map}
        multiplied = {t.src[0].name for t in self.gf.nodes
                      if t.op in ("MUL_MAT", "MUL_MAT_ID") and t.src[0].buffer is not None}
        missing = sorted((adapted & multiplied) - self.lora_handled)
        if missing:
            raise NotImplementedError(f"a LoRA adapter of {missing[0]} on a {self.hparams.arch} model: its graph "
                                      f"multiplies that weight without build_lora_mm here, which is not verified "
                                      f"against llama.cpp with adapters")

    def cb(self, cur: Tensor, name: str, il: int) -> None:
        if cur.buffer is not None:   # plamo2 names its conv and SSM state tensors
            self.renamed_persistent = True
        set_name(cur, f"{name}-{il}" if il >= 0 else name)
        if il != -1 and name in ("norm", "l_last"):
            self.pin(cur, il)

    # --- inputs ----------------------------------------------------------------------------------

    def build_inp_embd(self, tok_embd: Tensor) -> Tensor:
        """build_inp_embd: token rows or the embd input, n_embd_inp wide (deepstack models carry
        their extra layers' inputs there; a token row is padded to it), viewed back to n_embd."""
        hp = self.hparams
        n_tokens, n_embd_inp, n_embd = self.ubatch.n_tokens, hp.n_embd_inp(), hp.n_embd
        tokens = ggml.new_tensor(ggml.T.I32, n_tokens)
        self.cb(tokens, "inp_tokens", -1)
        tokens.set_input()
        self.t_inp_tokens = tokens
        embd = ggml.new_tensor(ggml.T.F32, n_embd_inp, n_tokens)
        self.cb(embd, "inp_embd", -1)
        embd.set_input()
        rows = ggml.get_rows(tok_embd, tokens)
        for lw, scale in self.lora_weights(tok_embd):   # lora for the token embeddings
            # non-transposed lora_b
            delta = ggml.scale(ggml.mul_mat(lw.b, ggml.get_rows(lw.a, tokens)), scale)
            rows = ggml.add(rows, delta)
        if n_embd_inp != n_embd:
            rows = ggml.pad(rows, n_embd_inp - n_embd, 0, 0, 0)
        cur = ggml.build_forward_select(self.gf, [rows, embd], 0)   # ubatch.token != nullptr
        if n_embd_inp != n_embd:
            cur = ggml.view(cur, (n_embd, n_tokens), (cur.nb[1],), 0)
        self.t_inp_embd = cur
        if hp.f_embedding_scale != 0.0:   # token input: scaled even with deepstack rows (Granite Vision)
            if not cur.is_contiguous():
                cur = ggml.cont(cur)
            cur = ggml.scale(cur, hp.f_embedding_scale)
        self.cb(cur, "embd", -1)
        ggml.build_forward_expand(self.gf, cur)
        return cur

    def build_inp_pos(self) -> Tensor:
        cur = ggml.new_tensor(ggml.T.I32, self.ubatch.n_tokens * self.hparams.n_pos_per_embd())
        cur.set_input()
        self.cb(cur, "inp_pos", -1)
        return self.written_at_decode(cur, "llm_graph_input_pos::set_input")

    def build_inp_attn_scale(self) -> Tensor:
        """The per-token attention temperature, 1x1xN for broadcasting."""
        cur = ggml.new_tensor(ggml.T.F32, 1, 1, self.ubatch.n_tokens)
        cur.set_input()
        self.cb(cur, "inp_attn_scale", -1)
        return self.written_at_decode(cur, "llm_graph_input_attn_temp::set_input")

    def build_inp_out_ids(self) -> Tensor:
        cur = ggml.new_tensor(ggml.T.I32, self.ubatch.n_outputs)
        cur.set_input()
        set_name(cur, "out_ids")
        return self.written_at_decode(cur, "llm_graph_input_out_ids::set_input")

    def build_inp_mean(self) -> Tensor:
        cur = ggml.new_tensor(ggml.T.F32, self.ubatch.n_tokens, self.ubatch.n_seqs_unq)
        cur.set_input()
        set_name(cur, "mean")
        return cur

    def build_inp_cls(self) -> Tensor:
        cur = ggml.new_tensor(ggml.T.I32, self.ubatch.n_seqs_unq)
        cur.set_input()
        set_name(cur, "cls")
        return cur

    def build_attn_inp_no_cache(self) -> AttnInputNoCache:
        """build_attn_inp_no_cache: an n_tokens x n_tokens mask (f16 for flash attention), and one
        for the sliding-window layers."""
        type_mask = ggml.T.F16 if self.cparams.flash_attn else ggml.T.F32
        kq_mask = ggml.new_tensor(type_mask, self.ubatch.n_tokens, self.ubatch.n_tokens, 1, 1)
        kq_mask.set_input()
        self.cb(kq_mask, "self_kq_mask", -1)
        self.written_at_decode(kq_mask, "llm_graph_input_attn_no_cache::set_input")
        kq_mask_swa = None
        if self.hparams.swa_type != LLAMA_SWA_TYPE_NONE:
            kq_mask_swa = ggml.new_tensor(type_mask, self.ubatch.n_tokens, self.ubatch.n_tokens, 1, 1)
            kq_mask_swa.set_input()
            self.written_at_decode(kq_mask_swa, "llm_graph_input_attn_no_cache::set_input")
        return AttnInputNoCache(kq_mask, kq_mask_swa)

    def build_attn_inp_kv(self) -> AttnInput:
        """build_attn_inp_kv_impl"""
        return self._attn_inp(self.kv)

    def build_attn_inp_kv_iswa(self) -> AttnInputISWA:
        """build_attn_inp_kv_iswa: the base cache's inputs, then the SWA cache's, then the rotations."""
        base = self._attn_inp(self.kv.base, rotations=False)
        swa = self._attn_inp(self.kv.swa, rotations=False)
        base.k_rot, base.v_rot = self.kv.base.build_input_k_rot(), self.kv.base.build_input_v_rot()
        swa.k_rot, swa.v_rot = self.kv.swa.build_input_k_rot(), self.kv.swa.build_input_v_rot()
        return AttnInputISWA(base, swa)

    def build_attn_inp_kv_msa(self, msa_enabled: bool) -> AttnInputMSA:
        """build_attn_inp_kv_msa: the base cache's inputs and rotations, then, when MSA runs, the
        indexer cache's K indices."""
        base = self._attn_inp(self.kv.base)
        inp = AttnInputMSA(base.kv, base.k_idxs, base.v_idxs, base.kq_mask, base.k_rot, base.v_rot)
        if msa_enabled:
            inp.k_idxs_idx = self.kv.idx.build_input_k_idxs(self.ubatch.n_tokens)
        return inp

    def build_attn_inp_k(self) -> AttnInputK:
        """build_attn_inp_k_impl: K indices and the mask; no V indices, no rotations."""
        return AttnInputK(self.kv, self.kv.build_input_k_idxs(self.ubatch.n_tokens), self.build_attn_inp_kq_mask(self.kv))

    def build_attn_inp_k_dsa(self) -> AttnInputKDSA:
        return self._attn_inp_k_dsa(self.kv)

    def build_attn_inp_k_dsa_iswa(self) -> AttnInputKDSAISWA:
        """build_attn_inp_k_dsa_iswa: the DSA caches' inputs, then the SWA cache's K indices and
        mask (build_attn_inp_k_impl's, without its SWA refusal)."""
        dsa = self._attn_inp_k_dsa(self.kv.dsa)
        swa = self.kv.swa
        return AttnInputKDSAISWA(dsa, AttnInputK(swa, swa.build_input_k_idxs(self.ubatch.n_tokens),
                                                 self.build_attn_inp_kq_mask(swa)))

    def _attn_inp_k_dsa(self, kv: KVCacheDSA) -> AttnInputKDSA:
        """build_attn_inp_k_dsa_impl: the MLA cache's inputs, then the indexer's; the fused
        lightning indexer (cparams.fused_lid, always on) wants an f16 indexer mask."""
        n_tokens, mla, lid = self.ubatch.n_tokens, kv.mla, kv.lid
        k_idxs_mla = mla.build_input_k_idxs(n_tokens)
        kq_mask_mla = self.build_attn_inp_kq_mask(mla)
        k_idxs_lid = lid.build_input_k_idxs(n_tokens)
        kq_mask_lid = self.build_attn_inp_kq_mask(lid, flash_attn=True)
        return AttnInputKDSA(kv, k_idxs_mla, kq_mask_mla, k_idxs_lid, kq_mask_lid, lid.build_input_k_rot())

    def build_inp_dsv4(self) -> DSV4Input:
        """build_inp_dsv4: the raw cache's K indices, mask (streams as the CSA plan splits the
        ubatch) and rotation, then each compressor's inputs sized by its reserve plan
        (dsv4_build_comp_inputs), then the compressed caches' rotations."""
        kv, ub = self.kv, self.ubatch
        raw = kv.raw.swa
        csa_plan = reserve_comp_plan(ub.n_tokens, ub.n_seqs, ub.n_seqs_unq, DSV4_CSA_RATIO, True, kv.csa_state, kv.csa)
        n_stream = csa_plan.n_stream
        if self.hparams.swa_type == LLAMA_SWA_TYPE_NONE:
            raise GGMLAbort("llama.cpp would abort (build_inp_dsv4 GGML_ASSERT: DSV4 expects SWA raw cache)")
        k_idxs = ggml.new_tensor(ggml.T.I64, ub.n_tokens)   # llama_kv_cache_dsv4_raw_context's: unnamed
        k_idxs.set_input()
        mask = ggml.new_tensor(ggml.T.F16 if self.cparams.flash_attn else ggml.T.F32, raw.get_n_kv(),
                               ub.n_tokens // n_stream, 1, n_stream)
        mask.set_input()
        set_name(mask, "attn_inp_kq_mask")
        inp = DSV4Input(kv, k_idxs, mask, raw.build_input_k_rot(),
                        self._dsv4_comp_inputs(csa_plan, "csa", n_stream),
                        self._dsv4_comp_inputs(reserve_comp_plan(ub.n_tokens, ub.n_seqs, ub.n_seqs_unq, DSV4_HCA_RATIO,
                                                                 False, kv.hca_state, kv.hca), "hca", n_stream),
                        self._dsv4_comp_inputs(reserve_comp_plan(ub.n_tokens, ub.n_seqs, ub.n_seqs_unq, DSV4_CSA_RATIO,
                                                                 True, kv.lid_state, kv.lid), "lid", n_stream))
        inp.csa.k_rot = kv.csa.build_input_k_rot()
        inp.hca.k_rot = kv.hca.build_input_k_rot()
        inp.lid.k_rot = kv.lid.build_input_k_rot()
        return inp

    def _dsv4_comp_inputs(self, plan: CompPlan, name: str, n_stream: int) -> DSV4CompInput:
        """dsv4_build_comp_inputs: a 1-D input per non-empty index list; the mask of the compressed
        rows is f16 for flash attention (the indexer's: for the fused lightning indexer, always on)."""
        def input_1d(type_: int, ne0: int, what: str) -> Optional[Tensor]:
            if ne0 == 0:
                return None
            t = ggml.new_tensor(type_, ne0)
            t.set_input()
            set_name(t, f"dsv4_{name}_{what}")
            return t
        i32, i64 = ggml.T.I32, ggml.T.I64
        mask = None
        if plan.n_kv > 0:
            f16 = self.cparams.flash_attn if name != "lid" else True
            mask = ggml.new_tensor(ggml.T.F16 if f16 else ggml.T.F32, plan.n_kv, plan.n_tokens // n_stream, 1, n_stream)
            mask.set_input()
            set_name(mask, f"dsv4_{name}_kq_mask")
        return DSV4CompInput(
            input_1d(i32, plan.n_tokens, "state_pos"), input_1d(i32, plan.n_persist, "state_persist_src_idxs"),
            input_1d(i32, plan.n_persist, "state_persist_dst_idxs"),
            input_1d(i32, plan.n_restore, "state_restore_src_idxs"),
            input_1d(i32, plan.n_restore, "state_restore_dst_idxs"),
            input_1d(i32, plan.n_snapshot, "state_snapshot_src_idxs"),
            input_1d(i32, plan.n_snapshot, "state_snapshot_dst_idxs"),
            input_1d(i32, plan.n_read, "state_read_idxs"), input_1d(i64, plan.n_blocks, "state_write_idxs"),
            input_1d(i32, plan.n_blocks, "state_write_pos"), mask)

    def build_rs_inp(self) -> RSInput:
        rs = self._rs_inp(self.kv)
        self.written_at_decode(rs.s_copy, "llm_graph_input_rs::set_input")
        return rs

    def build_inp_mem_hybrid(self) -> MemHybridInput:
        """build_inp_mem_hybrid: the recurrent state's inputs, then the KV cache's."""
        rs = self._rs_inp(self.kv.recr)
        attn = self._attn_inp(self.kv.attn)
        for t in (attn.k_idxs, attn.v_idxs, attn.kq_mask, rs.s_copy):   # its set_input asks no buffer of them
            self.written_at_decode(t, "llm_graph_input_mem_hybrid::set_input")
        return MemHybridInput(attn, rs)

    def build_inp_mem_hybrid_iswa(self) -> MemHybridInput:
        """build_inp_mem_hybrid_iswa: the recurrent state's inputs, then the base cache's, then the SWA
        cache's; unlike build_attn_inp_kv_iswa, no K/V rotation inputs."""
        rs = self._rs_inp(self.kv.recr)
        self.written_at_decode(rs.s_copy, "llm_graph_input_mem_hybrid_iswa::set_input")
        attn = self.kv.attn
        base = self._attn_inp(attn.base, rotations=False)
        return MemHybridInput(AttnInputISWA(base, self._attn_inp(attn.swa, rotations=False)), rs)

    def build_inp_mem_hybrid_k(self) -> MemHybridInput:
        """build_inp_mem_hybrid_k: the recurrent state's inputs, then the K-only cache's (MLA)."""
        rs = self._rs_inp(self.kv.recr)
        kv = self.kv.attn
        attn = AttnInputK(kv, kv.build_input_k_idxs(self.ubatch.n_tokens), self.build_attn_inp_kq_mask(kv))
        for t in (attn.k_idxs, attn.kq_mask, rs.s_copy):   # its set_input asks no buffer of them
            self.written_at_decode(t, "llm_graph_input_mem_hybrid_k::set_input")
        return MemHybridInput(attn, rs)

    def _rs_inp(self, mem: MemoryRecurrent) -> RSInput:
        """build_rs_inp_impl"""
        n_rs, n_seqs = mem.get_n_rs(), self.ubatch.n_seqs
        s_copy = ggml.new_tensor(ggml.T.I32, n_rs)
        s_copy.set_input()
        set_name(s_copy, "rs_s_copy")
        main = ggml.view(s_copy, (n_seqs,), (), 0)
        extra = ggml.view(s_copy, (n_rs - n_seqs,), (), n_seqs * s_copy.nb[0])
        return RSInput(mem, s_copy, main, extra)

    def build_rs(self, inp: RSInput, s: Tensor, state_size: int, n_seqs: int, get_state_rows=ggml.get_rows) -> Tensor:
        """build_rs: clear the rs_z state (a no-op view at reserve), gather the sequences' states
        (get_state_rows(states, ids): GET_ROWS, or Mamba-2's scan over them), copy the extra ones
        (none at reserve: n_rs == n_seqs) back into place."""
        mem = inp.mem
        n_rs, rs_head, rs_zero = mem.get_n_rs(), mem.get_head(), mem.get_rs_z()
        states = ggml.reshape(s, state_size, s.ne[1])
        zero = ggml.view(states, (state_size * (rs_zero >= 0),), (), rs_zero * states.nb[1] * (rs_zero >= 0))
        ggml.build_forward_expand(self.gf, ggml.scale(zero, 0.0, inplace=True))
        output_states = get_state_rows(states, inp.s_copy_main)
        ggml.build_forward_expand(self.gf, output_states)
        states_extra = ggml.get_rows(states, inp.s_copy_extra)
        dst = ggml.view(s, (state_size, n_rs - n_seqs), (s.nb[1],), (rs_head + n_seqs) * s.nb[1])
        ggml.build_forward_expand(self.gf, ggml.cpy(states_extra, dst))
        return output_states

    def build_rwkv_token_shift_load(self, inp: RSInput, il: int) -> Tensor:
        """The layer's token shift rows of each sequence, [n_embd, token_shift_count, n_seqs]."""
        hp = self.hparams
        token_shift = self.build_rs(inp, inp.mem.r_l[il], hp.n_embd_r(), self.ubatch.n_seqs)
        return ggml.reshape(token_shift, hp.n_embd, hp.token_shift_count, self.ubatch.n_seqs)

    def build_rwkv_token_shift_store(self, token_shift: Tensor, il: int) -> Tensor:
        """Copy the new token shift rows back into the layer's r state."""
        hp, mem, n_seqs = self.hparams, self.kv, self.ubatch.n_seqs
        r = mem.r_l[il]
        src = ggml.view(token_shift, (hp.n_embd * n_seqs * hp.token_shift_count,), (), 0)
        dst = ggml.view(r, (hp.n_embd_r() * n_seqs,), (), hp.n_embd_r() * mem.get_head() * ggml.type_size(r.type))
        return ggml.cpy(src, dst)

    def _attn_inp(self, kv: KVCache, rotations: bool = True) -> AttnInput:
        n_tokens = self.ubatch.n_tokens
        k_idxs = kv.build_input_k_idxs(n_tokens)
        v_idxs = kv.build_input_v_idxs(n_tokens)
        inp = AttnInput(kv, k_idxs, v_idxs, self.build_attn_inp_kq_mask(kv), None, None)
        if rotations:
            inp.k_rot, inp.v_rot = kv.build_input_k_rot(), kv.build_input_v_rot()
        return inp

    def build_attn_inp_kq_mask(self, kv: KVCache, flash_attn: Optional[bool] = None) -> Tensor:
        """flash_attn: the cparams' unless given (the DSA indexer's mask follows fused_lid)."""
        n_tokens = self.ubatch.n_tokens
        n_stream = 1 if self.cparams.kv_unified else self.ubatch.n_seqs_unq
        if flash_attn is None:
            flash_attn = self.cparams.flash_attn
        mask_type = ggml.T.F16 if flash_attn else ggml.T.F32   # flash attention wants f16
        mask = ggml.new_tensor(mask_type, kv.get_n_kv(), n_tokens // n_stream, 1, n_stream)
        mask.set_input()
        set_name(mask, "attn_inp_kq_mask")
        return mask

    # --- encoder-decoder (t5) inputs ---------------------------------------------------

    def build_attn_inp_cross(self) -> AttnInputCross:
        """build_attn_inp_cross: an unnamed mask of n_enc x n_tokens; before any llama_encode (the
        reserve) n_enc is n_ctx_train."""
        mask = ggml.new_tensor(ggml.T.F16 if self.cparams.flash_attn else ggml.T.F32, self.hparams.n_ctx_train,
                               self.ubatch.n_tokens, 1, 1)
        mask.set_input()
        return AttnInputCross(mask)

    def build_inp_cross_embd(self) -> Tensor:
        """build_inp_cross_embd: the encoder output the decoder attends, n_embd_inp x n_ctx_train
        before any llama_encode (cross->v_embd empty: the reserve)."""
        cur = ggml.new_tensor(ggml.T.F32, self.hparams.n_embd_inp(), self.hparams.n_ctx_train)
        cur.set_input()
        set_name(cur, "cross_embd")
        return cur

    def build_inp_pos_bucket_enc(self) -> Tensor:
        n_tokens = self.ubatch.n_tokens
        cur = ggml.new_tensor(ggml.T.I32, n_tokens, n_tokens)
        cur.set_input()
        set_name(cur, "pos_bucket_enc")
        return self.written_at_decode(cur, "llm_graph_input_pos_bucket::set_input")

    def build_inp_pos_bucket_dec(self) -> Tensor:
        """build_inp_pos_bucket_dec: the buckets of every cached position for each token."""
        cur = ggml.new_tensor(ggml.T.I32, self.kv.get_n_kv(), self.ubatch.n_tokens)
        cur.set_input()
        set_name(cur, "pos_bucket_dec")
        return cur

    def build_pos_bias(self, pos_bucket: Tensor, attn_rel_b: Tensor) -> Tensor:
        """build_pos_bias: the relative position bias per head, [n_kv, n_tokens, n_head]."""
        pos_bucket_1d = ggml.reshape(pos_bucket, pos_bucket.ne[0] * pos_bucket.ne[1])
        self.cb(pos_bucket_1d, "pos_bucket_1d", -1)
        pos_bias = ggml.get_rows(attn_rel_b, pos_bucket_1d)
        pos_bias = ggml.reshape(pos_bias, pos_bias.ne[0], pos_bucket.ne[0], pos_bucket.ne[1])
        pos_bias = ggml.cont(ggml.permute(pos_bias, 2, 0, 1, 3))
        self.cb(pos_bias, "pos_bias", -1)
        return pos_bias

    # --- layers ----------------------------------------------------------------------------------

    def lora_weights(self, w: Tensor) -> Iterator[tuple[LoraWeight, float]]:
        """Each applied adapter's lora_a/lora_b pair of weight w with its scale, in llama_context::loras'
        order (the loop build_lora_mm, build_lora_mm_id and build_inp_embd open with); w is then
        multiplied as llama.cpp multiplies it (check_loras)."""
        for adapter, adapter_scale in self.loras:
            lw = adapter.get_weight(w)
            if lw is not None:
                self.lora_handled.add(w.name)
                yield lw, lw.get_scale(adapter.alpha, adapter_scale)

    def build_lora_mm(self, w: Tensor, cur: Tensor, w_s: Optional[Tensor] = None) -> Tensor:
        """build_lora_mm: MUL_MAT, times the weight's scale where w_s is given, plus each applied
        LoRA adapter's scale * (b @ (a @ cur)) for the weight."""
        res = ggml.mul_mat(w, cur)
        if w_s is not None:
            res = ggml.mul(res, w_s)
        for lw, scale in self.lora_weights(w):
            ab_cur = ggml.mul_mat(lw.b, ggml.mul_mat(lw.a, cur))
            ab_cur = ggml.scale(ab_cur, scale)
            res = ggml.add(res, ab_cur)
        return res

    def mul_mat_no_lora(self, w: Tensor, cur: Tensor) -> Tensor:
        """ggml_mul_mat(ctx0, w, cur) of a weight, where llama.cpp's graph multiplies it so and not
        through build_lora_mm: an adapter of the weight is loaded and never read (check_loras)."""
        self.lora_handled.add(w.name)
        return ggml.mul_mat(w, cur)

    def build_lora_mm_id(self, w: Tensor, cur: Tensor, ids: Tensor, w_s: Optional[Tensor] = None) -> Tensor:
        """build_lora_mm_id: MUL_MAT_ID, times the selected experts' scales where w_s is given."""
        res = ggml.mul_mat_id(w, cur, ids)
        if w_s is not None:
            n_expert = w_s.ne[0]
            s = ggml.reshape(w_s, 1, n_expert, 1)
            s = ggml.repeat_4d(s, 1, n_expert, cur.ne[2], 1)
            res = ggml.mul(res, ggml.get_rows(s, ids))
        for lw, scale in self.lora_weights(w):
            ab_cur = ggml.mul_mat_id(lw.b, ggml.mul_mat_id(lw.a, cur, ids), ids)
            ab_cur = ggml.scale(ab_cur, scale)
            res = ggml.add(res, ab_cur)
        return res

    def build_norm(self, cur: Tensor, mw: Optional[Tensor], mb: Optional[Tensor], type_: str, il: int) -> Tensor:
        """build_norm with LLM_NORM, LLM_NORM_RMS or LLM_NORM_GROUP (over [n_tokens, channels] as one
        row per channel)"""
        if type_ == LLM_NORM:
            cur = ggml.norm(cur, self.hparams.f_norm_eps)
        elif type_ == LLM_NORM_GROUP:
            cur = ggml.reshape(cur, cur.ne[0], 1, cur.ne[1])
            cur = ggml.group_norm(cur, self.hparams.n_norm_groups, self.hparams.f_norm_group_eps)
            cur = ggml.reshape(cur, cur.ne[0], cur.ne[2])
        else:
            cur = ggml.rms_norm(cur, self.hparams.f_norm_rms_eps)
        if mw is not None or mb is not None:
            self.cb(cur, "norm", il)
        if mw is not None:
            cur = ggml.mul(cur, mw)
            if mb is not None:
                self.cb(cur, "norm_w", il)
        if mb is not None:
            cur = ggml.add(cur, mb)
        return cur

    def build_qkv(self, layer, cur: Tensor, n_embd_head: int, n_head: int, n_head_kv: int, il: int):
        """build_qkv with reshape: the fused attn_qkv path (views of one product) or separate Q/K/V."""
        n_tokens = self.ubatch.n_tokens
        if layer.wqkv is not None:
            qkv = self._fused_qkv(layer, cur, il)
            if self.hparams.f_clamp_kqv > 0.0:   # DBRX's clip_qkv
                qkv = ggml.clamp(qkv, -self.hparams.f_clamp_kqv, self.hparams.f_clamp_kqv)
                self.cb(qkv, "wqkv_clamped", il)
            n_embd_q, n_embd_k = n_embd_head * n_head, n_embd_head * n_head_kv
            row = ggml.row_size(qkv.type, n_embd_head)
            q = ggml.view(qkv, (n_embd_head, n_head, n_tokens), (row, qkv.nb[1]), 0)
            k = ggml.view(qkv, (n_embd_head, n_head_kv, n_tokens), (row, qkv.nb[1]), ggml.row_size(qkv.type, n_embd_q))
            v = ggml.view(qkv, (n_embd_head, n_head_kv, n_tokens), (row, qkv.nb[1]),
                          ggml.row_size(qkv.type, n_embd_q + n_embd_k))
        else:
            q = self._proj(layer.wq, layer.bq, layer.wq_s, cur, "Qcur", il)
            k = self._proj(layer.wk, layer.bk, layer.wk_s, cur, "Kcur", il)
            v = self._proj(layer.wv, layer.bv, layer.wv_s, cur, "Vcur", il)
            q = ggml.reshape(q, n_embd_head, n_head, n_tokens)
            k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
            v = ggml.reshape(v, n_embd_head, n_head_kv, n_tokens)
        self.cb(q, "Qcur", il)
        self.cb(k, "Kcur", il)
        self.cb(v, "Vcur", il)
        return q, k, v

    def build_qkv_flat(self, layer, cur: Tensor, n_embd_q: int, n_embd_k: int, n_embd_v: int, il: int):
        """build_qkv with reshape false: 2-D Q, K, V (contiguous copies of the fused product's
        views, or the separate projections with their biases), unnamed."""
        n_tokens = self.ubatch.n_tokens
        if layer.wqkv is not None:
            qkv = self._fused_qkv(layer, cur, il)
            q = ggml.view(qkv, (n_embd_q, n_tokens), (qkv.nb[1],), 0)
            k = ggml.view(qkv, (n_embd_k, n_tokens), (qkv.nb[1],), ggml.row_size(qkv.type, n_embd_q))
            v = ggml.view(qkv, (n_embd_v, n_tokens), (qkv.nb[1],), ggml.row_size(qkv.type, n_embd_q + n_embd_k))
            return ggml.cont(q), ggml.cont(k), ggml.cont(v)
        out = []
        for w, b, w_s in ((layer.wq, layer.bq, layer.wq_s), (layer.wk, layer.bk, layer.wk_s),
                          (layer.wv, layer.bv, layer.wv_s)):
            x = self.build_lora_mm(w, cur, w_s)
            out.append(ggml.add(x, b) if b is not None else x)
        return tuple(out)

    def _fused_qkv(self, layer, cur: Tensor, il: int) -> Tensor:
        """build_qkv's fused product and its bias: attn_qkv.bias, or in legacy files the separate
        Q/K/V biases concatenated (create_tensor_qkv loads those only without a fused bias)."""
        qkv = self.build_lora_mm(layer.wqkv, cur, layer.wqkv_s)
        self.cb(qkv, "wqkv", il)
        if layer.bqkv is not None:
            qkv = ggml.add(qkv, layer.bqkv)
            self.cb(qkv, "wqkv_b", il)
        elif layer.bq is not None and layer.bk is not None and layer.bv is not None:
            qkv = ggml.add(qkv, ggml.concat(ggml.concat(layer.bq, layer.bk, 0), layer.bv, 0))
            self.cb(qkv, "wqkv_b", il)
        return qkv

    def _proj(self, w: Tensor, b: Optional[Tensor], w_s: Optional[Tensor], cur: Tensor, name: str, il: int) -> Tensor:
        x = self.build_lora_mm(w, cur, w_s)
        self.cb(x, name, il)
        if b is not None:
            x = ggml.add(x, b)
            self.cb(x, name, il)
        if self.hparams.f_clamp_kqv > 0.0:
            x = ggml.clamp(x, -self.hparams.f_clamp_kqv, self.hparams.f_clamp_kqv)
            self.cb(x, f"{name}_clamped", il)
        return x

    def build_ffn(self, cur: Tensor, up: Optional[Tensor], up_b: Optional[Tensor], gate: Optional[Tensor],
                  gate_b: Optional[Tensor], down: Optional[Tensor], down_b: Optional[Tensor], type_op: str,
                  type_gate: str, il: int, down_s: Optional[Tensor] = None, up_s: Optional[Tensor] = None,
                  gate_s: Optional[Tensor] = None, act_scales: Optional[Tensor] = None) -> Tensor:
        """build_ffn for LLM_FFN_SILU / GELU / RELU with a sequential or parallel gate, and
        SWIGLU / GEGLU over a fused gate+up projection; up_s, gate_s and down_s scale the up and
        gate projections and the output; act_scales divides an ungated GELU's output (MPT's AWQ
        ffn.act.scales)."""
        tmp = self.build_lora_mm(up, cur) if up is not None else cur
        self.cb(tmp, "ffn_up", il)
        if up_b is not None:
            tmp = ggml.add(tmp, up_b)
            self.cb(tmp, "ffn_up_b", il)
        if up_s is not None:
            tmp = ggml.mul(tmp, up_s)
            self.cb(tmp, "ffn_up_s", il)
        if gate is not None:
            cur = self.build_lora_mm(gate, tmp if type_gate == LLM_FFN_SEQ else cur)
            self.cb(cur, "ffn_gate", il)
            if gate_b is not None:
                cur = ggml.add(cur, gate_b)
                self.cb(cur, "ffn_gate_b", il)
            if gate_s is not None:
                cur = ggml.mul(cur, gate_s)
                self.cb(cur, "ffn_gate_s", il)
        else:
            cur = tmp
        if type_op in (LLM_FFN_SWIGLU, LLM_FFN_GEGLU, LLM_FFN_REGLU):
            cur = ggml.glu(cur, {LLM_FFN_SWIGLU: ggml.GLU_SWIGLU, LLM_FFN_GEGLU: ggml.GLU_GEGLU,
                                 LLM_FFN_REGLU: ggml.GLU_REGLU}[type_op])
            self.cb(cur, f"ffn_{type_op.lower()}", il)
        elif type_op == LLM_FFN_RELU_SQR:   # ungated only: llama.cpp has no gated squared relu
            cur = ggml.unary(cur, "RELU")
            self.cb(cur, "ffn_relu", il)
            cur = ggml.sqr(cur)
            self.cb(cur, "ffn_sqr(relu)", il)
        elif (type_op == LLM_FFN_SILU and gate is not None and type_gate == LLM_FFN_PAR and il >= 0
              and self.hparams.swiglu_clamp_shexp_at(il) > SWIGLU_LIMIT_EPS):
            # one fused GGML_GLU_OP_SWIGLU_CLAMP for these (llama-graph.cpp:1848), else clamp, silu, clamp, mul
            fused = self.hparams.arch in ("deepseek4", "glm5-next")
            cur = self.build_swiglu_limited(cur, tmp, self.hparams.swiglu_clamp_shexp_at(il), fused, "ffn", il)
        else:
            cur = self.build_ffn_act(cur, tmp if gate is not None and type_gate == LLM_FFN_PAR else None, type_op,
                                     "ffn", il)
            if act_scales is not None and type_op == LLM_FFN_GELU and (gate is None or type_gate != LLM_FFN_PAR):
                cur = ggml.div(cur, act_scales)
                self.cb(cur, "ffn_act", il)
        if down is not None:
            cur = self.build_lora_mm(down, cur)
        if down_b is not None:
            self.cb(cur, "ffn_down", il)
            cur = ggml.add(cur, down_b)
        if down_s is not None:
            cur = ggml.mul(cur, down_s)
            self.cb(cur, "ffn_down_s", il)
        return cur

    def build_moe_ffn(self, cur: Tensor, gate_inp: Tensor, up_exps: Optional[Tensor], gate_exps: Optional[Tensor],
                      down_exps: Tensor, exp_probs_b: Optional[Tensor], n_expert: int, n_expert_used: int,
                      type_op: str, norm_w: bool, w_scale: float, gating_op: str, il: int,
                      gate_inp_b: Optional[Tensor] = None, up_exps_b: Optional[Tensor] = None,
                      gate_exps_b: Optional[Tensor] = None, down_exps_b: Optional[Tensor] = None,
                      gate_up_exps: Optional[Tensor] = None, probs_in: Optional[Tensor] = None,
                      down_exps_s: Optional[Tensor] = None, selected_experts_in: Optional[Tensor] = None) -> Tensor:
        """build_moe_ffn: router logits (or the caller's, probs_in), gating, top-k experts (or the
        caller's, selected_experts_in: DeepSeek-V4's hash routing), their weights, the experts' FFN
        by MUL_MAT_ID, weighting (of the output; of the input for llama4), then one view per used
        expert summed."""
        hp = self.hparams
        n_embd, n_tokens = cur.ne[0], cur.ne[1]
        if probs_in is None:
            logits = self.build_lora_mm(gate_inp, cur)
            self.cb(logits, "ffn_moe_logits", il)
        else:
            logits = probs_in
        if gate_inp_b is not None:
            logits = ggml.add(logits, gate_inp_b)
            self.cb(logits, "ffn_moe_logits_biased", il)
        if gating_op == LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX:
            probs = ggml.soft_max(logits)
        elif gating_op == LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID:
            probs = ggml.unary(logits, "SIGMOID")
        elif gating_op == LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT:   # softmax over the selected ones, later
            probs = logits
        elif gating_op == LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS:
            probs = ggml.sqrt(ggml.unary(logits, "SOFTPLUS"))
        else:
            raise NotImplementedError(f"expert gating function {gating_op} is not planned yet")
        self.cb(probs, "ffn_moe_probs", il)
        selection_probs = probs
        if exp_probs_b is not None:
            selection_probs = ggml.add(probs, exp_probs_b)
            self.cb(selection_probs, "ffn_moe_probs_biased", il)
        # llama4 selects by the logits; the sigmoid only weights (llama-graph.cpp build_moe_ffn)
        weight_before_ffn = hp.arch == "llama4"
        if weight_before_ffn:
            selection_probs = logits
        if hp.arch == "grovemoe":   # selection by the sigmoid of the logits, weights from the softmax
            selection_probs = ggml.unary(logits, "SIGMOID")
            self.cb(selection_probs, "ffn_moe_probs_biased", il)
        if hp.n_expert_groups > 1 and n_tokens > 0:
            selection_probs = self._select_expert_groups(selection_probs, n_expert, n_tokens, il)
        selected = selected_experts_in
        if selected is None:
            selected = ggml.argsort_top_k(selection_probs, n_expert_used)
            self.cb(selected.view_src, "ffn_moe_argsort", il)
        self.cb(selected, "ffn_moe_topk", il)
        if hp.arch == "grovemoe" and n_expert != hp.n_expert:
            # the chunk experts: expert ids over all experts, divided by the experts per group (as f32)
            f_sel = ggml.cast(selected, ggml.T.F32)
            selected = ggml.cast(ggml.scale(f_sel, 1.0 / hp.n_group_experts), ggml.T.I32)
            probs = ggml.reshape(probs, 1, hp.n_expert, n_tokens)
        else:
            probs = ggml.reshape(probs, 1, n_expert, n_tokens)
        weights = ggml.get_rows(probs, selected)
        self.cb(weights, "ffn_moe_weights", il)
        if gating_op == LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT:
            weights = ggml.soft_max(ggml.reshape(weights, n_expert_used, n_tokens))
            weights = ggml.reshape(weights, 1, n_expert_used, n_tokens)
            self.cb(weights, "ffn_moe_weights_softmax", il)
        if norm_w:
            weights = ggml.reshape(weights, n_expert_used, n_tokens)
            weights_sum = ggml.sum_rows(weights)
            self.cb(weights_sum, "ffn_moe_weights_sum", il)
            weights_sum = ggml.clamp(weights_sum, 6.103515625e-5, math.inf)   # no division by zero
            self.cb(weights_sum, "ffn_moe_weights_sum_clamped", il)
            weights = ggml.div(weights, weights_sum)
            self.cb(weights, "ffn_moe_weights_norm", il)
            weights = ggml.reshape(weights, 1, n_expert_used, n_tokens)
        if w_scale not in (0.0, 1.0):
            weights = ggml.scale(weights, w_scale)
            self.cb(weights, "ffn_moe_weights_scaled", il)
        ggml.build_forward_expand(self.gf, weights)   # early, so that topk-moe can be fused

        cur = ggml.reshape(cur, n_embd, 1, n_tokens)
        if weight_before_ffn:   # llama4 weights each expert's copy of the input, not its output
            cur = ggml.mul(ggml.repeat_4d(cur, n_embd, n_expert_used, n_tokens, 1), weights)
            self.cb(cur, "ffn_moe_weighted", il)
        if gate_up_exps is not None:
            gate_up = self.build_lora_mm_id(gate_up_exps, cur, selected)
            self.cb(gate_up, "ffn_moe_gate_up", il)
            n_ff = gate_up.ne[0] // 2
            cur = ggml.view(gate_up, (n_ff, gate_up.ne[1], gate_up.ne[2]), (gate_up.nb[1], gate_up.nb[2]), 0)
            self.cb(cur, "ffn_moe_gate", il)
            up = ggml.view(gate_up, (n_ff, gate_up.ne[1], gate_up.ne[2]), (gate_up.nb[1], gate_up.nb[2]),
                           n_ff * gate_up.nb[0])
            self.cb(up, "ffn_moe_up", il)
        else:
            up = self.build_lora_mm_id(up_exps, cur, selected)
            self.cb(up, "ffn_moe_up", il)
            if up_exps_b is not None:
                up = ggml.add_id(up, up_exps_b, selected)
                self.cb(up, "ffn_moe_up_biased", il)
            if gate_exps is not None:
                cur = self.build_lora_mm_id(gate_exps, cur, selected)
                self.cb(cur, "ffn_moe_gate", il)
            else:
                cur = up
            if gate_exps_b is not None:
                cur = ggml.add_id(cur, gate_exps_b, selected)
                self.cb(cur, "ffn_moe_gate_biased", il)
        has_gate = gate_exps is not None or gate_up_exps is not None
        if (type_op == LLM_FFN_SILU and gate_exps is not None and il >= 0
                and hp.swiglu_clamp_exp_at(il) > SWIGLU_LIMIT_EPS):
            # one fused GGML_GLU_OP_SWIGLU_CLAMP for these (llama-graph.cpp:2242), else clamp, silu, clamp, mul
            fused = hp.arch in ("maple", "deepseek4", "glm5-next", "hy_v4")
            cur = self.build_swiglu_limited(cur, up, hp.swiglu_clamp_exp_at(il), fused, "ffn_moe", il)
        elif type_op == LLM_FFN_SWIGLU_OAI_MOE:
            cur = ggml.glu_split(cur, up, ggml.GLU_SWIGLU_OAI)
            self.cb(cur, "ffn_moe_swiglu_oai", il)
        elif type_op == LLM_FFN_SITU:
            if not has_gate:
                raise GGMLAbort("llama.cpp would abort (build_moe_ffn GGML_ASSERT(has_gate)): situ experts without a gate")
            cur = build_situ(cur, up, hp.situ_beta, hp.situ_linear_beta)
            self.cb(cur, "ffn_moe_situ", il)
        elif type_op == LLM_FFN_RELU_SQR:
            if has_gate:
                raise GGMLAbort("llama.cpp would abort: gated squared relu not implemented (build_moe_ffn)")
            cur = ggml.sqr(ggml.unary(cur, "RELU"))
            self.cb(cur, "ffn_moe_relu_sqr", il)
        else:
            cur = self.build_ffn_act(cur, up if has_gate else None, type_op, "ffn_moe", il)

        experts = self.build_lora_mm_id(down_exps, cur, selected, down_exps_s)
        if self.hparams.arch == "mistral4":
            ggml.prec_set_src(experts, ggml.PREC_F32, 1)       # "src1 can exceed F16 range" (llama-graph.cpp:2319)
        self.cb(experts, "ffn_moe_down", il)
        if down_exps_s is not None:
            self.cb(experts, "ffn_moe_down_scaled", il)
        if down_exps_b is not None:
            experts = ggml.add_id(experts, down_exps_b, selected)
            self.cb(experts, "ffn_moe_down_biased", il)
        if not weight_before_ffn:
            experts = ggml.mul(experts, weights)
            self.cb(experts, "ffn_moe_weighted", il)
        ggml.build_forward_expand(self.gf, experts)

        # one view per used expert (ordered before the adds), then their sum
        n_used = hp.n_expert_used_arr[il]
        views = [ggml.view(experts, (n_embd, n_tokens), (experts.nb[2],), i * experts.nb[1]) for i in range(n_used)]
        for v in views:
            ggml.build_forward_expand(self.gf, v)
        moe_out = views[0]
        for v in views[1:]:
            moe_out = ggml.add(moe_out, v)
            ggml.build_forward_expand(self.gf, moe_out)
        if n_used == 1:
            moe_out = ggml.cont(moe_out)   # not a non-contiguous view
        self.cb(moe_out, "ffn_moe_out", il)
        return moe_out

    def _select_expert_groups(self, selection_probs: Tensor, n_expert: int, n_tokens: int, il: int) -> Tensor:
        """Group-limited routing (DeepSeek-V3): score each group by its top two experts, keep the
        n_group_used best groups, mask the others' experts to -inf."""
        hp = self.hparams
        n_groups = hp.n_expert_groups
        groups = ggml.reshape(selection_probs, n_expert // n_groups, n_groups, n_tokens)
        scores = ggml.argsort_top_k(groups, 2)
        scores = ggml.get_rows(ggml.reshape(groups, 1, groups.ne[0], groups.ne[1], groups.ne[2]), scores)
        scores = ggml.sum_rows(ggml.reshape(scores, scores.ne[1], scores.ne[2], scores.ne[3]))
        scores = ggml.reshape(scores, scores.ne[1], scores.ne[2])
        expert_groups = ggml.argsort_top_k(scores, hp.n_group_used)
        self.cb(expert_groups, "ffn_moe_group_topk", il)
        kept = ggml.get_rows(groups, expert_groups)
        masked = ggml.set_rows(ggml.fill(groups, -math.inf), kept, expert_groups)
        masked = ggml.reshape(masked, n_expert, n_tokens)
        self.cb(masked, "ffn_moe_probs_masked", il)
        return masked

    def build_swiglu_limited(self, cur: Tensor, up: Tensor, limit: float, fused: bool, prefix: str, il: int) -> Tensor:
        """The SwiGLU build_ffn and build_moe_ffn use above a swiglu_clamp limit: one
        GGML_GLU_OP_SWIGLU_CLAMP (fused), else up clamped to +-limit times silu(gate) capped at limit."""
        if fused:
            cur = ggml.glu_split(cur, up, ggml.GLU_SWIGLU_CLAMP, limit)
        else:
            up = ggml.clamp(up, -limit, limit)
            self.cb(up, f"{prefix}_up_clamped", il)
            gate_act = ggml.unary(cur, "SILU")
            self.cb(gate_act, f"{prefix}_silu", il)
            gate_act = ggml.clamp(gate_act, -math.inf, limit)
            self.cb(gate_act, f"{prefix}_silu_clamped", il)
            cur = ggml.mul(gate_act, up)
        self.cb(cur, f"{prefix}_swiglu_limited", il)
        return cur

    def build_ffn_act(self, cur: Tensor, up: Optional[Tensor], type_op: str, prefix: str, il: int) -> Tensor:
        """The activation build_ffn and build_moe_ffn share: with a gate, the GLU of gate and up
        (swiglu, geglu, reglu, swiglu_oai); without, the unary op itself (silu, gelu, relu)."""
        if up is not None:
            glu, name = {LLM_FFN_SILU: (ggml.GLU_SWIGLU, "swiglu"), LLM_FFN_GELU: (ggml.GLU_GEGLU, "geglu"),
                         LLM_FFN_RELU: (ggml.GLU_REGLU, "reglu"),
                         LLM_FFN_SWIGLU_OAI_MOE: (ggml.GLU_SWIGLU_OAI, "swiglu_oai")}[type_op]
            cur = ggml.glu_split(cur, up, glu)
            self.cb(cur, f"{prefix}_{name}", il)
        elif type_op == LLM_FFN_SWIGLU_OAI_MOE:
            raise GGMLAbort("llama.cpp would abort (build_ffn): LLM_FFN_SWIGLU_OAI_MOE requires a parallel gate")
        else:
            cur = ggml.unary(cur, type_op)
            self.cb(cur, f"{prefix}_{type_op.lower()}", il)
        return cur

    # --- attention -------------------------------------------------------------------------------

    def build_attn(self, inp, wo: Optional[Tensor], bo: Optional[Tensor], q_cur: Tensor, k_cur: Tensor,
                   v_cur: Tensor, kq_scale: float, il: int, sinks: Optional[Tensor] = None,
                   v_mla: Optional[Tensor] = None, wo_s: Optional[Tensor] = None,
                   kq_b: Optional[Tensor] = None) -> Tensor:
        """build_attn(llm_graph_input_attn_kv *) and build_attn(llm_graph_input_attn_kv_iswa *): the
        iswa form picks the layer's cache and expands q, k, v (the plain form q, v, k); wo_s scales
        the output projection; kq_b is added to KQ (T5's position bias)."""
        if isinstance(inp, AttnInputK):
            return self.build_attn_k(inp, wo, bo, q_cur, k_cur, v_cur, kq_scale, il, v_mla, sinks)
        if isinstance(inp, (AttnInputNoCache, AttnInputCross)):
            return self.build_attn_no_cache(inp, wo, bo, q_cur, k_cur, v_cur, kq_scale, il, sinks, v_mla, wo_s, kq_b)
        iswa = isinstance(inp, AttnInputISWA)
        if iswa:
            inp = inp.swa if self.hparams.is_swa(il) else inp.base
        # k_cur and v_cur are None where the layer reads another layer's K/V (gemma4's shared KV)
        if inp.k_rot is not None:
            q_cur = mul_mat_hadamard(q_cur, inp.k_rot)
            if k_cur is not None:
                k_cur = mul_mat_hadamard(k_cur, inp.k_rot)
        if inp.v_rot is not None and v_cur is not None:
            v_cur = mul_mat_hadamard(v_cur, inp.v_rot)
        for t in (q_cur, k_cur, v_cur) if iswa else (q_cur, v_cur, k_cur):
            if t is not None:
                ggml.build_forward_expand(self.gf, t)
        kv = inp.kv
        if k_cur is not None:
            ggml.build_forward_expand(self.gf, kv.cpy_k(k_cur, inp.k_idxs, il))
        if v_cur is not None:
            ggml.build_forward_expand(self.gf, kv.cpy_v(v_cur, inp.v_idxs, il))
        cur = self.build_attn_mha(q_cur, kv.get_k(il), kv.get_v(il), inp.kq_mask, kq_scale, il, sinks, kq_b=kq_b)
        self.cb(cur, "kqv_out", il)
        if inp.v_rot is not None:
            cur = mul_mat_hadamard(cur, inp.v_rot)
        if wo is not None:
            cur = self.build_lora_mm(wo, cur, wo_s)
        if bo is not None:
            cur = ggml.add(cur, bo)
        return cur

    def build_attn_no_cache(self, inp: Union[AttnInputNoCache, AttnInputCross], wo: Optional[Tensor],
                            bo: Optional[Tensor], q_cur: Tensor, k_cur: Tensor, v_cur: Tensor, kq_scale: float,
                            il: int, sinks: Optional[Tensor] = None, v_mla: Optional[Tensor] = None,
                            wo_s: Optional[Tensor] = None, kq_b: Optional[Tensor] = None) -> Tensor:
        """build_attn(llm_graph_input_attn_no_cache *): q, k, v expanded together (fewer splits),
        attention over the ubatch itself with the layer's mask; build_attn(llm_graph_input_attn_cross *)
        the same over the encoder output with the cross mask. kq_b: T5's position bias."""
        for t in (q_cur, k_cur, v_cur):
            ggml.build_forward_expand(self.gf, t)
        if isinstance(inp, AttnInputCross):
            kq_mask = inp.kq_mask
        else:
            kq_mask = inp.kq_mask_swa if self.hparams.is_swa(il) else inp.kq_mask
        cur = self.build_attn_mha(q_cur, k_cur, v_cur, kq_mask, kq_scale, il, sinks, v_mla, kq_b=kq_b)
        self.cb(cur, "kqv_out", il)
        if wo is not None:
            cur = self.build_lora_mm(wo, cur, wo_s)
        if bo is not None:
            cur = ggml.add(cur, bo)
        return cur

    def build_attn_k(self, inp: AttnInputK, wo: Optional[Tensor], bo: Optional[Tensor], q_cur: Tensor,
                     k_cur: Tensor, v_cur: Tensor, kq_scale: float, il: int, v_mla: Optional[Tensor],
                     sinks: Optional[Tensor] = None) -> Tensor:
        """build_attn(llm_graph_input_attn_k *): only K is stored; V is a view of K's first
        v_cur->ne[0] values, decompressed by v_mla after the attention; sinks join the softmax."""
        for t in (q_cur, v_cur, k_cur):
            ggml.build_forward_expand(self.gf, t)
        kv = inp.kv
        ggml.build_forward_expand(self.gf, kv.cpy_k(k_cur, inp.k_idxs, il))
        k = kv.get_k(il)
        v = ggml.view(k, (v_cur.ne[0], k.ne[1], k.ne[2], k.ne[3]), (k.nb[1], k.nb[2], k.nb[3]), 0)
        cur = self.build_attn_mha(q_cur, k, v, inp.kq_mask, kq_scale, il, sinks, v_mla)
        self.cb(cur, "kqv_out", il)
        if wo is not None:
            cur = self.build_lora_mm(wo, cur)
        if bo is not None:
            cur = ggml.add(cur, bo)
        return cur

    def build_attn_k_dsa(self, inp: AttnInputKDSA, wo: Optional[Tensor], bo: Optional[Tensor], q_cur: Tensor,
                         k_cur: Tensor, v_cur: Tensor, v_mla: Optional[Tensor], top_k: Tensor, kq_scale: float,
                         il: int, sinks: Optional[Tensor] = None) -> Tensor:
        """build_attn(llm_graph_input_attn_k_dsa *): MLA over the K-only cache as build_attn_k, its
        mask narrowed to the indexer's top-k keys: a -inf copy of the mask with zeros set at the
        selected rows, added to the mask."""
        for t in (q_cur, v_cur, k_cur):
            ggml.build_forward_expand(self.gf, t)
        kv = inp.kv.mla
        ggml.build_forward_expand(self.gf, kv.cpy_k(k_cur, inp.k_idxs_mla, il))
        kq_mask_top_k = self.build_top_k_mask(inp.kq_mask_mla, top_k, ggml.T.F32)
        k = kv.get_k(il)
        v = ggml.view(k, (v_cur.ne[0], k.ne[1], k.ne[2], k.ne[3]), (k.nb[1], k.nb[2], k.nb[3]), 0)
        cur = self.build_attn_mha(q_cur, k, v, kq_mask_top_k, kq_scale, il, sinks, v_mla, top_k.ne[0])
        self.cb(cur, "kqv_out", il)
        if wo is not None:
            cur = self.build_lora_mm(wo, cur)
        if bo is not None:
            cur = ggml.add(cur, bo)
        return cur

    def build_top_k_mask(self, kq_mask: Tensor, top_k: Tensor, zeros_type: int) -> Tensor:
        """The attention mask narrowed to the top-k keys (build_attn for llm_graph_input_attn_k_dsa,
        qwen4exp's build_attn_qsa, and DeepSeek-V4's build_top_k_mask, whose zeros are f16 with flash
        attention): a -inf copy of the mask viewed as rows of one value, zeros set at the selected rows,
        viewed back, plus the mask."""
        kq_mask_all = ggml.fill(kq_mask, -math.inf)
        kq_mask_all = ggml.view(kq_mask_all, (1, kq_mask_all.ne[0], kq_mask_all.ne[1], kq_mask_all.ne[3]),
                                (kq_mask_all.nb[0], kq_mask_all.nb[1], kq_mask_all.nb[2]), 0)
        top_k_3d = ggml.view(top_k, (top_k.ne[0], top_k.ne[1], top_k.ne[3], 1),
                             (top_k.nb[1], top_k.nb[2], top_k.ne[3] * top_k.nb[3]), 0)
        zeros = ggml.new_tensor(zeros_type, 1, top_k_3d.ne[0], top_k_3d.ne[1], top_k_3d.ne[2])
        zeros = ggml.fill(zeros, 0.0)
        kq_mask_top_k = ggml.set_rows(kq_mask_all, zeros, top_k_3d)
        kq_mask_top_k = ggml.view(kq_mask_top_k, (kq_mask_top_k.ne[1], kq_mask_top_k.ne[2], 1, kq_mask_top_k.ne[3]),
                                  (kq_mask_top_k.nb[2], kq_mask_top_k.nb[3], kq_mask_top_k.nb[3]), 0)
        return ggml.add(kq_mask_top_k, kq_mask)

    def build_attn_mha(self, q: Tensor, k: Tensor, v: Tensor, kq_mask: Tensor, kq_scale: float, il: int,
                       sinks: Optional[Tensor] = None, v_mla: Optional[Tensor] = None, n_kv_max: int = 0,
                       kq_b: Optional[Tensor] = None) -> Tensor:
        """build_attn_mha: FLASH_ATTN_EXT, or KQ, softmax, KQV; attention sinks join the softmax;
        v_mla decompresses MLA's values (after FLASH_ATTN_EXT as a matrix product over permuted rows);
        n_kv_max: the keys a top-k mask leaves (sparse attention), 0 for a dense mask; a KQ bias
        (kq_b) is added before the softmax and turns flash attention off for this attention."""
        hp = self.hparams
        v_trans = v.nb[1] > v.nb[2]
        n_stream = k.ne[3]
        q = ggml.view(q, (q.ne[0], q.ne[1], q.ne[2] // n_stream, n_stream),
                      (q.nb[1], q.nb[2], q.nb[2] * (q.ne[2] // n_stream)), 0)
        q = ggml.permute(q, 0, 2, 1, 3)
        k = ggml.permute(k, 0, 2, 1, 3)
        v = ggml.permute(v, 0, 2, 1, 3)
        if self.cparams.flash_attn and kq_b is None:
            if v_trans:
                v = ggml.transpose(v)
            if k.type == ggml.T.F32:
                k = ggml.cast(k, ggml.T.F16)
            if v.type == ggml.T.F32:
                v = ggml.cast(v, ggml.T.F16)
            cur = ggml.flash_attn_ext(q, k, v, kq_mask, kq_scale, hp.f_max_alibi_bias,
                                      hp.f_attn_logit_softcapping if hp.attn_soft_cap else 0.0, n_kv_max)
            self.fused_nodes.append((LLM_FUSED_OP_FLASH_ATTN, cur, il))
            if sinks is not None:   # ggml_flash_attn_ext_add_sinks
                cur.src.append(sinks)
            if v_mla is not None:
                cur = ggml.permute(cur, 0, 2, 1, 3)
                cur = self.mul_mat_no_lora(v_mla, cur)
                self.cb(cur, "fattn_mla", il)
                cur = ggml.cont(ggml.permute(cur, 0, 2, 1, 3))
            cur = ggml.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = ggml.mul_mat(k, q)
            self.cb(kq, "kq", il)
            if hp.arch == "grok":   # attn_output_multiplier, then 30 * tanh(kq / 30) (build_attn_mha)
                kq = ggml.unary(ggml.scale(kq, hp.f_attn_out_scale * c_reciprocal(hp.f_attn_logit_softcapping)), "TANH")
                self.cb(kq, "kq_tanh", il)
                kq = ggml.scale(kq, hp.f_attn_logit_softcapping)
                self.cb(kq, "kq_scaled", il)
            if hp.attn_soft_cap:
                kq = ggml.scale(kq, c_reciprocal(hp.f_attn_logit_softcapping))
                self.cb(kq, "kq_scaled_1", il)
                kq = ggml.unary(kq, "TANH")
                self.cb(kq, "kq_tanh", il)
                kq = ggml.scale(kq, hp.f_attn_logit_softcapping)
                self.cb(kq, "kq_scaled_2", il)
            if kq_b is not None:
                kq = ggml.add(kq, kq_b)
                self.cb(kq, "kq_plus_kq_b", il)
            kq = ggml.soft_max_ext(kq, kq_mask, kq_scale, hp.f_max_alibi_bias)
            if sinks is not None:   # ggml_soft_max_add_sinks
                kq.src.append(sinks)
            self.cb(kq, "kq_soft_max", il)
            if not v_trans:
                v = ggml.cont(ggml.transpose(v))
                self.cb(v, "v_cont", il)
            kqv = ggml.mul_mat(v, kq)
            self.cb(kqv, "kqv", il)
            if v_mla is not None:
                kqv = self.mul_mat_no_lora(v_mla, kqv)
                self.cb(kqv, "kqv_mla", il)
            cur = ggml.permute(kqv, 0, 2, 1, 3)
            cur = ggml.cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
            if not self.cparams.offload_kqv:
                self.pin_cpu(cur)
        ggml.build_forward_expand(self.gf, cur)
        return cur

    def build_output(self, cur: Tensor, softcap: Optional[float] = None, h_nextn: bool = False,
                     logit_scale: Optional[float] = None, out_ids: Optional[Tensor] = None,
                     norm: str = LLM_NORM_RMS, output_scale: Optional[float] = None,
                     name_no_bias: bool = False, lora: bool = True) -> None:
        """The tail most builders share: output_norm of the norm type, with its bias if any
        (result_norm, t_embd), the lm_head, its bias if any, final logit softcapping, Granite's
        logit scale (1/logit_scale) or Command-R's (times output_scale) if any (result_output,
        t_logits), expanded into the graph.
        h_nextn: the normed state is also kept for multi-token prediction (t_h_nextn).
        out_ids: the output rows are picked after the norm (embeddings_nextn_masked is false).
        name_no_bias: the product before the bias is named result_output_no_bias (phi2, phi3).
        lora: the lm_head through build_lora_mm; False: a plain ggml_mul_mat, which no LoRA adapter
        reaches (deepseek2.cpp, deepseek32.cpp, bailingmoe3.cpp, dots3note.cpp, kimi-linear.cpp)."""
        cur = self.build_norm(cur, self.model.output_norm, self.model.output_norm_b, norm, -1)
        if h_nextn:
            self.cb(cur, "h_nextn", -1)
            self.t_h_nextn = cur
        if out_ids is not None:
            cur = ggml.get_rows(cur, out_ids)
        self.cb(cur, "result_norm", -1)
        self.t_embd = cur
        cur = self.build_lora_mm(self.model.output, cur) if lora else self.mul_mat_no_lora(self.model.output, cur)
        if self.model.output_b is not None:
            if name_no_bias:
                self.cb(cur, "result_output_no_bias", -1)
            cur = ggml.add(cur, self.model.output_b)
        if softcap is not None:
            cur = ggml.scale(ggml.unary(ggml.scale(cur, c_reciprocal(softcap)), "TANH"), softcap)
        if logit_scale is not None:
            cur = ggml.scale(cur, c_reciprocal(logit_scale))
        if output_scale is not None:
            cur = ggml.scale(cur, output_scale)
        self.cb(cur, "result_output", -1)
        self.t_logits = cur
        ggml.build_forward_expand(self.gf, cur)

    def build_pooling(self) -> None:
        """build_pooling (llama_model::build_graph adds it after every architecture's graph): with
        embeddings, t_embd pooled by the context's pooling type into t_embd_pooled; rank runs the
        classification head."""
        if not self.cparams.embeddings:
            return
        model, hp, inp = self.model, self.hparams, self.t_embd
        if inp is None:
            raise GGMLAbort("llama.cpp would abort building the graph (build_pooling GGML_ASSERT: missing "
                            "result_norm/result_embd tensor)")
        pooling = self.cparams.pooling_type
        if pooling == LLAMA_POOLING_TYPE_NONE:
            cur = inp
        elif pooling == LLAMA_POOLING_TYPE_MEAN or (pooling == LLAMA_POOLING_TYPE_RANK
                                                    and hp.pooling_type_cls == LLAMA_POOLING_TYPE_MEAN):
            cur = ggml.mul_mat(ggml.cont(ggml.transpose(inp)), self.build_inp_mean())
        elif pooling in (LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_LAST, LLAMA_POOLING_TYPE_RANK):
            cur = ggml.get_rows(inp, self.build_inp_cls())
        else:
            raise GGMLAbort(f"llama.cpp would abort building the graph (build_pooling: GGML_ABORT unknown pooling "
                            f"type {pooling})")
        if pooling == LLAMA_POOLING_TYPE_RANK:
            if model.cls is not None:   # the classification head
                cur = self.mul_mat_no_lora(model.cls, cur)
                if model.cls_b is not None:
                    cur = ggml.add(cur, model.cls_b)
                cur = ggml.unary(cur, "GELU" if hp.arch == "modern-bert" else "TANH")
                if model.cls_norm is not None:
                    cur = self.build_norm(cur, model.cls_norm, None, LLM_NORM, -1)
            if model.cls_out is not None:
                cur = self.mul_mat_no_lora(model.cls_out, cur)
                if model.cls_out_b is not None:
                    cur = ggml.add(cur, model.cls_out_b)
            if hp.arch in ("qwen3", "qwen3vl"):   # the qwen3 reranker's softmax
                cur = ggml.soft_max(cur)
        self.cb(cur, "result_embd_pooled", -1)
        self.t_embd_pooled = cur
        ggml.build_forward_expand(self.gf, cur)

    def build_dense_out(self) -> None:
        """build_dense_out: with embeddings, sentence-transformers' dense projections after pooling."""
        model = self.model
        dense_2, dense_2_b, dense_3 = model.dense_2_out_layers, model.dense_2_out_layers_b, model.dense_3_out_layers
        if not self.cparams.embeddings or (dense_2 is None and dense_2_b is None and dense_3 is None):
            return
        cur = self.t_embd_pooled if self.t_embd_pooled is not None else self.t_embd
        if cur is None:
            raise GGMLAbort("llama.cpp would abort building the graph (build_dense_out GGML_ASSERT: missing "
                            "t_embd_pooled/t_embd)")
        if dense_2 is not None:
            cur = ggml.mul_mat(dense_2, cur)
        if dense_2_b is not None:
            cur = ggml.add(cur, dense_2_b)
        if dense_3 is not None:
            cur = ggml.mul_mat(dense_3, cur)
        self.cb(cur, "result_embd_pooled", -1)
        self.t_embd_pooled = cur
        ggml.build_forward_expand(self.gf, cur)

    def set_outputs(self) -> None:
        """llm_graph_result::set_outputs"""
        for t in (self.t_logits, self.t_embd, self.t_embd_pooled, self.t_h_nextn):
            if t is not None:
                t.set_output()
        for il in sorted(set(self.cparams.embeddings_layer_inp)):
            if il not in self.t_layer_inp:
                raise GGMLAbort(f"the graph does not record the input of layer {il} (GGML_ASSERT: layer input "
                                f"tensor is null)")
            self.t_layer_inp[il].set_output()


def c_reciprocal(x: float) -> float:
    """1.0f / x as C computes it: a softcapping of 0 in a header gives inf, and llama.cpp still
    builds (and reserves) the graph with it."""
    return math.copysign(math.inf, x) if x == 0.0 else 1.0 / x


def build_situ(gate: Tensor, up: Tensor, beta: float, linear_beta: float) -> Tensor:
    """situ(gate, up) = beta tanh(gate / beta) sigmoid(gate) * linear_beta tanh(up / linear_beta), the
    up branch as it is when linear_beta <= 0 (build_moe_ffn's LLM_FFN_SITU, kimi-k3.cpp's kimi_k3_situ)."""
    act = ggml.scale(ggml.unary(ggml.scale(gate, c_reciprocal(beta)), "TANH"), beta)
    act = ggml.mul(act, ggml.unary(gate, "SIGMOID"))
    if linear_beta > 0.0:
        up = ggml.scale(ggml.unary(ggml.scale(up, c_reciprocal(linear_beta)), "TANH"), linear_beta)
    return ggml.mul(act, up)


def mul_mat_hadamard(cur: Tensor, rot: Tensor) -> Tensor:
    """llama_mul_mat_hadamard (src/llama-impl.h)"""
    n = rot.ne[0]
    if cur.nelements() % n != 0:   # ggml_reshape_2d's GGML_ASSERT(ggml_nelements(a) == ne0*ne1)
        raise GGMLAbort(f"llama.cpp would abort (ggml_reshape_2d GGML_ASSERT): {cur.nelements()} values of "
                        f"'{cur.name}' do not split into rows of its {n}x{n} Hadamard rotation")
    if not cur.is_contiguous():
        res = ggml.cont(cur, n, cur.nelements() // n)
    else:
        res = ggml.reshape(cur, n, cur.nelements() // n)
    res = ggml.mul_mat(rot, res)
    res.op_params = (0, ggml.GGML_HINT_SRC0_IS_HADAMARD)
    return ggml.reshape(res, *cur.ne)


def kq_scale_for(hparams, n_embd_head: int) -> float:
    """The builders' usual scale: attention.scale when the header sets it, else 1/sqrt(head size)."""
    return 1.0 / math.sqrt(n_embd_head) if hparams.f_attention_scale == 0.0 else hparams.f_attention_scale
