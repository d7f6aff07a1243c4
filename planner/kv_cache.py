"""The unified KV cache: tensors, buffers and graph views (src/llama-kv-cache.cpp)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..backends.types import BufferType
from . import ggml
from .gallocr import alloc_ctx_tensors
from .ggml import Buffer, GGMLAbort, Tensor
from .hparams import HParams


# the architectures whose indexer keys always get a Hadamard rotation (llama_kv_cache::llama_kv_cache)
DSA_ARCHS = frozenset({"deepseek32", "deepseek4", "dots3note", "glm-dsa"})


@dataclass
class KVLayer:
    il: int
    k: Tensor
    v: Optional[Tensor]   # None with multi-head latent attention


@dataclass
class KVCache:
    hparams: HParams
    type_k: int
    type_v: int
    v_trans: bool
    kv_size: int
    n_stream: int
    layers: dict[int, KVLayer]                                 # map_layer_ids: model layer -> its K/V
    buffers: dict[str, Buffer] = field(default_factory=dict)   # buft name -> buffer
    n_embd_head_k_all: int = 0                                 # the layers' head size; -1 when they differ
    attn_rot_k: bool = False
    attn_rot_v: bool = False

    def get_n_kv(self) -> int:
        """The reserve graphs see a full cache (init_full): n_kv is the cache size."""
        return self.kv_size

    def memory_breakdown(self) -> dict[str, int]:
        return {name: b.size for name, b in self.buffers.items()}

    # --- graph pieces (llama_kv_cache::get_k / get_v / cpy_k / cpy_v / build_input_*) ---

    def get_k(self, il: int) -> Tensor:
        k = self.layers[il].k
        hp, n_kv = self.hparams, self.get_n_kv()
        return ggml.view(k, (hp.n_embd_head_k(il), hp.n_head_kv(il), n_kv, self.n_stream),
                         (ggml.row_size(k.type, hp.n_embd_head_k(il)), ggml.row_size(k.type, k.ne[0]),
                          ggml.row_size(k.type, k.ne[0] * self.kv_size)), 0)

    def get_v(self, il: int) -> Tensor:
        v = self.layers[il].v
        hp, n_kv = self.hparams, self.get_n_kv()
        if not self.v_trans:
            return ggml.view(v, (hp.n_embd_head_v(il), hp.n_head_kv(il), n_kv, self.n_stream),
                             (ggml.row_size(v.type, hp.n_embd_head_v(il)), ggml.row_size(v.type, v.ne[0]),
                              ggml.row_size(v.type, v.ne[0] * self.kv_size)), 0)
        return ggml.view(v, (n_kv, hp.n_head_kv(il), hp.n_embd_head_v(il), self.n_stream),
                         (ggml.row_size(v.type, self.kv_size * hp.n_embd_head_v(il)), ggml.row_size(v.type, self.kv_size),
                          ggml.row_size(v.type, self.kv_size * v.ne[0])), 0)

    def cpy_k(self, k_cur: Tensor, k_idxs: Tensor, il: int) -> Tensor:
        k = self.layers[il].k
        n_embd_gqa = k_cur.ne[0] * k_cur.ne[1]
        k_cur = ggml.view(k_cur, (n_embd_gqa, k_cur.ne[2]), (k_cur.nb[2],), 0)
        if self.n_stream > 1:
            k = ggml.reshape(k, n_embd_gqa, self.kv_size * self.n_stream)
        return ggml.set_rows(k, k_cur, k_idxs)

    def cpy_v(self, v_cur: Tensor, v_idxs: Tensor, il: int) -> Tensor:
        v = self.layers[il].v
        n_embd_gqa = v_cur.ne[0] * v_cur.ne[1]
        n_tokens = v_cur.ne[2]
        if not self.v_trans:
            v_cur = ggml.view(v_cur, (n_embd_gqa, n_tokens), (v_cur.nb[2],), 0)
            if self.n_stream > 1:
                v = ggml.reshape(v, n_embd_gqa, self.kv_size * self.n_stream)
            return ggml.set_rows(v, v_cur, v_idxs)
        if ggml.row_size(v_cur.type, n_embd_gqa) == v_cur.nb[2]:
            v_cur = ggml.reshape(v_cur, n_embd_gqa, n_tokens)
        else:
            v_cur = ggml.cont(v_cur, n_embd_gqa, n_tokens)
        if n_embd_gqa < v.ne[0]:   # [TAG_V_CACHE_VARIABLE]: padded to the widest layer
            v_cur = ggml.pad(v_cur, v.ne[0] - n_embd_gqa, 0, 0, 0)
        v_view = ggml.reshape(v, 1, v.nelements())
        v_cur = ggml.reshape(v_cur, 1, v_cur.nelements())
        return ggml.set_rows(v_view, v_cur, v_idxs)

    def build_input_k_idxs(self, n_tokens: int) -> Tensor:
        t = ggml.new_tensor(ggml.T.I64, n_tokens)
        t.set_input()
        t.name = "attn_inp_k_idxs"
        return t

    def build_input_v_idxs(self, n_tokens: int) -> Tensor:
        n = n_tokens if not self.v_trans else n_tokens * self.hparams.n_embd_v_gqa_max()
        t = ggml.new_tensor(ggml.T.I64, n)
        t.set_input()
        t.name = "attn_inp_v_idxs"
        return t

    def build_input_k_rot(self) -> Tensor | None:
        if not self.attn_rot_k:
            return None
        if self.n_embd_head_k_all == 0:
            # the lightning indexer's cache of a DeepSeek-V4 model without a CSA layer: rotated, but no layer
            raise GGMLAbort("llama.cpp would crash (SIGFPE) in llama_kv_cache::build_input_k_rot: the K rotation of "
                            "a cache without layers (head size 0) doubles its int size until it overflows to 0, then "
                            "divides by it")
        nrot = 64
        while True:   # the largest power of two >= 64 dividing the head size
            nrot *= 2
            if self.n_embd_head_k_all % nrot != 0:
                break
        nrot //= 2
        return self._rot_input(nrot, "attn_inp_k_rot")

    def build_input_v_rot(self) -> Tensor | None:
        return self._rot_input(64, "attn_inp_v_rot") if self.attn_rot_v else None

    @staticmethod
    def _rot_input(nrot: int, name: str) -> Tensor:
        t = ggml.new_tensor(ggml.T.F32, nrot, nrot)
        t.set_input()
        t.name = name
        return t


def sum_breakdowns(*memories) -> dict[str, int]:
    """The memory_breakdown of memories made of several (llama_kv_cache_iswa, _dsa, _msa,
    llama_memory_hybrid): per buffer type, the sum of theirs."""
    out: dict[str, int] = {}
    for mem in memories:
        for name, size in mem.memory_breakdown().items():
            out[name] = out.get(name, 0) + size
    return out


def create_kv_cache(hp: HParams, type_k: int, type_v: int, v_trans: bool, kv_size: int, n_seq_max: int,
                    unified: bool, buft_for_layer, layer_filter=None, reuse=None, name_tag: str = "",
                    other: Optional[KVCache] = None, share=None) -> KVCache:
    """llama_kv_cache::llama_kv_cache: one K and one V tensor per layer that has its own K/V
    (hparams.has_kv) and passes the filter, one buffer per buffer type; `reuse(il)` (the layer whose
    K/V a layer reads, or -1) maps the other layers onto those of earlier ones.

    `buft_for_layer(il)` gives the layer's BufferType (the device of the layer, or CPU without offload).
    Buffers come from gallocr.alloc_ctx_tensors (ggml_backend_alloc_ctx_tensors_from_buft), one per
    buffer type, visited in buffer-type name order as llama.cpp's ctx_map sorts them. name_tag keeps
    the tensor names of a model's second cache unique (cache_<tag>k_l<il>).

    other (mem_other: the cache of the context's ctx_other) and `share(il)` (the other's layer whose
    K/V a layer reads, or -1): a shared layer holds the other's K and V tensors, no tensor of its own;
    the cache then takes the other's size (shared cells view the source tensors), its head sizes and
    rotations ([TAG_KV_CACHE_SHARE_CELLS]).
    """
    if other is not None:
        kv_size = other.kv_size   # "kv_size = %u overridden to %u to match the shared source cache"
    n_stream = 1 if unified else n_seq_max
    layers: dict[int, KVLayer] = {}
    by_buft: dict[str, tuple[BufferType, list[Tensor]]] = {}
    n_embd_head_k_all = n_embd_head_v_all = 0
    is_mla = hp.is_mla()
    for il in range(hp.n_layer_all):    # the NextN layers too, unless the filter drops them
        if not hp.has_kv(il) or (layer_filter is not None and not layer_filter(il)):
            continue
        if share is not None and other is not None and share(il) >= 0:
            # other->layers[other->map_layer_ids[il_share]]: a layer the other does not map reads its first
            src = other.layers.get(share(il)) or next(iter(other.layers.values()), None)
            if src is None:
                raise GGMLAbort(f"llama.cpp would crash creating the KV cache: layer {il} shares the K/V of layer "
                                f"{share(il)} of a cache without layers")
            layers[il] = KVLayer(il, src.k, src.v)
            continue
        if n_embd_head_k_all == 0:
            n_embd_head_k_all = hp.n_embd_head_k(il)
        elif n_embd_head_k_all > 0 and n_embd_head_k_all != hp.n_embd_head_k(il):
            n_embd_head_k_all = -1
        if not is_mla:
            if n_embd_head_v_all == 0:
                n_embd_head_v_all = hp.n_embd_head_v(il)
            elif n_embd_head_v_all > 0 and n_embd_head_v_all != hp.n_embd_head_v(il):
                n_embd_head_v_all = -1
        # [TAG_V_CACHE_VARIABLE]: a transposed V cache is padded to the widest layer
        n_embd_v = hp.n_embd_v_gqa(il) if not v_trans else hp.n_embd_v_gqa_max()
        k = ggml.new_tensor(type_k, hp.n_embd_k_gqa(il), kv_size, n_stream)
        k.name = f"cache_{name_tag}k_l{il}"
        v = None
        if not is_mla:   # multi-head latent attention reads V from the K cache
            v = ggml.new_tensor(type_v, n_embd_v, kv_size, n_stream)
            v.name = f"cache_{name_tag}v_l{il}"
        layers[il] = KVLayer(il, k, v)
        buft = buft_for_layer(il)
        by_buft.setdefault(buft.name, (buft, []))[1].extend(t for t in (k, v) if t is not None)
    if reuse is not None:
        for il in range(hp.n_layer_all):
            il_reuse = reuse(il)
            if il_reuse < 0 or (layer_filter is not None and not layer_filter(il)):
                continue
            if il_reuse not in layers:
                raise GGMLAbort(f"llama.cpp would abort creating the KV cache (llama-kv-cache.cpp GGML_ASSERT): layer "
                                f"{il} reuses the K/V of layer {il_reuse}, which this cache does not hold")
            layers[il] = layers[il_reuse]
    cache = KVCache(hp, type_k, type_v, v_trans, kv_size, n_stream, layers, n_embd_head_k_all=n_embd_head_k_all)
    for name in sorted(by_buft):
        buft, tensors = by_buft[name]
        cache.buffers[name] = alloc_ctx_tensors(buft, tensors, usage="any")
    if other is not None:
        cache.n_embd_head_k_all = other.n_embd_head_k_all
        cache.attn_rot_k, cache.attn_rot_v = other.attn_rot_k, other.attn_rot_v
        return cache
    # attn_rot_k/v: Hadamard rotations for quantized caches whose layers share one head size
    # (the % 64 checks read layer 0's head size, as llama.cpp's n_embd_head_k() does)
    cache.attn_rot_k = n_embd_head_k_all > 0 and ggml.is_quantized(type_k) and hp.n_embd_head_k() % 64 == 0
    # always for the lightning indexer's keys (the DSA cache's hparams give them the indexer head size)
    if hp.arch in DSA_ARCHS and hp.n_embd_head_k_full == hp.indexer_head_size:
        cache.attn_rot_k = True
    cache.attn_rot_v = n_embd_head_v_all > 0 and ggml.is_quantized(type_v) and hp.n_embd_head_v() % 64 == 0
    return cache
