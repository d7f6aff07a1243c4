"""tools/mtmd/models/paddleocr.cpp: clip_graph_paddleocr (PaddleOCR-VL): SigLIP with its learned
positions interpolated to the image, M-RoPE (4 position ids per patch), then the mlp_AR projector:
a LayerNorm over each patch, 2x2 patches merged, a GELU MLP."""
from __future__ import annotations

from ... import ggml
from ..clip import NORM_TYPE_NORMAL, ClipGraph, set_name
from .qwen2vl import GGML_ROPE_TYPE_VISION


class ClipGraphPaddleocr(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp, d_head = self.model, self.hparams, self.d_head
        n_pos = self.n_patches
        positions = ggml.new_tensor(ggml.T.I32, n_pos * 4)   # m-rope requires 4 dim per position
        set_name(positions, "positions")
        positions.set_input()

        def add_pos(cur, layer):
            return ggml.rope_multi(cur, positions, None, d_head // 2, (d_head // 4,) * 4, GGML_ROPE_TYPE_VISION, 32768)

        learned_pos_embd = self.resize_position_embeddings()
        inp = self.build_inp()
        cur = self.build_vit(inp, self.n_patches, NORM_TYPE_NORMAL, hp.ffn_op, learned_pos_embd, add_pos)
        self.cb(cur, "vit_out", -1)
        # mlp_AR: the projector's LayerNorm (eps 1e-5), the 2x2 merge, the MLP
        cur = self.build_norm(cur, model.mm_input_norm_w, model.mm_input_norm_b, NORM_TYPE_NORMAL, 1e-5, -1)
        cur = self.build_patch_merge_permute(cur, hp.n_merge)
        cur = self.build_ffn(cur, model.mm_1_w, model.mm_1_b, None, None, model.mm_2_w, model.mm_2_b, hp.ffn_op, -1)
        self.cb(cur, "mlp_out", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphPaddleocr
