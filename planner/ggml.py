"""The part of ggml that decides memory: tensors, views, op constructors, graphs.

Mirrors ggml/src/ggml.c (llama.cpp 0c1e57098): shapes, strides, names and src order of each op
as its constructor sets them, and ggml_build_forward_expand's post-order walk.
Tensors carry no data; `buffer`/`offset` are filled by placement (weights, KV) or by gallocr.
"""
from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from .gguf import GGML_TYPE_SIZES

if TYPE_CHECKING:
    from ..backends.types import BufferType

# ggml.h enum ggml_tensor_flag
FLAG_INPUT, FLAG_OUTPUT, FLAG_PARAM, FLAG_LOSS = 1, 2, 4, 8

# ggml.h: op_params[1] of a MUL_MAT whose src0 is a Hadamard rotation (ggml_mul_mat_set_hint)
GGML_HINT_SRC0_IS_HADAMARD = 1

# ops that only make a view of src[0] (ggml_op_is_view / ggml_is_view_op in ggml-impl.h)
VIEW_OPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})


class T(enum.IntEnum):
    """ggml.h enum ggml_type (ids 4, 5, 31-33, 36-38 were removed)."""
    F32, F16, Q4_0, Q4_1 = 0, 1, 2, 3
    Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = range(6, 16)
    IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = range(16, 24)
    I8, I16, I32, I64, F64, IQ1_M, BF16 = range(24, 31)
    TQ1_0, TQ2_0 = 34, 35
    MXFP4, NVFP4, Q1_0, Q2_0 = 39, 40, 41, 42


# ggml_type_name: type_traits[].type_name in ggml.c (the K-quants keep a capital K)
_NAMES = {t: t.name.lower().replace("_k", "_K") for t in T}
_BY_NAME = {name.lower(): t for t, name in _NAMES.items()}
_SIZES = GGML_TYPE_SIZES   # type -> (block size, bytes per block), from ggml.c type_traits


def type_name(t: int) -> str:
    return _NAMES[t]


def type_by_name(name: str) -> int:
    return int(_BY_NAME[name.lower()])


def blck_size(t: int) -> int:
    return _SIZES[t][0]


def type_size(t: int) -> int:
    return _SIZES[t][1]


def row_size(t: int, ne0: int) -> int:
    """ggml_row_size"""
    return type_size(t) * ne0 // blck_size(t)


def is_quantized(t: int) -> bool:
    return blck_size(t) > 1


def contiguous_nb(t: int, ne: tuple[int, ...]) -> tuple[int, int, int, int]:
    bs, nb0 = _SIZES[t]
    nb1 = nb0 * (ne[0] // bs)
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


@dataclass(eq=False)
class Buffer:
    """A backend buffer that tensors can live in (weights, KV, output, compute)."""
    buft: "BufferType"  # backends.types.BufferType; buft.name is the name llama.cpp logs
    usage: str          # "weights", "compute", "any"
    size: int = 0


@dataclass(eq=False, slots=True)
class Tensor:
    type: int
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    op: str = "NONE"
    src: list[Optional["Tensor"]] = field(default_factory=list)
    op_params: tuple = ()
    flags: int = 0
    view_src: Optional["Tensor"] = None
    view_offs: int = 0
    name: str = ""
    buffer: Optional[Buffer] = None   # set when the tensor is already allocated (weights, KV)
    offset: Optional[int] = None      # offset in `buffer`

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.op}, {type_name(self.type)}, {list(self.ne)})"

    @property
    def nbytes(self) -> int:
        """ggml_nbytes: 0 for an empty tensor; else the last element's end (blocks for quantized rows)."""
        ne0, ne1, ne2, ne3 = self.ne
        if ne0 <= 0 or ne1 <= 0 or ne2 <= 0 or ne3 <= 0:
            return 0
        nb0, nb1, nb2, nb3 = self.nb
        rest = (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3
        bs, ts = _SIZES[self.type]
        if bs == 1:
            return ts + (ne0 - 1) * nb0 + rest
        return ne0 * nb0 // bs + rest

    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    def is_contiguous(self) -> bool:
        return is_contiguous_m_n(self, 0)

    def set_input(self) -> None:
        self.flags |= FLAG_INPUT

    def set_output(self) -> None:
        self.flags |= FLAG_OUTPUT


GGML_MAX_NAME = 64


def _fmt(name: str) -> str:
    """ggml_format_name: vsnprintf into char[GGML_MAX_NAME]."""
    return name[:GGML_MAX_NAME - 1]


def is_contiguous_m_n(t: Tensor, m: int, n: int = 4) -> bool:
    """ggml_is_contiguous_m_n (ggml.c:1474): dimensions 1..m may have gaps, m+1..n-1 are packed."""
    bs = blck_size(t.type)
    next_nb = type_size(t.type)
    if t.ne[0] != bs and t.nb[0] != next_nb:
        return False
    next_nb *= t.ne[0] // bs
    for i in range(1, n):
        if i > m:
            if t.ne[i] != 1 and t.nb[i] != next_nb:
                return False
            next_nb *= t.ne[i]
        else:
            next_nb = t.ne[i] * t.nb[i]   # this dimension does not need to be contiguous
    return True


def n_dims(t: Tensor) -> int:
    """ggml_n_dims: the dimensions up to the last one that is not 1 (at least 1)."""
    for i in range(3, 0, -1):
        if t.ne[i] > 1:
            return i + 1
    return 1


def _ne4(ne: tuple[int, ...]) -> tuple[int, int, int, int]:
    return tuple(ne) + (1,) * (4 - len(ne)) if len(ne) < 4 else tuple(ne)


class GGMLAbort(Exception):
    """A GGML_ASSERT that real llama.cpp would hit for this model and these parameters."""


def ggml_assert(cond: bool, where: str, condition: str, detail: str = "") -> None:
    """GGML_ASSERT(condition) at `where`: kept in release builds, so llama.cpp aborts (a C assert()
    is compiled out and has no mirror here)."""
    if not cond:
        raise GGMLAbort(f"llama.cpp would abort ({where} GGML_ASSERT({condition}))" + (f": {detail}" if detail else ""))


def new_tensor(type_: int, *ne: int, view_src: Tensor | None = None, view_offs: int = 0) -> Tensor:
    """ggml_new_tensor_impl: contiguous strides; a view of a view points at the root."""
    if view_src is not None and view_src.view_src is not None:
        view_offs += view_src.view_offs
        view_src = view_src.view_src
    ne4 = _ne4(ne)
    if view_src is not None:
        data_size = row_size(type_, ne4[0]) * ne4[1] * ne4[2] * ne4[3]
        if data_size and data_size + view_offs > view_src.nbytes:   # ggml.c:1797
            raise GGMLAbort(f"llama.cpp would abort (ggml.c:1797 GGML_ASSERT): a {type_name(type_)} view of "
                            f"{list(ne4)} at offset {view_offs} does not fit in '{view_src.name}' "
                            f"({view_src.nbytes} bytes); usually a cache type whose block size does not "
                            f"divide the head size")
    return Tensor(type=type_, ne=ne4, nb=contiguous_nb(type_, ne4), view_src=view_src, view_offs=view_offs)


def present(*tensors: Optional[Tensor]) -> None:
    """The tensors an op reads: a null one (a weight the file lacks that a graph uses anyway) is a
    null pointer llama.cpp would dereference."""
    if any(t is None for t in tensors):
        raise GGMLAbort("llama.cpp would crash building the graph: an operation reads a tensor the file does not "
                        "have (a null pointer)")


def _op(result: Tensor, op: str, srcs: list, params: tuple = ()) -> Tensor:
    result.op = op
    result.src = list(srcs)
    result.op_params = params
    return result


def dup_tensor(a: Tensor) -> Tensor:
    return new_tensor(a.type, *a.ne)


def view_tensor(a: Tensor) -> Tensor:
    """ggml_view_tensor: same shape and strides, op NONE."""
    present(a)
    r = new_tensor(a.type, *a.ne, view_src=a, view_offs=0)
    r.nb = a.nb
    r.name = _fmt(f"{a.name} (view)")
    return r


# --- views -------------------------------------------------------------------------------------

def view(a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...], offset: int) -> Tensor:
    """ggml_view_1d/2d/3d/4d: nb holds nb1.. (nb0 stays the type size)."""
    present(a)
    r = new_tensor(a.type, *ne, view_src=a, view_offs=offset)
    r.name = _fmt(f"{a.name} (view)")
    full = list(r.nb)
    for i, s in enumerate(nb, start=1):
        full[i] = s
    for i in range(len(nb) + 1, 4):
        full[i] = full[i - 1] * r.ne[i - 1]
    r.nb = tuple(full)
    return _op(r, "VIEW", [a], (offset,))


def reshape(a: Tensor, *ne: int) -> Tensor:
    """ggml_reshape_1d..4d (a must be contiguous)."""
    present(a)
    if not a.is_contiguous():   # ggml.c GGML_ASSERT(ggml_is_contiguous(a))
        raise GGMLAbort(f"llama.cpp would abort (ggml.c GGML_ASSERT(ggml_is_contiguous(a)) in ggml_reshape): "
                        f"'{a.name}' of {list(a.ne)} is not contiguous")
    if a.nelements() != math.prod(ne):   # ggml.c GGML_ASSERT(ggml_nelements(a) == ne0*ne1*...)
        raise GGMLAbort(f"llama.cpp would abort (ggml.c GGML_ASSERT(ggml_nelements(a) == ne0*ne1*...)): "
                        f"'{a.name}' of {list(a.ne)} reshaped to {list(ne)}")
    r = new_tensor(a.type, *ne, view_src=a, view_offs=0)
    r.name = _fmt(f"{a.name} (reshaped)")
    return _op(r, "RESHAPE", [a])


def permute(a: Tensor, ax0: int, ax1: int, ax2: int, ax3: int) -> Tensor:
    r = view_tensor(a)
    r.name = _fmt(f"{a.name} (permuted)")
    ne, nb = [0] * 4, [0] * 4
    for src_axis, dst_axis in enumerate((ax0, ax1, ax2, ax3)):
        ne[dst_axis] = a.ne[src_axis]
        nb[dst_axis] = a.nb[src_axis]
    r.ne, r.nb = tuple(ne), tuple(nb)
    return _op(r, "PERMUTE", [a], (ax0, ax1, ax2, ax3))


def transpose(a: Tensor) -> Tensor:
    r = view_tensor(a)
    r.name = _fmt(f"{a.name} (transposed)")
    r.ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    r.nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return _op(r, "TRANSPOSE", [a])


# --- compute ops -------------------------------------------------------------------------------

def cont(a: Tensor, *ne: int) -> Tensor:
    """ggml_cont / ggml_cont_Nd"""
    present(a)
    r = new_tensor(a.type, *(ne or a.ne))
    r.name = _fmt(f"{a.name} (cont)")
    return _op(r, "CONT", [a])


def cast(a: Tensor, type_: int) -> Tensor:
    r = new_tensor(type_, *a.ne)
    r.name = _fmt(f"{a.name} (copy)")
    return _op(r, "CPY", [a, r])


def cpy(a: Tensor, b: Tensor) -> Tensor:
    """ggml_cpy_impl: a view of the destination b, named after both."""
    r = view_tensor(b)
    r.name = _fmt(f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)")
    return _op(r, "CPY", [a, b])


def repeat(a: Tensor, b: Tensor) -> Tensor:
    """ggml_repeat: a tiled to b's shape, GGML_ASSERT(ggml_can_repeat(a, b))."""
    present(a, b)
    if not can_repeat(a, b):
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_repeat GGML_ASSERT(ggml_can_repeat(a, b))): "
                        f"'{a.name}' {list(a.ne)} to {list(b.ne)}")
    return _op(new_tensor(a.type, *b.ne), "REPEAT", [a])


