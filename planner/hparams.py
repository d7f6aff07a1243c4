"""Model hyperparameters: the parts of llama_hparams (src/llama-hparams.h/.cpp) that shape memory.

Filled by model.load_hparams (llama_model_base::load_hparams) and each architecture's
load_arch_hparams in planner/models/. Per-layer values are tuples of n_layer_all entries, read only
after the layer count is bounded by LLAMA_MAX_LAYERS; the accessors take the layer as llama.cpp's do.
"""
from __future__ import annotations

from dataclasses import dataclass

LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024

# enum llama_swa_type
LLAMA_SWA_TYPE_NONE, LLAMA_SWA_TYPE_STANDARD, LLAMA_SWA_TYPE_CHUNKED, LLAMA_SWA_TYPE_SYMMETRIC = 0, 1, 2, 3

# enum llama_rope_type
LLAMA_ROPE_TYPE_NONE, LLAMA_ROPE_TYPE_NORM, LLAMA_ROPE_TYPE_NEOX = -1, 0, 2
LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_IMROPE = 8, 40
GGML_MROPE_SECTIONS = 4

# enum llama_rope_scaling_type, by the names llama_rope_scaling_type_from_string accepts
LLAMA_ROPE_SCALING_TYPES = {"none": 0, "linear": 1, "yarn": 2, "longrope": 3}
LLAMA_ROPE_SCALING_TYPE_LONGROPE = 3

# enum llama_pooling_type
LLAMA_POOLING_TYPE_UNSPECIFIED, LLAMA_POOLING_TYPE_NONE, LLAMA_POOLING_TYPE_MEAN = -1, 0, 1
LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_LAST, LLAMA_POOLING_TYPE_RANK = 2, 3, 4
LLAMA_POOLING_TYPES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}   # --pooling's names


class UnsupportedModel(Exception):
    """One-line reason why schedplan cannot plan this model (or why llama.cpp would refuse it)."""


