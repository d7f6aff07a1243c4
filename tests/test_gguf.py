"""planner/gguf.py: agreement with gguf-py's GGUFReader, and one-line GGUFErrors for bad input."""
from __future__ import annotations

import math
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from fixtures.make_gguf import model_path, real_model_path, write_gguf
from schedplan.planner import gguf as g
from schedplan.planner.gguf import GGUFError, LazyArray, TensorInfo, read_header

BUNDLED = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"

# -- a hand-rolled GGUF builder: exact control of every byte ----------------------------------------


def _str(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, v) -> bytes:
    if vtype == g.STRING:
        return _str(v)
    return struct.pack(g._SCALAR_FMT[vtype], v)


def _kv(key, vtype, v, etype=None) -> bytes:
    out = _str(key) + struct.pack("<I", vtype)
    if vtype == g.ARRAY:
        out += struct.pack("<IQ", etype, len(v)) + b"".join(_value(etype, x) for x in v)
    else:
        out += _value(vtype, v)
    return out


def _ti(name, ne, ttype, offset) -> bytes:
    return _str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}q", *ne) + struct.pack("<iQ", ttype, offset)


TOKENS = [b"<unk>", b"", b"a" * 300, b"\x03\x00\x00\x00\x00\x00\x00\x00xyz"] + [b"t%d" % i for i in range(1500)]
KVS = [
    ("general.architecture", g.STRING, "llama", None),
    ("general.alignment", g.UINT32, 64, None),
    ("u8", g.UINT8, 200, None), ("i8", g.INT8, -3, None), ("u16", g.UINT16, 60000, None), ("i16", g.INT16, -2, None),
    ("u32", g.UINT32, 4000000000, None), ("i32", g.INT32, -7, None), ("f32", g.FLOAT32, 0.5, None),
    ("b", g.BOOL, True, None), ("u64", g.UINT64, 1 << 60, None), ("i64", g.INT64, -(1 << 60), None),
    ("f64", g.FLOAT64, 1e-300, None),
    ("small.ints", g.ARRAY, [1, 2, 3], g.INT32), ("small.strs", g.ARRAY, ["x", "", "ü"], g.STRING),
    ("small.bools", g.ARRAY, [True, False], g.BOOL),
    ("big.tokens", g.ARRAY, TOKENS, g.STRING),
    ("big.floats", g.ARRAY, [float(i) for i in range(2000)], g.FLOAT32),
]
TENSORS = [("a", (64, 3), 8), ("b", (5,), 0), ("c", (256, 2, 1, 2), 12)]   # Q8_0, F32, Q4_K


def build(kvs=KVS, tensors=TENSORS, version=3, offsets=None, alignment=64) -> tuple[bytes, int]:
    """A GGUF file (header and zero data) and the end of its tensor infos."""
    out = b"GGUF" + struct.pack("<IqQ", version, len(tensors), len(kvs))
    out += b"".join(_kv(*kv) for kv in kvs)
    off, infos = 0, []
    for i, (name, ne, t) in enumerate(tensors):
        infos.append(_ti(name, ne, t, offsets[i] if offsets else off))
        blck, size = g.GGML_TYPE_SIZES.get(t, (1, 1))
        nbytes = math.prod(ne) // blck * size
        off += -(-nbytes // alignment) * alignment
    out += b"".join(infos)
    end_infos = len(out)
    out += bytes(-len(out) % alignment) + bytes(off if 0 <= off < 1 << 20 else 0)
    return out, end_infos


def _write(tmp_path, data: bytes, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_builder_file_parses(tmp_path):
    data, end_infos = build()
    h = read_header(_write(tmp_path, data))
    assert h.version == 3 and h.alignment == 64
    assert h.data_offset == -(-end_infos // 64) * 64
    assert h.file_size == len(data) == h.data_offset + h.data_size
    for key, vtype, v, etype in KVS:
        got = h.get(key)
        if isinstance(got, LazyArray):
            assert len(got) == len(v) == h.array_len(key) and got.elem_type == etype
            got = got.to_list()
            if etype == g.STRING:
                v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
        assert got == v, key
        assert h.kv_types[key] == ((g.ARRAY, etype) if vtype == g.ARRAY else (vtype, None))
    assert isinstance(h.get("small.ints"), list) and isinstance(h.get("big.tokens"), LazyArray)
    assert [(t.name, t.ne, t.type) for t in h.tensors] == TENSORS
    assert h.tensors[0] == TensorInfo("a", (64, 3), 8, 0) and h.tensors[0].nbytes == 2 * 34 * 3
    assert h.arch() == "llama" and h.get("missing", 7) == 7


def test_version_2_reads_like_3(tmp_path):
    v2 = read_header(_write(tmp_path, build(version=2)[0], "v2.gguf"))
    v3 = read_header(_write(tmp_path, build(version=3)[0], "v3.gguf"))
    assert v2.version == 2 and (v2.metadata, v2.tensors, v2.data_offset) == (v3.metadata, v3.tensors, v3.data_offset)


def test_no_tensors_no_padding(tmp_path):
    data, end_infos = build(tensors=[])
    h = read_header(_write(tmp_path, data))
    assert len(h.tensors) == 0 and h.data_offset == end_infos and h.data_size == 0


@pytest.mark.parametrize("cut", ["infos", "padding", "data"])
def test_header_only_and_truncated_data_parse(tmp_path, cut):
    """The data section is never read: a file cut anywhere after the tensor infos plans the same."""
    data, end_infos = build()
    full = read_header(_write(tmp_path, data, "full.gguf"))
    size = {"infos": end_infos, "padding": end_infos + 1, "data": full.data_offset + 100}[cut]
    h = read_header(_write(tmp_path, data[:size]))
    assert h.file_size == size
    assert (h.metadata, h.tensors, h.data_offset, h.data_size) == \
        (full.metadata, full.tensors, full.data_offset, full.data_size)


def test_truncation_anywhere_in_the_header_is_an_error(tmp_path):
    data, end_infos = build()
    p = tmp_path / "cut.gguf"
    for cut in list(range(0, end_infos, 11)) + [end_infos - 1]:
        p.write_bytes(data[:cut])
        with pytest.raises(GGUFError) as e:
            read_header(p)
        msg = str(e.value)
        assert msg.startswith(f"{p}: ") and "\n" not in msg, msg


# -- corruptions: each one a GGUFError with a clear message ---------------------------------------

def _patch(kvs=None, tensors=None, **kw):
    return lambda: build(kvs=KVS if kvs is None else kvs, tensors=TENSORS if tensors is None else tensors, **kw)[0]


def _header_patch(fmt, offset, value):
    def make():
        data = bytearray(build()[0])
        struct.pack_into(fmt, data, offset, value)
        return bytes(data)
    return make


def _replace(old: bytes, new: bytes):
    def make():
        data = build()[0]
        assert data.count(old) == 1
        return data.replace(old, new)
    return make


_BIG_TOKEN_LEN = struct.pack("<Q", 300) + b"a" * 300
CORRUPTIONS = {
    "bad magic": (lambda: b"GGML" + build()[0][4:], "not a GGUF file (bad magic 'GGML'"),
    "binary magic": (lambda: b"\x00\x01\xff\x7f" + build()[0][4:], "bad magic '????'"),
    "short file": (lambda: b"GG", "not a GGUF file"),
    "empty file": (lambda: b"", "empty file"),
    "version 0": (_header_patch("<I", 4, 0), "bad GGUF version 0"),
    "version 1": (_header_patch("<I", 4, 1), "version 1 is no longer supported"),
    "version 4": (_header_patch("<I", 4, 4), "GGUF version 4 is not supported"),
    "big-endian": (_header_patch(">I", 4, 3), "big-endian"),
    "n_tensors huge": (_header_patch("<q", 8, 1 << 61), "absurd tensor count"),
    "n_tensors negative": (_header_patch("<q", 8, -1), "absurd tensor count"),
    "n_kv huge": (_header_patch("<q", 16, 1 << 62), "absurd key-value count"),
    "n_kv negative": (_header_patch("<q", 16, -5), "absurd key-value count"),
    "n_kv too big": (_header_patch("<q", 16, len(KVS) + 1), "too long"),   # tensor infos read as a key
    "key length huge": (_header_patch("<Q", 24, 1 << 40), "exceeds the maximum"),
    "key length past the end": (_header_patch("<Q", 24, 1 << 29), "truncated file"),
    "empty key": (_patch(kvs=[("", g.UINT8, 1, None)]), "key 0 is empty"),
    "duplicate key": (_patch(kvs=KVS + [("u8", g.UINT8, 1, None)]), "duplicate key 'u8'"),
    "bad value type": (_replace(_str("u8") + struct.pack("<I", g.UINT8), _str("u8") + struct.pack("<I", 13)),
                       "key 'u8' has invalid GGUF type 13"),
    "nested array": (_replace(struct.pack("<IQ", g.INT32, 3), struct.pack("<IQ", g.ARRAY, 3)),
                     "invalid GGUF array element type 9"),
    "array count over the maximum": (_replace(struct.pack("<IQ", g.INT32, 3), struct.pack("<IQ", g.INT32, 1 << 31)),
                                     "exceeds the maximum"),
    "array count past the end": (_replace(struct.pack("<IQ", g.INT32, 3), struct.pack("<IQ", g.INT32, 1 << 29)),
                                 "does not fit in the file"),
    "string array count past the end": (
        _replace(struct.pack("<IQ", g.STRING, len(TOKENS)), struct.pack("<IQ", g.STRING, 1 << 28)),
        "does not fit in the file"),
    "long string array runs off the end": (
        _replace(struct.pack("<IQ", g.STRING, len(TOKENS)), struct.pack("<IQ", g.STRING, len(TOKENS) + 1500)),
        "key 'big.tokens'"),
    "string in a long array too long": (_replace(_BIG_TOKEN_LEN, struct.pack("<Q", (1 << 30) + 1) + b"a" * 300),
                                        "exceeds the maximum"),
    "string in a long array past the end": (_replace(_BIG_TOKEN_LEN, struct.pack("<Q", 1 << 29) + b"a" * 300),
                                            "truncated file"),
    "alignment not u32": (_patch(kvs=[("general.alignment", g.UINT64, 64, None)]), "must be of type u32"),
    "alignment not a power of 2": (_patch(kvs=[("general.alignment", g.UINT32, 48, None)]), "not a power of 2"),
    "alignment 0": (_patch(kvs=[("general.alignment", g.UINT32, 0, None)]), "not a power of 2"),
    "5 dims": (_patch(tensors=[("a", (1, 1, 1, 1, 1), 0)]), "has 5 dimensions"),
    "huge n_dims": (_replace(_str("b") + struct.pack("<I", 1), _str("b") + struct.pack("<I", 1 << 31)),
                    "dimensions (at most 4)"),
    "negative dim": (_patch(tensors=[("a", (4, -1), 0)]), "dimension 1 has a negative number of elements"),
    "overflowing dims": (_patch(tensors=[("a", (1 << 40, 1 << 40), 0)]), "more than INT64_MAX elements"),
    "overflowing dims with a zero": (_patch(tensors=[("a", (1 << 62, 4, 0), 0)]), "more than INT64_MAX"),
    "removed ggml type": (_patch(tensors=[("a", (32,), 4)]), "invalid ggml type 4"),
    "ggml type past the end": (_patch(tensors=[("a", (32,), 43)]), "invalid ggml type 43"),
    "negative ggml type": (_patch(tensors=[("a", (32,), -1)]), "invalid ggml type -1"),
    "row not a multiple of the block": (_patch(tensors=[("a", (33, 2), 2)]), "not a multiple of the block size 32"),
    "byte size overflows": (_patch(tensors=[("a", ((1 << 62) + (1 << 61), 1), 0)]), "overflows"),
    "wrong tensor offset": (_patch(offsets=[0, 256, 64]), "tensor 'c' has offset 64, expected 320"),
    "duplicate tensor name": (_patch(tensors=[("a", (4,), 0), ("a", (4,), 0)]), "duplicate tensor name 'a'"),
    "tensor name too long": (_patch(tensors=[("x" * 64, (4,), 0)]), "name of 64 bytes is too long"),
    "tensor name length past the end": (_replace(_str("c") + struct.pack("<I", 4),
                                                 struct.pack("<Q", 1 << 20) + b"c" + struct.pack("<I", 4)),
                                        "too long"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupt_input_is_one_clear_line(tmp_path, name):
    make, expected = CORRUPTIONS[name]
    p = _write(tmp_path, make())
    with pytest.raises(GGUFError) as e:
        read_header(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg
    assert expected in msg, msg


@pytest.mark.parametrize("name", ["n_tensors huge", "n_kv huge", "array count past the end",
                                  "string array count past the end", "key length past the end"])
def test_absurd_counts_allocate_nothing(tmp_path, name):
    p = _write(tmp_path, CORRUPTIONS[name][0]())
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError):
            read_header(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_tensor_table_finds_every_name_in_tens_of_bytes_each(tmp_path):
    """Tensor infos are a columnar table (no object per tensor) whose hash index finds each one."""
    n = 20000
    tensors = [(f"blk.{i}.w", (32, i % 7 + 1), 0) for i in range(n)]
    p = _write(tmp_path, build(kvs=KVS[:1], tensors=tensors, alignment=32)[0])
    tracemalloc.start()
    try:
        h = read_header(p)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 100 * n
    assert len(h.tensors) == n and all(h.tensors.find(name) == i for i, (name, _, _) in enumerate(tensors))
    offset = sum(32 * (i % 7 + 1) * 4 for i in range(4321))     # F32, each a multiple of the alignment
    assert h.tensor("blk.4321.w") == TensorInfo("blk.4321.w", (32, 3), 0, offset) == h.tensors[4321]
    assert h.tensors[-1] == h.tensors[n - 1] and h.tensors.find("blk.20000.w") == -1 and h.tensor("w") is None
    with pytest.raises(IndexError):
        h.tensors[n]


def test_tensor_names_compare_as_decoded(tmp_path):
    """Invalid UTF-8 in a name is replaced before names are compared, as the loader sees them."""
    p = _write(tmp_path, build(tensors=[(b"a\xff", (4,), 0), (b"a\xfe", (4,), 0)])[0])
    with pytest.raises(GGUFError, match="duplicate tensor name 'a\ufffd'"):
        read_header(p)


def test_not_a_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_header(tmp_path / "missing.gguf")
    with pytest.raises(IsADirectoryError):
        read_header(tmp_path)


def test_random_bytes_never_crash(tmp_path):
    """Random corruption of a valid header: a GGUFError or a header, never another exception."""
    data, end_infos = build()
    rng = np.random.default_rng(0)
    p = tmp_path / "fuzz.gguf"
    for _ in range(300):
        b = bytearray(data)
        for pos in rng.integers(0, end_infos, size=rng.integers(1, 4)):
            b[pos] = int(rng.integers(0, 256))
        p.write_bytes(bytes(b))
        try:
            read_header(p)
        except GGUFError as e:
            assert "\n" not in str(e)


# -- the string skipper ---------------------------------------------------------------------------

def _strings(rng, n, kind):
    if kind == "short":
        return [b"t%d" % i for i in range(n)]
    if kind == "mixed":
        lens = np.where(rng.random(n) < 0.01, rng.integers(256, 2000, n), rng.integers(0, 20, n))
    elif kind == "long":
        lens = rng.integers(200, 700, n)
    else:  # zeros: token bytes full of zeros and fake length headers
        lens = rng.integers(0, 40, n)
    out = []
    for n_ in lens:
        s = bytearray(rng.integers(1, 256, int(n_), dtype=np.uint8).tobytes())
        if kind == "zeros" and n_ >= 16:
            s[3:11] = struct.pack("<Q", int(rng.integers(0, 255)))
            s[12:14] = b"\x00\x00"
        out.append(bytes(s))
    return out


@pytest.mark.parametrize("kind", ["short", "mixed", "long", "zeros"])
@pytest.mark.parametrize("seed", [0, 1])
def test_skip_strings_matches_the_plain_loop(kind, seed):
    rng = np.random.default_rng(seed)
    strings = _strings(rng, 20000, kind)
    blob = b"".join(_str(s) for s in strings) + b"tail" * 4
    p = g._Parser("x", blob, len(blob))
    ends = np.cumsum([8 + len(s) for s in strings])
    for count in (1, 7, 1025, len(strings)):
        assert g._skip_strings(p, 0, count) == ends[count - 1] == g._skip_strings_loop(p, 0, count)


# -- agreement with gguf-py on real and generated files -------------------------------------------

def _agree(path):
    import gguf

    h = read_header(path)
    r = gguf.GGUFReader(path)
    assert list(h.metadata) == [k for k in r.fields if not k.startswith("GGUF.")]
    for key, value in h.metadata.items():
        field = r.fields[key]
        expected = field.contents()
        got = value.to_list() if isinstance(value, LazyArray) else value
        assert got == expected, key
        if isinstance(value, (list, LazyArray)):
            assert h.array_len(key) == len(field.data)
    assert h.data_offset == r.data_offset and h.alignment == r.alignment
    assert len(h.tensors) == len(r.tensors)
    for t, rt in zip(h.tensors, r.tensors):
        assert (t.name, list(t.ne), t.type, t.nbytes) == (rt.name, rt.shape.tolist(), int(rt.tensor_type), rt.n_bytes)
        assert h.data_offset + t.offset == rt.data_offset
    return h


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-untied"])
def test_agrees_with_gguf_reader_on_fixtures(name):
    _agree(model_path(name))


def test_agrees_with_gguf_reader_on_real_smollm2():
    h = _agree(real_model_path("smollm2-135m-instruct-q4_1"))
    assert h.arch() == "llama" and h.array_len("tokenizer.ggml.tokens") == 49152
    assert h.data_offset + h.data_size == h.file_size


def test_header_only_fixture_matches_full(tmp_path):
    full = read_header(model_path("tiny-llama-untied"))
    header = read_header(write_gguf("tiny-llama-untied", tmp_path / "h.gguf", header_only=True))
    assert header.file_size == header.data_offset == full.data_offset
    assert (header.metadata.keys(), header.tensors) == (full.metadata.keys(), full.tensors)


def test_lazy_array_without_decoding():
    h = read_header(BUNDLED / "tinyllama-1.1b.gguf")
    tokens = h.get("tokenizer.ggml.tokens")
    assert isinstance(tokens, LazyArray) and len(tokens) == 32000 == h.array_len("tokenizer.ggml.tokens")
    assert tokens.to_list()[:4] == ["<unk>", "<s>", "</s>", "<0x00>"]
    assert h.get("tokenizer.ggml.token_type").to_list()[:5] == [2, 3, 3, 6, 6]
    with pytest.raises(GGUFError, match="not an array"):
        h.array_len("general.architecture")
    with pytest.raises(GGUFError, match="missing"):
        h.array_len("nope")
