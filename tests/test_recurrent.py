"""Recurrent state (llama_memory_recurrent) beside the KV cache: its size follows -np, not -c."""
from __future__ import annotations

import pytest

from fixtures import make_gguf as mk
from schedplan.planner.params import Params
from schedplan.planner.reserve import create_context


def _memory(name: str, **kw):
    return create_context(str(mk.header_path(name)), Params(**kw)).kv


@pytest.mark.parametrize("n_seq_max", [1, 4])
def test_hybrid_state_rows_are_one_per_sequence_whatever_the_context(n_seq_max):
    small, large = (_memory("tiny-qwen35", n_ctx=c, n_seq_max=n_seq_max) for c in (512, 4096))
    hp = small.recr.hparams
    n_recr = sum(hp.is_recr(il) for il in range(hp.n_layer))
    state = n_recr * (hp.n_embd_r() + hp.n_embd_s()) * 4 * n_seq_max      # f32 r and s rows
    assert small.recr.memory_breakdown() == large.recr.memory_breakdown() == {"CPU": state}
    assert sorted(small.recr.r_l) == [il for il in range(hp.n_layer) if hp.is_recr(il)]
    assert sorted(small.attn.layers) == [il for il in range(hp.n_layer) if not hp.is_recr(il)]
    assert large.attn.memory_breakdown()["CPU"] > small.attn.memory_breakdown()["CPU"]
    assert small.memory_breakdown() == {"CPU": small.attn.memory_breakdown()["CPU"] + state}


def test_mamba2_keeps_no_kv_cache():
    mem = _memory("tiny-mamba2", n_ctx=4096, n_seq_max=2)
    assert mem.memory_breakdown() == _memory("tiny-mamba2", n_ctx=512, n_seq_max=2).memory_breakdown()
    assert all(t.ne[1] == 2 for t in (*mem.r_l.values(), *mem.s_l.values()))
