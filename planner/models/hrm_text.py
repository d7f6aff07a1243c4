"""LLM_ARCH_HRM_TEXT (src/models/hrm-text.cpp): DFM Mimir (HRM-Text).

Two transformer stacks of layers_per_stack layers, a low one (blocks 0..lps-1) and a high one
(blocks lps..2*lps-1), run alternately over the same tokens: per high cycle, l_cycles passes of the
low stack on zH + zL (zL starting from the learned hrm.z_l_init), then one of the high stack on
zH + zL. Every pass has its own KV cache slots (block_count is layers_per_stack * h_cycles *
(l_cycles + 1)); the later passes reuse the first passes' weights. Weightless RMS norms, a
sigmoid gate on the attention output before wo, a final weightless norm per stack, no output norm.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import Tensor
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_embedding_scale = ml.get_f32("%s.embedding_scale", 0.0)
    hp.n_hrm_layers_per_stack = ml.get_u32("%s.hrm.layers_per_stack")
    hp.n_hrm_h_cycles = ml.get_u32("%s.hrm.h_cycles")
    hp.n_hrm_l_cycles = ml.get_u32("%s.hrm.l_cycles")
    ml.get_bool("%s.hrm.prefix_lm", False)   # read as llama.cpp does; prefix-LM prefill is not implemented there
    for key, value in (("layers_per_stack", hp.n_hrm_layers_per_stack), ("h_cycles", hp.n_hrm_h_cycles),
                       ("l_cycles", hp.n_hrm_l_cycles)):
        require(ml, value > 0, f"{ml.key('%s.hrm.' + key)} is 0")
    # the GGUF block count is the expanded cache-slot count
    n_slot = hp.n_hrm_layers_per_stack * hp.n_hrm_h_cycles * (hp.n_hrm_l_cycles + 1)
    require(ml, hp.n_layer == n_slot,
            f"{ml.key('%s.block_count')} is {hp.n_layer}, not layers_per_stack * h_cycles * (l_cycles + 1) = {n_slot}")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_head_k()
    n_q = n_embd_head_k * hp.n_head()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    model.hrm_z_l_init = c.create_tensor(tn("HRM_Z_L_INIT", None, 0), (n_embd,))
    lps, l_cycles = hp.n_hrm_layers_per_stack, hp.n_hrm_l_cycles
    # blocks [0, lps) hold the low stack, [lps, 2 * lps) the high one; the first low and high passes
    # create the layers, the later passes alias them
    l_first, h_first = 0, l_cycles * lps
    for h in range(hp.n_hrm_h_cycles):
        for l in range(l_cycles + 1):
            slot_base = (h * (l_cycles + 1) + l) * lps
            blk_base = lps if l == l_cycles else 0
            if h > 0 or 0 < l < l_cycles:
                src_base = h_first if l == l_cycles else l_first
                for il in range(lps):
                    model.layers[slot_base + il] = model.layers[src_base + il]
                continue
            for il in range(lps):
                layer, bid = model.layers[slot_base + il], blk_base + il
                c.create_tensor_qkv(layer, bid, n_embd, n_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
                layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", bid), (n_embd, n_q))
                layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", bid), (n_q, n_embd))
                layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", bid), (n_embd, n_ff))
                layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", bid), (n_ff, n_embd))
                layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", bid), (n_embd, n_ff))


def build_stack(g: GraphContext, inp_attn, inp_pos: Tensor, cur: Tensor, slot_base: int) -> Tensor:
    """llama_model_hrm_text::graph::build_stack: lps pre-norm layers, then the weightless final norm."""
    hp = g.hparams
    n_embd_head_k = hp.n_embd_head_k()
    kq_scale = 1.0 / math.sqrt(n_embd_head_k)
    for il in range(hp.n_hrm_layers_per_stack):
        s = slot_base + il
        layer = g.model.layers[s]
        inp_sa = cur
        cur = g.build_norm(cur, None, None, LLM_NORM_RMS, s)
        g.cb(cur, "attn_norm", s)
        gate = g.build_lora_mm(layer.wqkv_gate, cur)
        g.cb(gate, "attn_gate_proj", s)
        q, k, v = g.build_qkv(layer, cur, n_embd_head_k, hp.n_head(), hp.n_head_kv(), s)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", s)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(k, "Kcur", s)
        cur = g.build_attn(inp_attn, None, None, q, k, v, kq_scale, s)   # wo after the gate
        g.cb(cur, "attn_pregate", s)
        gate = ggml.unary(gate, "SIGMOID")
        g.cb(gate, "attn_gate_sigmoid", s)
        cur = ggml.mul(cur, gate)
        g.cb(cur, "attn_gated", s)
        cur = g.build_lora_mm(layer.wo, cur)
        g.cb(cur, "attn_out", s)
        cur = ggml.add(cur, inp_sa)
        g.cb(cur, "attn_add", s)
        inp_sa = cur
        cur = g.build_norm(cur, None, None, LLM_NORM_RMS, s)
        g.cb(cur, "ffn_norm", s)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, s)
        g.cb(cur, "ffn_out", s)
        cur = ggml.add(cur, inp_sa)
        g.cb(cur, "ffn_add", s)
        cur = g.build_cvec(cur, s)
        g.cb(cur, "l_out", s)
    cur = g.build_norm(cur, None, None, LLM_NORM_RMS, slot_base)
    g.cb(cur, "stack_norm", slot_base)
    return cur


def build(g: GraphContext) -> None:
    """llama_model_hrm_text::graph"""
    model, hp = g.model, g.hparams
    lps, l_cycles = hp.n_hrm_layers_per_stack, hp.n_hrm_l_cycles
    z_h = g.build_inp_embd(model.tok_embd)   # scaled by embedding_scale there
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()
    # the learned low-cycle state is [n_embd]; the adds broadcast it over the tokens
    z_l = model.hrm_z_l_init
    for h in range(hp.n_hrm_h_cycles):
        for l in range(l_cycles):
            z_l = build_stack(g, inp_attn, inp_pos, ggml.add(z_h, z_l), (h * (l_cycles + 1) + l) * lps)
        z_h = build_stack(g, inp_attn, inp_pos, ggml.add(z_h, z_l), (h * (l_cycles + 1) + l_cycles) * lps)
    cur = ggml.get_rows(z_h, inp_out_ids)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
