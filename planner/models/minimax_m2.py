"""LLM_ARCH_MINIMAX_M2 (src/models/minimax-m2.cpp): MiniMax-M2, MiniMax-M2.1 (230B-A10B).

olmoe's attention (QK norms over all heads, applied before the reshape) with GQA and partial NEOX
rope (head 128, n_rot 64), then routed experts only: sigmoid gating (from the header) with a
selection bias, normalised weights, no shared expert.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require, require_gating_func
from ..model_loader import ModelLoader, tn
from .olmoe import build_attn_qk_norm_flat

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    # no assert in llama.cpp: without experts build_moe_ffn reads cur_experts[0], a null tensor
    require(ml, hp.n_expert > 0, f"the {ml.arch} graph needs experts ({ml.key('%s.expert_count')} is 0)")
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0)
    require_gating_func(ml, hp)   # build_moe_ffn aborts on NONE, the value where the key is absent
    # the graph asserts it; not n_rot, which is half the head (its comment: head_dim 128, n_rot 64)
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the minimax-m2 graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_gqa, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_embd_v_gqa(), hp.n_embd_head_k()
    n_expert, n_ff = hp.n_expert, hp.n_ff()   # the experts are sized by feed_forward_length (n_ff)
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * hp.n_head(), n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * hp.n_head(), n_embd))
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k * hp.n_head(),))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (hp.n_embd_k_gqa(),))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))
        layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,))


def build(g: GraphContext) -> None:
    """llama_model_minimax_m2::graph"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        g.t_layer_inp[il] = inp_l
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        cur = build_attn_qk_norm_flat(g, layer, cur, inp_pos, inp_attn, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                              layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True,
                              hp.expert_weights_scale, hp.expert_gating_func, il)
        g.cb(cur, "ffn_moe_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
