"""tools/mtmd/models/minimax-m3.cpp: clip_graph_minimax_m3 (MiniMax-M3's vision tower): two temporal
patch kernels, the merge units' token order, a LayerNorm ViT whose heads rotate an h and a w band
(NEOX ropes placed by ggml_rope_set_offset; the t band and the padding unrotated), a per-patch
GELU-erf MLP, then the 2x2 merge MLP."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_GELU_ERF, NORM_TYPE_NORMAL, ClipGraph, set_name
from ...ggml import Tensor
from .deepseekocr2 import GGML_ROPE_TYPE_NEOX


class ClipGraphMinimaxM3(ClipGraph):
    def apply_rope(self, x: Tensor, pos_h: Tensor, pos_w: Tensor) -> Tensor:
        """x's heads as [t, h, w, pad]: h and w rotated"""
        dh = x.ne[0]
        axd = 2 * ((2 * (dh // 2) // 3) // 2)
        if 3 * axd > dh:
            raise self.abort("minimax-m3.cpp GGML_ASSERT(3 * axd <= dh)")
        x = ggml.rope_ext(x, pos_h, None, axd, GGML_ROPE_TYPE_NEOX, 0)
        x = ggml.rope_set_offset(x, axd)
        x = ggml.rope_ext(x, pos_w, None, axd, GGML_ROPE_TYPE_NEOX, 0)
        return ggml.rope_set_offset(x, 2 * axd)

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        for ok, what in ((model.patch_bias is None, "model.patch_bias == nullptr"),
                         (model.class_embedding is None, "model.class_embedding == nullptr"),
                         (model.patch_embeddings_0 is not None and model.patch_embeddings_1 is not None,
                          "model.patch_embeddings_0 && model.patch_embeddings_1"),
                         (model.mm_1_w is not None and model.mm_2_w is not None, "model.mm_1_w && model.mm_2_w"),
                         (model.mm_merger_fc1_w is not None and model.mm_merger_fc2_w is not None,
                          "model.mm_merger_fc1_w && model.mm_merger_fc2_w")):
            if not ok:
                raise self.abort(f"minimax-m3.cpp GGML_ASSERT({what})")
        batch_size = 1
        n_pos = self.n_patches
        merge, n_embd, p = hp.n_merge, self.n_embd, self.patch_size
        px, py = self.n_patches_x, self.n_patches_y

        inp_raw = self.build_inp_raw()
        inp = ggml.add(ggml.conv_2d(model.patch_embeddings_0, inp_raw, p, p, 0, 0, 1, 1),
                       ggml.conv_2d(model.patch_embeddings_1, inp_raw, p, p, 0, 0, 1, 1))
        # spatial merge order
        inp = ggml.permute(inp, 1, 2, 0, 3)
        inp = ggml.cont(inp, n_embd * merge, px // merge, py, batch_size)
        inp = ggml.reshape(inp, n_embd * merge, px // merge, merge, batch_size * (py // merge))
        inp = ggml.permute(inp, 0, 2, 1, 3)
        inp = ggml.cont(inp, n_embd, px * py, batch_size)

        # t (the time axis) is always 0: left unrotated
        pos_h = ggml.new_tensor(ggml.T.I32, n_pos)
        set_name(pos_h, "minimax_pos_h")
        pos_h.set_input()
        pos_w = ggml.new_tensor(ggml.T.I32, n_pos)
        set_name(pos_w, "minimax_pos_w")
        pos_w.set_input()
        emb = self.build_vit(inp, n_pos, NORM_TYPE_NORMAL, FFN_GELU_ERF, None,
                             lambda c, layer: self.apply_rope(c, pos_h, pos_w))
        emb = self.build_ffn(emb, model.mm_1_w, model.mm_1_b, None, None, model.mm_2_w, model.mm_2_b, FFN_GELU_ERF, -1)
        proj = emb.ne[0]
        emb = ggml.reshape(emb, proj * merge * merge, n_pos // (merge * merge))
        emb = self.build_ffn(emb, model.mm_merger_fc1_w, model.mm_merger_fc1_b, None, None,
                             model.mm_merger_fc2_w, model.mm_merger_fc2_b, FFN_GELU_ERF, -1)
        self.expand(emb)
        return self.gf


GRAPH_BUILDER = ClipGraphMinimaxM3
