"""The special tokens of llama_vocab that decide whether llama.cpp reranks (src/llama-vocab.cpp,
llama_vocab::impl::load): the tokenizer model's default BOS/EOS/SEP ids, the BPE pre-tokenizers
that drop the BOS, the range check of each default, then the tokenizer.ggml.*_token_id keys.

Read from the header alone: the token list only by its length (vocab.n_tokens()).
"""
from __future__ import annotations

from dataclasses import dataclass

from .gguf import STRING
from .hparams import LLAMA_POOLING_TYPE_RANK
from .model_loader import ModelLoader

LLAMA_TOKEN_NULL = -1

# llama_vocab::impl::load: each tokenizer model's default special_bos_id, special_eos_id, special_sep_id
_DEFAULT_BOS_EOS_SEP = {
    "llama":      (1, 2, LLAMA_TOKEN_NULL),                                  # SPM
    "bert":       (101, LLAMA_TOKEN_NULL, 102),                              # WPM
    "gpt2":       (11, 11, LLAMA_TOKEN_NULL),                                # BPE
    "hybriddna":  (11, 11, LLAMA_TOKEN_NULL),
    "whitespace": (11, 11, LLAMA_TOKEN_NULL),
    "t5":         (LLAMA_TOKEN_NULL, 1, LLAMA_TOKEN_NULL),                   # UGM
    "rwkv":       (LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL),
    "test":       (LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL),
    "plamo2":     (1, 2, LLAMA_TOKEN_NULL),
    "gemma4":     (LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL),    # BPE, read from the GGUF
}
_BPE_MODELS = frozenset({"gpt2", "hybriddna", "whitespace", "gemma4"})
# the BPE pre-tokenizers whose branch sets special_bos_id = LLAMA_TOKEN_NULL (LLAMA_VOCAB_PRE_TYPE_CHATGLM4)
_PRE_NO_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})

LLM_KV_TOKENIZER_BOS_ID = "tokenizer.ggml.bos_token_id"
LLM_KV_TOKENIZER_EOS_ID = "tokenizer.ggml.eos_token_id"
LLM_KV_TOKENIZER_SEP_ID = "tokenizer.ggml.seperator_token_id"   # sic, as llama-arch.cpp spells it
LLM_KV_TOKENIZER_CHAT_TEMPLATE = "tokenizer.chat_template"
LLM_KV_TOKENIZER_MERGES = "tokenizer.ggml.merges"


@dataclass(frozen=True)
class Vocab:
    """What llama_vocab_bos/eos/sep return (LLAMA_TOKEN_NULL: none)."""
    tokenizer_model: str
    n_tokens: int
    special_bos_id: int
    special_eos_id: int
    special_sep_id: int


def load_vocab(ml: ModelLoader) -> Vocab:
    """llama_vocab::impl::load, as far as the BOS, EOS and SEP ids go."""
    tokenizer_model = ml.get_str("tokenizer.ggml.model")
    n_tokens = ml.n_tokens()
    if tokenizer_model in ("no_vocab", "none"):     # returns before any special-token key is read
        return Vocab(tokenizer_model, n_tokens, LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL)
    if tokenizer_model not in _DEFAULT_BOS_EOS_SEP:
        ml.fail(f"unknown tokenizer: '{tokenizer_model}'")
    bos, eos, sep = _DEFAULT_BOS_EOS_SEP[tokenizer_model]
    tokenizer_pre = "gemma4" if tokenizer_model == "gemma4" else ml.get_str("tokenizer.ggml.pre", "")
    if tokenizer_model in _BPE_MODELS:   # the BPE branches read the merges (Kimi-K2's tokenizer has none)
        if not ml.has(LLM_KV_TOKENIZER_MERGES):
            if tokenizer_model == "gemma4" or tokenizer_pre != "kimi-k2":
                ml.fail("error loading model vocabulary: cannot find tokenizer merges in model file")
        elif not ml.is_array(LLM_KV_TOKENIZER_MERGES) or ml.header.kv_types[LLM_KV_TOKENIZER_MERGES][1] != STRING:
            ml.fail(f"error loading model vocabulary: invalid gguf type for {LLM_KV_TOKENIZER_MERGES}")
    if tokenizer_model in _BPE_MODELS and tokenizer_pre in _PRE_NO_BOS:
        bos = LLAMA_TOKEN_NULL
    # "special tokens": a default out of the vocabulary is disabled, then a key in range replaces it
    # (one out of range is ignored: "bad special token ..., using default id")
    ids = []
    for kv, default in ((LLM_KV_TOKENIZER_BOS_ID, bos), (LLM_KV_TOKENIZER_EOS_ID, eos), (LLM_KV_TOKENIZER_SEP_ID, sep)):
        if default >= n_tokens:
            default = LLAMA_TOKEN_NULL
        new_id = ml.get_u32(kv, -1)   # -1: no key
        ids.append(new_id if 0 <= new_id < n_tokens else default)
    return Vocab(tokenizer_model, n_tokens, *ids)


def has_chat_template(ml: ModelLoader, name: str) -> bool:
    """llama_model_chat_template(model, name) != NULL: the model's gguf_kv holds every key that is not an
    array (llama_model_base::load_hparams); the one-off Mistral fallback applies to the unnamed template only."""
    key = f"{LLM_KV_TOKENIZER_CHAT_TEMPLATE}.{name}"
    return ml.has(key) and not ml.is_array(key)


# common_init_from_params' warnings (common/common.cpp) where the context pools by rank
RERANK_NO_BOS = "vocab does not have a  BOS token, reranking will not work"
RERANK_NO_EOS_SEP_PROMPT = "vocab does not have an EOS token, SEP token, or rerank prompt. Reranking will not work"


def rerank_warnings(ml: ModelLoader, vocab: Vocab, pooling_type: int) -> list[str]:
    """What common_init_from_params warns of a context pooling by rank whose vocabulary cannot rerank.
    Its `return res` after them still hands llama-server the model and the context (the server listens),
    skipping only the LoRA adapters and the warm-up: the reservation is the same."""
    warnings = []
    if pooling_type != LLAMA_POOLING_TYPE_RANK:
        return warnings
    if vocab.special_bos_id == LLAMA_TOKEN_NULL:
        warnings.append(RERANK_NO_BOS)
    if (vocab.special_eos_id == LLAMA_TOKEN_NULL and vocab.special_sep_id == LLAMA_TOKEN_NULL
            and not has_chat_template(ml, "rerank")):
        warnings.append(RERANK_NO_EOS_SEP_PROMPT)
    return warnings
