"""tools/mtmd/models/exaone4_5.cpp: clip_graph_exaone4_5 (EXAONE 4.5's vision tower): qwen2vl's
patch embedding and 2x2 order, its own layers: a fused GQA QKV, M-RoPE, window attention between
the full layers of clip.vision.n_wa_pattern, SwiGLU; the merger, and the windows' order restored on
its output."""
from __future__ import annotations

from typing import Optional

from ... import ggml
from ..clip import FFN_GELU, FLASH_ATTN_ENABLED, NORM_TYPE_RMS, set_name
from ...ggml import Tensor
from .qwen2vl import GGML_ROPE_TYPE_VISION, ClipGraphQwen2vl


class ClipGraphExaone45(ClipGraphQwen2vl):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        if model.patch_bias is not None:
            raise self.abort("exaone4_5.cpp GGML_ASSERT(model.patch_bias == nullptr)")
        if model.class_embedding is not None:
            raise self.abort("exaone4_5.cpp GGML_ASSERT(model.class_embedding == nullptr)")
        batch_size = 1
        use_window_attn = hp.n_wa_pattern > 0
        n_wa_pattern = hp.n_wa_pattern
        n_pos = self.n_patches
        n_embd, n_head, d_head, eps = self.n_embd, self.n_head, self.d_head, self.eps
        px, py = self.n_patches_x, self.n_patches_y
        norm_t = NORM_TYPE_RMS
        n_kv_head = hp.n_head_kv if hp.n_head_kv > 0 else n_head
        if n_head % n_kv_head:
            raise self.abort("exaone4_5.cpp GGML_ASSERT(n_head % n_kv_head == 0)")

        inp = self.build_inp_with_temporal_merge()
        inp = self.merge_2x2(ggml.permute(inp, 1, 2, 0, 3), batch_size)
        positions = ggml.new_tensor(ggml.T.I32, n_pos * 4)
        set_name(positions, "positions")
        positions.set_input()
        window_mask: Optional[Tensor] = None
        window_idx: Optional[Tensor] = None
        inv_window_idx: Optional[Tensor] = None
        if use_window_attn:
            window_idx = ggml.new_tensor(ggml.T.I32, n_pos // 4)
            set_name(window_idx, "window_idx")
            window_idx.set_input()
            inv_window_idx = ggml.new_tensor(ggml.T.I32, n_pos // 4)
            set_name(inv_window_idx, "inv_window_idx")
            inv_window_idx.set_input()
            window_mask = ggml.new_tensor(ggml.T.F32, n_pos, n_pos)
            set_name(window_mask, "window_mask")
            window_mask.set_input()
            if self.flash_attn_type == FLASH_ATTN_ENABLED:
                window_mask = ggml.cast(window_mask, ggml.T.F16)
        inpL = inp
        if use_window_attn:
            inpL = ggml.reshape(inpL, n_embd * 4, px * py * batch_size // 4)
            inpL = ggml.get_rows(inpL, inv_window_idx)
            inpL = ggml.reshape(inpL, n_embd, px * py, batch_size)

        sections = (d_head // 4,) * 4
        for il in range(self.n_layer):
            layer = model.layers[il]
            full_attn = (il + 1) % n_wa_pattern == 0 if use_window_attn else True
            cur = self.build_norm(inpL, layer.ln_1_w, layer.ln_1_b, norm_t, eps, il)
            if layer.qkv_w is None:
                raise self.abort("exaone4_5.cpp GGML_ASSERT(layer.qkv_w != nullptr)")
            cur = self.build_mm(layer.qkv_w, cur)
            if layer.qkv_b is not None:
                cur = ggml.add(cur, layer.qkv_b)
            n_embd_kv = d_head * n_kv_head
            row = ggml.row_size(cur.type, d_head)
            Qcur = ggml.view(cur, (d_head, n_head, self.n_patches), (row, cur.nb[1]), 0)
            Kcur = ggml.view(cur, (d_head, n_kv_head, self.n_patches), (row, cur.nb[1]), ggml.row_size(cur.type, n_embd))
            Vcur = ggml.view(cur, (d_head, n_kv_head, self.n_patches), (row, cur.nb[1]),
                             ggml.row_size(cur.type, n_embd + n_embd_kv))
            Qcur = ggml.rope_multi(Qcur, positions, None, d_head // 2, sections, GGML_ROPE_TYPE_VISION, 32768)
            Kcur = ggml.rope_multi(Kcur, positions, None, d_head // 2, sections, GGML_ROPE_TYPE_VISION, 32768)
            cur = self.build_attn(layer.o_w, layer.o_b, Qcur, Kcur, Vcur, None if full_attn else window_mask,
                                  self.kq_scale, il)
            cur = ggml.add(cur, inpL)
            inpL = cur
            cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, norm_t, eps, il)
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, layer.ff_gate_w, layer.ff_gate_b,
                                 layer.ff_down_w, layer.ff_down_b, hp.ffn_op, il)
            inpL = ggml.add(inpL, cur)

        embeddings = self.build_norm(inpL, model.post_ln_w, model.post_ln_b, norm_t, eps, self.n_layer)
        embeddings = ggml.reshape(embeddings, n_embd * 4, n_pos // 4, batch_size)
        embeddings = self.build_ffn(embeddings, model.mm_0_w, model.mm_0_b, None, None, model.mm_1_w, model.mm_1_b,
                                    FFN_GELU, -1)
        if use_window_attn:
            embeddings = ggml.reshape(embeddings, hp.projection_dim, px * py // 4)
            embeddings = ggml.get_rows(embeddings, window_idx)
            embeddings = ggml.reshape(embeddings, hp.projection_dim, px * py // 4, batch_size)
        self.expand(embeddings)
        return self.gf


GRAPH_BUILDER = ClipGraphExaone45
