"""tools/mtmd/models/minicpmv.cpp: clip_graph_minicpmv (MiniCPM-V 2.5 to 4.5, projector type
"resampler"): a SigLIP ViT with learned positions, then the resampler, one cross-attention of
minicpmv_query_num learned queries over the patches (keys with 2D sinusoidal positions, heads of
128), a LayerNorm and the projection; and clip_graph_minicpmv4_6 (MiniCPM-V 4.6): SigLIP layers, the
ViT merger after layer insert_layer_id (window attention over 2x2 windows, a 2x2 downsample MLP;
none in the 4x mode), the remaining layers, and the final 2x2 merger MLP."""
from __future__ import annotations

import math

from ... import ggml
from ...ggml import Tensor
from ..clip import FFN_GELU, FFN_GELU_ERF, NORM_TYPE_NORMAL, ClipGraph, set_name


class ClipGraphMinicpmv(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp, eps = self.model, self.hparams, self.eps
        if model.class_embedding is not None:
            raise self.abort("minicpmv.cpp GGML_ASSERT(model.class_embedding == nullptr)")
        n_pos = self.n_patches
        n_embd_proj = self.n_mmproj_embd

        def inp(type_: int, *ne: int, name: str):
            t = ggml.new_tensor(type_, *ne)
            set_name(t, name)
            t.set_input()
            return t

        # the resampler's position embeddings (not the ViT's): base frequencies, 2D positions
        omega = inp(ggml.T.F32, n_embd_proj // 4, name="omega")
        pos_h = inp(ggml.T.F32, 1, n_pos, name="pos_h")
        pos_w = inp(ggml.T.F32, 1, n_pos, name="pos_w")
        positions = inp(ggml.T.I32, n_pos, name="positions")      # the ViT's learned positions
        learned_pos_embd = ggml.get_rows(self._weight(model.position_embeddings, "v.position_embd.weight"), positions)

        cur = self.build_inp()
        embeddings = self.build_vit(cur, n_pos, NORM_TYPE_NORMAL, hp.ffn_op, learned_pos_embd, None)

        q = model.mm_model_query
        v = self.build_mm(model.mm_model_kv_proj, embeddings)
        q = self.build_norm(q, model.mm_model_ln_q_w, model.mm_model_ln_q_b, NORM_TYPE_NORMAL, eps, -1)
        v = self.build_norm(v, model.mm_model_ln_kv_w, model.mm_model_ln_kv_b, NORM_TYPE_NORMAL, eps, -1)

        # the sinusoidal position embeddings: outer products, sin and cos
        omega_b = ggml.repeat_4d(omega, omega.ne[0], n_pos, 1, 1)
        theta_x = ggml.mul(omega_b, pos_w)
        theta_y = ggml.mul(omega_b, pos_h)
        pos_embd_x = ggml.concat(ggml.sin(theta_x), ggml.cos(theta_x), 0)
        pos_embd_y = ggml.concat(ggml.sin(theta_y), ggml.cos(theta_y), 0)
        pos_embed = ggml.concat(pos_embd_x, pos_embd_y, 0)
        k = ggml.add(v, pos_embed)

        d_head = 128
        n_head = n_embd_proj // d_head
        num_query = hp.minicpmv_query_num
        Q = ggml.add(self.build_mm(model.mm_model_attn_q_w, q), model.mm_model_attn_q_b)
        K = ggml.add(self.build_mm(model.mm_model_attn_k_w, k), model.mm_model_attn_k_b)
        V = ggml.add(self.build_mm(model.mm_model_attn_v_w, v), model.mm_model_attn_v_b)
        Q = ggml.reshape(Q, d_head, n_head, num_query)
        K = ggml.reshape(K, d_head, n_head, n_pos)
        V = ggml.reshape(V, d_head, n_head, n_pos)
        self.cb(Q, "resampler_Q", -1)
        self.cb(K, "resampler_K", -1)
        self.cb(V, "resampler_V", -1)
        embeddings = self.build_attn(model.mm_model_attn_o_w, model.mm_model_attn_o_b, Q, K, V, None,
                                     1.0 / math.sqrt(d_head), -1)
        self.cb(embeddings, "resampler_attn_out", -1)
        embeddings = self.build_norm(embeddings, model.mm_model_ln_post_w, model.mm_model_ln_post_b, NORM_TYPE_NORMAL,
                                     eps, -1)
        embeddings = self.build_mm(model.mm_model_proj, embeddings)
        self.expand(embeddings)
        return self.gf


class ClipGraphMinicpmv4_6(ClipGraph):
    def build_vit_layers(self, inp: Tensor, il_begin: int, il_end: int, n_pos_layer: int) -> Tensor:
        model, eps = self.model, self.eps
        for il in range(il_begin, il_end):
            layer = model.layers[il]
            cur = self.build_norm(inp, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_NORMAL, eps, il)
            self.cb(cur, "layer_inp_normed", il)
            cur = self.build_self_attn(cur, layer.q_w, layer.q_b, layer.k_w, layer.k_b, layer.v_w, layer.v_b,
                                       layer.o_w, layer.o_b, None, n_pos_layer, il, "")
            self.cb(cur, "attn_out", il)
            if layer.ls_1_w is not None:
                cur = ggml.mul(cur, layer.ls_1_w)
                self.cb(cur, "attn_out_scaled", il)
            cur = ggml.add(cur, inp)
            inp = cur
            self.cb(cur, "ffn_inp", il)
            cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_NORMAL, eps, il)
            self.cb(cur, "ffn_inp_normed", il)
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, layer.ff_gate_w, layer.ff_gate_b,
                                 layer.ff_down_w, layer.ff_down_b, self.hparams.ffn_op, il)
            self.cb(cur, "ffn_out", il)
            if layer.ls_2_w is not None:
                cur = ggml.mul(cur, layer.ls_2_w)
                self.cb(cur, "ffn_out_scaled", il)
            inp = ggml.add(inp, cur)
            self.cb(inp, "layer_out", il)
        return inp

    def build_self_attn(self, cur: Tensor, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, mask, n_pos: int, il: int,
                        prefix: str) -> Tensor:
        """The layers' and the ViT merger's attention: q/k/v with optional biases, heads, build_attn."""
        Qcur = self.build_mm(q_w, cur)
        if q_b is not None:
            Qcur = ggml.add(Qcur, q_b)
        Kcur = self.build_mm(k_w, cur)
        if k_b is not None:
            Kcur = ggml.add(Kcur, k_b)
        Vcur = self.build_mm(v_w, cur)
        if v_b is not None:
            Vcur = ggml.add(Vcur, v_b)
        Qcur = ggml.reshape(Qcur, self.d_head, self.n_head, n_pos)
        Kcur = ggml.reshape(Kcur, self.d_head, self.n_head, n_pos)
        Vcur = ggml.reshape(Vcur, self.d_head, self.n_head, n_pos)
        self.cb(Qcur, f"{prefix}Qcur", il)
        self.cb(Kcur, f"{prefix}Kcur", il)
        self.cb(Vcur, f"{prefix}Vcur", il)
        return self.build_attn(o_w, o_b, Qcur, Kcur, Vcur, mask, self.kq_scale, il)

    def gather_2x2(self, x: Tensor, idx: list[Tensor]) -> list[Tensor]:
        return [ggml.get_rows(x, i) for i in idx]

    def build(self) -> ggml.Cgraph:
        model, hp, eps = self.model, self.hparams, self.eps
        is_4x = hp.n_merge == 2
        n_pos = self.n_patches
        half_h, half_w = self.n_patches_y // 2, self.n_patches_x // 2
        n_ds = half_h * half_w
        n_out = n_ds if is_4x else (half_h // 2) * (half_w // 2)

        def add_i32_input(name: str, n: int) -> Tensor:
            t = ggml.new_tensor(ggml.T.I32, n)
            set_name(t, name)
            t.set_input()
            return t

        positions = add_i32_input("positions", n_pos)
        learned_pos_embd = ggml.get_rows(self._weight(model.position_embeddings, "v.position_embd.weight"), positions)
        if not is_4x:
            # the ViT merger's window reorder and block-diagonal mask, and its 2x2 gathers
            window_idx = add_i32_input("vit_merger_window_idx", n_pos)
            inv_window_idx = add_i32_input("vit_merger_inv_window_idx", n_pos)
            window_mask = ggml.new_tensor(ggml.T.F32, n_pos, n_pos)
            set_name(window_mask, "vit_merger_window_mask")
            window_mask.set_input()
            if self.flash_attn_type == 1:
                window_mask = ggml.cast(window_mask, ggml.T.F16)
            vit_ds_idx = [add_i32_input(f"vit_merger_ds_idx_{i}", n_ds) for i in range(4)]
        merger_ds_idx = [add_i32_input(f"merger_ds_idx_{i}", n_out) for i in range(4)]

        inp = self.build_inp()
        inp = ggml.add(inp, learned_pos_embd)
        self.cb(inp, "pos_embed", -1)
        inpL = inp
        if model.pre_ln_w is not None:
            inpL = self.build_norm(inpL, model.pre_ln_w, model.pre_ln_b, NORM_TYPE_NORMAL, eps, -1)
            self.cb(inpL, "pre_ln", -1)

        if not is_4x:
            insert_lid = hp.insert_layer_id
            inpL = self.build_vit_layers(inpL, 0, insert_lid + 1, n_pos)
            # the ViT merger: window self-attention in window-major order
            residual = inpL
            cur = self.build_norm(inpL, model.vit_merger_ln1_w, model.vit_merger_ln1_b, NORM_TYPE_NORMAL, eps, -1)
            self.cb(cur, "vit_merger_attn_inp_normed", -1)
            cur = ggml.get_rows(cur, window_idx)
            self.cb(cur, "vit_merger_window_reorder", -1)
            cur = self.build_self_attn(cur, model.vit_merger_attn_q_w, model.vit_merger_attn_q_b,
                                       model.vit_merger_attn_k_w, model.vit_merger_attn_k_b,
                                       model.vit_merger_attn_v_w, model.vit_merger_attn_v_b,
                                       model.vit_merger_attn_o_w, model.vit_merger_attn_o_b, window_mask, n_pos, -1,
                                       "vit_merger_")
            self.cb(cur, "vit_merger_attn_out", -1)
            cur = ggml.get_rows(cur, inv_window_idx)
            inpL = ggml.add(cur, residual)
            self.cb(inpL, "vit_merger_attn_residual", -1)
            # the ViT merger: 2x2 downsample and MLP (4 tokens -> 1)
            p0, p1, p2, p3 = self.gather_2x2(inpL, vit_ds_idx)
            mean_res = ggml.add(ggml.add(ggml.add(p0, p1), p2), p3)
            mean_res = ggml.scale(mean_res, 0.25)
            self.cb(mean_res, "vit_merger_ds_mean_res", -1)
            cat = ggml.concat(ggml.concat(ggml.concat(p0, p1, 0), p2, 0), p3, 0)
            cur = self.build_norm(cat, model.vit_merger_ds_ln_w, model.vit_merger_ds_ln_b, NORM_TYPE_NORMAL, eps, -1)
            self.cb(cur, "vit_merger_ds_normed", -1)
            cur = self.build_ffn(cur, model.vit_merger_ds_up_w, model.vit_merger_ds_up_b, None, None,
                                 model.vit_merger_ds_down_w, model.vit_merger_ds_down_b, FFN_GELU, -1)
            self.cb(cur, "vit_merger_ds_mlp_out", -1)
            inpL = ggml.add(cur, mean_res)
            self.cb(inpL, "vit_merger_ds_out", -1)
            inpL = self.build_vit_layers(inpL, insert_lid + 1, self.n_layer, n_ds)
        else:
            inpL = self.build_vit_layers(inpL, 0, self.n_layer, n_pos)

        if model.post_ln_w is not None:
            inpL = self.build_norm(inpL, model.post_ln_w, model.post_ln_b, NORM_TYPE_NORMAL, eps, -1)
            self.cb(inpL, "post_ln", -1)
        # the final merger (DownsampleMLP): another 2x2 merge to the text model
        p0, p1, p2, p3 = self.gather_2x2(inpL, merger_ds_idx)
        cat = ggml.concat(ggml.concat(ggml.concat(p0, p1, 0), p2, 0), p3, 0)
        cur = self.build_norm(cat, model.mm_input_norm_w, model.mm_input_norm_b, NORM_TYPE_NORMAL, eps, -1)
        self.cb(cur, "merger_normed", -1)
        cur = self.build_ffn(cur, model.mm_ffn_up_w, model.mm_ffn_up_b, None, None, model.mm_ffn_down_w,
                             model.mm_ffn_down_b, FFN_GELU_ERF, -1)
        self.cb(cur, "merger_out", -1)
        self.expand(cur)
        return self.gf


def GRAPH_BUILDER(ctx, nx: int, ny: int) -> ClipGraph:
    """clip_get_graph_builder's cases for this file: resampler, minicpmv4_6."""
    return (ClipGraphMinicpmv4_6 if ctx.model.proj_type == "minicpmv4_6" else ClipGraphMinicpmv)(ctx, nx, ny)
