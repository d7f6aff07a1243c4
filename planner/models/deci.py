"""LLM_ARCH_DECI (src/models/deci.cpp): DeciLM-7B, Llama-3.1-Nemotron-51B, Llama-3.1-Nemotron-Ultra-253B
(the NAS-pruned Llama 3.1 family).

The llama block with per-layer query and KV head counts and FFN widths: a layer without KV heads
but with heads replaces attention by one linear projection (wo), a layer without heads skips
attention (the FFN reads the layer input, without a residual add), and a layer with an FFN width
of 0 skips its FFN and, as deci.cpp's `continue` does, its output too (the next layer reads the
same input). llama3 rope_freqs or longrope factors where present; the lm_head is tied unless present.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext, kq_scale_for
from ..hparams import LLAMA_ROPE_SCALING_TYPE_LONGROPE, LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # layers without KV heads (linear or no attention) and without FFN are part of the design: the
    # checks of head counts and FFN widths skip them
    hp.ffn_only_arr = tuple(hp.n_head_kv(il) == 0 for il in range(hp.n_layer_all))
    hp.attn_only_arr = tuple(hp.n_ff(il) == 0 for il in range(hp.n_layer_all))
    # the graph asserts n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_head_k, n_rot = hp.n_embd, hp.n_vocab, hp.n_embd_head_k(), hp.n_rot()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        n_head, n_head_kv, n_ff = hp.n_head(i), hp.n_head_kv(i), hp.n_ff(i)
        if n_head_kv == 0 and n_head > 0:   # "linear attention"
            layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
            layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        elif n_head_kv > 0:
            layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
            c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * n_head, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i))
            layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * n_head, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        if n_ff > 0:
            layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        flags = TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0)
        if hp.rope_scaling_type_train == LLAMA_ROPE_SCALING_TYPE_LONGROPE:
            layer.rope_long = c.create_tensor(tn("ROPE_FACTORS_LONG", "weight", i), (n_rot // 2,), flags)
            layer.rope_short = c.create_tensor(tn("ROPE_FACTORS_SHORT", "weight", i), (n_rot // 2,), flags)
        else:
            layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (n_rot // 2,), flags)
        if n_ff > 0:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_gate_b = c.create_tensor(tn("FFN_GATE", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
        layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_deci::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    kq_scale = kq_scale_for(hp, n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        n_head, n_head_kv, n_ff = hp.n_head(il), hp.n_head_kv(il), hp.n_ff(il)
        if n_head == 0:   # attention-free layer of Llama-3_1-Nemotron-51B
            cur = inp_l
        else:
            cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "attn_norm", il)
        if n_head > 0 and n_head_kv == 0:   # "linear attention" of Llama-3_1-Nemotron-51B
            cur = g.build_lora_mm(layer.wo, cur)
            g.cb(cur, "wo", il)
        elif n_head > 0:
            rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
            q, k, v = g.build_qkv(layer, cur, n_embd_head, n_head, n_head_kv, il)
            q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(q, "Qcur", il)
            g.cb(k, "Kcur", il)
            g.cb(v, "Vcur", il)
            cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        if n_ff == 0:   # FFN-free layer of Llama-3_1-Nemotron-Ultra-253B: deci.cpp's `continue` keeps inpL
            continue
        ffn_inp = cur
        if n_head > 0:
            ffn_inp = ggml.add(cur, inp_sa)
            g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b, layer.ffn_down,
                          layer.ffn_down_b, LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
