"""tools/mtmd/models/qwen3tts-spkenc.cpp: clip_graph_qwen3tts_spkenc, Qwen3-TTS's ECAPA-TDNN speaker
encoder (the audio encoder of a qwen3tts projector): the mel frames through a stem TDNN, three
SE-Res2Net blocks at dilations 2, 3, 4, multi-layer feature aggregation, attentive statistics pooling
and a final 1x1 conv to one speaker embedding. Each conv is conv1d_same: reflect padding, an F32
im2col over a dummy kernel, a matrix product, a bias."""
from __future__ import annotations

from ... import ggml
from ...ggml import Tensor
from ..clip import ClipGraph, ClipLayer

SPK_RES2NET_SCALE = 8          # enc_res2net_scale
SPK_DILATIONS = (2, 3, 4)      # enc_dilations[1..3]


class ClipGraphQwen3ttsSpkenc(ClipGraph):
    def conv1d_same(self, x: Tensor, w: Tensor, b: Tensor, dilation: int) -> Tensor:
        """kernel K, "same" reflect padding, dilation d; x [C, T] -> [OC, T]"""
        k, ic, oc = w.ne[0], w.ne[1], w.ne[2]
        pad = ((k - 1) * dilation) // 2
        # ggml_pad_reflect_1d pads ne[0]: T onto ne[0] first, the layout im2col wants
        x_t = ggml.cont(ggml.transpose(x))                    # [T, IC]
        if pad > 0:
            x_t = ggml.pad_reflect_1d(x_t, pad, pad)          # [T + 2*pad, IC]
        x4d = ggml.reshape(x_t, x_t.ne[0], ic, 1, 1)
        # a dummy F32 kernel (im2col only reads its shape): a leaf of the graph, allocated like one
        dummy = ggml.new_tensor(ggml.T.F32, k, ic, 1, 1)
        col = ggml.im2col(dummy, x4d, 1, 1, 0, 0, dilation, 1, False, ggml.T.F32)
        t_out = col.ne[1]
        col = ggml.reshape(col, k * ic, t_out)
        w2d = ggml.reshape(w, k * ic, oc)
        y = ggml.mul_mat(w2d, col)                             # [OC, T_out]
        ggml.prec_set_acc(y, ggml.PREC_F32)
        b2d = ggml.reshape(b, oc, 1)
        return ggml.add(y, b2d)

    def res2net(self, x: Tensor, layer: ClipLayer, dilation: int, scale: int) -> Tensor:
        """the channels in `scale` chunks, chained dilated conv1d branches; x [C, T] -> [C, T]"""
        c, t = x.ne[0], x.ne[1]
        cs = c // scale
        outs: list[Tensor] = []
        prev = None
        for i in range(scale):
            chunk = ggml.cont(ggml.view(x, (cs, t), (x.nb[1],), i * cs * x.nb[0]))
            if i == 0:
                outs.append(chunk)
                continue
            inp = ggml.add(chunk, prev) if i >= 2 else chunk
            y = self.conv1d_same(inp, layer.res2_conv_w[i - 1], layer.res2_conv_b[i - 1], dilation)
            y = ggml.unary(y, "RELU")
            outs.append(y)
            prev = y
        acc = outs[0]
        for i in range(1, scale):
            acc = ggml.concat(acc, outs[i], 0)
        return acc

    def se_block(self, x: Tensor, layer: ClipLayer) -> Tensor:
        """the squeeze-and-excitation gate; x [C, T] -> [C, T]"""
        x_t = ggml.cont(ggml.transpose(x))                     # [T, C]
        mean = ggml.mean(x_t)                                  # [1, C]
        mean = ggml.cont(ggml.transpose(mean))                 # [C, 1]
        h = self.conv1d_same(mean, layer.se_conv1_w, layer.se_conv1_b, 1)
        h = ggml.unary(h, "RELU")
        h = self.conv1d_same(h, layer.se_conv2_w, layer.se_conv2_b, 1)
        h = ggml.unary(h, "SIGMOID")                           # [C, 1]
        return ggml.mul(x, h)

    def se_res2net_block(self, x: Tensor, layer: ClipLayer, dilation: int, scale: int) -> Tensor:
        """tdnn1, res2net, tdnn2, se, plus the residual"""
        residual = x
        h = self.conv1d_same(x, layer.conv_pw1_w, layer.conv_pw1_b, 1)
        h = ggml.unary(h, "RELU")
        h = self.res2net(h, layer, dilation, scale)
        h = self.conv1d_same(h, layer.conv_pw2_w, layer.conv_pw2_b, 1)
        h = ggml.unary(h, "RELU")
        h = self.se_block(h, layer)
        return ggml.add(h, residual)

    def attentive_stats_pool(self, x: Tensor) -> Tensor:
        """x [C, T] -> [2*C, 1]"""
        model = self.model
        t = x.ne[1]
        x_t = ggml.cont(ggml.transpose(x))
        mean = ggml.mean(x_t)
        mean = ggml.cont(ggml.transpose(mean))
        # std over T: sqrt(clamp(mean((x - mean)^2), eps))
        mean_rep = ggml.repeat(mean, x)
        centered = ggml.sub(x, mean_rep)
        var_t = ggml.cont(ggml.transpose(ggml.sqr(centered)))
        var = ggml.mean(var_t)
        var = ggml.cont(ggml.transpose(var))
        var = ggml.scale_bias(var, 1.0, 1e-12)
        std = ggml.sqrt(var)
        # attention input: cat([x, mean, std]) along the channels -> [3C, T]
        std_rep = ggml.repeat(std, x)
        cat = ggml.concat(x, mean_rep, 0)
        cat = ggml.concat(cat, std_rep, 0)
        a = self.conv1d_same(cat, model.spk_asp_tdnn_w, model.spk_asp_tdnn_b, 1)
        a = ggml.unary(a, "RELU")
        a = ggml.unary(a, "TANH")
        a = self.conv1d_same(a, model.spk_asp_attn_w, model.spk_asp_attn_b, 1)
        # softmax over T
        a_t = ggml.cont(ggml.transpose(a))
        w_t = ggml.soft_max(a_t)
        w = ggml.cont(ggml.transpose(w_t))
        # weighted mean: sum(w * x) over T (ggml_mean's 1/T undone)
        wx = ggml.mul(w, x)
        wx_t = ggml.cont(ggml.transpose(wx))
        w_mean = ggml.mean(wx_t)
        w_mean = ggml.scale(w_mean, float(t))
        w_mean = ggml.cont(ggml.transpose(w_mean))
        # weighted std: sum(w * (x - w_mean)^2) over T
        w_mean_rep = ggml.repeat(w_mean, x)
        dev = ggml.sub(x, w_mean_rep)
        w_var_in = ggml.mul(w, ggml.sqr(dev))
        w_var_t = ggml.cont(ggml.transpose(w_var_in))
        w_var = ggml.mean(w_var_t)
        w_var = ggml.scale(w_var, float(t))
        w_var = ggml.cont(ggml.transpose(w_var))
        w_var = ggml.scale_bias(w_var, 1.0, 1e-12)
        w_std = ggml.sqrt(w_var)
        return ggml.concat(w_mean, w_std, 0)

    def build(self) -> ggml.Cgraph:
        model = self.model
        inp = self.build_inp_raw(1)                            # [T, n_mel], the preprocessor's layout
        inp = ggml.reshape(inp, inp.ne[0], inp.ne[1])
        mel = ggml.cont(ggml.transpose(inp))                   # [n_mel, T]
        self.cb(mel, "mel", -1)
        # the stem TDNN, k=5: n_mel -> 512
        cur = self.conv1d_same(mel, self._weight(model.conv1d_1_w, "a.conv1d.0.weight"), model.conv1d_1_b, 1)
        cur = ggml.unary(cur, "RELU")
        self.cb(cur, "frontend", -1)
        if len(model.layers) != 3:
            raise self.abort("qwen3tts-spkenc.cpp GGML_ASSERT((int) model.layers.size() == 3)")
        blk_out = []
        for il in range(3):
            cur = self.se_res2net_block(cur, model.layers[il], SPK_DILATIONS[il], SPK_RES2NET_SCALE)
            blk_out.append(cur)
            self.cb(cur, "block_out", il)
        # multi-layer feature aggregation
        cat = ggml.concat(blk_out[0], blk_out[1], 0)
        cat = ggml.concat(cat, blk_out[2], 0)
        mfa = self.conv1d_same(cat, model.conv_out_w, model.conv_out_b, 1)
        mfa = ggml.unary(mfa, "RELU")
        self.cb(mfa, "mfa", -1)
        stats = self.attentive_stats_pool(mfa)
        self.cb(stats, "asp", -1)
        emb = self.conv1d_same(stats, model.mm_fc_w, model.mm_fc_b, 1)
        emb = ggml.reshape(emb, emb.ne[0])
        emb = ggml.cont(emb)
        self.cb(emb, "spk_embedding", -1)
        self.expand(emb)
        return self.gf


GRAPH_BUILDER = ClipGraphQwen3ttsSpkenc
