"""A fast, safe GGUF header reader (versions 2 and 3, little-endian).

Mirrors the header checks of gguf_init_from_reader (ggml/src/gguf.cpp, llama.cpp 0c1e57098): magic,
version, counts, key and tensor-name rules, ggml types, shapes and the tensor offsets llama.cpp
expects. What llama.cpp would reject is a GGUFError with one clear line; nothing is allocated in
proportion to a count read from the file before that count is checked against the file size.

Unlike llama.cpp, the tensor data section need not exist: a header-only or truncated copy of a model
plans exactly like the model (only the header is read).

Scalars are decoded; arrays of at most SMALL_ARRAY elements become Python lists; longer arrays
(vocabularies, merges, scores) stay undecoded as LazyArray. Long string arrays are skipped with a
vectorised scan (see _skip_strings), so a 262144-token vocabulary costs a few milliseconds. Tensor
infos are kept column by column (TensorInfos): tens of bytes each, however many the file holds.
"""
from __future__ import annotations

import itertools
import mmap
import os
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Iterator, Optional


GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32                 # GGUF_DEFAULT_ALIGNMENT
MAX_STRING_LENGTH = 1024 * 1024 * 1024  # GGUF_MAX_STRING_LENGTH
MAX_ARRAY_ELEMENTS = 1024 * 1024 * 1024  # GGUF_MAX_ARRAY_ELEMENTS
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64
INT64_MAX = (1 << 63) - 1
SIZE_MAX = (1 << 64) - 1
SMALL_ARRAY = 1024                     # arrays up to this many elements are decoded

# enum gguf_type
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
TYPE_NAMES = ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64")

# fixed-size value types: struct format
_SCALAR_FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
               BOOL: "<b", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
_SCALAR = {t: struct.Struct(f) for t, f in _SCALAR_FMT.items()}


def _unpack_array(etype: int, count: int, buf, offset: int) -> list:
    values = struct.unpack_from(f"<{count}{_SCALAR_FMT[etype][1]}", buf, offset)
    return [v != 0 for v in values] if etype == BOOL else list(values)

# ggml type id -> (block size, bytes per block), as ggml.c type_traits (llama.cpp 0c1e57098).
# Ids missing here (4, 5, 31-33, 36-38: removed types) have blck_size 0: gguf.cpp rejects them.
GGML_TYPE_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18), 42: (64, 18),
}
GGML_TYPE_COUNT = 43

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_KV_MIN_BYTES = 8 + 1 + 4 + 1        # key length, one key byte, type, a one-byte value
_TI_MIN_BYTES = 8 + 4 + 4 + 8        # name length, n_dims, type, offset


class GGUFError(Exception):
    """A GGUF file llama.cpp would not load, as one human line: '<path>: <reason>'."""


def shown(s: str, limit: int = 80) -> str:
    """A name or value from the file as a one-line message shows it: non-printable characters
    escaped (a newline in a key stays on the line), at most `limit` characters (a longer one is
    cut and its length given)."""
    head = s[:limit]
    if not head.isprintable():
        head = "".join(c if c.isprintable() else repr(c)[1:-1] for c in head)
    return f"{head}... ({len(s)} characters)" if len(s) > limit else head


@dataclass(frozen=True, slots=True)      # slots: a file may hold hundreds of thousands of them
class TensorInfo:
    name: str
    ne: tuple[int, ...]      # ggml order (ne0 first), n_dims entries, as stored
    type: int                # ggml type id
    offset: int              # relative to the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """ggml_nbytes of a contiguous tensor of this shape and type."""
        blck, size = GGML_TYPE_SIZES[self.type]
        return self.n_elements // blck * size


@dataclass
class TensorInfos(Sequence[TensorInfo]):
    """gguf_context's tensor infos, column by column: a file may hold hundreds of thousands of them,
    so there is no object per tensor (a TensorInfo is made when one is asked for). Names are one
    UTF-8 buffer (invalid bytes replaced, so names compare as the text they decode to); gguf_find_tensor
    is an open-addressing hash index of ids, at most half full."""
    _names: bytearray = field(default_factory=bytearray)
    _name_offs: array = field(default_factory=lambda: array("Q", [0]))    # name i: _names[offs[i]:offs[i + 1]]
    _n_dims: array = field(default_factory=lambda: array("B"))
    _ne: array = field(default_factory=lambda: array("q"))                # GGML_MAX_DIMS per tensor, 1 past n_dims
    _types: array = field(default_factory=lambda: array("i"))
    _offsets: array = field(default_factory=lambda: array("Q"))
    _index: array = field(default_factory=lambda: array("i", [-1]) * 16, compare=False)   # slot -> id, -1 free

    def __len__(self) -> int:
        return len(self._types)

    def __getitem__(self, i: int) -> TensorInfo:
        if i < 0:
            i += len(self._types)
        ttype = self._types[i]                # IndexError past either end
        ne = self._ne[GGML_MAX_DIMS * i:GGML_MAX_DIMS * i + self._n_dims[i]]
        return TensorInfo(self.name(i), tuple(ne), ttype, self._offsets[i])

    def name(self, i: int) -> str:
        """gguf_get_tensor_name"""
        return self._names[self._name_offs[i]:self._name_offs[i + 1]].decode()

    def names(self) -> Iterator[str]:
        return map(self.name, range(len(self._types)))

    def find(self, name: str) -> int:
        """gguf_find_tensor: the id of the tensor called `name`, or -1."""
        return self._index[self._slot(name.encode())]

    def add_name(self, name: str) -> bool:
        """The name of the next tensor, as gguf.cpp reads it first: False (nothing added) when a
        tensor has it already. append() adds the rest of the tensor's info."""
        key = name.encode()
        slot = self._slot(key)
        if self._index[slot] >= 0:
            return False
        self._index[slot] = len(self._types)
        self._names += key
        self._name_offs.append(len(self._names))
        return True

    def append(self, ne: tuple[int, ...], ttype: int, offset: int) -> None:
        """The rest of the info of the tensor whose name add_name() added last."""
        self._n_dims.append(len(ne))
        self._ne.extend(ne + _ONES[len(ne):])
        self._types.append(ttype)
        self._offsets.append(offset)
        if 2 * len(self._types) > len(self._index):
            self._grow()

    def _grow(self) -> None:
        """Twice the slots, every id placed again (the names are distinct: no comparisons)."""
        index = array("i", [-1]) * (2 * len(self._index))
        mask, names, offs = len(index) - 1, self._names, self._name_offs
        for i in range(len(self._types)):
            slot = hash(bytes(names[offs[i]:offs[i + 1]])) & mask
            while index[slot] >= 0:
                slot = (slot + 1) & mask
            index[slot] = i
        self._index = index

    def _slot(self, key: bytes) -> int:
        """Linear probing from the key's hash (salted per process, as a dict's): the slot holding
        the key's id, or the free slot where it goes."""
        index, names, offs = self._index, self._names, self._name_offs
        mask = len(index) - 1
        slot = hash(key) & mask
        while (i := index[slot]) >= 0 and names[offs[i]:offs[i + 1]] != key:
            slot = (slot + 1) & mask
        return slot


_ONES = (1,) * GGML_MAX_DIMS


@dataclass(frozen=True)
class LazyArray:
    """A long metadata array left undecoded: its element type, length and file offset (first element)."""
    elem_type: int
    count: int
    offset: int
    path: str = field(default="", compare=False)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator:
        return iter(self.to_list())

    def to_list(self) -> list:
        """Decode the elements (reads the file again)."""
        with open(self.path, "rb") as f:
            if self.elem_type == STRING:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    out, pos = [], self.offset
                    for _ in range(self.count):
                        n = _U64.unpack_from(mm, pos)[0]
                        out.append(bytes(mm[pos + 8:pos + 8 + n]).decode("utf-8", "replace"))
                        pos += 8 + n
                    return out
            f.seek(self.offset)
            data = f.read(self.count * _SCALAR[self.elem_type].size)
        return _unpack_array(self.elem_type, self.count, data, 0)


