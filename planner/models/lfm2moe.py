"""LLM_ARCH_LFM2MOE (src/models/lfm2moe.cpp): Liquid LFM2-8B-A1B, LFM2-24B-A2B.

LFM2's short-convolution and attention blocks and graph (llama_model_lfm2moe::graph is
llama_model_lfm2::graph) with routed experts after the leading dense layers: sigmoid or softmax
gating with a selection bias, normalised weights.
"""
from __future__ import annotations

from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_NONE, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import ModelLoader, tn
from . import lfm2

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX
build = lfm2.build


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_shortconv_l_cache = ml.get_u32("%s.shortconv.l_cache")
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    hp.is_recr_arr = tuple(hp.n_head_kv(il) == 0 for il in range(hp.n_layer))
    hp.swa_type = LLAMA_SWA_TYPE_NONE
    require(ml, hp.n_shortconv_l_cache > 1, f"{ml.key('%s.shortconv.l_cache')} must be above 1")
    require(ml, hp.expert_gating_func in (1, 2, 3),
            f"{ml.key('%s.expert_gating_func')} is {hp.expert_gating_func}, not a gating function planned (1-3)")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_expert, n_ff_exp = hp.n_embd, hp.n_expert, hp.n_ff_exp()
    lfm2.load_embd_output_tensors(c, model)
    for i, layer in enumerate(model.layers):
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        if i >= hp.n_layer_dense_lead:
            require(c.ml, n_expert > 0 and hp.n_expert_used() > 0, "n_expert and n_expert_used must be > 0")
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,))
        else:
            n_ff = hp.n_ff(i)
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        lfm2.load_operator_tensors(c, layer, i)
    lfm2.load_dense_out_tensors(c, model)
