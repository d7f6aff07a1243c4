"""LLM_ARCH_EAGLE3 (src/models/eagle3.cpp): an EAGLE-3 draft head, one llama decoder block over the
token embedding and the target model's fused hidden states.

llama-server loads it with --spec-type draft-eagle3 -md FILE beside its target (common/speculative.cpp):
its context gets ctx_other = the target's, the target's n_ctx, the draft cache types (-ctkd/-ctvd)
and, as for every encoder model, n_outputs_max = n_batch. The encoder graph (the fusion fc of
three target layers' hidden states, run by llama_encode) is never reserved: llama_context reserves
the default graph, the decoder below. A head without its own token_embd or output reads the
target's through ctx_other, so llama.cpp creates its context only beside the target
(llama-context.cpp: "eagle3 requires ctx_other to be set"); the plan refuses it alone in one line
and plans it beside its target (create_context(..., ctx_other=target), `reserve MODEL -md FILE`).
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    if not ml.is_array("%s.target_layers"):
        ml.fail("EAGLE3 model requires 'extract_layers' in GGUF metadata")
    target_layer_ids = ml.get_arr_i32("%s.target_layers")
    hp.target_layer_ids = tuple(target_layer_ids)
    if len(target_layer_ids) != 3:
        ml.fail("EAGLE3 requires exactly 3 entries in 'extract_layers'")
    n_embd_tgt = ml.get_u32("%s.target_hidden_size")
    hp.n_embd_inp_enc_impl = len(target_layer_ids) * n_embd_tgt & 0xFFFFFFFF
    hp.norm_before_residual = ml.get_bool("%s.norm_before_residual", False)
    hp.norm_before_fc = ml.get_bool("%s.norm_before_fc", False)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    n_embd_inp = hp.n_embd_inp_enc()
    n_embd_attn_input = 2 * n_embd

    # d2t (draft-to-target ids) sizes the draft vocabulary when the file holds one
    n_draft_vocab = n_vocab
    d2t_meta = c.ml.get_weight("d2t")
    if d2t_meta is not None:
        n_draft_vocab = d2t_meta.info.ne[0]
        model.d2t = c.create_tensor(tn("D2T"), (n_draft_vocab,))

    model.fc = c.create_tensor(tn("FC", "weight"), (n_embd_inp, n_embd))
    if hp.norm_before_fc:
        model.output_norm_enc = c.create_tensor(tn("ENC_OUTPUT_NORM", "weight"), (n_embd_inp,))

    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_draft_vocab), TENSOR_NOT_REQUIRED)

    # its own token embedding (Llama 3.3 70B's head), sized by the file: the target's vocabulary
    tok_embd_meta = c.ml.get_weight(tn("TOKEN_EMBD", "weight").name)
    if tok_embd_meta is not None:
        model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, tok_embd_meta.info.ne[1]))

    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_2 = c.create_tensor(tn("ATTN_NORM_2", "weight", i), (n_embd,))
        layer.wq = c.create_tensor(tn("ATTN_Q", "weight", i), (n_embd_attn_input, hp.n_embd_head_k() * hp.n_head(i)))
        layer.wk = c.create_tensor(tn("ATTN_K", "weight", i), (n_embd_attn_input, hp.n_embd_k_gqa(i)))
        layer.wv = c.create_tensor(tn("ATTN_V", "weight", i), (n_embd_attn_input, hp.n_embd_v_gqa(i)))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (hp.n_embd_head_k() * hp.n_head(i), n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, hp.n_ff(i)))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (hp.n_ff(i), n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, hp.n_ff(i)))
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (hp.n_rot() // 2,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_eagle3::graph<false>, the decoder (the graph llama_context reserves), over the
    head's own token_embd and output, or its target's (ctx_other) where it has none."""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    if n_embd_head != hp.n_embd_head_k():
        raise ggml.GGMLAbort("llama.cpp would abort (eagle3.cpp GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))")
    if hp.n_layer != 1:
        raise ggml.GGMLAbort(f"llama.cpp would abort (eagle3.cpp GGML_ASSERT(n_layer == 1)): the head has "
                             f"{hp.n_layer} layers")
    n_tokens, n_embd = g.ubatch.n_tokens, hp.n_embd

    tokens = ggml.new_tensor(ggml.T.I32, n_tokens)
    tokens.set_input()
    embd = ggml.new_tensor(ggml.T.F32, n_embd, n_tokens)
    embd.set_input()
    tok_embd = model.tok_embd if model.tok_embd is not None else g.model_other.tok_embd
    if tok_embd is None:
        raise ggml.GGMLAbort("llama.cpp would abort (eagle3.cpp GGML_ASSERT: EAGLE3 decoder requires token "
                             "embeddings (own or from target model))")
    inp_embd = ggml.get_rows(tok_embd, tokens)
    g.cb(inp_embd, "inp_embd", -1)
    inp_g = embd
    g.cb(inp_g, "inp_g_embeddings", -1)
    inp_l = inp_g

    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    kq_scale = 1.0 / math.sqrt(float(n_embd_head))

    il = 0
    layer = model.layers[il]
    embd_norm = g.build_norm(inp_embd, layer.attn_norm, None, LLM_NORM_RMS, il)
    g.cb(embd_norm, "embd_norm", il)
    g_norm = g.build_norm(inp_g, layer.attn_norm_2, None, LLM_NORM_RMS, -1)
    g.cb(g_norm, "g_norm", il)
    inp_sa = g_norm if hp.norm_before_residual else inp_l
    cur = ggml.concat(embd_norm, g_norm, il)
    g.cb(cur, "concat_embd", il)

    q = g.build_lora_mm(layer.wq, cur)
    g.cb(q, "Qcur", il)
    k = g.build_lora_mm(layer.wk, cur)
    g.cb(k, "Kcur", il)
    v = g.build_lora_mm(layer.wv, cur)
    g.cb(v, "Vcur", il)
    q = ggml.reshape(q, n_embd_head, hp.n_head(il), n_tokens)
    k = ggml.reshape(k, n_embd_head, hp.n_head_kv(il), n_tokens)
    v = ggml.reshape(v, n_embd_head, hp.n_head_kv(il), n_tokens)
    rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
    q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q, "Qcur_rope", il)
    g.cb(k, "Kcur_rope", il)
    cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il)

    ffn_inp = ggml.add(cur, inp_sa)
    g.cb(ffn_inp, "ffn_inp", il)
    cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
    g.cb(cur, "post_attn_norm", il)
    cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                      LLM_FFN_PAR, il)
    g.cb(cur, "ffn_out", il)
    cur = ggml.add(cur, ffn_inp)
    g.cb(cur, "eagle3_prenorm", il)

    # the pre-norm state, the next token's g_embeddings
    cur.set_output()
    g.t_h_nextn = cur

    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    output = model.output if model.output is not None else g.model_other.output
    if output is None:
        raise ggml.GGMLAbort("llama.cpp would abort (eagle3.cpp GGML_ASSERT: EAGLE3 decoder requires an output "
                             "projection (own or from target model))")
    cur = g.build_lora_mm(output, cur)
    if model.d2t is not None:
        # the draft vocabulary's logits scattered into the target's, -inf elsewhere
        n_draft_vocab, n_outputs = cur.ne[0], cur.ne[1]
        if model.d2t.type != ggml.T.I64:
            raise ggml.GGMLAbort("llama.cpp would abort (eagle3.cpp GGML_ASSERT(model.d2t->type == GGML_TYPE_I64)): "
                                 f"d2t is {ggml.type_name(model.d2t.type)}")
        logits = ggml.fill(ggml.new_tensor(ggml.T.F32, 1, hp.n_vocab, n_outputs), -math.inf)
        cur = ggml.set_rows(logits, ggml.reshape(cur, 1, n_draft_vocab, n_outputs),
                            ggml.reshape(model.d2t, n_draft_vocab, 1, 1))
        cur = ggml.reshape(cur, hp.n_vocab, n_outputs)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
