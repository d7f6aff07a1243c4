"""LLM_ARCH_KIMI_K3 (src/models/kimi-k3.cpp): Kimi-K3.

kimi-linear's hybrid of Kimi Delta Attention (KDA, recurrent state) and multi-head latent
attention without rope (K-only cache), with five differences: cross-layer attention residuals
(every attn_res_block_size layers the residual stream is banked and restarted; each sublayer's
input is a softmax-weighted mix of the bank and the current stream, the bank summed by the fused
DSV4_HC_PRE op), a latent MoE (the routed experts run on a down-projected input, their sum normed
and projected back up; the router scores the full-width input), the situ activation in place of
SwiGLU, a sigmoid output gate on the MLA layers, and a full-rank KDA output gate (ssm_g). Without
a lower bound the decay gate is kimi-linear's softplus; with one, bound * sigmoid.
"""
from __future__ import annotations

import math
from typing import Optional

from .. import ggml
from ..ggml import GGMLAbort, Tensor
from ..graph import LLM_FFN_SITU, LLM_NORM_RMS, GraphContext, RSInput, build_situ
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Layer, Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .delta_net import build_gdn_l2_norm, build_recurrent_attn
from .kimi_linear import _create_4d_or_3d, causal_conv1d

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla")
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla")
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank", 0)
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.ssm_d_conv = ml.get_u32("%s.ssm.conv_kernel")
    hp.n_embd_head_kda = ml.get_u32("%s.kda.head_dim")
    hp.kda_gate_lower_bound = ml.get_f32("%s.kda.gate_lower_bound", float("-inf"))
    # the MLA cache holds the compressed latent (older GGUFs have no value_length key)
    hp.n_embd_head_v_full = hp.n_lora_kv
    # the KDA layers are the trunk layers without KV heads
    hp.is_recr_arr = tuple(hp.n_head_kv(il) == 0 for il in range(hp.n_layer))
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    hp.n_expert_latent = ml.get_u32("%s.expert_latent_length", 0)
    hp.attn_res_block_size = ml.get_u32("%s.attn_res.block_size")
    hp.situ_beta = ml.get_f32("%s.activation.situ_beta")
    hp.situ_linear_beta = ml.get_f32("%s.activation.situ_linear_beta")
    require_gating_func(ml, hp)
    # no asserts in llama.cpp: an empty head or kernel is a negative view, no experts a null tensor
    if any(hp.is_recr_arr):
        require(ml, hp.n_embd_head_kda > 0, f"{ml.key('%s.kda.head_dim')} is 0 with KDA layers")
        require(ml, hp.ssm_d_conv > 0, f"{ml.key('%s.ssm.conv_kernel')} is 0 with KDA layers")
    if hp.n_layer_dense_lead < hp.n_layer:
        require(ml, hp.n_expert > 0, f"the {ml.arch} graph needs experts ({ml.key('%s.expert_count')} is 0)")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    n_embd_latent = hp.n_expert_latent if hp.n_expert_latent > 0 else n_embd
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    if hp.attn_res_block_size > 0:
        model.output_res_score = c.create_tensor(tn("OUTPUT_RES_SCORE", "weight"), (n_embd,))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        if hp.attn_res_block_size > 0:
            layer.attn_res_score = c.create_tensor(tn("ATTN_RES_SCORE", "weight", i), (n_embd,))
            layer.ffn_res_score = c.create_tensor(tn("FFN_RES_SCORE", "weight", i), (n_embd,))
        if hp.is_recr(i):
            load_kda_tensors(c, layer, i)
        else:
            load_mla_tensors(c, layer, i)
        if i < hp.n_layer_dense_lead:
            n_ff = hp.n_ff()
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
            continue
        n_ff_exp, n_expert = hp.n_ff_exp(), hp.n_expert
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,))
        # the routed experts live in the latent space
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd_latent, n_ff_exp, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd_latent, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd_latent, n_ff_exp, n_expert))
        if hp.n_expert_latent > 0:
            layer.ffn_routed_down = c.create_tensor(tn("FFN_ROUTED_DOWN", "weight", i), (n_embd, n_embd_latent))
            layer.ffn_routed_up = c.create_tensor(tn("FFN_ROUTED_UP", "weight", i), (n_embd_latent, n_embd))
            layer.ffn_routed_norm = c.create_tensor(tn("FFN_ROUTED_NORM", "weight", i), (n_embd_latent,),
                                                    TENSOR_NOT_REQUIRED)
        # the shared experts stay at n_embd
        n_ff_shexp = n_ff_exp * (hp.n_expert_shared if hp.n_expert_shared > 0 else 1)
        layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp),
                                               TENSOR_NOT_REQUIRED)
        layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd),
                                               TENSOR_NOT_REQUIRED)
        layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp),
                                             TENSOR_NOT_REQUIRED)


