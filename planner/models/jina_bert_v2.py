"""LLM_ARCH_JINA_BERT_V2 (src/models/jina-bert-v2.cpp): jina-embeddings-v2 (small, base; en, de,
es, zh, code), jina-reranker-v1-tiny/turbo.

bert's graph without positions: ALiBi with the loader's max bias 8. Optional per-layer Q/K
LayerNorms and a second post-attention norm (attn_norm_2); the FFN is GEGLU over an ffn_up of twice
n_ff rows (the checkpoint's fused up_gated_layer) or GELU with a separate optional gate, its width
read from the file. A rerank head of one output (cls, no cls.output).
"""
from __future__ import annotations

from ..hparams import HParams
from ..model import Model, TensorCreator, require, require_equal_head_sizes
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .bert import LLAMA_ROPE_TYPE, build, create_layer_out_norm, create_tok_norm  # noqa: F401


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    hp.f_max_alibi_bias = 8.0
    require_equal_head_sizes(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_ff, n_embd_gqa = hp.n_embd, hp.n_ff(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, hp.n_vocab))
    model.type_embd = c.create_tensor(tn("TOKEN_TYPES", "weight"), (n_embd, hp.n_token_types))
    create_tok_norm(c, model)
    model.cls = c.create_tensor(tn("CLS", "weight"), (n_embd, 1), TENSOR_NOT_REQUIRED)
    model.cls_b = c.create_tensor(tn("CLS", "bias"), (1,), TENSOR_NOT_REQUIRED)
    for i, layer in enumerate(model.layers):
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.attn_q_norm_b = c.create_tensor(tn("ATTN_Q_NORM", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.attn_k_norm_b = c.create_tensor(tn("ATTN_K_NORM", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,))
        layer.attn_out_norm = c.create_tensor(tn("ATTN_OUT_NORM", "weight", i), (n_embd,))
        layer.attn_out_norm_b = c.create_tensor(tn("ATTN_OUT_NORM", "bias", i), (n_embd,))
        layer.attn_norm_2 = c.create_tensor(tn("ATTN_NORM_2", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.attn_norm_2_b = c.create_tensor(tn("ATTN_NORM_2", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), TENSOR_NOT_REQUIRED)
        # the up projection's width as the file holds it: n_ff, or 2 n_ff with the gate fused in
        up = c.ml.get_weight(tn("FFN_UP", "weight", i).name)
        n_ffn_up = (tuple(up.info.ne) + (1,))[1] if up is not None else n_ff
        require(c.ml, n_ffn_up in (n_ff, 2 * n_ff),
                f"GGML_ASSERT(n_ffn_up == n_ff || n_ffn_up == n_ff * 2): ffn_up of layer {i} has {n_ffn_up} rows, "
                f"n_ff is {n_ff}")
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ffn_up))
        layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ffn_up,), TENSOR_NOT_REQUIRED)
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,))
        create_layer_out_norm(c, layer, i, hp)
