"""tools/mtmd/models/granite-speech.cpp: clip_graph_granite_speech (Granite Speech): the input linear,
Conformer blocks over chunks of audio_chunk_size frames (half-step SiLU FFNs, block attention with
Shaw relative positions looked up per distance, the GLU and depthwise conv as ggml_ssm_conv with the
folded batch norm), the CTC branch at the middle layer, feature layers concatenated (Granite Speech
Plus), and the QFormer projector (queries attending to themselves and to windows of frames)."""
from __future__ import annotations

import math

from ... import ggml
from ..clip import FFN_GELU, FFN_SILU, NORM_TYPE_NORMAL, ClipGraph, set_name


class ClipGraphGraniteSpeech(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        n_embd, n_head, d_head, n_layer, eps = self.n_embd, self.n_head, self.d_head, self.n_layer, self.eps
        n_frames = self.nx
        context_size = hp.audio_chunk_size
        ctc_layer = n_layer // 2
        conv_pad = hp.audio_conv_kernel_size // 2
        num_blocks = (n_frames + context_size - 1) // context_size
        padded_len = num_blocks * context_size
        remainder = n_frames % context_size
        proj_input_dim = n_embd * (len(hp.feature_layers) + 1)
        use_feature_concat = bool(hp.feature_layers)

        attn_dists = ggml.new_tensor(ggml.T.I32, context_size * context_size)
        set_name(attn_dists, "attn_dists")
        attn_dists.set_input()
        attn_mask = None
        if remainder > 0:
            attn_mask = ggml.new_tensor(ggml.T.F32, context_size, context_size, 1, num_blocks)
            set_name(attn_mask, "attn_mask")
            attn_mask.set_input()

        inp = self.build_inp_raw(1)
        cur = ggml.cont(ggml.transpose(inp))
        cur = self.build_mm(model.inp_proj_w, cur)
        cur = ggml.add(cur, model.inp_proj_b)
        concat_result = None
        if use_feature_concat and 0 in hp.feature_layers:
            concat_result = cur

        for il in range(n_layer):
            layer = model.layers[il]
            residual = cur
            # ffn1 (half-step)
            ffn1 = self.build_norm(cur, layer.ff_norm_w, layer.ff_norm_b, NORM_TYPE_NORMAL, eps, il)
            ffn1 = self.build_ffn(ffn1, layer.ff_up_w, layer.ff_up_b, None, None, layer.ff_down_w, layer.ff_down_b,
                                  FFN_SILU, il)
            residual = ggml.add(residual, ggml.scale(ffn1, 0.5))
            # block attention with Shaw relative positions
            normed = self.build_norm(residual, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_NORMAL, eps, il)
            if n_frames < padded_len:
                normed = ggml.pad(normed, 0, padded_len - n_frames, 0, 0)
            Q = self.build_mm(self._weight(layer.q_w, f"a.blk.{il}.attn_q.weight"), normed)
            K = self.build_mm(self._weight(layer.k_w, f"a.blk.{il}.attn_k.weight"), normed)
            V = self.build_mm(self._weight(layer.v_w, f"a.blk.{il}.attn_v.weight"), normed)
            Q = ggml.reshape(Q, d_head, n_head, context_size, num_blocks)
            K = ggml.reshape(K, d_head, n_head, context_size, num_blocks)
            V = ggml.reshape(V, d_head, n_head, context_size, num_blocks)
            Q_perm = ggml.permute(Q, 0, 2, 1, 3)
            K_perm = ggml.cont(ggml.permute(K, 0, 2, 1, 3))
            kq = ggml.mul_mat(K_perm, Q_perm)
            pos_emb = ggml.get_rows(layer.attn_rel_pos_emb, attn_dists)
            pos_emb = ggml.reshape(pos_emb, d_head, context_size, context_size)
            pos_emb = ggml.reshape(pos_emb, d_head, context_size, 1, context_size)
            Q_shaw = ggml.permute(Q, 0, 1, 3, 2)
            pos_attn = ggml.mul_mat(pos_emb, Q_shaw)
            pos_attn = ggml.cont(ggml.permute(pos_attn, 0, 2, 3, 1))
            scores = ggml.add(kq, pos_attn)
            attn_weights = ggml.soft_max_ext(scores, attn_mask, self.kq_scale, 0.0)
            V_perm = ggml.cont(ggml.permute(V, 1, 2, 0, 3))
            attn_out = ggml.mul_mat(V_perm, attn_weights)
            attn_out = ggml.permute(attn_out, 0, 2, 1, 3)
            attn_out = ggml.cont(attn_out, n_embd, padded_len)
            if n_frames < padded_len:
                attn_out = ggml.view(attn_out, (n_embd, n_frames), (attn_out.nb[1],), 0)
            cur = self.build_mm(layer.o_w, attn_out)
            cur = ggml.add(cur, layer.o_b)
            residual = ggml.add(residual, cur)
            # conv module
            cur = self.build_norm(residual, layer.norm_conv_w, layer.norm_conv_b, NORM_TYPE_NORMAL, eps, il)
            x = self.build_mm(layer.conv_pw1_w, cur)
            x = ggml.add(x, layer.conv_pw1_b)
            d = x.ne[0] // 2           # GLU
            gate = ggml.unary(ggml.view(x, (d, x.ne[1]), (x.nb[1],), d * x.nb[0]), "SIGMOID")
            x = ggml.mul(ggml.view(x, (d, x.ne[1]), (x.nb[1],), 0), gate)
            x = ggml.cont(ggml.transpose(x))
            x = ggml.pad_ext(x, conv_pad, conv_pad, 0, 0, 0, 0, 0, 0)
            x = ggml.ssm_conv(x, layer.conv_dw_w)
            x = ggml.add(ggml.mul(x, layer.conv_norm_w), layer.conv_norm_b)     # folded batch norm
            x = ggml.unary(x, "SILU")
            x = self.build_mm(layer.conv_pw2_w, x)
            x = ggml.add(x, layer.conv_pw2_b)
            cur = x
            residual = ggml.add(residual, cur)
            # ffn2 (half-step)
            ffn2 = self.build_norm(residual, layer.ff_norm_1_w, layer.ff_norm_1_b, NORM_TYPE_NORMAL, eps, il)
            ffn2 = self.build_ffn(ffn2, layer.ff_up_1_w, layer.ff_up_1_b, None, None, layer.ff_down_1_w,
                                  layer.ff_down_1_b, FFN_SILU, il)
            residual = ggml.add(residual, ggml.scale(ffn2, 0.5))
            cur = self.build_norm(residual, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_NORMAL, eps, il)
            if use_feature_concat and il + 1 in hp.feature_layers:
                concat_result = cur if concat_result is None else ggml.concat(concat_result, cur, 0)
            # CTC branch
            if il + 1 == ctc_layer:
                mid = self.build_mm(model.ctc_out_w, cur)
                mid = ggml.add(mid, model.ctc_out_b)
                mid = ggml.soft_max(mid)
                mid = self.build_mm(model.ctc_out_mid_w, mid)
                mid = ggml.add(mid, model.ctc_out_mid_b)
                cur = ggml.add(cur, mid)
        if use_feature_concat and concat_result is not None:
            cur = ggml.concat(concat_result, cur, 0)

        # QFormer projector
        window_size = hp.audio_proj_window_size
        if hp.audio_proj_downsample_rate == 0 or hp.audio_proj_head_count == 0 or window_size == 0:
            raise self.abort("granite-speech.cpp divides by the projector's downsample rate, head count and "
                             "window size: a zero crashes it")
        num_queries = window_size // hp.audio_proj_downsample_rate
        proj_n_head = hp.audio_proj_head_count
        proj_d_head = n_embd // proj_n_head
        proj_kq_scale = 1.0 / math.sqrt(proj_d_head) if proj_d_head > 0 else math.inf
        proj_eps = 1e-12
        nblocks_proj = (n_frames + window_size - 1) // window_size
        padded_proj = nblocks_proj * window_size
        if n_frames < padded_proj:
            cur = ggml.pad(cur, 0, padded_proj - n_frames, 0, 0)
        enc_windows = ggml.reshape(cur, proj_input_dim, window_size, nblocks_proj)
        qf = model.qf_proj_blocks[0]
        queries = self.build_norm(qf.qf_proj_query, qf.qf_proj_norm_w, qf.qf_proj_norm_b, NORM_TYPE_NORMAL, proj_eps, -1)
        q_3d = ggml.reshape(queries, n_embd, num_queries, 1)
        q_shape = ggml.new_tensor(ggml.T.F32, n_embd, num_queries, nblocks_proj)
        queries = ggml.repeat(q_3d, q_shape)
        for il, pl in enumerate(qf.qf_proj_layers):
            # self-attention
            Q = ggml.add(self.build_mm(pl.q_w, queries), pl.q_b)
            K = ggml.add(self.build_mm(pl.k_w, queries), pl.k_b)
            V = ggml.add(self.build_mm(pl.v_w, queries), pl.v_b)
            Q = ggml.reshape(Q, proj_d_head, proj_n_head, num_queries, nblocks_proj)
            K = ggml.reshape(K, proj_d_head, proj_n_head, num_queries, nblocks_proj)
            V = ggml.reshape(V, proj_d_head, proj_n_head, num_queries, nblocks_proj)
            sa_out = self.build_attn(pl.o_w, pl.o_b, Q, K, V, None, proj_kq_scale, il)
            sa_out = ggml.reshape(sa_out, n_embd, num_queries, nblocks_proj)
            queries = self.build_norm(ggml.add(sa_out, queries), pl.ln_1_w, pl.ln_1_b, NORM_TYPE_NORMAL, proj_eps, il)
            # cross-attention to the window's frames
            Q = ggml.add(self.build_mm(pl.cross_attn_q_w, queries), pl.cross_attn_q_b)
            K = ggml.add(self.build_mm(pl.cross_attn_k_w, enc_windows), pl.cross_attn_k_b)
            V = ggml.add(self.build_mm(pl.cross_attn_v_w, enc_windows), pl.cross_attn_v_b)
            Q = ggml.reshape(Q, proj_d_head, proj_n_head, num_queries, nblocks_proj)
            K = ggml.reshape(K, proj_d_head, proj_n_head, window_size, nblocks_proj)
            V = ggml.reshape(V, proj_d_head, proj_n_head, window_size, nblocks_proj)
            ca_out = self.build_attn(pl.cross_attn_o_w, pl.cross_attn_o_b, Q, K, V, None, proj_kq_scale, il)
            ca_out = ggml.reshape(ca_out, n_embd, num_queries, nblocks_proj)
            queries = self.build_norm(ggml.add(ca_out, queries), pl.cross_attn_norm_w, pl.cross_attn_norm_b,
                                      NORM_TYPE_NORMAL, proj_eps, il)
            # ffn
            ffn_out = self.build_ffn(queries, pl.ff_up_w, pl.ff_up_b, None, None, pl.ff_down_w, pl.ff_down_b, FFN_GELU, il)
            queries = self.build_norm(ggml.add(ffn_out, queries), pl.ln_2_w, pl.ln_2_b, NORM_TYPE_NORMAL, proj_eps, il)
        cur = ggml.reshape(queries, n_embd, num_queries * nblocks_proj)
        cur = ggml.add(self.build_mm(qf.qf_proj_linear_w, cur), qf.qf_proj_linear_b)
        self.cb(cur, "projector_out", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphGraniteSpeech
