"""LLM_ARCH_DFLASH (src/models/dflash.cpp): DFlash block-diffusion drafters (z-lab's Qwen3/Qwen3.5
DFlash, DFlash2 with convolutions and a selector, DSpark with a Markov head), loaded by llama-server
with --spec-type draft-dflash / draft-dspark -md FILE.

The drafters share their target's token embedding and lm_head (converted without them): llama_context
then reads the target's through ctx_other and requires it ("dflash requires ctx_other to be set"), so
llama.cpp creates their context only beside the target. The plan loads the file as llama.cpp does
(every tensor and key checked) and refuses the context alone in one line; common_fit_params measures
the draft alone, fails there and fits the model without it, as `fit` does. A drafter with its own
embedding and head, which llama.cpp runs alone, and the DeepSeek-V4 DSpark backbone
(hyper_connection.count) are not planned.
"""
from __future__ import annotations

from ..gguf import BOOL, INT32, UINT32
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX   # llama_model_rope_type: NeoX unless the DSV4 backbone


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_embedding_scale = ml.get_f32("%s.embedding_scale", hp.f_embedding_scale)
    hp.f_attention_scale = ml.get_f32("%s.attention.scale", hp.f_attention_scale)
    hp.f_attn_value_scale = ml.get_f32("%s.attention.value_scale", hp.f_attn_value_scale)
    hidden_act = ml.get_str("%s.hidden_activation", "silu")
    if hidden_act not in ("silu", "gelu", "gelu_pytorch_tanh"):
        ml.fail(f"unsupported DFlash hidden activation: {hidden_act}")
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
