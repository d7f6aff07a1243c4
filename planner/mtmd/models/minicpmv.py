"""tools/mtmd/models/minicpmv.cpp: clip_graph_minicpmv (MiniCPM-V 2.5 to 4.5, projector type
"resampler"): a SigLIP ViT with learned positions, then the resampler, one cross-attention of
minicpmv_query_num learned queries over the patches (keys with 2D sinusoidal positions, heads of
128), a LayerNorm and the projection."""
from __future__ import annotations

import math

from ... import ggml
from ..clip import NORM_TYPE_NORMAL, ClipGraph, set_name


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


GRAPH_BUILDER = ClipGraphMinicpmv
