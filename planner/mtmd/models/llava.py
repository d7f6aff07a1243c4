"""tools/mtmd/models/llava.cpp: clip_graph_llava, the CLIP ViT of LLaVA-style projectors (its own layer
loop: the feature-layer stack, and LLaVA drops the last layer) and their projectors: LLaVA's MLP
(mlp), Yi-VL's MLP with LayerNorms (mlp_norm), MobileVLM's LDP (two MobileNetV3 inverted residual
blocks: depthwise convs, squeeze-excite, hardswish) and MobileVLM V2's LDPv2 (an average pool and a
depthwise positional conv); GLM-Edge's adapter (adapter) shares the ViT."""
from __future__ import annotations

import math
from typing import Optional

from ... import ggml
from ...ggml import Tensor
from ..clip import NORM_TYPE_NORMAL, ClipGraph, set_name


class ClipGraphLlava(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        eps = self.eps
        n_pos = self.n_patches + (1 if model.class_embedding is not None else 0)
        if self.n_patches_x != self.n_patches_y:
            raise self.abort("llava.cpp GGML_ASSERT(n_patches_x == n_patches_y && \"only square images supported\")")

        # the deepest feature layer: LLaVA's default is the second to last layer
        il_last = hp.n_layer - 1
        if self.proj_type == "adapter":     # GLM-Edge keeps every layer
            il_last += 1
        deepest_feature_layer = max([-1, *hp.feature_layers])
        max_feature_layer = il_last if deepest_feature_layer < 0 else deepest_feature_layer

        inp = self.build_inp()
        if model.class_embedding is not None:
            inp = ggml.concat(inp, model.class_embedding, 1)
        positions = ggml.new_tensor(ggml.T.I32, n_pos)
        set_name(positions, "positions")
        positions.set_input()
        inp = ggml.add(inp, ggml.get_rows(self._weight(model.position_embeddings, "v.position_embd.weight"), positions))
        inpL = inp
        if model.pre_ln_w is not None:
            inpL = self.build_norm(inpL, model.pre_ln_w, model.pre_ln_b, NORM_TYPE_NORMAL, eps, -1)
            self.cb(inpL, "pre_ln", -1)

        embedding_stack: list[Tensor] = []
        for il in range(max_feature_layer):
            layer = model.layers[il]
            cur = inpL
            if hp.is_feature_layer(il):
                embedding_stack.append(cur)
            cur = self.build_norm(cur, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_NORMAL, eps, il)
            self.cb(cur, "layer_inp_normed", il)
            Qcur = self.build_mm(layer.q_w, cur)
            if layer.q_b is not None:
                Qcur = ggml.add(Qcur, layer.q_b)
            Kcur = self.build_mm(layer.k_w, cur)
            if layer.k_b is not None:
                Kcur = ggml.add(Kcur, layer.k_b)
            Vcur = self.build_mm(layer.v_w, cur)
            if layer.v_b is not None:
                Vcur = ggml.add(Vcur, layer.v_b)
            Qcur = ggml.reshape(Qcur, self.d_head, self.n_head, n_pos)
            Kcur = ggml.reshape(Kcur, self.d_head, self.n_head, n_pos)
            Vcur = ggml.reshape(Vcur, self.d_head, self.n_head, n_pos)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)
            cur = self.build_attn(layer.o_w, layer.o_b, Qcur, Kcur, Vcur, None, self.kq_scale, il)
            self.cb(cur, "attn_out", il)
            cur = ggml.add(cur, inpL)
            inpL = cur
            self.cb(cur, "ffn_inp", il)
            cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_NORMAL, eps, il)
            self.cb(cur, "ffn_inp_normed", il)
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, layer.ff_gate_w, layer.ff_gate_b,
                                 layer.ff_down_w, layer.ff_down_b, hp.ffn_op, il)
            self.cb(cur, "ffn_out", il)
            cur = ggml.add(inpL, cur)
            self.cb(cur, "layer_out", il)
            inpL = cur

        if model.post_ln_w is not None:
            inpL = self.build_norm(inpL, model.post_ln_w, model.post_ln_b, NORM_TYPE_NORMAL, eps, -1)
        embeddings = inpL
        # the vision feature layers (granite)
        if hp.is_feature_layer(max_feature_layer):
            embedding_stack.append(inpL)
        if embedding_stack:
            embeddings = embedding_stack[0]
            for t in embedding_stack[1:]:
                embeddings = ggml.concat(embeddings, t, 0)

        if hp.has_llava_projector:
            embeddings = ggml.reshape(embeddings, embeddings.ne[0], embeddings.ne[1])
            patches = ggml.new_tensor(ggml.T.I32, self.n_patches)
            set_name(patches, "patches")
            patches.set_input()
            embeddings = ggml.get_rows(embeddings, patches)
            if self.proj_type == "mlp":
                embeddings = ggml.add(self.build_mm(model.mm_0_w, embeddings), model.mm_0_b)
                embeddings = ggml.unary(embeddings, "GELU")
                if model.mm_2_w is not None:
                    embeddings = ggml.add(self.build_mm(model.mm_2_w, embeddings), model.mm_2_b)
            elif self.proj_type == "mlp_norm":
                embeddings = ggml.add(self.build_mm(model.mm_0_w, embeddings), model.mm_0_b)
                embeddings = ggml.norm(embeddings, eps)
                embeddings = ggml.add(ggml.mul(embeddings, model.mm_1_w), model.mm_1_b)
                embeddings = ggml.unary(embeddings, "GELU")
                embeddings = ggml.add(self.build_mm(model.mm_3_w, embeddings), model.mm_3_b)
                embeddings = ggml.norm(embeddings, eps)
                embeddings = ggml.add(ggml.mul(embeddings, model.mm_4_w), model.mm_4_b)
            elif self.proj_type == "ldp":
                embeddings = self.build_ldp(embeddings)
            elif self.proj_type == "ldpv2":
                embeddings = self.build_ldpv2(embeddings)
        elif self.proj_type == "adapter":
            embeddings = self.build_glm_edge(embeddings)
        self.expand(embeddings)
        return self.gf

    def build_ldp_block(self, x: Tensor, blk: int, stride: int, residual: Optional[Tensor]) -> Tensor:
        """One of LDP's inverted residual blocks over [w, h, C]: the depthwise conv, LayerNorm,
        hardswish, squeeze-excite (global average pool, fc1, ReLU, fc2, hardsigmoid), the pointwise
        conv and LayerNorm; the first block (stride 1) adds its input, the second ends in rows."""
        m, eps = self.model, self.eps

        def w(name: str) -> Tensor:
            return getattr(m, f"mm_model_block_{blk}_block_{name}")

        block = ggml.conv_2d_dw(w("0_0_w"), x, stride, stride, 1, 1, 1, 1)
        block = ggml.cont(ggml.permute(block, 1, 2, 0, 3))
        block = ggml.norm(block, eps)
        block = ggml.add(ggml.mul(block, w("0_1_w")), w("0_1_b"))
        block = ggml.cont(ggml.permute(block, 2, 0, 1, 3))
        block_hw = ggml.unary(block, "HARDSWISH")
        block = ggml.pool_2d(block_hw, ggml.POOL_AVG, block_hw.ne[0], block_hw.ne[1], block_hw.ne[0], block_hw.ne[1], 0, 0)
        block = ggml.reshape(block, block.ne[0] * block.ne[1] * block.ne[2], block.ne[3])
        block = ggml.add(self.build_mm(w("1_fc1_w"), block), w("1_fc1_b"))
        block = ggml.unary(block, "RELU")
        block = ggml.add(self.build_mm(w("1_fc2_w"), block), w("1_fc2_b"))
        block = ggml.unary(block, "HARDSIGMOID")
        block = ggml.reshape(block, 1, 1, block.ne[0], block.ne[1])
        block = ggml.mul(block_hw, block)
        width, height = block.ne[0], block.ne[1]
        block = ggml.reshape(block, width * height, block.ne[2], block.ne[3])
        block = ggml.cont(ggml.permute(block, 1, 0, 2, 3))
        block = self.build_mm(w("2_0_w"), block)
        block = ggml.reshape(block, block.ne[0], width, height, block.ne[3])
        block = ggml.norm(block, eps)
        block = ggml.add(ggml.mul(block, w("2_1_w")), w("2_1_b"))
        if residual is None:
            return ggml.reshape(block, block.ne[0], block.ne[1] * block.ne[2], block.ne[3])
        block = ggml.cont(ggml.permute(block, 2, 0, 1, 3))
        return ggml.add(residual, block)

    def build_ldp(self, embeddings: Tensor) -> Tensor:
        """MobileVLM's projector (24 patches a side, as llava.cpp fixes it)."""
        m, n_patch = self.model, 24
        mlp_1 = ggml.add(self.build_mm(m.mm_model_mlp_1_w, embeddings), m.mm_model_mlp_1_b)
        mlp_1 = ggml.unary(mlp_1, "GELU")
        mlp_3 = ggml.add(self.build_mm(m.mm_model_mlp_3_w, mlp_1), m.mm_model_mlp_3_b)
        mlp_3 = ggml.permute(mlp_3, 1, 0, 2, 3)
        mlp_3 = ggml.cont(mlp_3, n_patch, n_patch, mlp_3.ne[1], mlp_3.ne[2])
        block_1 = self.build_ldp_block(mlp_3, 1, 1, mlp_3)
        return self.build_ldp_block(block_1, 2, 2, None)

    def build_ldpv2(self, embeddings: Tensor) -> Tensor:
        """MobileVLM V2's projector: the MLP, a 2x2 average pool and the depthwise positional conv."""
        m, n_patch = self.model, 24
        mlp_0 = ggml.add(self.build_mm(m.mm_model_mlp_0_w, embeddings), m.mm_model_mlp_0_b)
        mlp_0 = ggml.unary(mlp_0, "GELU")
        mlp_2 = ggml.add(self.build_mm(m.mm_model_mlp_2_w, mlp_0), m.mm_model_mlp_2_b)
        mlp_2 = ggml.permute(mlp_2, 1, 0, 2, 3)
        mlp_2 = ggml.cont(mlp_2, n_patch, n_patch, mlp_2.ne[1], mlp_2.ne[2])
        mlp_2 = ggml.pool_2d(mlp_2, ggml.POOL_AVG, 2, 2, 2, 2, 0, 0)
        peg_0 = ggml.conv_2d_dw(m.mm_model_peg_0_w, mlp_2, 1, 1, 1, 1, 1, 1)
        peg_0 = ggml.cont(ggml.permute(peg_0, 1, 2, 0, 3))
        peg_0 = ggml.add(peg_0, m.mm_model_peg_0_b)
        mlp_2 = ggml.cont(ggml.permute(mlp_2, 1, 2, 0, 3))
        peg_0 = ggml.add(peg_0, mlp_2)
        return ggml.reshape(peg_0, peg_0.ne[0], peg_0.ne[1] * peg_0.ne[2], peg_0.ne[3])


    def build_glm_edge(self, embeddings: Tensor) -> Tensor:
        """GLM-Edge's adapter: a 2x2 stride-2 conv over the patch grid, then the GLU (linear,
        LayerNorm, in-place GELU, SwiGLU of gate and dense_h_to_4h, dense_4h_to_h), between the
        BOI and EOI embeddings."""
        m = self.model
        gridsz = int(math.sqrt(embeddings.ne[1]))
        embeddings = ggml.permute(embeddings, 1, 0, 2, 3)
        embeddings = ggml.cont(embeddings, gridsz, gridsz, embeddings.ne[1])
        embeddings = ggml.conv_2d(m.mm_model_adapter_conv_w, embeddings, 2, 2, 0, 0, 1, 1)
        embeddings = ggml.reshape(embeddings, embeddings.ne[0] * embeddings.ne[1], embeddings.ne[2], 1)
        embeddings = ggml.cont(ggml.permute(embeddings, 1, 0, 2, 3))
        embeddings = ggml.add(embeddings, m.mm_model_adapter_conv_b)
        embeddings = self.build_mm(m.mm_model_mlp_0_w, embeddings)
        embeddings = ggml.norm(embeddings, self.eps)
        embeddings = ggml.add(ggml.mul(embeddings, m.mm_model_ln_q_w), m.mm_model_ln_q_b)
        embeddings = ggml.unary(embeddings, "GELU", inplace=True)
        x = embeddings
        embeddings = self.build_mm(m.mm_model_mlp_2_w, embeddings)
        x = self.build_mm(m.mm_model_mlp_1_w, x)
        embeddings = ggml.glu_split(embeddings, x, ggml.GLU_SWIGLU)
        embeddings = self.build_mm(m.mm_model_mlp_3_w, embeddings)
        embeddings = ggml.concat(m.mm_boi, embeddings, 1)
        return ggml.concat(embeddings, m.mm_eoi, 1)


GRAPH_BUILDER = ClipGraphLlava
