"""tools/mtmd/models/ling3vl.cpp: clip_graph_ling3vl (Ling-3.0 VL): Qwen3-VL's vision tower (temporal
patch, 2x2 merge, interpolated positions, M-RoPE) through clip_graph's build_vit, a norm-only merger
(LayerNorm per patch before the merge) and the top-level GELU MLP."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_GELU, NORM_TYPE_NORMAL, set_name
from .qwen3vl import ClipGraphQwen3vl


class ClipGraphLing3vl(ClipGraphQwen3vl):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        if model.class_embedding is not None:
            raise self.abort("ling3vl.cpp GGML_ASSERT(model.class_embedding == nullptr)")
        if model.mm_input_norm_w is None:
            raise self.abort("ling3vl.cpp GGML_ASSERT(model.mm_input_norm_w != nullptr)")
        batch_size = 1
        n_pos = self.n_patches
        norm_t = NORM_TYPE_NORMAL
        inp = self.build_inp_with_temporal_merge()
        inp = self.merge_2x2(ggml.permute(inp, 1, 2, 0, 3), batch_size)     # the spatial merge
        if model.patch_bias is not None:
            inp = ggml.add(inp, model.patch_bias)
            self.cb(inp, "patch_bias", -1)
        learned_pos_embd = self.resize_position_embeddings(ggml.SCALE_MODE_BILINEAR | ggml.SCALE_FLAG_ALIGN_CORNERS)
        learned_pos_embd = self.merge_2x2(learned_pos_embd, batch_size)
        positions = ggml.new_tensor(ggml.T.I32, n_pos * 4)     # M-RoPE: 4 per position
        set_name(positions, "positions")
        positions.set_input()
        inpL = self.build_vit(inp, n_pos, norm_t, hp.ffn_op, learned_pos_embd, lambda c, layer: self.rope(c, positions))
        # the per-patch merger norm, before the 2x2 merge
        embeddings = self.build_norm(inpL, model.mm_input_norm_w, model.mm_input_norm_b, norm_t, self.eps, -1)
        self.cb(embeddings, "merger_norm", -1)
        embeddings = ggml.reshape(embeddings, self.n_embd * 4, n_pos // 4, batch_size)
        embeddings = self.build_ffn(embeddings, model.mm_0_w, model.mm_0_b, None, None, model.mm_1_w, model.mm_1_b,
                                    FFN_GELU, -1)
        self.expand(embeddings)
        return self.gf


GRAPH_BUILDER = ClipGraphLing3vl
