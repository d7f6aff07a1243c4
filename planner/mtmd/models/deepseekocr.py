"""tools/mtmd/models/deepseekocr.cpp: clip_graph_deepseekocr (DeepSeek-OCR): the SAM ViT-B encoder
(windowed attention with decomposed relative positions, global attention on layers 2, 5, 8 and 11,
then the neck and two stride-2 convs), a CLIP-L over SAM's 16x16 output with [CLS], both side by
side through the projector, and the tiles of a row laid out with one [image_newline] per row (the
warm-up image is one 1024x1024 row tile)."""
from __future__ import annotations

import math

from ... import ggml
from ..clip import FFN_GELU_QUICK, FLASH_ATTN_ENABLED, NORM_TYPE_NORMAL, ClipGraph, set_name
from ...ggml import Tensor

SAM_GLOBAL_ATTN = (2, 5, 8, 11)   # clip_hparams::global_attn_indices


def window_partition(x: Tensor, window: int) -> Tensor:
    """ggml_win_part as reshapes: [c, w, h, b] -> [c, window, window, windows * b], padded."""
    c, w, h, b = x.ne
    px = (window - w % window) % window
    py = (window - h % window) % window
    npw, nph = (w + px) // window, (h + py) // window
    cur = x
    if px > 0 or py > 0:
        cur = ggml.pad(cur, 0, px, py, 0)
    cur = ggml.reshape(cur, c * window, npw, window, nph * b)
    cur = ggml.cont(ggml.permute(cur, 0, 2, 1, 3))
    return ggml.reshape(cur, c, window, window, npw * nph * b)


def window_unpartition(x: Tensor, w: int, h: int, window: int) -> Tensor:
    """ggml_win_unpart as reshapes, the padding cut off."""
    c = x.ne[0]
    px = (window - w % window) % window
    py = (window - h % window) % window
    npw, nph = (w + px) // window, (h + py) // window
    b = x.ne[3] // (npw * nph)
    cur = ggml.reshape(x, c * window, window, npw, nph * b)
    cur = ggml.cont(ggml.permute(cur, 0, 2, 1, 3))
    cur = ggml.reshape(cur, c, w + px, h + py, b)
    cur = ggml.view(cur, (cur.ne[0], w, h, cur.ne[3]), (cur.nb[1], cur.nb[2], cur.nb[3]), 0)
    return ggml.cont(cur)


def conv_2d_f32(a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """ggml_conv_2d with the im2col kept in F32 (F16 for an F16 kernel)."""
    im2col = ggml.im2col(a, b, s0, s1, p0, p1, d0, d1, True, ggml.T.F16 if a.type == ggml.T.F16 else ggml.T.F32)
    result = ggml.mul_mat(ggml.reshape(im2col, im2col.ne[0], im2col.ne[3] * im2col.ne[2] * im2col.ne[1]),
                          ggml.reshape(a, a.ne[0] * a.ne[1] * a.ne[2], a.ne[3]))
    result = ggml.reshape(result, im2col.ne[1], im2col.ne[2], im2col.ne[3], a.ne[3])
    return ggml.cont(ggml.permute(result, 0, 1, 3, 2))


class ClipGraphDeepseekocr(ClipGraph):
    def get_rel_pos(self, rel_pos: Tensor, indices: Tensor, q_size: int, k_size: int) -> Tensor:
        """the relative position table resampled to 2 max(q, k) - 1 rows, gathered: [C, k, q]"""
        C = rel_pos.ne[0]
        if indices.ne[0] != k_size or indices.ne[1] != q_size:
            raise self.abort("deepseekocr.cpp get_rel_pos GGML_ASSERT(indices->ne[0] == k_size && indices->ne[1] == q_size)")
        max_rel_dist = 2 * max(q_size, k_size) - 1
        cur = rel_pos
        if max_rel_dist != rel_pos.ne[1]:
            ne0, ne1, ne2, ne3 = cur.ne
            cur = ggml.reshape(ggml.cont(ggml.permute(cur, 1, 0, 2, 3)), ne1, 1, ne0 * ne2 * ne3)
            cur = ggml.reshape(ggml.interpolate(cur, max_rel_dist, 1, ne0 * ne2 * ne3, 1, ggml.SCALE_MODE_BILINEAR),
                               max_rel_dist, ne0, ne2, ne3)
            cur = ggml.cont(ggml.permute(cur, 1, 0, 2, 3))
        qk = q_size * k_size
        return ggml.reshape(ggml.get_rows(cur, ggml.reshape(indices, qk)), C, k_size, q_size)

    def build_sam(self, inp_raw: Tensor) -> Tensor:
        model, hp = self.model, self.hparams
        n_embd, n_layer, n_heads = hp.sam_n_embd, hp.sam_n_layer, hp.sam_n_head
        if n_heads <= 0:
            raise self.abort("deepseekocr.cpp build_sam: n_embd / n_heads with sam.head_count 0")
        d_heads = n_embd // n_heads
        window = hp.attn_window_size
        sam_eps = 1e-6                  # the SAM stage's layernorms
        if window <= 0:
            raise self.abort(f"deepseekocr.cpp window_partition: a window of {window}")

        w = model.patch_embed_proj_w
        inpL = conv_2d_f32(w, inp_raw, w.ne[0], w.ne[1], 0, 0, 1, 1)
        inpL = ggml.add(inpL, ggml.reshape(model.patch_embed_proj_b, 1, 1, n_embd))
        inpL = ggml.cont(ggml.permute(inpL, 1, 2, 0, 3))
        rel_pos_indices_local = ggml.new_tensor(ggml.T.I32, window, window)
        rel_pos_indices_global = ggml.new_tensor(ggml.T.I32, inpL.ne[1], inpL.ne[2])
        set_name(rel_pos_indices_local, "rel_pos_indices_local")
        set_name(rel_pos_indices_global, "rel_pos_indices_global")
        rel_pos_indices_local.set_input()
        rel_pos_indices_global.set_input()

        tgt_size, str_size = inpL.ne[1], model.pos_embed.ne[1]
        if str_size != tgt_size:
            old_pos_embed = ggml.cont(ggml.permute(model.pos_embed, 2, 0, 1, 3))
            new_pos_embed = ggml.interpolate(old_pos_embed, tgt_size, tgt_size, n_embd, 1, ggml.SCALE_MODE_BICUBIC)
            new_pos_embed = ggml.cont(ggml.permute(new_pos_embed, 1, 2, 0, 3))
            cur = ggml.add(inpL, new_pos_embed)
        else:
            cur = ggml.add(inpL, model.pos_embed)

        for il in range(n_layer):
            layer = model.sam_layers[il]
            shortcut = cur
            cur = self.build_norm(cur, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_NORMAL, sam_eps, il)
            w0, h0 = cur.ne[1], cur.ne[2]
            is_global = il in SAM_GLOBAL_ATTN
            if is_global:
                indices = rel_pos_indices_global
            else:
                cur = window_partition(cur, window)
                indices = rel_pos_indices_local
            W, H = cur.ne[1], cur.ne[2]
            B = cur.ne[3]
            cur = ggml.mul_mat(layer.qkv_w, cur)
            cur = ggml.add(cur, layer.qkv_b)
            cur = ggml.reshape(cur, n_embd, 3, W * H, B)
            Q, K, V = (ggml.reshape(ggml.cont(ggml.view(cur, (n_embd, W * H, B), (cur.nb[2], cur.nb[3]), i * cur.nb[1])),
                                    d_heads, n_heads, W * H, B) for i in range(3))
            rw = self.get_rel_pos(layer.rel_pos_w, indices, W, W)     # [W, W, C]
            rh = self.get_rel_pos(layer.rel_pos_h, indices, H, H)     # [H, H, C]
            qr = ggml.permute(Q, 0, 2, 1, 3)
            qr = ggml.reshape(ggml.cont(qr), d_heads, W, H, B * n_heads)
            rw = ggml.mul_mat(rw, ggml.cont(ggml.permute(qr, 0, 2, 1, 3)))
            rw = ggml.cont(ggml.permute(rw, 0, 2, 1, 3))
            rw = ggml.reshape(rw, W, 1, W * H, n_heads * B)
            rw = ggml.repeat_4d(rw, W, H, W * H, n_heads * B)
            rh = ggml.mul_mat(rh, qr)
            rh = ggml.reshape(rh, 1, H, W * H, n_heads * B)
            mask = ggml.add(rw, rh)
            mask = ggml.reshape(mask, W * H, W * H, n_heads, B)
            if self.flash_attn_type == FLASH_ATTN_ENABLED:
                mask = ggml.cast(mask, ggml.T.F16)
            scale = 1.0 / math.sqrt(d_heads) if d_heads > 0 else math.inf
            cur = self.build_attn(layer.o_w, layer.o_b, Q, K, V, mask, scale, il)
            cur = ggml.reshape(ggml.cont(cur), n_embd, W, H, B)
            if not is_global:
                cur = window_unpartition(cur, w0, h0, window)
            cur = ggml.add(cur, shortcut)
            inpFF = cur
            cur = self.build_norm(inpFF, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_NORMAL, sam_eps, il)
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, None, None, layer.ff_down_w, layer.ff_down_b,
                                 hp.ffn_op, il)
            cur = ggml.add(cur, inpFF)

        cur = ggml.cont(ggml.permute(cur, 2, 0, 1, 3))
        cur = conv_2d_f32(model.neck_0_w, cur, 1, 1, 0, 0, 1, 1)
        cur = ggml.cont(ggml.permute(cur, 1, 2, 0, 3))
        cur = self.build_norm(cur, model.neck_1_w, model.neck_1_b, NORM_TYPE_NORMAL, sam_eps, -1)
        cur = ggml.cont(ggml.permute(cur, 2, 0, 1, 3))
        cur = conv_2d_f32(model.neck_2_w, cur, 1, 1, 1, 1, 1, 1)
        cur = ggml.cont(ggml.permute(cur, 1, 2, 0, 3))
        cur = self.build_norm(cur, model.neck_3_w, model.neck_3_b, NORM_TYPE_NORMAL, sam_eps, -1)
        cur = ggml.cont(ggml.permute(cur, 2, 0, 1, 3))
        cur = conv_2d_f32(model.net_2, cur, 2, 2, 1, 1, 1, 1)
        cur = conv_2d_f32(model.net_3, cur, 2, 2, 1, 1, 1, 1)
        self.expand(cur)
        return cur

    def build(self) -> ggml.Cgraph:
        model, n_embd = self.model, self.n_embd
        inp_raw = self.build_inp_raw()
        n_rows_batch = self.n_batch
        # the warm-up image is a row of tiles, not the overview (img.add_viewsep is false)
        nx, ny = self.nx, self.ny
        if not ny >= nx or nx <= 0 or ny % nx:
            raise self.abort("deepseekocr.cpp GGML_ASSERT(img.ny() >= img.nx() && img.ny() % img.nx() == 0)")
        n_tiles_per_row = ny // nx
        inp_raw = ggml.reshape(inp_raw, nx * nx, n_tiles_per_row, 3, n_rows_batch)
        inp_raw = ggml.cont(ggml.permute(inp_raw, 0, 2, 1, 3))
        inp_raw = ggml.reshape(inp_raw, nx, nx, 3, n_tiles_per_row * n_rows_batch)

        sam_out = self.build_sam(inp_raw)
        n_batch = n_tiles_per_row * n_rows_batch
        clip_n_patches = sam_out.ne[0] * sam_out.ne[1]

        # the CLIP-L over SAM's output: [n_embd, clip_n_patches, n_batch]
        inp = ggml.reshape(sam_out, clip_n_patches, sam_out.ne[2], sam_out.ne[3])
        inp = ggml.cont(ggml.permute(inp, 1, 0, 2, 3))
        new_pos_embd = model.position_embeddings
        if new_pos_embd is None:
            raise self.abort("deepseekocr.cpp: model.position_embeddings is read unconditionally (a null tensor)")
        n_pos = new_pos_embd.ne[1]     # +1 for [CLS]
        tgt_size = math.isqrt(inp.ne[1])
        src_size = int(math.sqrt(n_pos - 1)) if n_pos >= 1 else _nan_size()
        if tgt_size != src_size:
            row = ggml.row_size(new_pos_embd.type, new_pos_embd.ne[0])
            old_pos_embd = ggml.view(new_pos_embd, (new_pos_embd.ne[0], src_size * src_size), (row,), 0)
            cls_tok = ggml.view(new_pos_embd, (new_pos_embd.ne[0], 1), (row,), src_size * src_size)
            new_pos_embd = ggml.interpolate(old_pos_embd, tgt_size, tgt_size, new_pos_embd.ne[0], 1,
                                            ggml.SCALE_MODE_BICUBIC)
            new_pos_embd = ggml.reshape(new_pos_embd, n_embd, tgt_size * tgt_size, 1)
            new_pos_embd = ggml.concat(new_pos_embd, cls_tok, 1)
            n_pos = tgt_size * tgt_size + 1
        cls_embd = ggml.repeat_4d(model.class_embedding, n_embd, 1, n_batch, 1)
        inp = ggml.concat(cls_embd, inp, 1)
        positions = ggml.cast(ggml.arange(0, n_pos, 1), ggml.T.I32)
        learned_pos_embd = ggml.get_rows(new_pos_embd, positions)
        cur = self.build_vit(inp, n_pos, NORM_TYPE_NORMAL, FFN_GELU_QUICK, learned_pos_embd, None)
        self.expand(cur)
        clip_out = cur

        sam_out = ggml.cont(ggml.permute(sam_out, 1, 2, 0, 3))
        sam_out = ggml.reshape(sam_out, sam_out.ne[0], clip_n_patches, n_batch)
        # [CLS] stripped: the patch tokens only
        clip_out = ggml.view(clip_out, (n_embd, clip_n_patches, n_batch), (clip_out.nb[1], clip_out.nb[2]), clip_out.nb[1])
        cur = ggml.concat(clip_out, sam_out, 0)
        cur = ggml.mul_mat(model.mm_fc_w, cur)
        cur = ggml.add(cur, model.mm_fc_b)

        # a row of tiles: the tiles interleaved within each row, a newline per row
        grid_x = int(math.sqrt(clip_n_patches))
        grid_y = grid_x
        n_dim = cur.ne[0]
        cur = ggml.reshape(cur, n_dim * grid_x, grid_y, n_tiles_per_row, n_rows_batch)
        cur = ggml.cont(ggml.permute(cur, 0, 2, 1, 3))
        cur = ggml.reshape(cur, n_dim, grid_x * n_tiles_per_row, grid_y, n_rows_batch)
        imgnl = ggml.repeat_4d(self._weight(model.image_newline, "v.image_newline"), n_dim, 1, grid_y, n_rows_batch)
        cur = ggml.concat(cur, imgnl, 1)
        cur = ggml.reshape(cur, n_dim, (grid_x * n_tiles_per_row + 1) * grid_y, n_rows_batch)
        self.expand(cur)
        return self.gf


def _nan_size() -> int:
    """static_cast<int>(std::sqrt(negative)): NaN to int, INT_MIN on x86."""
    return -2**31


GRAPH_BUILDER = ClipGraphDeepseekocr
