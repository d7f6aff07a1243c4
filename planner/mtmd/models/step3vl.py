"""tools/mtmd/models/step3vl.cpp: clip_graph_step3vl (Step3-VL): an OpenCLIP ViT (interpolated learned
positions, 2D rope, layer scales), two stride-2 3x3 conv downsamplers with per-channel biases, and
the projection."""
from __future__ import annotations

from typing import Optional

from ... import ggml
from ...ggml import Tensor
from ..clip import NORM_TYPE_NORMAL, ClipGraph, set_name


class ClipGraphStep3vl(ClipGraph):
    def add_spatial_bias(self, cur: Tensor, bias: Optional[Tensor]) -> Tensor:
        if bias is None:
            return cur
        width, height, channels = cur.ne[0], cur.ne[1], cur.ne[2]
        cur = ggml.reshape(cur, width * height, channels)
        cur = ggml.cont(ggml.transpose(cur))
        cur = ggml.add(cur, bias)
        cur = ggml.cont(ggml.transpose(cur))
        return ggml.reshape(cur, width, height, channels)

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        if model.class_embedding is not None:
            raise self.abort("step3vl.cpp GGML_ASSERT(model.class_embedding == nullptr)")
        if model.patch_embeddings_0 is None:
            raise self.abort("step3vl.cpp GGML_ASSERT(model.patch_embeddings_0 != nullptr)")
        if model.position_embeddings is None:
            raise self.abort("step3vl.cpp GGML_ASSERT(model.position_embeddings != nullptr)")
        pos_h = ggml.new_tensor(ggml.T.I32, self.n_patches)
        set_name(pos_h, "pos_h")
        pos_h.set_input()
        pos_w = ggml.new_tensor(ggml.T.I32, self.n_patches)
        set_name(pos_w, "pos_w")
        pos_w.set_input()
        inp = self.build_inp()
        learned_pos_embd = self.resize_position_embeddings()
        cur = self.build_vit(inp, self.n_patches, NORM_TYPE_NORMAL, hp.ffn_op, learned_pos_embd,
                             lambda t, layer: self.build_rope_2d(t, pos_w, pos_h, hp.rope_theta, False))
        self.cb(cur, "vit_out", -1)
        # [n_embd, n_patches] -> [w, h, n_embd] for the downsampling convolutions
        cur = ggml.permute(cur, 1, 0, 2, 3)
        cur = ggml.cont(cur, self.n_patches_x, self.n_patches_y, self.n_embd)
        cur = ggml.conv_2d(self._weight(model.mm_0_w, "mm.0.weight"), cur, 2, 2, 1, 1, 1, 1)
        cur = self.add_spatial_bias(cur, model.mm_0_b)
        self.cb(cur, "downsample_0", -1)
        cur = ggml.conv_2d(self._weight(model.mm_1_w, "mm.1.weight"), cur, 2, 2, 1, 1, 1, 1)
        cur = self.add_spatial_bias(cur, model.mm_1_b)
        self.cb(cur, "downsample_1", -1)
        w, h = cur.ne[0], cur.ne[1]
        cur = ggml.reshape(cur, w * h, cur.ne[2], cur.ne[3])
        cur = ggml.cont(ggml.permute(cur, 1, 0, 2, 3))
        self.cb(cur, "downsample_flatten", -1)
        cur = ggml.mul_mat(model.mm_model_proj, cur)
        self.cb(cur, "projector_out", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphStep3vl
