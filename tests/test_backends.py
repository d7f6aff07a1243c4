"""CUDA, Metal and Vulkan backends and --device planning, against the arithmetic of their source.

Every expected number is worked out by hand from the C cited next to it (ggml-cuda/ggml-cuda.cu
"cu:", ggml-cuda/fattn.cu "fa:", ggml-metal/ggml-metal-ops.cpp "ops:", ggml-vulkan/ggml-vulkan.cpp
"vk:", src/llama*.cpp), never from what the planner prints. No GPU is involved: these are the rules
as read, not measurements.
"""
import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.golden import ARCH_FIXTURES, FA_OFF, NEEDS_TARGET
from fixtures.make_gguf import header_path
from schedplan.backends import cuda, metal, vulkan
from schedplan.backends.layout import use_counts
from schedplan.backends.types import BufferType, GraphView
from schedplan.cli.main import cli
from schedplan.cli.options import parse_params
from schedplan.planner import ggml
from schedplan.planner.devices import BadDevices, parse_device, plan_devices
from schedplan.planner.gguf import read_header
from schedplan.planner.ggml import Buffer, Cgraph, T, Tensor
from schedplan.planner.model import load_hparams
from schedplan.planner.model_loader import ModelLoader
from schedplan.planner.gallocr import alloc_ctx_tensors
from schedplan.planner.reserve import create_context, reserve, sched_reserve

GGUF = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
TINY, TINYLLAMA = str(GGUF / "tiny-llama.gguf"), str(GGUF / "tinyllama-1.1b.gguf")
CUDA = ["--device", "cuda:24GiB:cc=8.9"]
GiB = 1024**3


def pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def devices_of(path: str, *flags: str):
    return plan_devices(parse_params(list(flags)), load_hparams(ModelLoader(read_header(path))))


def fa_node(d: int, n_tokens: int, n_head: int, n_head_kv: int, n_kv: int, type_k: int, type_v: int) -> Tensor:
    """FLASH_ATTN_EXT as build_attn_mha makes it: Q f32 [d, n_tokens, n_head], K/V [d, n_kv, n_head_kv]
    views of the cache (permuted, so nb[1] is one cache row), f16 mask [n_kv, n_tokens]."""
    q = ggml.permute(ggml.new_tensor(T.F32, d, n_head, n_tokens), 0, 2, 1, 3)
    cache_k = ggml.new_tensor(type_k, d * n_head_kv, n_kv)
    cache_v = ggml.new_tensor(type_v, d * n_head_kv, n_kv)
    k = ggml.permute(ggml.view(cache_k, (d, n_head_kv, n_kv), (ggml.row_size(type_k, d), cache_k.nb[1]), 0), 0, 2, 1, 3)
    v = ggml.permute(ggml.view(cache_v, (d, n_head_kv, n_kv), (ggml.row_size(type_v, d), cache_v.nb[1]), 0), 0, 2, 1, 3)
    mask = ggml.new_tensor(T.F16, n_kv, n_tokens, 1, 1)
    return ggml.flash_attn_ext(q, k, v, mask, 0.125, 0.0, 0.0)


# --- CUDA: get_alloc_size (cu:903-919) ------------------------------------------------------------

def test_cuda_pads_quantized_rows_to_512():
    cc = 890
    # Q4_0 (32 values in 18 bytes): ne0 4096 is a multiple of 512, nothing is added
    t = ggml.new_tensor(T.Q4_0, 4096, 3)
    assert t.nbytes == 3 * 4096 // 32 * 18 == 6912
    assert cuda.alloc_size(cc, t) == 6912
    # ne0 4128 = 8*512 + 32: the last row grows by 512 - 32 = 480 values, 480/32*18 = 270 bytes
    # (the brief's 4100 is not a whole number of Q4_0 blocks)
    t = ggml.new_tensor(T.Q4_0, 4128, 3)
    assert cuda.alloc_size(cc, t) == 3 * 129 * 18 + 270
    # a q8_0 K cache row of 256 values (4 heads of 64): + 256 values = 8 blocks of 34 bytes
    t = ggml.new_tensor(T.Q8_0, 256, 4096)
    assert cuda.alloc_size(cc, t) == t.nbytes + 272
    # not quantized: never padded
    t = ggml.new_tensor(T.F16, 4100, 2)
    assert cuda.alloc_size(cc, t) == t.nbytes == 16400


def test_cuda_buffer_types():
    host = cuda.cuda_host_buft()
    dev = cuda.cuda_backend(1, 890, 24 * GiB, host)
    assert (dev.name, dev.device_name, dev.dev_type, dev.buft.name) == ("CUDA1", "CUDA1", "GPU", "CUDA1")
    assert dev.buft.alignment == 128 and dev.buft.max_size == 2**64 - 1 and not dev.buft.is_host   # cu:897, 926
    assert (host.name, host.alignment, host.is_host) == ("CUDA_Host", 32, True)                      # cu:1309
    assert dev.host_buft is host and dev.is_async_with_events
    assert dev.supports_buft(dev.buft) and not dev.supports_buft(host)                               # cu:5630
    # 100 bytes take 128 in a CUDA buffer, 128 in CUDA_Host (32-aligned), tensor after tensor
    a, b = ggml.new_tensor(T.I8, 100), ggml.new_tensor(T.I8, 100)
    assert alloc_ctx_tensors(dev.buft, [a, b], "any").size == 256 and b.offset == 128
    a, b = ggml.new_tensor(T.I8, 100), ggml.new_tensor(T.I8, 100)
    assert alloc_ctx_tensors(host, [a, b], "any").size == 256 and b.offset == 128
    a, b = ggml.new_tensor(T.I8, 90), ggml.new_tensor(T.I8, 90)
    assert alloc_ctx_tensors(host, [a, b], "any").size == 192


# --- CUDA: FlashAttention kernels and their scratch (fa:541-756) -------------------------------------

def fa_f16_copies(node: Tensor) -> int:
    """dst bytes padded to 128, then K and V as f16 (fattn-common.cuh:66-81)."""
    k, v = node.src[1], node.src[2]
    return pad(pad(node.nbytes, 128) + 2 * k.nelements(), 128) + 2 * v.nelements()


@pytest.mark.parametrize("cc, n_tokens, kernel", [
    # Ada (8.9): quantized K/V take the vector kernel for 1 or 2 queries, else MMA (fa:656-660)
    (890, 1, cuda.FATTN_VEC), (890, 2, cuda.FATTN_VEC), (890, 3, cuda.FATTN_MMA_F16), (890, 512, cuda.FATTN_MMA_F16),
    # Turing/Ampere (7.5, 8.6): only 1 query (fa:661-664)
    (750, 1, cuda.FATTN_VEC), (750, 2, cuda.FATTN_MMA_F16), (860, 2, cuda.FATTN_MMA_F16),
    # Volta: gqa 4 -> gqa_ratio_eff 4; vec while n_tokens*4 <= 2 (never), tile up to 16, then MMA (fa:673-681)
    (700, 1, cuda.FATTN_TILE), (700, 4, cuda.FATTN_TILE), (700, 5, cuda.FATTN_MMA_F16),
    # Pascal: no tensor cores; quantized: vec for <= 2 queries, else tile (fa:705-719)
    (610, 2, cuda.FATTN_VEC), (610, 3, cuda.FATTN_TILE),
])
def test_cuda_fa_kernel_and_extra_bytes_by_compute_capability(cc, n_tokens, kernel):
    node = fa_node(64, n_tokens, 8, 2, 512, T.Q8_0, T.Q8_0)
    assert cuda.best_fattn_kernel(cc, node) == kernel
    # tile and MMA kernels need f16 K and V; the vector kernel has a compiled q8_0-q8_0 case (fa:737-750)
    expected = node.nbytes if kernel == cuda.FATTN_VEC else fa_f16_copies(node)
    assert cuda.alloc_size(cc, node) == expected


def test_cuda_fa_extra_bytes_by_hand():
    # d 64, 512 queries, 8 heads: dst 64*8*512*4 = 1 MiB; K and V 64*512*2 = 65536 values each
    node = fa_node(64, 512, 8, 2, 512, T.Q8_0, T.Q8_0)
    assert cuda.alloc_size(890, node) == 1048576 + 2 * 65536 + 2 * 65536 == 1310720
    # an f16 cache needs no copy whatever the kernel
    node = fa_node(64, 512, 8, 2, 512, T.F16, T.F16)
    assert cuda.alloc_size(890, node) == cuda.alloc_size(700, node) == node.nbytes
    # q8_0 K with f16 V: no vector kernel compiled for that pair by default (GGML_CUDA_FA_QUANTS),
    # so the vector kernel falls back to f16: K gets a copy, V is f16 already
    node = fa_node(64, 1, 8, 2, 512, T.Q8_0, T.F16)
    assert cuda.best_fattn_kernel(890, node) == cuda.FATTN_VEC
    assert cuda.alloc_size(890, node) == pad(node.nbytes, 128) + 2 * 65536


