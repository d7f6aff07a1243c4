"""tools/mtmd/models/kimik25.cpp: clip_graph_kimik25 (Kimi-K2.5's MoonViT3d): Kimi-VL's graph with
the learned positions stored as a [C, W, H] grid (interpolated bicubically, added before the ViT),
a fused QKV whose Q/K the converter permuted to split 2D rope, and the merger's LayerNorm at the
ViT's eps."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_GELU, NORM_TYPE_NORMAL, ClipGraph, set_name
from ...ggml import Tensor


class ClipGraphKimik25(ClipGraph):
    def resize_position_embeddings_3d(self, mode: int) -> Tensor:
        """resize_position_embeddings with the grid's width and height in ne[1] and ne[2]"""
        pos_embd = self._weight(self.model.position_embeddings, "v.position_embd.weight")
        height, width = self.ny // self.patch_size, self.nx // self.patch_size
        n_embd = self.n_embd
        if pos_embd.ne[0] != n_embd:
            raise self.abort("kimik25.cpp GGML_ASSERT(stored_c == n_embd)")
        if height == pos_embd.ne[2] and width == pos_embd.ne[1]:
            return ggml.cont(pos_embd, n_embd, width * height)
        pos_embd = ggml.permute(pos_embd, 2, 1, 0, 3)
        pos_embd = ggml.interpolate(pos_embd, height, width, n_embd, 1, mode)
        pos_embd = ggml.permute(pos_embd, 2, 1, 0, 3)
        return ggml.cont(pos_embd, n_embd, width * height)

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        pos_h = ggml.new_tensor(ggml.T.I32, self.n_patches)
        set_name(pos_h, "pos_h")
        pos_h.set_input()
        pos_w = ggml.new_tensor(ggml.T.I32, self.n_patches)
        set_name(pos_w, "pos_w")
        pos_w.set_input()
        learned_pos_embd = self.resize_position_embeddings_3d(ggml.SCALE_MODE_BICUBIC)
        inp = self.build_inp()
        inp = ggml.add(inp, learned_pos_embd)    # added here, not by build_vit
        cur = self.build_vit(inp, self.n_patches, NORM_TYPE_NORMAL, hp.ffn_op, None,
                             lambda t, layer: self.build_rope_2d(t, pos_w, pos_h, hp.rope_theta, False))
        self.cb(cur, "vit_out", -1)
        scale_factor = hp.n_merge
        cur = self.build_patch_merge_permute(cur, scale_factor)
        proj_inp_dim, n_merged_patches = cur.ne[0], cur.ne[1]
        cur = ggml.view(cur, (self.n_embd, n_merged_patches * scale_factor * scale_factor),
                        (ggml.row_size(cur.type, self.n_embd),), 0)
        cur = ggml.norm(cur, hp.eps)
        cur = ggml.mul(cur, model.mm_input_norm_w)
        cur = ggml.add(cur, model.mm_input_norm_b)
        cur = ggml.view(cur, (proj_inp_dim, n_merged_patches), (ggml.row_size(cur.type, proj_inp_dim),), 0)
        self.cb(cur, "proj_inp_normed", -1)
        cur = self.build_ffn(cur, model.mm_1_w, model.mm_1_b, None, None, model.mm_2_w, model.mm_2_b, FFN_GELU, -1)
        self.cb(cur, "proj_out", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphKimik25
