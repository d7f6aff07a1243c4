"""LLM_ARCH_GEMMA4_ASSISTANT (src/models/gemma4-assistant.cpp): the Gemma 4 assistant, an MTP drafter
in a file of its own (llama-server --spec-type draft-mtp -md FILE).

Its blocks are all NextN layers (nextn_predict_layers = block_count): Q-only attention over its
target's K/V cache (llama_kv_cache_iswa over mem_other, create_memory), fed the target's token
embedding and hidden state. Its graph reads the target's token_embd and its cache the target's
memory through ctx_other, which llama_context requires for this architecture ("Gemma4Assistant
requires ctx_other to be set"): llama.cpp creates its context only beside the target. The plan loads
the file as llama.cpp does (every tensor and key checked) and refuses the context alone in one line;
common_fit_params measures the draft alone, fails there and fits the model without it, as `fit` does.
"""
from __future__ import annotations

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
