"""LLM_ARCH_MAMBA2 (src/models/mamba.cpp with build_mamba2_layer of src/models/mamba-base.cpp):
Mamba-2, attention-free.

Every layer is recurrent (llama_memory_recurrent): a conv state of d_conv-1 inputs and an SSM state
of d_state x d_inner per sequence, whatever the context length.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_ssm_hparams(ml, hp)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.is_recr_arr = (True,) * hp.n_layer     # llm_arch_is_recurrent


def load_ssm_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.ssm_d_conv = ml.get_u32("%s.ssm.conv_kernel")
    hp.ssm_d_inner = ml.get_u32("%s.ssm.inner_size")
    hp.ssm_d_state = ml.get_u32("%s.ssm.state_size")
    hp.ssm_dt_rank = ml.get_u32("%s.ssm.time_step_rank")
    hp.ssm_n_group = ml.get_u32("%s.ssm.group_count")
    # build_mamba2_layer's GGML_ASSERTs
    require(ml, hp.ssm_dt_rank > 0 and hp.ssm_d_inner % hp.ssm_dt_rank == 0,
            f"{ml.key('%s.ssm.inner_size')} ({hp.ssm_d_inner}) must be a multiple of {ml.key('%s.ssm.time_step_rank')}")
    require(ml, hp.ssm_n_group > 0 and hp.ssm_d_inner % hp.ssm_n_group == 0,
            f"{ml.key('%s.ssm.inner_size')} ({hp.ssm_d_inner}) must be a multiple of {ml.key('%s.ssm.group_count')}")


def load_mamba2_tensors(c: TensorCreator, layer, i: int, conv_bias_flags: int = 0, flags: int = 0) -> None:
    hp, n_embd = c.hparams, c.hparams.n_embd
    d_inner, n_group, d_state, dt_rank = hp.ssm_d_inner, hp.ssm_n_group, hp.ssm_d_state, hp.ssm_dt_rank
    conv_dim = d_inner + 2 * n_group * d_state
    layer.ssm_in = c.create_tensor(tn("SSM_IN", "weight", i), (n_embd, d_inner + conv_dim + dt_rank), flags)
    layer.ssm_conv1d = c.create_tensor(tn("SSM_CONV1D", "weight", i), (hp.ssm_d_conv, conv_dim), flags)
    layer.ssm_conv1d_b = c.create_tensor(tn("SSM_CONV1D", "bias", i), (conv_dim,), conv_bias_flags)
    layer.ssm_dt_b = c.create_tensor(tn("SSM_DT", "bias", i), (dt_rank,), flags)
    layer.ssm_a = c.create_tensor(tn("SSM_A", None, i), (1, dt_rank), flags)
    layer.ssm_d = c.create_tensor(tn("SSM_D", None, i), (1, dt_rank), flags)
    layer.ssm_norm = c.create_tensor(tn("SSM_NORM", "weight", i), (d_inner // n_group, n_group), flags)
    layer.ssm_out = c.create_tensor(tn("SSM_OUT", "weight", i), (d_inner, n_embd), flags)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        load_mamba2_tensors(c, layer, i)


def build(g: GraphContext) -> None:
    """llama_model_mamba::graph for LLM_ARCH_MAMBA2"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    rs_inp = g.build_rs_inp()
    inp_out_ids = g.build_inp_out_ids()
    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        cur = build_mamba2_layer(g, rs_inp, cur, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        cur = ggml.add(cur, inp_l)
        g.cb(cur, "l_out", il)
        inp_l = cur
    g.build_output(inp_l)


def build_mamba2_layer(g: GraphContext, inp, cur, il: int):
    """llm_build_mamba_base::build_mamba2_layer with n_rs_seq 0 (K = 1 state written per sequence)."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    mem = inp.mem
    kv_head, mem_size = mem.get_head(), mem.size
    d_conv, d_inner, d_state = hp.ssm_d_conv, hp.ssm_d_inner, hp.ssm_d_state
    n_head, n_group = hp.ssm_dt_rank, hp.ssm_n_group
    head_dim = d_inner // n_head
    n_seqs = ub.n_seqs
    n_seq_tokens = ub.n_tokens // n_seqs
    k_slots = 1
    conv_dim = d_inner + 2 * n_group * d_state

    conv_states_all, ssm_states_all = mem.r_l[il], mem.s_l[il]
    state_slots = ssm_states_all.ne[1]
    conv = g.build_rs(inp, conv_states_all, hp.n_embd_r(), n_seqs)
    conv = ggml.reshape(conv, d_conv - 1, conv_dim, n_seqs)

    zxbcdt = g.build_lora_mm(layer.ssm_in, cur)
    zxbcdt = ggml.reshape(zxbcdt, zxbcdt.ne[0], n_seq_tokens, n_seqs)
    es = ggml.type_size(zxbcdt.type)
    z = ggml.view(zxbcdt, (head_dim, n_head, n_seq_tokens, n_seqs), (head_dim * zxbcdt.nb[0], zxbcdt.nb[1], zxbcdt.nb[2]), 0)
    xbc = ggml.view(zxbcdt, (conv_dim, n_seq_tokens, n_seqs), (zxbcdt.nb[1], zxbcdt.nb[2]), d_inner * es)
    dt = ggml.view(zxbcdt, (n_head, n_seq_tokens, n_seqs), (zxbcdt.nb[1], zxbcdt.nb[2]), (2 * d_inner + 2 * n_group * d_state) * es)

    conv_x = ggml.concat(conv, ggml.transpose(xbc), 0)
    row_count = (d_conv - 1) * conv_dim
    row_size = ggml.row_size(conv_states_all.type, row_count)
    for slot in range(min(n_seq_tokens, k_slots)):
        last_conv = ggml.view(conv_x, (d_conv - 1, conv_dim, n_seqs), (conv_x.nb[1], conv_x.nb[2]),
                              (n_seq_tokens - slot) * conv_x.nb[0])
        dst = ggml.view(conv_states_all, (row_count, n_seqs), (conv_states_all.nb[1],), (slot * mem_size + kv_head) * row_size)
        ggml.build_forward_expand(g.gf, ggml.cpy(last_conv, dst))
    xbc = ggml.ssm_conv(conv_x, layer.ssm_conv1d)
    xbc = ggml.add(xbc, layer.ssm_conv1d_b)
    xbc = ggml.unary(xbc, "SILU")

    es = ggml.type_size(xbc.type)
    x = ggml.view(xbc, (head_dim, n_head, n_seq_tokens, n_seqs), (head_dim * xbc.nb[0], xbc.nb[1], xbc.nb[2]), 0)
    b = ggml.view(xbc, (d_state, n_group, n_seq_tokens, n_seqs), (d_state * xbc.nb[0], xbc.nb[1], xbc.nb[2]), d_inner * es)
    c = ggml.view(xbc, (d_state, n_group, n_seq_tokens, n_seqs), (d_state * xbc.nb[0], xbc.nb[1], xbc.nb[2]),
                  (d_inner + n_group * d_state) * es)
    dt = ggml.add(ggml.cont(dt), layer.ssm_dt_b)

    def get_ssm_rows(states, ids):
        ssm = ggml.reshape(states, d_state, head_dim, n_head, state_slots)
        return ggml.ssm_scan(ssm, x, dt, layer.ssm_a, b, c, ids, k_slots)

    y_ssm = g.build_rs(inp, ssm_states_all, hp.n_embd_s(), n_seqs, get_ssm_rows)
    d = d_state * d_inner
    n_written = min(n_seq_tokens, k_slots)
    row_size = ggml.row_size(ssm_states_all.type, d)
    y_row_size = ggml.row_size(y_ssm.type, d)
    state_offset = x.nelements() * ggml.type_size(x.type)
    src = ggml.view(y_ssm, (d, n_seqs, n_written), (y_row_size, y_row_size * n_seqs), state_offset)
    dst = ggml.view(ssm_states_all, (d, n_seqs, n_written), (ssm_states_all.nb[1], mem_size * row_size), kv_head * row_size)
    ggml.build_forward_expand(g.gf, ggml.cpy(src, dst))

    y = ggml.view(y_ssm, (head_dim, n_head, n_seq_tokens, n_seqs), (x.nb[1], n_head * x.nb[1], n_seq_tokens * n_head * x.nb[1]), 0)
    y = ggml.add(y, ggml.mul(x, layer.ssm_d))
    g.cb(y, "mamba2_y_add_d", il)
    y = ggml.glu_split(ggml.cont(z), y, ggml.GLU_SWIGLU)
    if layer.ssm_norm is not None:   # grouped RMS norm
        y = ggml.reshape(y, d_inner // n_group, n_group, n_seq_tokens, n_seqs)
        y = g.build_norm(y, layer.ssm_norm, None, LLM_NORM_RMS, il)
    y = ggml.reshape(y, d_inner, n_seq_tokens * n_seqs)
    cur = g.build_lora_mm(layer.ssm_out, y)
    g.cb(cur, "mamba_out", il)
    return cur
