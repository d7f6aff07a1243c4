"""LLM_ARCH_T5 (src/models/t5.cpp): T5, T5 v1.1, Flan-T5, mT5 and their kin, encoder-decoders.

llama_context reserves with the default graph type, which llama_model_t5::build_arch_graph builds as
the decoder (graph<false>): the token embeddings, self-attention over the KV cache with a relative
position bias (the decoder's layer-0 table unless the layer has its own; the bias turns flash
attention off for it), cross-attention over the encoder output kept for the decoder (cross_embd,
n_ctx_train rows before any encode: the reserve), an FFN (gated GELU where ffn_gate exists, Flan-T5,
else ReLU, T5), RMS norms without biases, and the lm_head (tied unless present). The encoder graph
(graph<true>, build_encoder) is what llama_model_t5encoder always builds. The KV cache is the
default llama_kv_cache over the file's block_count (the encoder's) layers, of which the decoder
uses the first decoder_block_count.
"""
from __future__ import annotations

from typing import Optional

from .. import ggml
from ..ggml import GGMLAbort, Tensor
from ..graph import LLM_FFN_GELU, LLM_FFN_PAR, LLM_FFN_RELU, LLM_FFN_SEQ, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_rel_attn_bkts = ml.get_u32("%s.attention.relative_buckets_count")
    hp.dec_n_layer = ml.get_u32("%s.decoder_block_count", hp.n_layer)


