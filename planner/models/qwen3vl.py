"""LLM_ARCH_QWEN3VL (src/models/qwen3vl.cpp): the text model of Qwen3-VL dense (2B to 32B).

qwen3's block and tensors with interleaved M-RoPE (rope.dimension_sections) and deepstack: the
input rows are n_embd x (1 + n_deepstack_layers) wide (the vision encoder's features for the
first layers ride beside the token embedding; a text batch pads the token rows with zeros) and
each of the first n_deepstack_layers layers adds its block of the input to its output.
Qwen3-TTS's talker (qwen3tts) is this model with a codec lm_head narrower than its vocabulary.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_IMROPE, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import ModelLoader
from . import qwen3
from .qwen3 import build_attn_qk_norm

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_IMROPE

# the lm_head width llama_model_qwen3vl::load_arch_tensors gives qwen3tts ([TAG_LLAMA_N_VOCAB_OUT]):
# its codec head, narrower than the text + codec vocabulary of token_embd
N_VOCAB_OUT_QWEN3TTS = 3072


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_qwen3vl::load_arch_tensors: qwen3's, the lm_head N_VOCAB_OUT_QWEN3TTS wide for
    qwen3tts (llama_model_qwen3tts is llama_model_qwen3vl, models.h); a tied head stays n_vocab wide."""
    qwen3.load_arch_tensors(c, model, N_VOCAB_OUT_QWEN3TTS if model.hparams.arch == "qwen3tts" else None)


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_deepstack_hparams(ml, hp)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    require_head_sizes_equal(ml, hp)


def load_deepstack_hparams(ml: ModelLoader, hp: HParams) -> None:
    """The keys qwen3vl and qwen3vlmoe read first: the deepstack layer count and the M-RoPE sections."""
    hp.n_deepstack_layers = ml.get_u32("%s.n_deepstack_layers", 0)
    hp.rope_sections = ml.get_rope_sections()


def build(g: GraphContext) -> None:
    """llama_model_qwen3vl::graph"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        cur = build_attn_qk_norm(g, layer, cur, inp_pos, inp_attn, il, hp.rope_sections)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = add_deepstack(g, cur, il)

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    cur = pad_logits(g, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)


def pad_logits(g: GraphContext, cur):
    """qwen3tts's codec head is narrower than token_embd: its logits are padded in front with -inf
    up to the vocabulary (a scalar view of output_norm scaled by 0 plus -inf, repeated, then
    concatenated before them); a head wider than token_embd is the graph's GGML_ABORT."""
    model = g.model
    n_vocab_in, n_vocab_out = model.tok_embd.ne[1], model.output.ne[1]
    if n_vocab_in > n_vocab_out:
        neg_inf = ggml.scale_bias(ggml.view(model.output_norm, (1,), (), 0), 0.0, -math.inf)
        neg_inf = ggml.repeat_4d(neg_inf, n_vocab_in - n_vocab_out, cur.ne[1], 1, 1)
        return ggml.concat(neg_inf, cur, 0)
    if n_vocab_in < n_vocab_out:
        raise ggml.GGMLAbort(f"llama.cpp would abort (qwen3vl.cpp GGML_ABORT(\"invalid case\")): the output head has "
                             f"{n_vocab_out} rows, more than token_embd's {n_vocab_in}")
    return cur


def add_deepstack(g: GraphContext, cur, il: int):
    """The first n_deepstack_layers layers add their n_embd block of the input rows (block il + 1)."""
    hp = g.hparams
    if il >= hp.n_deepstack_layers:
        return cur
    inp = g.t_inp_embd
    ds = ggml.view(inp, (hp.n_embd, g.ubatch.n_tokens), (inp.nb[1],), (il + 1) * hp.n_embd * 4)
    cur = ggml.add(cur, ds)
    g.cb(cur, "deepstack_out", il)
    return cur