def repeat_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    present(a)
    return _op(new_tensor(a.type, ne0, ne1, ne2, ne3), "REPEAT", [a])


def pad(a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """ggml_pad: ggml_pad_ext padding each dimension on the right."""
    return pad_ext(a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_ext(a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int, lp3: int, rp3: int) -> Tensor:
    """ggml_pad_ext: each dimension padded on the left and the right (the amounts are C ints)."""
    present(a)
    p = [(x + 2**31) % 2**32 - 2**31 for x in (lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)]
    r = new_tensor(a.type, *(n + p[2 * i] + p[2 * i + 1] for i, n in enumerate(a.ne)))
    return _op(r, "PAD", [a], (*p, 0))


def pad_reflect_1d(a: Tensor, p0: int, p1: int) -> Tensor:
    """ggml_pad_reflect_1d: ne[0] padded by p0 and p1 mirrored values (ggml.c:5299)."""
    present(a)
    ggml_assert(p0 >= 0 and p1 >= 0, "ggml.c:5304", "p0 >= 0 && p1 >= 0")
    ggml_assert(p0 < a.ne[0] and p1 < a.ne[0], "ggml.c:5307", "p0 < a->ne[0] && p1 < a->ne[0]",
                f"'{a.name}' {list(a.ne)} padded by {p0}, {p1}")
    ggml_assert(a.is_contiguous(), "ggml.c:5310", "ggml_is_contiguous(a)")
    ggml_assert(a.type == T.F32, "ggml.c:5311", "a->type == GGML_TYPE_F32")
    return _op(new_tensor(a.type, a.ne[0] + p0 + p1, a.ne[1], a.ne[2], a.ne[3]), "PAD_REFLECT_1D", [a], (p0, p1))


def get_rows(a: Tensor, b: Tensor) -> Tensor:
    present(a, b)
    t = a.type if a.type == T.I32 else T.F32
    return _op(new_tensor(t, a.ne[0], b.ne[0], b.ne[1], b.ne[2]), "GET_ROWS", [a, b])


def set_rows(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_set_rows: a view of the destination a; src order b, c, a (legacy)."""
    if a.ne[0] != b.ne[0]:   # ggml.c GGML_ASSERT(a->ne[0] == b->ne[0]): e.g. a K row unlike the cache's
        raise GGMLAbort(f"llama.cpp would abort (ggml.c GGML_ASSERT(a->ne[0] == b->ne[0])): rows of {b.ne[0]} "
                        f"values from '{b.name}' set into '{a.name}', whose rows hold {a.ne[0]}")
    return _op(view_tensor(a), "SET_ROWS", [b, c, a])


def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: GGML_ASSERT(ggml_can_mul_mat(a, b)) (a's rows as long as b's, b's batches a
    multiple of a's) and GGML_ASSERT(!ggml_is_transposed(a))."""
    present(a, b)
    if a.ne[0] != b.ne[0] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3] or a.nb[0] > a.nb[1]:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_mul_mat GGML_ASSERT(ggml_can_mul_mat(a, b))): "
                        f"'{a.name}' {list(a.ne)} times '{b.name}' {list(b.ne)}")
    return _op(new_tensor(T.F32, a.ne[1], b.ne[1], b.ne[2], b.ne[3]), "MUL_MAT", [a, b])


def _unary_like(op: str, a: Tensor, srcs: list, params: tuple = (), inplace: bool = False) -> Tensor:
    present(a)
    r = view_tensor(a) if inplace else dup_tensor(a)
    return _op(r, op, srcs, params)


def can_repeat(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_repeat: t0 broadcasts to t1's shape (an empty t0 only to an empty t1)."""
    n0, n1 = _ne4(t0.ne), _ne4(t1.ne)
    if 0 in n0:
        return 0 in n1
    return all(y % x == 0 for x, y in zip(n0, n1))


def _binary(op: str, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """ggml_add/mul/div_impl: b broadcasts over a, GGML_ASSERT(ggml_can_repeat(b, a)) (ggml.c)."""
    present(a, b)
    if not can_repeat(b, a):
        na, nb = _ne4(a.ne), _ne4(b.ne)
        raise GGMLAbort(f"llama.cpp would abort (ggml.c GGML_ASSERT(ggml_can_repeat(b, a))): {op} of "
                        f"'{a.name}' {list(na)} by '{b.name}' {list(nb)}, which does not repeat to its shape")
    return _unary_like(op, a, [a, b], inplace=inplace)


def add(a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    return _binary("ADD", a, b, inplace)


def mul(a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    return _binary("MUL", a, b, inplace)


def scale(a: Tensor, s: float, inplace: bool = False, b: float = 0.0) -> Tensor:
    """ggml_scale / ggml_scale_bias: a * s + b"""
    return _unary_like("SCALE", a, [a], (s, b), inplace)


def sub(a: Tensor, b: Tensor) -> Tensor:
    return _binary("SUB", a, b)


def scale_bias(a: Tensor, s: float, b: float) -> Tensor:
    """ggml_scale_bias: a * s + b"""
    return scale(a, s, b=b)


def sqrt(a: Tensor) -> Tensor:
    return _unary_like("SQRT", a, [a])


def sin(a: Tensor) -> Tensor:
    return _unary_like("SIN", a, [a])


def cos(a: Tensor) -> Tensor:
    return _unary_like("COS", a, [a])


def rms_norm(a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    return _unary_like("RMS_NORM", a, [a], (eps,), inplace)


def norm(a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    return _unary_like("NORM", a, [a], (eps,), inplace)


def group_norm(a: Tensor, n_groups: int, eps: float) -> Tensor:
    return _unary_like("GROUP_NORM", a, [a], (n_groups, eps))


def l2_norm(a: Tensor, eps: float) -> Tensor:
    return _unary_like("L2_NORM", a, [a], (eps,))


# enum ggml_unary_op, for the ones schedplan builds
UNARY_OPS = {"ABS": 0, "SGN": 1, "NEG": 2, "TANH": 4, "ELU": 5, "RELU": 6, "SIGMOID": 7, "GELU": 8, "GELU_QUICK": 9,
             "SILU": 10, "HARDSWISH": 11, "HARDSIGMOID": 12, "EXP": 13, "SOFTPLUS": 15, "GELU_ERF": 16, "XIELU": 17,
             "ROUND": 20}


def unary(a: Tensor, unary_op: str, inplace: bool = False) -> Tensor:
    """ggml_unary_impl (ggml_gelu, ggml_silu, ggml_tanh, ...; ggml_relu_inplace, ...): op UNARY, the
    kind in op_params[0]."""
    return _unary_like("UNARY", a, [a], (UNARY_OPS[unary_op],), inplace)


def softplus(x: float) -> float:
    """ggml_compute_softplus_f32 (ggml-impl.h): log(1 + e^x), x itself above 20."""
    return x if x > 20.0 else math.log1p(math.exp(x))


def xielu(a: Tensor, alpha_n: float, alpha_p: float, beta: float, eps: float) -> Tensor:
    """ggml_xielu: a unary XIELU with beta + softplus(alpha_n), softplus(alpha_p), beta, eps in op_params[1..4]."""
    return _unary_like("UNARY", a, [a], (UNARY_OPS["XIELU"], beta + softplus(alpha_n), softplus(alpha_p), beta, eps))


def rope_ext(a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
             inplace: bool = False) -> Tensor:
    return _unary_like("ROPE", a, [a, pos, freq_factors], (0, n_dims, mode, 0, n_ctx_orig), inplace)


def rope_set_offset(a: Tensor, n_offs: int) -> Tensor:
    """ggml_rope_set_offset: the rotated dimensions start n_offs into each row (op_params[15]); a
    itself changes, its shape does not (its callers pass a rope of NORM or NEOX mode)."""
    if a.op not in ("ROPE", "ROPE_BACK") or n_offs < 0:
        raise GGMLAbort("llama.cpp would abort (ggml.c ggml_rope_set_offset): GGML_ASSERT(a->op == GGML_OP_ROPE "
                        "|| a->op == GGML_OP_ROPE_BACK) or GGML_ASSERT(n_offs >= 0)")
    a.op_params = tuple(a.op_params) + (0,) * (15 - len(a.op_params)) + (n_offs,)
    return a


def rope_ext_back(a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, mode: int,
                  n_ctx_orig: int) -> Tensor:
    """ggml_rope_ext_back: ggml_rope_ext with the op turned into ROPE_BACK (the inverse rotation)."""
    r = rope_ext(a, pos, freq_factors, n_dims, mode, n_ctx_orig)
    r.op = "ROPE_BACK"
    return r


def rope_multi(a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, sections: tuple[int, ...],
               mode: int, n_ctx_orig: int) -> Tensor:
    """ggml_rope_multi: ggml_rope_impl with the M-RoPE sections in op_params[11..14]."""
    return _unary_like("ROPE", a, [a, pos, freq_factors], (0, n_dims, mode, 0, n_ctx_orig, *sections))


def soft_max_ext(a: Tensor, mask: Tensor | None, scale_: float, max_bias: float) -> Tensor:
    return _unary_like("SOFT_MAX", a, [a, mask], (scale_, max_bias))


def soft_max(a: Tensor) -> Tensor:
    return _unary_like("SOFT_MAX", a, [a, None], (1.0, 0.0))


def sqr(a: Tensor) -> Tensor:
    return _unary_like("SQR", a, [a])


def clamp(a: Tensor, lo: float, hi: float) -> Tensor:
    return _unary_like("CLAMP", a, [a], (lo, hi))


def set_1d(a: Tensor, b: Tensor, offset: int) -> Tensor:
    """ggml_set_1d (ggml_set_impl, not in place): a copy of a with b's elements written at offset."""
    present(a, b)
    if a.nelements() < b.nelements():
        raise GGMLAbort(f"llama.cpp would abort (ggml.c GGML_ASSERT(ggml_nelements(a) >= ggml_nelements(b))): SET of "
                        f"{b.nelements()} elements into '{a.name}' of {a.nelements()}")
    return _op(dup_tensor(a), "SET", [a, b], (a.nb[1], a.nb[2], a.nb[3], offset, 0))


def div(a: Tensor, b: Tensor) -> Tensor:
    return _binary("DIV", a, b)


def concat(a: Tensor, b: Tensor, dim: int) -> Tensor:
    present(a, b)
    if a.type != b.type or any(a.ne[d] != b.ne[d] for d in range(4) if d != dim):
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_concat GGML_ASSERTs: one type, equal sizes but in dim "
                        f"{dim}): '{a.name}' {type_name(a.type)} {list(a.ne)}, '{b.name}' {type_name(b.type)} {list(b.ne)}")
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return _op(new_tensor(a.type, *ne), "CONCAT", [a, b], (dim,))


def argmax(a: Tensor) -> Tensor:
    """ggml_argmax: the I32 index of each row's maximum"""
    present(a)
    if a.ne[2] != 1 or a.ne[3] != 1 or a.ne[0] > 2**31 - 1:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_argmax GGML_ASSERT(ggml_is_matrix(a))): '{a.name}' "
                        f"{list(a.ne)}")
    return _op(new_tensor(T.I32, a.ne[1]), "ARGMAX", [a])


def fill(a: Tensor, c: float) -> Tensor:
    return _op(dup_tensor(a), "FILL", [a], (c,))


def mean(a: Tensor) -> Tensor:
    """ggml_mean: F32 [1, ne1, ne2, ne3]"""
    return _op(new_tensor(T.F32, 1, a.ne[1], a.ne[2], a.ne[3]), "MEAN", [a])


def sum_rows(a: Tensor) -> Tensor:
    return _op(new_tensor(a.type, 1, a.ne[1], a.ne[2], a.ne[3]), "SUM_ROWS", [a])


def arange(start: float, stop: float, step: float) -> Tensor:
    """ggml_arange: f32 [ceil((stop - start) / step)], GGML_ASSERT(stop > start)."""
    start, stop, step = (struct.unpack("f", struct.pack("f", x))[0] for x in (start, stop, step))
    if not stop > start:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_arange GGML_ASSERT(stop > start)): {start} .. {stop}")
    steps = math.ceil(struct.unpack("f", struct.pack("f", (stop - start) / step))[0])
    return _op(new_tensor(T.F32, steps), "ARANGE", [], (start, stop, step))


SORT_ORDER_ASC, SORT_ORDER_DESC = 0, 1   # enum ggml_sort_order


def argsort(a: Tensor, order: int = SORT_ORDER_DESC) -> Tensor:
    """ggml_argsort (descending, as argsort_top_k asks, unless told): i32 indices of a's shape."""
    return _op(new_tensor(T.I32, *a.ne), "ARGSORT", [a], (order,))


def argsort_top_k(a: Tensor, k: int) -> Tensor:
    """ggml_argsort_top_k: a view of the first k indices of each row of the argsort."""
    r = argsort(a)
    return view(r, (k, r.ne[1], r.ne[2], r.ne[3]), (r.nb[1], r.nb[2], r.nb[3]), 0)


def top_k(a: Tensor, k: int) -> Tensor:
    """ggml_top_k: the i32 indices of each row's k largest values."""
    if a.ne[0] < k:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c GGML_ASSERT(a->ne[0] >= k)): the top {k} of rows of "
                        f"{a.ne[0]} in '{a.name}'")
    return _op(new_tensor(T.I32, k, a.ne[1], a.ne[2], a.ne[3]), "TOP_K", [a])


