"""tools/mtmd/models/whisper-enc.cpp: clip_graph_whisper_enc, a Whisper encoder (two 1-D convs over
the mel frames, the ViT at half the frames, Qwen2-Audio's and Voxtral's average pool) and the
projectors of Ultravox (stacked frames, RMS norms, swapped SwiGLU), Qwen2-Audio, Voxtral (stacked
frames, a GELU MLP), Music Flamingo, MERaLiON (stacked frames, a LayerNorm, a SiLU compression and a
GLU) and GLM-ASR (a LayerNorm, stacked frames, a GELU MLP between the begin/end-of-audio rows)."""
from __future__ import annotations

from ... import ggml
from ..clip import FFN_GELU_ERF, NORM_TYPE_NORMAL, ClipGraph


class ClipGraphWhisperEnc(ClipGraph):
    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        n_frames = self.nx
        n_pos = n_frames // 2
        pos = self._weight(model.position_embeddings, "a.position_embd.weight")
        if pos.ne[1] < n_pos:
            raise self.abort(f"whisper-enc.cpp GGML_ASSERT(model.position_embeddings->ne[1] >= n_pos): "
                             f"{pos.ne[1]} positions, {n_pos} needed")
        inp = self.build_inp_raw(1)
        cur = ggml.conv_1d_ph(model.conv1d_1_w, inp, 1, 1)
        cur = ggml.add(cur, model.conv1d_1_b)
        cur = ggml.unary(cur, "GELU_ERF")
        cur = ggml.conv_1d_ph(model.conv1d_2_w, cur, 2, 1)
        cur = ggml.add(cur, model.conv1d_2_b)
        cur = ggml.unary(cur, "GELU_ERF")
        inp = ggml.cont(ggml.transpose(cur))
        self.cb(inp, "after_conv1d", -1)
        layer0 = model.layers[0] if model.layers else None
        if layer0 is None or None in (layer0.ln_1_w, layer0.ln_1_b, layer0.ln_2_w, layer0.ln_2_b, layer0.q_b,
                                      layer0.v_b) or layer0.k_b is not None:
            raise self.abort("whisper-enc.cpp GGML_ASSERTs on the first layer: LayerNorms with biases, Q and V "
                             "biases, no K bias")
        pos_embd_selected = ggml.view(pos, (pos.ne[0], n_pos), (pos.nb[1],), 0)
        cur = self.build_vit(inp, n_pos, NORM_TYPE_NORMAL, hp.ffn_op, pos_embd_selected, None)
        self.cb(cur, "after_transformer", -1)
        if model.audio_has_stack_frames():
            cur = self.build_stack(cur, hp.proj_stack_factor, self.n_embd)
            self.cb(cur, "after_stacked", -1)
        if self.proj_type == "ultravox":
            cur = ggml.mul(ggml.rms_norm(cur, 1e-6), model.mm_norm_pre_w)
            cur = self.build_mm(model.mm_1_w, cur)
            # ultravox_model.py's SwiGLU: the second half goes through the SiLU
            cur = ggml.glu(cur, ggml.GLU_SWIGLU, swapped=True)
            cur = ggml.mul(ggml.rms_norm(cur, 1e-6), model.mm_norm_mid_w)
            cur = self.build_mm(model.mm_2_w, cur)
        elif self.proj_type == "qwen2a":
            cur = self.build_mm(model.mm_fc_w, cur)
            cur = ggml.add(cur, model.mm_fc_b)
        elif self.proj_type in ("voxtral", "musicflamingo"):
            cur = self.build_ffn(cur, model.mm_1_w, model.mm_1_b, None, None, model.mm_2_w, model.mm_2_b,
                                 FFN_GELU_ERF, -1)
        elif self.proj_type == "meralion":
            # stack (above) -> ln -> linear0 + SiLU -> GLU -> out
            cur = ggml.norm(cur, hp.eps)
            cur = ggml.mul(cur, model.mm_norm_pre_w)
            cur = ggml.add(cur, model.mm_norm_pre_b)
            cur = ggml.mul_mat(model.mm_0_w, cur)
            cur = ggml.add(cur, model.mm_0_b)
            cur = ggml.unary(cur, "SILU")
            gate = ggml.mul_mat(model.mm_1_w, cur)
            gate = ggml.add(gate, model.mm_1_b)
            gate = ggml.unary(gate, "SILU")
            pool = ggml.mul_mat(model.mm_2_w, cur)
            pool = ggml.add(pool, model.mm_2_b)
            cur = ggml.mul(gate, pool)
            cur = ggml.mul_mat(model.mm_3_w, cur)
            cur = ggml.add(cur, model.mm_3_b)
        else:     # glma
            cur = ggml.norm(cur, hp.eps)
            cur = ggml.mul(cur, model.mm_norm_pre_w)
            cur = ggml.add(cur, model.mm_norm_pre_b)
            cur = self.build_stack(cur, hp.proj_stack_factor, self.n_embd)
            cur = self.build_ffn(cur, model.mm_1_w, model.mm_1_b, None, None, model.mm_2_w, model.mm_2_b, hp.ffn_op, 0)
            cur = ggml.concat(model.mm_boi, cur, 1)
            cur = ggml.concat(cur, model.mm_eoi, 1)
        self.cb(cur, "projected", -1)
        self.expand(cur)
        return self.gf


GRAPH_BUILDER = ClipGraphWhisperEnc
