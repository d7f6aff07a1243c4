"""LLM_ARCH_DFLASH (src/models/dflash.cpp): DFlash block-diffusion drafters (z-lab's Qwen3/Qwen3.5
DFlash, DFlash2 with convolutions and a selector, DSpark with a Markov head), loaded by llama-server
with --spec-type draft-dflash / draft-dspark -md FILE.

The drafters share their target's token embedding and lm_head (converted without them): llama_context
then reads the target's through ctx_other and requires it ("dflash requires ctx_other to be set"), so
llama.cpp creates their context only beside the target, and so does the plan (create_context(...,
ctx_other=target): the decoder graph over the target's token_embd and output, its own KV cache); alone
it is refused in one line. common_fit_params measures the draft alone, fails there and fits the model
without it, as `fit` does. A drafter with its own embedding and head, which llama.cpp runs alone, the
DeepSeek-V4 DSpark backbone (hyper_connection.count), and beside a target DFlash2 (convolutions and a
selector) and DSpark's Markov head are not planned.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLAbort
from ..graph import LLM_FFN_GELU, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..gguf import BOOL, INT32, UINT32
from ..hparams import LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_NONE, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn


def LLAMA_ROPE_TYPE(hp: HParams) -> int:
    """llama_model_rope_type: drafts for M-RoPE targets carry rope sections (M-RoPE), the others NeoX
    (the DSV4 backbone's NORM is not planned)."""
    return LLAMA_ROPE_TYPE_MROPE if any(hp.rope_sections) else LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_embedding_scale = ml.get_f32("%s.embedding_scale", hp.f_embedding_scale)
    hp.f_attention_scale = ml.get_f32("%s.attention.scale", hp.f_attention_scale)
    hp.f_attn_value_scale = ml.get_f32("%s.attention.value_scale", hp.f_attn_value_scale)
    hidden_act = ml.get_str("%s.hidden_activation", "silu")
    if hidden_act not in ("silu", "gelu", "gelu_pytorch_tanh"):
        ml.fail(f"unsupported DFlash hidden activation: {hidden_act}")
    hp.llm_ffn_op = LLM_FFN_SILU if hidden_act == "silu" else LLM_FFN_GELU
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_logit_scale = ml.get_f32("%s.logit_scale", hp.f_logit_scale)
    hp.f_final_logit_softcapping = ml.get_f32("%s.final_logit_softcapping", 0.0)
    if ml.has("%s.rope.dimension_sections"):   # drafts for M-RoPE targets: [n_rot/2, 0, 0, 0]
        hp.rope_sections = ml.get_rope_sections()
    for key in ("block_size", "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        ml.get_u32(f"%s.{key}", 0)   # read (their types checked); load_arch_tensors checks them for DFlash2
    if not ml.is_array("%s.target_layers"):
        ml.fail("DFlash model requires 'target_layers' in GGUF metadata")
    target_layer_ids = ml.get_arr_i32("%s.target_layers")
    hp.n_embd_inp_enc_impl = len(target_layer_ids) * hp.n_embd & 0xFFFFFFFF
    if ml.get_u32("%s.hyper_connection.count", 0) > 0:
        raise NotImplementedError("a DSpark drafter over DeepSeek-V4 blocks (hyper_connection.count) is not planned")
    # optional interleaved sliding-window attention (one rope: the windowed layers' is the main one)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window", 0)
    if hp.n_swa > 0:
        hp.swa_type = LLAMA_SWA_TYPE_STANDARD
        key = "%s.attention.sliding_window_pattern"
        if not ml.is_array(key):
            ml.fail(f"array key not found in model: {ml.key(key)}")
        flags = ml.get_arr(key, (BOOL, UINT32, INT32))
        hp.is_swa_arr = tuple(il < len(flags) and flags[il] != 0 for il in range(hp.n_layer_all))
        hp.rope_freq_base_train_swa = hp.rope_freq_base_train


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp, ml = model.hparams, c.ml
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    n_embd_inp = hp.n_embd_inp_enc()

    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)

    # a reduced draft vocabulary: d2t maps its rows to target token ids
    n_vocab_draft = n_vocab
    d2t_meta = ml.get_weight("d2t")
    if d2t_meta is not None:
        n_vocab_draft = d2t_meta.info.ne[0]
        model.d2t = c.create_tensor(tn("D2T"), (n_vocab_draft,))

    # DSpark: a Markov head and a confidence head
    markov_meta = ml.get_weight("markov_w1.weight")
    if markov_meta is not None:
        rank = markov_meta.info.ne[0]
        c.create_tensor(tn("DSPARK_MARKOV_W1", "weight"), (rank, n_vocab))
        c.create_tensor(tn("DSPARK_MARKOV_W2", "weight"), (rank, n_vocab_draft))
        c.create_tensor(tn("DSPARK_MARKOV_W2", "scale"), (1,), TENSOR_NOT_REQUIRED)
        c.create_tensor(tn("DSPARK_CONF_PROJ", "weight"), (n_embd + rank, 1), TENSOR_NOT_REQUIRED)
        c.create_tensor(tn("DSPARK_CONF_PROJ", "bias"), (1,), TENSOR_NOT_REQUIRED)

    # DFlash2: per-layer convolutions and a selector
    selector = ml.get_weight("selector_hidden.weight") is not None
    if selector:
        rank, top_k = ml.get_u32("%s.selector_rank", 0), ml.get_u32("%s.selector_top_k", 0)
        kernel, group = ml.get_u32("%s.conv_kernel_size", 0), ml.get_u32("%s.conv_group_size", 0)
        if rank <= 0 or ml.get_u32("%s.block_size", 0) <= 0 or top_k <= 0 or kernel <= 0 or group <= 0:
            ml.fail("DFlash2 model is missing conv/selector metadata")
        if n_embd % group != 0:
            ml.fail("DFlash2 hidden size must be divisible by conv_group_size")
        if n_embd < top_k * (top_k + 1):
            ml.fail("DFlash2 hidden size is too small for the selector lattice")
        c.create_tensor(tn("DFLASH_SELECTOR_PREV", "weight"), (rank, n_vocab))
        c.create_tensor(tn("DFLASH_SELECTOR_NEXT", "weight"), (rank, n_vocab))
        c.create_tensor(tn("DFLASH_SELECTOR_HIDDEN", "weight"), (n_embd, rank))

    model.fc = c.create_tensor(tn("FC", "weight"), (n_embd_inp, n_embd))
    c.create_tensor(tn("FC", "scale"), (1,), TENSOR_NOT_REQUIRED)
    model.output_norm_enc = c.create_tensor(tn("ENC_OUTPUT_NORM", "weight"), (n_embd,))   # after fc
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    # reduced-vocabulary drafts ship their own head; full-vocabulary ones share the target's (ctx_other)
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab_draft), TENSOR_NOT_REQUIRED)
    if model.output is None and model.tok_embd is not None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab_draft), TENSOR_DUPLICATED)

    for i, layer in enumerate(model.layers):
        n_embd_head_k, n_head = hp.n_embd_head_k(i), hp.n_head(i)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd, n_embd_head_k * n_head))
        layer.wk = c.create_tensor(tn("ATTN_K", "weight", i), (n_embd, hp.n_embd_k_gqa(i)))
        layer.wv = c.create_tensor(tn("ATTN_V", "weight", i), (n_embd, hp.n_embd_v_gqa(i)), TENSOR_NOT_REQUIRED)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * n_head, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.out_scale = c.create_tensor(tn("LAYER_OUT_SCALE", "weight", i), (1,), TENSOR_NOT_REQUIRED)
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (n_embd_head_k // 2,),
                                           TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i > 0 else 0))
        layer.attn_sinks = c.create_tensor(tn("ATTN_SINKS", "weight", i), (n_head,), TENSOR_NOT_REQUIRED)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, hp.n_ff(i)))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (hp.n_ff(i), n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, hp.n_ff(i)))
        if selector:
            projected = 2 * kernel * (n_embd // group)
            c.create_tensor(tn("DFLASH_ATTN_CONV_BASE", None, i), (n_embd, kernel, 2))
            c.create_tensor(tn("DFLASH_ATTN_CONV_PROJ", "weight", i), (n_embd, projected))
            c.create_tensor(tn("DFLASH_FFN_CONV_BASE", None, i), (n_embd, kernel, 2))
            c.create_tensor(tn("DFLASH_FFN_CONV_PROJ", "weight", i), (n_embd, projected))


def build(g: GraphContext) -> None:
    """llama_model_dflash::graph<false>, the decoder, for the token batch llama_context reserves
    (noise-block diffusion: cache-aware attention over the block, no output row selection), over the
    target's token_embd and output where the drafter has none (ctx_other)."""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    n_embd_head = hp.n_embd_head_v()
    if n_embd_head != hp.n_embd_head_k():
        raise GGMLAbort("llama.cpp would abort (dflash.cpp GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))")
    inp_pos = g.build_inp_pos()
    use_iswa = hp.swa_type != LLAMA_SWA_TYPE_NONE
    inp_attn = g.build_attn_inp_kv_iswa() if use_iswa else g.build_attn_inp_kv()
    kq_scale = hp.f_attention_scale if hp.f_attention_scale != 0.0 else 1.0 / math.sqrt(float(n_embd_head))

    def rope(cur, il):
        if hp.rope_type == LLAMA_ROPE_TYPE_MROPE:
            return ggml.rope_multi(cur, inp_pos, None, hp.n_rot(il), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
        return ggml.rope_ext(cur, inp_pos, model.layers[0].rope_freqs, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)

    tok_embd = model.tok_embd if model.tok_embd is not None else g.model_other.tok_embd
    if tok_embd is None:
        raise GGMLAbort("llama.cpp would abort (dflash.cpp GGML_ASSERT: DFlash decoder requires the target model's "
                        "token embeddings)")
    tokens = ggml.new_tensor(ggml.T.I32, n_tokens)
    tokens.set_input()
    g.t_inp_tokens = tokens
    inp_l = ggml.get_rows(tok_embd, tokens)
    if hp.f_embedding_scale != 0.0:
        inp_l = ggml.scale(inp_l, hp.f_embedding_scale)
    g.cb(inp_l, "inp_noise_embd", -1)

    for il, layer in enumerate(model.layers):
        noise_norm = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(noise_norm, "noise_norm", il)
        q = g.build_lora_mm(layer.wq, noise_norm, layer.wq_s)
        k = g.build_lora_mm(layer.wk, noise_norm, layer.wk_s)
        shared_kv = layer.wv is None
        v = k if shared_kv else g.build_lora_mm(layer.wv, noise_norm, layer.wv_s)
        q = ggml.reshape(q, n_embd_head, hp.n_head(il), n_tokens)
        k = ggml.reshape(k, n_embd_head, hp.n_head_kv(il), n_tokens)
        v = ggml.reshape(v, n_embd_head, hp.n_head_kv(il), n_tokens)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        if shared_kv:
            v = ggml.rms_norm(v, hp.f_norm_rms_eps)
        q = rope(q, il)
        k = rope(k, il)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il, sinks=layer.attn_sinks, wo_s=layer.wo_s)
        if hp.f_attn_value_scale != 0.0:
            cur = ggml.scale(cur, hp.f_attn_value_scale)
            g.cb(cur, "attn_out_scaled", il)
        if layer.attn_post_norm is not None:
            cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "attn_post_norm", il)
        ffn_inp = ggml.add(cur, inp_l)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, hp.llm_ffn_op,
                          LLM_FFN_PAR, il, down_s=layer.ffn_down_s, up_s=layer.ffn_up_s, gate_s=layer.ffn_gate_s)
        g.cb(cur, "ffn_out", il)
        if layer.ffn_post_norm is not None:
            cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "ffn_post_norm", il)
        cur = ggml.add(cur, ffn_inp)
        if layer.out_scale is not None:
            cur = ggml.mul(cur, layer.out_scale)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    output = model.output if model.output is not None else g.model_other.output   # the target's lm_head (ctx_other)
    if output is None:
        raise GGMLAbort("llama.cpp would abort (dflash.cpp GGML_ASSERT: DFlash decoder requires the target model's "
                        "output projection)")
    cur = g.build_lora_mm(output, cur)
    if model.d2t is not None:
        # reduced-draft-vocabulary exports: the draft logits scattered into the target's vocabulary
        n_draft_vocab, n_outputs = cur.ne[0], cur.ne[1]
        if model.d2t.type != ggml.T.I64 or model.d2t.ne[0] != n_draft_vocab:
            raise GGMLAbort("llama.cpp would abort (dflash.cpp GGML_ASSERT(model.d2t->type == GGML_TYPE_I64 and "
                            "d2t->ne[0] == n_draft_vocab))")
        logits = ggml.fill(ggml.new_tensor(ggml.T.F32, 1, hp.n_vocab, n_outputs), -math.inf)
        cur = ggml.set_rows(logits, ggml.reshape(cur, 1, n_draft_vocab, n_outputs),
                            ggml.reshape(model.d2t, n_draft_vocab, 1, 1))
        cur = ggml.reshape(cur, hp.n_vocab, n_outputs)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
