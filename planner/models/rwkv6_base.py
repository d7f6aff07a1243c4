"""llm_build_rwkv6_base (src/models/rwkv6-base.cpp): the RWKV-6 time mix (data-dependent token
shift, decay LoRA, RWKV_WKV6, or for QRWKV models without time_mix_first GATED_LINEAR_ATTN) and
channel mix that rwkv6 and rwkv6qwen2 build over llama_memory_recurrent: the wkv state (s, n_embd
x head size) is read through build_rs and written back after the op; the token shift rows (r)
are the graphs' own (build_rwkv_token_shift_load/store).
"""
from __future__ import annotations

from .. import ggml
from ..ggml import GGMLAbort
from ..graph import GraphContext
from ..model import Layer
from ..model_loader import ModelLoader, tn


def load_rwkv6_hparams(ml: ModelLoader, hp) -> None:
    """The keys rwkv6 and rwkv6qwen2 read; a zero wkv.head_size is refused (llama.cpp divides by it)."""
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon", 0.0)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon", 0.0)
    load_wkv_head_size(ml, hp)
    hp.time_mix_extra_dim = ml.get_u32("%s.time_mix_extra_dim")
    hp.time_decay_extra_dim = ml.get_u32("%s.time_decay_extra_dim")
    hp.rescale_every_n_layers = ml.get_u32("%s.rescale_every_n_layers", 0)
    hp.token_shift_count = ml.get_u32("%s.token_shift_count", 2)
    hp.is_recr_arr = (True,) * hp.n_layer     # llm_arch_is_recurrent


def load_wkv_head_size(ml: ModelLoader, hp) -> None:
    hp.wkv_head_size = ml.get_u32("%s.wkv.head_size")
    if hp.wkv_head_size == 0:
        ml.fail(f"{ml.key('%s.wkv.head_size')} is 0: llama.cpp divides the embedding length by it (a crash)")


def build_wkv_state_store(g: GraphContext, wkv_output, il: int) -> None:
    """Copy the new wkv states (after every token's output in the op's result) back into the layer's
    s state; rwkv6-base.cpp and rwkv7-base.cpp do the same."""
    hp, mem, ub = g.hparams, g.kv, g.ubatch
    n_embd, n_seqs = hp.n_embd, ub.n_seqs
    state = ggml.view(wkv_output, (n_embd * hp.wkv_head_size * n_seqs,), (),
                      n_embd * ub.n_tokens * ggml.type_size(ggml.T.F32))
    s = mem.s_l[il]
    dst = ggml.view(s, (hp.n_embd_s() * n_seqs,), (), hp.n_embd_s() * mem.get_head() * ggml.type_size(s.type))
    ggml.build_forward_expand(g.gf, ggml.cpy(state, dst))


def build_rwkv6_channel_mix(g: GraphContext, layer: Layer, cur, x_prev):
    """llm_build_rwkv6_base::build_rwkv6_channel_mix (LLM_ARCH_RWKV6)"""
    sx = ggml.sub(x_prev, cur)
    xk = ggml.add(ggml.mul(sx, layer.channel_mix_lerp_k), cur)
    xr = ggml.add(ggml.mul(sx, layer.channel_mix_lerp_r), cur)
    r = ggml.unary(g.build_lora_mm(layer.channel_mix_receptance, xr), "SIGMOID")
    k = ggml.sqr(ggml.unary(g.build_lora_mm(layer.channel_mix_key, xk), "RELU"))
    return ggml.mul(r, g.build_lora_mm(layer.channel_mix_value, k))


def build_rwkv6_time_mix(g: GraphContext, inp, cur, x_prev, il: int):
    """llm_build_rwkv6_base::build_rwkv6_time_mix"""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    mem = g.kv
    n_tokens, n_seqs = ub.n_tokens, ub.n_seqs
    n_seq_tokens = n_tokens // n_seqs
    n_embd, head_size = hp.n_embd, hp.wkv_head_size
    n_head = n_embd // head_size
    n_head_kv = hp.n_head_kv(il)
    kv_head = mem.get_head()
    is_qrwkv = layer.time_mix_first is None
    f32 = ggml.type_size(ggml.T.F32)

    sx = ggml.sub(x_prev, cur)
    sx = ggml.reshape(sx, n_embd, n_tokens)
    cur = ggml.reshape(cur, n_embd, n_tokens)
    xxx = ggml.add(ggml.mul(sx, layer.time_mix_lerp_x), cur)
    xxx = ggml.reshape(ggml.unary(g.mul_mat_no_lora(layer.time_mix_w1, xxx), "TANH"),
                       layer.time_mix_w1.ne[1] // 5, 1, 5, n_tokens)
    xxx = ggml.cont(ggml.permute(xxx, 0, 1, 3, 2))
    w2 = layer.time_mix_w2
    xxx = ggml.mul_mat(ggml.reshape(w2, w2.ne[0], w2.ne[1], 1, 5), xxx)

    def part(i: int):
        return ggml.view(xxx, (n_embd, n_tokens), (xxx.nb[1],), n_embd * n_tokens * i * f32)

    if layer.time_mix_lerp_fused is not None:
        sx = ggml.reshape(sx, n_embd, 1, n_tokens)
        cur = ggml.reshape(cur, n_embd, 1, n_tokens)
        xxx = ggml.add(ggml.mul(ggml.add(xxx, layer.time_mix_lerp_fused), sx), cur)
        xw, xk, xv, xr, xg = (part(i) for i in range(5))
    else:   # unfused lerps, "for backward compatibility"
        xw, xk, xv, xr, xg = (part(i) for i in range(5))
        xw, xk, xv, xr, xg = (ggml.add(ggml.mul(ggml.add(x, lerp), sx), cur) for x, lerp in
                              ((xw, layer.time_mix_lerp_w), (xk, layer.time_mix_lerp_k), (xv, layer.time_mix_lerp_v),
                               (xr, layer.time_mix_lerp_r), (xg, layer.time_mix_lerp_g)))
    r = g.build_lora_mm(layer.time_mix_receptance, xr)
    k = g.build_lora_mm(layer.time_mix_key, xk)
    v = g.build_lora_mm(layer.time_mix_value, xv)
    if layer.time_mix_receptance_b is not None:
        r = ggml.add(r, layer.time_mix_receptance_b)
    if layer.time_mix_key_b is not None:
        k = ggml.add(k, layer.time_mix_key_b)
    if layer.time_mix_value_b is not None:
        v = ggml.add(v, layer.time_mix_value_b)
    gate = g.build_lora_mm(layer.time_mix_gate, xg)
    gate = ggml.unary(gate, "SIGMOID" if is_qrwkv else "SILU")
    if n_head_kv != 0 and n_head_kv != n_head:
        if n_head % n_head_kv != 0:
            raise GGMLAbort(f"llama.cpp would abort (rwkv6-base.cpp GGML_ASSERT(n_head % n_head_kv == 0)): "
                            f"{n_head} wkv heads, {n_head_kv} KV heads")
        k = ggml.reshape(k, head_size, 1, n_head_kv, n_tokens)
        v = ggml.reshape(v, head_size, 1, n_head_kv, n_tokens)
        tmp = ggml.new_tensor(ggml.T.F32, head_size, n_head // n_head_kv, n_head_kv, n_tokens)
        k = ggml.repeat(k, tmp)
        v = ggml.repeat(v, tmp)
    k = ggml.reshape(k, head_size, n_head, n_tokens)
    v = ggml.reshape(v, head_size, n_head, n_tokens)
    r = ggml.reshape(r, head_size, n_head, n_tokens)

    w = g.mul_mat_no_lora(layer.time_mix_decay_w2, ggml.unary(g.mul_mat_no_lora(layer.time_mix_decay_w1, xw), "TANH"))
    w = ggml.add(w, layer.time_mix_decay)
    w = ggml.unary(ggml.unary(ggml.unary(w, "EXP"), "NEG"), "EXP")
    w = ggml.reshape(w, head_size, n_head, n_tokens)
    if is_qrwkv:
        k = ggml.sub(k, ggml.mul(k, w))   # k * (1 - w)
    s = mem.s_l[il]
    wkv_state = g.build_rs(inp, s, hp.n_embd_s(), n_seqs)
    if is_qrwkv:
        wkv_output = ggml.gated_linear_attn(k, v, r, w, wkv_state, head_size ** -0.5)
    else:
        wkv_output = ggml.rwkv_wkv6(k, v, r, layer.time_mix_first, w, wkv_state)
    cur = ggml.view(wkv_output, (n_embd * n_tokens,), (), 0)   # before the store names wkv_output
    build_wkv_state_store(g, wkv_output, il)
    if not is_qrwkv:   # group norm with head_count groups
        cur = ggml.reshape(cur, n_embd // n_head, n_head, n_tokens)
        cur = ggml.norm(cur, 64e-5)
        cur = ggml.reshape(cur, n_embd, n_tokens)
        cur = ggml.add(ggml.mul(cur, layer.time_mix_ln), layer.time_mix_ln_b)
    else:
        cur = ggml.reshape(cur, n_embd, n_tokens)
    cur = ggml.mul(cur, gate)
    cur = g.build_lora_mm(layer.time_mix_output, cur)
    return ggml.reshape(cur, n_embd, n_seq_tokens, n_seqs)
