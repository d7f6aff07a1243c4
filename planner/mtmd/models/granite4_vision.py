"""tools/mtmd/models/granite4-vision.cpp: clip_graph_granite4_vision (Granite Vision 4.1): a SigLIP
tower over the tiles stacked on the image's Y axis (the warm-up image is one tile), then one
windowed QFormer per projector (clip.vision.feature_layer: the layer it reads; spatial_offsets: a
spatial projector gathers its downsampled rows, a layerwise one average-pools them), their outputs
side by side; a tiled image's assembly with newline rows is not part of the warm-up."""
from __future__ import annotations

import math

from ... import ggml
from ..clip import NORM_TYPE_NORMAL, ClipGraph, QfBlock, set_name
from ...ggml import Tensor


class ClipGraphGranite4Vision(ClipGraph):
    def __init__(self, ctx, nx: int, ny: int, n_batch: int = 1):
        super().__init__(ctx, nx, ny, n_batch)
        if nx <= 0:
            raise self.abort("granite4-vision.cpp: n_tiles = img.ny() / img.nx() divides by an empty image's width")
        self.n_tiles = ny // nx                   # the tiles stacked on the Y axis
        self.tile_side = nx // self.patch_size

    def build_tile_inp(self) -> Tensor:
        """the stacked tiles split into the batch axis, then the usual patch embedding"""
        inp_raw = self.build_inp_raw()
        n_tiles, p = self.n_tiles, self.patch_size
        if n_tiles > 1:
            px = self.nx
            inp_raw = ggml.reshape(inp_raw, px * px, n_tiles, 3, 1)
            inp_raw = ggml.cont(ggml.permute(inp_raw, 0, 2, 1, 3))
            inp_raw = ggml.reshape(inp_raw, px, px, 3, n_tiles)
        inp = ggml.conv_2d(self.model.patch_embeddings_0, inp_raw, p, p, 0, 0, 1, 1)
        inp = ggml.reshape(inp, self.tile_side * self.tile_side, self.n_embd, n_tiles)
        inp = ggml.cont(ggml.transpose(inp))
        if self.model.patch_bias is not None:
            inp = ggml.add(inp, self.model.patch_bias)
        return inp

    def gather(self, src: Tensor, name: str, idx_len: int) -> Tensor:
        """one index row per tile, all rows the same permutation"""
        idx = ggml.new_tensor(ggml.T.I32, idx_len, self.n_tiles)
        set_name(idx, name)
        idx.set_input()
        return ggml.get_rows(src, idx)

    def interp_down(self, src: Tensor, side: int, new_side: int) -> Tensor:
        n_embd, n_tiles = src.ne[0], self.n_tiles
        t = ggml.reshape(src, n_embd, side, side, n_tiles)
        t = ggml.cont(ggml.permute(t, 2, 0, 1, 3))
        # the tile axis folded into the channels: ggml_pool_2d pools the first two axes only
        t = ggml.reshape(t, side, side, n_embd * n_tiles)
        if new_side <= 0 or side < new_side:
            raise self.abort(f"granite4-vision.cpp interp_down: a pooling kernel of side / new_side = {side} / {new_side}")
        kernel = side // new_side
        t = ggml.pool_2d(t, ggml.POOL_AVG, kernel, kernel, kernel, kernel, 0, 0)
        t = ggml.reshape(t, new_side, new_side, n_embd, n_tiles)
        t = ggml.cont(ggml.permute(t, 1, 2, 0, 3))
        return ggml.reshape(t, n_embd, new_side * new_side, n_tiles)

    def build_block(self, blk: QfBlock, h: Tensor, bid: int, spatial_offset: int, image_side: int, window_side: int,
                    query_side: int, qformer_eps: float) -> Tensor:
        """a WindowQFormer block"""
        n_embd = h.ne[0]
        if h.ne[1] != image_side * image_side:
            raise self.abort("granite4-vision.cpp GGML_ASSERT(h->ne[1] == image_side * image_side)")
        if window_side <= 0:
            raise self.abort(f"granite4-vision.cpp build_block: image_side / window_side with window_side {window_side}")
        n = image_side // window_side
        new_side = n * query_side
        n_windows = n * n
        n_win_all = n_windows * self.n_tiles
        enc_len = window_side * window_side
        query_len = query_side * query_side
        name = f"g4v_blk{bid}"

        x = self.build_norm(h, blk.qf_proj_norm_w, blk.qf_proj_norm_b, NORM_TYPE_NORMAL, self.eps, bid)
        enc = ggml.reshape(self.gather(x, f"{name}_win_idx", image_side * image_side), n_embd, enc_len, n_win_all)
        if spatial_offset >= 0:
            d = self.gather(x, f"{name}_spatial_idx", new_side * new_side)
        else:
            d = self.interp_down(x, image_side, new_side)
        dw = ggml.reshape(self.gather(d, f"{name}_qwin_idx", new_side * new_side), n_embd, query_len, n_win_all)
        q_in = ggml.add(dw, blk.qf_proj_query)
        e_in = ggml.add(enc, blk.qf_proj_img_pos)
        q = self.build_norm(q_in, blk.qf_proj_post_norm_w, blk.qf_proj_post_norm_b, NORM_TYPE_NORMAL, qformer_eps, bid)

        def linear(x: Tensor, w, b) -> Tensor:
            t = ggml.reshape(x, x.ne[0], x.ne[1] * x.ne[2])
            t = self.build_mm(w, t)
            return ggml.add(t, b) if b is not None else t

        if len(blk.qf_proj_layers) != 1:
            raise self.abort("granite4-vision.cpp GGML_ASSERT(blk.qf_proj_layers.size() == 1)")
        pl = blk.qf_proj_layers[0]
        d_h = 64
        n_head = n_embd // d_h
        scale = 1.0 / math.sqrt(d_h)
        # self-attention
        nq = q.ne[1]
        Q = ggml.reshape(linear(q, pl.q_w, pl.q_b), d_h, n_head, nq, n_win_all)
        K = ggml.reshape(linear(q, pl.k_w, pl.k_b), d_h, n_head, nq, n_win_all)
        V = ggml.reshape(linear(q, pl.v_w, pl.v_b), d_h, n_head, nq, n_win_all)
        sa_out = self.build_attn(pl.o_w, pl.o_b, Q, K, V, None, scale, bid)
        sa_out = ggml.reshape(sa_out, n_embd, nq, n_win_all)
        sa_out = ggml.add(sa_out, q)
        sa_out = self.build_norm(sa_out, pl.ln_1_w, pl.ln_1_b, NORM_TYPE_NORMAL, qformer_eps, bid)
        # cross-attention
        nq, nkv = sa_out.ne[1], e_in.ne[1]
        Q = ggml.reshape(linear(sa_out, pl.cross_attn_q_w, pl.cross_attn_q_b), d_h, n_head, nq, n_win_all)
        K = ggml.reshape(linear(e_in, pl.cross_attn_k_w, pl.cross_attn_k_b), d_h, n_head, nkv, n_win_all)
        V = ggml.reshape(linear(e_in, pl.cross_attn_v_w, pl.cross_attn_v_b), d_h, n_head, nkv, n_win_all)
        ca_out = self.build_attn(pl.cross_attn_o_w, pl.cross_attn_o_b, Q, K, V, None, scale, bid)
        ca_out = ggml.reshape(ca_out, n_embd, nq, n_win_all)
        ca_out = ggml.add(ca_out, sa_out)
        ca_out = self.build_norm(ca_out, pl.cross_attn_norm_w, pl.cross_attn_norm_b, NORM_TYPE_NORMAL, qformer_eps, bid)
        # FFN
        t = ggml.reshape(ca_out, n_embd, query_len * n_win_all)
        t = self.build_mm(pl.ff_up_w, t)
        if pl.ff_up_b is not None:
            t = ggml.add(t, pl.ff_up_b)
        t = ggml.unary(t, "GELU_ERF")
        t = self.build_mm(pl.ff_down_w, t)
        if pl.ff_down_b is not None:
            t = ggml.add(t, pl.ff_down_b)
        t = ggml.reshape(t, n_embd, query_len, n_win_all)
        ffn = ggml.add(t, ca_out)
        ffn = self.build_norm(ffn, pl.ln_2_w, pl.ln_2_b, NORM_TYPE_NORMAL, qformer_eps, bid)
        # back to raster order, then out_linear
        flat = ggml.reshape(ffn, n_embd, query_len * n_windows, self.n_tiles)
        unwinned = self.gather(flat, f"{name}_unwin_idx", new_side * new_side)
        out = self.build_mm(blk.qf_proj_linear_w, unwinned)
        if blk.qf_proj_linear_b is not None:
            out = ggml.add(out, blk.qf_proj_linear_b)
        return out

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        d_head, n_head, n_embd, n_tiles = self.d_head, self.n_head, self.n_embd, self.n_tiles
        if model.patch_embeddings_0 is None:
            raise self.abort("granite4-vision.cpp GGML_ASSERT(model.patch_embeddings_0 != nullptr)")
        if model.position_embeddings is None:
            raise self.abort("granite4-vision.cpp GGML_ASSERT(model.position_embeddings != nullptr)")
        if model.class_embedding is not None:
            raise self.abort("granite4-vision.cpp GGML_ASSERT(model.class_embedding == nullptr)")
        if not model.qf_proj_blocks:
            raise self.abort("granite4-vision.cpp GGML_ASSERT(!model.qf_proj_blocks.empty())")

        # SigLIP, every layer's output kept
        inp = ggml.add(self.build_tile_inp(), model.position_embeddings)
        tile_n_patches = self.tile_side * self.tile_side
        inpL = inp
        layer_outs: list[Tensor] = []
        for il in range(self.n_layer):
            layer = model.layers[il]
            cur = self.build_norm(inpL, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_NORMAL, self.eps, il)
            Qcur = self.build_mm(layer.q_w, cur)
            if layer.q_b is not None:
                Qcur = ggml.add(Qcur, layer.q_b)
            Kcur = self.build_mm(layer.k_w, cur)
            if layer.k_b is not None:
                Kcur = ggml.add(Kcur, layer.k_b)
            Vcur = self.build_mm(layer.v_w, cur)
            if layer.v_b is not None:
                Vcur = ggml.add(Vcur, layer.v_b)
            Qcur = ggml.reshape(Qcur, d_head, n_head, tile_n_patches, n_tiles)
            Kcur = ggml.reshape(Kcur, d_head, n_head, tile_n_patches, n_tiles)
            Vcur = ggml.reshape(Vcur, d_head, n_head, tile_n_patches, n_tiles)
            cur = self.build_attn(layer.o_w, layer.o_b, Qcur, Kcur, Vcur, None, self.kq_scale, il)
            cur = ggml.reshape(cur, n_embd, tile_n_patches, n_tiles)
            cur = ggml.add(cur, inpL)
            inpL = cur
            cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_NORMAL, self.eps, il)
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, layer.ff_gate_w, layer.ff_gate_b,
                                 layer.ff_down_w, layer.ff_down_b, hp.ffn_op, il)
            cur = ggml.add(inpL, cur)
            layer_outs.append(cur)
            inpL = cur

        # the WindowQFormer blocks, concatenated
        mmproj = None
        for bid, vlayer in enumerate(hp.feature_layers):
            if not 0 <= vlayer < self.n_layer:
                raise self.abort("granite4-vision.cpp GGML_ASSERT(vlayer >= 0 && vlayer < n_layer)")
            stream = self.build_block(model.qf_proj_blocks[bid], layer_outs[vlayer], bid, hp.proj_spatial_offsets[bid],
                                      self.tile_side, hp.downsample_window_side, hp.downsample_query_side, 1e-12)
            mmproj = ggml.concat(mmproj, stream, 0) if mmproj is not None else stream
        self.expand(mmproj)
        return self.gf


GRAPH_BUILDER = ClipGraphGranite4Vision
