"""tools/mtmd/models/conformer.cpp: clip_graph_conformer (LFM2-Audio's FastConformer encoder): the
conv subsampling (a conv2d, two depthwise + pointwise pairs, 8x fewer frames), Conformer blocks
(half-step SiLU FFNs, relative-position attention with the u/v biases and the rel shift, a GLU and a
depthwise conv1d as ggml_ssm_conv after pad/roll/pad, a folded batch norm), and the audio adapter
(LayerNorm, GELU MLP)."""
from __future__ import annotations

import math

from ... import ggml
from ..clip import FFN_GELU_ERF, FFN_SILU, NORM_TYPE_NORMAL, ClipGraph, set_name

FC_FACTOR = 0.5
EPS = 1e-5


class ClipGraphConformer(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model = self.model
        d_head, n_head = self.d_head, self.n_head
        n_frames = self.nx
        n_pos = n_frames // 2
        n_pos_embd = (((((n_frames + 1) // 2) + 1) // 2 + 1) // 2) * 2 - 1
        pos = self._weight(model.position_embeddings, "a.position_embd.weight")
        if pos.ne[1] < n_pos:
            raise self.abort(f"conformer.cpp GGML_ASSERT(model.position_embeddings->ne[1] >= n_pos): {pos.ne[1]} "
                             f"positions, {n_pos} needed")
        pos_emb = ggml.new_tensor(ggml.T.F32, 512, n_pos_embd)
        set_name(pos_emb, "pos_emb")
        pos_emb.set_input()
        self.expand(pos_emb)

        inp = self.build_inp_raw(1)
        cur = ggml.cont(ggml.transpose(inp))
        # pre encode, conv subsampling
        w, b = model.pre_encode_conv_X_w, model.pre_encode_conv_X_b
        cur = ggml.conv_2d(w[0], cur, 2, 2, 1, 1, 1, 1)
        cur = ggml.add(cur, b[0])
        cur = ggml.unary(cur, "RELU", inplace=True)
        cur = ggml.conv_2d_dw_direct(w[2], cur, 2, 2, 1, 1, 1, 1)
        cur = ggml.add(cur, b[2])
        cur = ggml.conv_2d_direct(w[3], cur, 1, 1, 0, 0, 1, 1)
        cur = ggml.add(cur, b[3])
        cur = ggml.unary(cur, "RELU", inplace=True)
        cur = ggml.conv_2d_dw_direct(w[5], cur, 2, 2, 1, 1, 1, 1)
        cur = ggml.add(cur, b[5])
        cur = ggml.conv_2d_direct(w[6], cur, 1, 1, 0, 0, 1, 1)
        cur = ggml.add(cur, b[6])
        cur = ggml.unary(cur, "RELU", inplace=True)
        # flatten the channel and frequency axes
        cur = ggml.cont(ggml.permute(cur, 0, 2, 1, 3))
        cur = ggml.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2])
        cur = self.build_mm(model.pre_encode_out_w, cur)
        cur = ggml.add(cur, model.pre_encode_out_b)

        for il in range(self.n_layer):
            layer = model.layers[il]
            residual = cur
            # feed_forward1
            cur = self.build_norm(cur, layer.ff_norm_w, layer.ff_norm_b, NORM_TYPE_NORMAL, EPS, il)
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, None, None, layer.ff_down_w, layer.ff_down_b,
                                 FFN_SILU, il)
            residual = ggml.add(residual, ggml.scale(cur, FC_FACTOR))
            # self-attention
            cur = self.build_norm(residual, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_NORMAL, EPS, il)
            Qcur = self.build_mm(self._weight(layer.q_w, f"a.blk.{il}.attn_q.weight"), cur)
            Qcur = ggml.add(Qcur, layer.q_b)
            Qcur = ggml.reshape(Qcur, d_head, n_head, Qcur.ne[1])
            Q_bias_u = ggml.add(Qcur, layer.pos_bias_u)
            Q_bias_u = ggml.permute(Q_bias_u, 0, 2, 1, 3)
            Q_bias_v = ggml.add(Qcur, layer.pos_bias_v)
            Q_bias_v = ggml.permute(Q_bias_v, 0, 2, 1, 3)
            Kcur = self.build_mm(self._weight(layer.k_w, f"a.blk.{il}.attn_k.weight"), cur)
            Kcur = ggml.add(Kcur, layer.k_b)
            Kcur = ggml.reshape(Kcur, d_head, n_head, Kcur.ne[1])
            Kcur = ggml.cont(ggml.permute(Kcur, 0, 2, 1, 3))
            Vcur = self.build_mm(self._weight(layer.v_w, f"a.blk.{il}.attn_v.weight"), cur)
            Vcur = ggml.add(Vcur, layer.v_b)
            Vcur = ggml.reshape(Vcur, d_head, n_head, Vcur.ne[1])
            Vcur = ggml.cont(ggml.permute(Vcur, 1, 2, 0, 3))
            matrix_ac = ggml.mul_mat(Q_bias_u, Kcur)
            matrix_ac = ggml.cont(ggml.permute(matrix_ac, 1, 0, 2, 3))
            p = self.build_mm(layer.linear_pos_w, pos_emb)
            p = ggml.reshape(p, d_head, n_head, p.ne[1])
            p = ggml.permute(p, 0, 2, 1, 3)
            matrix_bd = ggml.mul_mat(Q_bias_v, p)
            matrix_bd = ggml.cont(ggml.permute(matrix_bd, 1, 0, 2, 3))
            # rel shift
            pos_len, q_len, h = matrix_bd.ne[0], matrix_bd.ne[1], matrix_bd.ne[2]
            matrix_bd = ggml.pad_ext(matrix_bd, 1, 0, 0, 0, 0, 0, 0, 0)
            matrix_bd = ggml.reshape(matrix_bd, q_len, pos_len + 1, h)
            matrix_bd = ggml.view(matrix_bd, (q_len, pos_len, h), (matrix_bd.nb[1], matrix_bd.nb[2]),
                                  matrix_bd.nb[0] * q_len)
            matrix_bd = ggml.cont(matrix_bd, pos_len, q_len, h)
            matrix_bd = ggml.view(matrix_bd, (matrix_ac.ne[0], matrix_bd.ne[1], matrix_bd.ne[2]),
                                  (matrix_bd.nb[1], matrix_bd.nb[2]), 0)
            scores = ggml.add(matrix_ac, matrix_bd)
            scores = ggml.scale(scores, 1.0 / math.sqrt(d_head))
            attn = ggml.soft_max(scores)
            x = ggml.mul_mat(attn, Vcur)
            x = ggml.permute(x, 2, 0, 1, 3)
            x = ggml.cont(x, x.ne[0] * x.ne[1], x.ne[2])
            out = self.build_mm(layer.o_w, x)
            out = ggml.add(out, layer.o_b)
            cur = out
            residual = ggml.add(residual, cur)
            cur = self.build_norm(residual, layer.norm_conv_w, layer.norm_conv_b, NORM_TYPE_NORMAL, EPS, il)
            # conv
            x = self.build_mm(layer.conv_pw1_w, cur)
            x = ggml.add(x, layer.conv_pw1_b)
            d = x.ne[0] // 2        # GLU
            gate = ggml.unary(ggml.view(x, (d, x.ne[1]), (x.nb[1],), d * x.nb[0]), "SIGMOID")
            x = ggml.mul(ggml.view(x, (d, x.ne[1]), (x.nb[1],), 0), gate)
            x = ggml.cont(ggml.transpose(x))
            # ggml_ssm_conv for f32 precision
            x = ggml.pad(x, 4, 0, 0, 0)
            x = ggml.roll(x, 4, 0, 0, 0)
            x = ggml.pad(x, 4, 0, 0, 0)
            x = ggml.ssm_conv(x, layer.conv_dw_w)
            x = ggml.add(x, layer.conv_dw_b)
            x = ggml.add(ggml.mul(x, layer.conv_norm_w), layer.conv_norm_b)
            x = ggml.unary(x, "SILU")
            x = self.build_mm(layer.conv_pw2_w, x)
            x = ggml.add(x, layer.conv_pw2_b)
            cur = x
            residual = ggml.add(residual, cur)
            cur = self.build_norm(residual, layer.ff_norm_1_w, layer.ff_norm_1_b, NORM_TYPE_NORMAL, EPS, il)
            cur = self.build_ffn(cur, layer.ff_up_1_w, layer.ff_up_1_b, None, None, layer.ff_down_1_w,
                                 layer.ff_down_1_b, FFN_SILU, il)
            residual = ggml.add(residual, ggml.scale(cur, FC_FACTOR))
            cur = self.build_norm(residual, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_NORMAL, EPS, il)

        # audio adapter
        cur = self.build_norm(cur, model.mm_0_w, model.mm_0_b, NORM_TYPE_NORMAL, EPS, -1)
        cur = self.build_ffn(cur, model.mm_1_w, model.mm_1_b, None, None, model.mm_3_w, model.mm_3_b, FFN_GELU_ERF, -1)
        self.cb(cur, "projected", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphConformer
