"""LLM_ARCH_GROVEMOE (src/models/grovemoe.cpp): GroveMoE-Base, GroveMoE-Inst (33B-A3B).

Qwen3-MoE's attention (per-head QK norms, NEOX rope) with two expert sets from one router: the
experts (softmax-weighted, selected by the sigmoid of the logits), then the "chunk" experts, one per
group of experts, selected by the same router (expert ids divided by the group size) and run on the
first experts' output, added to it scaled by expert_group_scale.
"""
from __future__ import annotations


from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require, require_head_sizes_equal
from ..model_loader import ModelLoader, tn
from .qwen3 import build_attn_qk_norm

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_ff_chexp = ml.get_u32("%s.expert_chunk_feed_forward_length", 0)
    hp.expert_group_scale = ml.get_f32("%s.expert_group_scale")
    hp.n_group_experts = ml.get_u32("%s.experts_per_group")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    require_head_sizes_equal(ml, hp)   # the graph's GGML_ASSERTs


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_expert_used = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_expert_used()
    n_embd_head_k, n_embd_gqa, n_ff = hp.n_embd_head_k(), hp.n_embd_v_gqa(), hp.n_ff()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    require(c.ml, n_expert > 0, "n_expert must be > 0 for GROVEMOE")
    require(c.ml, n_expert_used > 0, "n_expert_used must be > 0 for GROVEMOE")
    require(c.ml, hp.n_group_experts > 0, "n_group_experts must be > 0 for GROVEMOE")
    n_ff_exp = hp.n_ff_exp() or n_ff // n_expert_used
    n_ff_chexp = hp.n_ff_chexp or n_embd_head_k
    n_chunk_expert = n_expert // hp.n_group_experts
    for i, layer in enumerate(model.layers):
        n_embd_q = n_embd_head_k * hp.n_head()
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_q, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_gate_chexps = c.create_tensor(tn("FFN_GATE_CHEXPS", "weight", i), (n_embd, n_ff_chexp, n_chunk_expert))
        layer.ffn_down_chexps = c.create_tensor(tn("FFN_DOWN_CHEXPS", "weight", i), (n_ff_chexp, n_embd, n_chunk_expert))
        layer.ffn_up_chexps = c.create_tensor(tn("FFN_UP_CHEXPS", "weight", i), (n_embd, n_ff_chexp, n_chunk_expert))


def build(g: GraphContext) -> None:
    """llama_model_grovemoe::graph"""
    model, hp = g.model, g.hparams
    n_chunk_expert = hp.n_expert // hp.n_group_experts
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        cur = build_attn_qk_norm(g, layer, cur, inp_pos, inp_attn, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)

        probs = g.build_lora_mm(layer.ffn_gate_inp, cur)
        g.cb(probs, "ffn_moe_logits", il)
        moe_out = g.build_moe_ffn(cur, None, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps, None,
                                  hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il, probs_in=probs)
        g.cb(moe_out, "ffn_moe_out", il)
        cur = moe_out
        # the chunk experts run on the experts' output (llama.cpp passes cur after the first call)
        moe_out = g.build_moe_ffn(cur, None, layer.ffn_up_chexps, layer.ffn_gate_chexps, layer.ffn_down_chexps, None,
                                  n_chunk_expert, min(hp.n_expert_used(), n_chunk_expert), LLM_FFN_SILU, True,
                                  hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il, probs_in=probs)
        g.cb(moe_out, "ffn_adj_moe_out", il)
        cur = ggml.add(cur, ggml.scale(moe_out, hp.expert_group_scale))
        g.cb(cur, "ffn_final_moe_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
