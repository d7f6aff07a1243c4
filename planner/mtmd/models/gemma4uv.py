"""tools/mtmd/models/gemma4uv.cpp: clip_graph_gemma4uv (Gemma 4's unified vision embedder, no
transformer): im2col patches (its shape-only kernel a leaf of the graph), LayerNorm, the patch
linear, LayerNorm, x and y position tables, LayerNorm, then the RMS pre-projection norm and the
projection."""
from __future__ import annotations

from ... import ggml
from ..clip import NORM_TYPE_NORMAL, ClipGraph, set_name


class ClipGraphGemma4uv(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, p = self.model, self.patch_size
        inp_raw = self.build_inp_raw()
        eps = 1e-5      # Gemma4UnifiedVisionEmbedder's LayerNorms: pytorch's default eps
        # not ggml_conv_2d: the norm applies after im2col
        c = inp_raw.ne[2]
        kernel = ggml.new_tensor(ggml.T.F32, p, p, c)
        inp = ggml.im2col(kernel, inp_raw, p, p, 0, 0, 1, 1, True, inp_raw.type)
        inp = ggml.reshape(inp, inp.ne[0], inp.ne[1] * inp.ne[2] * inp.ne[3])
        inp = self.build_norm(inp, model.patch_norm_1_w, model.patch_norm_1_b, NORM_TYPE_NORMAL, eps, -1)
        inp = ggml.mul_mat(self._weight(model.patch_embeddings_0, "v.patch_embd.weight"), inp)
        inp = ggml.add(inp, model.patch_bias)
        inp = self.build_norm(inp, model.patch_norm_2_w, model.patch_norm_2_b, NORM_TYPE_NORMAL, eps, -1)

        pos_x = ggml.new_tensor(ggml.T.I32, self.n_patches)
        set_name(pos_x, "pos_x")
        pos_x.set_input()
        pos_y = ggml.new_tensor(ggml.T.I32, self.n_patches)
        set_name(pos_y, "pos_y")
        pos_y.set_input()
        pos_embd = self._weight(model.position_embeddings, "v.position_embd.weight")
        pos_size = pos_embd.ne[1]
        nb1 = ggml.row_size(pos_embd.type, self.n_embd)
        # the x and y lookup tables
        tbl_x = ggml.view(pos_embd, (self.n_embd, pos_size), (nb1,), 0)
        tbl_y = ggml.view(pos_embd, (self.n_embd, pos_size), (nb1,), pos_size * nb1)
        emb_x = ggml.get_rows(tbl_x, pos_x)
        emb_y = ggml.get_rows(tbl_y, pos_y)
        inp = ggml.add(inp, emb_x)
        inp = ggml.add(inp, emb_y)
        self.cb(inp, "pos_embd", -1)
        inp = self.build_norm(inp, model.patch_norm_3_w, model.patch_norm_3_b, NORM_TYPE_NORMAL, eps, -1)

        # Gemma4UnifiedMultimodalEmbedder: embedding_pre_projection_norm, the projection
        cur = ggml.rms_norm(inp, self.hparams.eps)
        cur = self.build_mm(model.mm_input_proj_w, cur)
        self.cb(cur, "projected", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphGemma4uv