def load_encoder_tensors(c: TensorCreator, model: Model) -> None:
    """The encoder's blocks, the same in llama_model_t5 and llama_model_t5encoder."""
    hp = model.hparams
    n_embd, n_ff, n_head = hp.n_embd, hp.n_ff(), hp.n_head()
    n_embd_k_gqa, n_embd_v_gqa = hp.n_embd_k_gqa(), hp.n_embd_v_gqa()
    for i in range(hp.n_layer):
        layer = model.layers[i]
        layer.attn_norm_enc = c.create_tensor(tn("ENC_ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_rel_b_enc = c.create_tensor(tn("ENC_ATTN_REL_B", "weight", i), (n_head, hp.n_rel_attn_bkts),
                                               TENSOR_NOT_REQUIRED)
        layer.wq_enc = c.create_tensor(tn("ENC_ATTN_Q", "weight", i), (n_embd, n_embd_k_gqa))
        layer.wk_enc = c.create_tensor(tn("ENC_ATTN_K", "weight", i), (n_embd, n_embd_k_gqa))
        layer.wv_enc = c.create_tensor(tn("ENC_ATTN_V", "weight", i), (n_embd, n_embd_v_gqa))
        layer.wo_enc = c.create_tensor(tn("ENC_ATTN_OUT", "weight", i), (n_embd_v_gqa, n_embd))
        layer.ffn_norm_enc = c.create_tensor(tn("ENC_FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_enc = c.create_tensor(tn("ENC_FFN_GATE", "weight", i), (n_embd, n_ff), TENSOR_NOT_REQUIRED)
        layer.ffn_down_enc = c.create_tensor(tn("ENC_FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up_enc = c.create_tensor(tn("ENC_FFN_UP", "weight", i), (n_embd, n_ff))


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_head = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_head()
    n_embd_k_gqa, n_embd_v_gqa = hp.n_embd_k_gqa(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm_enc = c.create_tensor(tn("ENC_OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm = c.create_tensor(tn("DEC_OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    if hp.dec_n_layer > hp.n_layer:
        # layers.resize(dec_n_layer), but create_tensor places a block by pimpl->dev_layer.at(bid),
        # which has block_count entries: the first decoder block past them throws std::out_of_range
        c.ml.fail(f"{c.ml.key('%s.decoder_block_count')} is {hp.dec_n_layer}, more than the {hp.n_layer} "
                  f"blocks of {c.ml.key('%s.block_count')}: llama.cpp fails to load it (decoder block "
                  f"{hp.n_layer} has no device: dev_layer.at() out of range)")
    load_encoder_tensors(c, model)
    for i in range(hp.dec_n_layer):
        layer = model.layers[i]
        layer.attn_norm = c.create_tensor(tn("DEC_ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_rel_b = c.create_tensor(tn("DEC_ATTN_REL_B", "weight", i), (n_head, hp.n_rel_attn_bkts),
                                           TENSOR_NOT_REQUIRED)
        layer.wq = c.create_tensor(tn("DEC_ATTN_Q", "weight", i), (n_embd, n_embd_k_gqa))
        layer.wk = c.create_tensor(tn("DEC_ATTN_K", "weight", i), (n_embd, n_embd_k_gqa))
        layer.wv = c.create_tensor(tn("DEC_ATTN_V", "weight", i), (n_embd, n_embd_v_gqa))
        layer.wo = c.create_tensor(tn("DEC_ATTN_OUT", "weight", i), (n_embd_v_gqa, n_embd))
        layer.attn_norm_cross = c.create_tensor(tn("DEC_CROSS_ATTN_NORM", "weight", i), (n_embd,))
        # unused by the graph (and skipped in a file without data, TENSOR_SKIP_IF_VIRTUAL)
        layer.attn_rel_b_cross = c.create_tensor(tn("DEC_CROSS_ATTN_REL_B", "weight", i),
                                                 (n_head, hp.n_rel_attn_bkts), TENSOR_NOT_REQUIRED)
        layer.wq_cross = c.create_tensor(tn("DEC_CROSS_ATTN_Q", "weight", i), (n_embd, n_embd_k_gqa))
        layer.wk_cross = c.create_tensor(tn("DEC_CROSS_ATTN_K", "weight", i), (n_embd, n_embd_k_gqa))
        layer.wv_cross = c.create_tensor(tn("DEC_CROSS_ATTN_V", "weight", i), (n_embd, n_embd_v_gqa))
        layer.wo_cross = c.create_tensor(tn("DEC_CROSS_ATTN_OUT", "weight", i), (n_embd_v_gqa, n_embd))
        layer.ffn_norm = c.create_tensor(tn("DEC_FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("DEC_FFN_GATE", "weight", i), (n_embd, n_ff), TENSOR_NOT_REQUIRED)
        layer.ffn_down = c.create_tensor(tn("DEC_FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("DEC_FFN_UP", "weight", i), (n_embd, n_ff))


def _rel_b(layer: Optional[Tensor], layer0: Optional[Tensor], what: str, il: int) -> Tensor:
    """The layer's relative position bias table, else layer 0's (only layer 0 has one in converted files)."""
    rel_b = layer if layer is not None else layer0
    if rel_b is None:   # ggml_get_rows(ctx0, NULL, ...) dereferences the missing table
        raise GGMLAbort(f"llama.cpp would crash (build_pos_bias reads a missing tensor): {what} layer {il} has no "
                        f"relative position bias (attn_rel_b) and layer 0 none to share")
    return rel_b


def _ffn(g: GraphContext, cur: Tensor, up: Tensor, gate: Tensor, down: Tensor, il: int) -> Tensor:
    """T5 uses relu, flan-T5 uses gelu-gated"""
    return g.build_ffn(cur, up, None, gate, None, down, None, LLM_FFN_GELU if gate is not None else LLM_FFN_RELU,
                       LLM_FFN_PAR if gate is not None else LLM_FFN_SEQ, il)


def build(g: GraphContext) -> None:
    """llama_model_t5::graph<false>: the decoder."""
    model, hp, ub = g.model, g.hparams, g.ubatch
    n_embd_head = hp.n_embd_head_v()
    n_head, n_head_kv = hp.n_head(), hp.n_head_kv()
    if n_embd_head != hp.n_embd_head_k():
        raise GGMLAbort("llama.cpp would abort (t5.cpp GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))")
    inp_l = g.build_inp_embd(model.tok_embd)
    embd_enc = g.build_inp_cross_embd()
    pos_bucket_dec = g.build_inp_pos_bucket_dec()
    n_outputs_enc = embd_enc.ne[1]
    inp_attn_self = g.build_attn_inp_kv()
    inp_attn_cross = g.build_attn_inp_cross()
    inp_out_ids = g.build_inp_out_ids()

    for il in range(hp.dec_n_layer):
        layer = model.layers[il]
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, n_head, n_head_kv, il)
        kq_b = g.build_pos_bias(pos_bucket_dec, _rel_b(layer.attn_rel_b, model.layers[0].attn_rel_b, "decoder", il))
        cur = g.build_attn(inp_attn_self, layer.wo, layer.bo, q, k, v, 1.0, il, wo_s=layer.wo_s, kq_b=kq_b)
        g.cb(cur, "kqv_out", il)
        cur = ggml.add(cur, inp_sa)
        g.cb(cur, "cross_inp", il)
        inp_ca = cur

        cur = g.build_norm(cur, layer.attn_norm_cross, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm_cross", il)
        q = g.build_lora_mm(layer.wq_cross, cur)
        g.cb(q, "Qcur", il)
        k = g.build_lora_mm(layer.wk_cross, embd_enc)
        g.cb(k, "Kcur", il)
        v = g.build_lora_mm(layer.wv_cross, embd_enc)
        g.cb(v, "Vcur", il)
        q = ggml.reshape(q, n_embd_head, n_head, ub.n_tokens)
        k = ggml.reshape(k, n_embd_head, n_head_kv, n_outputs_enc)
        v = ggml.reshape(v, n_embd_head, n_head_kv, n_outputs_enc)
        cur = g.build_attn(inp_attn_cross, layer.wo_cross, None, q, k, v, 1.0, il)
        g.cb(cur, "kqv_out", il)
        if il == hp.dec_n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_ca = ggml.get_rows(inp_ca, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_ca)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = _ffn(g, cur, layer.ffn_up, layer.ffn_gate, layer.ffn_down, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = inp_l
    g.cb(cur, "result_embd", -1)
    cur = g.build_norm(cur, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


def build_encoder(g: GraphContext) -> None:
    """llama_model_t5::graph<true>: the encoder (llama_model_t5encoder's only graph)."""
    model, hp, ub = g.model, g.hparams, g.ubatch
    n_embd_head = hp.n_embd_head_v()
    n_head, n_head_kv = hp.n_head(), hp.n_head_kv()
    if n_embd_head != hp.n_embd_head_k():
        raise GGMLAbort("llama.cpp would abort (t5.cpp GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))")
    inp_l = g.build_inp_embd(model.tok_embd)
    pos_bucket_enc = g.build_inp_pos_bucket_enc()
    inp_attn = g.build_attn_inp_no_cache()
    inp_out_ids = g.build_inp_out_ids()

    for il in range(hp.n_layer):
        layer = model.layers[il]
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm_enc, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        q = g.build_lora_mm(layer.wq_enc, cur)
        g.cb(q, "Qcur", il)
        k = g.build_lora_mm(layer.wk_enc, cur)
        g.cb(k, "Kcur", il)
        v = g.build_lora_mm(layer.wv_enc, cur)
        g.cb(v, "Vcur", il)
        q = ggml.reshape(q, n_embd_head, n_head, ub.n_tokens)
        k = ggml.reshape(k, n_embd_head, n_head_kv, ub.n_tokens)
        v = ggml.reshape(v, n_embd_head, n_head_kv, ub.n_tokens)
        kq_b = g.build_pos_bias(pos_bucket_enc,
                                _rel_b(layer.attn_rel_b_enc, model.layers[0].attn_rel_b_enc, "encoder", il))
        cur = g.build_attn(inp_attn, layer.wo_enc, None, q, k, v, 1.0, il, kq_b=kq_b)
        g.cb(cur, "kqv_out", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm_enc, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = _ffn(g, cur, layer.ffn_up_enc, layer.ffn_gate_enc, layer.ffn_down_enc, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = inp_l
    g.cb(cur, "result_embd", -1)
    cur = g.build_norm(cur, model.output_norm_enc, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    ggml.build_forward_expand(g.gf, cur)
