"""tools/mtmd/models/youtuvl.cpp: clip_graph_youtuvl (Youtu-VL): SigLIP2's patch linear over the
image cut into 2x2-merge-ordered patches, its own LayerNorm layers with M-RoPE and window attention
outside the full-attention layers (clip.vision.wa_layer_indexes, windows reordered by
inv_window_idx / window_idx), the post-layernorm, then the merger: an RMS norm, 2x2 patches side by
side, a GELU MLP."""
from __future__ import annotations

from typing import Optional

from ... import ggml
from ..clip import FFN_GELU, FLASH_ATTN_ENABLED, NORM_TYPE_NORMAL, NORM_TYPE_RMS, ClipGraph, set_name
from ...ggml import Tensor
from .qwen2vl import GGML_ROPE_TYPE_VISION


class ClipGraphYoutuvl(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        if model.class_embedding is not None:
            raise self.abort("youtuvl.cpp GGML_ASSERT(model.class_embedding == nullptr)")
        batch_size = 1
        use_window_attn = bool(hp.wa_layer_indexes)
        n_pos = self.n_patches
        m, p = 2, self.patch_size
        Wp, Hp = self.n_patches_x, self.n_patches_y
        Hm, Wm = Hp // m, Wp // m
        n_embd, eps, d_head, n_head = self.n_embd, self.eps, self.d_head, self.n_head
        norm_t = NORM_TYPE_NORMAL

        inp = self.build_inp_raw()
        # the conv3d as a linear: (patch_size, m, Wm, patch_size, m, Hm, C) -> (C, patch_size, patch_size, m, m, Wm, Hm)
        inp = ggml.reshape(inp, Wm * m * p, m * p, Hm, 3)
        inp = ggml.permute(inp, 1, 2, 3, 0)
        inp = ggml.cont(inp, m * p * 3, Wm, m * p, Hm)
        inp = ggml.permute(inp, 0, 2, 1, 3)
        inp = ggml.cont(inp, m * p * 3, p, m, Hm * Wm)
        inp = ggml.permute(inp, 1, 0, 2, 3)
        inp = ggml.cont(inp, p, 3, p, Hm * Wm * m * m)
        inp = ggml.permute(inp, 2, 0, 1, 3)
        inp = ggml.cont(inp, 3 * p * p, Hm * Wm * m * m, 1)
        inp = self.build_mm(self._weight(model.patch_embeddings_0, "v.patch_embd.weight"), inp)
        if model.patch_bias is not None:
            inp = ggml.add(inp, model.patch_bias)
        inp = ggml.reshape(inp, n_embd, self.n_patches)

        inpL = inp
        window_mask: Optional[Tensor] = None
        positions = ggml.new_tensor(ggml.T.I32, n_pos * 4)
        set_name(positions, "positions")
        positions.set_input()
        if model.pre_ln_w is not None:
            inpL = self.build_norm(inpL, model.pre_ln_w, model.pre_ln_b, norm_t, eps, -1)
        if use_window_attn:
            inv_window_idx = ggml.new_tensor(ggml.T.I32, n_pos // 4)
            set_name(inv_window_idx, "inv_window_idx")
            inv_window_idx.set_input()
            window_mask = ggml.new_tensor(ggml.T.F32, n_pos, n_pos)
            set_name(window_mask, "window_mask")
            window_mask.set_input()
            if self.flash_attn_type == FLASH_ATTN_ENABLED:
                window_mask = ggml.cast(window_mask, ggml.T.F16)
            inpL = ggml.reshape(inpL, n_embd * 4, Wp * Hp * batch_size // 4)
            inpL = ggml.get_rows(inpL, inv_window_idx)
            inpL = ggml.reshape(inpL, n_embd, Wp * Hp, batch_size)

        sections = (d_head // 4,) * 4
        for il in range(self.n_layer):
            layer = model.layers[il]
            full_attn = il in hp.wa_layer_indexes if use_window_attn else True
            cur = self.build_norm(inpL, layer.ln_1_w, layer.ln_1_b, norm_t, eps, il)
            Qcur = ggml.add(self.build_mm(layer.q_w, cur), layer.q_b)
            Kcur = ggml.add(self.build_mm(layer.k_w, cur), layer.k_b)
            Vcur = ggml.add(self.build_mm(layer.v_w, cur), layer.v_b)
            Qcur = ggml.reshape(Qcur, d_head, n_head, self.n_patches)
            Kcur = ggml.reshape(Kcur, d_head, n_head, self.n_patches)
            Vcur = ggml.reshape(Vcur, d_head, n_head, self.n_patches)
            Qcur = ggml.rope_multi(Qcur, positions, None, d_head // 2, sections, GGML_ROPE_TYPE_VISION, 32768)
            Kcur = ggml.rope_multi(Kcur, positions, None, d_head // 2, sections, GGML_ROPE_TYPE_VISION, 32768)
            cur = self.build_attn(layer.o_w, layer.o_b, Qcur, Kcur, Vcur, None if full_attn else window_mask,
                                  self.kq_scale, il)
            cur = ggml.add(cur, inpL)
            inpL = cur
            cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, norm_t, eps, il)
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, None, None, layer.ff_down_w, layer.ff_down_b,
                                 hp.ffn_op, il)
            inpL = ggml.add(inpL, cur)

        embeddings = inpL
        if use_window_attn:
            spatial_merge_unit = 4
            window_idx = ggml.new_tensor(ggml.T.I32, n_pos // spatial_merge_unit)
            set_name(window_idx, "window_idx")
            window_idx.set_input()
            embeddings = ggml.reshape(embeddings, n_embd * spatial_merge_unit, self.n_patches // spatial_merge_unit)
            embeddings = ggml.get_rows(embeddings, window_idx)
            embeddings = ggml.reshape(embeddings, n_embd, self.n_patches, batch_size)
            self.cb(embeddings, "window_order_restored", -1)
        if model.post_ln_w is not None:
            embeddings = self.build_norm(embeddings, model.post_ln_w, model.post_ln_b, norm_t, eps, self.n_layer)
        # the merger (VLPatchMerger): ln_q, 2x2 patches side by side, the MLP
        embeddings = self.build_norm(embeddings, model.mm_input_norm_w, None, NORM_TYPE_RMS, 1e-6, -1)
        embeddings = ggml.reshape(embeddings, n_embd * 4, n_pos // 4, batch_size)
        embeddings = self.build_ffn(embeddings, model.mm_0_w, model.mm_0_b, None, None, model.mm_1_w, model.mm_1_b,
                                    FFN_GELU, -1)
        self.expand(embeddings)
        return self.gf


GRAPH_BUILDER = ClipGraphYoutuvl
