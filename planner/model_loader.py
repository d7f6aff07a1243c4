"""What llama_model_loader (src/llama-model-loader.cpp) checks while it reads a GGUF: typed keys,
per-layer arrays, and tensors whose shapes must be the ones the hyperparameters imply.

Every refusal is one UnsupportedModel line naming the key or tensor, the value found and what
llama.cpp requires; nothing is allocated in proportion to a header value before it is bounded.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, NamedTuple, Optional

from .arch import LLM_TENSOR_INFOS
from .download import read_model_header
from .gguf import ARRAY, BOOL, FLOAT32, INT32, STRING, UINT16, UINT32, UINT64, GGUFError, _type_name, shown
from .hparams import LLAMA_MAX_LAYERS, UnsupportedModel
from .params import KvOverride
from .split import LLM_KV_SPLIT_COUNT, LLM_KV_SPLIT_NO, LLM_KV_SPLIT_TENSORS_COUNT, list_splits, llama_split_path, llama_split_prefix

if TYPE_CHECKING:
    from .gguf import GGUFHeader, TensorInfo

# llama_model_loader's create_tensor flags; TENSOR_SKIP: a tensor in the file that is counted as
# used but not loaded (the NextN layers when load_mtp is off, as llama_model_default_params has it);
# TENSOR_ALLOW_RESHAPE: the file's shape may differ, only the element count must match; TENSOR_READ_LAZY:
# read on demand when large (see TensorCreator)
TENSOR_NOT_REQUIRED, TENSOR_DUPLICATED, TENSOR_SKIP, TENSOR_ALLOW_RESHAPE, TENSOR_READ_LAZY = 1, 2, 4, 16, 32

# the array element types get_arr reads at all (others: "is not a string/float32/uint32/int32/uint64 array")
_ARRAY_ELEM_TYPES = (BOOL, UINT32, INT32, UINT64, FLOAT32, STRING)


class TensorWeight(NamedTuple):
    """llama_tensor_weight: the file holding a tensor (its index in the loader's files), where its
    data starts there, and its info."""
    idx: int
    offs: int
    info: TensorInfo


@dataclass(frozen=True)
class TN:
    """LLM_TN_IMPL: a tensor enum (a key of LLM_TENSOR_INFOS), its GGUF name and the layer."""
    tensor: str
    name: str
    bid: int


def tn(tensor: str, suffix: Optional[str] = None, bid: int = -1) -> TN:
    """LLM_TN(arch)(tensor, suffix, bid): 'blk.%d.attn_q' + '.weight'."""
    fmt = LLM_TENSOR_INFOS[tensor][0]
    name = fmt % bid if "%d" in fmt else fmt
    return TN(tensor, f"{name}.{suffix}" if suffix else name, bid)


class ModelLoader:
    """llama_model_loader: the files of the model (one, or the parts of a split GGUF, read from
    the first), the key getters (get_key, get_key_or_arr, get_arr) and the tensor checks."""

    def __init__(self, header: GGUFHeader, header_cache: bool = True, kv_overrides: tuple[KvOverride, ...] = ()):
        self.header = header
        self.header_cache = header_cache   # for split parts given as URLs
        # the constructor's kv_overrides map: the list ends at the first empty key, and of two
        # overrides of one key the first stays (std::unordered_map::insert)
        self.kv_overrides: dict[str, KvOverride] = {}
        for o in kv_overrides:
            if not o.key:
                break
            self.kv_overrides.setdefault(o.key, o)
        self.warnings: list[str] = []   # validate_override's "Bad metadata override type" lines
        self.arch = ""
        self.arch = self._override("general.architecture", STRING)   # get_key(general.architecture, arch_name, false)
        if self.arch is None:
            self.arch = header.arch()
        self.files: list[GGUFHeader] = [header]
        self.n_tensors = len(header.tensors)   # the parts of a split add theirs
        n_split = self.get_u16(LLM_KV_SPLIT_COUNT, 0)
        if n_split > 1:
            self._load_splits(n_split)

    def _add_tensors(self, header: GGUFHeader) -> None:
        for name in header.tensors.names():
            if self.get_weight(name) is not None:
                self.fail(f"invalid model: tensor '{name}' is duplicated")
        self.files.append(header)
        self.n_tensors += len(header.tensors)

    def get_weight(self, name: str) -> Optional[TensorWeight]:
        """llama_model_loader::get_weight: None when no file holds the tensor."""
        for idx, file in enumerate(self.files):
            info = file.tensor(name)
            if info is not None:
                return TensorWeight(idx, file.data_offset + info.offset, info)
        return None

    def tensor_names(self) -> Iterator[str]:
        """The names of every file's tensors (weights_map's keys)."""
        return (name for file in self.files for name in file.tensors.names())

    def _load_splits(self, n_split: int) -> None:
        """The split branch of llama_model_loader's constructor: MODEL must be the first part; the
        others are found by name beside it, each must say which part it is, and together they
        must hold split.tensors.count tensors."""
        path = self.header.path
        idx = self.get_u16(LLM_KV_SPLIT_NO)
        if idx != 0:
            first = llama_split_prefix(path, idx, n_split)
            self.fail(f"illegal split file idx: {idx} (file: {path}), model must be loaded with the first split"
                      + (f": {llama_split_path(first, 0, n_split)}" if first else ""))
        try:
            paths = list_splits(path, idx, n_split)
        except ValueError as e:
            self.fail(str(e))
        for idx in range(1, n_split):
            try:
                part = read_model_header(paths[idx], self.header_cache)
            except (OSError, GGUFError) as e:
                reason = "missing" if isinstance(e, FileNotFoundError) else shown(str(e), 300)
                self.fail(f"failed to load GGUF split from {paths[idx]} ({reason})")
            t = part.kv_types.get(LLM_KV_SPLIT_NO, (None, None))[0]
            if t is None:
                self.fail(f"missing key {LLM_KV_SPLIT_NO} in GGUF split {paths[idx]}")
            if t != UINT16 or part.get(LLM_KV_SPLIT_NO) != idx:   # gguf_get_val_u16 asserts the type
                self.fail(f"invalid split file idx: {shown(repr(part.get(LLM_KV_SPLIT_NO)), 40)} "
                          f"(file: {paths[idx]}), expected {idx}: a part of another split?")
            self._add_tensors(part)
        n_tensors = self._get(LLM_KV_SPLIT_TENSORS_COUNT, INT32, None)
        if n_tensors != self.n_tensors:
            self.fail(f"corrupted model: {n_tensors} tensors expected but {self.n_tensors} found "
                      f"in {n_split} parts: a part of another split?")

    def fail(self, reason: str):
        # names and values from the file may hold anything: one line, of a readable length
        raise UnsupportedModel(f"{self.header.path}: {shown(reason, 1000)}")

    def key(self, kv: str) -> str:
        """LLM_KV: '%s.block_count' with the architecture's name."""
        return kv % self.arch if "%s" in kv else kv

    def _typed(self, key: str, gguf_type: int):
        value = self.header.get(key)
        found = self.header.kv_types.get(key, (None, None))[0]
        if found != gguf_type:
            self.fail(f"key {key} has wrong type {_type_name(*self.header.kv_types[key])} "
                      f"but expected type {_type_name(gguf_type, None)}")
        return value

    def get_u32(self, kv: str, default: Optional[int] = None) -> int:
        """get_key for a uint32_t; without a default the key is required."""
        return self._get(kv, UINT32, default)

    def get_f32(self, kv: str, default: Optional[float] = None) -> float:
        return self._get(kv, FLOAT32, default)

    def get_u16(self, kv: str, default: Optional[int] = None) -> int:
        return self._get(kv, UINT16, default)

    def get_bool(self, kv: str, default: Optional[bool] = None) -> bool:
        return self._get(kv, BOOL, default)

    def get_str(self, kv: str, default: Optional[str] = None) -> str:
        return self._get(kv, STRING, default)

    def _override(self, key: str, gguf_type: int):
        """GGUFMeta::GKV<T>::try_override: the override of key converted to T (the C++ type a gguf_type
        stands for), or None where there is none or its type is not T's (validate_override warns, and
        the file's value is read)."""
        o = self.kv_overrides.get(key)
        if o is None:
            return None
        expected = _OVERRIDE_TAG[gguf_type]
        if o.tag != expected:
            warning = f"Bad metadata override type for key '{key}', expected {expected} but got {o.tag}"
            if warning not in self.warnings:
                self.warnings.append(warning)
            return None
        if gguf_type == UINT32:          # target = val_i64: the integer conversions wrap
            return o.value & 0xFFFFFFFF
        if gguf_type == UINT16:
            return o.value & 0xFFFF
        if gguf_type == INT32:
            return (o.value + (1 << 31)) % (1 << 32) - (1 << 31)
        if gguf_type == FLOAT32:         # double to float
            return _to_float(o.value)
        return o.value

    def found(self, kv: str, gguf_type: int) -> bool:
        """What get_key(kv, T, false) returns: an override of T's type, or the key in the file."""
        key = self.key(kv)
        return self._override(key, gguf_type) is not None or self.header.get(key) is not None

    def _get(self, kv: str, gguf_type: int, default):
        """get_key: an override of the type asked for replaces the file's value (even where the file
        has no such key), one of another type is ignored with a warning."""
        key = self.key(kv)
        value = self._override(key, gguf_type)
        if value is not None:
            return value
        if self.header.get(key) is None:
            if default is None:
                self.fail(f"key not found in model: {key}")
            return default
        return self._typed(key, gguf_type)

    def get_i32_from_u32(self, kv: str, default: int) -> int:
        """get_key into an enum through a uint32_t (the enum's int reads the bits as signed)."""
        value = self.get_u32(kv, default & 0xFFFFFFFF)
        return value - (1 << 32) if value >= 1 << 31 else value

    def get_arr_n_str(self, kv: str) -> int:
        """get_arr into a std::vector<std::string>, not required: its length, 0 where the key is
        absent or not an array; an array of another element type is refused as the loader refuses it."""
        key = self.key(kv)
        if not self.is_array(kv):
            return 0
        elem = self.header.kv_types[key][1]
        if elem not in _ARRAY_ELEM_TYPES or elem == BOOL:
            self.fail(f"{key} is not a string/float32/uint32/int32/uint64 array")
        if elem != STRING:
            self.fail(f"{key} has wrong array element type {_type_name(elem, None)}")
        return len(self.header.get(key))

    def has(self, kv: str) -> bool:
        return self.header.get(self.key(kv)) is not None

    def is_array(self, kv: str) -> bool:
        return self.header.kv_types.get(self.key(kv), (None, None))[0] == ARRAY

    def get_key_or_arr(self, kv: str, n: int, default: Optional[int] = None) -> tuple[int, ...]:
        """get_key_or_arr for uint32_t per-layer values: a scalar for every layer, or an array of
        exactly n (n was bounded by LLAMA_MAX_LAYERS before)."""
        key = self.key(kv)
        value = self.header.get(key)
        if value is None:
            if default is None:
                self.fail(f"key not found in model: {key}")
            return (default,) * n
        if self.header.kv_types[key][0] != ARRAY:   # get_key: an override applies to a scalar in the file
            return (self._get(kv, UINT32, None),) * n
        if len(value) != n:
            self.fail(f"key {key} has wrong array length; expected {n}, got {len(value)}")
        return self.get_arr(kv, (BOOL, UINT32, INT32))

    def get_key_or_arr_f32(self, kv: str, n: int, default: Optional[float] = None) -> tuple[float, ...]:
        """get_key_or_arr for float per-layer values (a float32 scalar, or a float32 array of exactly n)."""
        key = self.key(kv)
        value = self.header.get(key)
        if value is None:
            if default is None:
                self.fail(f"key not found in model: {key}")
            return (default,) * n
        if self.header.kv_types[key][0] != ARRAY:
            return (self._get(kv, FLOAT32, None),) * n
        if len(value) != n:
            self.fail(f"key {key} has wrong array length; expected {n}, got {len(value)}")
        return self.get_arr(kv, (FLOAT32,))

    def get_arr_n(self, kv: str) -> int:
        """get_arr_n (required): the length of an array key."""
        key = self.key(kv)
        if self.header.get(key) is None:
            self.fail(f"key not found in model: {key}")
        if not self.is_array(kv):
            self._typed(key, ARRAY)
        return len(self.header.get(key))

    def get_rope_sections(self) -> tuple[int, ...]:
        """get_key_or_arr(LLM_KV_ROPE_DIMENSION_SECTIONS, hparams.rope_sections, 4, true): into a
        std::array<int, 4>, so a scalar must be an int32 and the values read as signed ints."""
        key = self.key("%s.rope.dimension_sections")
        if self.header.get(key) is not None and self.header.kv_types[key][0] != ARRAY:
            return (self._get("%s.rope.dimension_sections", INT32, None),) * 4
        return tuple(v - (1 << 32) if v >= 1 << 31 else v for v in self.get_key_or_arr("%s.rope.dimension_sections", 4))

    def get_arr(self, kv: str, elem_types: tuple[int, ...], n_max: int = LLAMA_MAX_LAYERS) -> tuple:
        """get_arr into a std::array<T, n_max> of 32-bit integers (elem_types: the element types
        T accepts): the element type must match and the length is bounded; values are read as
        uint32_t (bools as 0 or 1, int32 bit patterns as unsigned)."""
        key = self.key(kv)
        if not self.is_array(kv):
            self.fail(f"array key not found in model: {key}")
        elem = self.header.kv_types[key][1]
        if elem not in _ARRAY_ELEM_TYPES:
            self.fail(f"{key} is not a string/float32/uint32/int32/uint64 array "
                      f"(its elements are {_type_name(elem, None)})")
        if elem not in elem_types:
            self.fail(f"{key} has wrong array element type {_type_name(elem, None)}")
        value = self.header.get(key)
        if len(value) > n_max:
            self.fail(f"array length {len(value)} for key {key} exceeds max {n_max}")
        if elem in (BOOL, INT32):
            return tuple(int(v) & 0xFFFFFFFF for v in value)
        return tuple(value)

    def get_arr_i32(self, kv: str) -> tuple[int, ...]:
        """get_arr into a std::vector<int32_t> (required): an int32 or uint32 array of any length,
        values read as signed; a bool array is not one the vector overload reads."""
        key = self.key(kv)
        if not self.is_array(kv):
            self.fail(f"array key not found in model: {key}")
        elem = self.header.kv_types[key][1]
        if elem not in _ARRAY_ELEM_TYPES or elem == BOOL:
            self.fail(f"{key} is not a string/float32/uint32/int32/uint64 array "
                      f"(its elements are {_type_name(elem, None)})")
        if elem not in (UINT32, INT32):
            self.fail(f"{key} has wrong array element type {_type_name(elem, None)}")
        return tuple(v - (1 << 32) if v >= 1 << 31 else v for v in (int(x) & 0xFFFFFFFF for x in self.header.get(key)))

    def n_tokens(self) -> int:
        """vocab.n_tokens(): the length of tokenizer.ggml.tokens (its count is bounded by the reader); without
        a vocabulary (tokenizer.ggml.model "none" or "no_vocab": wavtokenizer-dec) the %s.vocab_size dummy
        tokens llama_vocab::impl::load adds."""
        if self.get_str("tokenizer.ggml.model", "") in ("none", "no_vocab"):
            return self.get_u32("%s.vocab_size", 0)
        return self.header.array_len("tokenizer.ggml.tokens") if self.header.get("tokenizer.ggml.tokens") is not None else 0

    def check_tensor_dims(self, name: str, ne: tuple[int, ...], required: bool,
                          allow_reshape: bool = False) -> Optional[TensorInfo]:
        """llama_model_loader::check_tensor_dims (allow_reshape: the element counts only)"""
        weight = self.get_weight(name)
        if weight is None:
            if required:
                self.fail(f"tensor '{name}' not found (llama.cpp: check_tensor_dims)")
            return None
        cur = weight.info
        want = tuple(ne) + (1,) * (4 - len(ne))
        have = tuple(cur.ne) + (1,) * (4 - len(cur.ne))
        if allow_reshape and math.prod(want) == math.prod(have):
            return cur
        if want != have:
            self.fail(f"tensor '{name}' has wrong shape; expected {_fmt_ne(want)}, got {_fmt_ne(have)}")
        return cur


# the override type each getter's C++ type takes (try_override's overloads)
_OVERRIDE_TAG = {BOOL: "bool", UINT16: "int", UINT32: "int", INT32: "int", FLOAT32: "float", STRING: "str"}


def _to_float(x: float) -> float:
    """A double converted to float: rounded to nearest, beyond the float range an infinity."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _fmt_ne(ne: tuple[int, ...]) -> str:
    return ", ".join(f"{d:5d}" for d in ne)
