"""backends/cpu.py supports_op against ggml_backend_cpu_device_supports_op (ggml-cpu/ggml-cpu.cpp:424)
and CPU_REPACK's extra_buffer_type::supports_op (ggml-cpu/repack.cpp:5191): by hand from the source,
and live against the reference build's own CPU device, node for node."""
from __future__ import annotations

import ctypes
import dataclasses

import pytest

from schedplan.backends import cpu
from schedplan.planner import ggml
from schedplan.planner.ggml import GGML_HINT_SRC0_IS_HADAMARD, Buffer, T, Tensor


def node(op: str, type_: int, ne: tuple[int, ...], srcs: list, params: tuple = ()) -> Tensor:
    return ggml._op(ggml.new_tensor(type_, *ne), op, srcs, params)


def mul_mat(a: int, b: int, hint: int = 0) -> Tensor:
    t = ggml.mul_mat(ggml.new_tensor(a, 256, 4), ggml.new_tensor(b, 256, 8))
    t.op_params = (0, hint)
    return t


def out_prod(a: int, b: int, ne2_a: int) -> Tensor:
    """ggml_out_prod: a [m, k, ne2_a], b [n, k, 2] (ne2_a divides 2), an F32 result [m, n, 2]."""
    return node("OUT_PROD", T.F32, (256, 32, 2), [ggml.new_tensor(a, 256, 16, ne2_a), ggml.new_tensor(b, 32, 16, 2)])


def repacked(type_: int = T.Q4_0, ne: tuple[int, ...] = (256, 64)) -> Tensor:
    w = ggml.new_tensor(type_, *ne)
    w.buffer = Buffer(cpu.cpu_repack_buft(), "weights")
    return w


def test_cpu_supports_op_rules_by_hand():
    ok = cpu.supports_op
    # MUL_MAT: src1 F32, src0's vec_dot_type, or BF16 widened where that is F32 (ggml-cpu.cpp:459)
    assert ok(mul_mat(T.Q4_K, T.F32)) and ok(mul_mat(T.Q4_K, T.Q8_K)) and not ok(mul_mat(T.Q4_K, T.F16))
    assert ok(mul_mat(T.Q4_0, T.Q8_0)) and not ok(mul_mat(T.Q4_1, T.Q8_0)) and ok(mul_mat(T.Q4_1, T.Q8_1))
    assert ok(mul_mat(T.F16, T.F16)) and not ok(mul_mat(T.F16, T.BF16)) and ok(mul_mat(T.F32, T.BF16))
    assert ok(mul_mat(T.Q8_K, T.F32)) and ok(mul_mat(T.Q8_K, T.BF16))      # Q8_K has no vec_dot_type: F32
    # the Hadamard hint with an F32 src0 and result: src1 F32 or F16 only (ggml-cpu.cpp:454)
    assert ok(mul_mat(T.F32, T.F16, GGML_HINT_SRC0_IS_HADAMARD))
    assert not ok(mul_mat(T.F32, T.BF16, GGML_HINT_SRC0_IS_HADAMARD)) and ok(mul_mat(T.F32, T.BF16))
    # CPY and SET_ROWS need the destination's from_float (ggml-cpu.cpp:443)
    src = ggml.new_tensor(T.F32, 256, 4)
    assert ok(ggml.cpy(src, ggml.new_tensor(T.Q8_0, 256, 4)))
    assert not ok(ggml.cpy(src, ggml.new_tensor(T.IQ2_XXS, 256, 4)))
    # OUT_PROD: a non-F32 src0 must match src1 in ne[2], ne[3] (ggml-cpu.cpp:476)
    assert ok(out_prod(T.F32, T.F32, 1)) and ok(out_prod(T.Q8_0, T.F32, 2)) and not ok(out_prod(T.Q8_0, T.F32, 1))
    assert not ok(out_prod(T.F32, T.F16, 2))
    # CONV_2D: a contiguous kernel (ggml-cpu.cpp:480)
    kernel, inp = ggml.new_tensor(T.F16, 3, 3, 8, 16), ggml.new_tensor(T.F32, 32, 32, 8, 1)
    assert ok(ggml.conv_2d_direct(kernel, inp, 1, 1, 1, 1, 1, 1))
    assert not ok(ggml.conv_2d_direct(ggml.permute(kernel, 1, 0, 2, 3), inp, 1, 1, 1, 1, 1, 1))
    # a source in CPU_REPACK leaves the answer to it: its MUL_MAT(_ID) over F32 only (repack.cpp:5191)
    x = ggml.new_tensor(T.F32, 256, 8)
    assert ok(ggml.mul_mat(repacked(), x)) and not ok(ggml.mul_mat(repacked(), ggml.new_tensor(T.Q8_0, 256, 8)))
    assert not ok(ggml.get_rows(repacked(), ggml.new_tensor(T.I32, 8)))
    assert not ok(ggml.mul_mat(repacked(T.Q8_0), x))          # not a type CPU_REPACK lays out on AVX2
    device_x = ggml.new_tensor(T.F32, 256, 8)
    device_x.buffer = Buffer(dataclasses.replace(cpu.cpu_buft(), name="RPC0", is_host=False), "compute")
    assert not ok(ggml.mul_mat(repacked(), device_x))
    assert ok(ggml.reshape(repacked(), 256 * 64))              # NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE first


# --- live: the reference build's CPU device -------------------------------------------------------------

class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class RealGgml:
    """The ggml calls that build the same nodes in a no_alloc context and ask the CPU device."""

    def __init__(self):
        from schedplan.backends import llama_cpp_run as lcr
        llama_cpp = lcr.import_llama_cpp()
        llama_cpp.llama_backend_init()
        self.g = lcr.Ggml()
        base = lcr.load_lib("libggml-base.so.0")
        vp, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        f = lambda name, res, *args: lcr._fn(base, name, res, *args)   # noqa: E731
        self.ctx = f("ggml_init", vp, _InitParams)(_InitParams(256 << 20, None, True))
        self.new = f("ggml_new_tensor_4d", vp, vp, i32, i64, i64, i64, i64)
        self.mul_mat = f("ggml_mul_mat", vp, vp, vp, vp)
        self.hint = f("ggml_mul_mat_set_hint", None, vp, i32)
        self.cpy = f("ggml_cpy", vp, vp, vp, vp)
        self.out_prod = f("ggml_out_prod", vp, vp, vp, vp)
        self.get_rows = f("ggml_get_rows", vp, vp, vp, vp)
        self.get_rows_back = f("ggml_get_rows_back", vp, vp, vp, vp, vp)
        self.permute = f("ggml_permute", vp, vp, vp, i32, i32, i32, i32)
        self.conv_2d = f("ggml_conv_2d_direct", vp, vp, vp, vp, i32, i32, i32, i32, i32, i32)
        self.tensor_alloc = f("ggml_backend_tensor_alloc", i32, vp, vp, vp)
        self.supports = f("ggml_backend_dev_supports_op", ctypes.c_bool, vp, vp)
        self.dev = self.g.dev_by_type(0)          # GGML_BACKEND_DEVICE_TYPE_CPU
        get_extra = ctypes.CFUNCTYPE(ctypes.POINTER(vp), vp)(
            self.g.reg_get_proc_address(self.g.dev_backend_reg(self.dev), b"ggml_backend_dev_get_extra_bufts"))
        extra = get_extra(self.dev)
        self.repack = next(extra[i] for i in range(8) if self.g.buft_name(extra[i]).decode() == "CPU_REPACK")

    def tensor(self, type_: int, *ne: int) -> int:
        ne4 = tuple(ne) + (1,) * (4 - len(ne))
        return self.new(self.ctx, int(type_), *ne4)

    def repacked(self, type_: int, *ne: int) -> int:
        w = self.tensor(type_, *ne)
        buf = self.g.buft_alloc_buffer(self.repack, 1 << 20)
        assert self.tensor_alloc(buf, w, self.g.buffer_get_base(buf)) == 0
        return w