def lightning_indexer(q: Tensor, k: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    """ggml_lightning_indexer (DeepSeek sparse attention): f32 scores [n_kv, n_tokens, 1, n_stream]."""
    return _op(new_tensor(T.F32, k.ne[2], q.ne[2], 1, q.ne[3]), "LIGHTNING_INDEXER", [q, k, weights, mask])


# enum ggml_prec (ggml.h)
PREC_F32 = 10


def prec_set_acc(t: Tensor, prec: int) -> bool:
    """ggml_prec_set_acc (ggml.c:3291): the accumulator precision of a MUL_MAT / MUL_MAT_ID
    (op_params[0]) or FLASH_ATTN_EXT (op_params[3]); False for other ops."""
    idx = {"MUL_MAT": 0, "MUL_MAT_ID": 0, "FLASH_ATTN_EXT": 3}.get(t.op)
    if idx is None:
        return False
    params = list(t.op_params) + [0] * (idx + 1 - len(t.op_params))
    params[idx] = prec
    t.op_params = tuple(params)
    return True


def prec_set_src(t: Tensor, prec: int, idx: int) -> None:
    """ggml_prec_set_src for MUL_MAT/MUL_MAT_ID's src1: op_params[3] (ggml.c:3316-3336), which the
    CUDA and Vulkan backends refuse for MUL_MAT_ID at GGML_PREC_F32."""
    ggml_assert(0 <= idx < 10, "ggml.c:3321", "idx >= 0 && idx < GGML_MAX_SRC")
    if t.op in ("MUL_MAT", "MUL_MAT_ID") and idx == 1:
        params = list(t.op_params) + [0] * (4 - len(t.op_params))
        params[2 + idx] = prec
        t.op_params = tuple(params)


def mul_mat_id(a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_mul_mat_id: one matrix per expert in a; ids picks them per b row."""
    return _op(new_tensor(T.F32, a.ne[1], ids.ne[0], b.ne[2], 1), "MUL_MAT_ID", [a, b, ids])


def add_id(a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    return _op(dup_tensor(a), "ADD_ID", [a, b, ids])


def ssm_conv(sx: Tensor, c: Tensor) -> Tensor:
    """ggml_ssm_conv: [d_inner, tokens per sequence, sequences] from the padded input sx."""
    n_t = sx.ne[0] - c.ne[0] + 1
    if sx.ne[3] != 1 or c.ne[2] != 1 or c.ne[3] != 1 or sx.ne[1] != c.ne[1] or n_t < 0:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_ssm_conv GGML_ASSERTs: a 3-D input of the kernel's "
                        f"channels): '{sx.name}' {list(sx.ne)}, kernel '{c.name}' {list(c.ne)}")
    return _op(new_tensor(T.F32, c.ne[1], n_t, sx.ne[2]), "SSM_CONV", [sx, c])


def ssm_scan(s: Tensor, x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, ids: Tensor, k: int) -> Tensor:
    """ggml_ssm_scan: y and the K final states, concatenated in one 1-D result."""
    n = x.nelements() + k * s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0]
    return _op(new_tensor(T.F32, n), "SSM_SCAN", [s, x, dt, a, b, c, ids], (k,))


def gated_delta_net(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, k_slots: int) -> Tensor:
    """ggml_gated_delta_net: rows of outputs for every token, then K state snapshots per sequence."""
    s_v, h, n_tokens, n_seqs = v.ne
    r = new_tensor(T.F32, s_v * h, n_tokens * n_seqs + k_slots * s_v * n_seqs)
    return _op(r, "GATED_DELTA_NET", [q, k, v, g, beta, state], (k_slots,))


def _linear_attn(op: str, k: Tensor, state: Tensor, same_shape: list, srcs: list, params: tuple = ()) -> Tensor:
    """ggml_rwkv_wkv6, ggml_gated_linear_attn, ggml_rwkv_wkv7: S, H, n_tokens from k, n_seqs from the
    state; the operands in same_shape must be [S, H, n_tokens] and the state S*S*H*n_seqs values
    (GGML_ASSERTs). The result: [S*H, n_tokens + S*n_seqs], every token's output, then the new states."""
    s_, h, n_tokens = k.ne[0], k.ne[1], k.ne[2]
    n_seqs = state.ne[1]
    if any(t.ne[:3] != (s_, h, n_tokens) for t in same_shape) or state.nelements() != s_ * s_ * h * n_seqs:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_{op.lower()} GGML_ASSERTs): k {list(k.ne)}, "
                        f"state {list(state.ne)}, operands {[list(t.ne) for t in same_shape]}")
    return _op(new_tensor(T.F32, s_ * h, n_tokens + s_ * n_seqs), op, srcs, params)


