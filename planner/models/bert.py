"""LLM_ARCH_BERT (src/models/bert.cpp): BERT encoders for embeddings and reranking (bge, MiniLM,
e5, ...).

No memory: non-causal attention over the ubatch alone (build_attn_inp_no_cache). Token rows plus
the first token-type row and learned positions, a LayerNorm over the embeddings, then post-norm
blocks: attention (Q/K/V with biases), residual and LayerNorm, a GELU FFN with biases, residual and
LayerNorm. The graph ends at result_embd (t_embd, no lm_head); build_pooling pools it. The graph
is llama_model_bert::graph, which jina-bert-v2, jina-bert-v3, nomic-bert and nomic-bert-moe share
(models.h `using graph = llama_model_bert::graph`): build() takes their branches as the C++ does.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_GEGLU, LLM_FFN_GELU, LLM_FFN_PAR, LLM_FFN_SEQ, LLM_FFN_SILU, LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require_equal_head_sizes
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX   # applied only by nomic-bert, nomic-bert-moe and jina-bert-v3


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    require_equal_head_sizes(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd = hp.n_embd
    create_tok_embd(c, model)
    model.pos_embd = c.create_tensor(tn("POS_EMBD", "weight"), (n_embd, hp.n_ctx_train))
    model.cls = c.create_tensor(tn("CLS", "weight"), (n_embd, n_embd), TENSOR_NOT_REQUIRED)
    model.cls_b = c.create_tensor(tn("CLS", "bias"), (n_embd,), TENSOR_NOT_REQUIRED)
    model.cls_out = c.create_tensor(tn("CLS_OUT", "weight"), (n_embd, hp.n_cls_out), TENSOR_NOT_REQUIRED)
    model.cls_out_b = c.create_tensor(tn("CLS_OUT", "bias"), (hp.n_cls_out,), TENSOR_NOT_REQUIRED)
    create_tok_norm(c, model)
    for i, layer in enumerate(model.layers):
        create_attn(c, layer, i, hp)
        create_ffn(c, layer, i, hp)
        create_layer_out_norm(c, layer, i, hp)


# --- the loaders' shared parts (bert, nomic-bert, nomic-bert-moe, jina-bert-v3 create them alike) --------

def create_tok_embd(c: TensorCreator, model: Model) -> None:
    """The token rows and the optional token-type rows; a model without token types is refused."""
    hp = model.hparams
    if hp.n_token_types == 0:
        c.ml.fail(f"{hp.arch} model needs to define token type count")
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (hp.n_embd, hp.n_vocab))
    model.type_embd = c.create_tensor(tn("TOKEN_TYPES", "weight"), (hp.n_embd, hp.n_token_types), TENSOR_NOT_REQUIRED)


def create_tok_norm(c: TensorCreator, model: Model) -> None:
    model.tok_norm = c.create_tensor(tn("TOKEN_EMBD_NORM", "weight", 0), (model.hparams.n_embd,))
    model.tok_norm_b = c.create_tensor(tn("TOKEN_EMBD_NORM", "bias", 0), (model.hparams.n_embd,))


def create_attn(c: TensorCreator, layer, i: int, hp: HParams) -> None:
    """Q/K/V, the output projection (its bias optional) and the post-attention LayerNorm."""
    n_embd, n_embd_gqa = hp.n_embd, hp.n_embd_v_gqa()
    c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
    layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
    layer.attn_out_norm = c.create_tensor(tn("ATTN_OUT_NORM", "weight", i), (n_embd,))
    layer.attn_out_norm_b = c.create_tensor(tn("ATTN_OUT_NORM", "bias", i), (n_embd,))


def create_ffn(c: TensorCreator, layer, i: int, hp: HParams) -> None:
    """The ungated FFN, its biases optional."""
    n_embd, n_ff = hp.n_embd, hp.n_ff()
    layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
    layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
    layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
    layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)


def create_layer_out_norm(c: TensorCreator, layer, i: int, hp: HParams) -> None:
    layer.layer_out_norm = c.create_tensor(tn("LAYER_OUT_NORM", "weight", i), (hp.n_embd,))
    layer.layer_out_norm_b = c.create_tensor(tn("LAYER_OUT_NORM", "bias", i), (hp.n_embd,))


def build(g: GraphContext) -> None:
    """llama_model_bert::graph"""
    model, hp = g.model, g.hparams
    arch = hp.arch
    n_embd, n_embd_head, n_tokens = hp.n_embd, hp.n_embd_head_v(), g.ubatch.n_tokens
    inp_pos = g.build_inp_pos() if arch != "jina-bert-v2" else None
    inp_l = g.build_inp_embd(model.tok_embd)
    if model.type_embd is not None:   # token types are hardcoded to zero ("Sentence A")
        inp_l = ggml.add(inp_l, ggml.view(model.type_embd, (n_embd,), (), 0))
    if arch == "bert":
        inp_l = ggml.add(ggml.get_rows(model.pos_embd, inp_pos), inp_l)
    g.cb(inp_l, "inp_embd", -1)
    inp_l = g.build_norm(inp_l, model.tok_norm, model.tok_norm_b, LLM_NORM, 0)
    g.cb(inp_l, "inp_norm", 0)
    inp_attn = g.build_attn_inp_no_cache()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = inp_l
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        if layer.attn_q_norm is not None:
            q = ggml.reshape(q, n_embd_head * hp.n_head(), n_tokens)
            q = g.build_norm(q, layer.attn_q_norm, layer.attn_q_norm_b, LLM_NORM, il)
            q = ggml.reshape(q, n_embd_head, hp.n_head(), n_tokens)
        if layer.attn_k_norm is not None:
            k = ggml.reshape(k, n_embd_head * hp.n_head_kv(), n_tokens)
            k = g.build_norm(k, layer.attn_k_norm, layer.attn_k_norm_b, LLM_NORM, il)
            k = ggml.reshape(k, n_embd_head, hp.n_head_kv(), n_tokens)
        if arch in ("nomic-bert", "nomic-bert-moe", "jina-bert-v3"):
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0 / math.sqrt(n_embd_head), il, wo_s=layer.wo_s)
        g.cb(cur, "kqv_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        cur = ggml.add(cur, inp_l)   # re-add the layer input
        cur = g.build_norm(cur, layer.attn_out_norm, layer.attn_out_norm_b, LLM_NORM, il)
        if layer.attn_norm_2 is not None:
            cur = ggml.add(cur, inp_l)
            cur = g.build_norm(cur, layer.attn_norm_2, layer.attn_norm_2_b, LLM_NORM, il)
        ffn_inp = cur
        g.cb(ffn_inp, "ffn_inp", il)

        if hp.moe_every_n_layers > 0 and il % hp.moe_every_n_layers == 1:
            cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, None, layer.ffn_down_exps, None,
                                  hp.n_expert, hp.n_expert_used(), LLM_FFN_GELU, False, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
            g.cb(cur, "ffn_moe_out", il)
        elif arch in ("bert", "nomic-bert-moe", "jina-bert-v3"):
            cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, None, None, layer.ffn_down, layer.ffn_down_b,
                              LLM_FFN_GELU, LLM_FFN_SEQ, il)
            g.cb(cur, "ffn_out", il)
        elif arch == "jina-bert-v2":
            up_contains_gate = layer.ffn_gate is None and layer.ffn_up.ne[1] != hp.n_ff()
            cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, None, layer.ffn_down,
                              layer.ffn_down_b, LLM_FFN_GEGLU if up_contains_gate else LLM_FFN_GELU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)   # attentions bypass the intermediate layer
        cur = g.build_norm(cur, layer.layer_out_norm, layer.layer_out_norm_b, LLM_NORM, il)
        inp_l = cur

    g.cb(inp_l, "result_embd", -1)
    g.t_embd = inp_l
    ggml.build_forward_expand(g.gf, inp_l)
