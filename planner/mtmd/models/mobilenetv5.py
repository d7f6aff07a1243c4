"""tools/mtmd/models/mobilenetv5.cpp: clip_graph_mobilenetv5 (Gemma 3n's vision tower): a SAME-padded
stride-2 stem, edge residual blocks (stage 0), universal inverted residual blocks and multi-query
attention blocks (keys and values from a stride-2 depthwise conv), each stage starting at stride 2;
the multi-scale fusion adapter over the ends of stages 2 and 3 (nearest upscale, concat, a 1x1 FFN,
an average pool to 16x16, RMS norm), then Gemma 3n's embedder (scale, soft RMS norm, projection,
post-projection RMS norm)."""
from __future__ import annotations

import math
from typing import Optional

from ... import ggml
from ...ggml import Tensor
from ..clip import ClipGraph, MobilenetV5Block


class ClipGraphMobilenetv5(ClipGraph):
    def rms_norm_2d(self, inp: Tensor, weight: Optional[Tensor], eps: float = 1e-6) -> Tensor:
        """RMS norm over the channels of each position of [W, H, C, B]."""
        cur = ggml.cont(ggml.permute(inp, 2, 1, 0, 3))
        cur = ggml.rms_norm(cur, eps)
        if weight is not None:
            cur = ggml.mul(cur, weight)
        return ggml.cont(ggml.permute(cur, 2, 1, 0, 3))

    def pad_same_2d(self, inp: Tensor, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
                    dilation_h: int = 1, dilation_w: int = 1) -> Tensor:
        """Conv2dSame's asymmetric padding."""
        ih, iw = inp.ne[1], inp.ne[0]
        oh, ow = (ih + stride_h - 1) // stride_h, (iw + stride_w - 1) // stride_w
        pad_h = max(0, (oh - 1) * stride_h + (kernel_h - 1) * dilation_h + 1 - ih)
        pad_w = max(0, (ow - 1) * stride_w + (kernel_w - 1) * dilation_w + 1 - iw)
        if pad_h > 0 or pad_w > 0:
            inp = ggml.pad_ext(inp, pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2, 0, 0, 0, 0)
        return inp

    def build_edge_residual(self, inp: Tensor, block: MobilenetV5Block, stride: int) -> Tensor:
        cur = inp
        if stride == 2:      # Conv2dSame(kernel 3, stride 2)
            cur = self.pad_same_2d(cur, 3, 3, stride, stride)
            cur = ggml.conv_2d_direct(block.s0_conv_exp_w, cur, stride, stride, 0, 0, 1, 1)
        else:
            cur = ggml.conv_2d_direct(block.s0_conv_exp_w, cur, stride, stride, 1, 1, 1, 1)
        if block.s0_bn1_w is not None:
            cur = self.rms_norm_2d(cur, block.s0_bn1_w)
        cur = ggml.unary(cur, "GELU")
        cur = ggml.conv_2d_direct(block.s0_conv_pwl_w, cur, 1, 1, 0, 0, 1, 1)
        if block.s0_bn2_w is not None:
            cur = self.rms_norm_2d(cur, block.s0_bn2_w)
        if stride == 1 and inp.ne[2] == cur.ne[2] and inp.ne[0] == cur.ne[0]:
            cur = ggml.add(cur, inp)
        return cur

    def build_inverted_residual(self, inp: Tensor, block: MobilenetV5Block, stride: int) -> Tensor:
        cur = inp
        if block.dw_start_w is not None:
            p = block.dw_start_w.ne[0] // 2
            cur = ggml.conv_2d_dw(block.dw_start_w, cur, 1, 1, p, p, 1, 1)
            if block.dw_start_bn_w is not None:
                cur = self.rms_norm_2d(cur, block.dw_start_bn_w)
        if block.pw_exp_w is not None:
            cur = ggml.conv_2d_direct(block.pw_exp_w, cur, 1, 1, 0, 0, 1, 1)
            if block.pw_exp_bn_w is not None:
                cur = self.rms_norm_2d(cur, block.pw_exp_bn_w)
            cur = ggml.unary(cur, "GELU")
        if block.dw_mid_w is not None:       # where a stage downsamples
            k = block.dw_mid_w.ne[0]
            if stride > 1:
                cur = self.pad_same_2d(cur, k, k, stride, stride)
                cur = ggml.conv_2d_dw(block.dw_mid_w, cur, stride, stride, 0, 0, 1, 1)
            else:
                cur = ggml.conv_2d_dw(block.dw_mid_w, cur, stride, stride, k // 2, k // 2, 1, 1)
            if block.dw_mid_bn_w is not None:
                cur = self.rms_norm_2d(cur, block.dw_mid_bn_w)
            cur = ggml.unary(cur, "GELU")
        if block.pw_proj_w is not None:
            cur = ggml.conv_2d_direct(block.pw_proj_w, cur, 1, 1, 0, 0, 1, 1)
            if block.pw_proj_bn_w is not None:
                cur = self.rms_norm_2d(cur, block.pw_proj_bn_w)
        if block.layer_scale_w is not None:
            cur = ggml.mul(cur, block.layer_scale_w)
        if inp.ne[0] == cur.ne[0] and inp.ne[1] == cur.ne[1] and inp.ne[2] == cur.ne[2]:
            cur = ggml.add(cur, inp)
        return cur

    def build_mobilenet_attn(self, inp: Tensor, block: MobilenetV5Block) -> Tensor:
        cur = inp
        if block.attn_norm_w is not None:
            cur = self.rms_norm_2d(cur, block.attn_norm_w, 1e-6)
        q = ggml.conv_2d_direct(block.attn_q_w, cur, 1, 1, 0, 0, 1, 1)
        k_inp = cur
        if block.attn_k_dw_w is not None:     # keys downsampled: Conv2dSame(k, stride 2), depthwise
            k_size = block.attn_k_dw_w.ne[0]
            k_inp = self.pad_same_2d(cur, k_size, k_size, 2, 2)
            k_inp = ggml.conv_2d_dw(block.attn_k_dw_w, k_inp, 2, 2, 0, 0, 1, 1)
            if block.attn_k_norm_w is not None:
                k_inp = self.rms_norm_2d(k_inp, block.attn_k_norm_w, 1e-6)
        k = ggml.conv_2d_direct(block.attn_k_w, k_inp, 1, 1, 0, 0, 1, 1)
        v_inp = cur
        if block.attn_v_dw_w is not None:
            v_size = block.attn_v_dw_w.ne[0]
            v_inp = self.pad_same_2d(cur, v_size, v_size, 2, 2)
            v_inp = ggml.conv_2d_dw(block.attn_v_dw_w, v_inp, 2, 2, 0, 0, 1, 1)
            if block.attn_v_norm_w is not None:
                v_inp = self.rms_norm_2d(v_inp, block.attn_v_norm_w, 1e-6)
        v = ggml.conv_2d_direct(block.attn_v_w, v_inp, 1, 1, 0, 0, 1, 1)

        W, H, B = cur.ne[0], cur.ne[1], cur.ne[3]
        D = k.ne[2]           # the head dimension
        n_head = q.ne[2] // D
        N = W * H
        q = ggml.reshape(q, N, D * n_head, B)
        q = ggml.reshape(q, N, D, n_head, B)
        q = ggml.cont(ggml.permute(q, 1, 0, 2, 3))
        M = k.ne[0] * k.ne[1]
        k = ggml.reshape(k, M, D, B)
        k = ggml.reshape(k, M, D, 1, B)
        k = ggml.cont(ggml.permute(k, 1, 0, 2, 3))
        v = ggml.reshape(v, M, D, B)
        v = ggml.reshape(v, M, D, 1, B)
        v = ggml.cont(v)
        scores = ggml.mul_mat(k, q)
        scores = ggml.scale(scores, 1.0 / math.sqrt(D))
        scores = ggml.soft_max(scores)
        kqv = ggml.mul_mat(v, scores)
        kqv = ggml.cont(ggml.permute(kqv, 1, 0, 2, 3))
        kqv = ggml.reshape(kqv, N, D * n_head, B)
        kqv = ggml.reshape(kqv, W, H, D * n_head, B)
        kqv = ggml.cont(kqv)
        cur = ggml.conv_2d_direct(block.attn_o_w, kqv, 1, 1, 0, 0, 1, 1)
        if inp.ne[0] == cur.ne[0] and inp.ne[2] == cur.ne[2]:
            if block.layer_scale_w is not None:
                cur = ggml.mul(cur, block.layer_scale_w)
            cur = ggml.add(cur, inp)
        return cur

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        inp = self.build_inp_raw()
        # the stem: Conv2dSame(3 -> C, kernel 3, stride 2)
        cur = self.pad_same_2d(inp, 3, 3, 2, 2)
        cur = ggml.conv_2d_direct(self._weight(model.mobilenet_stem_conv_w, "v.conv_stem.conv.weight"), cur, 2, 2, 0, 0, 1, 1)
        if model.mobilenet_stem_conv_b is not None:
            cur = ggml.add(cur, model.mobilenet_stem_conv_b)
        if model.mobilenet_stem_norm_w is not None:
            cur = self.rms_norm_2d(cur, model.mobilenet_stem_norm_w)
        cur = ggml.unary(cur, "GELU")

        blocks, ends = model.mobilenet_blocks, model.mobilenet_stage_ends
        total_blocks = len(blocks)

        def is_stage_start(i: int) -> bool:
            return i == 0 or any(i == end_idx + 1 for end_idx in ends)

        def is_fusion_point(i: int) -> bool:
            if len(ends) >= 4:
                return i in (ends[2], ends[3])    # the ends of stages 2 and 3
            return i == total_blocks - 1

        intermediate_features: list[Tensor] = []
        for i, block in enumerate(blocks):
            stride = 2 if is_stage_start(i) else 1
            if block.s0_conv_exp_w is not None:
                cur = self.build_edge_residual(cur, block, stride)
            elif block.attn_q_w is not None:
                cur = self.build_mobilenet_attn(cur, block)
            else:
                cur = self.build_inverted_residual(cur, block, stride)
            if is_fusion_point(i):
                intermediate_features.append(cur)

        # the multi-scale fusion adapter
        if intermediate_features:
            high_res_w, high_res_h = intermediate_features[0].ne[0], intermediate_features[0].ne[1]
            resized_feats = []
            for feat in intermediate_features:
                if feat.ne[0] < high_res_w or feat.ne[1] < high_res_h:
                    if high_res_w % feat.ne[0]:
                        raise self.abort("mobilenetv5.cpp GGML_ASSERT(high_res_w % feat_w == 0)")
                    feat = ggml.upscale(feat, high_res_w // feat.ne[0], ggml.SCALE_MODE_NEAREST)
                resized_feats.append(feat)
            cur = resized_feats[0]
            for feat in resized_feats[1:]:
                cur = ggml.concat(cur, feat, 2)
            if model.msfa_ffn_expand_w is not None:
                cur = ggml.conv_2d_direct(model.msfa_ffn_expand_w, cur, 1, 1, 0, 0, 1, 1)
                if model.msfa_ffn_expand_bn is not None:
                    cur = self.rms_norm_2d(cur, model.msfa_ffn_expand_bn)
                cur = ggml.unary(cur, "GELU")
            if model.msfa_ffn_project_w is not None:
                cur = ggml.conv_2d_direct(model.msfa_ffn_project_w, cur, 1, 1, 0, 0, 1, 1)
                if model.msfa_ffn_project_bn is not None:
                    cur = self.rms_norm_2d(cur, model.msfa_ffn_project_bn)
            target_out_res = 16      # the output resolution
            current_w = cur.ne[0]
            if current_w > target_out_res:
                s = current_w // target_out_res
                if current_w % target_out_res:
                    raise self.abort("mobilenetv5.cpp GGML_ASSERT(current_w % target_out_res == 0)")
                cur = ggml.pool_2d(cur, ggml.POOL_AVG, s, s, s, s, 0, 0)
            if model.msfa_concat_norm_w is not None:
                cur = self.rms_norm_2d(cur, model.msfa_concat_norm_w)

        # Gemma 3n's multimodal embedder
        W, H, C, B = cur.ne[0], cur.ne[1], cur.ne[2], cur.ne[3]
        if C != hp.n_embd:
            raise self.abort("mobilenetv5.cpp GGML_ASSERT(C == hparams.n_embd)")
        cur = ggml.permute(cur, 2, 1, 0, 3)
        cur = ggml.permute(cur, 0, 2, 1, 3)
        cur = ggml.cont(cur)
        cur = ggml.reshape(cur, C, W * H, B)
        cur = ggml.cont(cur)
        cur = ggml.scale(cur, math.sqrt(C))
        cur = ggml.rms_norm(cur, 1e-6)
        if model.mm_soft_emb_norm_w is not None:
            cur = ggml.mul(cur, model.mm_soft_emb_norm_w)
        if model.mm_input_proj_w is not None:
            cur = self.build_mm(model.mm_input_proj_w, cur)
        cur = ggml.rms_norm(cur, 1e-6)      # the post-projection norm (its weight is not loaded)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphMobilenetv5