@pytest.fixture(scope="module")
def real():
    pytest.importorskip("llama_cpp")
    return RealGgml()


def _differences(cases: list[tuple[str, Tensor, int]], real: RealGgml) -> list[tuple[str, bool, bool]]:
    out = []
    for label, ours, theirs in cases:
        a, b = cpu.supports_op(ours), real.supports(real.dev, theirs)
        if a != b:
            out.append((label, a, b))
    return out


# the types ggml_new_tensor takes (every ggml_type but the removed ids)
TYPES = list(T)


@pytest.mark.live
def test_cpu_supports_op_equals_ggml(real):
    """Every MUL_MAT type pair (with and without the Hadamard hint), CPY into every type, OUT_PROD and
    GET_ROWS_BACK over the types, CONV_2D with a permuted kernel, and the repacked weights: the same
    answer as the reference build's CPU device gives."""
    r = real
    cases = []
    for a in TYPES:
        for b in TYPES:
            for hint in (0, GGML_HINT_SRC0_IS_HADAMARD):
                t = r.mul_mat(r.ctx, r.tensor(a, 256, 4), r.tensor(b, 256, 8))
                r.hint(t, hint)
                cases.append((f"MUL_MAT {a.name} {b.name} hint {hint}", mul_mat(a, b, hint), t))
        cases.append((f"CPY F32 -> {a.name}", ggml.cpy(ggml.new_tensor(T.F32, 256, 4), ggml.new_tensor(a, 256, 4)),
                      r.cpy(r.ctx, r.tensor(T.F32, 256, 4), r.tensor(a, 256, 4))))
        for b in (T.F32, T.F16):
            for ne2_a in (1, 2):
                cases.append((f"OUT_PROD {a.name} {b.name} ne2 {ne2_a}", out_prod(a, b, ne2_a),
                              r.out_prod(r.ctx, r.tensor(a, 256, 16, ne2_a), r.tensor(b, 32, 16, 2))))
        grad, rows, like = (ggml.new_tensor(a, 256, 8), ggml.new_tensor(T.I32, 8), ggml.new_tensor(T.F32, 256, 32))
        cases.append((f"GET_ROWS_BACK {a.name}", node("GET_ROWS_BACK", T.F32, (256, 32), [grad, rows, like]),
                      r.get_rows_back(r.ctx, r.tensor(a, 256, 8), r.tensor(T.I32, 8), r.tensor(T.F32, 256, 32))))
    kernel, inp = ggml.new_tensor(T.F16, 3, 3, 8, 16), ggml.new_tensor(T.F32, 32, 32, 8, 1)
    for perm in ((0, 1, 2, 3), (1, 0, 2, 3)):
        cases.append((f"CONV_2D kernel permuted {perm}",
                      ggml.conv_2d_direct(ggml.permute(kernel, *perm), inp, 1, 1, 1, 1, 1, 1),
                      r.conv_2d(r.ctx, r.permute(r.ctx, r.tensor(T.F16, 3, 3, 8, 16), *perm), r.tensor(T.F32, 32, 32, 8),
                                1, 1, 1, 1, 1, 1)))
    for w_type in (T.Q4_0, T.Q4_K, T.IQ4_NL, T.Q8_0):
        for rows in (64, 60):
            for x_type in (T.F32, T.F16, cpu.VEC_DOT_TYPE[w_type]):
                cases.append((f"MUL_MAT repacked {w_type.name} x {rows} over {x_type.name}",
                              ggml.mul_mat(repacked(w_type, (256, rows)), ggml.new_tensor(x_type, 256, 8)),
                              r.mul_mat(r.ctx, r.repacked(w_type, 256, rows), r.tensor(x_type, 256, 8))))
            cases.append((f"GET_ROWS repacked {w_type.name} x {rows}",
                          ggml.get_rows(repacked(w_type, (256, rows)), ggml.new_tensor(T.I32, 8)),
                          r.get_rows(r.ctx, r.repacked(w_type, 256, rows), r.tensor(T.I32, 8))))
    assert len(cases) > 2 * len(TYPES) ** 2
    assert _differences(cases, r) == []