def test_cuda_fa_supported_head_sizes_and_types():
    assert cuda.supports_op(890, "CUDA0", fa_node(128, 4, 8, 2, 512, T.F16, T.F16))
    assert not cuda.supports_op(890, "CUDA0", fa_node(48, 4, 8, 2, 512, T.F16, T.F16))     # fa:598: no kernel
    assert not cuda.supports_op(890, "CUDA0", fa_node(64, 4, 8, 2, 512, T.IQ4_NL, T.IQ4_NL))  # fa:525
    # head 40 has no tensor-core kernel but a tile one
    assert cuda.best_fattn_kernel(890, fa_node(40, 4, 8, 2, 512, T.F16, T.F16)) == cuda.FATTN_TILE


# --- CUDA: offload_op and supports_op -----------------------------------------------------------------

def test_offload_op_thresholds():
    w = ggml.new_tensor(T.Q4_0, 64, 64)
    mm31, mm32 = ggml.mul_mat(w, ggml.new_tensor(T.F32, 64, 31)), ggml.mul_mat(w, ggml.new_tensor(T.F32, 64, 32))
    rope = ggml.rope_ext(ggml.new_tensor(T.F32, 64, 1, 32), ggml.new_tensor(T.I32, 32), None, 64, 0, 0)
    rows = ggml.get_rows(ggml.new_tensor(T.F32, 64, 100), ggml.new_tensor(T.I32, 64))
    add = ggml.add(ggml.new_tensor(T.F32, 64, 4, 8), ggml.new_tensor(T.F32, 64, 4, 8))     # 32 rows
    for offload in (cuda.offload_op, vulkan.offload_op):                                  # cu:5636, vk debug:766
        assert not offload(mm31) and offload(mm32)
        assert offload(rope)          # ROPE counts ne[2] (32 tokens), not ne[1] (1 head)
        assert not offload(rows)      # GET_ROWS: batch 0
        assert offload(add)           # nrows = 4*8
    # Metal offloads only MUL_MAT(_ID) (mt:774)
    assert metal.offload_op(mm32) and not metal.offload_op(mm31)
    assert not metal.offload_op(rope) and not metal.offload_op(add)


def test_cuda_supports_op_for_our_ops():
    ok = lambda t: cuda.supports_op(890, "CUDA0", t)   # noqa: E731
    x = ggml.new_tensor(T.F32, 256, 8)
    for wtype, expected in ((T.Q4_0, True), (T.Q4_K, True), (T.Q6_K, True), (T.IQ4_NL, True), (T.TQ1_0, False)):
        assert ok(ggml.mul_mat(ggml.new_tensor(wtype, 256, 16), x)) is expected                # cu:5245
    idx = ggml.new_tensor(T.I64, 8)
    cache = lambda ty: ggml.new_tensor(ty, 256, 64)   # noqa: E731
    assert ok(ggml.set_rows(cache(T.Q8_0), x, idx)) and ok(ggml.set_rows(cache(T.F16), x, idx))   # cu:5318
    assert not ok(ggml.set_rows(cache(T.Q4_K), x, idx))
    # IQ4_NL rows are read in QK_K (256) blocks (cu:5306)
    assert ok(ggml.get_rows(ggml.new_tensor(T.IQ4_NL, 256, 10), ggml.new_tensor(T.I32, 4)))
    assert not ok(ggml.get_rows(ggml.new_tensor(T.IQ4_NL, 96, 10), ggml.new_tensor(T.I32, 4)))
    # a source in another CUDA device's buffer (cu:5152-5160)
    w = ggml.new_tensor(T.F16, 256, 16)
    w.buffer = Buffer(cuda.cuda_backend(1, 890, GiB, cuda.cuda_host_buft()).buft, "weights")
    assert not ok(ggml.mul_mat(w, x)) and cuda.supports_op(890, "CUDA1", ggml.mul_mat(w, x))
    w.buffer = Buffer(cuda.cuda_host_buft(), "weights")
    assert ok(ggml.mul_mat(w, x))
    # F16 activations need an F16 matrix (cu:5221)
    assert not ok(ggml.mul_mat(ggml.new_tensor(T.Q4_0, 256, 16), ggml.new_tensor(T.F16, 256, 8)))
    # an op outside the switch: its default (cu:5625)
    assert not ok(op_node("WIN_PART", x))


def test_cuda_supports_the_ops_of_moe_swa_and_recurrent_models():
    ok = lambda t: cuda.supports_op(890, "CUDA0", t)   # noqa: E731
    x, h = ggml.new_tensor(T.F32, 256, 8), ggml.new_tensor(T.F16, 256, 8)
    # every unary op on a contiguous source (cu:5164-5193), XIELU excepted for BF16
    assert ok(ggml.unary(x, "GELU")) and ok(ggml.unary(x, "TANH")) and ok(ggml.unary(x, "SIGMOID"))
    assert not ok(ggml.unary(ggml.transpose(x), "GELU"))
    xielu = ggml.unary(ggml.new_tensor(T.BF16, 256, 8), "SILU")
    xielu.op_params = (cuda.GGML_UNARY_OP_XIELU,)
    assert not ok(xielu)
    # experts: MUL_MAT_ID as MUL_MAT (cu:5215-5276); sorting by CUB on CUDA >= 11.7 (common.cuh:114)
    experts, ids = ggml.new_tensor(T.MXFP4, 256, 128, 8), ggml.new_tensor(T.I32, 2, 8)
    assert ok(ggml.mul_mat_id(experts, ggml.new_tensor(T.F32, 256, 1, 8), ids))
    assert not ok(ggml.mul_mat_id(experts, ggml.new_tensor(T.F16, 256, 1, 8), ids))
    assert ok(ggml.argsort(ggml.new_tensor(T.F32, 100000, 8)))
    assert ok(ggml.sum_rows(x)) and not ok(ggml.sum_rows(h))                                    # cu:5581
    assert ok(ggml.div(x, x)) and ok(ggml.clamp(x, 0.0, 1.0)) and ok(ggml.fill(x, 0.0))
    # CONCAT: same types; plain types of 1, 2, 4 or 8 bytes (cu:5220-5251)
    q = ggml.permute(ggml.new_tensor(T.Q8_0, 256, 8, 2), 0, 2, 1, 3)
    assert ok(ggml.concat(x, x, 0)) and ok(ggml.concat(h, h, 1)) and not ok(ggml.concat(q, q, 1))
    with pytest.raises(ggml.GGMLAbort):    # ggml_concat asserts one type: no such node reaches a backend
        ggml.concat(x, h, 0)


def op_node(op: str, *srcs: Tensor, type_: int = T.F32, ne=None, params: tuple = ()) -> Tensor:
    """A node of an op planner.ggml has no constructor for: the shape of its first source unless given."""
    t = ggml.new_tensor(type_, *(ne or srcs[0].ne))
    t.op, t.src, t.op_params = op, list(srcs), params
    return t


def indexer(n_head: int, type_k: int, q_row: int = 128) -> Tensor:
    """LIGHTNING_INDEXER as the DSA graph builds it: q f32 [128, n_head, 8 tokens] (rows of q_row
    values), keys [128, 1, 256], f32 head weights [n_head, 8], f16 mask [256, 8]."""
    q = ggml.view(ggml.new_tensor(T.F32, q_row, n_head, 8), (128, n_head, 8), (4 * q_row, 4 * q_row * n_head), 0)
    k = ggml.new_tensor(type_k, 128, 1, 256)
    return ggml.lightning_indexer(q, k, ggml.new_tensor(T.F32, n_head, 8), ggml.new_tensor(T.F16, 256, 8))


def hc_ops(hc: int = 4, mixes: int = 24) -> tuple[Tensor, Tensor, Tensor]:
    """DeepSeek-V4's hyper-connection ops over 8 tokens of 64 values, hc residual streams."""
    x, residual = ggml.new_tensor(T.F32, 64, 8), ggml.new_tensor(T.F32, 64, hc, 8)
    pre = ggml.dsv4_hc_pre(residual, ggml.new_tensor(T.F32, hc, 8))
    comb = ggml.dsv4_hc_comb(ggml.new_tensor(T.F32, mixes, 8), ggml.new_tensor(T.F32, 3),
                             ggml.new_tensor(T.F32, mixes), 1e-6, 20)
    post = ggml.dsv4_hc_post(x, residual, ggml.new_tensor(T.F32, hc, 8), comb)
    return pre, comb, post


def test_cuda_supports_the_ops_of_recurrent_dsa_and_dsv4_models():
    ok = lambda t: cuda.supports_op(890, "CUDA0", t)   # noqa: E731
    x = ggml.new_tensor(T.F32, 64, 4, 8)
    state = ggml.new_tensor(T.F32, 64 * 64 * 4, 2)
    # the linear attentions, CUMSUM, TRI, SOLVE_TRI, TOP_K: whatever their operands (cu:5594-5596, 5617-5620)
    assert ok(ggml.rwkv_wkv6(x, x, x, ggml.new_tensor(T.F32, 64, 4), x, state))
    assert ok(ggml.gated_linear_attn(x, x, x, x, state, 0.125))
    assert ok(ggml.rwkv_wkv7(x, x, x, x, x, x, state))
    for op in ("CUMSUM", "TRI", "SOLVE_TRI", "DIAG"):
        assert ok(op_node(op, x))
    assert ok(ggml.top_k(ggml.new_tensor(T.F32, 100000, 8), 2048))      # CUB: any row length (cu:5562)
    # L2_NORM, like NORM and RMS_NORM, wants contiguous rows only (cu:5465-5468)
    assert ok(ggml.l2_norm(ggml.permute(x, 0, 2, 1, 3), 1e-6)) and not ok(ggml.l2_norm(ggml.transpose(x), 1e-6))
    # the hyper-connection ops: f32 throughout, no shape test (cu:5600-5609)
    assert all(ok(t) for t in hc_ops()) and all(ok(t) for t in hc_ops(hc=4, mixes=32))
    pre = hc_ops()[0]
    pre.src[1] = ggml.new_tensor(T.F16, 4, 8)
    assert not ok(pre)
    # the lightning indexer: head size 128, 64 or 32 heads, unquantized Q and K rows 16-byte aligned,
    # K f32/bf16/f16/q8_0/q5_1/q5_0/q4_1/q4_0 (lightning-indexer.cu:536-588)
    assert ok(indexer(64, T.F16)) and ok(indexer(32, T.Q8_0)) and ok(indexer(64, T.BF16))
    assert not ok(indexer(16, T.F16)) and not ok(indexer(64, T.Q4_K))
    assert not ok(indexer(64, T.F16, q_row=130))       # nb[1] = 520 bytes, not a multiple of 16
    assert ok(indexer(64, T.F16, q_row=132))           # 528 is


def test_cuda_supports_op_of_ops_no_architecture_builds():
    ok = lambda t: cuda.supports_op(890, "CUDA0", t)   # noqa: E731
    a, b = ggml.new_tensor(T.F32, 64, 8), ggml.new_tensor(T.F32, 64, 8)
    assert ok(op_node("OUT_PROD", a, b)) and not ok(op_node("OUT_PROD", a, b, type_=T.F16))       # cu:5275
    assert ok(op_node("SOFT_MAX_BACK", a, b, params=(1.0, 0.0)))                                   # cu:5527
    assert not ok(op_node("SOFT_MAX_BACK", a, b, params=(1.0, 8.0)))                               # ALiBi
    assert ok(op_node("SET", a, b)) and not ok(op_node("SET", a, ggml.new_tensor(T.F16, 64, 8)))  # cu:5332
    assert ok(op_node("REPEAT_BACK", ggml.new_tensor(T.F32, 4, 8, 128, 256), ne=(4, 8, 1, 1)))     # 2^15 planes
    assert not ok(op_node("REPEAT_BACK", ggml.new_tensor(T.F32, 4, 8, 128, 257), ne=(4, 8, 1, 1)))
    assert ok(op_node("ROLL", a)) and not ok(op_node("ROLL", ggml.transpose(a)))                   # cu:5532
    assert ok(op_node("CONV_2D_DW", ggml.new_tensor(T.F16, 3, 3, 8), a))                          # cu:5549
    assert not ok(op_node("CONV_2D_DW", ggml.new_tensor(T.Q8_0, 32, 3, 8), a))


class Deps:
    """The scheduler's add_alloc_dep (ggml-backend.cpp:1464-1470): per `until`, the kept tensors once each."""

    def __init__(self) -> None:
        self.keep: dict[Tensor, list[Tensor]] = {}

    def __call__(self, tensor: Tensor, until: Tensor) -> None:
        keep = self.keep.setdefault(until, [])
        if not any(t is tensor for t in keep):
            keep.append(tensor)


def moe_reduction(n_expert_used: int, expert_scale: bool = False):
    """build_moe_ffn's weighted sum of the experts' outputs (llama-graph.cpp): experts [64, n_used, 8]
    (an expert down projection's output) times the router weights [1, n_used, 8], one view per used
    expert, the ADDs summing them. Returns (nodes, experts, scale, weights, dst)."""
    experts = ggml.mul_mat_id(ggml.new_tensor(T.Q8_0, 32, 64, 16), ggml.new_tensor(T.F32, 32, n_expert_used, 8),
                              ggml.new_tensor(T.I32, n_expert_used, 8))
    scale = ggml.new_tensor(T.F32, 1, n_expert_used, 8) if expert_scale else None
    weights = ggml.new_tensor(T.F32, 1, n_expert_used, 8)
    weighted = ggml.mul(ggml.mul(experts, scale) if scale is not None else experts, weights)
    views = [ggml.view(weighted, (64, 8), (weighted.nb[2],), i * weighted.nb[1]) for i in range(n_expert_used)]
    dst = views[0]
    for v in views[1:]:
        dst = ggml.add(dst, v)
    return graph(*views, dst), experts, scale, weights, dst


def test_cuda_graph_optimize_keeps_the_moe_reduction_inputs():
    # MUL, 4 VIEWs, 3 ADDs: one fused kernel reads the experts and the weights until the last ADD
    # (cu:3044-3174, 4539-4548)
    nodes, experts, _, weights, dst = moe_reduction(4)
    assert [t.op for t in nodes] == ["MUL_MAT_ID", "MUL", "VIEW", "VIEW", "VIEW", "VIEW", "ADD", "ADD", "ADD"]
    deps = Deps()
    cuda.graph_optimize(GraphView(nodes, []), deps, use_counts(nodes))
    assert deps.keep == {dst: [experts, weights]}
    # (experts * expert scale) * weights: the scale kept too, after the weights (cu:4542-4546)
    nodes, experts, scale, weights, dst = moe_reduction(4, expert_scale=True)
    deps = Deps()
    cuda.graph_optimize(GraphView(nodes, []), deps, use_counts(nodes))
    assert deps.keep == {dst: [experts, weights, scale]}
    # 15 used experts at most (MOE_WEIGHTED_REDUCTION_MAX_EXPERTS, cu:3034)
    for n_used, fused in ((15, True), (16, False)):
        nodes, *_ = moe_reduction(n_used)
        deps = Deps()
        cuda.graph_optimize(GraphView(nodes, []), deps, use_counts(nodes))
        assert bool(deps.keep) is fused
    # a view read outside the reduction: the views cannot be elided (ggml_can_fuse_subgraph_ext)
    nodes, *_ = moe_reduction(4)
    nodes.append(ggml.scale(nodes[3], 2.0))
    deps = Deps()
    cuda.graph_optimize(GraphView(nodes, []), deps, use_counts(nodes))
    assert not deps.keep


def topk_moe(n_expert: int, n_expert_used: int = 2, norm: bool = True):
    """build_moe_ffn's softmax gating (llama-graph.cpp): probs, the top-k ids, their weights, with
    norm_w the weights' sum clamped and divided out; then the next node of the layer."""
    logits = ggml.mul_mat(ggml.new_tensor(T.F32, 64, n_expert), ggml.new_tensor(T.F32, 64, 8))
    probs = ggml.soft_max(logits)
    ids = ggml.argsort_top_k(probs, n_expert_used)
    weights = ggml.get_rows(ggml.reshape(probs, 1, n_expert, 8), ids)
    if norm:
        weights = ggml.reshape(weights, n_expert_used, 8)
        weights = ggml.reshape(ggml.div(weights, ggml.clamp(ggml.sum_rows(weights), 6.103515625e-5, float("inf"))),
                               1, n_expert_used, 8)
    after = ggml.reshape(ggml.new_tensor(T.F32, 64, 8), 64, 1, 8)
    return graph(weights, after)


def test_cuda_graph_optimize_keeps_the_topk_moe_gating_alive_to_the_next_node():
    nodes = topk_moe(8)
    assert [t.op for t in nodes] == ["MUL_MAT", "SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE",
                                     "SUM_ROWS", "CLAMP", "DIV", "RESHAPE", "RESHAPE"]
    deps = Deps()
    cuda.graph_optimize(GraphView(nodes, []), deps, use_counts(nodes))
    # add_alloc_deps(i, i + ops.size()) (cu:4603): every node of the gating and its sources, kept
    # until the node after the last one, in node order (cu:4530-4539)
    logits, after = nodes[0], nodes[-1]
    assert deps.keep == {after: [nodes[1], logits, *nodes[2:11]]}
    # without the normalisation the run ends at GET_ROWS
    nodes = topk_moe(8, norm=False)
    deps = Deps()
    cuda.graph_optimize(GraphView(nodes, []), deps, use_counts(nodes))
    assert deps.keep == {nodes[-1]: [nodes[1], nodes[0], *nodes[2:6]]}
    # only instantiated expert counts: powers of 2 up to 512, 288 and 576 (topk-moe.cu:407-412)
    for n_expert, fused in ((6, False), (288, True), (576, True), (1024, False)):
        nodes = topk_moe(n_expert)
        deps = Deps()
        cuda.graph_optimize(GraphView(nodes, []), deps, use_counts(nodes))
        assert bool(deps.keep) is fused, n_expert
    # at the end of a split the C reads on into the next split's nodes (the view shares the graph's
    # array): the next split's first node is kept waiting for
    nodes = topk_moe(8)
    counts = use_counts(nodes)
    deps = Deps()
    cuda.graph_optimize(GraphView(nodes[:-1], nodes[-1:]), deps, counts)
    assert deps.keep == {nodes[-1]: [nodes[1], nodes[0], *nodes[2:11]]}
    # a SCALE there, reading the gating's output, belongs to the pattern: ops.size() then passes the
    # split's end and ggml_can_fuse_subgraph refuses the run (ggml-impl.h:740)
    nodes = graph(ggml.scale(topk_moe(8)[10], 2.0))
    deps = Deps()
    cuda.graph_optimize(GraphView(nodes[:-1], nodes[-1:]), deps, use_counts(nodes))
    assert not deps.keep


# --- Metal -----------------------------------------------------------------------------------------

def test_metal_fa_alloc_size_by_hand():
    # d 64, 100 queries, 8 heads, 2 KV heads, 512 KV rows, f16 cache
    node = fa_node(64, 100, 8, 2, 512, T.F16, T.F16)
    out = 64 * 8 * 100 * 4
    # pad (ops:3064): 64 KV rows of K (row 128*2 bytes) * 2 heads, same for V, and 64 mask rows of 100*2 bytes
    pad_ = 64 * (256 * 2 * 1 + 256 * 2 * 1 + 2 * 100 * 1 * 1)
    # blk (ops:3122): not vec (100 >= 20): ceil(100/8) = 13 x ceil(512/64) = 8 bytes, padded to 32
    blk = pad(13 * 8, 32)
    # tmp (ops:3161): min(100, 32) * 8 heads * 32 workgroups * (64 + 2) floats
    tmp = 4 * 32 * 8 * 1 * 32 * 66
    # kv_f16 (ops:3190), always: K and V as f16, 64*512*2 values each, padded to 16
    kv = 2 * (2 * 64 * 512 * 2)
    assert metal.alloc_size(node) == out + pad_ + blk + tmp + kv
    # q8_0 with 32 or more queries: the pad counts f16 rows (2*64 bytes), not q8_0 ones
    node = fa_node(64, 100, 8, 2, 512, T.Q8_0, T.Q8_0)
    assert metal.fa_extra_pad(node) == 64 * (128 * 2 + 128 * 2 + 2 * 100)
    # a vec-sized batch (< 20 queries) sizes blk by 1 query x 32 KV rows per block
    node = fa_node(64, 4, 8, 2, 512, T.F16, T.F16)
    assert metal.fa_extra_blk(node) == pad(4 * 16, 32)


def test_metal_other_alloc_sizes():
    # MUL_MAT_ID: +4*n_expert (tpe), +4*n_expert*n_token (ids), +8 + 256*4 (amax) (ops:2650-2673)
    w = ggml.new_tensor(T.Q4_0, 64, 32, 8)               # 8 experts
    ids = ggml.new_tensor(T.I32, 2, 10)                  # 2 used experts, 10 tokens
    mm_id = Tensor(T.F32, (32, 2, 10, 1), ggml.contiguous_nb(T.F32, (32, 2, 10, 1)), "MUL_MAT_ID",
                   [w, ggml.new_tensor(T.F32, 64, 2, 10), ids])
    assert metal.alloc_size(mm_id) == mm_id.nbytes + 32 + 320 + 8 + 1024
    x = ggml.new_tensor(T.F32, 100, 3)
    cumsum = Tensor(T.F32, x.ne, x.nb, "CUMSUM", [x])
    assert metal.alloc_size(cumsum) == 2 * 1200
    top_k = Tensor(T.I32, (4, 3, 1, 1), ggml.contiguous_nb(T.I32, (4, 3, 1, 1)), "TOP_K", [x])
    assert metal.alloc_size(top_k) == 2 * 4 * 300


def test_metal_device():
    dev = metal.metal_backend(0, 64 * GiB, 48 * GiB)
    assert (dev.name, dev.buft.name, dev.mapped_buft.name) == ("MTL0", "MTL0", "MTL0_Mapped")
    assert dev.buft.alignment == 32 and dev.buft.max_size == 48 * GiB and dev.host_buft is None
    assert dev.supports_buft(dev.buft) and dev.supports_buft(dev.mapped_buft)
    assert dev.graph_optimize is not None


def weight(buft: BufferType, *ne: int, offset: int = 0) -> Tensor:
    t = ggml.new_tensor(T.F32, *ne)
    t.buffer, t.offset = Buffer(buft, "weights"), offset
    return t


def graph(*outs: Tensor) -> list[Tensor]:
    g = Cgraph()
    for t in outs:
        ggml.build_forward_expand(g, t)
    return g.nodes


def test_metal_graph_optimize_moves_fused_group_and_keeps_its_inputs():
    mapped = BufferType("MTL0_Mapped", 32)
    w1, w2 = weight(mapped, 64, 64), weight(mapped, 64, offset=16384)
    x, x2 = ggml.new_tensor(T.F32, 64, 4), ggml.new_tensor(T.F32, 64, 4)
    p = ggml.mul_mat(w1, x)
    u = ggml.rms_norm(p, 1e-5)              # reads p: cannot run with it
    n = ggml.rms_norm(x2, 1e-5)
    m = ggml.mul(n, w2)                     # RMS_NORM + MUL: one fusion group (fu:678)
    nodes = graph(p, u, m)
    assert nodes == [p, u, n, m]
    deps = []
    metal.graph_optimize(nodes, lambda t, until: deps.append((t, until)), use_counts(nodes))
    # fu:705-760: the raw run RMS_NORM, MUL keeps its external sources (x2, w2) until m
    assert deps == [(x2, m), (w2, m)]
    # co:386-431: u conflicts with p (it reads p's output); the group [n, m] only reads x2 and w2,
    # so it is pulled ahead of u as a whole. Unfused, m would have stayed behind u (it reads n).
    assert nodes == [p, n, m, u]


def test_metal_graph_optimize_respects_buffer_ranges():
    kv = BufferType("MTL0", 32)
    cache = ggml.new_tensor(T.F16, 64, 16)
    cache.buffer, cache.offset = Buffer(kv, "any"), 0
    w = weight(BufferType("MTL0_Mapped", 32), 64, 64)
    x, idx = ggml.new_tensor(T.F32, 64, 4), ggml.new_tensor(T.I64, 4)
    a = ggml.mul_mat(w, x)
    s = ggml.set_rows(cache, a, idx)                  # writes the cache, reads a
    r = ggml.cont(ggml.view(cache, (64, 16), (128,), 0))  # reads the cache: must stay after s
    b = ggml.mul_mat(w, x)                            # independent: moves up with s
    nodes = graph(s, r, b)
    assert [t.op for t in nodes] == ["MUL_MAT", "SET_ROWS", "VIEW", "CONT", "MUL_MAT"]
    metal.graph_optimize(nodes, lambda t, until: None, use_counts(nodes))
    # s conflicts with a; pulled forward: the VIEW (empty; its dst range is the cache's, which s will
    # write: blocked), CONT (reads the cache range s writes: blocked), b (free): moved
    assert nodes == [a, b, s, nodes[3], nodes[4]] and [t.op for t in nodes[3:]] == ["VIEW", "CONT"]


