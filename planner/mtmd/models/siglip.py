"""tools/mtmd/models/siglip.cpp: clip_graph_siglip, a SigLIP ViT and the projectors of Gemma 3
(average-pooled patches, RMS norm, input projection), Idefics3 / SmolVLM (pixel shuffle, one
matrix), LFM2-VL (SigLIP2 NaFlex positions interpolated to the image, pixel shuffle, optional
LayerNorm, a GELU MLP), Janus-Pro (an MLP) and Phi-4 vision (interpolated positions, a GELU MLP)."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_GELU, NORM_TYPE_NORMAL, ClipGraph


class ClipGraphSiglip(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        inp = self.build_inp()
        learned_pos_embd = model.position_embeddings
        if self.proj_type in ("lfm2", "phi4"):
            learned_pos_embd = self.resize_position_embeddings()
        cur = self.build_vit(inp, self.n_patches, NORM_TYPE_NORMAL, hp.ffn_op, learned_pos_embd, None)
        if self.proj_type == "gemma3":
            batch_size = 1
            if self.n_patches_x != self.n_patches_y:
                raise self.abort("siglip.cpp GGML_ASSERT(n_patches_x == n_patches_y)")
            patches_per_image = self.n_patches_x
            kernel_size = hp.n_merge
            cur = ggml.transpose(cur)
            cur = ggml.cont(cur, patches_per_image, patches_per_image, self.n_embd, batch_size)
            # a 2d average pool to reduce the number of output tokens
            cur = ggml.pool_2d(cur, ggml.POOL_AVG, kernel_size, kernel_size, kernel_size, kernel_size, 0, 0)
            cur = ggml.reshape(cur, cur.ne[0] * cur.ne[0], self.n_embd, batch_size)
            cur = ggml.cont(ggml.transpose(cur))
            # norm before the projection
            cur = ggml.rms_norm(cur, self.eps)
            cur = ggml.mul(cur, model.mm_soft_emb_norm_w)
            cur = ggml.mul_mat(ggml.cont(ggml.transpose(model.mm_input_proj_w)), cur)
        elif self.proj_type == "idefics3":
            cur = self.build_patch_merge_permute(cur, hp.n_merge)
            cur = self.build_mm(model.mm_fc_w, cur)
        elif self.proj_type == "lfm2":
            cur = self.build_patch_merge_permute(cur, hp.n_merge)
            if model.mm_input_norm_w is not None:     # the input norm is optional in LFM2-VL
                cur = ggml.norm(cur, 1e-5)             # nn.LayerNorm's default eps
                cur = ggml.mul(cur, model.mm_input_norm_w)
            if model.mm_input_norm_b is not None:
                cur = ggml.add(cur, model.mm_input_norm_b)
            cur = self.build_ffn(cur, model.mm_1_w, model.mm_1_b, None, None, model.mm_2_w, model.mm_2_b, FFN_GELU, -1)
        elif self.proj_type == "janus_pro":
            cur = self.build_ffn(cur, model.mm_0_w, model.mm_0_b, None, None, model.mm_1_w, model.mm_1_b, hp.ffn_op, -1)
        elif self.proj_type == "phi4":
            cur = self.build_ffn(cur, model.mm_0_w, model.mm_0_b, None, None, model.mm_2_w, model.mm_2_b, FFN_GELU, -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphSiglip
