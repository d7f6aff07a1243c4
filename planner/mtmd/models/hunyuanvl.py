"""tools/mtmd/models/hunyuanvl.cpp: clip_graph_hunyuanvl (HunyuanOCR): a LayerNorm ViT whose
position embeddings are a graph input (interpolated on the CPU), then the perceiver projector: an
RMS norm, a 2x2 stride-2 conv, GELU, a 1x1 conv, an [image_newline] column after each row, the
linear to the text model, [image_begin] / [image_end] around the image, and a final RMS norm."""
from __future__ import annotations

from ... import ggml
from ..clip import NORM_TYPE_NORMAL, NORM_TYPE_RMS, ClipGraph, set_name


class ClipGraphHunyuanvl(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp, n_embd, eps = self.model, self.hparams, self.n_embd, self.eps
        merge, pw, ph = hp.n_merge, self.n_patches_x, self.n_patches_y
        # filled on the CPU by clip_image_batch_encode
        pos_embd = ggml.new_tensor(ggml.T.F32, n_embd, ph * pw)
        set_name(pos_embd, "hunyuanvl_pos_embd")
        pos_embd.set_input()

        inp = self.build_inp()
        cur = self.build_vit(inp, self.n_patches, NORM_TYPE_NORMAL, hp.ffn_op, pos_embd, None)

        # perceiver projector
        cur = self.build_norm(cur, model.mm_pre_norm_w, None, NORM_TYPE_RMS, eps, -1)
        cur = ggml.reshape(cur, n_embd, pw, ph)       # [C, W*H] -> [W, H, C] for conv2d
        cur = ggml.cont(ggml.permute(cur, 2, 0, 1, 3))
        cur = ggml.conv_2d(model.mm_0_w, cur, merge, merge, 0, 0, 1, 1)
        if model.mm_0_b is not None:
            cur = ggml.add(cur, ggml.reshape(model.mm_0_b, 1, 1, model.mm_0_b.ne[0]))
        cur = ggml.unary(cur, "GELU")
        cur = ggml.conv_2d(model.mm_1_w, cur, 1, 1, 0, 0, 1, 1)
        if model.mm_1_b is not None:
            cur = ggml.add(cur, ggml.reshape(model.mm_1_b, 1, 1, model.mm_1_b.ne[0]))
        ow, oh = pw // merge, ph // merge
        idim = cur.ne[2]
        # append newline along W (dim 0)
        nl = ggml.reshape(model.image_newline, 1, 1, idim, 1)
        nl = ggml.repeat_4d(nl, 1, oh, idim, 1)
        cur = ggml.concat(cur, nl, 0)
        cur = ggml.permute(cur, 1, 2, 0, 3)           # [OW+1, OH, OC] -> [OC, (OW+1)*OH]
        cur = ggml.cont(cur, idim, (ow + 1) * oh)
        cur = self.build_mm(model.mm_model_proj, cur)
        if model.mm_model_proj_b is not None:
            cur = ggml.add(cur, model.mm_model_proj_b)
        # wrap with begin/end tokens
        cur = ggml.concat(ggml.reshape(model.mm_img_begin, model.mm_img_begin.ne[0], 1), cur, 1)
        cur = ggml.concat(cur, ggml.reshape(model.mm_img_end, model.mm_img_end.ne[0], 1), 1)
        cur = self.build_norm(cur, model.mm_post_norm_w, None, NORM_TYPE_RMS, eps, -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphHunyuanvl
