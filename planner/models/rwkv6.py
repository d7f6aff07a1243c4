"""LLM_ARCH_RWKV6 (src/models/rwkv6.cpp): RWKV-6 "Finch" 1.6B to 14B, attention-free.

Every layer is recurrent (llama_memory_recurrent): two token shift rows of n_embd (the time mix's
and the channel mix's previous input) and a wkv state of n_embd x head size per sequence. LayerNorms
with biases, LN0 after the embeddings, the output halved every rescale_every_n_layers layers.
"""
from __future__ import annotations

from .. import ggml
from ..ggml import GGMLAbort
from ..graph import LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .rwkv6_base import build_rwkv6_channel_mix, build_rwkv6_time_mix, load_rwkv6_hparams

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    load_rwkv6_hparams(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    extra, decay_extra, head_size, ffn_size = hp.time_mix_extra_dim, hp.time_decay_extra_dim, hp.wkv_head_size, hp.n_ff_arr[0]
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.tok_norm = c.create_tensor(tn("TOKEN_EMBD_NORM", "weight", 0), (n_embd,))
    model.tok_norm_b = c.create_tensor(tn("TOKEN_EMBD_NORM", "bias", 0), (n_embd,))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_b = c.create_tensor(tn("ATTN_NORM", "bias", i), (n_embd,))
        layer.attn_norm_2 = c.create_tensor(tn("ATTN_NORM_2", "weight", i), (n_embd,))
        layer.attn_norm_2_b = c.create_tensor(tn("ATTN_NORM_2", "bias", i), (n_embd,))
        layer.time_mix_w1 = c.create_tensor(tn("TIME_MIX_W1", "weight", i), (n_embd, extra * 5))
        layer.time_mix_w2 = c.create_tensor(tn("TIME_MIX_W2", "weight", i), (extra, n_embd, 5))
        layer.time_mix_lerp_x = c.create_tensor(tn("TIME_MIX_LERP_X", "weight", i), (n_embd, 1, 1))
        for name in ("w", "k", "v", "r", "g"):
            setattr(layer, f"time_mix_lerp_{name}", c.create_tensor(tn(f"TIME_MIX_LERP_{name.upper()}", "weight", i),
                                                                    (n_embd, 1, 1), TENSOR_NOT_REQUIRED))
        layer.time_mix_lerp_fused = c.create_tensor(tn("TIME_MIX_LERP_FUSED", "weight", i), (n_embd, 1, 1, 5),
                                                    TENSOR_NOT_REQUIRED)
        require(c.ml, layer.time_mix_lerp_fused is not None or layer.time_mix_lerp_w is not None,
                f"layer {i} has neither time_mix_lerp_fused nor time_mix_lerp_w")
        layer.time_mix_first = c.create_tensor(tn("TIME_MIX_FIRST", "weight", i), (head_size, n_embd // head_size))
        layer.time_mix_decay = c.create_tensor(tn("TIME_MIX_DECAY", "weight", i), (n_embd,))
        layer.time_mix_decay_w1 = c.create_tensor(tn("TIME_MIX_DECAY_W1", "weight", i), (n_embd, decay_extra))
        layer.time_mix_decay_w2 = c.create_tensor(tn("TIME_MIX_DECAY_W2", "weight", i), (decay_extra, n_embd))
        layer.time_mix_key = c.create_tensor(tn("TIME_MIX_KEY", "weight", i), (n_embd, n_embd))
        layer.time_mix_value = c.create_tensor(tn("TIME_MIX_VALUE", "weight", i), (n_embd, n_embd))
        layer.time_mix_receptance = c.create_tensor(tn("TIME_MIX_RECEPTANCE", "weight", i), (n_embd, n_embd))
        layer.time_mix_gate = c.create_tensor(tn("TIME_MIX_GATE", "weight", i), (n_embd, n_embd))
        layer.time_mix_ln = c.create_tensor(tn("TIME_MIX_LN", "weight", i), (n_embd,))
        layer.time_mix_ln_b = c.create_tensor(tn("TIME_MIX_LN", "bias", i), (n_embd,))
        layer.time_mix_output = c.create_tensor(tn("TIME_MIX_OUTPUT", "weight", i), (n_embd, n_embd))
        layer.channel_mix_lerp_k = c.create_tensor(tn("CHANNEL_MIX_LERP_K", "weight", i), (n_embd, 1, 1))
        layer.channel_mix_lerp_r = c.create_tensor(tn("CHANNEL_MIX_LERP_R", "weight", i), (n_embd, 1, 1))
        layer.channel_mix_key = c.create_tensor(tn("CHANNEL_MIX_KEY", "weight", i), (n_embd, ffn_size))
        layer.channel_mix_value = c.create_tensor(tn("CHANNEL_MIX_VALUE", "weight", i), (ffn_size, n_embd))
        layer.channel_mix_receptance = c.create_tensor(tn("CHANNEL_MIX_RECEPTANCE", "weight", i), (n_embd, n_embd))


def require_token_shift_count(g: GraphContext, count: int) -> None:
    """The graphs' GGML_ASSERT on the token shift rows (2: rwkv6, rwkv7; 1: the Qwen-based ones)."""
    hp = g.hparams
    if hp.token_shift_count != count:
        raise GGMLAbort(f"llama.cpp would abort building the {hp.arch} graph: token_shift_count is "
                        f"{hp.token_shift_count}, the graph needs {count}")


def build_token_shift_block(g: GraphContext, rs_inp, inp_l, il: int, time_mix):
    """The block rwkv6.cpp and rwkv7.cpp share: LayerNorms before the time mix and the channel mix,
    each mixing with the previous token (the stored shift rows for a sequence's first token), both
    last inputs stored as the new shift rows; returns the channel mix's input, its shifted input and
    the residual (2-D, the output rows only on the last layer). time_mix(att_norm, x_prev)."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    n_embd, n_seqs, n_tokens = hp.n_embd, ub.n_seqs, ub.n_tokens
    n_seq_tokens = n_tokens // n_seqs
    es = ggml.type_size(ggml.T.F32)
    token_shift = g.build_rwkv_token_shift_load(rs_inp, il)
    att_shift = ggml.view(token_shift, (n_embd, 1, n_seqs), (token_shift.nb[1], token_shift.nb[2]), 0)
    ffn_shift = ggml.view(token_shift, (n_embd, 1, n_seqs), (token_shift.nb[1], token_shift.nb[2]),
                          n_embd * ggml.type_size(token_shift.type))
    att_norm = g.build_norm(inp_l, layer.attn_norm, layer.attn_norm_b, LLM_NORM, il)
    g.cb(att_norm, "attn_norm", il)
    x_prev = ggml.concat(att_shift, ggml.view(att_norm, (n_embd, n_seq_tokens - 1, n_seqs),
                                              (att_norm.nb[1], att_norm.nb[2]), 0), 1)
    cur = time_mix(att_norm, x_prev)
    ffn_inp = ggml.add(cur, inp_l)
    g.cb(ffn_inp, "ffn_inp", il)
    ffn_norm = g.build_norm(ffn_inp, layer.attn_norm_2, layer.attn_norm_2_b, LLM_NORM, il)
    g.cb(ffn_norm, "ffn_norm", il)
    x_prev = ggml.concat(ffn_shift, ggml.view(ffn_norm, (n_embd, n_seq_tokens - 1, n_seqs),
                                              (ffn_norm.nb[1], ffn_norm.nb[2]), 0), 1)
    last = (n_seq_tokens - 1) * n_embd * es
    token_shift = ggml.concat(ggml.view(att_norm, (n_embd, 1, n_seqs), (att_norm.nb[1], att_norm.nb[2]), last),
                              ggml.view(ffn_norm, (n_embd, 1, n_seqs), (ffn_norm.nb[1], ffn_norm.nb[2]), last), 1)
    ggml.build_forward_expand(g.gf, g.build_rwkv_token_shift_store(token_shift, il))
    ffn_inp = ggml.reshape(ffn_inp, n_embd, n_tokens)
    ffn_norm = ggml.reshape(ffn_norm, n_embd, n_tokens)
    x_prev = ggml.reshape(x_prev, n_embd, n_tokens)
    return ffn_inp, ffn_norm, x_prev


def build(g: GraphContext) -> None:
    """llama_model_rwkv6::graph"""
    model, hp, ub = g.model, g.hparams, g.ubatch
    require_token_shift_count(g, 2)
    n_embd, n_seqs = hp.n_embd, ub.n_seqs
    n_seq_tokens = ub.n_tokens // n_seqs
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = g.build_norm(inp_l, model.tok_norm, model.tok_norm_b, LLM_NORM, 0)
    rs_inp = g.build_rs_inp()
    inp_out_ids = g.build_inp_out_ids()
    for il, layer in enumerate(model.layers):
        inp_l = ggml.reshape(inp_l, n_embd, n_seq_tokens, n_seqs)
        ffn_inp, ffn_norm, x_prev = build_token_shift_block(
            g, rs_inp, inp_l, il, lambda att_norm, x_prev: build_rwkv6_time_mix(g, rs_inp, att_norm, x_prev, il))
        if il == hp.n_layer - 1:
            ffn_inp = ggml.get_rows(ffn_inp, inp_out_ids)
            ffn_norm = ggml.get_rows(ffn_norm, inp_out_ids)
            x_prev = ggml.get_rows(x_prev, inp_out_ids)
        cur = build_rwkv6_channel_mix(g, layer, ffn_norm, x_prev)
        cur = ggml.add(cur, ffn_inp)
        if hp.rescale_every_n_layers != 0 and (il + 1) % hp.rescale_every_n_layers == 0:
            cur = ggml.scale(cur, 0.5)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur
    build_output_norm_b(g, inp_l, LLM_NORM)


def build_output_norm_b(g: GraphContext, cur, norm_type: str) -> None:
    """The RWKV graphs' tail: output_norm with its bias (if any), the lm_head."""
    model = g.model
    cur = g.build_norm(cur, model.output_norm, model.output_norm_b, norm_type, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
