"""Model hyperparameters read from GGUF keys as llama.cpp derives them.

Mirrors src/llama-model.cpp llama_model::load_hparams and src/models/llama.cpp load_arch_hparams
for the architectures schedplan supports.
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedplan.planner.gguf import GGUFHeader

SUPPORTED_ARCHS = ("llama",)


class UnsupportedModel(Exception):
    """One-line reason why schedplan cannot plan this model."""


@dataclass(frozen=True)
class HParams:
    arch: str
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: tuple[int, ...]        # per layer
    n_head_kv: tuple[int, ...]     # per layer
    n_ff: tuple[int, ...]          # per layer
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int
    n_vocab: int
    n_expert: int
    f_norm_rms_eps: float
    f_attention_scale: float
    rope_freq_base_train: float
    causal_attn: bool = True

    def n_embd_k_gqa(self, il: int) -> int:
        return self.n_embd_head_k * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.n_embd_head_v * self.n_head_kv[il]

    def n_embd_v_gqa_max(self) -> int:
        return max(self.n_embd_v_gqa(il) for il in range(self.n_layer))


def _int(header: GGUFHeader, key: str, value) -> int:
    """An integer GGUF value; anything else (string, float, bool, array) is one clear error, as
    llama.cpp's typed key getters reject it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnsupportedModel(f"{header.path}: GGUF key {key} has {_describe(header, key, value)}, expected an integer")
    return value


def _float(header: GGUFHeader, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsupportedModel(f"{header.path}: GGUF key {key} has {_describe(header, key, value)}, expected a number")
    return float(value)


def _describe(header: GGUFHeader, key: str, value) -> str:
    from schedplan.planner.gguf import _type_name
    t = header.kv_types.get(key)
    return f"a value of type {_type_name(*t)}" if t else f"the value {value!r}"


def _per_layer(header: GGUFHeader, key: str, n_layer: int, default: int | None = None) -> tuple[int, ...]:
    """llama_model_loader::get_key_or_arr: a scalar applies to every layer, an array gives one per layer."""
    value = header.get(key, default)
    if value is None:
        raise UnsupportedModel(f"{header.path}: missing GGUF key {key}")
    if isinstance(value, (list, tuple)):
        if len(value) != n_layer:
            raise UnsupportedModel(f"{header.path}: {key} has {len(value)} entries for {n_layer} layers")
        return tuple(_int(header, key, v) for v in value)
    return (_int(header, key, value),) * n_layer


def _required(header: GGUFHeader, key: str):
    value = header.get(key)
    if value is None:
        raise UnsupportedModel(f"{header.path}: missing GGUF key {key}")
    return value


def _get_int(header: GGUFHeader, key: str, default: int) -> int:
    return _int(header, key, header.get(key, default))


def _get_float(header: GGUFHeader, key: str, default: float) -> float:
    return _float(header, key, header.get(key, default))


def load_hparams(header: GGUFHeader) -> HParams:
    arch = header.arch()
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(
            f"{header.path}: architecture '{arch}' is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    p = f"{arch}."
    n_layer = _int(header, p + "block_count", _required(header, p + "block_count"))
    if n_layer < 1:
        raise UnsupportedModel(f"{header.path}: {p}block_count is {n_layer}: the model has no layers")
    n_embd = _int(header, p + "embedding_length", _required(header, p + "embedding_length"))
    n_head = _per_layer(header, p + "attention.head_count", n_layer)
    n_head_kv = _per_layer(header, p + "attention.head_count_kv", n_layer, default=n_head[0])
    n_ff = _per_layer(header, p + "feed_forward_length", n_layer, default=0)
    if n_head[0] == 0 or n_embd % n_head[0] != 0:
        raise UnsupportedModel(f"{header.path}: n_embd {n_embd} is not a multiple of n_head {n_head[0]}")
    # load_hparams: n_embd_head_k = n_embd / n_head unless attention.key_length says otherwise
    n_embd_head_k = _get_int(header, p + "attention.key_length", n_embd // n_head[0])
    n_embd_head_v = _get_int(header, p + "attention.value_length", n_embd // n_head[0])
    n_rot = _get_int(header, p + "rope.dimension_count", n_embd_head_k)
    # load_arch_hparams (models/llama.cpp): vocab_size key, else the tokenizer's token count
    n_vocab = header.get(p + "vocab_size")
    if n_vocab is None:
        n_vocab = header.array_len("tokenizer.ggml.tokens") if header.get("tokenizer.ggml.tokens") is not None else 0
    n_expert = _get_int(header, p + "expert_count", 0)
    if n_expert:
        raise UnsupportedModel(f"{header.path}: mixture-of-experts llama models are not supported yet")
    return HParams(
        arch=arch,
        n_ctx_train=_int(header, p + "context_length", _required(header, p + "context_length")),
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        n_embd_head_k=n_embd_head_k,
        n_embd_head_v=n_embd_head_v,
        n_rot=n_rot,
        n_vocab=_int(header, p + "vocab_size", n_vocab),
        n_expert=n_expert,
        f_norm_rms_eps=_get_float(header, p + "attention.layer_norm_rms_epsilon", 0.0),
        f_attention_scale=_get_float(header, p + "attention.scale", 0.0),
        rope_freq_base_train=_get_float(header, p + "rope.freq_base", 10000.0),
    )