@dataclass(init=False)
class HParams:
    """llama_hparams. Its generated __init__ (about 200 parameters) would cost every plan some 3 ms to
    build at import: the one below takes the same keywords (dataclasses.replace passes them all)."""
    arch: str
    n_ctx_train: int = 0
    n_embd: int = 0
    n_layer: int = 0              # llama_hparams::n_layer(): the layers the graph runs (n_layer_all - n_layer_nextn)
    n_layer_all: int = 0          # block_count: with the multi-token-prediction (NextN) layers
    n_layer_nextn: int = 0        # nextn_predict_layers: loaded and placed, never in the main graph
    n_vocab: int = 0
    n_token_types: int = 0        # vocab.n_token_types(): tokenizer.ggml.token_type_count (BERT's segments)
    n_head_arr: tuple[int, ...] = ()
    n_head_kv_arr: tuple[int, ...] = ()
    n_ff_arr: tuple[int, ...] = ()
    n_embd_head_k_full: int = 0
    n_embd_head_v_full: int = 0
    n_embd_head_k_swa: int = 0
    n_embd_head_v_swa: int = 0
    n_rot_full: int = 0
    n_rot_swa: int = 0
    n_expert: int = 0
    n_expert_used_arr: tuple[int, ...] = ()
    n_ff_exp_arr: tuple[int, ...] = ()
    n_expert_groups: int = 0
    n_group_used: int = 0
    expert_weights_scale: float = 0.0
    expert_weights_norm: bool = False
    expert_gating_func: int = 0            # llama_expert_gating_func_type; 0 = NONE
    n_expert_shared: int = 0
    n_layer_dense_lead: int = 0
    dense_2_feat_in: int = 0               # sentence-transformers' dense projections (gemma-embedding, gemma3)
    dense_2_feat_out: int = 0
    dense_3_feat_in: int = 0
    dense_3_feat_out: int = 0
    llm_ffn_op: str = ""                   # modern-bert: the FFN's op from hidden_activation (GEGLU by default)
    moe_every_n_layers: int = 0            # nomic-bert-moe: every n-th layer's FFN is an expert one
    n_lora_q: int = 0                      # multi-head latent attention (DeepSeek V2/V3)
    n_lora_kv: int = 0
    n_embd_head_k_mla_impl: int = 0
    n_embd_head_v_mla_impl: int = 0
    n_lora_kv_swa: int = 0                 # dots3note: the sliding-window layers' MLA geometry
    n_embd_head_k_mla_swa: int = 0
    n_embd_head_v_mla_swa: int = 0
    indexer_n_head: int = 0                # DeepSeek sparse attention's lightning indexer (deepseek32)
    indexer_head_size: int = 0
    indexer_top_k: int = 0
    is_indexer_full_arr: tuple[bool, ...] = ()   # glm-dsa: layers with their own indexer (the others reuse its top-k)
    indexer_kpool: int = 0                 # glm5-next: the indexer scores pools of kpool consecutive keys
    indexer_kpool_select_tail: bool = False   # glm5-next: the incomplete last pool always joins the selection
    indexer_block_size: int = 0            # minimax-m3's MSA: positions per block, and the local blocks always kept
    indexer_local_blocks: int = 0
    f_norm_eps: float = 0.0
    f_norm_group_eps: float = 0.0          # wavtokenizer-dec: its group norms (LLM_NORM_GROUP)
    n_norm_groups: int = 0
    posnet_n_embd: int = 0                 # wavtokenizer-dec: hparams.posnet and hparams.convnext
    posnet_n_layer: int = 0
    convnext_n_embd: int = 0
    convnext_n_layer: int = 0
    f_clamp_kqv: float = 0.0
    f_max_alibi_bias: float = 0.0          # ALiBi (baichuan 13B, refact, bloom, mpt, jais): the attention's slope bias
    use_par_res: bool = False              # gptneox: attention and FFN in parallel (use_parallel_residual)
    swin_norm: bool = False                # chameleon: the norms after attention and FFN instead of before
    f_norm_rms_eps: float = 0.0
    f_attention_scale: float = 0.0
    f_embedding_scale: float = 0.0
    f_attn_temp_scale: float = 0.0
    f_attn_logit_softcapping: float = 50.0
    f_attn_out_scale: float = 0.0          # grok: attention.output_scale, multiplies KQ before its tanh cap
    f_final_logit_softcapping: float = 30.0
    attn_soft_cap: bool = False
    rope_type: int = LLAMA_ROPE_TYPE_NORM
    rope_freq_base_train: float = 10000.0
    rope_freq_base_train_swa: float = 10000.0
    rope_scaling_type_train: int = 1
    n_ctx_orig_yarn: int = 0
    swa_type: int = LLAMA_SWA_TYPE_NONE
    n_swa: int = 0
    is_swa_arr: tuple[bool, ...] = ()
    n_no_rope_layer_step: int = 4          # every n-th layer has no rope (smollm3, llama4); llama-hparams.h's default
    n_moe_layer_step: int = 0              # llama4: every n-th layer has experts (interleave_moe_layer_step)
    use_kq_norm: bool = False              # llama4: L2 norm of Q and K on the rope layers
    causal_attn: bool = True
    pooling_type: int = LLAMA_POOLING_TYPE_UNSPECIFIED       # the model's default pooling for embeddings
    pooling_type_cls: int = LLAMA_POOLING_TYPE_UNSPECIFIED   # a rank head's pooling (modern-bert's "mean")
    n_cls_out: int = 1                     # a classifier's outputs: classifier.output_labels' length
    n_embd_out_impl: int = 0               # embedding_length_out: the embeddings' width when not n_embd
    # recurrent layers (llama_memory_recurrent): Mamba-2, gated delta net, short convolution
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0
    ssm_n_group: int = 0
    ssm_dt_b_c_rms: bool = False
    n_shortconv_l_cache: int = 0
    n_embd_head_kda: int = 0               # kimi-linear, bailingmoe3: the KDA layers' head size (kda.head_dim)
    kda_gate_lower_bound: float = float("-inf")   # kimi-k3, bailingmoe3: the KDA gate's lower bound (-inf: softplus)
    n_expert_latent: int = 0               # kimi-k3: the routed experts' latent width (0: n_embd)
    attn_res_block_size: int = 0           # kimi-k3: cross-layer attention residuals banked every n layers
    situ_beta: float = 1.0                 # kimi-k3: the situ activation's betas
    situ_linear_beta: float = 0.0
    n_embd_head_la: int = 0                # minimax-01: the lightning attention layers' head size
    # RWKV: token shift rows (r) and a head_size x head_size wkv state per head (s)
    wkv_head_size: int = 0
    token_shift_count: int = 2
    time_mix_extra_dim: int = 0
    time_decay_extra_dim: int = 0
    rescale_every_n_layers: int = 0
    n_lora_decay: int = 0                  # RWKV-7's LoRA ranks
    n_lora_iclr: int = 0
    n_lora_value_res_mix: int = 0
    n_lora_gate: int = 0
    is_recr_arr: tuple[bool, ...] = ()
    rope_pattern: tuple[bool, ...] = ()     # granite: rope.scaling.finetuned switches rope per layer
    # nemotron_h: a non-recurrent layer is attention-only (no FFN size) or FFN-only (no KV heads)
    attn_only_arr: tuple[bool, ...] = ()
    ffn_only_arr: tuple[bool, ...] = ()
    # t5, t5encoder: relative position buckets; t5's decoder block count (n_layer unless the file says)
    n_rel_attn_bkts: int = 0
    dec_n_layer: int = 0
    f_logit_scale: float = 0.0
    f_residual_scale: float = 0.0
    n_ff_shexp: int = 0
    n_ff_chexp: int = 0                    # grovemoe: the chunk experts' size, experts per group, their weight
    n_group_experts: int = 0
    expert_group_scale: float = 0.0
    xielu_alpha_n: tuple[float, ...] = ()      # apertus: the per-layer xIELU activation's parameters
    xielu_alpha_p: tuple[float, ...] = ()
    xielu_beta: tuple[float, ...] = ()
    xielu_eps: tuple[float, ...] = ()
    swiglu_clamp_exp: tuple[float, ...] = ()     # per-layer SwiGLU limits of the experts / the dense and
    swiglu_clamp_shexp: tuple[float, ...] = ()   # shared FFNs (swiglu_clamp_exp/_shexp; absent: all 0)
    moe_latent_size: int = 0               # nemotron_h_moe: experts work in a smaller latent space
    rope_sections: tuple[int, ...] = (0, 0, 0, 0)
    n_deepstack_layers: int = 0            # qwen3vl(moe): the input rows carry this many extra n_embd blocks
    n_embd_inp_impl: int = 0               # gemma4-assistant: the input rows are the target's (n_embd_out)
    n_embd_inp_enc_impl: int = 0           # eagle3: the encoder's input rows (the target's fused hidden states)
    target_layer_ids: tuple[int, ...] = ()  # llama_model::target_layer_ids (eagle3, dflash): the target layers it reads
    norm_before_residual: bool = False     # eagle3: the normed target features feed the residual
    norm_before_fc: bool = False           # eagle3.1: an RMS norm before the feature fusion
    dflash_block_size: int = 0             # dflash: the trained noise block; DFlash2's convolutions and selector
    dflash_conv_kernel_size: int = 0
    dflash_conv_group_size: int = 0
    dflash_selector_rank: int = 0
    dflash_selector_top_k: int = 0
    dflash_sample_from_anchor: bool = True   # dspark: the first block slot is a prediction (else a bonus token)
    deepstack_mapping_arr: tuple[int, ...] = ()   # granite: per layer, the input block it adds (-1 past the array)
    n_layer_kv_from_start: int = -1        # gemma4: if non-negative, only the first n layers have their own K/V
    n_embd_per_layer: int = 0              # gemma4: per-layer token embeddings (E2B/E4B)
    n_altup: int = 4                       # gemma3n: altup_num_inputs, altup_active_idx, the LAuReL rank and the
    i_altup_act: int = 0                   # per-layer embedding width: llama_hparams' defaults, which no
    laurel_rank: int = 64                  # loader reads
    n_embd_altup: int = 256
    # DeepSeek-V4: grouped low-rank output projection, compressed attention, hyper-connections, hash routing
    dsv4_o_group_count: int = 0
    dsv4_o_lora_rank: int = 0
    dsv4_hc_mult: int = 0                  # hyper-connection streams (hyper_connection.count; qwen4exp too)
    dsv4_hc_sinkhorn_iters: int = 0
    dsv4_hash_layer_count: int = 0         # the leading layers that route by token id (ffn_gate_tid2eid)
    dsv4_compress_rope_base: float = 0.0
    dsv4_hc_eps: float = 0.0
    hc_magnitude: float = 0.0              # hy_v4: the post gates' magnitude (hyper_connection.magnitude)
    # per layer: 0 (window only), 4 (CSA + indexer) or 128 (HCA); qwen4exp: tokens per QSA block
    dsv4_compress_ratios: tuple[int, ...] = ()
    n_layer_phys: int = 0                  # nanbeige: the physical layers, run n_loops times (llama_model_nanbeige's
    n_loops: int = 1                       # members), output_norm between loops unless skip_loop_final_norm
    skip_loop_final_norm: bool = False
    n_hrm_layers_per_stack: int = 0        # hrm_text: the low and high stacks' layers, their cycles; the file's
    n_hrm_h_cycles: int = 0                # block_count is the cache slots, layers_per_stack * h * (l + 1)
    n_hrm_l_cycles: int = 0
    router_layer: int = -1                 # graniteswitch: the extra last layer holding the adapter router's K/V
    n_adapters: int = 0                    # graniteswitch: embedded LoRA adapters (slots 1..n) of this rank
    max_lora_rank: int = 0
    adapter_substitutes: tuple[int, ...] = ()   # the token each adapter-activating token is embedded as
    f_attn_value_scale: float = 0.0        # mimo2: the attention output's scale (attention.value_scale; 0: none)
    hc_low_rank: int = 0                   # qwen4exp: the streams' mixer is low rank (hyper_connection.low_rank)
    # qwen4exp's PLE n-gram hash embeddings: one layer, (ngram_size - 1) * heads_per_ngram heads of
    # n_embd_per_layer gathered from per_layer_token_embd, a dilated causal conv over them
    is_ple_arr: tuple[bool, ...] = ()
    ple_ngram_size: int = 0
    ple_n_heads: int = 0
    ple_conv_kernel: int = 0
    ple_head_offsets: tuple[int, ...] = ()
    ple_head_vocab_sizes: tuple[int, ...] = ()

    def __init__(self, arch: str, **fields) -> None:
        self.arch = arch
        for name, value in fields.items():
            if name not in self.__dataclass_fields__:
                raise TypeError(f"HParams has no field {name}")
            setattr(self, name, value)

    # --- per-layer accessors (llama-hparams.cpp) --------------------------------------------------

    def n_head(self, il: int = 0) -> int:
        return self.n_head_arr[il]

    def n_head_kv(self, il: int = 0) -> int:
        return self.n_head_kv_arr[il]

    def n_ff(self, il: int = 0) -> int:
        return self.n_ff_arr[il]

    def n_expert_used(self, il: int = 0) -> int:
        return self.n_expert_used_arr[il]

    def n_expert_used_max(self) -> int:
        return max(self.n_expert_used_arr)

    def deepstack_mapping(self, il: int) -> int:
        return self.deepstack_mapping_arr[il] if il < len(self.deepstack_mapping_arr) else -1

    def use_mrope(self) -> bool:
        """llama_hparams::use_mrope"""
        return self.rope_sections[0] > 0 and self.rope_sections[1] > 0

    def swiglu_clamp_exp_at(self, il: int) -> float:
        """hparams.swiglu_clamp_exp[il]: 0 where the architecture does not read the key."""
        return self.swiglu_clamp_exp[il] if self.swiglu_clamp_exp else 0.0

    def swiglu_clamp_shexp_at(self, il: int) -> float:
        return self.swiglu_clamp_shexp[il] if self.swiglu_clamp_shexp else 0.0

    def n_ff_exp(self, il: int = 0) -> int:
        return self.n_ff_exp_arr[il]

    def is_mla(self) -> bool:
        return self.n_embd_head_k_mla_impl != 0 and self.n_embd_head_v_mla_impl != 0

    def n_embd_head_k_mla(self) -> int:
        return self.n_embd_head_k_mla_impl if self.is_mla() else self.n_embd_head_k()

    def n_embd_head_v_mla(self) -> int:
        return self.n_embd_head_v_mla_impl if self.is_mla() else self.n_embd_head_v()

    def is_swa(self, il: int) -> bool:
        return self.is_swa_arr[il]

    def is_swa_any(self) -> bool:
        return any(self.is_swa_arr)

    def is_recr(self, il: int) -> bool:
        # false past the array, as llama.cpp's LLAMA_MAX_LAYERS-sized is_recr_impl is
        return il < len(self.is_recr_arr) and self.is_recr_arr[il]

    def is_ple(self, il: int) -> bool:
        return il < len(self.is_ple_arr) and self.is_ple_arr[il]

    def ple_conv_state(self) -> int:
        """llama_hparams::ple_conv_state: the PLE conv's history, dilated by the n-gram size, over the
        hc streams (0 without PLE); uint32_t arithmetic."""
        if self.ple_n_heads == 0 or self.ple_conv_kernel == 0:
            return 0
        return (self.ple_conv_kernel - 1) * self.ple_ngram_size * self.dsv4_hc_mult * self.n_embd & 0xFFFFFFFF

    def is_indexer_full(self, il: int) -> bool:
        return self.is_indexer_full_arr[il]

    def has_attn(self, il: int) -> bool:
        return not (self.ffn_only_arr and self.ffn_only_arr[il])

    def has_ffn(self, il: int) -> bool:
        return not (self.attn_only_arr and self.attn_only_arr[il])

    def has_kv(self, il: int) -> bool:
        """llama_hparams::has_kv: the later layers may reuse an earlier layer's K/V (gemma4)"""
        return self.n_layer_kv_from_start < 0 or il < self.n_layer_kv_from_start

    def has_rope(self, il: int) -> bool:
        if self.router_layer >= 0 and il == self.router_layer:   # the router's K/V is no position
            return False
        return not self.rope_pattern or self.rope_pattern[il]

    def n_embd_r(self) -> int:
        """llama_hparams::n_embd_r: a recurrent layer's conv state (LFM2: its short conv's cache; RWKV:
        its token shifts). uint32_t arithmetic."""
        if self.wkv_head_size != 0:
            return self.token_shift_count * self.n_embd & 0xFFFFFFFF
        if self.n_shortconv_l_cache != 0:
            return self.n_embd * (self.n_shortconv_l_cache - 1)
        if self.n_embd_head_kda != 0:
            # Kimi KDA: the Q, K and V short convolutions' states
            return 3 * (self.ssm_d_conv - 1 if self.ssm_d_conv > 0 else 3) * self.n_head() * self.n_embd_head_kda
        d_conv = self.ssm_d_conv - 1 if self.ssm_d_conv > 0 else 0
        return d_conv * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    def n_embd_s(self) -> int:
        """llama_hparams::n_embd_s: a recurrent layer's SSM state (Kimi KDA: head x head per head; RWKV:
        the wkv state, n_embd x head size). uint32_t arithmetic."""
        if self.wkv_head_size != 0:
            return self.n_embd * self.wkv_head_size & 0xFFFFFFFF
        if self.n_embd_head_kda != 0:
            return self.n_embd_head_kda * self.n_embd_head_kda * self.n_head()
        if self.n_embd_head_la != 0:
            # MiniMax-Text-01's lightning attention: head x head per head
            return self.n_embd_head_la * self.n_embd_head_la * self.n_head() & 0xFFFFFFFF
        return self.ssm_d_state * self.ssm_d_inner

    def n_embd_inp(self) -> int:
        """llama_hparams::n_embd_inp: n_embd_inp_impl where set, else n_embd plus one n_embd per
        deepstack layer (uint32_t arithmetic)."""
        if self.n_embd_inp_impl > 0:
            return self.n_embd_inp_impl
        return (self.n_embd + self.n_embd * self.n_deepstack_layers) & 0xFFFFFFFF

    def n_embd_out(self) -> int:
        return self.n_embd_out_impl if self.n_embd_out_impl > 0 else self.n_embd
    def n_embd_inp_enc(self) -> int:
        """llama_hparams::n_embd_inp_enc"""
        return self.n_embd_inp_enc_impl if self.n_embd_inp_enc_impl > 0 else self.n_embd_inp()

    def n_pos_per_embd(self) -> int:
        return GGML_MROPE_SECTIONS if self.rope_type in (LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_IMROPE) else 1

    def n_embd_head_k(self, il: int = 0) -> int:
        return self.n_embd_head_k_swa if self.is_swa(il) else self.n_embd_head_k_full

    def n_embd_head_v(self, il: int = 0) -> int:
        return self.n_embd_head_v_swa if self.is_swa(il) else self.n_embd_head_v_full

    def n_rot(self, il: int = 0) -> int:
        return self.n_rot_swa if self.is_swa(il) else self.n_rot_full

    def n_embd_k_gqa(self, il: int = 0) -> int:
        return self.n_embd_head_k(il) * self.n_head_kv(il)

    def n_embd_v_gqa(self, il: int = 0) -> int:
        return self.n_embd_head_v(il) * self.n_head_kv(il)

    def n_embd_v_gqa_max(self) -> int:
        return max(self.n_embd_v_gqa(il) for il in range(self.n_layer_all))

    def set_swa_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        """llama_hparams::set_swa_pattern: every n_pattern-th layer is dense (the last of each
        period, or the first with dense_first); n_pattern 0 makes every layer SWA."""
        def is_swa(il: int) -> bool:
            return n_pattern == 0 or (il % n_pattern != 0 if dense_first else il % n_pattern < n_pattern - 1)
        # the NextN layers are never SWA
        self.is_swa_arr = tuple(is_swa(il) for il in range(self.n_layer)) + (False,) * self.n_layer_nextn