def rwkv_wkv6(k: Tensor, v: Tensor, r: Tensor, tf: Tensor, td: Tensor, state: Tensor) -> Tensor:
    return _linear_attn("RWKV_WKV6", k, state, [v, r, td], [k, v, r, tf, td, state])


def gated_linear_attn(k: Tensor, v: Tensor, q: Tensor, g: Tensor, state: Tensor, scale_: float) -> Tensor:
    return _linear_attn("GATED_LINEAR_ATTN", k, state, [v, q, g], [k, v, q, g, state], (scale_,))


def rwkv_wkv7(r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor) -> Tensor:
    return _linear_attn("RWKV_WKV7", k, state, [w, v, a, b], [r, w, k, v, a, b, state])


# enum ggml_glu_op
GLU_REGLU, GLU_GEGLU, GLU_SWIGLU, GLU_SWIGLU_OAI, GLU_GEGLU_ERF, GLU_GEGLU_QUICK, GLU_SWIGLU_CLAMP = range(7)


def glu(a: Tensor, glu_op: int, swapped: bool = False) -> Tensor:
    """ggml_glu_impl without b (ggml_swiglu, ggml_geglu, *_swapped): gate and value are the two
    halves of a's rows."""
    r = new_tensor(a.type, a.ne[0] // 2, a.ne[1], a.ne[2], a.ne[3])
    return _op(r, "GLU", [a, None], (glu_op, int(swapped)))


def glu_split(a: Tensor, b: Tensor, glu_op: int, limit: float | None = None) -> Tensor:
    """ggml_glu_impl with b: result has a's shape and type; ggml_swiglu_clamp's limit in op_params[3]."""
    r = new_tensor(a.type, *a.ne)
    return _op(r, "GLU", [a, b], (glu_op, 0) if limit is None else (glu_op, 0, 0, limit))


def dsv4_hc_pre(x: Tensor, weights: Tensor) -> Tensor:
    """ggml_dsv4_hc_pre: the hyper-connection streams x [n_embd, hc, n_tokens] mixed into one by
    weights [hc, n_tokens]: f32 [n_embd, n_tokens]."""
    return _op(new_tensor(T.F32, x.ne[0], x.ne[2]), "DSV4_HC_PRE", [x, weights], (1.0, 0))


def dsv4_hc_comb(mixes: Tensor, scale_: Tensor, base: Tensor, eps: float, n_iter: int) -> Tensor:
    """ggml_dsv4_hc_comb: the Sinkhorn-normalised stream mixing matrix of each token, f32 [hc, hc,
    n_tokens] from mixes [(2 + hc) * hc, n_tokens] (ggml.c asserts hc == 4)."""
    hc = 4
    return _op(new_tensor(T.F32, hc, hc, mixes.ne[1]), "DSV4_HC_COMB", [mixes, scale_, base], (eps, n_iter))


def flash_attn_ext(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale_: float, max_bias: float,
                   softcap: float, n_kv_max: int = 0) -> Tensor:
    """ggml_flash_attn_ext, then build_attn_mha's ggml_flash_attn_ext_set_n_kv_max (op_params[4]: the
    keys a sparse mask leaves, 0 for a dense one) and ggml_prec_set_acc(F32) (op_params[3])."""
    r = new_tensor(T.F32, v.ne[0], q.ne[2], q.ne[1], q.ne[3])
    return _op(r, "FLASH_ATTN_EXT", [q, k, v, mask], (scale_, max_bias, softcap, PREC_F32, n_kv_max))


def dsv4_hc_pre_gated(x: Tensor, gate: Tensor, scale_: float) -> Tensor:
    """ggml_dsv4_hc_pre_gated: the hc streams of x [n_embd, hc, n_tokens], each scaled by its sigmoid
    gate (gate has x's shape), summed and scaled: f32 [n_embd, n_tokens]."""
    n_embd, hc, n_tokens = x.ne[0], x.ne[1], x.ne[2]
    if x.type != T.F32 or gate.type != T.F32 or tuple(gate.ne) != (n_embd, hc, n_tokens, 1) or x.ne[3] != 1:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_dsv4_hc_pre_impl GGML_ASSERT): x {list(x.ne)}, "
                        f"gate {list(gate.ne)}")
    return _op(new_tensor(T.F32, n_embd, n_tokens), "DSV4_HC_PRE", [x, gate], (scale_, 1))


def dsv4_hc_post(x: Tensor, residual: Tensor, post: Tensor, comb: Tensor | None) -> Tensor:
    """ggml_dsv4_hc_post: the block output x [n_embd, n_tokens] added to each of the hc residual streams
    [n_embd, hc, n_tokens], scaled per stream by post [hc, n_tokens] (mixed by comb when given)."""
    n_embd, n_tokens, hc = x.ne[0], x.ne[1], residual.ne[1]
    if (x.ne[2:] != (1, 1) or tuple(residual.ne) != (n_embd, hc, n_tokens, 1) or tuple(post.ne) != (hc, n_tokens, 1, 1)
            or (comb is not None and tuple(comb.ne) != (hc, hc, n_tokens, 1))):
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_dsv4_hc_post GGML_ASSERT): x {list(x.ne)}, "
                        f"residual {list(residual.ne)}, post {list(post.ne)}")
    return _op(new_tensor(T.F32, n_embd, hc, n_tokens), "DSV4_HC_POST", [x, residual, post, comb])


def im2col(a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int, is_2d: bool,
           dst_type: int) -> Tensor:
    """ggml_im2col: b's patches under the kernel a, one row of IC * KH * KW values per output position."""
    present(a, b)
    if (a.ne[2] != b.ne[2]) if is_2d else (b.ne[1] != a.ne[1] or b.ne[3] != 1):
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_im2col GGML_ASSERT on the channels): kernel "
                        f"'{a.name}' {list(a.ne)} over '{b.name}' {list(b.ne)}")
    oh = conv_output_size(b.ne[1], a.ne[1], s1, p1, d1) if is_2d else 0
    ow = conv_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    if (is_2d and oh <= 0) or ow <= 0:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_im2col: b too small compared to a): kernel "
                        f"'{a.name}' {list(a.ne)} over '{b.name}' {list(b.ne)}")
    ne = ((a.ne[2] * a.ne[1] * a.ne[0]) if is_2d else a.ne[1] * a.ne[0], ow, oh if is_2d else b.ne[2],
          b.ne[3] if is_2d else 1)
    return _op(new_tensor(dst_type, *ne), "IM2COL", [a, b], (s0, s1, p0, p1, d0, d1, int(is_2d)))


def conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size (C int64 division)"""
    n = ins + 2 * p - d * (ks - 1) - 1
    return (abs(n) // s) * (1 if n >= 0 else -1) + 1


def conv_2d(a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """ggml_conv_2d: im2col (f16, f32 for a bf16 kernel), a matrix product, then [OW, OH, OC, N]."""
    col = im2col(a, b, s0, s1, p0, p1, d0, d1, True, T.F32 if a.type == T.BF16 else T.F16)
    r = mul_mat(reshape(col, col.ne[0], col.ne[3] * col.ne[2] * col.ne[1]),
                reshape(a, a.ne[0] * a.ne[1] * a.ne[2], a.ne[3]))
    r = reshape(r, col.ne[1], col.ne[2], col.ne[3], a.ne[3])
    return cont(permute(r, 0, 1, 3, 2))


def conv_2d_direct(a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """ggml_conv_2d_direct: CONV_2D of the kernel a [KW, KH, IC, OC] over b [W, H, C, N]."""
    present(a, b)
    if a.ne[2] != b.ne[2]:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_conv_2d_direct GGML_ASSERT(a->ne[2] == b->ne[2])): kernel "
                        f"'{a.name}' {list(a.ne)} over '{b.name}' {list(b.ne)}")
    ne = (conv_output_size(b.ne[0], a.ne[0], s0, p0, d0), conv_output_size(b.ne[1], a.ne[1], s1, p1, d1), a.ne[3], b.ne[3])
    return _op(new_tensor(b.type, *ne), "CONV_2D", [a, b], (s0, s1, p0, p1, d0, d1))


def conv_2d_dw(a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """ggml_conv_2d_dw: a depthwise conv as one im2col over every channel and a batched product,
    [OW, OH, C, N]."""
    present(a, b)
    new_a = reshape(a, a.ne[0], a.ne[1], 1, a.ne[2] * a.ne[3])
    col = im2col(new_a, reshape(b, b.ne[0], b.ne[1], 1, b.ne[2] * b.ne[3]), s0, s1, p0, p1, d0, d1, True,
                 T.F32 if a.type == T.BF16 else T.F16)        # [N * IC, OH, OW, KH * KW]
    new_b = reshape(col, col.ne[0], col.ne[2] * col.ne[1], b.ne[2], b.ne[3])
    new_a = reshape(new_a, new_a.ne[0] * new_a.ne[1], new_a.ne[2], new_a.ne[3], 1)
    r = mul_mat(new_a, new_b)
    return reshape(r, col.ne[1], col.ne[2], b.ne[2], b.ne[3])


def conv_2d_dw_direct(a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """ggml_conv_2d_dw_direct: CONV_2D_DW, one [KW, KH, 1, C] kernel per channel of b; a result in
    b's channel-contiguous order (CWHN) where b has it."""
    present(a, b)
    if a.ne[2] != 1 or a.ne[3] != b.ne[2]:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_conv_2d_dw_direct GGML_ASSERTs: a [KW, KH, 1, C] "
                        f"kernel): '{a.name}' {list(a.ne)} over '{b.name}' {list(b.ne)}")
    ne = (conv_output_size(b.ne[0], a.ne[0], s0, p0, d0), conv_output_size(b.ne[1], a.ne[1], s1, p1, d1), b.ne[2], b.ne[3])
    r = new_tensor(b.type, *ne)
    ts = type_size(b.type)
    if b.nb[0] > b.nb[2] and b.nb[1] > b.nb[0] and b.nb[2] == ts:    # ggml_is_contiguous_channels(b)
        nb0 = r.ne[2] * ts
        r.nb = (nb0, r.ne[0] * nb0, ts, r.nb[3])
    return _op(r, "CONV_2D_DW", [a, b], (s0, s1, p0, p1, d0, d1))


def roll(a: Tensor, shift0: int, shift1: int, shift2: int, shift3: int) -> Tensor:
    present(a)
    if a.nb[0] != type_size(a.type) or any(abs(s) >= n for s, n in zip((shift0, shift1, shift2, shift3), _ne4(a.ne))):
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_roll GGML_ASSERTs: shifts under the sizes): '{a.name}' "
                        f"{list(a.ne)} by {[shift0, shift1, shift2, shift3]}")
    return _op(dup_tensor(a), "ROLL", [a], (shift0, shift1, shift2, shift3))


