"""LLM_ARCH_MINIMAX_M3 (src/models/minimax-m3.cpp): MiniMax-M3 (428B-A23B).

MiniMax-M2's GQA with per-head QK norms and partial NEOX rope, DeepSeek-V3's leading dense layers
and routed experts (gating from the header, a selection bias) beside shared experts, all swigluoai;
and MiniMax Sparse Attention on the layers past the dense ones, over llama_kv_cache_msa: an indexer
head per KV head scores the cached positions, max-pooled per block; each query attends to the top
blocks (and the local ones the bias forces). MSA runs only with flash attention and per-sequence
streams; otherwise every layer is dense.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import GGMLAbort, Tensor
from ..graph import LLM_FFN_SWIGLU_OAI_MOE, LLM_NORM_RMS, GraphContext, mul_mat_hadamard
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require, require_gating_func
from ..model_loader import ModelLoader, tn
from .deepseek2 import build_ffn_dense_or_moe

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    hp.indexer_n_head = ml.get_u32("%s.attention.indexer.head_count")
    hp.indexer_head_size = ml.get_u32("%s.attention.indexer.key_length")
    hp.indexer_top_k = ml.get_u32("%s.attention.indexer.top_k")
    hp.indexer_block_size = ml.get_u32("%s.attention.indexer.block_size")
    hp.indexer_local_blocks = ml.get_u32("%s.attention.indexer.local_blocks")
    require(ml, hp.indexer_block_size > 0, f"{ml.key('%s.attention.indexer.block_size')} is 0 (GGML_ASSERT)")
    require_gating_func(ml, hp)   # build_moe_ffn aborts on any other value
    # no assert in llama.cpp: a routed layer without experts reads a null expert output
    require(ml, hp.n_expert > 0 or hp.n_layer_dense_lead >= hp.n_layer,
            f"the {ml.arch} graph needs experts past the leading dense layers ({ml.key('%s.expert_count')} is 0)")
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_gqa, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_embd_v_gqa(), hp.n_embd_head_k()
    n_head, n_expert, n_ff, n_ff_exp = hp.n_head(), hp.n_expert, hp.n_ff(), hp.n_ff_exp()
    n_ff_shexp = n_ff_exp * hp.n_expert_shared
    idx_dim = hp.indexer_head_size
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * n_head, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * n_head, n_embd))
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        # per-head QK norms: one head's vector for every head
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        if i < hp.n_layer_dense_lead:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
            continue
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp))
        layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd))
        layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp))
        layer.indexer_q_proj = c.create_tensor(tn("INDEXER_Q_PROJ", "weight", i), (n_embd, hp.indexer_n_head * idx_dim))
        layer.indexer_k_proj = c.create_tensor(tn("INDEXER_K_PROJ", "weight", i), (n_embd, idx_dim))
        layer.indexer_q_norm = c.create_tensor(tn("INDEXER_Q_NORM", "weight", i), (idx_dim,))
        layer.indexer_k_norm = c.create_tensor(tn("INDEXER_K_NORM", "weight", i), (idx_dim,))


class MSAInput:
    """llm_graph_input_msa: the per-graph block layout every sparse layer shares (bias and pos_mask
    per token, the position -> cell map per stream; cell_blk for a batch, pos_slot_f at decode)."""

    def __init__(self, n_tokens: int, n_kv: int, n_ps: int, nblk: int, ns: int, decode: bool):
        self.bias = _input(ggml.new_tensor(ggml.T.F32, nblk, n_tokens))
        self.pos_mask = _input(ggml.new_tensor(ggml.T.F32, n_ps, n_tokens))
        self.pos_slot_i = _input(ggml.new_tensor(ggml.T.I32, n_ps, ns))
        self.pos_slot_f = _input(ggml.new_tensor(ggml.T.F32, n_ps, ns)) if decode else None
        self.cell_blk = None if decode else _input(ggml.new_tensor(ggml.T.I32, n_kv, ns))


def _input(t: Tensor) -> Tensor:
    t.set_input()
    return t


def build(g: GraphContext) -> None:
    """llama_model_minimax_m3::graph"""
    model, hp, cp = g.model, g.hparams, g.cparams
    n_embd_head, n_tokens = hp.n_embd_head_v(), g.ubatch.n_tokens
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    # MSA reads V untransposed (flash attention) and anchors blocks to per-stream slots
    msa_enabled = cp.flash_attn and (cp.n_seq_max == 1 or not cp.kv_unified)
    inp_attn = g.build_attn_inp_kv_msa(msa_enabled)
    msa = msa_mf = None
    blk = hp.indexer_block_size
    if msa_enabled:
        msa_kqm = inp_attn.kq_mask
        n_kv, n_tps, ns = msa_kqm.ne[0], msa_kqm.ne[1], msa_kqm.ne[3]
        # every position in the cache, in whole blocks: GGML_PAD, whose bit mask is exact for powers of two
        n_ps = (g.kv.get_n_pos() + blk - 1) & ~(blk - 1)
        nblk = n_ps // blk
        decode = n_tps == 1
        msa = MSAInput(n_tokens, n_kv, n_ps, nblk, ns, decode)
        if not decode:
            msa_mf = ggml.cast(msa_kqm, ggml.T.F32)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(k, "Kcur_normed", il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        kq_scale = 1.0 / math.sqrt(n_embd_head)
        if not (msa_enabled and il >= hp.n_layer_dense_lead):
            cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il)
        else:
            cur = build_attn_msa(g, inp_attn, msa, msa_mf, cur, q, k, v, inp_pos, kq_scale, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = build_ffn_dense_or_moe(g, layer, ffn_inp, hp.expert_weights_norm, il, LLM_FFN_SWIGLU_OAI_MOE)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)


def build_attn_msa(g: GraphContext, inp, msa: MSAInput, msa_mf, cur: Tensor, q: Tensor, k_cur: Tensor, v_cur: Tensor,
                   inp_pos: Tensor, kq_scale: float, il: int) -> Tensor:
    """A sparse layer: the indexer's normed, roped keys into its cache; Q/K/V into the base cache;
    per stream, block scores (indexer queries against the keys gathered through the position ->
    cell map, max-pooled per block, the local blocks forced), the top blocks' mask over the cells
    and one grouped flash attention (a batch), or at decode the top blocks' keys and values
    gathered for all streams at once; then the output projection."""
    hp, layer = g.hparams, g.model.layers[il]
    n_tokens = g.ubatch.n_tokens
    n_idx_dim, hd, blk = hp.indexer_head_size, hp.indexer_n_head, hp.indexer_block_size
    iq = g.build_lora_mm(layer.indexer_q_proj, cur)
    ik = g.build_lora_mm(layer.indexer_k_proj, cur)
    iq = ggml.reshape(iq, n_idx_dim, hd, n_tokens)
    ik = ggml.reshape(ik, n_idx_dim, 1, n_tokens)
    iq = g.build_norm(iq, layer.indexer_q_norm, None, LLM_NORM_RMS, il)
    ik = g.build_norm(ik, layer.indexer_k_norm, None, LLM_NORM_RMS, il)
    iq = ggml.rope_ext(iq, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
    ik = ggml.rope_ext(ik, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
    kv_idx, kv = g.kv.idx, inp.kv
    ggml.build_forward_expand(g.gf, kv_idx.cpy_k(ik, inp.k_idxs_idx, il))
    ik_kv = kv_idx.get_k(il)
    if inp.k_rot is not None:
        q = mul_mat_hadamard(q, inp.k_rot)
        k_cur = mul_mat_hadamard(k_cur, inp.k_rot)
    if inp.v_rot is not None:
        v_cur = mul_mat_hadamard(v_cur, inp.v_rot)
    for t in (q, k_cur, v_cur):
        ggml.build_forward_expand(g.gf, t)
    ggml.build_forward_expand(g.gf, kv.cpy_k(k_cur, inp.k_idxs, il))
    ggml.build_forward_expand(g.gf, kv.cpy_v(v_cur, inp.v_idxs, il))
    k, v = kv.get_k(il), kv.get_v(il)
    d, hkv = k.ne[0], k.ne[1]
    n_head = hp.n_head()
    gp = n_head // hkv
    if hkv != hd:
        raise GGMLAbort(f"llama.cpp would abort (minimax-m3.cpp GGML_ASSERT(HKV == Hd)): {hkv} KV heads, "
                        f"{hd} indexer heads (MSA needs one per GQA group)")
    n_kv, ns, nblk = inp.kq_mask.ne[0], inp.kq_mask.ne[3], msa.bias.ne[0]
    n_ps = msa.pos_mask.ne[0]
    n_top = min(hp.indexer_top_k, nblk)
    if msa.pos_slot_f is not None:   # decode: one token per stream
        ik3 = ggml.view(ik_kv, (n_idx_dim, n_kv, ns), (ik_kv.nb[2], ik_kv.nb[3]), 0)
        ikp = ggml.get_rows(ik3, msa.pos_slot_i)
        iq4 = ggml.reshape(iq, n_idx_dim, hd, 1, ns)
        sc = ggml.mul_mat(ggml.reshape(ikp, n_idx_dim, n_ps, 1, ns), iq4)
        sc = ggml.add(sc, ggml.reshape(msa.pos_mask, n_ps, 1, 1, ns), inplace=True)
        bs = ggml.pool_2d(sc, ggml.POOL_MAX, blk, 1, blk, 1, 0, 0)
        g.cb(bs, "msa_bs", il)
        bsf = ggml.add(bs, ggml.reshape(msa.bias, nblk, 1, 1, ns))
        idx = ggml.top_k(bsf, n_top)
        # positions of the top blocks, their cells (through the position -> cell map), their K/V rows
        a = ggml.scale(ggml.cast(idx, ggml.T.F32), float(blk))
        a = ggml.reshape(a, 1, n_top, hd, ns)
        tj = ggml.add(ggml.repeat_4d(a, blk, n_top, hd, ns), ggml.reshape(ggml.arange(0.0, float(blk), 1.0), blk, 1, 1))
        tokj = ggml.cast(ggml.reshape(tj, blk * n_top * hd, ns), ggml.T.I32)
        cs = ggml.get_rows(ggml.reshape(msa.pos_slot_f, 1, n_ps, ns), tokj)
        cs = ggml.reshape(cs, blk, n_top, hd, ns)
        tr = ggml.add(ggml.scale(cs, float(hkv)), ggml.reshape(ggml.arange(0.0, float(hkv), 1.0), 1, 1, hd))
        tokr = ggml.cast(ggml.reshape(tr, blk * n_top * hd, ns), ggml.T.I32)
        k3 = ggml.view(k, (d, hkv * n_kv, ns), (k.nb[1], k.nb[3]), 0)
        v3 = ggml.view(v, (d, hkv * n_kv, ns), (v.nb[1], v.nb[3]), 0)
        mp = ggml.reshape(msa.pos_mask, 1, n_ps, ns)
        kg = ggml.get_rows(k3, tokr)
        vg = ggml.get_rows(v3, tokr)
        mg = ggml.get_rows(mp, tokj)
        kt = ggml.T.F16 if ggml.is_quantized(k.type) else k.type
        vt = ggml.T.F16 if ggml.is_quantized(v.type) else v.type
        kfa = ggml.reshape(kg, d, blk * n_top, 1, hd * ns)
        vfa = ggml.reshape(vg, d, blk * n_top, 1, hd * ns)
        if kfa.type != kt:
            kfa = ggml.cast(kfa, kt)
        if vfa.type != vt:
            vfa = ggml.cast(vfa, vt)
        mfa = ggml.cast(ggml.reshape(mg, blk * n_top, 1, 1, hd * ns), ggml.T.F16)
        cur = build_attn_msa_fa(g, q, kfa, vfa, mfa, gp, kq_scale, il)
    else:
        n_tps = n_tokens // ns
        outs = []
        for st in range(ns):
            iq_s = ggml.view(iq, (n_idx_dim, hd, n_tps), (iq.nb[1], iq.nb[2]), st * n_tps * iq.nb[2])
            ik_s = ggml.view(ik_kv, (n_idx_dim, n_kv), (ik_kv.nb[2],), st * ik_kv.nb[3])
            psl_s = ggml.view(msa.pos_slot_i, (n_ps,), (), st * msa.pos_slot_i.nb[1])
            pm_s = ggml.view(msa.pos_mask, (n_ps, 1, n_tps), (msa.pos_mask.nb[1], msa.pos_mask.nb[1]),
                             st * n_tps * msa.pos_mask.nb[1])
            cb_s = ggml.view(msa.cell_blk, (n_kv,), (), st * msa.cell_blk.nb[1])
            mf_s = ggml.view(msa_mf, (n_kv, n_tps, 1), (msa_mf.nb[1], msa_mf.nb[3]), st * msa_mf.nb[3])
            bias_s = ggml.view(msa.bias, (nblk, 1, n_tps), (msa.bias.nb[1], msa.bias.nb[1]),
                               st * n_tps * msa.bias.nb[1])
            q_s = ggml.view(q, (d, n_head, n_tps), (q.nb[1], q.nb[2]), st * n_tps * q.nb[2])
            k_s = ggml.view(k, (d, hkv, n_kv, 1), (k.nb[1], k.nb[2], k.nb[3]), st * k.nb[3])
            v_s = ggml.view(v, (d, hkv, n_kv, 1), (v.nb[1], v.nb[2], v.nb[3]), st * v.nb[3])

            ikp = ggml.get_rows(ik_s, psl_s)
            sc = ggml.mul_mat(ikp, ggml.reshape(iq_s, n_idx_dim, hd * n_tps))
            sc = ggml.reshape(sc, n_ps, hd, n_tps)
            sc = ggml.add(sc, pm_s, inplace=True)   # unmapped positions come out -inf
            bs = ggml.pool_2d(sc, ggml.POOL_MAX, blk, 1, blk, 1, 0, 0)
            g.cb(bs, "msa_bs", il)
            bsf = ggml.add(bs, bias_s)   # the local blocks rank first
            g.cb(bsf, "msa_bsf", il)
            idx = ggml.top_k(bsf, n_top)
            # the top blocks' mask: -inf everywhere, zeros set at the chosen blocks
            ninf = ggml.cast(ggml.scale_bias(bias_s, 0.0, -1e30), ggml.T.F16)
            ninf = ggml.repeat_4d(ninf, nblk, hd, n_tps, 1)
            zero = ggml.scale(ggml.cast(idx, ggml.T.F32), 0.0)
            bm = ggml.set_rows(ggml.reshape(ninf, 1, nblk, hd * n_tps), ggml.reshape(zero, 1, n_top, hd * n_tps),
                               ggml.reshape(idx, n_top, hd * n_tps))
            bm = ggml.reshape(bm, nblk, hd, n_tps)
            bm = ggml.cont(ggml.permute(bm, 0, 2, 1, 3))
            g.cb(bm, "msa_block_mask", il)
            # block -> cell through the cell -> position block map, with the causal mask
            bm2 = ggml.cont(ggml.transpose(ggml.reshape(bm, nblk, n_tps * hd)))
            bmc = ggml.get_rows(bm2, cb_s)
            bmx = ggml.cont(ggml.transpose(bmc))
            bmx = ggml.reshape(bmx, n_kv, n_tps, hd)
            mask4 = ggml.add(bmx, mf_s, inplace=True)
            mask4 = ggml.cast(ggml.reshape(mask4, n_kv, n_tps, 1, hd), ggml.T.F16)
            g.cb(mask4, "msa_mask4", il)
            kfa = ggml.permute(k_s, 0, 3, 1, 2)
            vfa = ggml.permute(v_s, 0, 3, 1, 2)
            outs.append(build_attn_msa_fa(g, q_s, kfa, vfa, mask4, gp, kq_scale, il))
        cur = outs[0]
        for out in outs[1:]:
            cur = ggml.concat(cur, out, 1)
    if inp.v_rot is not None:
        cur = mul_mat_hadamard(cur, inp.v_rot)
    g.cb(cur, "kqv_out", il)
    if layer.wo is not None:
        cur = g.build_lora_mm(layer.wo, cur)
    return cur


def build_attn_msa_fa(g: GraphContext, q_cur: Tensor, k: Tensor, v: Tensor, mask: Tensor, gp: int, kq_scale: float,
                      il: int) -> Tensor:
    """build_attn_msa_fa: one flash attention for every GQA group (and at decode every stream), the
    groups on its sequence dimension: q [D, HQ, T] as [D, R, Gp, C] against k/v [D, n_keys, 1, C]."""
    d, hq, t = q_cur.ne[0], q_cur.ne[1], q_cur.ne[2]
    c = k.ne[3]
    r = hq * t // (gp * c)
    if gp * c * r != hq * t:
        raise GGMLAbort("llama.cpp would abort (minimax-m3.cpp GGML_ASSERT(Gp*C*R == HQ*T))")
    q = ggml.reshape(q_cur, d, gp, c, r)
    q = ggml.permute(q, 0, 2, 3, 1)
    o = ggml.flash_attn_ext(q, k, v, mask, kq_scale, 0.0, 0.0)
    g.cb(o, "msa_fattn", il)
    o = ggml.permute(o, 0, 1, 3, 2)
    if not o.is_contiguous():
        o = ggml.cont(o)   # a copy for a batch, no-op layout at decode
    return ggml.reshape(o, d * hq, t)
