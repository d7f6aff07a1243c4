"""tools/mtmd/models/gemma4ua.cpp: clip_graph_gemma4ua (Gemma 4 unified's audio side): no encoder,
the raw 16 kHz waveform in frames of 640 samples (n_mel_bins), an RMS norm and the projection
(Gemma4UnifiedMultimodalEmbedder)."""
from __future__ import annotations

from ... import ggml
from ..clip import ClipGraph


class ClipGraphGemma4ua(ClipGraph):
    def build(self) -> ggml.Cgraph:
        inp = self.build_inp_raw(1)
        cur = ggml.cont(ggml.permute(inp, 1, 0, 2, 3))
        # embedding_pre_projection_norm
        cur = ggml.rms_norm(cur, self.hparams.eps)
        cur = self.build_mm(self._weight(self.model.mm_input_proj_w, "mm.a.input_projection.weight"), cur)
        self.cb(cur, "projected", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphGemma4ua
