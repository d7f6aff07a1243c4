"""tools/mtmd/models/muse-glimmer.cpp: clip_graph_muse_glimmer (Muse Glimmer): the patches with
bilinearly resized learned positions, grouped into windows (a permutation), a ViT whose sparse
layers attend within the windows (a block-diagonal mask; every sparse_factor-th and the last layer
global) with 2D rope and exact GELU, the order restored, a pixel-shuffle gather and the adapter MLP
into the text model."""
from __future__ import annotations

from ... import ggml
from ...ggml import Tensor
from ..clip import FFN_GELU_ERF, NORM_TYPE_NORMAL, BuildVitOpts, ClipGraph, set_name


class ClipGraphMuseGlimmer(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        ds = hp.n_merge
        sf = hp.muse_glimmer_sparse_factor
        n_tok = self.n_patches
        n_out = (self.n_patches_x // ds) * (self.n_patches_y // ds)

        def inp_i32(name: str, n: int) -> Tensor:
            t = ggml.new_tensor(ggml.T.I32, n)
            set_name(t, name)
            t.set_input()
            return t

        pos_w = inp_i32("muse_glimmer_pos_w", n_tok)
        pos_h = inp_i32("muse_glimmer_pos_h", n_tok)
        sp_perm = inp_i32("muse_glimmer_sp_perm", n_tok)
        inv_perm = inp_i32("muse_glimmer_inv_perm", n_tok)
        ds_perm = inp_i32("muse_glimmer_ds_perm", n_tok)
        sp_mask = ggml.new_tensor(ggml.T.F32, n_tok, n_tok)
        set_name(sp_mask, "muse_glimmer_sp_mask")
        sp_mask.set_input()

        x = self.build_inp()
        x = ggml.add(x, self.resize_position_embeddings(ggml.SCALE_MODE_BILINEAR))
        self.cb(x, "after_posemb", -1)
        x = ggml.get_rows(x, sp_perm)       # the windows' order
        self.cb(x, "after_sp_perm", -1)
        # sparse layers get the window mask, global ones (every sf-th and the last) none
        masks = [None if il == self.n_layer - 1 or (il + 1) % sf == 0 else sp_mask for il in range(self.n_layer)]
        x = self.build_vit(x, n_tok, NORM_TYPE_NORMAL, FFN_GELU_ERF, None,
                           lambda cur, layer: self.build_rope_2d(cur, pos_w, pos_h, hp.rope_theta, False),
                           BuildVitOpts(attn_mask_layers=masks))
        x = ggml.get_rows(x, inv_perm)      # the grid's order
        self.cb(x, "after_inv_perm", -1)
        # the pixel shuffle: ds*ds neighbours gathered, channel-outer
        x = ggml.get_rows(x, ds_perm)
        x = ggml.reshape(x, self.n_embd, ds * ds, n_out)
        x = ggml.permute(x, 1, 0, 2, 3)
        x = ggml.cont(x)
        x = ggml.reshape(x, self.n_embd * ds * ds, n_out)
        self.cb(x, "encoder_out", -1)
        x = self.build_mm(model.mm_0_w, x)
        x = ggml.unary(x, "GELU_ERF")
        x = self.build_mm(model.mm_1_w, x)
        x = ggml.unary(x, "GELU_ERF")
        x = self.build_mm(model.mm_2_w, x)
        self.cb(x, "projected", -1)
        self.expand(x)
        return self.gf


GRAPH_BUILDER = ClipGraphMuseGlimmer