def load_kda_tensors(c: TensorCreator, layer: Layer, i: int) -> None:
    hp = c.hparams
    n_embd, n_head, head_dim, d_conv = hp.n_embd, hp.n_head(), hp.n_embd_head_kda, hp.ssm_d_conv
    d_inner = head_dim * n_head
    layer.ssm_q_conv = _create_4d_or_3d(c, "SSM_CONV1D_Q", i, (d_conv, 1, d_inner))
    layer.ssm_k_conv = _create_4d_or_3d(c, "SSM_CONV1D_K", i, (d_conv, 1, d_inner))
    layer.ssm_v_conv = _create_4d_or_3d(c, "SSM_CONV1D_V", i, (d_conv, 1, d_inner))
    c.create_tensor_qkv(layer, i, n_embd, d_inner, d_inner, d_inner)
    layer.ssm_f_a = c.create_tensor(tn("SSM_F_A", "weight", i), (n_embd, head_dim))
    layer.ssm_f_b = c.create_tensor(tn("SSM_F_B", "weight", i), (head_dim, d_inner))
    layer.ssm_beta = c.create_tensor(tn("SSM_BETA", "weight", i), (n_embd, n_head))
    # K3's A_log is a plain 1-D [n_head] tensor, -exp(A_log) already
    layer.ssm_a = c.create_tensor(tn("SSM_A_NOSCAN", None, i), (n_head,))
    layer.ssm_dt_b = c.create_tensor(tn("SSM_DT", "bias", i), (d_inner,))
    # one full-rank gate instead of kimi-linear's g_a/g_b pair
    layer.ssm_g = c.create_tensor(tn("SSM_G", "weight", i), (n_embd, d_inner))
    layer.ssm_o_norm = c.create_tensor(tn("SSM_NORM", "weight", i), (head_dim,))
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (d_inner, n_embd))


