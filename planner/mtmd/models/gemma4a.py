"""tools/mtmd/models/gemma4a.cpp: clip_graph_gemma4a (Gemma 4's audio encoder): two stride-2 conv2d
subsampling blocks (channel LayerNorm, ReLU), the input projection, Conformer blocks (half-step
SiLU FFN, chunked local attention of 12-frame blocks over 24 frames with a blocked relative
position term and a 50 softcap, a GLU and a causal depthwise conv1d, a second half-step FFN, the
output norm), the output projection and the audio embedder (RMS norm, projection). Every weight
is a Gemma4ClippableLinear (gemma4v's build_mm)."""
from __future__ import annotations

import math

from ... import ggml
from ..clip import FFN_SILU, NORM_TYPE_RMS, ClipGraph, set_name
from .gemma4v import ClipGraphGemma4v

RES_WEIGHT = 0.5
NORM_EPS = 1e-6
CHUNK = 12                  # C: chunk_size
PAST = 12                   # P: max_past_horizon (context_left - 1)


class ClipGraphGemma4a(ClipGraph):
    build_mm = ClipGraphGemma4v.build_mm

    def build(self) -> ggml.Cgraph:
        model = self.model
        d_head, n_head = self.d_head, self.n_head
        inp = self.build_inp_raw(1)
        cur = ggml.cont(ggml.transpose(inp))
        # subsampling conv2d (symmetric padding 1)
        for i in range(2):
            cur = ggml.conv_2d(self._weight(model.sscp_conv_w[i], f"a.conv1d.{i}.weight"), cur, 2, 2, 1, 1, 1, 1)
            if model.sscp_conv_b[i] is not None:
                cur = ggml.add(cur, model.sscp_conv_b[i])
            if model.sscp_norm_w[i] is not None:    # nn.LayerNorm over the channels
                cur = ggml.cont(ggml.permute(cur, 1, 2, 0, 3))
                cur = ggml.norm(cur, NORM_EPS)
                cur = ggml.mul(cur, model.sscp_norm_w[i])
                cur = ggml.cont(ggml.permute(cur, 2, 0, 1, 3))
            cur = ggml.unary(cur, "RELU")
        # [freq, time, ch] -> [ch*freq, time]
        cur = ggml.cont(ggml.permute(cur, 1, 2, 0, 3))
        cur = ggml.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2])
        if model.sscp_inp_proj_w is not None:
            cur = self.build_mm(model.sscp_inp_proj_w, cur)
            if model.sscp_inp_proj_b is not None:
                cur = ggml.add(cur, model.sscp_inp_proj_b)

        n_pos = cur.ne[1]
        C, P = CHUNK, PAST
        S = C + P                   # context_size
        R = P + 1                   # RPE positions
        B = (n_pos + C - 1) // C    # num_blocks
        pad_seq = B * C - n_pos
        pos_emb = ggml.new_tensor(ggml.T.F32, n_head * d_head, R)
        set_name(pos_emb, "pos_emb")
        pos_emb.set_input()
        kq_mask = ggml.new_tensor(ggml.T.F32, S, C, B)
        set_name(kq_mask, "kq_mask")
        kq_mask.set_input()

        def extract_blocks(t: ggml.Tensor) -> ggml.Tensor:
            """left pad by P, right pad to S*B, then overlapping windows of S with stride C"""
            pad_kv = S * B - n_pos
            t = ggml.pad_ext(t, 0, 0, 0, 0, P, pad_kv - P, 0, 0)
            t = ggml.view(t, (d_head, n_head, S, B), (t.nb[1], t.nb[2], C * t.nb[2]), 0)
            return ggml.cont(t)

        for il in range(self.n_layer):
            layer = model.layers[il]
            residual = cur
            # FFN 1 (half-step)
            if layer.ff_norm_w is not None and layer.ff_up_w is not None and layer.ff_down_w is not None:
                cur = self.build_norm(cur, layer.ff_norm_w, None, NORM_TYPE_RMS, NORM_EPS, il)
                cur = self.build_ffn(cur, layer.ff_up_w, None, None, None, layer.ff_down_w, None, FFN_SILU, il)
                if layer.ff_post_norm_w is not None:
                    cur = self.build_norm(cur, layer.ff_post_norm_w, None, NORM_TYPE_RMS, NORM_EPS, il)
                residual = ggml.add(residual, ggml.scale(cur, RES_WEIGHT))
            # chunked local self-attention with relative positions
            if None not in (layer.q_w, layer.k_w, layer.v_w, layer.o_w):
                q_scale = (1.0 / math.sqrt(d_head)) / math.log(2.0)
                k_scale = math.log(1.0 + math.exp(1.0)) / math.log(2.0)
                softcap = 50.0
                attn_norm_w = layer.attn_pre_norm_w if layer.attn_pre_norm_w is not None else layer.ln_1_w
                cur = (self.build_norm(residual, attn_norm_w, None, NORM_TYPE_RMS, NORM_EPS, il)
                       if attn_norm_w is not None else residual)
                Qcur = self.build_mm(layer.q_w, cur)
                Kcur = self.build_mm(layer.k_w, cur)
                Vcur = self.build_mm(layer.v_w, cur)
                Qcur = ggml.reshape(Qcur, d_head, n_head, n_pos)
                Kcur = ggml.reshape(Kcur, d_head, n_head, n_pos)
                Vcur = ggml.reshape(Vcur, d_head, n_head, n_pos)
                Qcur = ggml.scale(Qcur, q_scale)
                if layer.per_dim_scale_w is not None:
                    Qcur = ggml.mul(Qcur, ggml.reshape(layer.per_dim_scale_w, d_head, 1, 1))
                Kcur = ggml.scale(Kcur, k_scale)
                if layer.per_dim_k_scale_w is not None:
                    Kcur = ggml.mul(Kcur, ggml.reshape(layer.per_dim_k_scale_w, d_head, 1, 1))
                # Q in blocks: [D, H, N] -> [D, H, C, B] -> [D, C, B, H]
                Qcur = ggml.pad(Qcur, 0, 0, pad_seq, 0)
                Qcur = ggml.reshape(Qcur, d_head, n_head, C, B)
                Qcur = ggml.cont(ggml.permute(Qcur, 0, 3, 1, 2))
                Kblk = extract_blocks(Kcur)
                Kblk = ggml.cont(ggml.permute(Kblk, 0, 3, 1, 2))     # [D, S, B, H]
                Vblk = extract_blocks(Vcur)
                Vblk = ggml.cont(ggml.permute(Vblk, 1, 3, 0, 2))     # [S, D, B, H]
                matrix_ac = ggml.mul_mat(Kblk, Qcur)                 # [S, C, B, H]
                if layer.attn_k_rel_w is not None:
                    p = ggml.mul_mat(layer.attn_k_rel_w, pos_emb)
                    p = ggml.reshape(p, d_head, n_head, R)
                    p = ggml.cont(ggml.permute(p, 0, 2, 1, 3))       # [D, R, H]
                    Q_flat = ggml.reshape(Qcur, d_head, C * B, n_head)
                    matrix_bd = ggml.mul_mat(p, Q_flat)              # [R, C*B, H]
                    matrix_bd = ggml.reshape(matrix_bd, R, C, B, n_head)
                    # blocked relative shift (Transformer-XL appendix B)
                    matrix_bd = ggml.pad(matrix_bd, S + 1 - R, 0, 0, 0)
                    matrix_bd = ggml.reshape(matrix_bd, (S + 1) * C, B, n_head)
                    matrix_bd = ggml.view(matrix_bd, (C * S, B, n_head), (matrix_bd.nb[1], matrix_bd.nb[2]), 0)
                    matrix_bd = ggml.cont(matrix_bd)
                    matrix_bd = ggml.reshape(matrix_bd, S, C, B, n_head)
                    matrix_ac = ggml.add(matrix_ac, matrix_bd)
                scores = ggml.scale(matrix_ac, 1.0 / softcap)
                scores = ggml.unary(scores, "TANH")
                scores = ggml.scale(scores, softcap)
                scores = ggml.add(scores, kq_mask)
                attn = ggml.soft_max(scores)
                x = ggml.mul_mat(Vblk, attn)                         # [D, C, B, H]
                x = ggml.cont(ggml.permute(x, 0, 2, 3, 1))
                x = ggml.cont(x, d_head * n_head, C * B)
                if pad_seq > 0:
                    x = ggml.view(x, (d_head * n_head, n_pos), (x.nb[1],), 0)
                    x = ggml.cont(x)
                x = self.build_mm(layer.o_w, x)
                if layer.o_b is not None:
                    x = ggml.add(x, layer.o_b)
                if layer.attn_post_norm_w is not None:
                    x = self.build_norm(x, layer.attn_post_norm_w, None, NORM_TYPE_RMS, NORM_EPS, il)
                residual = ggml.add(residual, x)
            # convolution module
            if None not in (layer.norm_conv_w, layer.conv_pw1_w, layer.conv_dw_w, layer.conv_pw2_w):
                cur = self.build_norm(residual, layer.norm_conv_w, None, NORM_TYPE_RMS, NORM_EPS, il)
                x = self.build_mm(layer.conv_pw1_w, cur)
                d = x.ne[0] // 2         # GLU
                gate = ggml.unary(ggml.cont(ggml.view(x, (d, x.ne[1]), (x.nb[1],), d * x.nb[0])), "SIGMOID")
                x = ggml.mul(ggml.view(x, (d, x.ne[1]), (x.nb[1],), 0), gate)
                x = ggml.cont(ggml.transpose(x))
                # causal depthwise conv1d, left padded only
                x = ggml.pad_ext(x, 4, 0, 0, 0, 0, 0, 0, 0)
                x = ggml.ssm_conv(x, layer.conv_dw_w)
                if layer.conv_dw_b is not None:
                    x = ggml.add(x, layer.conv_dw_b)
                if layer.conv_norm_w is not None:
                    x = ggml.rms_norm(x, NORM_EPS)
                    x = ggml.mul(x, layer.conv_norm_w)
                x = ggml.unary(x, "SILU")
                x = self.build_mm(layer.conv_pw2_w, x)
                residual = ggml.add(residual, x)
            # FFN 2 (half-step)
            if None not in (layer.ff_norm_1_w, layer.ff_up_1_w, layer.ff_down_1_w):
                cur = self.build_norm(residual, layer.ff_norm_1_w, None, NORM_TYPE_RMS, NORM_EPS, il)
                cur = self.build_ffn(cur, layer.ff_up_1_w, None, None, None, layer.ff_down_1_w, None, FFN_SILU, il)
                if layer.ff_post_norm_1_w is not None:
                    cur = self.build_norm(cur, layer.ff_post_norm_1_w, None, NORM_TYPE_RMS, NORM_EPS, il)
                residual = ggml.add(residual, ggml.scale(cur, RES_WEIGHT))
            # layer output norm
            cur = (self.build_norm(residual, layer.ln_2_w, None, NORM_TYPE_RMS, NORM_EPS, il)
                   if layer.ln_2_w is not None else residual)

        # output projection
        if model.audio_out_proj_w is not None:
            cur = self.build_mm(model.audio_out_proj_w, cur)
            if model.audio_out_proj_b is not None:
                cur = ggml.add(cur, model.audio_out_proj_b)
        # audio multimodal embedder
        cur = ggml.rms_norm(cur, NORM_EPS)
        if model.mm_soft_emb_norm_w is not None:
            cur = ggml.mul(cur, model.mm_soft_emb_norm_w)
        if model.mm_input_proj_w is not None:
            cur = self.build_mm(model.mm_input_proj_w, cur)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphGemma4a
