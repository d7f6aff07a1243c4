"""tools/mtmd/models/cogvlm.cpp: clip_graph_cogvlm (CogVLM / CogVLM2's EVA2-CLIP): [CLS] and learned
positions, post-norm blocks of a fused qkv (LayerNorm after attention and after the FFN), the [CLS]
dropped, then the GLU projector (linear, LayerNorm, in-place GELU, SwiGLU of up and gate, down)
between the BOI and EOI embeddings."""
from __future__ import annotations

from ... import ggml
from ..clip import NORM_TYPE_NORMAL, ClipGraph


class ClipGraphCogvlm(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp, eps = self.model, self.hparams, self.eps
        if model.class_embedding is None:
            raise self.abort("cogvlm.cpp GGML_ASSERT(model.class_embedding != nullptr)")
        if model.position_embeddings is None:
            raise self.abort("cogvlm.cpp GGML_ASSERT(model.position_embeddings != nullptr)")
        n_pos = self.n_patches + 1     # and the [CLS] token
        d_head, n_head, n_embd = self.d_head, self.n_head, self.n_embd
        inp = self.build_inp()
        inp = ggml.concat(inp, model.class_embedding, 1)
        inp = ggml.add(inp, model.position_embeddings)
        self.cb(inp, "inp_pos", -1)
        inpL = inp
        for il in range(self.n_layer):
            layer = model.layers[il]
            cur = self.build_mm(layer.qkv_w, inpL)
            cur = ggml.add(cur, layer.qkv_b)
            nb = (d_head * 4, cur.nb[1])     # d_head * sizeof(float)
            Qcur = ggml.view(cur, (d_head, n_head, n_pos), nb, 0)
            Kcur = ggml.view(cur, (d_head, n_head, n_pos), nb, n_embd * 4)
            Vcur = ggml.view(cur, (d_head, n_head, n_pos), nb, 2 * n_embd * 4)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)
            cur = self.build_attn(layer.o_w, layer.o_b, Qcur, Kcur, Vcur, None, self.kq_scale, il)
            self.cb(cur, "attn_out", il)
            cur = self.build_norm(cur, layer.ln_1_w, layer.ln_1_b, NORM_TYPE_NORMAL, eps, il)
            self.cb(cur, "attn_post_norm", il)
            cur = ggml.add(cur, inpL)
            inpL = cur
            cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, layer.ff_gate_w, layer.ff_gate_b,
                                 layer.ff_down_w, layer.ff_down_b, hp.ffn_op, il)
            self.cb(cur, "ffn_out", il)
            cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, NORM_TYPE_NORMAL, eps, il)
            self.cb(cur, "ffn_post_norm", il)
            cur = ggml.add(cur, inpL)
            self.cb(cur, "layer_out", il)
            inpL = cur
        # the [CLS] token out
        cur = ggml.view(inpL, (n_embd, self.n_patches), (ggml.row_size(inpL.type, n_embd),), 0)
        cur = self.build_mm(model.mm_model_proj, cur)
        cur = self.build_norm(cur, model.mm_post_fc_norm_w, model.mm_post_fc_norm_b, NORM_TYPE_NORMAL, 1e-5, -1)
        cur = ggml.unary(cur, "GELU", inplace=True)
        h_to_4h = self.build_mm(model.mm_h_to_4h_w, cur)
        gate = self.build_mm(model.mm_gate_w, cur)
        gate = ggml.glu_split(gate, h_to_4h, ggml.GLU_SWIGLU)
        cur = self.build_mm(model.mm_4h_to_h_w, gate)
        cur = ggml.concat(model.mm_boi, cur, 1)
        cur = ggml.concat(cur, model.mm_eoi, 1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphCogvlm
