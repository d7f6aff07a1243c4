"""tools/mtmd/models/mimo-audio.cpp: clip_graph_mimo_audio (MiMo-V2.5's audio): the audio tokenizer's
encoder (two conv1d, a LayerNorm ViT with NEOX rope, full or windowed masks per layer, the 3rd
layer's attention output added back before the final norm, a strided downsampling conv), its RVQ
quantization (per codebook: distances, argmax, the chosen rows subtracted), the codes' embeddings
summed, the input local transformer over groups of frames (RMS norms, SwiGLU) and the projection."""
from __future__ import annotations

from typing import Optional

from ... import ggml
from ..clip import FFN_GELU_ERF, FFN_SILU, NORM_TYPE_NORMAL, NORM_TYPE_RMS, BuildVitOpts, ClipGraph, ClipLayer, set_name

GGML_ROPE_TYPE_NEOX = 2
SKIP_CAPTURE_IL = 2          # encoder_skip_layer_id 3 (1-indexed)


class ClipGraphMimoAudio(ClipGraph):
    def _input(self, t: ggml.Tensor, name: str) -> ggml.Tensor:
        set_name(t, name)
        t.set_input()
        return t

    def build(self) -> ggml.Cgraph:
        model, hp = self.model, self.hparams
        n_layer, n_embd, d_head, n_head, eps = self.n_layer, self.n_embd, self.d_head, self.n_head, self.eps
        inp = self.build_inp_raw(1)
        cur = ggml.conv_1d_ph(model.conv1d_1_w, inp, 1, 1)
        cur = ggml.add(cur, model.conv1d_1_b)
        cur = ggml.unary(cur, "GELU_ERF")
        cur = ggml.conv_1d_ph(model.conv1d_2_w, cur, 2, 1)
        cur = ggml.add(cur, model.conv1d_2_b)
        cur = ggml.unary(cur, "GELU_ERF")
        inpL = ggml.cont(ggml.transpose(cur))
        n_pos = inpL.ne[1]
        self.cb(inpL, "after_conv1d", -1)
        if len(hp.wa_pattern_mode) != n_layer:
            raise self.abort("mimo-audio.cpp GGML_ASSERT(wa_pattern_mode.size() == n_layer)")
        inp_pos = self._input(ggml.new_tensor(ggml.T.I32, n_pos), "mimo_audio_positions")
        full_mask = self._input(ggml.new_tensor(ggml.T.F32, n_pos, n_pos), "mimo_audio_full_mask")
        window_mask = self._input(ggml.new_tensor(ggml.T.F32, n_pos, n_pos), "mimo_audio_window_mask")
        if n_layer <= SKIP_CAPTURE_IL:
            raise self.abort(f"mimo-audio.cpp GGML_ASSERT(n_layer > skip_capture_il): {n_layer} layers")
        skip: list[ggml.Tensor] = []

        def capture(layer_cur: ggml.Tensor, il: int) -> None:
            if il == SKIP_CAPTURE_IL:
                skip.append(layer_cur)
        # the skip connection is added before the final norm: build_vit must not apply it
        opts = BuildVitOpts(attn_mask_layers=[full_mask if m == -1 else window_mask for m in hp.wa_pattern_mode],
                            callback_layer_out=capture, skip_post_ln=True)

        def add_pos(x: ggml.Tensor, layer: ClipLayer) -> ggml.Tensor:
            return ggml.rope_ext(x, inp_pos, None, d_head, GGML_ROPE_TYPE_NEOX, 0)

        inpL = self.build_vit(inpL, n_pos, NORM_TYPE_NORMAL, hp.ffn_op, None, add_pos, opts)
        inpL = ggml.reshape(inpL, n_embd, n_pos)
        inpL = ggml.add(inpL, skip[0])
        inpL = self.build_norm(inpL, model.post_ln_w, model.post_ln_b, NORM_TYPE_NORMAL, eps, -1)
        self.cb(inpL, "after_transformer", -1)
        # downsample: strided conv (no bias), GELU, LayerNorm
        ds = ggml.cont(ggml.transpose(inpL))
        ds = ggml.conv_1d(model.downsample_conv_w, ds, 2, 0, 1)
        ds = ggml.unary(ds, "GELU_ERF")
        ds = ggml.cont(ggml.transpose(ds))
        inpL = self.build_norm(ds, model.downsample_norm_w, model.downsample_norm_b, NORM_TYPE_NORMAL, eps, -1)

        # RVQ quantization: codebook [dim, max_bins, n_q]
        codebook = model.rvq_codebook
        dim = codebook.ne[0]
        if dim != inpL.ne[0] or len(hp.rvq_codebook_size) != codebook.ne[2]:
            raise self.abort("mimo-audio.cpp GGML_ASSERTs on the RVQ codebook: its width is the encoder's, one "
                             "table per quantizer")
        codes = []
        residual = inpL
        for q, bins in enumerate(hp.rvq_codebook_size):
            codebook_q = ggml.cont(ggml.view(codebook, (dim, bins), (codebook.nb[1],), q * codebook.nb[2]))
            codebook_norm = ggml.sum_rows(ggml.sqr(codebook_q))
            codebook_norm = ggml.cont(ggml.transpose(codebook_norm))
            dot = ggml.mul_mat(codebook_q, residual)
            scores = ggml.sub(ggml.scale(dot, 2.0), codebook_norm)
            idx = ggml.argmax(scores)
            codes.append(idx)
            quant = ggml.get_rows(codebook_q, idx)
            residual = ggml.sub(residual, quant)
            self.cb(idx, "rvq_code", q)

        # the codes' LLM embeddings, summed
        code_embd = model.mm_a_code_embd
        dim, vocab = code_embd.ne[0], code_embd.ne[1]
        if len(codes) != code_embd.ne[2] or dim != inpL.ne[0]:
            raise self.abort("mimo-audio.cpp GGML_ASSERTs on the code embeddings: one table per quantizer, the "
                             "encoder's width")
        code_embd_sum: Optional[ggml.Tensor] = None
        for i, code in enumerate(codes):
            table_i = ggml.cont(ggml.view(code_embd, (dim, vocab), (code_embd.nb[1],), i * code_embd.nb[2]))
            embd_i = ggml.get_rows(table_i, code)
            code_embd_sum = embd_i if code_embd_sum is None else ggml.add(code_embd_sum, embd_i)
        self.cb(code_embd_sum, "code_embd_sum", -1)

        # input_local_transformer: groups of group_size frames attend within their group (a
        # block-diagonal mask, positions repeating per group)
        group_size = hp.audio_local_group_size
        n_pos_ds = code_embd_sum.ne[1]
        n_groups = (n_pos_ds + group_size - 1) // group_size
        n_padded = n_groups * group_size
        cur_local = code_embd_sum
        if n_padded != n_pos_ds:
            cur_local = ggml.pad(cur_local, 0, n_padded - n_pos_ds, 0, 0)
        local_pos = self._input(ggml.new_tensor(ggml.T.I32, n_padded), "mimo_audio_local_positions")
        local_mask = self._input(ggml.new_tensor(ggml.T.F32, n_padded, n_padded), "mimo_audio_local_mask")

        def apply_local_rope(x: ggml.Tensor) -> ggml.Tensor:
            return ggml.rope_ext(x, local_pos, None, d_head, GGML_ROPE_TYPE_NEOX, 0)

        for il in range(hp.audio_local_n_layer):
            layer = model.mm_a_local_layers[il]
            attn_in = self.build_norm(cur_local, layer.ln_1_w, None, NORM_TYPE_RMS, eps, il)
            Qcur = self.build_mm(layer.q_w, attn_in)
            if layer.q_b is not None:
                Qcur = ggml.add(Qcur, layer.q_b)
            Kcur = self.build_mm(layer.k_w, attn_in)
            if layer.k_b is not None:
                Kcur = ggml.add(Kcur, layer.k_b)
            Vcur = self.build_mm(layer.v_w, attn_in)
            if layer.v_b is not None:
                Vcur = ggml.add(Vcur, layer.v_b)
            Qcur = ggml.reshape(Qcur, d_head, n_head, n_padded)
            Kcur = ggml.reshape(Kcur, d_head, n_head, n_padded)
            Vcur = ggml.reshape(Vcur, d_head, n_head, n_padded)
            Qcur = apply_local_rope(Qcur)
            Kcur = apply_local_rope(Kcur)
            attn_out = self.build_attn(layer.o_w, None, Qcur, Kcur, Vcur, local_mask, self.kq_scale, il)
            cur_local = ggml.add(cur_local, attn_out)
            ffn_in = self.build_norm(cur_local, layer.ln_2_w, None, NORM_TYPE_RMS, eps, il)
            ffn_out = self.build_ffn(ffn_in, layer.ff_up_w, None, layer.ff_gate_w, None, layer.ff_down_w, None,
                                     FFN_SILU, il)
            cur_local = ggml.add(cur_local, ffn_out)
        cur_local = self.build_norm(cur_local, model.mm_a_local_norm_w, None, NORM_TYPE_RMS, eps, -1)
        self.cb(cur_local, "after_local_transformer", -1)
        # each group's frames flattened into one vector (AudioProjection's input), then Linear, GELU, Linear
        grouped = ggml.reshape(cur_local, n_embd * group_size, n_groups)
        projected = self.build_ffn(grouped, model.mm_1_w, None, None, None, model.mm_2_w, None, FFN_GELU_ERF, -1)
        self.cb(projected, "after_projection", -1)
        self.expand(projected)
        return self.gf


GRAPH_BUILDER = ClipGraphMimoAudio
