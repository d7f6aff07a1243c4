"""LLM_ARCH_NANBEIGE (src/models/nanbeige.cpp): Nanbeige4 (looped).

The llama block (optional rope_freqs), its physical layers run num_loops times: the loops share
the weights, each logical layer has its own KV cache; between loops the hidden state is normed by
output_norm unless skip_loop_final_norm.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext, kq_scale_for
from ..hparams import LLAMA_MAX_LAYERS, LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    n_loops = ml.get_u32("%s.num_loops", 1)
    require(ml, n_loops >= 1, f"{ml.key('%s.num_loops')} is 0 (GGML_ASSERT(n_loops_u >= 1))")
    hp.skip_loop_final_norm = ml.get_bool("%s.skip_loop_final_norm", False)
    n_layer_phys = hp.n_layer
    require(ml, n_layer_phys * n_loops <= LLAMA_MAX_LAYERS,
            f"{n_layer_phys} layers times {ml.key('%s.num_loops')} {n_loops} is above LLAMA_MAX_LAYERS "
            f"({LLAMA_MAX_LAYERS})")
    hp.n_layer_phys, hp.n_loops = n_layer_phys, n_loops
    # expand the logical layer count before the layers and the KV cache are made: layer i + j * phys
    # repeats layer i's sizes (n_head_arr, n_head_kv_arr, n_ff_arr, is_swa_impl, is_recr_impl)
    if n_loops > 1:
        n_layer_all = n_layer_phys * n_loops

        def expand(arr: tuple, fill) -> tuple:
            out = list(arr[:n_layer_all]) + [fill] * (n_layer_all - len(arr))
            for j in range(1, n_loops):
                for i in range(n_layer_phys):
                    out[i + j * n_layer_phys] = out[i]
            return tuple(out)

        hp.n_head_arr, hp.n_head_kv_arr = expand(hp.n_head_arr, 0), expand(hp.n_head_kv_arr, 0)
        hp.n_ff_arr = expand(hp.n_ff_arr, 0)
        hp.is_swa_arr, hp.is_recr_arr = expand(hp.is_swa_arr, False), expand(hp.is_recr_arr, False)
        hp.n_layer_all = n_layer_all
        hp.n_layer = n_layer_all - hp.n_layer_nextn
    # the graph's GGML_ASSERT (n_rot is free: rope turns the first n_rot of each head)
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the nanbeige graph needs equal head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_head_k, n_rot = hp.n_embd, hp.n_vocab, hp.n_embd_head_k(), hp.n_rot()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    n_phys = hp.n_layer_phys
    for i in range(n_phys):
        layer = model.layers[i]
        n_q, n_ff = n_embd_head_k * hp.n_head(i), hp.n_ff(i)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (n_rot // 2,),
                                           TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
    # the loops share the physical weights; each slot keeps its own KV index
    for j in range(1, hp.n_loops):
        for i in range(n_phys):
            model.layers[i + j * n_phys] = model.layers[i]


def build(g: GraphContext) -> None:
    """llama_model_nanbeige::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    n_phys, n_loops = hp.n_layer_phys, hp.n_loops
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    kq_scale = kq_scale_for(hp, n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        g.t_layer_inp[il] = inp_l
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur
        if n_loops > 1 and (il + 1) % n_phys == 0 and il + 1 < hp.n_layer and not hp.skip_loop_final_norm:
            cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "loop_norm", il)
            inp_l = cur

    g.build_output(inp_l)
