"""tools/mtmd/models/deepseek4v.cpp: clip_graph_deepseek4v (DeepSeek-V4-Flash-Vision): an RMS-norm
ViT with 2D M-RoPE, the aligner (the grid zero-padded to the merge, an unfold as pixtral's im2col
with a dummy kernel, a GELU-erf MLP), then the LLM token block: the sentinel embeddings appended as
rows and everything gathered in the precomputed layout (dsv4_get_block_layout)."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_GELU_ERF, NORM_TYPE_RMS, ClipGraph, _align, set_name
from .qwen2vl import GGML_ROPE_TYPE_VISION


def dsv4_block_n_out(n_llm_w: int, n_llm_h: int, lead_pad: int) -> int:
    """clip-impl.h dsv4_get_block_layout().n_out: [PAD]*lead_pad [START] rows (each with its newline,
    an odd count padded by a row) [PAD]*pad_last [END]"""
    rows = n_llm_h + n_llm_h % 2
    row_len = n_llm_w + 1
    pad_last = (rows // 2 * row_len) % 2 * 2
    return lead_pad + 1 + rows * row_len + pad_last + 1


class ClipGraphDeepseek4v(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp, d_head = self.model, self.hparams, self.d_head
        n_merge, n_embd = hp.n_merge, self.n_embd
        px, py = self.n_patches_x, self.n_patches_y
        positions = ggml.new_tensor(ggml.T.I32, self.n_patches * 4)
        set_name(positions, "positions")
        positions.set_input()
        sections = (d_head // 4, d_head // 4, 0, 0)

        def add_pos(cur, layer):
            return ggml.rope_multi(cur, positions, None, d_head // 2, sections, GGML_ROPE_TYPE_VISION, 0)

        inp = self.build_inp()
        cur = self.build_vit(inp, self.n_patches, NORM_TYPE_RMS, hp.ffn_op, None, add_pos)
        self.cb(cur, "vit_out", -1)

        # the aligner's patch merge: F.unfold as im2col with a dummy kernel, the grid zero-padded
        cur = ggml.reshape(cur, n_embd, px, py)
        cur = ggml.cont(ggml.permute(cur, 2, 0, 1, 3))      # [x, y, n_embd]
        pad_x = (n_merge - px % n_merge) % n_merge
        pad_y = (n_merge - py % n_merge) % n_merge
        if pad_x or pad_y:
            cur = ggml.pad(cur, pad_x, pad_y, 0, 0)
        kernel = ggml.view(cur, (n_merge, n_merge, cur.ne[2]), (0, 0), 0)
        cur = ggml.im2col(kernel, cur, n_merge, n_merge, 0, 0, 1, 1, True, inp.type)
        cur = ggml.reshape(cur, cur.ne[0], cur.ne[1] * cur.ne[2])
        cur = self.build_ffn(cur, model.mm_1_w, model.mm_1_b, None, None, model.mm_2_w, model.mm_2_b, FFN_GELU_ERF, -1)
        self.cb(cur, "aligner_out", -1)

        # the token block: the sentinels as rows n_grid + 0..3, then the layout's gather
        n_embd_out, n_grid = cur.ne[0], cur.ne[1]
        for name, tok in (("v.token_embd.img_start", model.token_embd_img_start),
                          ("v.token_embd.img_end", model.token_embd_img_end),
                          ("v.image_newline", model.image_newline),
                          ("v.token_embd.img_pad", model.token_embd_img_pad)):
            cur = ggml.concat(cur, ggml.reshape(self._weight(tok, name), n_embd_out, 1), 1)
        n_llm_w = _align(px, n_merge) // n_merge
        n_llm_h = _align(py, n_merge) // n_merge
        n_out = dsv4_block_n_out(n_llm_w, n_llm_h, 0)     # the warm-up image has no lead padding
        if n_grid != n_llm_w * n_llm_h:
            raise self.abort("deepseek4v.cpp GGML_ASSERT(n_grid == n_llm_w * n_llm_h)")
        layout_idx = ggml.new_tensor(ggml.T.I32, n_out)
        set_name(layout_idx, "layout_idx")
        layout_idx.set_input()
        cur = ggml.get_rows(cur, layout_idx)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphDeepseek4v