def test_metal_supports_op_by_the_source():
    ok, cu = metal.supports_op, lambda t: cuda.supports_op(890, "CUDA0", t)   # noqa: E731
    # MUL_MAT_ID with f16 activations: no f16 mat-vec kernel for it, only the mat-mat one, for 32
    # tokens or more and rows of 64 values or more (dev:1856, co:44-49); CUDA refuses it outright
    experts = ggml.new_tensor(T.Q4_0, 256, 128, 8)
    for n_tokens, expected in ((32, True), (31, False)):
        node = ggml.mul_mat_id(experts, ggml.new_tensor(T.F16, 256, 2, n_tokens), ggml.new_tensor(T.I32, 2, n_tokens))
        assert ok(node) is expected and not cu(node)
    # MUL_MAT: f16 x f16 has a mat-vec kernel; a quantized matrix by f16 needs the mat-mat path, 9
    # columns or more (co:35-42)
    assert ok(ggml.mul_mat(ggml.new_tensor(T.F16, 256, 16), ggml.new_tensor(T.F16, 256, 1)))
    assert not ok(ggml.mul_mat(ggml.new_tensor(T.Q4_0, 256, 16), ggml.new_tensor(T.F16, 256, 8)))
    assert ok(ggml.mul_mat(ggml.new_tensor(T.Q4_0, 256, 16), ggml.new_tensor(T.F16, 256, 9)))
    # a Hadamard-hinted f32 x f16 product runs on the FWHT kernels: widths 64-512, and 1024-8192
    # where n*4 bytes fit the 32 KiB of threadgroup memory (co:13-33)
    for n, expected in ((512, True), (8192, True), (96, False)):
        node = ggml.mul_mat(ggml.new_tensor(T.F32, n, n), ggml.new_tensor(T.F16, n, 4))
        node.op_params = (0, ggml.GGML_HINT_SRC0_IS_HADAMARD)
        assert ok(node) is expected
    x = ggml.new_tensor(T.F32, 64, 4, 8)
    state = ggml.new_tensor(T.F32, 64 * 64 * 4, 2)
    # the delta net wants S_v a multiple of 32 (dev:1842); RWKV 6/7 any; GATED_LINEAR_ATTN has no kernel
    gdn = lambda s_v: ggml.gated_delta_net(*(ggml.new_tensor(T.F32, s_v, 4, 8, 1) for _ in range(3)),   # noqa: E731
                                           ggml.new_tensor(T.F32, 4, 8, 1), ggml.new_tensor(T.F32, 1, 4, 8, 1),
                                           ggml.new_tensor(T.F32, s_v, s_v, 4, 1), 1)
    assert ok(gdn(64)) and not ok(gdn(16)) and cu(gdn(16))
    assert ok(ggml.rwkv_wkv6(x, x, x, ggml.new_tensor(T.F32, 64, 4), x, state))
    assert ok(ggml.rwkv_wkv7(x, x, x, x, x, x, state))
    gla = ggml.gated_linear_attn(x, x, x, x, state, 0.125)
    assert not ok(gla) and cu(gla)
    # the lightning indexer: exactly 64 heads of 128 (ggml-metal-impl.h:132-133), an f16 mask (dev:1772-1801)
    assert ok(indexer(64, T.F16)) and ok(indexer(64, T.Q8_0))
    assert not ok(indexer(32, T.F16)) and cu(indexer(32, T.F16))
    assert not ok(indexer(64, T.IQ4_NL))
    # the hyper-connection ops: 4 streams, 24 mixes (dev:1802-1834)
    assert all(ok(t) for t in hc_ops())
    pre, comb, post = hc_ops(mixes=32)
    assert ok(pre) and not ok(comb) and cu(comb)
    # CONCAT: plain types and the legacy quants only (dev:1621-1647); CUDA concatenates any quant
    q4k = ggml.new_tensor(T.Q4_K, 256, 4)
    assert ok(ggml.concat(x, x, 0)) and not ok(ggml.concat(q4k, q4k, 1)) and cu(ggml.concat(q4k, q4k, 1))
    # unary ops want contiguous rows (dev:1566-1593), CUDA a contiguous tensor
    permuted = ggml.permute(x, 0, 2, 1, 3)
    assert ok(ggml.unary(permuted, "SILU")) and not cu(ggml.unary(permuted, "SILU"))
    assert not ok(ggml.unary(ggml.transpose(x), "SILU"))
    # copies (dev:1860-1921)
    assert ok(ggml.cpy(x, ggml.new_tensor(T.Q2_0, 64, 4, 8)))
    assert not ok(ggml.cpy(ggml.new_tensor(T.F16, 64, 32), ggml.new_tensor(T.Q8_0, 64, 32)))
    for op in ("SOLVE_TRI", "CUMSUM", "TRI"):
        assert ok(op_node(op, x))
    assert not ok(op_node("WIN_PART", x))                         # outside the switch (dev:1956)


def packs(nodes: list[Tensor], i: int) -> int:
    return metal.fusion_max(nodes, i, use_counts(nodes))


def metal_deps(nodes: list[Tensor]) -> dict:
    deps = Deps()
    metal.add_fusion_alloc_deps(nodes, deps)
    return deps.keep


def test_metal_packs_the_moe_fusions_and_keeps_their_inputs():
    # the MoE reduction of 4 experts: MUL, 4 VIEWs, 3 ADDs are one group (fu:493-623)
    nodes, experts, _, weights, dst = moe_reduction(4)
    assert packs(nodes, 1) == 8
    # its raw run (ops_all) keeps the MUL's sources until the last ADD (fu:720-765)
    assert metal_deps(nodes) == {dst: [experts, weights]}
    # at most 8 experts (fu:484); an expert scale makes MUL, MUL: no pattern
    assert packs(moe_reduction(8)[0], 1) == 16 and packs(moe_reduction(9)[0], 1) == 1
    assert packs(moe_reduction(4, expert_scale=True)[0], 1) == 1
    # softmax top-k routing with normalised weights: SOFT_MAX .. DIV packed, the trailing RESHAPE
    # outside the group (fu:1117-1121 maps the matched non-empty nodes back); any expert count up to
    # 1024 (fu:422-425), where CUDA takes powers of 2, 288 and 576
    nodes = topk_moe(6)
    assert [packs(nodes, i) for i in (1, 10)] == [9, 1]
    # the raw run of 10 ops ends with that RESHAPE: the logits are kept until it
    assert metal_deps(nodes) == {nodes[10]: [nodes[0]]}
    nodes = topk_moe(6, norm=False)
    assert packs(nodes, 1) == 5 and metal_deps(nodes) == {nodes[5]: [nodes[0]]}
    assert packs(topk_moe(2048), 1) == 1


def test_metal_packs_the_recurrent_fusions():
    # SSM_CONV + SiLU (fu:142-171); a GELU does not fuse, but its raw run keeps the conv's inputs all
    # the same: alloc deps match the ops alone (fu:705-718)
    sx, c = ggml.new_tensor(T.F32, 3 + 8, 128, 1), ggml.new_tensor(T.F32, 4, 128)
    for act, fused in (("SILU", 2), ("GELU", 1)):
        nodes = graph(ggml.unary(ggml.ssm_conv(sx, c), act))
        assert packs(nodes, 0) == fused
        assert metal_deps(nodes) == {nodes[1]: [sx, c]}
    # the delta net and the CPY of its state snapshot into the recurrent cache (fu:211-270): the
    # views between them are packed along
    s_v, h, n_tokens = 64, 4, 8
    q, k, v = (ggml.new_tensor(T.F32, s_v, h, n_tokens, 1) for _ in range(3))
    for cache_row, fused in ((s_v * s_v * h, 4), (s_v * s_v * h + 64, 1)):
        net = ggml.gated_delta_net(q, k, v, ggml.new_tensor(T.F32, h, n_tokens, 1),
                                   ggml.new_tensor(T.F32, 1, h, n_tokens, 1), ggml.new_tensor(T.F32, s_v, s_v, h, 1), 1)
        state = ggml.view(net, (s_v, s_v, h, 1), (4 * s_v, 4 * s_v * s_v, 4 * s_v * s_v * h), 4 * s_v * h * n_tokens)
        cache = ggml.new_tensor(T.F32, cache_row, 4)
        nodes = graph(ggml.cpy(state, ggml.view(cache, (s_v * s_v * h, 1), (cache.nb[1],), 0)))
        assert [t.op for t in nodes] == ["GATED_DELTA_NET", "VIEW", "VIEW", "CPY"]
        assert packs(nodes, 0) == fused     # a cache row longer than the state: not the snapshot layout
        assert metal_deps(nodes) == {}      # the raw ops are not GATED_DELTA_NET, CPY


def test_metal_packs_the_snake_activation():
    # x + sin(a*x)^2 * inv_b, a and inv_b one value per channel (fu:273-325)
    x, a, inv_b = ggml.new_tensor(T.F32, 32, 16), ggml.new_tensor(T.F32, 1, 16), ggml.new_tensor(T.F32, 1, 16)
    mul0 = ggml.mul(x, a)
    sin = op_node("SIN", mul0)
    add = ggml.add(x, ggml.mul(ggml.sqr(sin), inv_b))
    nodes = graph(add)
    assert [t.op for t in nodes] == ["MUL", "SIN", "SQR", "MUL", "ADD"]
    assert packs(nodes, 0) == 5 and metal_deps(nodes) == {add: [x, a, inv_b]}
    other = ggml.add(ggml.new_tensor(T.F32, 32, 16), nodes[3])      # the closing ADD reads another x
    nodes = graph(other)
    assert packs(nodes, 0) == 1


@pytest.mark.parametrize("device", ["cuda:24GiB:cc=7.5", "cuda:24GiB:cc=8.9", "cuda:24GiB:cc=12.0", "metal:64GiB"])
def test_every_architecture_plans_on_cuda_and_metal(device):
    """supports_op is the whole switch and graph_optimize every fusion: no op is 'not modelled'."""
    for name in sorted({small for small, _, _ in ARCH_FIXTURES.values()} - NEEDS_TARGET):
        fa = ["-fa", "off"] if name in FA_OFF else []     # llama.cpp aborts on plm with flash attention
        result = CliRunner().invoke(cli, ["reserve", str(header_path(name)), "-c", "4096", *fa, "--device", device])
        assert result.exit_code == 0, (name, result.output)


# --- Vulkan ----------------------------------------------------------------------------------------

LAVAPIPE = dataclasses.replace(vulkan.DEFAULT_DEVICE, min_storage_buffer_offset_alignment=16,
                               max_memory_allocation_size=2 * GiB, max_buffer_size=2**32 - 1,
                               max_storage_buffer_range=128 * 1024**2, subgroup_size=8, subgroup_min_size=8)


def test_vulkan_buffer_types():
    host = vulkan.vulkan_host_buft(vulkan.DEFAULT_DEVICE)
    dev = vulkan.vulkan_backend(0, 16 * GiB, dataclasses.replace(vulkan.DEFAULT_DEVICE,
                                                                 min_storage_buffer_offset_alignment=16), host)
    assert (dev.name, dev.buft.name, dev.buft.alignment, dev.buft.max_size) == ("Vulkan0", "Vulkan0", 16, GiB)
    small = dataclasses.replace(vulkan.DEFAULT_DEVICE, max_memory_allocation_size=512 * 1024**2)
    assert vulkan.vulkan_backend(1, GiB, small, host).buft.max_size == 512 * 1024**2                   # vk:4218
    # maintenance4's maxBufferSize caps the allocation size (vk:4195-4199) and is the size test's limit
    m4 = dataclasses.replace(vulkan.DEFAULT_DEVICE, max_memory_allocation_size=4 * GiB, max_buffer_size=768 * 1024**2)
    assert (m4.max_alloc, m4.buffer_limit, m4.suballocation_block_size) == (768 * 1024**2, 768 * 1024**2, 768 * 1024**2)
    assert (LAVAPIPE.max_alloc, LAVAPIPE.buffer_limit) == (2 * GiB, 2**32 - 1)
    assert (host.name, host.alignment, host.max_size, host.is_host) == ("Vulkan_Host", 64, GiB, True)
    assert host.buffer_size(1000) == 1032 and host.buffer_size(0) == 0                 # vk:13080, backend.cpp:41
    assert dev.buft.buffer_size(1000) == 1000
    a, b = ggml.new_tensor(T.I8, 100), ggml.new_tensor(T.I8, 100)
    assert alloc_ctx_tensors(dev.buft, [a, b], "any").size == 224 and b.offset == 112
    igpu = vulkan.vulkan_backend(0, GiB, dataclasses.replace(vulkan.DEFAULT_DEVICE, integrated=True), host)
    assert (igpu.dev_type, igpu.mmap_support, dev.dev_type, dev.mmap_support) == ("IGPU", False, "GPU", True)


def test_vulkan_supports_op_sizes_and_types():
    dev = dataclasses.replace(vulkan.DEFAULT_DEVICE, max_memory_allocation_size=GiB)
    ok = lambda t: vulkan.supports_op(dev, t)   # noqa: E731
    x = ggml.new_tensor(T.F32, 256, 8)
    assert ok(ggml.mul_mat(ggml.new_tensor(T.Q4_K, 256, 16), x))
    # a tensor above max_buffer_size (vk:15307-15328)
    big = ggml.new_tensor(T.F32, 1024, 1024, 257)
    assert big.nbytes > GiB and not ok(ggml.add(big, big))
    assert ok(fa_node(64, 4, 8, 2, 512, T.IQ4_NL, T.IQ4_NL))                               # vk:15471
    assert not ok(fa_node(64, 4, 8, 2, 512, T.BF16, T.F16))                               # vk:15486
    assert not ok(fa_node(68, 4, 8, 2, 512, T.F16, T.F16))                                # HSK % 8
    # without subgroup shuffle and vote there is no scalar flash attention (vk:15491)
    no_vote = dataclasses.replace(dev, subgroup_ops=frozenset({"BASIC", "SHUFFLE"}))
    assert not vulkan.supports_op(no_vote, fa_node(64, 4, 8, 2, 512, T.F16, T.F16))
    # lavapipe: a storage buffer range of 128 MiB bounds every bound tensor (vk:15312-15316) ...
    logits = ggml.mul_mat(ggml.new_tensor(T.Q8_0, 576, 49152), ggml.new_tensor(T.F32, 576, 1024))
    assert logits.nbytes == 192 * 1024**2 and ok(logits) and not vulkan.supports_op(LAVAPIPE, logits)
    # ... unless the device has 64-bit indexing
    assert vulkan.supports_op(dataclasses.replace(LAVAPIPE, shader_64bit_indexing=True), logits)
    every_unary = [ggml.new_tensor(T.F32, 8) for _ in range(22)]
    for i, t in enumerate(every_unary):
        u = ggml.new_tensor(T.F32, 8)
        u.op, u.src, u.op_params = "UNARY", [t], (i,)
        assert ok(u)                                                                   # vk:15332-15354


def test_vulkan_mul_mat_id_needs_shared_memory_for_its_smallest_tile():
    # ggml_vk_matmul_shmem_support (vk:1418-1475) of s_warptile_mmqid {32, 32, 32, 32, ..., 32}: with fp16,
    # subgroups of 32 and no cooperative matrix, (32 + 32) * (32 + 1) * 2 + 32 * 2 * 2 + 1 * 4 * 4 = 4368
    # bytes, and the IQ2_S grid takes 8 KiB more
    def fits(shmem: int, type_: str) -> bool:
        return vulkan.mul_mat_id_supported(dataclasses.replace(vulkan.DEFAULT_DEVICE,
                                                                max_compute_shared_memory_size=shmem), type_)
    assert fits(4368, "Q4_K") and not fits(4367, "Q4_K")
    assert fits(4368 + 8192, "IQ2_S") and not fits(4368 + 8191, "IQ2_S")


def test_vulkan_graph_optimize_groups_independent_nodes():
    w = weight(BufferType("Vulkan0", 16), 64, 64)
    x = ggml.new_tensor(T.F32, 64, 4)
    q = ggml.mul_mat(w, x)
    rq = ggml.rms_norm(q, 1e-5)
    k = ggml.mul_mat(w, x)
    rk = ggml.rms_norm(k, 1e-5)
    nodes = graph(rq, rk)
    assert nodes == [q, rq, k, rk]
    vulkan.graph_optimize(nodes, lambda t, until: None, use_counts(nodes))
    # vk:14826-14866: from q, k is independent (taken), rq and rk read q and k (not taken); next set rq, rk
    assert nodes == [q, k, rq, rk]


