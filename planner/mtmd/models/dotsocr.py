"""tools/mtmd/models/dotsocr.cpp: clip_graph_dotsocr (dots.ocr): an RMS-norm ViT with M-RoPE like
PaddleOCR's, the post-trunk norm (mm.post_norm, as the ViT's post-layernorm), then the merger: a
LayerNorm, the patch merge, a GELU-erf MLP."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_GELU_ERF, NORM_TYPE_NORMAL, NORM_TYPE_RMS, ClipGraph, set_name
from .qwen2vl import GGML_ROPE_TYPE_VISION


class ClipGraphDotsocr(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp, d_head = self.model, self.hparams, self.d_head
        positions = ggml.new_tensor(ggml.T.I32, self.n_patches * 4)   # m-rope requires 4 dim per position
        set_name(positions, "positions")
        positions.set_input()

        def add_pos(cur, layer):
            return ggml.rope_multi(cur, positions, None, d_head // 2, (d_head // 4,) * 4, GGML_ROPE_TYPE_VISION, 32768)

        inp = self.build_inp()
        cur = self.build_vit(inp, self.n_patches, NORM_TYPE_RMS, hp.ffn_op, None, add_pos)
        self.cb(cur, "vit_out", -1)
        if hp.n_merge <= 0:
            raise self.abort("dotsocr.cpp GGML_ASSERT(hparams.n_merge > 0)")
        cur = self.build_norm(cur, model.mm_input_norm_w, model.mm_input_norm_b, NORM_TYPE_NORMAL, 1e-6, -1)
        cur = self.build_patch_merge_permute(cur, hp.n_merge)
        # nn.GELU() defaults to the exact erf GELU
        cur = self.build_ffn(cur, model.mm_0_w, model.mm_0_b, None, None, model.mm_2_w, model.mm_2_b, FFN_GELU_ERF, -1)
        self.cb(cur, "after_projector", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphDotsocr
