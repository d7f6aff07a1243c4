"""tools/mtmd/models/pockettts-spkenc.cpp and pockettts-seanet.cpp: clip_graph_pockettts_spkenc, Pocket
TTS's voice-prompt encoder (the audio encoder of a pockettts projector): the raw 24 kHz waveform (a
one-row "mel") through mimi's SEANet encoder (causal convs, T-first [T, C]), its causal transformer
(LayerNorms, NORM rope, layer scales, a GELU FFN), the downsample to 12.5 Hz, then the speaker
projection to the backbone's width. The decoder half of the SEANet helper belongs to the gen-audio
graph, which clip_init never builds."""
from __future__ import annotations

from typing import Optional

from ... import ggml
from ...ggml import Tensor
from ..clip import FFN_GELU, NORM_TYPE_NORMAL, ClipGraph, ClipLayer, ClipSeanetStage


def _div_ceil(a: int, b: int) -> int:
    """pockettts-seanet.cpp div_ceil: a / b + (a % b ? 1 : 0) in C int64 (truncating) arithmetic."""
    q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    return q + (1 if a - q * b else 0)


class ClipGraphPocketttsSpkenc(ClipGraph):
    # --- clip_graph_pockettts_seanet (the encoder path) ---

    def seanet_conv1d(self, x: Tensor, w: Tensor, b: Optional[Tensor], stride: int, dilation: int,
                      pad_replicate: bool = False) -> Tensor:
        """x [T, IC], w [K, IC, OC] -> [T / stride, OC]; causal: the K - stride padding on the left, and
        a trailing pad so the last frame is not dropped (pad_for_conv1d)"""
        k_size = (w.ne[0] - 1) * dilation + 1
        p_total = k_size - stride
        n_frames = _div_ceil(x.ne[0] - k_size + p_total, stride)
        ideal_len = n_frames * stride + k_size - p_total
        p_extra = ideal_len - x.ne[0]
        if pad_replicate and p_total > 0:
            # the resamplers repeat the first frame instead of zero-padding
            first = ggml.view(x, (1, x.ne[1]), (x.nb[1],), 0)
            left = ggml.repeat_4d(first, p_total, x.ne[1], 1, 1)
            x = ggml.concat(left, x, 0)
            x = ggml.pad_ext(x, 0, p_extra, 0, 0, 0, 0, 0, 0)
        else:
            x = ggml.pad_ext(x, p_total, p_extra, 0, 0, 0, 0, 0, 0)
        y = ggml.conv_1d(w, x, stride, 0, dilation)
        y = ggml.reshape(y, y.ne[0], y.ne[1])
        if b is not None:
            y = ggml.add(y, ggml.reshape(b, 1, b.ne[0]))
        return y

    def res_unit(self, x: Tensor, stage: ClipSeanetStage, dilation: int) -> Tensor:
        h = ggml.unary(x, "ELU")
        h = self.seanet_conv1d(h, stage.res_conv1_w, stage.res_conv1_b, 1, dilation)
        h = ggml.unary(h, "ELU")
        h = self.seanet_conv1d(h, stage.res_conv2_w, stage.res_conv2_b, 1, 1)   # pointwise
        return ggml.add(x, h)

    def encode(self, x: Tensor) -> Tensor:
        seanet, hp = self.model.seanet, self.hparams
        cur = self.seanet_conv1d(x, seanet.conv_in_w, seanet.conv_in_b, 1, 1)
        self.cb(cur, "seanet_enc_in", -1)
        for i in range(hp.seanet_n_stage):
            stage = seanet.stages[i]
            cur = self.res_unit(cur, stage, 1)
            cur = ggml.unary(cur, "ELU")
            cur = self.seanet_conv1d(cur, stage.scale_conv_w, stage.scale_conv_b, hp.seanet_ratios[i], 1)
            self.cb(cur, "seanet_enc_stage", i)
        cur = ggml.unary(cur, "ELU")
        cur = self.seanet_conv1d(cur, seanet.conv_out_w, seanet.conv_out_b, 1, 1)
        self.cb(cur, "seanet_enc_out", -1)
        return cur

    # --- clip_graph_pockettts_spkenc ---

    def tfm_layer_forward(self, cur: Tensor, layer: ClipLayer, inp_pos: Tensor, kq_mask: Tensor, il: int) -> Tensor:
        """a pre-norm block with layer scale on both residual paths (mimi_transformer.py)"""
        inp = cur
        cur = self.build_norm(cur, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_NORMAL, self.eps, il)
        q_cur = self.build_mm(layer.q_w, cur)
        k_cur = self.build_mm(layer.k_w, cur)
        v_cur = self.build_mm(layer.v_w, cur)
        n_pos = cur.ne[1]
        q_cur = ggml.reshape(q_cur, self.d_head, self.n_head, n_pos)
        k_cur = ggml.reshape(k_cur, self.d_head, self.n_head, n_pos)
        v_cur = ggml.reshape(v_cur, self.d_head, self.n_head, n_pos)
        q_cur = ggml.rope_ext(q_cur, inp_pos, None, self.d_head, 0, 0)    # GGML_ROPE_TYPE_NORMAL
        k_cur = ggml.rope_ext(k_cur, inp_pos, None, self.d_head, 0, 0)
        cur = self.build_attn(layer.o_w, None, q_cur, k_cur, v_cur, kq_mask, self.kq_scale, il)
        cur = ggml.mul(cur, layer.ls_1_w)
        cur = ggml.add(cur, inp)
        inp = cur
        cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_NORMAL, self.eps, il)
        cur = self.build_ffn(cur, layer.ff_up_w, None, None, None, layer.ff_down_w, None, FFN_GELU, il)
        cur = ggml.mul(cur, layer.ls_2_w)
        return ggml.add(cur, inp)

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        # the preprocessor hands the waveform over as a single-row "mel", [n_samples, 1]
        inp_raw = self.build_inp_raw(1)
        cur = ggml.reshape(inp_raw, inp_raw.ne[0], inp_raw.ne[1])
        cur = self.encode(cur)
        self.cb(cur, "mimi_enc", -1)
        cur = ggml.cont(ggml.transpose(cur))                 # [T, 512] -> [512, T]
        inp_pos = ggml.new_tensor(ggml.T.I32, cur.ne[1])
        self.cb(inp_pos, "inp_pos", -1)
        inp_pos.set_input()
        # causal with a sliding window (_build_attention_mask)
        kq_mask = ggml.new_tensor(ggml.T.F32, cur.ne[1], cur.ne[1])
        self.cb(kq_mask, "kq_mask", -1)
        kq_mask.set_input()
        for il in range(self.n_layer):
            cur = self.tfm_layer_forward(cur, model.layers[il], inp_pos, kq_mask, il)
        self.cb(cur, "mimi_enc_tfm", -1)
        # downsample to the model's frame rate
        cur = ggml.cont(ggml.transpose(cur))
        cur = self.seanet_conv1d(cur, model.downsample_w, None, hp.mimi_downsample, 1, True)
        self.cb(cur, "mimi_downsample", -1)
        cur = ggml.cont(ggml.transpose(cur))
        cur = self.build_mm(model.spk_proj_w, cur)
        self.cb(cur, "spk_proj", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphPocketttsSpkenc
