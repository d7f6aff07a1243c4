"""tools/mtmd/models/yasa2.cpp: clip_graph_yasa2 (Reka's ConvNeXt-V2 vision encoder): a strided patch
conv and its channel LayerNorm, ConvNeXt stages (a LayerNorm and 2x2 conv down, then blocks of a 7x7
depthwise conv, LayerNorm, pointwise MLP with GELU-erf and GRN), the learned positions when their
count matches, an average pool to at most 8x8, and the GELU-erf projector."""
from __future__ import annotations

from typing import Optional

from ... import ggml
from ..clip import FFN_GELU_ERF, ClipGraph
from ...ggml import Tensor


def add_channel_bias(x_whcb: Tensor, b_c: Optional[Tensor]) -> Tensor:
    if b_c is None:
        return x_whcb
    return ggml.add(x_whcb, ggml.reshape(b_c, 1, 1, b_c.ne[0], 1))


def mul_channel_weight(x_whcb: Tensor, w_c: Optional[Tensor]) -> Tensor:
    if w_c is None:
        return x_whcb
    return ggml.mul(x_whcb, ggml.reshape(w_c, 1, 1, w_c.ne[0], 1))


class ClipGraphYasa2(ClipGraph):
    def layer_norm_channels(self, inp: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float) -> Tensor:
        """HF ConvNextLayerNorm(channels_first): over the channels of [W, H, C, B]"""
        cur = ggml.cont(ggml.permute(inp, 2, 1, 0, 3))     # [C, H, W, B]
        u = ggml.mean(cur)
        xm = ggml.sub(cur, u)
        s = ggml.mul(xm, xm)
        s = ggml.mean(s)
        s = ggml.clamp(s, eps, 1e30)
        s = ggml.sqrt(s)
        xhat = ggml.div(xm, s)
        xhat = ggml.cont(ggml.permute(xhat, 2, 1, 0, 3))   # [W, H, C, B]
        xhat = mul_channel_weight(xhat, w)
        return add_channel_bias(xhat, b)

    def convnext_grn(self, inp: Tensor, w: Optional[Tensor], b: Optional[Tensor]) -> Tensor:
        """ConvNeXtV2's GRN: the spatial L2 norm per channel over its channel mean"""
        wdim, hdim, cdim, bdim = inp.ne
        sq = ggml.mul(inp, inp)
        gx = ggml.sum_rows(ggml.reshape(sq, wdim * hdim, cdim, 1, bdim))
        gx = ggml.sqrt(gx)
        gx_mean = ggml.mean(ggml.cont(ggml.permute(gx, 1, 0, 2, 3)))
        gx_mean = ggml.clamp(gx_mean, 1e-6, 1e30)
        nx = ggml.div(gx, gx_mean)
        nx = ggml.cont(ggml.permute(nx, 0, 2, 1, 3))
        xnx = ggml.mul(inp, nx)
        xnx = mul_channel_weight(xnx, w)
        xnx = add_channel_bias(xnx, b)
        return ggml.add(inp, xnx)

    def build(self) -> ggml.Cgraph:
        model, eps, p = self.model, self.eps, self.patch_size
        cur = self.build_inp_raw()
        cur = ggml.conv_2d(model.patch_embeddings_0, cur, p, p, 0, 0, 1, 1)
        cur = add_channel_bias(cur, model.patch_bias)
        cur = self.layer_norm_channels(cur, model.yasa_patch_ln_w, model.yasa_patch_ln_b, eps)

        for stage in model.yasa_stages:
            if stage.down_conv_w is not None:
                cur = self.layer_norm_channels(cur, stage.down_ln_w, stage.down_ln_b, eps)
                cur = ggml.conv_2d(stage.down_conv_w, cur, 2, 2, 0, 0, 1, 1)
                cur = add_channel_bias(cur, stage.down_conv_b)
            for blk in stage.blocks:
                res = cur
                x = ggml.conv_2d_dw(blk.dw_w, cur, 1, 1, 3, 3, 1, 1)
                x = add_channel_bias(x, blk.dw_b)
                x = self.layer_norm_channels(x, blk.ln_w, blk.ln_b, eps)
                # pwconv1 / pwconv2: Linear layers over the channels, as matrix products over the tokens
                w, h, b = x.ne[0], x.ne[1], x.ne[3]
                tok = ggml.cont(ggml.permute(ggml.reshape(x, w * h, x.ne[2], b), 1, 0, 2, 3))
                tok = ggml.mul_mat(self._weight(blk.pw1_w, "pw1.weight"), tok)
                if blk.pw1_b is not None:
                    tok = ggml.add(tok, ggml.reshape(blk.pw1_b, blk.pw1_b.ne[0], 1, 1))
                x = ggml.cont(ggml.permute(tok, 1, 0, 2, 3))
                x = ggml.reshape(x, w, h, tok.ne[0], b)
                x = ggml.unary(x, "GELU_ERF")
                x = self.convnext_grn(x, blk.grn_w, blk.grn_b)
                tok = ggml.cont(ggml.permute(ggml.reshape(x, w * h, x.ne[2], b), 1, 0, 2, 3))
                tok = ggml.mul_mat(self._weight(blk.pw2_w, "pw2.weight"), tok)
                if blk.pw2_b is not None:
                    tok = ggml.add(tok, ggml.reshape(blk.pw2_b, blk.pw2_b.ne[0], 1, 1))
                x = ggml.cont(ggml.permute(tok, 1, 0, 2, 3))
                x = ggml.reshape(x, w, h, tok.ne[0], b)
                cur = ggml.add(res, x)

        # the learned positions before the pooling (when their count matches)
        pre_w, pre_h = cur.ne[0], cur.ne[1]
        tokens_pre = ggml.reshape(cur, pre_w * pre_h, cur.ne[2], cur.ne[3])
        tokens_pre = ggml.cont(ggml.permute(tokens_pre, 1, 0, 2, 3))
        pos_embed = model.yasa_vision_pos_embed
        if pos_embed is not None and tokens_pre.ne[1] == pos_embed.ne[1]:
            tokens_pre = ggml.add(tokens_pre, ggml.reshape(pos_embed, pos_embed.ne[0], pos_embed.ne[1], 1))
        cur = ggml.cont(ggml.permute(tokens_pre, 1, 0, 2, 3))
        cur = ggml.reshape(cur, pre_w, pre_h, cur.ne[1], cur.ne[2])
        # AdaptiveAvgPool2d to 8x8 (smaller warm-up images keep their size)
        pooled_w, pooled_h = min(8, cur.ne[0]), min(8, cur.ne[1])
        if pooled_w <= 0 or pooled_h <= 0:
            raise self.abort("yasa2.cpp: the pooling divides by an empty feature map's side")
        kw, kh = max(1, cur.ne[0] // pooled_w), max(1, cur.ne[1] // pooled_h)
        cur = ggml.pool_2d(cur, ggml.POOL_AVG, kw, kh, kw, kh, 0, 0)
        tokens = ggml.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2], cur.ne[3])
        tokens = ggml.cont(ggml.permute(tokens, 1, 0, 2, 3))
        if model.mm_0_w is None or model.mm_2_w is None:
            raise self.abort("yasa2.cpp GGML_ASSERT(model.mm_0_w && model.mm_2_w)")
        embeddings = self.build_ffn(tokens, model.mm_0_w, model.mm_0_b, None, None, model.mm_2_w, model.mm_2_b,
                                    FFN_GELU_ERF, -1)
        self.expand(embeddings)
        return self.gf


GRAPH_BUILDER = ClipGraphYasa2