def conv_1d(a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_1d: im2col (1-D; f16, f32 for a bf16 kernel), a matrix product, then [OL, OC, N]."""
    col = im2col(a, b, s0, 0, p0, 0, d0, 0, False, T.F32 if a.type == T.BF16 else T.F16)
    r = mul_mat(reshape(col, col.ne[0], col.ne[2] * col.ne[1]), reshape(a, a.ne[0] * a.ne[1], a.ne[2]))
    return reshape(r, col.ne[1], a.ne[2], col.ne[2])


def conv_1d_ph(a: Tensor, b: Tensor, s: int, d: int) -> Tensor:
    """ggml_conv_1d_ph: half padding"""
    present(a)
    return conv_1d(a, b, s, a.ne[0] // 2, d)


def conv_1d_dw(a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_1d_dw: a depthwise 1-D convolution, im2col over b as [L, 1, C] (f16, f32 for a bf16
    kernel) times the kernel, [OL, C, 1]."""
    present(a, b)
    new_b = reshape(b, b.ne[0], 1, b.ne[1], b.ne[2])
    col = im2col(a, new_b, s0, 0, p0, 0, d0, 0, False, T.F32 if a.type == T.BF16 else T.F16)
    r = mul_mat(col, a)
    return reshape(r, r.ne[0], r.ne[2], 1)


def conv_1d_dw_ph(a: Tensor, b: Tensor, s0: int, d0: int) -> Tensor:
    """ggml_conv_1d_dw_ph: half padding"""
    present(a)
    return conv_1d_dw(a, b, s0, a.ne[0] // 2, d0)


POOL_MAX, POOL_AVG = 0, 1   # enum ggml_op_pool


def pool_1d(a: Tensor, op: int, k0: int, s0: int, p0: int) -> Tensor:
    """ggml_pool_1d: f32 [OL, ne1, ne2, ne3]."""
    present(a)
    ne0 = int((a.ne[0] + 2 * p0 - k0) / s0 + 1)
    if ne0 <= 0:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_pool_1d GGML_ASSERT(ne[0] > 0)): a pool of {k0} over "
                        f"'{a.name}' {list(a.ne)}")
    return _op(new_tensor(T.F32, ne0, a.ne[1], a.ne[2], a.ne[3]), "POOL_1D", [a], (op, k0, s0, p0))


def pool_2d(a: Tensor, op: int, k0: int, k1: int, s0: int, s1: int, p0: float, p1: float) -> Tensor:
    """ggml_pool_2d: f32 [OW, OH, C, N] (ggml_calc_pool_output_size in float, truncated)."""
    ne0, ne1 = int((a.ne[0] + 2 * p0 - k0) / s0 + 1), int((a.ne[1] + 2 * p1 - k1) / s1 + 1)
    if ne0 <= 0 or ne1 <= 0:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_pool_2d GGML_ASSERT(ne[0] > 0 && ne[1] > 0)): "
                        f"a {k0}x{k1} pool over '{a.name}' {list(a.ne)}")
    return _op(new_tensor(T.F32, ne0, ne1, a.ne[2], a.ne[3]), "POOL_2D", [a], (op, k0, k1, s0, s1, p0, p1))


# enum ggml_scale_mode and its flags
SCALE_MODE_NEAREST, SCALE_MODE_BILINEAR, SCALE_MODE_BICUBIC = 0, 1, 2
SCALE_FLAG_ALIGN_CORNERS, SCALE_FLAG_ANTIALIAS = 1 << 8, 1 << 9


def upscale(a: Tensor, scale_factor: int, mode: int) -> Tensor:
    """ggml_upscale: GGML_ASSERT(scale_factor > 1), then interpolate to ne0, ne1 times the factor."""
    if scale_factor <= 1:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_upscale GGML_ASSERT(scale_factor > 1)): '{a.name}' by "
                        f"{scale_factor}")
    return interpolate(a, a.ne[0] * scale_factor, a.ne[1] * scale_factor, a.ne[2], a.ne[3], mode)


def interpolate(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: int) -> Tensor:
    """ggml_interpolate (ggml_interpolate_impl): op UPSCALE to the given shape, a must be f32."""
    if a.type != T.F32:
        raise GGMLAbort(f"llama.cpp would abort (ggml.c ggml_interpolate_impl GGML_ASSERT(a->type == "
                        f"GGML_TYPE_F32)): '{a.name}' is {type_name(a.type)}")
    return _op(new_tensor(a.type, ne0, ne1, ne2, ne3), "UPSCALE", [a], (mode,))


# --- graphs ------------------------------------------------------------------------------------

@dataclass
class Cgraph:
    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    visited: set[Tensor] = field(default_factory=set)   # the visited_hash_set (Tensor hashes by identity)

    def n_nodes(self) -> int:
        return len(self.nodes)


def _visit_parents(g: Cgraph, node: Tensor) -> None:
    """ggml_visit_parents_graph (ggml.c): post-order over src left to right; leafs vs nodes.

    The COMPUTE flag it also sets only steers backends' compute loops, so it is not modelled.
    """
    visited = g.visited
    if node in visited:
        return
    visited.add(node)
    stack = [(node, iter(node.src))]
    while stack:
        t, srcs = stack[-1]
        for s in srcs:
            if s is not None and s not in visited:
                visited.add(s)
                stack.append((s, iter(s.src)))
                break
        else:
            stack.pop()
            if t.op == "NONE" and not (t.flags & FLAG_PARAM):
                if not t.name:
                    t.name = f"leaf_{len(g.leafs)}"
                g.leafs.append(t)
            else:
                if not t.name:
                    t.name = f"node_{len(g.nodes)}"
                g.nodes.append(t)


def build_forward_expand(g: Cgraph, t: Tensor) -> None:
    _visit_parents(g, t)


def build_forward_select(g: Cgraph, tensors: list[Tensor], idx: int) -> Tensor:
    """ggml_build_forward_select: every candidate enters the graph (only idx is computed)."""
    for t in tensors:
        _visit_parents(g, t)
    return tensors[idx]
