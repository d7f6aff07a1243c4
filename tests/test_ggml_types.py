"""schedplan carries ggml's type table itself (importing the gguf package costs the command ~200 ms,
bench/bench_header.py); it must agree with gguf's tables wherever gguf knows the type."""
import gguf

from schedplan.planner import ggml


def test_type_table_agrees_with_gguf():
    known = {int(t) for t in gguf.GGMLQuantizationType}
    checked = 0
    for t in ggml.T:
        if int(t) not in known:
            continue
        g = gguf.GGMLQuantizationType(int(t))
        assert g.name == t.name
        assert tuple(gguf.GGML_QUANT_SIZES[g]) == (ggml.blck_size(t), ggml.type_size(t))
        checked += 1
    assert checked == len(ggml.T) - 1   # gguf 0.19 lacks Q2_0 (42)


def test_type_names_are_ggml_type_name():
    """ggml_type_name keeps the capital K of the K-quants."""
    assert [ggml.type_name(t) for t in (ggml.T.Q4_K, ggml.T.Q8_0, ggml.T.BF16, ggml.T.IQ4_NL)] == \
        ["q4_K", "q8_0", "bf16", "iq4_nl"]
    assert ggml.type_by_name("q4_k") == ggml.type_by_name("Q4_K") == 12
