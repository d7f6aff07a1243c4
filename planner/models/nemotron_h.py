"""LLM_ARCH_NEMOTRON_H (src/models/nemotron-h.cpp): NVIDIA Nemotron-H and Nemotron Nano v2, dense.

Each block is one of: Mamba-2 (no KV heads, no FFN size), attention without rope (KV heads, no FFN
size) or a squared-ReLU MLP (an FFN size, no KV heads); llama_memory_hybrid keeps only the first
two kinds (create_memory's nemotron_h filters), the MLP blocks hold no memory.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_RELU_SQR, LLM_NORM_RMS, GraphContext, kq_scale_for
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn
from .mamba2 import build_mamba2_layer, load_mamba2_tensors, load_ssm_hparams

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_ssm_hparams(ml, hp)
    hp.is_recr_arr = tuple(hp.n_head_kv(il) == 0 and hp.n_ff(il) == 0 for il in range(hp.n_layer))
    hp.attn_only_arr = tuple(not hp.is_recr(il) and hp.n_ff(il) == 0 for il in range(hp.n_layer))
    hp.ffn_only_arr = tuple(not hp.is_recr(il) and hp.n_ff(il) != 0 for il in range(hp.n_layer))
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon", hp.f_norm_eps)
    if hp.n_expert > 0:
        ml.fail(f"{ml.key('%s.expert_count')}: Nemotron-H with experts (latent MoE, router logits given to "
                "build_moe_ffn) is not planned yet")
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


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
        if hp.is_recr(i):
            load_mamba2_tensors(c, layer, i, conv_bias_flags=TENSOR_NOT_REQUIRED)
        elif hp.n_ff(i) == 0:
            n_q = hp.n_embd_head_k() * hp.n_head(i)
            c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i))
            layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
            layer.wo_b = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        else:
            n_ff = hp.n_ff(i)
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
            layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
            layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_nemotron_h::graph (embeddings_nextn_masked false, no layer inputs extracted)"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    ggml.build_forward_expand(g.gf, inp_l)
    inp = g.build_inp_mem_hybrid()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        if hp.is_recr(il):
            cur = build_mamba2_layer(g, inp.rs, cur, il)
        elif hp.n_ff(il) == 0:
            q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
            cur = g.build_attn(inp.attn, layer.wo, layer.wo_b, q, k, v, kq_scale_for(hp, n_embd_head), il)
            g.cb(cur, "attn_out", il)
        else:
            cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, None, None, layer.ffn_down, layer.ffn_down_b,
                              LLM_FFN_RELU_SQR, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
            g.cb(cur, "l_out", il)
        cur = ggml.add(cur, inp_l)
        g.cb(cur, "nemotron_h_block_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "h_nextn", -1)
    g.t_h_nextn = cur
    cur = ggml.get_rows(cur, inp_out_ids)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
