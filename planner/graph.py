"""llm_graph_context: the shared graph builders of src/llama-graph.cpp used by the supported archs.

Each builder creates tensors in the same order, with the same names (cb: "%s-%d"), srcs and
build_forward_expand calls as llama.cpp, because node order decides the allocator's offsets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from schedplan.planner import ggml
from schedplan.planner.cparams import CParams
from schedplan.planner.ggml import Cgraph, Tensor
from schedplan.planner.kv_cache import KVCache
from schedplan.planner.model import Model



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
    """llm_graph_input_attn_kv"""
    k_idxs: Tensor
    v_idxs: Tensor
    kq_mask: Tensor
    k_rot: Optional[Tensor]
    v_rot: Optional[Tensor]


@dataclass
class GraphContext:
    model: Model
    cparams: CParams
    kv: KVCache
    ubatch: Ubatch
    n_kv: int
    # graph_get_cb's backend pinning: pin(tensor, il) for "norm" and "l_last" (llama-context.cpp:2635)
    pin: Callable[[Tensor, int], None]
    # build_attn_mha without offload_kqv: ggml_backend_sched_set_tensor_backend(cur, backend_cpu)
    pin_cpu: Callable[[Tensor], None]
    gf: Cgraph = field(default_factory=Cgraph)
    t_logits: Optional[Tensor] = None
    t_embd: Optional[Tensor] = None
    fused_flash_attn: list[tuple[Tensor, int]] = field(default_factory=list)   # res->add_fused_node

    @property
    def hparams(self):
        return self.model.hparams

    def cb(self, cur: Tensor, name: str, il: int) -> None:
        set_name(cur, f"{name}-{il}" if il >= 0 else name)
        if il != -1 and name in ("norm", "l_last"):
            self.pin(cur, il)

    # --- inputs ----------------------------------------------------------------------------------

    def build_inp_embd(self, tok_embd: Tensor) -> Tensor:
        n_tokens = self.ubatch.n_tokens
        tokens = ggml.new_tensor(ggml.T.I32, n_tokens)
        self.cb(tokens, "inp_tokens", -1)
        tokens.set_input()
        embd = ggml.new_tensor(ggml.T.F32, self.hparams.n_embd, n_tokens)
        self.cb(embd, "inp_embd", -1)
        embd.set_input()
        rows = ggml.get_rows(tok_embd, tokens)
        cur = ggml.build_forward_select(self.gf, [rows, embd], 0)   # ubatch.token != nullptr
        self.cb(cur, "embd", -1)
        ggml.build_forward_expand(self.gf, cur)
        return cur

    def build_inp_pos(self) -> Tensor:
        cur = ggml.new_tensor(ggml.T.I32, self.ubatch.n_tokens)
        cur.set_input()
        self.cb(cur, "inp_pos", -1)
        return cur

    def build_inp_out_ids(self) -> Tensor:
        cur = ggml.new_tensor(ggml.T.I32, self.ubatch.n_outputs)
        cur.set_input()
        set_name(cur, "out_ids")
        return cur

    def build_attn_inp_kv(self) -> AttnInput:
        """build_attn_inp_kv_impl + build_attn_inp_kq_mask"""
        n_tokens = self.ubatch.n_tokens
        k_idxs = self.kv.build_input_k_idxs(n_tokens)
        v_idxs = self.kv.build_input_v_idxs(n_tokens)
        n_stream = 1 if self.cparams.kv_unified else self.ubatch.n_seqs_unq
        mask_type = ggml.T.F16 if self.cparams.flash_attn else ggml.T.F32
        mask = ggml.new_tensor(mask_type, self.n_kv, n_tokens // n_stream, 1, n_stream)
        mask.set_input()
        set_name(mask, "attn_inp_kq_mask")
        return AttnInput(k_idxs, v_idxs, mask, self.kv.build_input_k_rot(), self.kv.build_input_v_rot())

    # --- layers ----------------------------------------------------------------------------------

    def build_lora_mm(self, w: Tensor, cur: Tensor) -> Tensor:
        return ggml.mul_mat(w, cur)

    def build_norm(self, cur: Tensor, mw: Optional[Tensor], il: int) -> Tensor:
        """LLM_NORM_RMS without bias"""
        cur = ggml.rms_norm(cur, self.hparams.f_norm_rms_eps)
        if mw is not None:
            self.cb(cur, "norm", il)
            cur = ggml.mul(cur, mw)
        return cur

    def build_qkv(self, layer, cur: Tensor, n_embd_head: int, n_head: int, n_head_kv: int, il: int):
        """The separate Q/K/V path of build_qkv with reshape."""
        n_tokens = self.ubatch.n_tokens
        q = self._proj(layer.wq, layer.wq_b, cur, "Qcur", il)
        k = self._proj(layer.wk, layer.wk_b, cur, "Kcur", il)
        v = self._proj(layer.wv, layer.wv_b, cur, "Vcur", il)
        q = ggml.reshape(q, n_embd_head, n_head, n_tokens)
        k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
        v = ggml.reshape(v, n_embd_head, n_head_kv, n_tokens)
        self.cb(q, "Qcur", il)
        self.cb(k, "Kcur", il)
        self.cb(v, "Vcur", il)
        return q, k, v

    def _proj(self, w: Tensor, b: Optional[Tensor], cur: Tensor, name: str, il: int) -> Tensor:
        x = self.build_lora_mm(w, cur)
        self.cb(x, name, il)
        if b is not None:
            x = ggml.add(x, b)
            self.cb(x, name, il)
        return x

    def build_ffn_silu_par(self, layer, cur: Tensor, il: int) -> Tensor:
        """build_ffn with LLM_FFN_SILU, LLM_FFN_PAR (gate and up in parallel, swiglu, down)."""
        tmp = self.build_lora_mm(layer.ffn_up, cur)
        self.cb(tmp, "ffn_up", il)
        if layer.ffn_up_b is not None:
            tmp = ggml.add(tmp, layer.ffn_up_b)
            self.cb(tmp, "ffn_up_b", il)
        cur = self.build_lora_mm(layer.ffn_gate, cur)
        self.cb(cur, "ffn_gate", il)
        if layer.ffn_gate_b is not None:
            cur = ggml.add(cur, layer.ffn_gate_b)
            self.cb(cur, "ffn_gate_b", il)
        cur = ggml.glu_split(cur, tmp, ggml.GLU_SWIGLU)
        self.cb(cur, "ffn_swiglu", il)
        cur = self.build_lora_mm(layer.ffn_down, cur)
        if layer.ffn_down_b is not None:
            self.cb(cur, "ffn_down", il)
            cur = ggml.add(cur, layer.ffn_down_b)
        return cur

    # --- attention -------------------------------------------------------------------------------

    def build_attn(self, inp: AttnInput, wo: Tensor, wo_b: Optional[Tensor], q_cur: Tensor, k_cur: Tensor,
                   v_cur: Tensor, kq_scale: float, il: int) -> Tensor:
        """build_attn(llm_graph_input_attn_kv *, ...)"""
        if inp.k_rot is not None:
            q_cur = mul_mat_hadamard(q_cur, inp.k_rot)
            k_cur = mul_mat_hadamard(k_cur, inp.k_rot)
        if inp.v_rot is not None:
            v_cur = mul_mat_hadamard(v_cur, inp.v_rot)
        ggml.build_forward_expand(self.gf, q_cur)
        ggml.build_forward_expand(self.gf, v_cur)
        ggml.build_forward_expand(self.gf, k_cur)
        ggml.build_forward_expand(self.gf, self.kv.cpy_k(k_cur, inp.k_idxs, il))
        ggml.build_forward_expand(self.gf, self.kv.cpy_v(v_cur, inp.v_idxs, il))
        k = self.kv.get_k(il, self.n_kv)
        v = self.kv.get_v(il, self.n_kv)
        cur = self.build_attn_mha(q_cur, k, v, inp.kq_mask, kq_scale, il)
        self.cb(cur, "kqv_out", il)
        if inp.v_rot is not None:
            cur = mul_mat_hadamard(cur, inp.v_rot)
        cur = self.build_lora_mm(wo, cur)
        if wo_b is not None:
            cur = ggml.add(cur, wo_b)
        return cur

    def build_attn_mha(self, q: Tensor, k: Tensor, v: Tensor, kq_mask: Tensor, kq_scale: float, il: int) -> Tensor:
        v_trans = v.nb[1] > v.nb[2]
        n_stream = k.ne[3]
        q = ggml.view(q, (q.ne[0], q.ne[1], q.ne[2] // n_stream, n_stream),
                      (q.nb[1], q.nb[2], q.nb[2] * (q.ne[2] // n_stream)), 0)
        q = ggml.permute(q, 0, 2, 1, 3)
        k = ggml.permute(k, 0, 2, 1, 3)
        v = ggml.permute(v, 0, 2, 1, 3)
        if self.cparams.flash_attn:
            if v_trans:
                v = ggml.transpose(v)
            if k.type == ggml.T.F32:
                k = ggml.cast(k, ggml.T.F16)
            if v.type == ggml.T.F32:
                v = ggml.cast(v, ggml.T.F16)
            cur = ggml.flash_attn_ext(q, k, v, kq_mask, kq_scale, 0.0, 0.0)
            self.fused_flash_attn.append((cur, il))
            cur = ggml.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = ggml.mul_mat(k, q)
            self.cb(kq, "kq", il)
            kq = ggml.soft_max_ext(kq, kq_mask, kq_scale, 0.0)
            self.cb(kq, "kq_soft_max", il)
            if not v_trans:
                v = ggml.cont(ggml.transpose(v))
                self.cb(v, "v_cont", il)
            kqv = ggml.mul_mat(v, kq)
            self.cb(kqv, "kqv", il)
            cur = ggml.permute(kqv, 0, 2, 1, 3)
            cur = ggml.cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
            if not self.cparams.offload_kqv:
                self.pin_cpu(cur)
        ggml.build_forward_expand(self.gf, cur)
        return cur

    def set_outputs(self) -> None:
        """llm_graph_result::set_outputs"""
        for t in (self.t_logits, self.t_embd):
            if t is not None:
                t.set_output()


def mul_mat_hadamard(cur: Tensor, rot: Tensor) -> Tensor:
    """llama_mul_mat_hadamard (src/llama-impl.h)"""
    n = rot.ne[0]
    if not cur.is_contiguous():
        res = ggml.cont(cur, n, cur.nelements() // n)
    else:
        res = ggml.reshape(cur, n, cur.nelements() // n)
    res = ggml.mul_mat(rot, res)
    res.op_params = (0, ggml.GGML_HINT_SRC0_IS_HADAMARD)
    return ggml.reshape(res, *cur.ne)


def kq_scale_for(hparams, n_embd_head: int) -> float:
    return 1.0 / math.sqrt(n_embd_head) if hparams.f_attention_scale == 0.0 else hparams.f_attention_scale
