"""tools/mtmd/models/deepseekocr2.cpp: clip_graph_deepseekocr2 (DeepSeek-OCR 2): deepseekocr.cpp's
SAM, then a Qwen2 encoder (GQA, RMS norms, SwiGLU, NEOX rope) over SAM's tokens followed by the
learned queries of their count (16x16: the 1024 queries), whose outputs go through the projector."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_SILU, NORM_TYPE_RMS, BuildVitOpts, set_name
from .deepseekocr import ClipGraphDeepseekocr

GGML_ROPE_TYPE_NEOX = 2


class ClipGraphDeepseekocr2(ClipGraphDeepseekocr):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        if hp.n_head_kv <= 0:
            raise self.abort("deepseekocr2.cpp GGML_ASSERT(hparams.n_head_kv > 0)")
        if self.n_head % hp.n_head_kv:
            raise self.abort("deepseekocr2.cpp GGML_ASSERT(n_head % hparams.n_head_kv == 0)")
        inp_raw = self.build_inp_raw()
        sam_out = self.build_sam(inp_raw)

        # the Qwen2 encoder: [C, H*W, B], then the queries
        inp = ggml.reshape(sam_out, sam_out.ne[0] * sam_out.ne[1], sam_out.ne[2], sam_out.ne[3])
        inp = ggml.cont(ggml.permute(inp, 1, 0, 2, 3))
        num_image_tokens = inp.ne[1]
        if num_image_tokens not in (144, 256):
            raise self.abort(f"deepseekocr2.cpp GGML_ASSERT(num_image_tokens == 144 || num_image_tokens == 256): "
                             f"{num_image_tokens}")
        # 16x16 -> query_1024 (1024x1024 images), 12x12 -> query_768 (768x768 images)
        query_embed, num_queries = model.resample_query_1024, 256
        if num_image_tokens == 144:
            query_embed, num_queries = model.resample_query_768, 144
        query_embed = ggml.cast(self._weight(query_embed, f"v.resample_query_{1024 if num_queries == 256 else 768}.weight"),
                                inp.type)
        query_embed = ggml.repeat_4d(query_embed, query_embed.ne[0], num_queries, inp.ne[2], 1)
        inp = ggml.concat(inp, query_embed, 1)
        seq_len = inp.ne[1]
        attn_mask = ggml.new_tensor(ggml.T.F32, seq_len, seq_len)
        set_name(attn_mask, "qwen2_attn_mask")
        attn_mask.set_input()
        inp_pos = ggml.cast(ggml.arange(0, seq_len, 1), ggml.T.I32)
        d_head = self.d_head

        def add_rope(x, layer):
            return ggml.rope_ext(x, inp_pos, None, d_head, GGML_ROPE_TYPE_NEOX, 131072)

        # build_vit applies the final norm (post_ln) itself
        cur = self.build_vit(inp, seq_len, NORM_TYPE_RMS, FFN_SILU, None, add_rope, BuildVitOpts(attn_mask=attn_mask))
        # the query tokens only
        cur = ggml.cont(ggml.view(cur, (cur.ne[0], num_queries, cur.ne[2]), (cur.nb[1], cur.nb[2]),
                                  cur.nb[1] * (cur.ne[1] - num_queries)))
        self.expand(cur)
        cur = ggml.mul_mat(model.mm_fc_w, cur)
        cur = ggml.add(cur, model.mm_fc_b)
        self.expand(cur)      # the view separator follows the overview only, not the warm-up's row
        return self.gf


GRAPH_BUILDER = ClipGraphDeepseekocr2