def test_vulkan_graph_optimize_pulls_rope_view_set_rows():
    w = weight(BufferType("Vulkan0", 16), 64, 64)
    x, pos, idx = ggml.new_tensor(T.F32, 64, 4), ggml.new_tensor(T.I32, 4), ggml.new_tensor(T.I64, 4)
    cache = ggml.new_tensor(T.F32, 64, 16)
    cache.buffer, cache.offset = Buffer(BufferType("Vulkan0", 16), "any"), 0
    o = ggml.mul_mat(w, x)
    r = ggml.rope_ext(ggml.new_tensor(T.F32, 64, 1, 4), pos, None, 64, 0, 0)
    o2 = ggml.mul_mat(w, x)
    v = ggml.view(r, (64, 4), (r.nb[2],), 0)
    s = ggml.set_rows(cache, v, idx)
    nodes = graph(o, r, o2, s)
    assert nodes == [o, r, o2, v, s]
    vulkan.graph_optimize(nodes, lambda t, until: None, use_counts(nodes))
    # vk:14890-14921: with the ROPE taken, its VIEW and SET_ROWS join the set right after it (the
    # ROPE is used once, by the VIEW, and the VIEW once, by the SET_ROWS); then o2
    assert nodes == [o, r, v, s, o2]


# --- --device parsing, device order, buffer types ---------------------------------------------------

def test_parse_device():
    assert parse_device("cuda:24GiB:cc=8.9") == parse_device("CUDA:25769803776:cc=8.9")
    d = parse_device("cuda:24GiB:cc=12.0")
    assert (d.kind, d.memory, d.cc) == ("cuda", 24 * GiB, 1200)
    d = parse_device("metal:64GiB")
    assert (d.memory, d.max_buffer) == (64 * GiB, 64 * GiB)
    assert parse_device("metal:64GiB:maxbuf=36GB").max_buffer == 36 * 10**9
    d = parse_device("vulkan:7.5GiB:align=128:maxalloc=2GiB")
    assert (d.memory, d.vulkan.min_storage_buffer_offset_alignment, d.vulkan.min_memory_map_alignment,
            d.vulkan.max_memory_allocation_size) == (7.5 * GiB, 128, 64, 2 * GiB)
    assert parse_device("vulkan:16GiB").vulkan == vulkan.DEFAULT_DEVICE     # what no key gives: documented defaults
    for bad in ("cuda:24GiB", "cuda:24GiB:cc=89", "tpu:1GiB", "cuda", "metal:lots", "cuda:1GiB:cc=8.9:align=4",
                "vulkan:1GiB:align=0", "vulkan:1GiB:align=48", "vulkan:1GiB:maxalloc=0", "vulkan:1GiB:storage=1"):
        with pytest.raises(BadDevices):
            parse_device(bad)


def test_device_order_rpc_first_then_gpus_by_registry():
    # src/llama.cpp:276-285: RPC servers first, then the GPUs as the registry lists them (CUDA, Metal,
    # Vulkan: ggml-backend-reg.cpp:120-133), each backend's devices in --device order; CPU last
    d = devices_of(TINY, "--device", "vulkan:8GiB:align=16", "--device", "cuda:24GiB:cc=8.9", "--rpc", "10.0.0.1:50052",
                   "--device", "metal:16GiB", "--device", "cuda:8GiB:cc=7.5", "-ts", "1,1,1,1,1")
    assert [b.name for b in d.backends] == ["RPC0[10.0.0.1:50052]", "CUDA0", "CUDA1", "MTL0", "Vulkan0", "CPU"]
    assert [b.device_name for b in d.model_devices()] == ["RPC0", "CUDA0", "CUDA1", "MTL0", "Vulkan0"]
    assert d.backends[2].memory == 8 * GiB                 # the second cuda flag is CUDA1
    # the first device is the RPC server, which has no host buffer type: the CPU keeps CPU
    # (llama-context.cpp:408-419); make_cpu_buft_list takes the first device that has one: CUDA0's
    assert [b.name for b in d.backend_bufts] == ["RPC0[10.0.0.1:50052]", "CUDA0", "CUDA1", "MTL0", "Vulkan0", "CPU"]
    assert d.host_backend.name == "CUDA0"
    assert d.pipeline_parallel                           # all async + events, full offload, -sm layer


@pytest.mark.parametrize("device, cpu_buft", [("cuda:24GiB:cc=8.9", "CUDA_Host"), ("vulkan:16GiB:align=16", "Vulkan_Host"),
                                              ("metal:16GiB", "CPU")])
def test_cpu_computes_in_the_first_devices_host_buffer(device, cpu_buft):
    d = devices_of(TINY, "--device", device)
    assert d.backend_bufts[-1].name == cpu_buft and d.cpu.buft.name == "CPU"
    # --no-host leaves the CPU backend's buffer type alone: only make_cpu_buft_list reads it
    d = devices_of(TINY, "--device", device, "--no-host")
    assert d.backend_bufts[-1].name == cpu_buft and d.host_backend is None


def test_layers_split_by_free_memory():
    # 24 GiB + 8 GiB -> split points 0.75, 1.0 over 23 layers (22 + output): layer il goes to the
    # first device whose point exceeds il/23, so il <= 17 (17/23 = 0.739) on CUDA0 (llama-model.cpp:1591)
    d = devices_of(TINYLLAMA, "--device", "cuda:24GiB:cc=8.9", "--device", "cuda:8GiB:cc=8.9")
    assert [b.name for b in d.layer_backend] == ["CUDA0"] * 18 + ["CUDA1"] * 4 and d.output_backend.name == "CUDA1"
    # -ts wins over memory: 1,1 -> il/23 < 0.5 -> il <= 11
    d = devices_of(TINYLLAMA, "--device", "cuda:24GiB:cc=8.9", "--device", "cuda:8GiB:cc=8.9", "-ts", "1,1")
    assert [b.name for b in d.layer_backend] == ["CUDA0"] * 12 + ["CUDA1"] * 10
    # RPC servers' memory is unknown: mixing needs -ts; -sm row has no split buffers here
    with pytest.raises(BadDevices, match="-ts"):
        devices_of(TINYLLAMA, "--rpc", "127.0.0.1:1", "--device", "cuda:24GiB:cc=8.9")
    with pytest.raises(BadDevices, match="split buffers"):
        devices_of(TINYLLAMA, "--device", "cuda:24GiB:cc=8.9", "-sm", "row")
    d = devices_of(TINYLLAMA, "--device", "cuda:24GiB:cc=8.9", "--device", "vulkan:8GiB:align=16", "-sm", "none", "-mg", "1")
    assert [b.name for b in d.backends] == ["Vulkan0", "CPU"] and d.backend_bufts[-1].name == "Vulkan_Host"


def test_cpu_weights_skip_repack_when_a_host_buffer_type_comes_first():
    # make_cpu_buft_list: [CUDA_Host, CPU_REPACK, CPU]; CUDA supports a Q4_0 MUL_MAT, so CUDA_Host is
    # picked, and with mmap it becomes CPU, mapped (llama-model-loader.cpp:1268-1276). --no-host
    # drops CUDA_Host and the Q4_0 matrices of the CPU layers repack.
    with_host = reserve(TINYLLAMA, parse_params(CUDA + ["-ngl", "10", "-c", "512"]))["model_buffers"]
    no_host = reserve(TINYLLAMA, parse_params(CUDA + ["-ngl", "10", "-c", "512", "--no-host"]))["model_buffers"]
    assert "CPU_REPACK" not in with_host and "CPU_REPACK" in no_host
    assert with_host["CUDA0"] == no_host["CUDA0"]


# --- whole plans ---------------------------------------------------------------------------------------

def model_sizes(path: str) -> dict[str, int]:
    h = read_header(path)
    return {t.name: ggml.new_tensor(t.type, *t.ne).nbytes for t in h.tensors}