@dataclass
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, object]
    tensors: TensorInfos
    alignment: int
    data_offset: int                 # absolute offset of the tensor data section
    file_size: int                   # apparent size of the file as it is (the data may be missing)
    data_size: int = 0               # size of the data section llama.cpp expects (padded tensors)
    kv_types: dict[str, tuple[int, Optional[int]]] = field(default_factory=dict)   # key -> (type, array elem type)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def arch(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: missing string key general.architecture")
        return arch

    def array_len(self, key: str) -> int:
        """Length of an array value without decoding it."""
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: missing GGUF key {key}")
        value = self.metadata[key]
        if not isinstance(value, (list, LazyArray)):
            raise GGUFError(f"{self.path}: GGUF key {key} is not an array")
        return len(value)

    def tensor(self, name: str) -> Optional[TensorInfo]:
        i = self.tensors.find(name)
        return self.tensors[i] if i >= 0 else None


def read_header(path) -> GGUFHeader:
    """Parse the GGUF header of `path` (str or PathLike). Raises GGUFError for anything llama.cpp's
    reader rejects; OSError (FileNotFoundError, IsADirectoryError, ...) when the file cannot be opened."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise GGUFError(f"{path}: empty file, not a GGUF file")
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError) as e:
            raise GGUFError(f"{path}: cannot map the file ({e}); is it a regular file?") from None
    try:
        return _Parser(path, mm, size).parse()
    finally:
        mm.close()


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


class _Parser:
    def __init__(self, path: str, buf, size: int):
        self.path, self.buf, self.end, self.pos = path, buf, size, 0
        self.what = "header"

    # -- errors and primitive reads ---------------------------------------------------------------

    def fail(self, reason: str):
        raise GGUFError(f"{self.path}: {reason}")

    def need(self, n: int):
        if n > self.end - self.pos:
            self.fail(f"truncated file: {self.what} needs {n} bytes at offset {self.pos}, "
                      f"the file has {self.end} bytes")

    def read(self, st: struct.Struct):
        """One fixed-size value at the current position."""
        self.need(st.size)
        v = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return v

    def u32(self) -> int:
        return self.read(_U32)

    def u64(self) -> int:
        return self.read(_U64)

    def i64(self) -> int:
        return self.read(_I64)

    def raw_string(self) -> bytes:
        n = self.u64()
        if n > MAX_STRING_LENGTH:
            self.fail(f"{self.what}: string length {n} exceeds the maximum {MAX_STRING_LENGTH}")
        self.need(n)
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def string(self) -> str:
        return self.raw_string().decode("utf-8", "replace")

    # -- the header --------------------------------------------------------------------------------

    def parse(self) -> GGUFHeader:
        if self.end < 4:
            self.fail(f"not a GGUF file (only {self.end} bytes)")
        if self.buf[:4] != GGUF_MAGIC:
            magic = bytes(self.buf[:4])
            text = "".join(chr(c) if 32 <= c < 127 else "?" for c in magic)
            self.fail(f"not a GGUF file (bad magic '{text}', expected 'GGUF')")
        self.pos = 4
        self.what = "the GGUF version"
        version = self.u32()
        if version == 0:
            self.fail("bad GGUF version 0")
        if version & 0xFFFF == 0:
            self.fail(f"GGUF version {version:#x} looks byte-swapped: big-endian GGUF files are not supported")
        if version == 1:
            self.fail("GGUF version 1 is no longer supported by llama.cpp (supported: 2, 3)")
        if version not in SUPPORTED_VERSIONS:
            self.fail(f"GGUF version {version} is not supported (supported: 2, 3)")

        self.what = "the tensor count"
        n_tensors = self.i64()
        self.what = "the key-value count"
        n_kv = self.i64()
        if n_tensors < 0 or n_tensors * _TI_MIN_BYTES > self.end - self.pos:
            self.fail(f"absurd tensor count {n_tensors} for a file of {self.end} bytes")
        if n_kv < 0 or n_kv * _KV_MIN_BYTES > self.end - self.pos:
            self.fail(f"absurd key-value count {n_kv} for a file of {self.end} bytes")

        metadata: dict[str, object] = {}
        kv_types: dict[str, tuple[int, Optional[int]]] = {}
        for i in range(n_kv):
            self.what = f"key {i}"
            key = self.string()
            if not key:
                self.fail(f"key {i} is empty")
            if key in metadata:
                self.fail(f"duplicate key '{shown(key)}'")
            self.what = f"key '{shown(key)}'"
            metadata[key], kv_types[key] = self.value(key)

        alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in metadata:
            if kv_types["general.alignment"] != (UINT32, None):
                t = kv_types["general.alignment"]
                self.fail(f"key 'general.alignment' must be of type u32 but is {_type_name(*t)}")
            alignment = metadata["general.alignment"]
            if alignment == 0 or alignment & (alignment - 1):
                self.fail(f"alignment {alignment} is not a power of 2")

        tensors, data_size = self.tensor_infos(n_tensors, alignment)
        data_offset = _pad(self.pos, alignment) if n_tensors > 0 else self.pos
        return GGUFHeader(path=self.path, version=version, metadata=metadata, tensors=tensors, alignment=alignment,
                          data_offset=data_offset, file_size=self.end, data_size=data_size, kv_types=kv_types)

    def value(self, key: str):
        vtype = self.u32()
        if vtype == ARRAY:
            etype = self.u32()
            count = self.u64()
            return self.array(key, etype, count), (ARRAY, etype)
        if vtype == STRING:
            return self.string(), (STRING, None)
        st = _SCALAR.get(vtype)
        if st is None:
            self.fail(f"key '{shown(key)}' has invalid GGUF type {vtype}")
        v = self.read(st)
        return (v != 0 if vtype == BOOL else v), (vtype, None)

    def array(self, key: str, etype: int, count: int):
        if etype != STRING and etype not in _SCALAR:
            self.fail(f"key '{shown(key)}' has invalid GGUF array element type {etype}")
        if count > MAX_ARRAY_ELEMENTS:
            self.fail(f"key '{shown(key)}': array of {count} elements exceeds the maximum {MAX_ARRAY_ELEMENTS}")
        remain = self.end - self.pos
        if etype == STRING:
            if count * 8 > remain:
                self.fail(f"key '{shown(key)}': array of {count} strings does not fit in the file ({remain} bytes left)")
            if count <= SMALL_ARRAY:
                return [self.string() for _ in range(count)]
            start = self.pos
            self.pos = _skip_strings(self, self.pos, count)
            return LazyArray(STRING, count, start, self.path)
        st = _SCALAR[etype]
        nbytes = count * st.size
        if nbytes > remain:
            self.fail(f"key '{shown(key)}': array of {count} {TYPE_NAMES[etype]} does not fit in the file "
                      f"({remain} bytes left)")
        start = self.pos
        self.pos += nbytes
        if count > SMALL_ARRAY:
            return LazyArray(etype, count, start, self.path)
        return _unpack_array(etype, count, self.buf, start)

    def tensor_infos(self, n_tensors: int, alignment: int) -> tuple[TensorInfos, int]:
        """The tensor infos and the data section size; checks as gguf.cpp, inlined for speed
        (MoE models have thousands of tensors)."""
        buf, end, pos = self.buf, self.end, self.pos
        u64, u32, dims, type_off = _U64.unpack_from, _U32.unpack_from, _DIMS, _TYPE_OFFSET.unpack_from
        sizes_of = GGML_TYPE_SIZES
        tensors = TensorInfos()
        data_size = 0
        for i in range(n_tensors):
            if pos + 8 > end:
                self.truncated(pos, 8, f"tensor {i}")
            n = u64(buf, pos)[0]
            if n >= GGML_MAX_NAME:
                self.fail(f"tensor {i}: name of {n} bytes is too long (at most {GGML_MAX_NAME - 1})")
            if pos + 8 + n + 4 > end:
                self.truncated(pos + 8, n + 4, f"tensor {i}")
            name = buf[pos + 8:pos + 8 + n].decode("utf-8", "replace")
            pos += 8 + n
            if not tensors.add_name(name):
                self.fail(f"duplicate tensor name '{shown(name)}'")
            n_dims = u32(buf, pos)[0]
            pos += 4
            if n_dims > GGML_MAX_DIMS:
                self.fail(f"tensor '{shown(name)}' has {n_dims} dimensions (at most {GGML_MAX_DIMS})")
            if pos + 8 * n_dims + 12 > end:
                self.truncated(pos, 8 * n_dims + 12, f"tensor '{shown(name)}'")
            ne = dims[n_dims](buf, pos)
            pos += 8 * n_dims
            ttype, offset = type_off(buf, pos)
            pos += 12
            nel = 1
            if ne:
                nel = ne[0]
                if nel < 0 or min(ne) < 0:
                    j = next(j for j, d in enumerate(ne) if d < 0)
                    self.fail(f"tensor '{shown(name)}' dimension {j} has a negative number of elements: {ne[j]}")
                for d in ne[1:]:              # gguf.cpp's overflow check, zeros included
                    if d > 1 and INT64_MAX // d < nel:
                        self.fail(f"tensor '{shown(name)}' shape {list(ne)} has more than INT64_MAX elements")
                    nel *= d
            sizes = sizes_of.get(ttype)
            if sizes is None:
                self.fail(f"tensor '{shown(name)}' has invalid ggml type {ttype}")
            blck, tsize = sizes
            if ne and ne[0] % blck:
                self.fail(f"tensor '{shown(name)}' has {ne[0]} elements per row, not a multiple of the block size "
                          f"{blck} of its ggml type {ttype}")
            nbytes = nel // blck * tsize
            if nbytes > SIZE_MAX - (alignment - 1):
                self.fail(f"tensor '{shown(name)}' shape {list(ne)} has a size in bytes that overflows")
            if offset != data_size:
                self.fail(f"tensor '{shown(name)}' has offset {offset}, expected {data_size}")
            data_size += (nbytes + alignment - 1) // alignment * alignment
            if data_size > SIZE_MAX:
                self.fail(f"tensor '{shown(name)}': the data section size overflows")
            tensors.append(ne, ttype, offset)
        self.pos = pos
        return tensors, data_size

    def truncated(self, pos: int, n: int, what: str):
        self.pos, self.what = pos, what
        self.need(n)


_DIMS = [struct.Struct(f"<{n}q").unpack_from for n in range(GGML_MAX_DIMS + 1)]
_TYPE_OFFSET = struct.Struct("<iQ")


def _type_name(t: int, elem: Optional[int]) -> str:
    name = TYPE_NAMES[t] if 0 <= t < len(TYPE_NAMES) else str(t)
    return f"{name}[{TYPE_NAMES[elem]}]" if elem is not None else name


# -- skipping long string arrays ---------------------------------------------------------------------
#
# A string is a u64 length and its bytes, so the end of N strings is a chain of N dependent reads.
# A bare unpack_from loop walks 262144 tokens in ~26 ms, less than importing numpy (~110 ms) costs
# the command (bench/bench_header.py). Lengths are checked once, at the end: a wild length only moves
# the position past the end of the file (no allocation), and then the checked loop runs again to
# name the first bad string.


def _skip_strings(p: _Parser, pos: int, count: int) -> int:
    buf, unpack, start = p.buf, _U64.unpack_from, pos
    try:
        for _ in itertools.repeat(None, count):
            pos += 8 + unpack(buf, pos)[0]
    except (struct.error, OverflowError):      # a read past the end of the buffer
        pos = p.end + 1
    if pos > p.end:
        return _skip_strings_loop(p, start, count)
    return pos


def _skip_strings_loop(p: _Parser, pos: int, count: int) -> int:
    """The plain loop, with every length checked."""
    buf, unpack, end = p.buf, _U64.unpack_from, p.end
    for _ in itertools.repeat(None, count):
        if pos + 8 > end:
            p.pos = pos
            p.need(8)
        n = unpack(buf, pos)[0]
        if n > MAX_STRING_LENGTH:
            p.fail(f"{p.what}: string length {n} at offset {pos} exceeds the maximum {MAX_STRING_LENGTH}")
        pos += 8 + n
    if pos > end:
        p.pos = pos
        p.fail(f"truncated file: {p.what} runs past the end of the file ({end} bytes)")
    return pos
