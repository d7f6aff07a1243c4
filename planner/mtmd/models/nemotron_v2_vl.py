"""tools/mtmd/models/nemotron-v2-vl.cpp: clip_graph_nemotron_v2_vl (Nemotron Nano 12B v2 VL's RADIO
ViT): positions added to the patches (the converter resampled them to the fixed input), the [CLS]
and register tokens in front, the ViT, the tokens dropped, the pixel shuffle, an RMS norm and a
squared-ReLU MLP."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_RELU_SQR, NORM_TYPE_NORMAL, NORM_TYPE_RMS, ClipGraph


class ClipGraphNemotronV2Vl(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        if model.class_embedding is None:
            raise self.abort("nemotron-v2-vl.cpp GGML_ASSERT(model.class_embedding != nullptr)")
        if model.position_embeddings is None:
            raise self.abort("nemotron-v2-vl.cpp GGML_ASSERT(model.position_embeddings != nullptr)")
        n_registers = model.class_embedding.ne[1]
        n_pos = self.n_patches + n_registers
        inp = self.build_inp()
        inp = ggml.add(inp, model.position_embeddings)
        self.cb(inp, "inp_pos", -1)
        inp = ggml.concat(model.class_embedding, inp, 1)
        cur = self.build_vit(inp, n_pos, NORM_TYPE_NORMAL, hp.ffn_op, None, None)
        row = ggml.row_size(cur.type, self.n_embd)
        cur = ggml.view(cur, (self.n_embd, self.n_patches), (row,), n_registers * row)
        cur = self.build_patch_merge_permute(cur, hp.n_merge)
        cur = self.build_norm(cur, model.mm_0_w, None, NORM_TYPE_RMS, 1e-6, -1)
        cur = self.build_ffn(cur, model.mm_1_w, None, None, None, model.mm_3_w, None, FFN_RELU_SQR, -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphNemotronV2Vl
