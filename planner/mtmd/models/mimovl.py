"""tools/mtmd/models/mimovl.cpp: clip_graph_mimovl (MiMo-V2.5's vision tower): a Qwen2.5-VL-shaped
ViT with GQA (head_dim from the fused QKV rows), RMS norms, 2D M-RoPE, per-layer window modes
(clip.vision.wa_pattern_mode: -1 full, 0 row windows, 1 column windows with the merge units
reordered on entry and back on exit) with a banded mask and attention sinks on windowed layers, a
SwiGLU FFN with biases, the post-LayerNorm and a GELU merger over 2x2 units; its matrix products
accumulate in F32."""
from __future__ import annotations

import math

from ... import ggml
from ..clip import FFN_GELU, FLASH_ATTN_ENABLED, NORM_TYPE_NORMAL, NORM_TYPE_RMS, ClipGraph, set_name
from ...ggml import Tensor
from .qwen2vl import GGML_ROPE_TYPE_VISION


class ClipGraphMimovl(ClipGraph):
    def build_mm(self, w: Tensor, x: Tensor) -> Tensor:
        cur = ggml.mul_mat(w, x)
        ggml.prec_set_acc(cur, ggml.PREC_F32)
        return cur

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        n_head, n_embd, eps = self.n_head, self.n_embd, self.eps
        for ok, what in ((model.patch_embeddings_0 is not None, "model.patch_embeddings_0 != nullptr"),
                         (model.patch_embeddings_1 is not None, "model.patch_embeddings_1 != nullptr"),
                         (model.class_embedding is None, "model.class_embedding == nullptr"),
                         (hp.n_head_kv > 0, "hparams.n_head_kv > 0"),
                         (hp.n_head_kv > 0 and n_head % hp.n_head_kv == 0, "n_head % hparams.n_head_kv == 0"),
                         (len(hp.wa_pattern_mode) == self.n_layer, "wa_pattern_mode.size() == n_layer")):
            if not ok:
                raise self.abort(f"mimovl.cpp GGML_ASSERT({what})")
        batch_size = 1
        n_pos = self.n_patches
        n_head_kv = hp.n_head_kv
        merge = hp.n_merge if hp.n_merge > 0 else 2
        merge_unit = merge * merge
        n_units = n_pos // merge_unit
        if n_units * merge_unit != n_pos:
            raise self.abort("mimovl.cpp GGML_ASSERT(n_units * merge_unit == n_pos)")
        # head_dim from the fused QKV rows: (n_head + 2 n_head_kv) head_dim (not n_embd / n_head)
        if not model.layers or model.layers[0].qkv_w is None:
            raise self.abort("mimovl.cpp GGML_ASSERT(model.layers[0].qkv_w != nullptr)")
        qkv_rows = model.layers[0].qkv_w.ne[1]
        head_dim = qkv_rows // (n_head + 2 * n_head_kv)
        if head_dim * (n_head + 2 * n_head_kv) != qkv_rows:
            raise self.abort("mimovl.cpp GGML_ASSERT(head_dim * (n_head + 2 * n_head_kv) == qkv_rows)")
        attn_scale = 1.0 / math.sqrt(head_dim) if head_dim > 0 else math.inf
        rope_n_dims = head_dim // 2
        sections = (rope_n_dims // 2, rope_n_dims // 2, 0, 0)

        # the Conv3D (kt = 2) as two Conv2D, then the merge tiles' token order
        p = self.patch_size
        inp_raw = self.build_inp_raw()
        inp = ggml.conv_2d(model.patch_embeddings_0, inp_raw, p, p, 0, 0, 1, 1)
        inp = ggml.add(inp, ggml.conv_2d(model.patch_embeddings_1, inp_raw, p, p, 0, 0, 1, 1))
        if self.nx % (p * 2) or self.ny % (p * 2):
            raise self.abort("mimovl.cpp GGML_ASSERT(img.nx() % (patch_size * 2) == 0)")
        px, py = self.n_patches_x, self.n_patches_y
        inp = ggml.permute(inp, 1, 2, 0, 3)
        inp = ggml.cont(inp, n_embd * 2, px // 2, py, batch_size)
        inp = ggml.reshape(inp, n_embd * 2, px // 2, 2, batch_size * (py // 2))
        inp = ggml.permute(inp, 0, 2, 1, 3)
        inp = ggml.cont(inp, n_embd, px * py, batch_size)
        self.cb(inp, "patch_embed", -1)

        positions_row = ggml.new_tensor(ggml.T.I32, n_pos * 4)
        set_name(positions_row, "mimovl_positions_row")
        positions_row.set_input()
        positions_col = ggml.new_tensor(ggml.T.I32, n_pos * 4)
        set_name(positions_col, "mimovl_positions_col")
        positions_col.set_input()
        # the column-major permutation as F32, its inverse by argsort
        idx_col_f = ggml.new_tensor(ggml.T.F32, n_units)
        set_name(idx_col_f, "mimovl_idx_col")
        idx_col_f.set_input()
        idx_col = ggml.cast(idx_col_f, ggml.T.I32)
        idx_col_inv = ggml.argsort(idx_col_f, ggml.SORT_ORDER_ASC)
        window_mask = ggml.new_tensor(ggml.T.F32, n_pos, n_pos)
        set_name(window_mask, "mimovl_window_mask")
        window_mask.set_input()
        window_mask_attn = ggml.cast(window_mask, ggml.T.F16) if self.flash_attn_type == FLASH_ATTN_ENABLED else window_mask

        def reorder(x: Tensor, idx: Tensor) -> Tensor:
            y = ggml.reshape(x, n_embd * merge_unit, n_units)
            y = ggml.get_rows(y, idx)
            return ggml.reshape(y, n_embd, n_pos, batch_size)

        inpL = inp
        prev_mode = -1
        for il in range(self.n_layer):
            layer = model.layers[il]
            mode = hp.wa_pattern_mode[il]
            is_full, is_col = mode == -1, mode == 1
            if is_col and prev_mode != 1:
                inpL = reorder(inpL, idx_col)
            elif not is_col and prev_mode == 1:
                inpL = reorder(inpL, idx_col_inv)
            cur = self.build_norm(inpL, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_RMS, eps, il)
            qkv = ggml.add(self.build_mm(layer.qkv_w, cur), layer.qkv_b)
            row = ggml.row_size(qkv.type, head_dim)
            off_k = ggml.row_size(qkv.type, n_head * head_dim)
            off_v = ggml.row_size(qkv.type, (n_head + n_head_kv) * head_dim)
            Qcur = ggml.view(qkv, (head_dim, n_head, n_pos), (row, qkv.nb[1]), 0)
            Kcur = ggml.view(qkv, (head_dim, n_head_kv, n_pos), (row, qkv.nb[1]), off_k)
            Vcur = ggml.view(qkv, (head_dim, n_head_kv, n_pos), (row, qkv.nb[1]), off_v)
            pos = positions_col if is_col else positions_row
            Qcur = ggml.rope_multi(Qcur, pos, None, rope_n_dims, sections, GGML_ROPE_TYPE_VISION, 32768)
            Kcur = ggml.rope_multi(Kcur, pos, None, rope_n_dims, sections, GGML_ROPE_TYPE_VISION, 32768)
            # windowed layers: the banded mask and the per-head sinks
            if not is_full and layer.attn_sinks is None:
                raise self.abort("mimovl.cpp GGML_ASSERT(layer.attn_sinks != nullptr)")
            attn_out = self.build_attn(layer.o_w, layer.o_b, Qcur, Kcur, Vcur, None if is_full else window_mask_attn,
                                       attn_scale, il, None if is_full else layer.attn_sinks)
            cur = ggml.add(attn_out, inpL)
            inpL = cur
            cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_RMS, eps, il)
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, layer.ff_gate_w, layer.ff_gate_b,
                                 layer.ff_down_w, layer.ff_down_b, hp.ffn_op, il)
            inpL = ggml.add(inpL, cur)
            prev_mode = mode
        if prev_mode == 1:       # the merger reads row order
            inpL = reorder(inpL, idx_col_inv)

        inpL = self.build_norm(inpL, model.post_ln_w, model.post_ln_b, NORM_TYPE_NORMAL, 1e-6, self.n_layer)
        embeddings = ggml.reshape(inpL, n_embd * merge_unit, n_units, batch_size)
        embeddings = self.build_ffn(embeddings, model.mm_0_w, None, None, None, model.mm_1_w, None, FFN_GELU, -1)
        self.expand(embeddings)
        return self.gf


GRAPH_BUILDER = ClipGraphMimovl
