"""tools/mtmd/models/dots3note.cpp: clip_graph_dots3note_a (dots3-note's audio encoder): three
stride-2 conv2d (GELU-erf) over the mel frames, conv_out to d_model, an RMS-norm ViT with NEOX rope
on the first half of each head, and the adapter (LayerNorm, GELU-erf MLP)."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_GELU_ERF, NORM_TYPE_NORMAL, NORM_TYPE_RMS, ClipGraph, ClipLayer, set_name

GGML_ROPE_TYPE_NEOX = 2


class ClipGraphDots3noteA(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        inp = self.build_inp_raw(1)

        def conv_block(x: ggml.Tensor, w, b) -> ggml.Tensor:
            x = ggml.conv_2d(self._weight(w, "a.conv2d.N.weight"), x, 2, 2, 1, 1, 1, 1)
            x = ggml.add(x, ggml.reshape(self._weight(b, "a.conv2d.N.bias"), 1, 1, x.ne[2], 1))
            return ggml.unary(x, "GELU_ERF")

        inp = conv_block(inp, model.conv2d_1_w, model.conv2d_1_b)
        inp = conv_block(inp, model.conv2d_2_w, model.conv2d_2_b)
        inp = conv_block(inp, model.conv2d_3_w, model.conv2d_3_b)
        self.cb(inp, "after_conv_stem", -1)
        # [OW, OH, OC] -> [OH*OC, OW]
        inp = ggml.cont(ggml.permute(inp, 2, 0, 1, 3))
        inp = ggml.reshape(inp, inp.ne[0] * inp.ne[1], inp.ne[2])
        inp = ggml.mul_mat(model.conv_out_w, inp)      # to d_model, no bias
        self.cb(inp, "after_conv_out", -1)
        n_pos = inp.ne[1]
        positions = ggml.new_tensor(ggml.T.I32, n_pos)
        set_name(positions, "positions")
        positions.set_input()

        def add_pos(cur: ggml.Tensor, layer: ClipLayer) -> ggml.Tensor:
            # partial rotary: the first half of each head, NEOX style
            return ggml.rope_ext(cur, positions, None, self.d_head // 2, GGML_ROPE_TYPE_NEOX, 0)

        cur = self.build_vit(inp, n_pos, NORM_TYPE_RMS, hp.ffn_op, None, add_pos)
        self.cb(cur, "after_transformer", -1)
        cur = self.build_norm(cur, model.mm_norm_pre_w, model.mm_norm_pre_b, NORM_TYPE_NORMAL, 1e-5, -1)
        cur = self.build_ffn(cur, model.mm_1_w, model.mm_1_b, None, None, model.mm_2_w, model.mm_2_b, FFN_GELU_ERF, -1)
        self.cb(cur, "projected", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphDots3noteA
