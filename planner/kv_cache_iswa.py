"""llama_kv_cache_iswa (src/llama-kv-cache-iswa.cpp): the dense layers in a base cache of the full
context, the sliding-window layers in a smaller SWA cache beside it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .cparams import CParams, pad
from .hparams import HParams
from .kv_cache import KVCache, create_kv_cache, sum_breakdowns


@dataclass
class KVCacheISWA:
    base: KVCache
    swa: KVCache

    def memory_breakdown(self) -> dict[str, int]:
        """Per buffer type, the base cache's bytes plus the SWA cache's."""
        return sum_breakdowns(self.base, self.swa)


def swa_size(hp: HParams, cp: CParams, unified: Optional[bool] = None) -> int:
    """The SWA cache's cells: the window of every sequence plus a ubatch, padded to 256 (always,
    for performance: llama.cpp issue 17037), at most the base size; --swa-full: the base size.
    unified: the context's -kvu unless the caller's memory says otherwise."""
    unified = cp.kv_unified if unified is None else unified
    if cp.swa_full:
        return cp.n_ctx_seq
    return pad(min(cp.n_ctx_seq, hp.n_swa * (cp.n_seq_max if unified else 1) + cp.n_ubatch), 256)


def create_kv_cache_iswa(hp: HParams, cp: CParams, v_trans: bool, buft_for_layer, layer_filter=None,
                         reuse=None, unified: Optional[bool] = None, mem_other: Optional[KVCacheISWA] = None,
                         share=None) -> KVCacheISWA:
    """unified: the context's -kvu unless the caller's memory says otherwise (DeepSeek-V4's raw
    cache is never unified). mem_other: the iswa cache of ctx_other, whose base and SWA caches the
    base and SWA caches share layers with (`share`, see create_kv_cache)."""
    unified = cp.kv_unified if unified is None else unified

    def cache(size: int, swa: bool, other: Optional[KVCache]) -> KVCache:
        return create_kv_cache(hp, cp.type_k, cp.type_v, v_trans, size, cp.n_seq_max, unified, buft_for_layer,
                               lambda il: hp.is_swa(il) == swa and (layer_filter is None or layer_filter(il)), reuse,
                               other=other, share=share)
    return KVCacheISWA(cache(cp.n_ctx_seq, False, mem_other.base if mem_other else None),
                       cache(swa_size(hp, cp, unified), True, mem_other.swa if mem_other else None))
