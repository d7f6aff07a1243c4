"""LLM_ARCH_MAMBA (src/models/mamba.cpp): Mamba-1 (state-spaces/mamba 130M to 2.8B, FalconMamba),
attention-free.

Every layer is recurrent (llama_memory_recurrent): a conv state of d_conv-1 inputs of d_inner
channels and an SSM state of d_state x d_inner per sequence. The graph (llama_model_mamba::graph)
is mamba2's too: build_mamba_layer or build_mamba2_layer of mamba-base.cpp by the architecture.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Layer, Model, TensorCreator
from ..model_loader import ModelLoader, tn
from .mamba_base import build_mamba2_layer, build_mamba_layer

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_mamba_hparams(ml, hp)
    hp.ssm_dt_b_c_rms = ml.get_bool("%s.ssm.dt_b_c_rms", False)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.is_recr_arr = (True,) * hp.n_layer     # llm_arch_is_recurrent


def load_mamba_hparams(ml: ModelLoader, hp: HParams) -> None:
    """The ssm.* keys of a Mamba-1 layer (mamba, jamba)."""
    hp.ssm_d_conv = ml.get_u32("%s.ssm.conv_kernel")
    hp.ssm_d_inner = ml.get_u32("%s.ssm.inner_size")
    hp.ssm_d_state = ml.get_u32("%s.ssm.state_size")
    hp.ssm_dt_rank = ml.get_u32("%s.ssm.time_step_rank")


def check_expansion(c: TensorCreator) -> None:
    """load_arch_tensors: 'only an expansion factor of 2 is supported for now'."""
    hp = c.hparams
    if 2 * hp.n_embd != hp.ssm_d_inner:
        c.ml.fail(f"{c.ml.key('%s.ssm.inner_size')} is {hp.ssm_d_inner}, not twice the embedding length "
                  f"{hp.n_embd}: llama.cpp supports only an expansion factor of 2")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    check_expansion(c)
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (hp.n_embd, hp.n_vocab))
    c.create_output(model, hp.n_embd, hp.n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (hp.n_embd,))
        load_mamba_tensors(c, layer, i)


def load_mamba_tensors(c: TensorCreator, layer: Layer, i: int, with_norms: bool = False) -> None:
    """A Mamba-1 layer's tensors; with_norms: jamba's dt/B/C RMS norms."""
    hp = c.hparams
    n_embd, d_conv, d_inner, d_state, dt_rank = hp.n_embd, hp.ssm_d_conv, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank
    layer.ssm_in = c.create_tensor(tn("SSM_IN", "weight", i), (n_embd, 2 * d_inner))
    layer.ssm_conv1d = c.create_tensor(tn("SSM_CONV1D", "weight", i), (d_conv, d_inner))
    layer.ssm_conv1d_b = c.create_tensor(tn("SSM_CONV1D", "bias", i), (d_inner,))
    layer.ssm_x = c.create_tensor(tn("SSM_X", "weight", i), (d_inner, dt_rank + 2 * d_state))
    if with_norms:
        layer.ssm_dt_norm = c.create_tensor(tn("SSM_DT_NORM", "weight", i), (dt_rank,))
    layer.ssm_dt = c.create_tensor(tn("SSM_DT", "weight", i), (dt_rank, d_inner))
    layer.ssm_dt_b = c.create_tensor(tn("SSM_DT", "bias", i), (d_inner,))
    if with_norms:
        layer.ssm_b_norm = c.create_tensor(tn("SSM_B_NORM", "weight", i), (d_state,))
        layer.ssm_c_norm = c.create_tensor(tn("SSM_C_NORM", "weight", i), (d_state,))
    layer.ssm_a = c.create_tensor(tn("SSM_A", None, i), (d_state, d_inner))
    layer.ssm_d = c.create_tensor(tn("SSM_D", None, i), (d_inner,))
    layer.ssm_out = c.create_tensor(tn("SSM_OUT", "weight", i), (d_inner, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_mamba::graph (mamba and mamba2)"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    rs_inp = g.build_rs_inp()
    inp_out_ids = g.build_inp_out_ids()
    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        if hp.arch == "mamba2":
            cur = build_mamba2_layer(g, rs_inp, cur, il)
        else:
            cur = build_mamba_layer(g, rs_inp, cur, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        cur = ggml.add(cur, inp_l)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur
    g.build_output(inp_l)