@pytest.mark.parametrize("path", [TINY, TINYLLAMA])
def test_full_offload_on_cuda_end_to_end(path):
    hp = load_hparams(ModelLoader(read_header(path)))
    plan = reserve(path, parse_params(CUDA + ["-ngl", "99", "-c", "4096"]))
    sizes = model_sizes(path)
    tied = "output.weight" not in sizes
    # the input layer stays on the CPU (llama-model.cpp:1605): token_embd mapped from the file; every
    # other weight (and a tied output's copy of token_embd) in CUDA0, each padded to 128
    assert plan["model_buffers"]["CPU_Mapped"] == sizes["token_embd.weight"]
    cuda0 = sum(pad(s, 128) for name, s in sizes.items() if name != "token_embd.weight")
    assert plan["model_buffers"]["CUDA0"] == cuda0 + (pad(sizes["token_embd.weight"], 128) if tied else 0)
    # f16 K and V of every layer: n_embd_k_gqa x 4096 cells
    kv = hp.n_embd_k_gqa() * 4096 * 2
    assert plan["kv_buffers"] == {"CUDA0": 2 * hp.n_layer * pad(kv, 128)}
    # the output layer is on CUDA0: logits in CUDA0's host buffer type (llama-context.cpp:2194-2201)
    assert plan["output_buffers"] == {"CUDA_Host": hp.n_vocab * 4}
    assert plan["params"]["flash_attn"] and plan["params"]["sched_copies"] == 1
    assert plan["params"]["devices"] == ["CUDA0"]
    # Splits: the token embedding's GET_ROWS reads a host (CPU_Mapped) weight, so pass 1 gives it the
    # CPU and CUDA does not take it (GET_ROWS batch 0 < 32); every other node follows a CUDA0 weight
    # or a neighbour (passes 1-2). Split 1 copies in the embeddings and the INPUT leafs it reads, in
    # node order: inp_pos (ROPE), k_idxs, v_idxs (SET_ROWS), kq_mask (FLASH_ATTN_EXT), out_ids.
    for name in ("pp", "tg"):
        assert plan["graphs"][name]["splits"] == 2
        cpu_split, gpu_split = plan["splits"][name]
        assert (cpu_split["backend"], cpu_split["nodes"], cpu_split["first"], cpu_split["inputs"]) == ("CPU", [0, 1], "embd", [])
        assert gpu_split["backend"] == "CUDA0" and gpu_split["last"] == "result_output"
        assert [i["name"] for i in gpu_split["inputs"]] == ["embd", "inp_pos", "attn_inp_k_idxs", "attn_inp_v_idxs",
                                                              "attn_inp_kq_mask", "out_ids"]
    assert set(plan["compute_buffers"]) == {"CUDA0", "CUDA_Host"}


def test_tinyllama_cuda_compute_peaks_at_the_logits():
    # pp with 512 outputs: the last MUL_MAT holds its input result_norm (2048 x 512 f32) and the
    # logits (32000 x 512 f32), both 128-aligned; every earlier tensor is smaller and freed by then
    plan = reserve(TINYLLAMA, parse_params(CUDA + ["-ngl", "99", "-c", "4096"]))
    assert plan["compute_buffers"]["CUDA0"] == 2048 * 512 * 4 + 32000 * 512 * 4


def test_metal_weights_are_mapped_from_the_file():
    plan = reserve(TINYLLAMA, parse_params(["--device", "metal:16GiB", "-ngl", "99", "-c", "512"]))
    h = read_header(TINYLLAMA)
    sizes = model_sizes(TINYLLAMA)
    offs = {t.name: t.offset for t in h.tensors}
    # get_mapping_range over the Metal context: first to last byte of its tensors in the file
    on_metal = [n for n in sizes if n != "token_embd.weight"]
    first = min(offs[n] for n in on_metal)
    last = max(offs[n] + sizes[n] for n in on_metal)
    assert plan["model_buffers"] == {"CPU_Mapped": sizes["token_embd.weight"], "MTL0_Mapped": last - first}
    assert plan["output_buffers"] == {"CPU": 32000 * 4}          # Metal has no host buffer type
    assert set(plan["compute_buffers"]) == {"MTL0", "CPU"}


def test_vulkan_compute_buffer_over_1gib_is_chunked():
    # -fa off, 2048 tokens, 4096 cells, 32 heads: kq alone is 4096*2048*32*4 = 1 GiB, the chunk limit
    # (the suballocation block, vk:4216), and more is alive beside it, so gallocr opens new chunks,
    # none above 1 GiB since no tensor is
    params = parse_params(["--device", "vulkan:16GiB:align=16", "-ngl", "99", "-c", "4096", "-b", "2048", "-ub", "2048",
                           "-fa", "off"])
    ctx = create_context(TINYLLAMA, params)
    sched_reserve(ctx)
    chunks = ctx.sched.galloc.chunk_sizes(0)
    assert len(chunks) >= 2 and all(c <= GiB for c in chunks) and sum(chunks) > GiB
    plan = reserve(TINYLLAMA, params)
    assert plan["compute_buffers"]["Vulkan0"] == sum(chunks)
    # the CPU's Vulkan_Host buffers are 32 bytes larger than asked (vk:13080), each chunk
    host_chunks = [c for c in ctx.sched.galloc.chunk_sizes(1) if c]
    assert plan["compute_buffers"]["Vulkan_Host"] == sum(host_chunks) + 32 * len(host_chunks)
    assert plan["output_buffers"] == {"Vulkan_Host": 32000 * 4 + 32}


# --- Vulkan profiles ---------------------------------------------------------------------------------

LAVAPIPE_PROFILE = Path(__file__).resolve().parent.parent / "fixtures" / "vulkan" / "lavapipe-mesa-22.3.6.json"


def test_lavapipe_profile_gives_what_ggml_vulkan_reads():
    """vulkaninfo --json of lavapipe, read as ggml_vk_get_device reads the driver (ggml_vulkan logged
    for it: fp16 1, warp size 8, shared memory 32768, matrix cores none)."""
    from schedplan.backends.vulkan_profile import read_profile
    d = read_profile(str(LAVAPIPE_PROFILE))
    assert (d.min_storage_buffer_offset_alignment, d.min_memory_map_alignment, d.max_storage_buffer_range) == \
        (16, 64, 128 * 1024**2)
    assert (d.max_memory_allocation_size, d.max_buffer_size, d.max_alloc, d.buffer_limit) == \
        (2 * GiB, 2**32 - 1, 2 * GiB, 2**32 - 1)
    assert (d.subgroup_size, d.max_compute_shared_memory_size, d.fp16, d.integrated) == (8, 32768, True, False)
    assert {"SHUFFLE", "VOTE", "ARITHMETIC"} <= d.subgroup_ops and not d.cooperative_matrix
    assert d.compute_full_subgroups and d.vulkan_memory_model and not d.shader_64bit_indexing


def test_profile_read_again_only_when_changed(tmp_path):
    """read_profile parses a file once while it is unchanged, and again once it changes."""
    import json
    import os

    from schedplan.backends.vulkan_profile import read_profile
    doc = json.loads(LAVAPIPE_PROFILE.read_text())
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    first = read_profile(str(path))
    assert read_profile(str(path)) is first
    limits = doc["capabilities"]["device"]["properties"]["VkPhysicalDeviceProperties"]["limits"]
    limits["maxStorageBufferRange"] = 256 * 1024**2
    path.write_text(json.dumps(doc))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))    # a new time even on coarse clocks
    assert (first.max_storage_buffer_range, read_profile(str(path)).max_storage_buffer_range) == \
        (128 * 1024**2, 256 * 1024**2)


@pytest.mark.parametrize("edit, message", [
    (lambda doc: "not json {", "not valid JSON"),
    (lambda doc: {"profiles": {}}, "no 'capabilities' object"),
    (lambda doc: doc["capabilities"]["device"]["properties"]["VkPhysicalDeviceProperties"]["limits"].pop(
        "maxStorageBufferRange") and doc, "lacks VkPhysicalDeviceProperties.limits.maxStorageBufferRange"),
    (lambda doc: doc["capabilities"]["device"]["properties"].pop("VkPhysicalDeviceMaintenance3Properties")
     and doc["capabilities"]["device"]["properties"]["VkPhysicalDeviceVulkan11Properties"].pop("maxMemoryAllocationSize")
     and doc, "lacks VkPhysicalDeviceMaintenance3Properties.maxMemoryAllocationSize"),
    (lambda doc: doc["capabilities"]["device"]["properties"]["VkPhysicalDeviceProperties"]["limits"].update(
        minStorageBufferOffsetAlignment="16") or doc, "minStorageBufferOffsetAlignment is '16', not a positive integer"),
])
def test_a_bad_profile_is_one_line(tmp_path, edit, message):
    import json as json_
    from click.testing import CliRunner
    from schedplan.cli.main import cli
    doc = edit(json_.loads(LAVAPIPE_PROFILE.read_text()))
    bad = tmp_path / "profile.json"
    bad.write_text(doc if isinstance(doc, str) else json_.dumps(doc))
    r = CliRunner().invoke(cli, ["reserve", str(TINY), "--device", f"vulkan:8GiB:profile={bad}"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and message in r.output, r.output
    r = CliRunner().invoke(cli, ["reserve", str(TINY), "--device", f"vulkan:8GiB:profile={tmp_path / 'missing.json'}"])
    assert r.exit_code == 2 and "No such file" in r.output and r.output.count("\n") == 1
