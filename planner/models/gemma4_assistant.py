"""LLM_ARCH_GEMMA4_ASSISTANT (src/models/gemma4-assistant.cpp): the Gemma 4 assistant, an MTP drafter
in a file of its own (llama-server --spec-type draft-mtp -md FILE).

Its blocks are all NextN layers (nextn_predict_layers = block_count): Q-only attention over its
target's K/V cache (llama_kv_cache_iswa over mem_other, create_memory), fed the target's token
embedding and hidden state. Its graph reads the target's token_embd and its cache the target's
memory through ctx_other, which llama_context requires for this architecture ("Gemma4Assistant
requires ctx_other to be set"): llama.cpp creates its context only beside the target, and so does the
plan (create_context(..., ctx_other=target)); alone it is refused in one line. common_fit_params
measures the draft alone, fails there and fits the model without it, as `fit` does.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_GELU, LLM_FFN_PAR, LLM_NORM_RMS, GraphContext
from ..gguf import BOOL, INT32, UINT32
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_embd_inp_impl = hp.n_embd_out()   # embedding_length_out: the target's width
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    key = "%s.attention.sliding_window_pattern"
    if not ml.is_array(key):
        ml.fail(f"array key not found in model: {ml.key(key)}")
    flags = ml.get_arr(key, (BOOL, UINT32, INT32))
    hp.is_swa_arr = tuple(il < len(flags) and flags[il] != 0 for il in range(hp.n_layer_all))
    ml.get_u32("%s.attention.shared_kv_layers", 0)   # read (its type checked) into a local llama.cpp leaves unused
    hp.f_attention_scale = 1.0
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train_swa)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_embd_head_k_swa = ml.get_u32("%s.attention.key_length_swa")
    hp.n_embd_head_v_swa = ml.get_u32("%s.attention.value_length_swa")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp, ml = model.hparams, c.ml
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    if hp.n_embd_head_k() != hp.n_embd_head_v():
        ml.fail("Gemma 4 assistant requires n_embd_head_k == n_embd_head_v")
    if hp.n_embd_head_k_swa != hp.n_embd_head_v_swa:
        ml.fail("Gemma 4 assistant requires n_embd_head_k_swa == n_embd_head_v_swa")
    if hp.n_embd_inp() == n_embd:   # n_embd_out()
        ml.fail("Gemma 4 assistant requires embedding_length_out to carry the target hidden size")

    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    c.create_tensor(tn("MASKED_EMBD_CENTROIDS", "weight"), (), TENSOR_NOT_REQUIRED)
    c.create_tensor(tn("MASKED_EMBD_ORDERING"), (), TENSOR_NOT_REQUIRED)

    n_embd_backbone = hp.n_embd_inp()
    model.nextn_proj_post = c.create_tensor(tn("NEXTN_PROJ_POST", "weight"), (n_embd, n_embd_backbone))

    rope_freqs_flag = 0
    for i, layer in enumerate(model.layers_nextn):   # layers 0 .. n_layer_nextn - 1: every block
        n_head, n_embd_head, n_ff = hp.n_head(i), hp.n_embd_head_k(i), hp.n_ff(i)
        if i == 0:
            model.nextn_proj_pre = c.create_tensor(tn("NEXTN_PROJ_PRE", "weight", i), (2 * n_embd_backbone, n_embd))
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd, n_embd_head * n_head))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head * n_head, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head,))
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,))
        layer.out_scale = c.create_tensor(tn("LAYER_OUT_SCALE", "weight", i), (1,))
        if not hp.is_swa(i):
            layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (n_embd_head // 2,), rope_freqs_flag)
            rope_freqs_flag = TENSOR_DUPLICATED
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,))


def build(g: GraphContext) -> None:
    """llama_model_gemma4_assistant::graph: the target's token rows (scaled) beside the target's
    hidden state, projected down; Q-only attention over the target's K/V (every cache layer is
    shared), a GeGLU FFN; logits and the state projected back to the target's width (h_nextn)."""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    n_embd_backbone = hp.n_embd_inp()
    # llm_graph_input_embd(n_embd_backbone): the tokens and the target's hidden state, both inputs
    inp_tokens = ggml.new_tensor(ggml.T.I32, n_tokens)
    g.cb(inp_tokens, "inp_tokens", -1)
    inp_tokens.set_input()
    g.t_inp_tokens = inp_tokens
    inp_h = ggml.new_tensor(ggml.T.F32, n_embd_backbone, n_tokens)
    g.cb(inp_h, "inp_h", -1)
    inp_h.set_input()
    g.t_inp_embd = inp_h

    x = ggml.get_rows(g.model_other.tok_embd, inp_tokens)   # GGML_ASSERT(cparams.ctx_other != nullptr)
    x = ggml.scale(x, math.sqrt(n_embd_backbone))
    g.cb(x, "inp_embd_target", -1)
    xh = ggml.concat(x, inp_h, 0)
    g.cb(xh, "inp_xh", -1)
    cur = g.mul_mat_no_lora(model.nextn_proj_pre, xh)
    g.cb(cur, "pre_proj", -1)

    inp_attn = g.build_attn_inp_kv_iswa()
    inp_pos = g.build_inp_pos()
    inp_out_ids = g.build_inp_out_ids()
    inp_l = cur
    n_layer_nextn = hp.n_layer_nextn
    for il in range(n_layer_nextn):
        layer = model.layers_nextn[il]   # model.layers[il]: every layer is a NextN one (n_layer is 0)
        n_embd_head, n_head = hp.n_embd_head_k(il), hp.n_head(il)
        cur_norm = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur_norm, "attn_norm", il)
        q = g.build_lora_mm(layer.wq, cur_norm)
        q = ggml.reshape(q, n_embd_head, n_head, n_tokens)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        freq_factors = None if hp.is_swa(il) else layer.rope_freqs
        q = ggml.rope_ext(q, inp_pos, freq_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur_pos", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, None, None, hp.f_attention_scale, il)
        if il == n_layer_nextn - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_post_norm", il)
        attn_out = ggml.add(cur, inp_l)
        g.cb(attn_out, "attn_out", il)
        cur = g.build_norm(attn_out, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_GELU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, -1)
        g.cb(cur, "ffn_post_norm", il)
        cur = ggml.add(cur, attn_out)
        cur = ggml.mul(cur, layer.out_scale)
        g.cb(cur, "out_scaled", il)
        inp_l = cur
    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    logits = g.build_lora_mm(model.output, cur)
    g.cb(logits, "result_output", -1)
    g.t_logits = logits
    h_next = g.mul_mat_no_lora(model.nextn_proj_post, cur)
    g.cb(h_next, "h_nextn", -1)
    g.t_h_nextn = h_next
    ggml.build_forward_expand(g.gf, logits)
    ggml.build_forward_expand(g.gf, h_next)


# one graph for every context type (build_arch_graph): the MTP context llama-server creates builds it too
build_mtp = build
