"""LLM_ARCH_DFLASH (src/models/dflash.cpp): DFlash block-diffusion drafters (z-lab's Qwen3/Qwen3.5
DFlash, DFlash2 with convolutions and a selector, DSpark with a Markov head), loaded by llama-server
with --spec-type draft-dflash / draft-dspark -md FILE.

The drafters share their target's token embedding and lm_head (converted without them): llama_context
then reads the target's through ctx_other and requires it ("dflash requires ctx_other to be set"), so
llama.cpp creates their context only beside the target, and so does the plan (create_context(...,
ctx_other=target): the decoder graph over the target's token_embd and output, its own KV cache); alone
it is refused in one line. common_fit_params measures the draft alone, fails there and fits the model
without it, as `fit` does. Beside a target, DFlash2's dynamic convolutions and candidate selector (its
lattice in t_h_nextn) and DSpark's Markov and confidence heads are built as dflash.cpp builds them for
the reserve ubatches. A drafter with its own embedding and head, which llama.cpp runs alone, and the
DeepSeek-V4 DSpark backbone (hyper_connection.count) are not planned.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLAbort
from ..graph import LLM_FFN_GELU, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..gguf import ARRAY, BOOL, INT32, STRING, UINT32
from ..hparams import (LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_NONE, LLAMA_SWA_TYPE_STANDARD, HParams,
                       UnsupportedModel)
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
    hp.dflash_block_size = ml.get_u32("%s.block_size", 0)
    hp.dflash_conv_kernel_size = ml.get_u32("%s.conv_kernel_size", 0)
    hp.dflash_conv_group_size = ml.get_u32("%s.conv_group_size", 0)
    hp.dflash_selector_rank = ml.get_u32("%s.selector_rank", 0)
    hp.dflash_selector_top_k = ml.get_u32("%s.selector_top_k", 0)
    # DSpark's Markov head reads this key from the model's metadata strings (llama_model::gguf_kv, which
    # leaves arrays out): absent or "true" samples from the anchor slot
    key = ml.key("%s.sample_from_anchor")
    kv_type = ml.header.kv_types.get(key, (None, None))[0]
    value = ml.header.get(key)
    hp.dflash_sample_from_anchor = (value is None or kv_type == ARRAY or (kv_type == BOOL and bool(value))
                                    or (kv_type == STRING and value == "true"))
    if not ml.is_array("%s.target_layers"):
        ml.fail("DFlash model requires 'target_layers' in GGUF metadata")
    target_layer_ids = ml.get_arr_i32("%s.target_layers")
    hp.target_layer_ids = tuple(target_layer_ids)
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
        model.dspark_markov_w1 = c.create_tensor(tn("DSPARK_MARKOV_W1", "weight"), (rank, n_vocab))
        model.dspark_markov_w2 = c.create_tensor(tn("DSPARK_MARKOV_W2", "weight"), (rank, n_vocab_draft))
        model.dspark_markov_w2_s = c.create_tensor(tn("DSPARK_MARKOV_W2", "scale"), (1,), TENSOR_NOT_REQUIRED)
        model.dspark_conf_proj = c.create_tensor(tn("DSPARK_CONF_PROJ", "weight"), (n_embd + rank, 1),
                                                 TENSOR_NOT_REQUIRED)
        model.dspark_conf_proj_b = c.create_tensor(tn("DSPARK_CONF_PROJ", "bias"), (1,), TENSOR_NOT_REQUIRED)

    # DFlash2: per-layer convolutions and a selector
    selector = ml.get_weight("selector_hidden.weight") is not None
    if selector:
        rank, top_k = hp.dflash_selector_rank, hp.dflash_selector_top_k
        kernel, group = hp.dflash_conv_kernel_size, hp.dflash_conv_group_size
        if rank <= 0 or hp.dflash_block_size <= 0 or top_k <= 0 or kernel <= 0 or group <= 0:
            ml.fail("DFlash2 model is missing conv/selector metadata")
        if n_embd % group != 0:
            ml.fail("DFlash2 hidden size must be divisible by conv_group_size")
        if n_embd < (top_k * (top_k + 1)) & 0xFFFFFFFF:   # a uint32_t product
            ml.fail("DFlash2 hidden size is too small for the selector lattice")
        model.dflash_selector_prev = c.create_tensor(tn("DFLASH_SELECTOR_PREV", "weight"), (rank, n_vocab))
        model.dflash_selector_next = c.create_tensor(tn("DFLASH_SELECTOR_NEXT", "weight"), (rank, n_vocab))
        model.dflash_selector_hidden = c.create_tensor(tn("DFLASH_SELECTOR_HIDDEN", "weight"), (n_embd, rank))

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
            layer.dflash_attn_conv_base = c.create_tensor(tn("DFLASH_ATTN_CONV_BASE", None, i), (n_embd, kernel, 2))
            layer.dflash_attn_conv_proj = c.create_tensor(tn("DFLASH_ATTN_CONV_PROJ", "weight", i), (n_embd, projected))
            layer.dflash_ffn_conv_base = c.create_tensor(tn("DFLASH_FFN_CONV_BASE", None, i), (n_embd, kernel, 2))
            layer.dflash_ffn_conv_proj = c.create_tensor(tn("DFLASH_FFN_CONV_PROJ", "weight", i), (n_embd, projected))


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
        attn_dynamic = None
        if layer.dflash_attn_conv_proj is not None:
            attn_dynamic = g.build_lora_mm(layer.dflash_attn_conv_proj, noise_norm)
            noise_norm = build_dflash2_conv(g, noise_norm, attn_dynamic, layer.dflash_attn_conv_base, 0)
            g.cb(noise_norm, "attn_conv_in", il)
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
        if attn_dynamic is not None:
            cur = build_dflash2_conv(g, cur, attn_dynamic, layer.dflash_attn_conv_base, 1)
            g.cb(cur, "attn_conv_out", il)
        if layer.attn_post_norm is not None:
            cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
            g.cb(cur, "attn_post_norm", il)
        ffn_inp = ggml.add(cur, inp_l)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        ffn_dynamic = None
        if layer.dflash_ffn_conv_proj is not None:
            ffn_dynamic = g.build_lora_mm(layer.dflash_ffn_conv_proj, cur)
            cur = build_dflash2_conv(g, cur, ffn_dynamic, layer.dflash_ffn_conv_base, 0)
            g.cb(cur, "ffn_conv_in", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, hp.llm_ffn_op,
                          LLM_FFN_PAR, il, down_s=layer.ffn_down_s, up_s=layer.ffn_up_s, gate_s=layer.ffn_gate_s)
        g.cb(cur, "ffn_out", il)
        if ffn_dynamic is not None:
            cur = build_dflash2_conv(g, cur, ffn_dynamic, layer.dflash_ffn_conv_base, 1)
            g.cb(cur, "ffn_conv_out", il)
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
    # DFlash2 feeds these logits to its selector, so they take the target's output transforms; DFlash1
    # and DSpark read them through the sampler instead
    if model.dflash_selector_hidden is not None:
        if hp.f_logit_scale != 0.0:
            cur = ggml.scale(cur, hp.f_logit_scale)
        if hp.f_final_logit_softcapping > 0.0:
            cur = ggml.scale(cur, 1.0 / hp.f_final_logit_softcapping)
            cur = ggml.unary(cur, "TANH")
            cur = ggml.scale(cur, hp.f_final_logit_softcapping)
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
    if model.dspark_markov_w1 is not None:
        build_dspark_markov_head(g, tokens)
    if model.dflash_selector_hidden is not None:
        build_dflash2_selector(g, tokens)


def build_dspark_markov_head(g: GraphContext, tokens: ggml.Tensor) -> None:
    """dflash.cpp build_dspark_markov_head: DSpark's Markov bias on the draft logits, chained greedily
    over the block positions, and its optional confidence head (into t_h_nextn)."""
    model, hp = g.model, g.hparams
    w1, w2 = model.dspark_markov_w1, model.dspark_markov_w2
    has_conf = model.dspark_conf_proj is not None
    base = g.t_logits
    n_vocab, n_tok = base.ne[0], base.ne[1]
    # block_size: std::stoi of the dflash.block_size metadata string (a uint32 the loader checked)
    if hp.dflash_block_size == 0:
        raise GGMLAbort("llama.cpp would abort (dflash.cpp GGML_ASSERT: DSpark draft requires 'dflash.block_size' "
                        "in GGUF metadata, and block_size > 0)")
    if hp.dflash_block_size >= 2**31:   # std::out_of_range, caught by llama_init_from_model
        raise UnsupportedModel(f"llama.cpp cannot create the draft context: std::stoi of dflash.block_size "
                               f"{hp.dflash_block_size} is out of range (failed to initialize the context)")
    block_size = hp.dflash_block_size
    i_draft_beg = 0 if hp.dflash_sample_from_anchor else 1   # SpecForge exports: slot 0 is a bonus token
    n_blocks = g.ubatch.n_seqs_unq
    if not (n_blocks > 0 and n_tok % n_blocks == 0):
        raise GGMLAbort("llama.cpp would abort (dflash.cpp GGML_ASSERT: DSpark markov head requires equal-size blocks)")
    block_drafts = n_tok // n_blocks
    if block_drafts > block_size:
        return
    token_stride = block_drafts * tokens.nb[0]
    base_stride = block_drafts * base.nb[1]
    prev = ggml.view(tokens, (1, n_blocks), (token_stride,), 0)
    prev = ggml.cont(prev, n_blocks)
    cat = cat_conf = None
    if not hp.dflash_sample_from_anchor:
        # the bonus anchor slot: its logits unbiased, the (unread) confidence column padded
        cat = ggml.cont(ggml.view(base, (n_vocab, n_blocks), (base_stride,), 0))
        if has_conf:
            cat_conf = ggml.unary(ggml.cont(ggml.view(base, (1, n_blocks), (base_stride,), 0)), "SIGMOID")
    for i in range(i_draft_beg, block_drafts):
        w1_prev = ggml.get_rows(w1, prev)                                   # [R, n_blocks]
        bias = g.build_lora_mm(w2, w1_prev, model.dspark_markov_w2_s)      # [n_vocab_draft, n_blocks]
        if model.d2t is not None:
            # a reduced draft vocabulary: the bias scattered to the target rows
            n_draft_vocab = bias.ne[0]
            full = ggml.fill(ggml.new_tensor(ggml.T.F32, 1, n_vocab, n_blocks), 0.0)
            bias = ggml.set_rows(full, ggml.reshape(bias, 1, n_draft_vocab, n_blocks),
                                 ggml.reshape(model.d2t, n_draft_vocab, 1, 1))
            bias = ggml.reshape(bias, n_vocab, n_blocks)
        base_i = ggml.view(base, (n_vocab, n_blocks), (base_stride,), i * base.nb[1])
        col = ggml.add(base_i, bias)
        cat = ggml.concat(cat, col, 1) if cat is not None else col
        if has_conf:
            conf_inp = g.t_embd
            conf_inp_i = ggml.view(conf_inp, (conf_inp.ne[0], n_blocks), (block_drafts * conf_inp.nb[1],),
                                   i * conf_inp.nb[1])
            feat = ggml.concat(ggml.cont(conf_inp_i), w1_prev, 0)
            conf = g.mul_mat_no_lora(model.dspark_conf_proj, feat)
            if model.dspark_conf_proj_b is not None:
                conf = ggml.add(conf, model.dspark_conf_proj_b)
            conf = ggml.unary(conf, "SIGMOID")
            cat_conf = ggml.concat(cat_conf, conf, 1) if cat_conf is not None else conf
        if i + 1 < block_drafts:
            prev = ggml.argmax(col)
    # cat is position-major: back to the ubatch's block-major order
    out = ggml.reshape(cat, n_vocab, n_blocks, block_drafts)
    out = ggml.cont(ggml.permute(out, 0, 2, 1, 3))
    out = ggml.reshape(out, n_vocab, n_tok)
    if has_conf:
        conf = ggml.reshape(cat_conf, 1, n_blocks, block_drafts)
        conf = ggml.cont(ggml.permute(conf, 0, 2, 1, 3))
        conf = ggml.reshape(conf, 1, n_tok)
        conf = ggml.repeat(conf, g.t_embd)   # n_embd-wide rows, read through llama_get_embeddings_nextn
        g.t_h_nextn = conf
        ggml.build_forward_expand(g.gf, conf)
    g.t_logits = out
    ggml.build_forward_expand(g.gf, out)


def build_dflash2_conv(g: GraphContext, hidden: ggml.Tensor, dynamic: ggml.Tensor, base: ggml.Tensor,
                       side: int) -> ggml.Tensor:
    """dflash.cpp build_dflash2_conv: a causal depthwise convolution within each block, its taps the
    static base plus the per-token dynamic coefficients of one side (0 before, 1 after the sublayer)."""
    hp = g.hparams
    hidden_size, n_tokens = hidden.ne[0], hidden.ne[1]
    n_blocks = g.ubatch.n_seqs_unq
    kernel_size, group_size = hp.dflash_conv_kernel_size, hp.dflash_conv_group_size
    n_groups = hidden_size // group_size
    if not (n_blocks > 0 and n_tokens % n_blocks == 0):
        raise GGMLAbort("llama.cpp would abort (dflash.cpp GGML_ASSERT(n_blocks > 0 && n_tokens % n_blocks == 0))")
    block_size = n_tokens // n_blocks
    if not hidden.is_contiguous() or hidden.ne[1] != n_tokens:
        hidden = ggml.cont(hidden, hidden_size, n_tokens)
    if not dynamic.is_contiguous() or dynamic.ne[1] != n_tokens:
        dynamic = ggml.cont(dynamic, dynamic.ne[0], n_tokens)
    blocks = ggml.reshape(hidden, hidden_size, block_size, n_blocks)
    coeffs = ggml.reshape(dynamic, n_groups, kernel_size, 2, n_tokens)
    coeffs_side = ggml.view(coeffs, (n_groups, kernel_size, n_tokens), (coeffs.nb[1], coeffs.nb[3]),
                            side * coeffs.nb[2])
    coeff_all = ggml.cont(coeffs_side)
    coeff_all = ggml.reshape(coeff_all, 1, n_groups, kernel_size, n_tokens)
    coeff_all = ggml.repeat_4d(coeff_all, group_size, n_groups, kernel_size, n_tokens)
    base_side = ggml.reshape(ggml.view(base, (hidden_size * kernel_size,), (), side * base.nb[2]),
                             group_size, n_groups, kernel_size, 1)
    weight_all = ggml.add(coeff_all, base_side)
    # taps at or past block_size read only the left padding and add nothing
    result = None
    for tap in range(min(kernel_size, block_size)):
        values = blocks
        if tap > 0:
            previous = ggml.view(blocks, (hidden_size, block_size - tap, n_blocks), (blocks.nb[1], blocks.nb[2]), 0)
            values = ggml.pad_ext(previous, 0, 0, tap, 0, 0, 0, 0, 0)
        values = ggml.reshape(values, hidden_size, n_tokens)
        weight = ggml.reshape(ggml.cont(ggml.view(weight_all, (group_size, n_groups, 1, n_tokens),
                                                  (weight_all.nb[1], weight_all.nb[2], weight_all.nb[3]),
                                                  tap * weight_all.nb[2])), hidden_size, n_tokens)
        term = ggml.mul(weight, values)
        result = ggml.add(result, term) if result is not None else term
    return result


def build_dflash2_selector(g: GraphContext, tokens: ggml.Tensor) -> None:
    """dflash.cpp build_dflash2_selector: the top-k candidates of every block position and the pairwise
    transition scores, packed into the t_h_nextn rows for the CPU-side walk."""
    model, hp = g.model, g.hparams
    n_tokens, n_embd = g.ubatch.n_tokens, hp.n_embd
    top_k, rank = hp.dflash_selector_top_k, hp.dflash_selector_rank
    n_blocks = g.ubatch.n_seqs_unq
    if not (n_blocks > 0 and n_tokens % n_blocks == 0) or g.t_logits.ne[1] != n_tokens:
        raise GGMLAbort("llama.cpp would abort (dflash.cpp GGML_ASSERT(n_blocks > 0 && n_tokens % n_blocks == 0) "
                        "or GGML_ASSERT(res->t_logits->ne[1] == n_tokens))")
    tokens_per_block = n_tokens // n_blocks
    block_size = min(tokens_per_block, hp.dflash_block_size)
    row_used = top_k + top_k * top_k
    logits = g.t_logits
    candidates = ggml.top_k(logits, top_k)
    logits_rows = ggml.reshape(logits, 1, logits.ne[0], n_tokens)
    unary = ggml.reshape(ggml.get_rows(logits_rows, candidates), top_k, n_tokens)
    gate = g.build_lora_mm(model.dflash_selector_hidden, g.t_embd)
    # [.., tokens_per_block, n_blocks]: the block position fastest, the sequences outside
    cand_blk = ggml.reshape(candidates, top_k, tokens_per_block, n_blocks)
    unary_blk = ggml.reshape(unary, top_k, tokens_per_block, n_blocks)
    gate_blk = ggml.reshape(gate, rank, tokens_per_block, n_blocks)

    def run_view(t: ggml.Tensor, n0: int, beg_pos: int, n_pos: int) -> ggml.Tensor:
        return ggml.cont(ggml.view(t, (n0, n_pos, n_blocks), (t.nb[1], t.nb[2]), beg_pos * t.nb[1]))

    def score_run(beg_pos: int, n_pos: int, pred_ids: ggml.Tensor) -> ggml.Tensor:
        # a position's score reads only the candidate sets at pos-1 and pos: a run scores in one matmul
        cand_run = run_view(cand_blk, top_k, beg_pos, n_pos)
        unary_run = run_view(unary_blk, top_k, beg_pos, n_pos)
        gate_run = run_view(gate_blk, rank, beg_pos, n_pos)
        n_pred = pred_ids.ne[0] // (n_pos * n_blocks)
        successor = ggml.reshape(ggml.get_rows(model.dflash_selector_next,
                                               ggml.reshape(cand_run, top_k * n_pos * n_blocks)),
                                 rank, top_k, n_pos, n_blocks)
        predecessor = ggml.reshape(ggml.get_rows(model.dflash_selector_prev, pred_ids), rank, n_pred, n_pos, n_blocks)
        gate_bcast = ggml.reshape(gate_run, rank, 1, n_pos, n_blocks)
        cond = ggml.mul(predecessor, ggml.repeat(gate_bcast, predecessor))
        score = ggml.mul_mat(successor, cond)
        if n_pred == 1:
            score = ggml.repeat_4d(score, top_k, top_k, n_pos, n_blocks)
        unary_bcast = ggml.reshape(unary_run, top_k, 1, n_pos, n_blocks)
        score = ggml.add(score, ggml.repeat(unary_bcast, score))
        row = ggml.concat(ggml.cast(cand_run, ggml.T.F32), ggml.reshape(score, top_k * top_k, n_pos, n_blocks), 0)
        return ggml.pad(row, n_embd - row_used, 0, 0, 0)

    packed = ggml.fill(ggml.new_tensor(ggml.T.F32, n_embd, 1, n_blocks), 0.0)
    if block_size > 1:
        # position 1 alone: its predecessor is the anchor token, one id per sequence
        anchor_ids = ggml.cont(ggml.view(tokens, (1, n_blocks), (tokens_per_block * tokens.nb[0],), 0), n_blocks)
        packed = ggml.concat(packed, score_run(1, 1, anchor_ids), 1)
    if block_size > 2:
        prev_ids = ggml.reshape(ggml.cont(ggml.view(cand_blk, (top_k, block_size - 2, n_blocks),
                                                    (cand_blk.nb[1], cand_blk.nb[2]), cand_blk.nb[1])),
                                top_k * (block_size - 2) * n_blocks)
        packed = ggml.concat(packed, score_run(2, block_size - 2, prev_ids), 1)
    packed = ggml.reshape(packed, n_embd, block_size * n_blocks)
    g.cb(packed, "dflash2_lattice", -1)
    g.t_h_nextn = packed
    ggml.build_forward_expand(g.gf, packed)