def load_mla_tensors(c: TensorCreator, layer: Layer, i: int) -> None:
    hp = c.hparams
    n_embd, n_head = hp.n_embd, hp.n_head()
    q_lora_rank, kv_lora_rank = hp.n_lora_q, hp.n_lora_kv
    n_embd_head_k, n_embd_head_v = hp.n_embd_head_k_mla(), hp.n_embd_head_v_mla()
    qk_rope_head_dim = hp.n_rot()
    qk_nope_head_dim = n_embd_head_k - qk_rope_head_dim
    layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,), TENSOR_NOT_REQUIRED)
    layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,))
    if layer.attn_q_a_norm is not None:
        layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank))
        layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head * n_embd_head_k))
    else:
        layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd, n_head * n_embd_head_k))
    layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + qk_rope_head_dim))
    layer.wkv_b = c.create_tensor(tn("ATTN_KV_B", "weight", i),
                                  (kv_lora_rank, n_head * (qk_nope_head_dim + n_embd_head_v)), TENSOR_NOT_REQUIRED)
    if layer.wkv_b is None:
        layer.wk_b = c.create_tensor(tn("ATTN_K_B", "weight", i), (qk_nope_head_dim, kv_lora_rank, n_head))
        layer.wv_b = c.create_tensor(tn("ATTN_V_B", "weight", i), (kv_lora_rank, n_embd_head_v, n_head))
    # K3's sigmoid output gate on the attention output, before attn_output
    layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, n_head * n_embd_head_v),
                                      TENSOR_NOT_REQUIRED)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_v, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_kimi_k3::graph: per layer the attention residual mix, attention (KDA or MLA), the
    FFN residual mix, the FFN (dense situ on the leading layers, else the latent MoE), each
    sublayer's output summed into the running prefix; a final mix, the output rows, norm and head."""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    inp_l = g.build_inp_embd(model.tok_embd)
    g.cb(inp_l, "inp_embd", -1)
    inp = g.build_inp_mem_hybrid_k() if hp.is_mla() else g.build_inp_mem_hybrid()
    inp_out_ids = g.build_inp_out_ids()
    res = AttnResiduals(g, hp.attn_res_block_size)
    require_both_kinds(hp, "MLA")

    for il, layer in enumerate(model.layers):
        # the residual stream, banked on checkpoint layers and then restarted from the attention output alone
        prefix_sum = inp_l
        cur = res.mix(prefix_sum, layer.attn_res_score, il)
        banked = res.use and il % res.block_size == 0
        if banked:
            res.push(prefix_sum, n_tokens)
        cur = g.build_norm(cur, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        ggml.build_forward_expand(g.gf, cur)
        if hp.is_recr(il):
            cur = build_kda(g, inp.rs, layer, cur, il)
        else:
            cur = build_mla(g, inp.attn, layer, cur, il)
        prefix_sum = cur if banked else ggml.add(prefix_sum, cur)
        g.cb(prefix_sum, "prefix_sum_attn", il)
        cur = res.mix(prefix_sum, layer.ffn_res_score, il)
        cur = g.build_norm(cur, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if il < hp.n_layer_dense_lead:
            cur = build_situ(g.mul_mat_no_lora(layer.ffn_gate, cur), g.mul_mat_no_lora(layer.ffn_up, cur), hp.situ_beta,
                             hp.situ_linear_beta)
            cur = g.mul_mat_no_lora(layer.ffn_down, cur)
            g.cb(cur, "ffn_out", il)
        else:
            cur = build_latent_moe(g, layer, cur, il)
        prefix_sum = ggml.add(prefix_sum, cur)
        prefix_sum = g.build_cvec(prefix_sum, il)
        g.cb(prefix_sum, "l_out", il)
        inp_l = prefix_sum

    cur = res.mix(inp_l, model.output_res_score, -1)
    cur = ggml.get_rows(cur, inp_out_ids)
    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.mul_mat_no_lora(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


class AttnResiduals:
    """graph::res_push / res_mix: the bank of checkpoints [n_embd, n_ckpt, n_tokens] (resi_stack)."""

    def __init__(self, g: GraphContext, block_size: int):
        self.g, self.block_size = g, block_size
        self.use = block_size > 0
        self.stack: Optional[Tensor] = None

    def push(self, cur: Tensor, n_tokens: int) -> None:
        """Append a checkpoint, never re-folding the chain."""
        ckpt = ggml.reshape(cur, self.g.hparams.n_embd, 1, n_tokens)
        self.stack = ckpt if self.stack is None else ggml.concat(self.stack, ckpt, 1)

    def mix(self, cur: Tensor, score_w: Optional[Tensor], il: int) -> Tensor:
        """The checkpoints and the current stream scored by the RMS norms of their values times
        score_w, softmax-weighted: the bank summed by DSV4_HC_PRE, the current stream by a MUL
        (nothing banked yet, or no residual mixing: the stream as it is)."""
        if not self.use or self.stack is None:
            return cur
        g, src = self.g, self.stack
        n_ckpt, n_tokens, eps = src.ne[1], cur.ne[1], g.hparams.f_norm_rms_eps
        sc_src = ggml.sum_rows(ggml.mul(ggml.rms_norm(src, eps), score_w))
        sc_src = ggml.reshape(sc_src, n_ckpt, n_tokens)
        sc_cur = ggml.sum_rows(ggml.mul(ggml.rms_norm(cur, eps), score_w))
        probs = ggml.soft_max(ggml.concat(sc_src, sc_cur, 0))
        g.cb(probs, "res_probs", il)
        p_src = ggml.cont(ggml.view(probs, (n_ckpt, n_tokens), (probs.nb[1],), 0))
        p_cur = ggml.cont(ggml.view(probs, (1, n_tokens), (probs.nb[1],), probs.nb[0] * n_ckpt))
        return ggml.add(ggml.dsv4_hc_pre(src, p_src), ggml.mul(cur, p_cur))


def require_both_kinds(hp: HParams, attn_kind: str) -> None:
    """llm_graph_input_mem_hybrid*::set_input fills both halves' inputs at every decode (reserving
    never does): a model of KDA layers only, or attention layers only, leaves the other half's input
    in no graph, with no buffer, and llama.cpp aborts at its first decode."""
    n_kda = sum(hp.is_recr(il) for il in range(hp.n_layer))
    if n_kda in (0, hp.n_layer):
        unused = f"the KQ mask (no {attn_kind} layer)" if n_kda else "the recurrent state's s_copy (no KDA layer)"
        raise GGMLAbort("llama.cpp would abort at the first decode (ggml-backend.cpp GGML_ASSERT(buffer) in "
                        f"llm_graph_input_mem_hybrid's set_input): {unused} is in no graph, so no buffer holds it")


def build_kda(g: GraphContext, inp: RSInput, layer: Layer, cur: Tensor, il: int, low_rank_gate: bool = False) -> Tensor:
    """graph::build_kda_layer: kimi-linear's conv'd Q/K/V, the decay gate (bound * sigmoid with a
    lower bound, else softplus) times A, beta, the L2-normed delta rule over the layer's state, the
    RMS-normed output gated by sigmoid(ssm_g(x)), the output projection. GLM5-Next's KDA layer
    (glm5-next.cpp build_kda_layer) is the same with kimi-linear's low-rank gate g_b(g_a(x))."""
    hp, ub = g.hparams, g.ubatch
    n_head, head_dim = hp.n_head(), hp.n_embd_head_kda
    d_inner = n_head * head_dim
    n_seqs, n_tokens = ub.n_seqs, ub.n_tokens
    n_seq_tokens = n_tokens // n_seqs
    if layer.wq is None:
        raise GGMLAbort(f"llama.cpp would crash (a null pointer): the KDA layer {il} projects Q, K and V with "
                        f"blk.{il}.attn_q/k/v, and the file has a fused attn_qkv instead")
    mem = inp.mem
    kv_head = mem.get_head()
    conv_states_all = mem.r_l[il]
    conv_state_all = g.build_rs(inp, conv_states_all, hp.n_embd_r(), n_seqs)
    # kimi_k3_conv1d is kimi-linear's causal_conv1d when no rollback states are kept (n_rs_seq 0)
    q = causal_conv1d(g, conv_states_all, conv_state_all, 0, cur, layer.wq, layer.ssm_q_conv, kv_head)
    k = causal_conv1d(g, conv_states_all, conv_state_all, 1, cur, layer.wk, layer.ssm_k_conv, kv_head)
    v = causal_conv1d(g, conv_states_all, conv_state_all, 2, cur, layer.wv, layer.ssm_v_conv, kv_head)
    g.cb(q, "kda_q_conv", il)
    g.cb(k, "kda_k_conv", il)
    g.cb(v, "kda_v_conv", il)

    g1 = ggml.add(g.mul_mat_no_lora(layer.ssm_f_b, g.mul_mat_no_lora(layer.ssm_f_a, cur)), layer.ssm_dt_b)
    a = ggml.reshape(layer.ssm_a, 1, n_head, 1)
    if hp.kda_gate_lower_bound > float("-inf"):
        g1 = ggml.mul(ggml.reshape(g1, head_dim, n_head, n_tokens), a)
        g1 = ggml.scale(ggml.unary(ggml.scale(g1, -1.0), "SIGMOID"), hp.kda_gate_lower_bound)
    else:
        g1 = ggml.mul(ggml.reshape(ggml.unary(g1, "SOFTPLUS"), head_dim, n_head, n_tokens), a)
    g.cb(g1, "kda_g1", il)
    g1 = ggml.reshape(g1, head_dim, n_head, n_seq_tokens, n_seqs)
    beta = ggml.reshape(g.mul_mat_no_lora(layer.ssm_beta, cur), 1, n_head, n_seq_tokens, n_seqs)
    beta = ggml.unary(beta, "SIGMOID")
    g.cb(beta, "kda_beta", il)

    ssm_states_all = mem.s_l[il]
    state = g.build_rs(inp, ssm_states_all, hp.n_embd_s(), n_seqs)
    state = ggml.reshape(state, head_dim, head_dim, n_head, n_seqs)
    q = build_gdn_l2_norm(q, hp.f_norm_rms_eps)
    k = build_gdn_l2_norm(k, hp.f_norm_rms_eps)
    output = ggml.cont(build_recurrent_attn(g, inp, ssm_states_all, q, k, v, g1, beta, state, il))
    g.cb(output, "kda_scan_out", il)

    if low_rank_gate:
        g2 = g.mul_mat_no_lora(layer.ssm_g_b, g.mul_mat_no_lora(layer.ssm_g_a, cur))
    else:
        cur_3d = ggml.reshape(cur, cur.ne[0], n_seq_tokens, n_seqs)
        g2 = g.mul_mat_no_lora(layer.ssm_g, ggml.reshape(cur_3d, cur_3d.ne[0], n_seq_tokens * n_seqs))
    g2 = ggml.reshape(g2, head_dim, n_head, n_tokens)
    o = ggml.reshape(output, head_dim, n_head, n_tokens)
    normed = g.build_norm(o, layer.ssm_o_norm, None, LLM_NORM_RMS, il)
    g.cb(g2, "kda_g2", il)
    g.cb(normed, "kda_normed", il)
    gated = ggml.cont(ggml.mul(normed, ggml.unary(g2, "SIGMOID")), d_inner, n_tokens)
    cur = g.mul_mat_no_lora(layer.wo, gated)
    g.cb(cur, "kda_out", il)
    return cur


def build_mla(g: GraphContext, inp, layer: Layer, cur: Tensor, il: int) -> Tensor:
    """graph::build_mla_layer (K-only cache): Q through the optional Q LoRA, the latent and its
    norm, the absorption by attn_k_b (no rope), the attention decompressed by attn_v_b, the
    output gated by sigmoid(attn_gate(x)) of the normed layer input, then attn_output."""
    hp = g.hparams
    n_head, n_tokens = hp.n_head(), g.ubatch.n_tokens
    n_embd_head_k_mla, kv_lora_rank = hp.n_embd_head_k_mla(), hp.n_lora_kv
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k_mla - n_embd_head_qk_rope
    kq_scale = 1.0 / math.sqrt(n_embd_head_k_mla)
    if layer.wkv_b is not None:   # the MHA path over a K/V cache, for a file that keeps attn_kv_b whole
        if hp.is_mla():
            raise GGMLAbort(f"llama.cpp would crash (a null pointer): blk.{il}.attn_kv_b.weight takes the MHA path, "
                            f"whose K/V cache input is not built beside the K-only cache of key_length_mla")
        raise NotImplementedError(f"kimi-k3's MHA path over an unsplit blk.{il}.attn_kv_b.weight (the converter "
                                  f"splits it into attn_k_b and attn_v_b)")
    if not hp.is_mla():
        raise GGMLAbort(f"llama.cpp would crash (a null pointer): the MLA layer {il} reads the K-only cache input, "
                        f"which is not built without key_length_mla and value_length_mla")
    inp_gate = cur
    if layer.wq_a is not None:
        q = g.mul_mat_no_lora(layer.wq_b, g.build_norm(g.mul_mat_no_lora(layer.wq_a, cur), layer.attn_q_a_norm, None,
                                                  LLM_NORM_RMS, il))
    else:
        q = g.mul_mat_no_lora(layer.wq, cur)
    kv_cmpr_pe = g.mul_mat_no_lora(layer.wkv_a_mqa, cur)
    row = ggml.row_size(kv_cmpr_pe.type, kv_lora_rank + n_embd_head_qk_rope)
    kv_cmpr = ggml.view(kv_cmpr_pe, (kv_lora_rank, n_tokens), (row,), 0)
    k_pe = ggml.view(kv_cmpr_pe, (n_embd_head_qk_rope, 1, n_tokens), (row, row),
                     ggml.row_size(kv_cmpr_pe.type, kv_lora_rank))
    kv_cmpr = g.build_norm(kv_cmpr, layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)
    q_row = ggml.row_size(q.type, n_embd_head_k_mla)
    q_nope = ggml.view(q, (n_embd_head_qk_nope, n_head, n_tokens), (q_row, q_row * n_head), 0)
    q_pe = ggml.view(q, (n_embd_head_qk_rope, n_head, n_tokens), (q_row, q_row * n_head),
                     ggml.row_size(q.type, n_embd_head_qk_nope))
    q_nope_absorbed = ggml.permute(g.mul_mat_no_lora(layer.wk_b, ggml.permute(q_nope, 0, 2, 1, 3)), 0, 2, 1, 3)
    q_cur = ggml.concat(q_nope_absorbed, q_pe, 0)
    kv_cmpr_3d = ggml.reshape(kv_cmpr, kv_lora_rank, 1, n_tokens)
    k_cur = ggml.concat(kv_cmpr_3d, k_pe, 0)
    out = g.build_attn(inp, None, None, q_cur, k_cur, kv_cmpr_3d, kq_scale, il, v_mla=layer.wv_b)
    if layer.wqkv_gate is not None:
        out = ggml.mul(out, ggml.unary(g.mul_mat_no_lora(layer.wqkv_gate, inp_gate), "SIGMOID"))
        g.cb(out, "mla_gated", il)
    out = g.mul_mat_no_lora(layer.wo, out)
    g.cb(out, "mla_out", il)
    return out


def build_latent_moe(g: GraphContext, layer: Layer, cur: Tensor, il: int) -> Tensor:
    """graph::build_latent_moe: the router scores the full-width input, the routed situ experts run
    on its down-projection; their sum is normed and projected back up; the shared situ experts read
    the full-width input."""
    hp = g.hparams
    identity = cur
    routed_in = g.mul_mat_no_lora(layer.ffn_routed_down, cur) if layer.ffn_routed_down is not None else cur
    logits = g.mul_mat_no_lora(layer.ffn_gate_inp, identity)
    g.cb(logits, "ffn_moe_logits", il)
    moe_out = g.build_moe_ffn(routed_in, None, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                              layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(), LLM_FFN_SITU,
                              hp.expert_weights_norm, hp.expert_weights_scale, hp.expert_gating_func, il,
                              probs_in=logits)
    g.cb(moe_out, "ffn_moe_out", il)
    if layer.ffn_routed_norm is not None:
        moe_out = g.build_norm(moe_out, layer.ffn_routed_norm, None, LLM_NORM_RMS, il)
    if layer.ffn_routed_up is not None:
        moe_out = g.mul_mat_no_lora(layer.ffn_routed_up, moe_out)
    if layer.ffn_gate_shexp is not None:
        if layer.ffn_up_shexp is None or layer.ffn_down_shexp is None:
            raise GGMLAbort(f"llama.cpp would crash (a null pointer): blk.{il}.ffn_gate_shexp.weight without "
                            f"ffn_up_shexp and ffn_down_shexp")
        sh = build_situ(g.mul_mat_no_lora(layer.ffn_gate_shexp, identity), g.mul_mat_no_lora(layer.ffn_up_shexp, identity),
                        hp.situ_beta, hp.situ_linear_beta)
        sh = g.mul_mat_no_lora(layer.ffn_down_shexp, sh)
        g.cb(sh, "ffn_shexp", il)
        moe_out = ggml.add(moe_out, sh)
    g.cb(moe_out, "ffn_out", il)
    return moe_out
