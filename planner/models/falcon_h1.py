"""LLM_ARCH_FALCON_H1 (src/models/falcon-h1.cpp): TII Falcon-H1 0.5B to 34B.

Every layer runs GQA attention (NEOX rope) and a Mamba-2 mixer (build_mamba2_layer of
mamba-base.cpp) side by side on the same normed input and adds them, then a SwiGLU FFN; so
llama_memory_hybrid keeps every layer in both the KV cache and the recurrent state (create_memory's
falcon-h1 filters accept every layer).
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext, kq_scale_for
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn
from .mamba2 import load_ssm_hparams
from .mamba_base import build_mamba2_layer

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    load_ssm_hparams(ml, hp)
    hp.is_recr_arr = (True,) * hp.n_layer_all


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd = hp.n_embd
    d_conv, n_group, d_state, d_inner, n_ssm_head = hp.ssm_d_conv, hp.ssm_n_group, hp.ssm_d_state, hp.ssm_d_inner, hp.ssm_dt_rank
    conv_dim = d_inner + 2 * n_group * d_state
    n_head, n_head_kv, n_ff = hp.n_head(0), hp.n_head_kv(0), hp.n_ff(0)
    n_embd_head_k, n_embd_head_v = hp.n_embd_head_k(), hp.n_embd_head_v()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, hp.n_vocab))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, hp.n_vocab), TENSOR_NOT_REQUIRED)
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, hp.n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.ssm_in = c.create_tensor(tn("SSM_IN", "weight", i), (n_embd, d_inner + conv_dim + n_ssm_head))
        layer.ssm_conv1d = c.create_tensor(tn("SSM_CONV1D", "weight", i), (d_conv, conv_dim))
        layer.ssm_conv1d_b = c.create_tensor(tn("SSM_CONV1D", "bias", i), (conv_dim,), TENSOR_NOT_REQUIRED)
        layer.ssm_dt_b = c.create_tensor(tn("SSM_DT", "bias", i), (n_ssm_head,))
        layer.ssm_a = c.create_tensor(tn("SSM_A", None, i), (1, n_ssm_head))
        layer.ssm_d = c.create_tensor(tn("SSM_D", None, i), (1, n_ssm_head))
        layer.ssm_norm = c.create_tensor(tn("SSM_NORM", "weight", i), (d_inner // n_group, n_group), TENSOR_NOT_REQUIRED)
        layer.ssm_out = c.create_tensor(tn("SSM_OUT", "weight", i), (d_inner, n_embd))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * n_head, n_head_kv * n_embd_head_k, n_head_kv * n_embd_head_v)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * n_head, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)   # loaded, never used
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        # the converter names the pre-FFN norm "blk.N.ffn_norm" (FFN_PRE_NORM), without ".weight"
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", None, i), (n_embd,))
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (hp.n_rot() // 2,),
                                           TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_gate_b = c.create_tensor(tn("FFN_GATE", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
        layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_falcon_h1::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp = g.build_inp_mem_hybrid()
    kq_scale = kq_scale_for(hp, n_embd_head)
    inp_out_ids = g.build_inp_out_ids()
    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur-post-rope", il)
        g.cb(k, "Kcur-post-rope", il)
        g.cb(v, "Vcur-post-rope", il)
        attn_out = g.build_attn(inp.attn, layer.wo, None, q, k, v, kq_scale, il)   # attn_output.bias unused
        g.cb(attn_out, "attn_out", il)

        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)   # the same norm again, for the SSM
        g.cb(cur, "ssm_in", il)
        ssm_out = build_mamba2_layer(g, inp.rs, cur, il)
        g.cb(ssm_out, "ssm_out", il)

        cur = ggml.add(attn_out, ssm_out)
        inp_sa = ggml.add(cur, inp_sa)
        g.cb(cur, "layer_out", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = inp_sa
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b, layer.ffn_down,
                          layer.ffn_down_b, LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, inp_sa)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur
    g.build_output(inp_l)
