"""tools/mtmd/models/parakeet.cpp: clip_graph_parakeet (Nemotron's Parakeet audio encoder): the conv
subsampling (conv2d, depthwise + pointwise pairs, 8x fewer frames), sinusoidal relative positions
built in the graph, FastConformer blocks (half-step SiLU FFNs, relative-position attention with
the u/v biases and the rel shift, a GLU, the depthwise conv as ggml_ssm_conv, an unfolded batch
norm) and the sound projection (RMS norm, squared-ReLU MLP).

The warm-up's 3000 mel frames give 375 frames here: parakeet.cpp's local (windowed) attention,
taken past 8192 frames, is never part of the reservation and is not built."""
from __future__ import annotations

import math

from ... import ggml
from ..clip import FFN_RELU_SQR, FFN_SILU, ClipGraph, set_name

FC_FACTOR = 0.5


class ClipGraphParakeet(ClipGraph):
    def _ln(self, cur: ggml.Tensor, w, b) -> ggml.Tensor:
        cur = ggml.norm(cur, self.hparams.eps)
        return ggml.add(ggml.mul(cur, w), b)

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        w, b = model.pre_encode_conv_X_w, model.pre_encode_conv_X_b
        inp = self.build_inp_raw(1)
        inp = ggml.cont(ggml.transpose(inp))
        cur = ggml.conv_2d(w[0], inp, 2, 2, 1, 1, 1, 1)
        cur = ggml.add(cur, b[0])
        cur = ggml.unary(cur, "RELU")
        cur = ggml.conv_2d_dw_direct(w[2], cur, 2, 2, 1, 1, 1, 1)
        cur = ggml.add(cur, b[2])
        cur = ggml.conv_2d(w[3], cur, 1, 1, 0, 0, 1, 1)
        cur = ggml.add(cur, b[3])
        cur = ggml.unary(cur, "RELU")
        cur = ggml.conv_2d_dw_direct(w[5], cur, 2, 2, 1, 1, 1, 1)
        cur = ggml.add(cur, b[5])
        cur = ggml.conv_2d(w[6], cur, 1, 1, 0, 0, 1, 1)
        cur = ggml.add(cur, b[6])
        cur = ggml.unary(cur, "RELU")
        # [freq, time, chan] -> [freq, chan, time] -> [freq * chan, time]
        cur = ggml.cont(ggml.permute(cur, 0, 2, 1, 3))
        cur = ggml.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2])
        cur = self.build_mm(model.pre_encode_out_w, cur)
        cur = ggml.add(cur, model.pre_encode_out_b)
        set_name(cur, "pre_enc_out")

        n_state = hp.n_embd
        n_time = cur.ne[1]
        window_size = 2 * n_time - 1
        d_half = n_state // 2
        attn_mask = ggml.new_tensor(ggml.T.F32, n_time, n_time)
        set_name(attn_mask, "attn_mask")
        attn_mask.set_input()
        pos_freqs = ggml.new_tensor(ggml.T.F32, d_half)
        set_name(pos_freqs, "pos_freqs")
        pos_freqs.set_input()
        rel_positions = ggml.new_tensor(ggml.T.F32, 1, window_size)
        set_name(rel_positions, "rel_positions")
        rel_positions.set_input()
        freqs = ggml.repeat_4d(pos_freqs, d_half, window_size, 1, 1)
        theta = ggml.mul(freqs, rel_positions)
        sin = ggml.reshape(ggml.sin(theta), 1, d_half, window_size)
        cos = ggml.reshape(ggml.cos(theta), 1, d_half, window_size)
        pos_emb = ggml.reshape(ggml.cont(ggml.concat(sin, cos, 0)), n_state, window_size)
        set_name(pos_emb, "pos_emb")

        n_head = hp.n_head
        d_head = n_state // n_head
        for il in range(self.n_layer):
            layer = model.layers[il]
            # FFN1
            residual = cur
            cur = self._ln(cur, layer.ff_norm_w, layer.ff_norm_b)
            cur = self.build_ffn(cur, layer.ff_up_w, None, None, None, layer.ff_down_w, None, FFN_SILU, il)
            cur = ggml.add(residual, ggml.scale(cur, FC_FACTOR))
            # self-attention with relative positions
            residual = cur
            cur = self._ln(cur, layer.ln_1_w, layer.ln_1_b)
            Q_cur = self.build_mm(self._weight(layer.q_w, f"a.blk.{il}.attn_q.weight"), cur)
            K_cur = self.build_mm(self._weight(layer.k_w, f"a.blk.{il}.attn_k.weight"), cur)
            V_cur = self.build_mm(self._weight(layer.v_w, f"a.blk.{il}.attn_v.weight"), cur)
            Q_cur = ggml.reshape(Q_cur, d_head, n_head, n_time)
            K_cur = ggml.reshape(K_cur, d_head, n_head, n_time)
            V_cur = ggml.reshape(V_cur, d_head, n_head, n_time)
            pos = self.build_mm(layer.linear_pos_w, pos_emb)
            pos = ggml.reshape(pos, d_head, n_head, pos_emb.ne[1])
            pos = ggml.cont(ggml.permute(pos, 0, 2, 1, 3))
            # full attention
            Q_u = ggml.add(Q_cur, layer.pos_bias_u)
            K_prep = ggml.permute(K_cur, 0, 2, 1, 3)
            Q_prep = ggml.permute(Q_u, 0, 2, 1, 3)
            content_scores = ggml.mul_mat(K_prep, Q_prep)
            Q_v = ggml.add(Q_cur, layer.pos_bias_v)
            Q_v = ggml.cont(ggml.permute(Q_v, 0, 2, 1, 3))
            rel_pos_scores = ggml.mul_mat(pos, Q_v)
            # relative positional shift
            pos_window, n_frame, n_h = rel_pos_scores.ne[0], rel_pos_scores.ne[1], rel_pos_scores.ne[2]
            rel_pos_scores = ggml.pad_ext(rel_pos_scores, 1, 0, 0, 0, 0, 0, 0, 0)
            rel_pos_scores = ggml.reshape(rel_pos_scores, n_frame, pos_window + 1, n_h)
            rel_pos_scores = ggml.cont(rel_pos_scores)
            center = pos_window // 2
            offset = rel_pos_scores.nb[0] * (center + 1)
            rel_pos_scores = ggml.view(rel_pos_scores, (n_frame, pos_window, n_h), (pos_window * 4, rel_pos_scores.nb[2]),
                                       offset)
            rel_pos_scores = ggml.cont(rel_pos_scores)
            rel_pos_scores = ggml.view(rel_pos_scores, (content_scores.ne[0], content_scores.ne[1], rel_pos_scores.ne[2]),
                                       (rel_pos_scores.nb[1], rel_pos_scores.nb[2]), 0)
            rel_pos_scores = ggml.cont(rel_pos_scores)
            attn_scores = ggml.add(content_scores, rel_pos_scores)
            attn_scores = ggml.scale(attn_scores, 1.0 / math.sqrt(d_head))
            attn_scores = ggml.add(attn_scores, attn_mask)
            probs = ggml.soft_max(attn_scores)
            V_cur = ggml.cont(ggml.permute(V_cur, 1, 2, 0, 3))
            cur = ggml.mul_mat(probs, V_cur)
            cur = ggml.permute(cur, 2, 0, 1, 3)
            cur = ggml.cont(cur, n_state, n_time)
            cur = self.build_mm(layer.o_w, cur)
            cur = ggml.add(residual, cur)
            # convolution
            residual = cur
            cur = self._ln(cur, layer.norm_conv_w, layer.norm_conv_b)
            cur = self.build_mm(layer.conv_pw1_w, cur)
            d = cur.ne[0] // 2
            signal = ggml.view(cur, (d, cur.ne[1]), (cur.nb[1],), 0)
            gate = ggml.view(cur, (d, cur.ne[1]), (cur.nb[1],), d * cur.nb[0])
            cur = ggml.mul(signal, ggml.unary(gate, "SIGMOID"))
            cur = ggml.cont(ggml.transpose(cur))
            dw_pad = (hp.audio_conv_kernel_size - 1) // 2
            cur = ggml.pad_ext(cur, dw_pad, dw_pad, 0, 0, 0, 0, 0, 0)
            cur = ggml.ssm_conv(cur, layer.conv_dw_w)
            cur = ggml.sub(cur, layer.conv_norm_mean)
            std = ggml.sqrt(layer.conv_norm_var)
            cur = ggml.div(cur, std)
            cur = ggml.add(ggml.mul(cur, layer.conv_norm_w), layer.conv_norm_b)
            cur = ggml.unary(cur, "SILU")
            cur = self.build_mm(layer.conv_pw2_w, cur)
            cur = ggml.add(residual, cur)
            # FFN2
            residual = cur
            cur = self._ln(cur, layer.ff_norm_1_w, layer.ff_norm_1_b)
            cur = self.build_ffn(cur, layer.ff_up_1_w, None, None, None, layer.ff_down_1_w, None, FFN_SILU, il)
            cur = ggml.add(residual, ggml.scale(cur, 0.5))
            cur = self._ln(cur, layer.ln_2_w, layer.ln_2_b)

        self.cb(cur, "encoder_out", -1)
        cur = ggml.rms_norm(cur, 1e-6)
        cur = ggml.mul(cur, model.mm_norm_pre_w)
        cur = self.build_ffn(cur, model.mm_0_w, model.mm_0_b, None, None, model.mm_1_w, model.mm_1_b, FFN_RELU_SQR, -1)
        self.cb(cur, "projected", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphParakeet
