"""tools/mtmd/clip.cpp (llama.cpp 0c1e57098): the projector GGUF's loader (clip_model_loader: the
header's keys read and checked, the tensors each projector type asks for placed on the device mtmd
chooses), the shared graph builders (clip_graph: build_vit, build_attn, build_ffn, ...) and the
warm-up reservation clip_init makes, whose per-device sizes mtmd_get_memory_usage reports.

The projector's graph builders live in planner/mtmd/models/<name>.py beside
tools/mtmd/models/<name>.cpp. Every projector type llama.cpp knows is planned but gemma3na, which
clip.cpp itself refuses (NO_HPARAMS_TYPES); one llama.cpp does not know is refused as clip.cpp refuses it.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from ...backends import cpu, rpc
from ...backends.types import Backend, BufferType
from .. import ggml
from ..devices import BadDevices, local_devices, rpc_memory
from ..download import read_model_header
from ..gallocr import alloc_ctx_tensors
from ..ggml import Buffer, GGMLAbort, Tensor
from ..gguf import ARRAY, BOOL, FLOAT32, INT32, STRING, UINT32, GGUFHeader, _type_name, shown
from ..hparams import UnsupportedModel
from ..params import Params
from ..sched import Sched

# clip-impl.h: keys
KEY_NAME = "general.name"
KEY_DESCRIPTION = "general.description"
KEY_PROJ_TYPE = "clip.projector_type"
KEY_HAS_AUDIO_ENC = "clip.has_audio_encoder"
KEY_HAS_VISION_ENC = "clip.has_vision_encoder"
KEY_HAS_GEN_AUDIO_ENC = "clip.has_gen_audio_encoder"
KEY_USE_GELU = "clip.use_gelu"
KEY_USE_SILU = "clip.use_silu"
KEY_N_EMBD = "clip.%s.embedding_length"
KEY_N_FF = "clip.%s.feed_forward_length"
KEY_N_BLOCK = "clip.%s.block_count"
KEY_PROJ_DIM = "clip.%s.projection_dim"
KEY_N_HEAD = "clip.%s.attention.head_count"
KEY_N_HEAD_KV = "clip.%s.attention.head_count_kv"
KEY_N_EMBD_HEAD = "clip.%s.attention.head_dim"
KEY_LAYER_NORM_EPS = "clip.%s.attention.layer_norm_epsilon"
KEY_FEATURE_LAYERS = "clip.%s.feature_layer"
KEY_VISION_PROJ_TYPE = "clip.vision.projector_type"
KEY_AUDIO_PROJ_TYPE = "clip.audio.projector_type"
KEY_GEN_AUDIO_PROJ_TYPE = "clip.gen.audio.projector_type"
KEY_IMAGE_SIZE = "clip.vision.image_size"
KEY_PATCH_SIZE = "clip.vision.patch_size"
KEY_IMAGE_MEAN = "clip.vision.image_mean"
KEY_IMAGE_STD = "clip.vision.image_std"
KEY_IMAGE_GRID_PINPOINTS = "clip.vision.image_grid_pinpoints"
KEY_MINICPMV_VERSION = "clip.minicpmv_version"
KEY_MINICPMV_QUERY_NUM = "clip.minicpmv_query_num"
KEY_A_NUM_MEL_BINS = "clip.audio.num_mel_bins"
KEY_A_PROJ_STACK_FACTOR = "clip.audio.projector.stack_factor"
KEY_PROJ_SCALE_FACTOR = "clip.vision.projector.scale_factor"
KEY_SPATIAL_MERGE_SIZE = "clip.vision.spatial_merge_size"
KEY_WIN_ATTN_PATTERN = "clip.vision.n_wa_pattern"
KEY_MM_PATCH_MERGE_TYPE = "clip.vision.mm_patch_merge_type"
KEY_PREPROC_IMAGE_SIZE = "clip.vision.preproc_image_size"
KEY_PREPROC_MIN_TILES = "clip.vision.preproc_min_tiles"
KEY_PREPROC_MAX_TILES = "clip.vision.preproc_max_tiles"
KEY_WIN_ATTN_LAYER_INDEXES = "clip.vision.wa_layer_indexes"
KEY_IMAGE_MIN_PIXELS = "clip.vision.image_min_pixels"
KEY_IMAGE_MAX_PIXELS = "clip.vision.image_max_pixels"
KEY_A_RVQ_NUM_QUANTIZERS = "clip.audio.rvq.num_quantizers"
KEY_A_RVQ_CODEBOOK_SIZE = "clip.audio.rvq.codebook_size"
KEY_A_WA_PATTERN_MODE = "clip.audio.wa_pattern_mode"
KEY_A_ATTN_WINDOW_SIZE = "clip.audio.window_size"
KEY_A_LOCAL_BLOCK_COUNT = "clip.audio.local_block_count"
KEY_A_LOCAL_GROUP_SIZE = "clip.audio.local_group_size"
KEY_A_CONV_KERNEL_SIZE = "clip.audio.conv_kernel_size"
KEY_AUDIO_SUBSMPL_FACTOR = "clip.audio.subsampling_factor"
KEY_A_CHUNK_SIZE = "clip.audio.chunk_size"
KEY_A_MAX_POS_EMB = "clip.audio.max_pos_emb"
KEY_A_PROJ_WINDOW_SIZE = "clip.audio.projector.window_size"
KEY_A_PROJ_DOWNSAMPLE_RATE = "clip.audio.projector.downsample_rate"
KEY_A_PROJ_HEAD_COUNT = "clip.audio.projector.head_count"
KEY_ATTN_WINDOW_SIZE = "clip.vision.window_size"
KEY_PROJ_SAMPLE_QUERY_SIDE = "clip.vision.projector.query_side"
KEY_PROJ_SAMPLE_WINDOW_SIDE = "clip.vision.projector.window_side"
KEY_PROJ_SPATIAL_OFFSETS = "clip.vision.projector.spatial_offsets"
KEY_WA_PATTERN_MODE = "clip.vision.wa_pattern_mode"
KEY_SWIGLU_CLAMP = "clip.vision.swiglu_clamp"
KEY_VISION_N_EXPERT_USED = "clip.vision.expert_used_count"
KEY_SAM_N_HEAD = "clip.vision.sam.head_count"
KEY_SAM_N_BLOCK = "clip.vision.sam.block_count"
KEY_SAM_N_EMBD = "clip.vision.sam.embedding_length"

# clip-impl.h: tensor names
TN_POS_EMBD = "%s.position_embd.weight"
TN_CLASS_EMBD = "v.class_embd"
TN_PATCH_EMBD = "v.patch_embd.weight"
TN_PATCH_EMBD_1 = "v.patch_embd.weight.1"
TN_PATCH_BIAS = "v.patch_embd.bias"
TN_NORM_EMBD = "v.norm_embd.%s"
TN_PATCH_NORM = "v.patch_norm.%d.%s"
TN_ATTN_QKV = "%s.blk.%d.attn_qkv.%s"
TN_ATTN_K = "%s.blk.%d.attn_k.%s"
TN_ATTN_Q = "%s.blk.%d.attn_q.%s"
TN_ATTN_V = "%s.blk.%d.attn_v.%s"
TN_ATTN_OUTPUT = "%s.blk.%d.attn_out.%s"
TN_ATTN_SINKS = "%s.blk.%d.attn_sinks"
TN_ATTN_K_NORM = "%s.blk.%d.attn_k_norm.%s"
TN_ATTN_Q_NORM = "%s.blk.%d.attn_q_norm.%s"
TN_FFN_DOWN = "%s.blk.%d.ffn_down.%s"
TN_FFN_GATE = "%s.blk.%d.ffn_gate.%s"
TN_FFN_UP = "%s.blk.%d.ffn_up.%s"
TN_FFN_GATE_INP = "%s.blk.%d.ffn_gate_inp.%s"
TN_FFN_GATE_EXPS = "%s.blk.%d.ffn_gate_exps.%s"
TN_FFN_UP_EXPS = "%s.blk.%d.ffn_up_exps.%s"
TN_FFN_DOWN_EXPS = "%s.blk.%d.ffn_down_exps.%s"
TN_FFN_EXP_PROBS_B = "%s.blk.%d.exp_probs_b.%s"
TN_LN_1 = "%s.blk.%d.ln1.%s"
TN_LN_2 = "%s.blk.%d.ln2.%s"
TN_LS_1 = "%s.blk.%d.ls1.%s"
TN_LS_2 = "%s.blk.%d.ls2.%s"
TN_LS_OUT = "%s.blk.%d.out_scale.%s"
TN_ATTN_POST_NORM = "%s.blk.%d.attn_post_norm.%s"
TN_FFN_POST_NORM = "%s.blk.%d.ffn_post_norm.%s"
TN_LN_PRE = "%s.pre_ln.%s"
TN_LN_POST = "%s.post_ln.%s"
TN_LLAVA_PROJ = "mm.%d.%s"
TN_MVLM_PROJ_MLP = "mm.model.mlp.%d.%s"
TN_MVLM_PROJ_BLOCK = "mm.model.mb_block.%d.block.%d.%s"
TN_MVLM_PROJ_PEG = "mm.model.peg.%d.%s"
TN_IMAGE_NEWLINE = "v.image_newline"
TN_MM_POST_FC_NORM = "mm.post_fc_norm.%s"
TN_MM_H_TO_4H = "mm.up.%s"
TN_MM_4H_TO_H = "mm.down.%s"
TN_TOK_BOI = "v.boi"
TN_TOK_EOI = "v.eoi"
TN_TOK_GLM_BOI = "adapter.boi"
TN_TOK_GLM_EOI = "adapter.eoi"
TN_GLM_ADAPER_CONV = "adapter.conv.%s"
TN_GLM_ADAPTER_LINEAR = "adapter.linear.linear.%s"
TN_GLM_ADAPTER_NORM_1 = "adapter.linear.norm1.%s"
TN_GLM_ADAPTER_D_H_2_4H = "adapter.linear.dense_h_to_4h.%s"
TN_GLM_ADAPTER_GATE = "adapter.linear.gate.%s"
TN_GLM_ADAPTER_D_4H_2_H = "adapter.linear.dense_4h_to_h.%s"
TN_VIT_MERGER_LN1 = "v.vit_merger.ln1.%s"
TN_VIT_MERGER_ATTN_Q = "v.vit_merger.attn_q.%s"
TN_VIT_MERGER_ATTN_K = "v.vit_merger.attn_k.%s"
TN_VIT_MERGER_ATTN_V = "v.vit_merger.attn_v.%s"
TN_VIT_MERGER_ATTN_O = "v.vit_merger.attn_out.%s"
TN_VIT_MERGER_DS_LN = "v.vit_merger.ds_ln.%s"
TN_VIT_MERGER_DS_UP = "v.vit_merger.ds_ffn_up.%s"
TN_VIT_MERGER_DS_DOWN = "v.vit_merger.ds_ffn_down.%s"
TN_MNV5_STEM_CONV = "v.conv_stem.conv.weight"
TN_MNV5_STEM_BIAS = "v.conv_stem.conv.bias"
TN_MNV5_STEM_BN = "v.conv_stem.bn.weight"
TN_MNV5_BLK_S0_EXP_W = "v.blk.%d.%d.conv_exp.weight"
TN_MNV5_BLK_S0_BN1_W = "v.blk.%d.%d.bn1.weight"
TN_MNV5_BLK_S0_PWL_W = "v.blk.%d.%d.conv_pwl.weight"
TN_MNV5_BLK_S0_BN2_W = "v.blk.%d.%d.bn2.weight"
TN_MNV5_BLK_DW_START_W = "v.blk.%d.%d.dw_start.conv.weight"
TN_MNV5_BLK_DW_START_BN = "v.blk.%d.%d.dw_start.bn.weight"
TN_MNV5_BLK_DW_MID_W = "v.blk.%d.%d.dw_mid.conv.weight"
TN_MNV5_BLK_DW_MID_BN = "v.blk.%d.%d.dw_mid.bn.weight"
TN_MNV5_BLK_PW_EXP_W = "v.blk.%d.%d.pw_exp.conv.weight"
TN_MNV5_BLK_PW_EXP_BN = "v.blk.%d.%d.pw_exp.bn.weight"
TN_MNV5_BLK_PW_PROJ_W = "v.blk.%d.%d.pw_proj.conv.weight"
TN_MNV5_BLK_PW_PROJ_BN = "v.blk.%d.%d.pw_proj.bn.weight"
TN_MNV5_BLK_LAYER_SCALE = "v.blk.%d.%d.layer_scale.gamma"
TN_MNV5_ATTN_Q_W = "v.blk.%d.%d.attn.query.proj.weight"
TN_MNV5_ATTN_K_W = "v.blk.%d.%d.attn.key.proj.weight"
TN_MNV5_ATTN_V_W = "v.blk.%d.%d.attn.value.proj.weight"
TN_MNV5_ATTN_O_W = "v.blk.%d.%d.attn.output.proj.weight"
TN_MNV5_ATTN_K_DW = "v.blk.%d.%d.attn.key.down_conv.weight"
TN_MNV5_ATTN_K_NORM = "v.blk.%d.%d.attn.key.norm.weight"
TN_MNV5_ATTN_V_DW = "v.blk.%d.%d.attn.value.down_conv.weight"
TN_MNV5_ATTN_V_NORM = "v.blk.%d.%d.attn.value.norm.weight"
TN_MNV5_ATTN_NORM = "v.blk.%d.%d.norm.weight"
TN_MNV5_MSFA_FFN_EXP_W = "v.msfa.ffn.pw_exp.conv.weight"
TN_MNV5_MSFA_FFN_EXP_BN = "v.msfa.ffn.pw_exp.bn.weight"
TN_MNV5_MSFA_FFN_PROJ_W = "v.msfa.ffn.pw_proj.conv.weight"
TN_MNV5_MSFA_FFN_PROJ_BN = "v.msfa.ffn.pw_proj.bn.weight"
TN_MNV5_MSFA_NORM = "v.msfa.norm.weight"
TN_MINICPMV_POS_EMBD_K = "resampler.pos_embed_k"
TN_MINICPMV_QUERY = "resampler.query"
TN_MINICPMV_PROJ = "resampler.proj.weight"
TN_MINICPMV_KV_PROJ = "resampler.kv.weight"
TN_MINICPMV_ATTN = "resampler.attn.%s.%s"
TN_MINICPMV_LN = "resampler.ln_%s.%s"
TN_MM_INP_NORM = "mm.input_norm.weight"
TN_MM_INP_NORM_B = "mm.input_norm.bias"
TN_MM_INP_PROJ = "mm.input_projection.weight"
TN_MM_PROJECTOR = "mm.model.fc.%s"
TN_MM_PATCH_MERGER = "mm.patch_merger.%s"
TN_MM_UP = "mm.up.%s"
TN_MM_GATE = "mm.gate.%s"
TN_MM_DOWN = "mm.down.%s"
TN_MM_POST_NORM = "mm.post_norm.%s"
TN_TOK_IMG_BREAK = "v.token_embd.img_break"
TN_STD_BIAS = "v.std_bias"
TN_STD_SCALE = "v.std_scale"
TN_MM_SOFT_EMB_N = "mm.soft_emb_norm.weight"
TN_A_MM_INP_PROJ = "mm.a.input_projection.%s"
TN_A_MM_SOFT_EMB_N = "mm.a.soft_emb_norm.%s"
TN_A_INP_PROJ = "a.input_projection.%s"
TN_A_CONV1D = "a.conv1d.%d.%s"
TN_A_CONV1D_NORM = "a.conv1d.%d.norm.%s"
TN_A_OUT_PROJ = "a.pre_encode.out.%s"
TN_A_ATTN_PRE_NORM = "%s.blk.%d.attn_pre_norm.%s"
TN_A_ATTN_K_REL = "%s.blk.%d.attn_k_rel.%s"
TN_A_PER_DIM_SCALE = "%s.blk.%d.per_dim_scale.%s"
TN_A_PER_DIM_K_SCALE = "%s.blk.%d.per_dim_k_scale.%s"
TN_A_FFN_POST_NORM_1 = "%s.blk.%d.ffn_post_norm_1.%s"
TN_FFN_NORM = "%s.blk.%d.ffn_norm.%s"
TN_FFN_NORM_1 = "%s.blk.%d.ffn_norm_1.%s"
TN_FFN_UP_1 = "%s.blk.%d.ffn_up_1.%s"
TN_FFN_DOWN_1 = "%s.blk.%d.ffn_down_1.%s"
TN_NORM_CONV = "%s.blk.%d.norm_conv.%s"
TN_CONV_DW = "%s.blk.%d.conv_dw.%s"
TN_CONV_NORM = "%s.blk.%d.conv_norm.%s"
TN_CONV_PW1 = "%s.blk.%d.conv_pw1.%s"
TN_CONV_PW2 = "%s.blk.%d.conv_pw2.%s"
TN_A_DOWNSAMPLE_CONV = "a.downsample.conv.%s"
TN_A_DOWNSAMPLE_NORM = "a.downsample.norm.%s"
TN_A_RVQ_CODEBOOK = "a.rvq.codebook.%s"
TN_MM_A_CODE_EMBD = "mm.a.code_embd.%s"
TN_MM_A_LOCAL_ATTN_Q = "mm.a.local_blk.%d.attn_q.%s"
TN_MM_A_LOCAL_ATTN_K = "mm.a.local_blk.%d.attn_k.%s"
TN_MM_A_LOCAL_ATTN_V = "mm.a.local_blk.%d.attn_v.%s"
TN_MM_A_LOCAL_ATTN_OUT = "mm.a.local_blk.%d.attn_out.%s"
TN_MM_A_LOCAL_FFN_GATE = "mm.a.local_blk.%d.ffn_gate.%s"
TN_MM_A_LOCAL_FFN_UP = "mm.a.local_blk.%d.ffn_up.%s"
TN_MM_A_LOCAL_FFN_DOWN = "mm.a.local_blk.%d.ffn_down.%s"
TN_MM_A_LOCAL_LN1 = "mm.a.local_blk.%d.ln1.%s"
TN_MM_A_LOCAL_LN2 = "mm.a.local_blk.%d.ln2.%s"
TN_MM_A_LOCAL_NORM = "mm.a.local_norm.%s"
TN_CONV_NORM_MEAN = "%s.blk.%d.conv_norm_mean"
TN_CONV_NORM_VAR = "%s.blk.%d.conv_norm_var"
TN_INP_PROJ = "a.input_projection.%s"
TN_CTC_OUT = "a.enc_ctc_out.%s"
TN_CTC_OUT_MID = "a.enc_ctc_out_mid.%s"
TN_ATTN_REL_POS_EMB = "%s.blk.%d.attn_rel_pos_emb"
TN_QF_PROJ_QUERY = "%s.proj_query"
TN_QF_PROJ_NORM = "%s.proj_norm.%s"
TN_QF_PROJ_LINEAR = "%s.proj_linear.%s"
TN_QF_SELF_ATTN_Q = "%s.proj_blk.%d.self_attn_q.%s"
TN_QF_SELF_ATTN_K = "%s.proj_blk.%d.self_attn_k.%s"
TN_QF_SELF_ATTN_V = "%s.proj_blk.%d.self_attn_v.%s"
TN_QF_SELF_ATTN_O = "%s.proj_blk.%d.self_attn_out.%s"
TN_QF_SELF_ATTN_N = "%s.proj_blk.%d.self_attn_norm.%s"
TN_QF_CROSS_ATTN_Q = "%s.proj_blk.%d.cross_attn_q.%s"
TN_QF_CROSS_ATTN_K = "%s.proj_blk.%d.cross_attn_k.%s"
TN_QF_CROSS_ATTN_V = "%s.proj_blk.%d.cross_attn_v.%s"
TN_QF_CROSS_ATTN_O = "%s.proj_blk.%d.cross_attn_out.%s"
TN_QF_CROSS_ATTN_N = "%s.proj_blk.%d.cross_attn_norm.%s"
TN_QF_FFN_UP = "%s.proj_blk.%d.ffn_up.%s"
TN_QF_FFN_DOWN = "%s.proj_blk.%d.ffn_down.%s"
TN_QF_FFN_NORM = "%s.proj_blk.%d.ffn_norm.%s"
TN_MEL_FILTERS = "a.mel_filters"
TN_WINDOW = "a.window"
TN_PRE_ENCODE_OUT = "a.pre_encode.out.%s"
TN_POS_BIAS_U = "%s.blk.%d.pos_bias_u"
TN_POS_BIAS_V = "%s.blk.%d.pos_bias_v"
TN_LINEAR_POS = "%s.blk.%d.linear_pos.%s"
TN_CONV1D = "a.conv1d.%d.%s"
TN_CONV2D = "a.conv2d.%d.%s"
TN_CONV_OUT = "a.conv_out.%s"
TN_MM_AUDIO_MLP = "mm.a.mlp.%d.%s"
TN_MM_AUDIO_FC = "mm.a.fc.%s"
TN_MM_NORM_PRE = "mm.a.norm_pre.%s"
TN_MM_NORM_MID = "mm.a.norm_mid.%s"
TN_DEEPSTACK_NORM = "v.deepstack.%d.norm.%s"
TN_DEEPSTACK_FC1 = "v.deepstack.%d.fc1.%s"
TN_DEEPSTACK_FC2 = "v.deepstack.%d.fc2.%s"
TN_IMAGE_SEPERATOR = "v.view_seperator"
TN_MM_PRE_NORM = "mm.pre_norm.%s"
TN_MM_IMG_BEGIN = "mm.image_begin"
TN_MM_IMG_END = "mm.image_end"
TN_TOK_IMG_START = "v.token_embd.img_start"
TN_TOK_IMG_END = "v.token_embd.img_end"
TN_TOK_IMG_PAD = "v.token_embd.img_pad"
TN_YASA_PATCH_LN_W = "v.patch_ln.weight"
TN_YASA_PATCH_LN_B = "v.patch_ln.bias"
TN_YASA_BACKBONE_LN_W = "v.backbone_ln.weight"
TN_YASA_BACKBONE_LN_B = "v.backbone_ln.bias"
TN_YASA_POS_EMBD = "v.vision_pos_embed"
TN_YASA_STAGE_DOWN_LN = "v.stage.%d.down.ln.%s"
TN_YASA_STAGE_DOWN_CONV = "v.stage.%d.down.conv.%s"
TN_YASA_STAGE_BLK = "v.stage.%d.blk.%d.%s.%s"
TN_MM_MERGER_FC1 = "mm.merger.fc1.%s"
TN_MM_MERGER_FC2 = "mm.merger.fc2.%s"
TN_SAM_POS_EMBD = "v.sam.pos_embd.%s"
TN_SAM_PATCH_EMBD = "v.sam.patch_embd.%s"
TN_SAM_PRE_NORM = "v.sam.blk.%d.pre_ln.%s"
TN_SAM_POST_NORM = "v.sam.blk.%d.post_ln.%s"
TN_SAM_ATTN_POS_H = "v.sam.blk.%d.attn.pos_h.%s"
TN_SAM_ATTN_POS_W = "v.sam.blk.%d.attn.pos_w.%s"
TN_SAM_ATTN_QKV = "v.sam.blk.%d.attn.qkv.%s"
TN_SAM_ATTN_OUT = "v.sam.blk.%d.attn.out.%s"
TN_SAM_FFN_UP = "v.sam.blk.%d.mlp.lin1.%s"
TN_SAM_FFN_DOWN = "v.sam.blk.%d.mlp.lin2.%s"
TN_SAM_NECK = "v.sam.neck.%d.%s"
TN_SAM_NET = "v.sam.net_%d.%s"
TN_RESMPL_QUERY = "v.resample_query_%d.%s"
TN_MULTI_PROJ_IMG_POS = "v.proj_blk.%d.img_pos"
TN_MULTI_PROJ_QUERY = "%s.proj_blk.%d.query"
TN_MULTI_PROJ_LINEAR = "%s.proj_blk.%d.linear.%s"
TN_MULTI_PROJ_NORM = "%s.proj_blk.%d.norm.%s"
TN_MULTI_PROJ_POST_NORM = "%s.proj_blk.%d.post_norm.%s"
TN_A_SE_CONV1 = "a.blk.%d.se_conv1.%s"
TN_A_SE_CONV2 = "a.blk.%d.se_conv2.%s"
TN_A_CONV_RES2 = "a.blk.%d.res2.%d.%s"
TN_A_ASP_ATTN = "a.asp_attn.%s"
TN_A_ASP_TDNN = "a.asp_tdnn.%s"
TN_A_GEN_CODE_PROJ_IN = "a.gen.code.proj_in.%s"
TN_A_GEN_CODE_EMBD = "a.gen.code.embd.%s"
TN_A_GEN_CODE_HEAD = "a.gen.code.head.%s"
TN_A_GEN_CODE_OUT_EMBD = "a.gen.code.out_embd.%s"
TN_A_GEN_CODE_NORM = "a.gen.code.output_norm.%s"
TN_A_GEN_WAV_QUANT_FIRST_IN = "a.gen.wav.quant.first.in_proj.%s"
TN_A_GEN_WAV_QUANT_FIRST_OUT = "a.gen.wav.quant.first.out_proj.%s"
TN_A_GEN_WAV_QUANT_FIRST_CB = "a.gen.wav.quant.first.codebook.%s"
TN_A_GEN_WAV_QUANT_REST_IN = "a.gen.wav.quant.rest.in_proj.%s"
TN_A_GEN_WAV_QUANT_REST_OUT = "a.gen.wav.quant.rest.out_proj.%s"
TN_A_GEN_WAV_QUANT_REST_CB = "a.gen.wav.quant.rest.codebook.%s"
TN_A_GEN_WAV_PRE_CONV = "a.gen.wav.pre_conv.%s"
TN_A_GEN_WAV_TFM_IN_PROJ = "a.gen.wav.tfm.in_proj.%s"
TN_A_GEN_WAV_TFM_OUT_PROJ = "a.gen.wav.tfm.out_proj.%s"
TN_A_GEN_WAV_TFM_OUT_NORM = "a.gen.wav.tfm.output_norm.%s"
TN_A_GEN_WAV_UP_CONV = "a.gen.wav.up.blk.%d.conv.%s"
TN_A_GEN_WAV_UP_DWCONV = "a.gen.wav.up.blk.%d.dwconv.%s"
TN_A_GEN_WAV_UP_NORM = "a.gen.wav.up.blk.%d.norm.%s"
TN_A_GEN_WAV_UP_PW1 = "a.gen.wav.up.blk.%d.pw1.%s"
TN_A_GEN_WAV_UP_PW2 = "a.gen.wav.up.blk.%d.pw2.%s"
TN_A_GEN_WAV_UP_GAMMA = "a.gen.wav.up.blk.%d.gamma"
TN_A_GEN_WAV_DAC_ENTRY = "a.gen.wav.dac.entry.%s"
TN_A_GEN_WAV_DAC_SNAKE = "a.gen.wav.dac.blk.%d.snake.%s"
TN_A_GEN_WAV_DAC_CONV = "a.gen.wav.dac.blk.%d.conv.%s"
TN_A_GEN_WAV_DAC_RES_ACT1 = "a.gen.wav.dac.blk.%d.res.%d.act1.%s"
TN_A_GEN_WAV_DAC_RES_CONV1 = "a.gen.wav.dac.blk.%d.res.%d.conv1.%s"
TN_A_GEN_WAV_DAC_RES_ACT2 = "a.gen.wav.dac.blk.%d.res.%d.act2.%s"
TN_A_GEN_WAV_DAC_RES_CONV2 = "a.gen.wav.dac.blk.%d.res.%d.conv2.%s"
TN_A_GEN_WAV_DAC_POST_SNAKE = "a.gen.wav.dac.post_snake.%s"
TN_A_GEN_WAV_DAC_POST_CONV = "a.gen.wav.dac.post_conv.%s"
TN_A_SEANET_CONV_IN = "a.seanet.conv_in.%s"
TN_A_SEANET_CONV_OUT = "a.seanet.conv_out.%s"
TN_A_SEANET_RES_CONV1 = "a.seanet.blk.%d.res_conv1.%s"
TN_A_SEANET_RES_CONV2 = "a.seanet.blk.%d.res_conv2.%s"
TN_A_SEANET_SCALE_CONV = "a.seanet.blk.%d.scale_conv.%s"
TN_A_SPEAKER_PROJ = "a.speaker_proj.%s"
TN_A_GEN_FLOW_INPUT_PROJ = "a.gen.flow.input_proj.%s"
TN_A_GEN_FLOW_COND_EMBD = "a.gen.flow.cond_embd.%s"
TN_A_GEN_FLOW_TIME_FREQS = "a.gen.flow.time.%d.freqs"
TN_A_GEN_FLOW_TIME_UP = "a.gen.flow.time.%d.up.%s"
TN_A_GEN_FLOW_TIME_DOWN = "a.gen.flow.time.%d.down.%s"
TN_A_GEN_FLOW_TIME_NORM = "a.gen.flow.time.%d.norm"
TN_A_GEN_FLOW_BLK_NORM = "a.gen.flow.blk.%d.norm.%s"
TN_A_GEN_FLOW_BLK_UP = "a.gen.flow.blk.%d.up.%s"
TN_A_GEN_FLOW_BLK_DOWN = "a.gen.flow.blk.%d.down.%s"
TN_A_GEN_FLOW_BLK_ADA = "a.gen.flow.blk.%d.ada.%s"
TN_A_GEN_FLOW_FINAL_ADA = "a.gen.flow.final.ada.%s"
TN_A_GEN_FLOW_FINAL_PROJ = "a.gen.flow.final.proj.%s"
TN_A_GEN_OUT_EOS = "a.gen.out_eos.%s"
TN_A_GEN_INPUT_LINEAR = "a.gen.input_linear.%s"
TN_A_GEN_EMB_MEAN = "a.gen.emb_mean"
TN_A_GEN_EMB_STD = "a.gen.emb_std"
TN_A_GEN_WAV_QUANT_OUT = "a.gen.wav.quant_out.%s"
TN_A_GEN_WAV_UPSAMPLE = "a.gen.wav.upsample.%s"
TN_A_GEN_WAV_SEANET_CONV_IN = "a.gen.wav.seanet.conv_in.%s"
TN_A_GEN_WAV_SEANET_CONV_OUT = "a.gen.wav.seanet.conv_out.%s"
TN_A_GEN_WAV_SEANET_RES_CONV1 = "a.gen.wav.seanet.blk.%d.res_conv1.%s"
TN_A_GEN_WAV_SEANET_RES_CONV2 = "a.gen.wav.seanet.blk.%d.res_conv2.%s"
TN_A_GEN_WAV_SEANET_SCALE_CONV = "a.gen.wav.seanet.blk.%d.scale_conv.%s"

# clip-impl.h PROJECTOR_TYPE_NAMES: every type llama.cpp knows, by its GGUF name
PROJECTOR_TYPE_NAMES = (
    "mlp", "ldp", "ldpv2", "resampler", "adapter", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger",
    "ling3vl", "step3vl", "gemma3", "gemma3nv", "gemma3na", "gemma4v", "gemma4a", "gemma4uv", "gemma4ua",
    "phi4", "idefics3", "pixtral", "ultravox", "internvl", "llama4", "qwen2a", "qwen3a", "glma", "qwen2.5o",
    "voxtral", "meralion", "musicflamingo", "lfm2", "kimivl", "paddleocr", "lightonocr", "cogvlm",
    "janus_pro", "dots_ocr", "dots3note_v", "dots3note_a", "deepseekocr", "deepseekocr2", "deepseek4v",
    "lfm2a", "glm4v", "glm5v", "youtuvl", "yasa2", "kimik25", "nemotron_v2_vl", "exaone4_5", "hunyuanvl",
    "minicpmv4_6", "granite_speech", "mimovl", "minimax_m3", "granite4_vision", "mimo_audio", "parakeet",
    "qwen3tts_spkenc", "qwen3tts_gen", "pockettts_spkenc", "pockettts_gen", "muse-glimmer",
)

# the graph builder of each planned type (clip_get_graph_builder): module in planner/mtmd/models
GRAPH_BUILDERS = {
    "gemma3": "siglip", "idefics3": "siglip", "lfm2": "siglip",
    "qwen2vl_merger": "qwen2vl", "qwen2.5vl_merger": "qwen2vl",
    "qwen3vl_merger": "qwen3vl",
    "pixtral": "pixtral", "lightonocr": "pixtral",
    "paddleocr": "paddleocr",
    "hunyuanvl": "hunyuanvl",
    "youtuvl": "youtuvl",
    "granite4_vision": "granite4_vision",
    "mimovl": "mimovl",
    "dots_ocr": "dotsocr", "dots3note_v": "dotsocr",
    "kimivl": "kimivl",
    "llama4": "llama4",
    "internvl": "internvl",
    "glm4v": "glm4v", "glm5v": "glm4v",
    "deepseekocr": "deepseekocr", "deepseekocr2": "deepseekocr2",
    "exaone4_5": "exaone4_5",
    "kimik25": "kimik25",
    "minimax_m3": "minimax_m3",
    "deepseek4v": "deepseek4v",
    "yasa2": "yasa2",
    "gemma4v": "gemma4v",
    "ultravox": "whisper_enc", "voxtral": "whisper_enc", "qwen2a": "whisper_enc", "musicflamingo": "whisper_enc",
    "glma": "whisper_enc", "meralion": "whisper_enc",
    "qwen3a": "qwen3a",
    "mlp": "llava", "mlp_norm": "llava", "ldp": "llava", "ldpv2": "llava", "adapter": "llava",
    "resampler": "minicpmv", "minicpmv4_6": "minicpmv",
    "janus_pro": "siglip", "phi4": "siglip",
    "nemotron_v2_vl": "nemotron_v2_vl",
    "cogvlm": "cogvlm",
    "step3vl": "step3vl", "ling3vl": "ling3vl",
    "muse-glimmer": "muse_glimmer",
    "gemma4uv": "gemma4uv",
    "gemma3nv": "mobilenetv5",
    "gemma4ua": "gemma4ua",
    "gemma4a": "gemma4a",
    "lfm2a": "conformer",
    "dots3note_a": "dots3note",
    "mimo_audio": "mimo_audio",
    "parakeet": "parakeet",
    "granite_speech": "granite_speech",
    "qwen3tts_spkenc": "qwen3tts_spkenc",
    "pockettts_spkenc": "pockettts_spkenc",
}

# the known types clip_model_loader::load_hparams has no case for: it reads the common keys, then
# throws "unknown vision projector type" (Gemma 3n's audio encoder: a Gemma 3n file's vision
# encoder, gemma3nv, makes clip_init skip it)
NO_HPARAMS_TYPES = frozenset({"gemma3na"})

# the gen-audio types planned: clip_init loads their weights and reserves nothing for them (its
# "TODO: fix warmup": no warm-up graph, so no builder here)
GEN_AUDIO_TYPES = frozenset({"qwen3tts_gen", "pockettts_gen"})

# clip_modality
MODALITY_VISION, MODALITY_AUDIO, MODALITY_GEN_AUDIO = "vision", "audio", "gen.audio"

# clip_flash_attn_type
FLASH_ATTN_AUTO, FLASH_ATTN_DISABLED, FLASH_ATTN_ENABLED = -1, 0, 1

# ffn_op_type, norm_type
FFN_GELU, FFN_GELU_ERF, FFN_SILU, FFN_GELU_QUICK, FFN_RELU_SQR = range(5)
NORM_TYPE_NORMAL, NORM_TYPE_RMS = range(2)

INT32_MAX = 2**31 - 1


def fail(path: str, reason: str):
    """clip_init's catch: the projector is not loaded (mtmd_get_memory_usage returns nothing, and
    llama-server then fails to start)."""
    raise UnsupportedModel(f"{path}: llama.cpp would fail to load the multimodal projector: {shown(reason, 1000)}")


@dataclass
class ClipHparams:
    """clip_hparams, the fields the planned projector types use."""
    image_size: int = 0
    patch_size: int = 0
    n_embd: int = 0
    n_ff: int = 0
    projection_dim: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    n_embd_head: int = 0
    n_layer: int = 0
    n_merge: int = 1
    image_min_pixels: int = -1
    image_max_pixels: int = -1
    warmup_image_size: int = 0
    warmup_audio_size: int = 3000
    ffn_op: int = FFN_GELU
    eps: float = 1e-6
    rope_theta: float = 0.0
    swiglu_clamp: float = 0.0
    n_wa_pattern: int = 0
    wa_layer_indexes: set[int] = field(default_factory=set)
    wa_pattern_mode: list[int] = field(default_factory=list)
    attn_window_size: int = 0
    proj_spatial_offsets: list[int] = field(default_factory=list)
    downsample_query_side: int = 0
    downsample_window_side: int = 0
    n_expert_used: int = 0
    sam_n_layer: int = 0
    sam_n_head: int = 0
    sam_n_embd: int = 0
    image_longest_edge: int = 0
    preproc_min_tiles: int = 0
    preproc_max_tiles: int = 0
    feature_layers: list[int] = field(default_factory=list)
    n_mel_bins: int = 0
    proj_stack_factor: int = 0
    minicpmv_version: int = 0
    minicpmv_query_num: int = 0
    custom_image_min_tokens: int = -1
    custom_image_max_tokens: int = -1
    has_llava_projector: bool = False
    insert_layer_id: int = 0      # MiniCPM-V 4.6's ViT merger insertion layer
    muse_glimmer_sparse_factor: int = 0

    def is_feature_layer(self, layer: int) -> bool:
        return layer in self.feature_layers
    rvq_num_quantizers: int = 0
    rvq_codebook_size: list[int] = field(default_factory=list)
    audio_local_n_layer: int = 0
    audio_local_group_size: int = 0
    subsampling_factor: int = 0
    audio_conv_kernel_size: int = 0
    audio_chunk_size: int = 0
    audio_max_pos_emb: int = 0
    audio_proj_window_size: int = 0
    audio_proj_downsample_rate: int = 0
    audio_proj_head_count: int = 0
    n_mel_filters: int = 0          # parakeet's a.mel_filters and a.window: their f32 values (get_vector)
    n_window: int = 0
    wav_tfm_n_layer: int = 0
    wav_upsample_n_block: int = 0
    wav_dac_n_block: int = 0
    wav_dac_n_res: int = 0
    seanet_ratios: list[int] = field(default_factory=list)
    seanet_n_stage: int = 0
    mimi_downsample: int = 0
    mimi_tfm_context: int = 0

    def set_limit_image_tokens(self, n_tokens_min: int, n_tokens_max: int) -> None:
        patch_area = self.patch_size * self.patch_size * self.n_merge * self.n_merge
        self.image_min_pixels = _i32((self.custom_image_min_tokens if self.custom_image_min_tokens > 0
                                      else n_tokens_min) * patch_area)
        self.image_max_pixels = _i32((self.custom_image_max_tokens if self.custom_image_max_tokens > 0
                                      else n_tokens_max) * patch_area)
        self.warmup_image_size = int(math.sqrt(self.image_max_pixels)) if self.image_max_pixels >= 0 else _nan_int()

    def set_limit_image_tokens_custom(self) -> None:
        """set_limit_image_tokens() without defaults: only --image-min/max-tokens set the limits."""
        patch_area = self.patch_size * self.patch_size * self.n_merge * self.n_merge
        if self.custom_image_min_tokens > 0:
            self.image_min_pixels = _i32(self.custom_image_min_tokens * patch_area)
        if self.custom_image_max_tokens > 0:
            self.image_max_pixels = _i32(self.custom_image_max_tokens * patch_area)

    def set_warmup_n_tokens(self, n_tokens: int) -> None:
        n_tok_per_side = int(math.sqrt(n_tokens))
        self.warmup_image_size = _i32(n_tok_per_side * self.patch_size * self.n_merge)


def _i32(x: int) -> int:
    """A C int product: wraps at 32 bits."""
    return (x + 2**31) % 2**32 - 2**31


def _nan_int() -> int:
    """static_cast<int>(std::sqrt(negative)): NaN to int, INT_MIN on x86."""
    return -2**31


@dataclass
class ClipLayer:
    """clip_layer, the fields the planned projector types use."""
    ln_1_w: Optional[Tensor] = None
    ln_1_b: Optional[Tensor] = None
    k_w: Optional[Tensor] = None
    k_b: Optional[Tensor] = None
    q_w: Optional[Tensor] = None
    q_b: Optional[Tensor] = None
    v_w: Optional[Tensor] = None
    v_b: Optional[Tensor] = None
    qkv_w: Optional[Tensor] = None
    qkv_b: Optional[Tensor] = None
    o_w: Optional[Tensor] = None
    o_b: Optional[Tensor] = None
    attn_sinks: Optional[Tensor] = None
    k_norm: Optional[Tensor] = None
    q_norm: Optional[Tensor] = None
    attn_post_norm_w: Optional[Tensor] = None
    ff_up_w: Optional[Tensor] = None
    ff_up_b: Optional[Tensor] = None
    ff_gate_w: Optional[Tensor] = None
    ff_gate_b: Optional[Tensor] = None
    ff_down_w: Optional[Tensor] = None
    ff_down_b: Optional[Tensor] = None
    ff_gate_inp_w: Optional[Tensor] = None
    ff_gate_exps_w: Optional[Tensor] = None
    ff_up_exps_w: Optional[Tensor] = None
    ff_down_exps_w: Optional[Tensor] = None
    ff_exp_probs_b: Optional[Tensor] = None
    ln_2_w: Optional[Tensor] = None
    ln_2_b: Optional[Tensor] = None
    ff_post_norm_w: Optional[Tensor] = None
    ls_1_w: Optional[Tensor] = None
    ls_2_w: Optional[Tensor] = None
    ls_out_w: Optional[Tensor] = None
    deepstack_norm_w: Optional[Tensor] = None
    deepstack_norm_b: Optional[Tensor] = None
    deepstack_fc1_w: Optional[Tensor] = None
    deepstack_fc1_b: Optional[Tensor] = None
    deepstack_fc2_w: Optional[Tensor] = None
    deepstack_fc2_b: Optional[Tensor] = None
    # the conformer's (Gemma 4 audio)
    ff_norm_w: Optional[Tensor] = None
    ff_norm_b: Optional[Tensor] = None
    pos_bias_u: Optional[Tensor] = None
    pos_bias_v: Optional[Tensor] = None
    linear_pos_w: Optional[Tensor] = None
    attn_pre_norm_w: Optional[Tensor] = None
    per_dim_scale_w: Optional[Tensor] = None
    per_dim_k_scale_w: Optional[Tensor] = None
    attn_k_rel_w: Optional[Tensor] = None
    norm_conv_w: Optional[Tensor] = None
    norm_conv_b: Optional[Tensor] = None
    conv_pw1_w: Optional[Tensor] = None
    conv_pw1_b: Optional[Tensor] = None
    conv_dw_w: Optional[Tensor] = None
    conv_dw_b: Optional[Tensor] = None
    conv_norm_w: Optional[Tensor] = None
    conv_norm_b: Optional[Tensor] = None
    conv_norm_mean: Optional[Tensor] = None
    conv_norm_var: Optional[Tensor] = None
    conv_pw2_w: Optional[Tensor] = None
    conv_pw2_b: Optional[Tensor] = None
    ff_norm_1_w: Optional[Tensor] = None
    ff_norm_1_b: Optional[Tensor] = None
    ff_up_1_w: Optional[Tensor] = None
    ff_up_1_b: Optional[Tensor] = None
    ff_down_1_w: Optional[Tensor] = None
    ff_down_1_b: Optional[Tensor] = None
    ff_post_norm_1_w: Optional[Tensor] = None
    attn_rel_pos_emb: Optional[Tensor] = None
    # a QFormer layer's cross-attention (Granite Speech)
    cross_attn_q_w: Optional[Tensor] = None
    rel_pos_h: Optional[Tensor] = None            # a SAM layer's relative positions
    rel_pos_w: Optional[Tensor] = None
    cross_attn_q_b: Optional[Tensor] = None
    cross_attn_k_w: Optional[Tensor] = None
    cross_attn_k_b: Optional[Tensor] = None
    cross_attn_v_w: Optional[Tensor] = None
    cross_attn_v_b: Optional[Tensor] = None
    cross_attn_o_w: Optional[Tensor] = None
    cross_attn_o_b: Optional[Tensor] = None
    cross_attn_norm_w: Optional[Tensor] = None
    cross_attn_norm_b: Optional[Tensor] = None
    se_conv1_w: Optional[Tensor] = None
    se_conv1_b: Optional[Tensor] = None
    se_conv2_w: Optional[Tensor] = None
    se_conv2_b: Optional[Tensor] = None
    res2_conv_w: list[Tensor] = field(default_factory=list)
    res2_conv_b: list[Tensor] = field(default_factory=list)

    def has_deepstack(self) -> bool:
        return self.deepstack_fc1_w is not None


@dataclass
class MobilenetV5Block:
    """mobilenetv5_block: an edge residual (stage 0), a universal inverted residual or an MQA block."""
    s0_conv_exp_w: Optional[Tensor] = None
    s0_bn1_w: Optional[Tensor] = None
    s0_conv_pwl_w: Optional[Tensor] = None
    s0_bn2_w: Optional[Tensor] = None
    dw_start_w: Optional[Tensor] = None
    dw_start_bn_w: Optional[Tensor] = None
    pw_exp_w: Optional[Tensor] = None
    pw_exp_bn_w: Optional[Tensor] = None
    dw_mid_w: Optional[Tensor] = None
    dw_mid_bn_w: Optional[Tensor] = None
    pw_proj_w: Optional[Tensor] = None
    pw_proj_bn_w: Optional[Tensor] = None
    layer_scale_w: Optional[Tensor] = None
    attn_q_w: Optional[Tensor] = None
    attn_k_w: Optional[Tensor] = None
    attn_v_w: Optional[Tensor] = None
    attn_o_w: Optional[Tensor] = None
    attn_k_dw_w: Optional[Tensor] = None
    attn_k_norm_w: Optional[Tensor] = None
    attn_v_dw_w: Optional[Tensor] = None
    attn_v_norm_w: Optional[Tensor] = None
    attn_norm_w: Optional[Tensor] = None


@dataclass
class QfBlock:
    """qf_block (clip-model.h): a QFormer projector's queries, norms, layers and output linear (Granite
    Speech's; Granite 4 Vision's windowed, with image positions)."""
    qf_proj_query: Optional[Tensor] = None
    qf_proj_norm_w: Optional[Tensor] = None
    qf_proj_norm_b: Optional[Tensor] = None
    qf_proj_linear_w: Optional[Tensor] = None
    qf_proj_linear_b: Optional[Tensor] = None
    qf_proj_post_norm_w: Optional[Tensor] = None
    qf_proj_post_norm_b: Optional[Tensor] = None
    qf_proj_img_pos: Optional[Tensor] = None     # vision only
    qf_proj_layers: list[ClipLayer] = field(default_factory=list)


@dataclass
class Yasa2Block:
    """yasa2_block (clip-model.h): a ConvNeXt-V2 block"""
    dw_w: Optional[Tensor] = None
    dw_b: Optional[Tensor] = None
    ln_w: Optional[Tensor] = None
    ln_b: Optional[Tensor] = None
    pw1_w: Optional[Tensor] = None
    pw1_b: Optional[Tensor] = None
    grn_w: Optional[Tensor] = None
    grn_b: Optional[Tensor] = None
    pw2_w: Optional[Tensor] = None
    pw2_b: Optional[Tensor] = None


@dataclass
class Yasa2Stage:
    """yasa2_stage (clip-model.h): an optional downsample, then blocks"""
    down_ln_w: Optional[Tensor] = None
    down_ln_b: Optional[Tensor] = None
    down_conv_w: Optional[Tensor] = None
    down_conv_b: Optional[Tensor] = None
    blocks: list[Yasa2Block] = field(default_factory=list)


@dataclass
class ClipSeanetStage:
    """clip_seanet::stage"""
    res_conv1_w: Tensor
    res_conv1_b: Tensor
    res_conv2_w: Tensor
    res_conv2_b: Tensor
    scale_conv_w: Tensor
    scale_conv_b: Tensor


@dataclass
class ClipSeanet:
    """clip_seanet: mimi's SEANet convolution stack (encoder or decoder)"""
    conv_in_w: Tensor
    conv_in_b: Tensor
    conv_out_w: Tensor
    conv_out_b: Tensor
    stages: list[ClipSeanetStage]


@dataclass
class ClipModel:
    """clip_model, the fields the planned projector types use."""
    modality: str = MODALITY_VISION
    proj_type: str = ""
    hparams: ClipHparams = field(default_factory=ClipHparams)
    class_embedding: Optional[Tensor] = None
    patch_embeddings_0: Optional[Tensor] = None
    patch_embeddings_1: Optional[Tensor] = None
    patch_bias: Optional[Tensor] = None
    position_embeddings: Optional[Tensor] = None
    norm_embd_w: Optional[Tensor] = None
    norm_embd_b: Optional[Tensor] = None
    pre_ln_w: Optional[Tensor] = None
    pre_ln_b: Optional[Tensor] = None
    layers: list[ClipLayer] = field(default_factory=list)
    n_deepstack_layers: int = 0
    post_ln_w: Optional[Tensor] = None
    post_ln_b: Optional[Tensor] = None
    mm_0_w: Optional[Tensor] = None
    mm_0_b: Optional[Tensor] = None
    mm_1_w: Optional[Tensor] = None
    mm_1_b: Optional[Tensor] = None
    mm_2_w: Optional[Tensor] = None
    mm_2_b: Optional[Tensor] = None
    mm_3_w: Optional[Tensor] = None
    mm_3_b: Optional[Tensor] = None
    mm_fc_w: Optional[Tensor] = None
    mm_ffn_up_w: Optional[Tensor] = None
    mm_ffn_up_b: Optional[Tensor] = None
    mm_ffn_gate_w: Optional[Tensor] = None
    mm_ffn_gate_b: Optional[Tensor] = None
    mm_ffn_down_w: Optional[Tensor] = None
    mm_ffn_down_b: Optional[Tensor] = None
    mm_post_norm_w: Optional[Tensor] = None
    mm_post_norm_b: Optional[Tensor] = None
    mm_input_norm_w: Optional[Tensor] = None
    mm_input_norm_b: Optional[Tensor] = None
    mm_patch_merger_w: Optional[Tensor] = None
    mm_patch_merger_b: Optional[Tensor] = None
    mm_model_proj: Optional[Tensor] = None
    mm_model_mlp_1_w: Optional[Tensor] = None
    mm_model_mlp_2_w: Optional[Tensor] = None
    mm_model_mlp_3_w: Optional[Tensor] = None
    token_embd_img_break: Optional[Tensor] = None
    std_bias: Optional[Tensor] = None
    std_scale: Optional[Tensor] = None
    clamped: set[str] = field(default_factory=set)   # clamp_info_map's keys: Gemma4ClippableLinear weights
    mm_input_proj_w: Optional[Tensor] = None
    mm_soft_emb_norm_w: Optional[Tensor] = None
    conv1d_1_w: Optional[Tensor] = None
    conv1d_1_b: Optional[Tensor] = None
    conv1d_2_w: Optional[Tensor] = None
    conv1d_2_b: Optional[Tensor] = None
    conv2d_1_w: Optional[Tensor] = None
    conv2d_1_b: Optional[Tensor] = None
    conv2d_2_w: Optional[Tensor] = None
    conv2d_2_b: Optional[Tensor] = None
    conv2d_3_w: Optional[Tensor] = None
    conv2d_3_b: Optional[Tensor] = None
    conv_out_w: Optional[Tensor] = None
    conv_out_b: Optional[Tensor] = None
    mm_norm_pre_w: Optional[Tensor] = None
    mm_norm_pre_b: Optional[Tensor] = None
    mm_norm_mid_w: Optional[Tensor] = None
    mm_boi: Optional[Tensor] = None
    mm_eoi: Optional[Tensor] = None
    mm_fc_b: Optional[Tensor] = None
    patch_norm_1_w: Optional[Tensor] = None
    patch_norm_1_b: Optional[Tensor] = None
    patch_norm_2_w: Optional[Tensor] = None
    patch_norm_2_b: Optional[Tensor] = None
    patch_norm_3_w: Optional[Tensor] = None
    patch_norm_3_b: Optional[Tensor] = None
    mm_4_w: Optional[Tensor] = None
    mm_4_b: Optional[Tensor] = None
    image_newline: Optional[Tensor] = None
    # MobileVLM's LDP / LDPv2
    mm_model_mlp_0_w: Optional[Tensor] = None
    mm_model_mlp_0_b: Optional[Tensor] = None
    mm_model_mlp_1_b: Optional[Tensor] = None
    mm_model_mlp_2_b: Optional[Tensor] = None
    mm_model_mlp_3_b: Optional[Tensor] = None
    mm_model_block_1_block_0_0_w: Optional[Tensor] = None
    mm_model_block_1_block_0_1_w: Optional[Tensor] = None
    mm_model_block_1_block_0_1_b: Optional[Tensor] = None
    mm_model_block_1_block_1_fc1_w: Optional[Tensor] = None
    mm_model_block_1_block_1_fc1_b: Optional[Tensor] = None
    mm_model_block_1_block_1_fc2_w: Optional[Tensor] = None
    mm_model_block_1_block_1_fc2_b: Optional[Tensor] = None
    mm_model_block_1_block_2_0_w: Optional[Tensor] = None
    mm_model_block_1_block_2_1_w: Optional[Tensor] = None
    mm_model_block_1_block_2_1_b: Optional[Tensor] = None
    mm_model_block_2_block_0_0_w: Optional[Tensor] = None
    mm_model_block_2_block_0_1_w: Optional[Tensor] = None
    mm_model_block_2_block_0_1_b: Optional[Tensor] = None
    mm_model_block_2_block_1_fc1_w: Optional[Tensor] = None
    mm_model_block_2_block_1_fc1_b: Optional[Tensor] = None
    mm_model_block_2_block_1_fc2_w: Optional[Tensor] = None
    mm_model_block_2_block_1_fc2_b: Optional[Tensor] = None
    mm_model_block_2_block_2_0_w: Optional[Tensor] = None
    mm_model_block_2_block_2_1_w: Optional[Tensor] = None
    mm_model_block_2_block_2_1_b: Optional[Tensor] = None
    mm_model_peg_0_w: Optional[Tensor] = None
    mm_model_peg_0_b: Optional[Tensor] = None
    # GLM-Edge's adapter
    mm_model_adapter_conv_w: Optional[Tensor] = None
    mm_model_adapter_conv_b: Optional[Tensor] = None
    # MiniCPM-V's resampler
    mm_model_pos_embed_k: Optional[Tensor] = None
    mm_model_query: Optional[Tensor] = None
    mm_model_kv_proj: Optional[Tensor] = None
    mm_model_attn_q_w: Optional[Tensor] = None
    mm_model_attn_q_b: Optional[Tensor] = None
    mm_model_attn_k_w: Optional[Tensor] = None
    mm_model_attn_k_b: Optional[Tensor] = None
    mm_model_attn_v_w: Optional[Tensor] = None
    mm_model_attn_v_b: Optional[Tensor] = None
    mm_model_attn_o_w: Optional[Tensor] = None
    mm_model_attn_o_b: Optional[Tensor] = None
    mm_model_ln_q_w: Optional[Tensor] = None
    mm_model_ln_q_b: Optional[Tensor] = None
    mm_model_ln_kv_w: Optional[Tensor] = None
    mm_model_ln_kv_b: Optional[Tensor] = None
    mm_model_ln_post_w: Optional[Tensor] = None
    mm_model_ln_post_b: Optional[Tensor] = None
    # MiniCPM-V 4.6's ViT merger (window attention, 2x2 downsample MLP)
    vit_merger_ln1_w: Optional[Tensor] = None
    vit_merger_ln1_b: Optional[Tensor] = None
    vit_merger_attn_q_w: Optional[Tensor] = None
    vit_merger_attn_q_b: Optional[Tensor] = None
    vit_merger_attn_k_w: Optional[Tensor] = None
    vit_merger_attn_k_b: Optional[Tensor] = None
    vit_merger_attn_v_w: Optional[Tensor] = None
    vit_merger_attn_v_b: Optional[Tensor] = None
    vit_merger_attn_o_w: Optional[Tensor] = None
    vit_merger_attn_o_b: Optional[Tensor] = None
    vit_merger_ds_ln_w: Optional[Tensor] = None
    vit_merger_ds_ln_b: Optional[Tensor] = None
    vit_merger_ds_up_w: Optional[Tensor] = None
    vit_merger_ds_up_b: Optional[Tensor] = None
    vit_merger_ds_down_w: Optional[Tensor] = None
    vit_merger_ds_down_b: Optional[Tensor] = None
    # Gemma 3n's MobileNetV5
    mobilenet_stem_conv_w: Optional[Tensor] = None
    mobilenet_stem_conv_b: Optional[Tensor] = None
    mobilenet_stem_norm_w: Optional[Tensor] = None
    msfa_ffn_expand_w: Optional[Tensor] = None
    msfa_ffn_expand_bn: Optional[Tensor] = None
    msfa_ffn_project_w: Optional[Tensor] = None
    msfa_ffn_project_bn: Optional[Tensor] = None
    msfa_concat_norm_w: Optional[Tensor] = None
    mobilenet_blocks: list[MobilenetV5Block] = field(default_factory=list)
    mobilenet_stage_ends: list[int] = field(default_factory=list)
    # CogVLM's projector
    mm_post_fc_norm_w: Optional[Tensor] = None
    mm_post_fc_norm_b: Optional[Tensor] = None
    mm_h_to_4h_w: Optional[Tensor] = None
    mm_gate_w: Optional[Tensor] = None
    mm_4h_to_h_w: Optional[Tensor] = None
    # Gemma 4 audio's subsampling convs, their norms and projections
    sscp_conv_w: list[Optional[Tensor]] = field(default_factory=lambda: [None, None])
    sscp_conv_b: list[Optional[Tensor]] = field(default_factory=lambda: [None, None])
    sscp_norm_w: list[Optional[Tensor]] = field(default_factory=lambda: [None, None])
    sscp_inp_proj_w: Optional[Tensor] = None
    sscp_inp_proj_b: Optional[Tensor] = None
    audio_out_proj_w: Optional[Tensor] = None
    audio_out_proj_b: Optional[Tensor] = None
    # LFM2-Audio's conformer: the subsampling convs (pre_encode.conv.0, 2, 3, 5, 6) and their projection
    pre_encode_conv_X_w: list[Optional[Tensor]] = field(default_factory=lambda: [None] * 7)
    pre_encode_conv_X_b: list[Optional[Tensor]] = field(default_factory=lambda: [None] * 7)
    pre_encode_out_w: Optional[Tensor] = None
    pre_encode_out_b: Optional[Tensor] = None
    # MiMo-Audio: the tokenizer's downsampling and RVQ codebooks, the LLM side's code embeddings and
    # input_local_transformer
    downsample_conv_w: Optional[Tensor] = None
    downsample_norm_w: Optional[Tensor] = None
    downsample_norm_b: Optional[Tensor] = None
    rvq_codebook: Optional[Tensor] = None
    mm_a_code_embd: Optional[Tensor] = None
    mm_a_local_layers: list[ClipLayer] = field(default_factory=list)
    mm_a_local_norm_w: Optional[Tensor] = None
    # Granite Speech: the input projection, the CTC branch, the QFormer projector
    inp_proj_w: Optional[Tensor] = None
    inp_proj_b: Optional[Tensor] = None
    ctc_out_w: Optional[Tensor] = None
    ctc_out_b: Optional[Tensor] = None
    ctc_out_mid_w: Optional[Tensor] = None
    ctc_out_mid_b: Optional[Tensor] = None
    qf_proj_blocks: list[QfBlock] = field(default_factory=list)
    mm_model_proj_b: Optional[Tensor] = None
    mm_pre_norm_w: Optional[Tensor] = None
    mm_img_begin: Optional[Tensor] = None
    mm_img_end: Optional[Tensor] = None
    view_seperator: Optional[Tensor] = None
    token_embd_img_start: Optional[Tensor] = None   # DeepSeek-V4's sentinel rows
    token_embd_img_end: Optional[Tensor] = None
    token_embd_img_pad: Optional[Tensor] = None
    yasa_patch_ln_w: Optional[Tensor] = None        # Yasa2's ConvNeXt
    yasa_patch_ln_b: Optional[Tensor] = None
    yasa_backbone_ln_w: Optional[Tensor] = None
    yasa_backbone_ln_b: Optional[Tensor] = None
    yasa_vision_pos_embed: Optional[Tensor] = None
    yasa_stages: list[Yasa2Stage] = field(default_factory=list)
    mm_merger_fc1_w: Optional[Tensor] = None        # MiniMax-M3's 2x2 merge MLP
    mm_merger_fc1_b: Optional[Tensor] = None
    mm_merger_fc2_w: Optional[Tensor] = None
    mm_merger_fc2_b: Optional[Tensor] = None
    pos_embed: Optional[Tensor] = None              # DeepSeek-OCR's SAM encoder
    patch_embed_proj_w: Optional[Tensor] = None
    patch_embed_proj_b: Optional[Tensor] = None
    sam_layers: list[ClipLayer] = field(default_factory=list)
    neck_0_w: Optional[Tensor] = None
    neck_1_w: Optional[Tensor] = None
    neck_1_b: Optional[Tensor] = None
    neck_2_w: Optional[Tensor] = None
    neck_3_w: Optional[Tensor] = None
    neck_3_b: Optional[Tensor] = None
    net_2: Optional[Tensor] = None
    net_3: Optional[Tensor] = None
    resample_query_768: Optional[Tensor] = None
    resample_query_1024: Optional[Tensor] = None
    spk_asp_attn_w: Optional[Tensor] = None
    spk_asp_attn_b: Optional[Tensor] = None
    spk_asp_tdnn_w: Optional[Tensor] = None
    spk_asp_tdnn_b: Optional[Tensor] = None
    gen_code_proj_in_w: Optional[Tensor] = None
    gen_code_proj_in_b: Optional[Tensor] = None
    gen_code_embd_w: Optional[Tensor] = None
    gen_code_head_w: Optional[Tensor] = None
    gen_code_out_embd_w: Optional[Tensor] = None
    gen_code_norm_w: Optional[Tensor] = None
    c2w: dict[str, Tensor] = field(default_factory=dict)   # clip_model.c2w (code2wav), by GGUF name: no graph reads it
    seanet: Optional["ClipSeanet"] = None
    downsample_w: Optional[Tensor] = None
    spk_proj_w: Optional[Tensor] = None
    flow: dict[str, Tensor] = field(default_factory=dict)  # clip_flow_net, by GGUF name: no graph reads it
    gen_out_eos_w: Optional[Tensor] = None
    gen_out_eos_b: Optional[Tensor] = None
    gen_input_lin_w: Optional[Tensor] = None
    gen_emb_mean: Optional[Tensor] = None
    gen_emb_std: Optional[Tensor] = None
    gen_quant_out_w: Optional[Tensor] = None
    gen_upsample_w: Optional[Tensor] = None
    gen_tfm_layers: list[ClipLayer] = field(default_factory=list)

    def audio_has_avgpool(self) -> bool:
        return self.proj_type in ("qwen2a", "voxtral", "musicflamingo")

    def audio_has_stack_frames(self) -> bool:
        return self.proj_type in ("ultravox", "voxtral", "meralion")


@dataclass
class ClipContextParams:
    """clip_context_params as mtmd fills them (mtmd_context::mtmd_context)."""
    use_gpu: bool = True
    device: Optional[str] = None       # -mmdev: a device name ("RPC0", "CUDA1"); None: the first GPU
    flash_attn_type: int = FLASH_ATTN_AUTO
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    warmup: bool = True


def registry_devices(params: Params) -> list[Backend]:
    """ggml's device registry as llama-server holds it: the static backends' devices in registry
    order (CUDA, Metal, Vulkan), the CPU, then the RPC servers --rpc registered (add_rpc_devices,
    common/arg.cpp: ggml_backend_register appends them after the static registry's devices)."""
    memory = rpc_memory(params)
    return (local_devices(params.devices) + [cpu.cpu_backend()]
            + [rpc.rpc_backend(endpoint, i, memory[i]) for i, endpoint in enumerate(params.rpc)])


def mmproj_backend(devices: list[Backend], cparams: ClipContextParams) -> Optional[Backend]:
    """clip_ctx::clip_ctx: with use_gpu, the device -mmdev names (common/arg.cpp parse_device_list
    refuses an unknown one and the CPU), else the first GPU device, else the first IGPU one; None:
    the CPU backend runs the projector."""
    if not cparams.use_gpu:
        return None
    if cparams.device is not None:
        dev = next((d for d in devices if d.device_name == cparams.device), None)
        if dev is None or dev.dev_type == "CPU":
            raise BadDevices(f"-mmdev {cparams.device}: invalid device (available: "
                             f"{', '.join(d.device_name for d in devices if d.dev_type != 'CPU') or 'none'})")
        return dev
    return next((d for d in devices if d.dev_type == "GPU"), None) or \
        next((d for d in devices if d.dev_type == "IGPU"), None)


@dataclass
class ClipCtx:
    """clip_ctx: the model, its backends (the projector's device, then the CPU) and scheduler, and
    what it counts for mtmd_get_memory_usage: the weights' bytes (mem_usage) and the warm-up's
    compute buffers (mem_compute), per device."""
    model: ClipModel
    backend: Backend
    backend_cpu: Backend
    backend_ptrs: list[Backend]
    backend_buft: list[BufferType]
    sched: Sched
    flash_attn_type: int
    weights: Buffer
    mem_usage: dict[str, int] = field(default_factory=dict)
    mem_compute: dict[str, int] = field(default_factory=dict)
    n_nodes: int = 0
    n_splits: int = 0
    compute_buffers: dict[str, int] = field(default_factory=dict)   # per buffer type, as clip.cpp logs them


def new_clip_ctx(devices: list[Backend], cparams: ClipContextParams, model: ClipModel) -> ClipCtx:
    backend_cpu = cpu.cpu_backend()
    backend = mmproj_backend(devices, cparams)
    backend_ptrs: list[Backend] = []
    if backend is not None:
        backend_ptrs.append(backend)
    else:
        backend = backend_cpu
    backend_ptrs.append(backend_cpu)
    if cparams.image_min_tokens > 0:
        model.hparams.custom_image_min_tokens = cparams.image_min_tokens
    if cparams.image_max_tokens > 0:
        model.hparams.custom_image_max_tokens = cparams.image_max_tokens
    bufts = [b.buft for b in backend_ptrs]
    # ggml_backend_sched_new(backends, bufts, n, 8192, parallel false, op_offload true)
    sched = Sched(backend_ptrs, bufts, parallel=False, op_offload=True)
    return ClipCtx(model, backend, backend_cpu, backend_ptrs, bufts, sched, cparams.flash_attn_type,
                   Buffer(backend.buft, "weights"))


class ClipModelLoader:
    """clip_model_loader: the projector GGUF's header, its modalities, the typed key getters."""

    def __init__(self, path: str, use_cache: bool = True):
        self.path = str(path)
        self.header: GGUFHeader = read_model_header(self.path, use_cache)
        self.get_string(KEY_NAME, "")           # read for the log: a key of another type aborts there
        self.get_string(KEY_DESCRIPTION, "")
        self.has_vision = self.get_bool(KEY_HAS_VISION_ENC, False)
        self.has_audio = self.get_bool(KEY_HAS_AUDIO_ENC, False)
        self.has_gen_audio = self.get_bool(KEY_HAS_GEN_AUDIO_ENC, False)

    def fail(self, reason: str):
        fail(self.path, reason)

    def _kv_type(self, key: str) -> tuple[Optional[int], Optional[int]]:
        return self.header.kv_types.get(key, (None, None))

    def _scalar(self, key: str, gguf_type: int, default):
        kv_type = self._kv_type(key)[0]
        if kv_type is None:
            if default is None:
                self.fail(f"Key not found: {key}")
            return default
        if kv_type != gguf_type:   # gguf_get_val_*: GGML_ASSERT(gguf_get_kv_type(ctx, key_id) == type)
            raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (gguf.cpp "
                            f"GGML_ASSERT on the key's type): {key} is {_type_name(*self._kv_type(key))}, "
                            f"clip.cpp reads a {_type_name(gguf_type, None)}")
        return self.header.get(key)

    def get_bool(self, key: str, default: Optional[bool] = None) -> bool:
        return self._scalar(key, BOOL, default)

    def get_i32(self, key: str, default: Optional[int] = None) -> int:
        return self._scalar(key, INT32, default)

    def get_u32(self, key: str, default: Optional[int] = None) -> int:
        """get_u32: a u32 that must fit an int"""
        value = self._scalar(key, UINT32, default)
        if value > INT32_MAX:
            self.fail(f"get_u32: value {value} for key '{key}' exceeds INT32_MAX")
        return value

    def get_f32(self, key: str, default: Optional[float] = None) -> float:
        return self._scalar(key, FLOAT32, default)

    def get_string(self, key: str, default: Optional[str] = None) -> str:
        return self._scalar(key, STRING, default)

    def get_arr(self, key: str, elem_type: int, required: bool) -> Optional[list]:
        """get_arr_f32 / get_arr_int: an array of that element type, None when absent and optional."""
        kv_type, elem = self._kv_type(key)
        if kv_type is None:
            if required:
                self.fail(f"Key not found: {key}")
            return None
        if kv_type != ARRAY:
            self.fail(f"key '{key}' is not an array")
        if elem != elem_type:
            self.fail(f"array '{key}' has type {elem}, expected {elem_type}")
        value = self.header.get(key)
        return list(value) if isinstance(value, list) else value.to_list()

    # --- clip_model_loader::load_hparams ---------------------------------------------------------

    def load_hparams(self, model: ClipModel, modality: str) -> None:
        hp = model.hparams
        model.modality = modality
        proj_type = self.get_string(KEY_PROJ_TYPE, "")
        if not proj_type:
            proj_type = self.get_string({MODALITY_VISION: KEY_VISION_PROJ_TYPE, MODALITY_AUDIO: KEY_AUDIO_PROJ_TYPE,
                                         MODALITY_GEN_AUDIO: KEY_GEN_AUDIO_PROJ_TYPE}[modality], "")
        if proj_type not in PROJECTOR_TYPE_NAMES:
            self.fail(f"load_hparams: unknown projector type: {proj_type}")
        if proj_type == "qwen2.5o":    # the legacy name of Qwen2.5-Omni's two encoders
            proj_type = "qwen2.5vl_merger" if modality == MODALITY_VISION else "qwen2a"
        model.proj_type = proj_type

        prefix = modality
        hp.n_embd = self.get_u32(KEY_N_EMBD % prefix)
        hp.n_head = self.get_u32(KEY_N_HEAD % prefix)
        hp.n_embd_head = self.get_u32(KEY_N_EMBD_HEAD % prefix, 0)
        hp.n_ff = self.get_u32(KEY_N_FF % prefix)
        hp.n_layer = self.get_u32(KEY_N_BLOCK % prefix)
        hp.projection_dim = self.get_u32(KEY_PROJ_DIM % prefix)
        hp.eps = self.get_f32(KEY_LAYER_NORM_EPS % prefix)
        hp.n_head_kv = self.get_u32(KEY_N_HEAD_KV % prefix, hp.n_head)
        if modality == MODALITY_VISION:
            hp.image_size = self.get_u32(KEY_IMAGE_SIZE)
            hp.patch_size = self.get_u32(KEY_PATCH_SIZE)
            hp.minicpmv_version = self.get_i32(KEY_MINICPMV_VERSION, 0)
            hp.minicpmv_query_num = self.get_u32(KEY_MINICPMV_QUERY_NUM, 0)
            if hp.minicpmv_query_num == 0:    # legacy files: by version
                hp.minicpmv_query_num = 64 if hp.minicpmv_version in (3, 4, 5, 6, 100045) else 96
        elif modality == MODALITY_AUDIO:
            hp.n_mel_bins = self.get_u32(KEY_A_NUM_MEL_BINS)
            hp.image_size, hp.patch_size = 0, 1
        else:
            hp.image_size, hp.patch_size = 0, 1
        pinpoints = self.get_arr(KEY_IMAGE_GRID_PINPOINTS, INT32, False) or []
        if len(pinpoints) % 2:
            self.fail(f"load_hparams: image_grid_pinpoints must have an even number of elements, got {len(pinpoints)}")
        hp.warmup_image_size = hp.image_size
        use_gelu = self.get_bool(KEY_USE_GELU, False)
        use_silu = self.get_bool(KEY_USE_SILU, False)
        if use_gelu and use_silu:
            self.fail("load_hparams: both use_gelu and use_silu are set to true")
        hp.ffn_op = FFN_GELU if use_gelu else FFN_SILU if use_silu else FFN_GELU_QUICK
        self.get_string(KEY_MM_PATCH_MERGE_TYPE, "")
        if modality == MODALITY_VISION:
            image_mean = self.get_arr(KEY_IMAGE_MEAN, FLOAT32, False) or []
            image_std = self.get_arr(KEY_IMAGE_STD, FLOAT32, False) or []
            if len(image_mean) < 3 or len(image_std) < 3:
                self.fail(f"load_hparams: image_mean/image_std arrays must have at least 3 elements, got "
                          f"{len(image_mean)} and {len(image_std)}")
        hp.feature_layers = self.get_arr(KEY_FEATURE_LAYERS % prefix, INT32, False) or []
        for v in hp.feature_layers:
            if v > hp.n_layer:
                self.fail(f"load_hparams: feature layer index {v} is out of range (n_layer: {hp.n_layer})")

        # model-specific params
        if proj_type in NO_HPARAMS_TYPES:
            self.fail(f"load_hparams: unknown vision projector type {proj_type}")
        if proj_type in ("mlp", "mlp_norm", "ldp", "ldpv2"):
            hp.has_llava_projector = True
        elif proj_type == "resampler":
            if hp.minicpmv_version == 0:
                hp.minicpmv_version = 2
        elif proj_type == "minicpmv4_6":
            # the ViT merger's 2x2 and the final merger's 2x2: 4x per side
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, 4)
            if hp.n_merge not in (2, 4):
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT(hparams.n_merge == 2 || hparams.n_merge == 4)): n_merge {hp.n_merge}")
            wa_layer_indexes = self.get_arr(KEY_WIN_ATTN_LAYER_INDEXES, INT32, False) or []   # borrowed: the insertion point
            if wa_layer_indexes:
                if not 0 <= wa_layer_indexes[0] < hp.n_layer:
                    self.fail(f"load_hparams: layer index {wa_layer_indexes[0]} is out of range (n_layer: {hp.n_layer})")
                hp.insert_layer_id = wa_layer_indexes[0]
        elif proj_type == "muse-glimmer":
            hp.n_merge = 2            # the pixel-shuffle downsample after the ViT
            hp.rope_theta = 10000.0
            hp.muse_glimmer_sparse_factor = 4     # 3 sparse layers and 1 global, repeating
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.set_limit_image_tokens(1, 4096)
            hp.set_warmup_n_tokens(32 * 32)
        elif proj_type == "gemma3nv":
            hp.n_merge = 1            # MobileNetV5 handles resizing internally
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
        elif proj_type == "nemotron_v2_vl":
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
        elif proj_type == "phi4":
            hp.n_merge = 1
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS)
            hp.image_max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS)
            hp.set_warmup_n_tokens(16 * 16)
        elif proj_type == "gemma3":
            hp.n_merge = 4            # every Gemma 3 size: 4x fewer patches per side
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
        elif proj_type == "internvl":
            # older InternVL GGUFs have no tile limits: llama.cpp's defaults
            hp.preproc_min_tiles, hp.preproc_max_tiles = 1, 12
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
            hp.preproc_min_tiles = self.get_u32(KEY_PREPROC_MIN_TILES, hp.preproc_min_tiles)
            hp.preproc_max_tiles = self.get_u32(KEY_PREPROC_MAX_TILES, hp.preproc_max_tiles)
            if not (hp.preproc_min_tiles <= hp.preproc_max_tiles < INT32_MAX):
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT(preproc_min_tiles <= preproc_max_tiles)): {hp.preproc_min_tiles} > "
                                f"{hp.preproc_max_tiles}")
        elif proj_type == "idefics3":
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
            hp.image_longest_edge = self.get_u32(KEY_PREPROC_IMAGE_SIZE, hp.image_longest_edge)
            hp.set_limit_image_tokens_custom()
        elif proj_type == "lfm2":
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
            hp.set_limit_image_tokens(64, 256)   # LFM2.5-VL's processor_config.json
        elif proj_type == "pixtral":
            hp.n_merge = 1            # the original Pixtral does not merge patches
            hp.rope_theta = 10000.0
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.set_limit_image_tokens(8, 1024)
            hp.set_warmup_n_tokens(256)   # avoid OOM on warmup
        elif proj_type == "lightonocr":
            hp.n_merge = 1
            hp.rope_theta = 10000.0
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.image_longest_edge = hp.image_size
            hp.image_longest_edge = self.get_u32(KEY_PREPROC_IMAGE_SIZE, hp.image_longest_edge)
            hp.set_limit_image_tokens_custom()
            hp.set_warmup_n_tokens(256)
        elif proj_type == "paddleocr":
            hp.n_merge = 2
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS)
            hp.image_max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS)
            hp.set_warmup_n_tokens(28 * 28)   # avoid OOM on warmup
        elif proj_type == "hunyuanvl":
            hp.n_merge = 2
            hp.ffn_op = FFN_GELU
            hp.set_limit_image_tokens(256, 16384)
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS, hp.image_min_pixels)
            hp.image_max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS, hp.image_max_pixels)
            hp.set_warmup_n_tokens(32 * 32)
        elif proj_type == "youtuvl":
            hp.n_merge = 2
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.attn_window_size = self.get_u32(KEY_ATTN_WINDOW_SIZE)
            hp.wa_layer_indexes = set(self.get_arr(KEY_WIN_ATTN_LAYER_INDEXES, INT32, True))
            hp.set_limit_image_tokens(1, 62500)
            hp.set_warmup_n_tokens(16 * 16)   # avoid OOM on warmup
        elif proj_type == "dots_ocr":
            hp.rope_theta = 10000.0
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR)
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS)
            hp.image_max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS)
            hp.set_warmup_n_tokens(46 * 46)   # avoid OOM on warmup
        elif proj_type == "dots3note_v":
            hp.rope_theta = 10000.0
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE)
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS)
            hp.image_max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS)
            hp.n_expert_used = self.get_u32(KEY_VISION_N_EXPERT_USED)
            hp.set_warmup_n_tokens(46 * 46)   # avoid OOM on warmup
        elif proj_type == "mimovl":
            hp.n_merge = 2            # spatial_merge_size
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.n_head_kv = self.get_u32(KEY_N_HEAD_KV % "vision")
            hp.attn_window_size = self.get_u32(KEY_ATTN_WINDOW_SIZE)   # the banded window's radius
            hp.wa_pattern_mode = self.get_arr(KEY_WA_PATTERN_MODE, INT32, True)
            if len(hp.wa_pattern_mode) != hp.n_layer:
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT: mimovl wa_pattern_mode length must equal n_layer): "
                                f"{len(hp.wa_pattern_mode)} != {hp.n_layer}")
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS)
            hp.image_max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS)
            hp.set_warmup_n_tokens(46 * 46)   # avoid OOM on warmup
        elif proj_type == "granite4_vision":
            # feature_layers: read above as optional
            hp.proj_spatial_offsets = self.get_arr(KEY_PROJ_SPATIAL_OFFSETS, INT32, True)
            if len(hp.feature_layers) != len(hp.proj_spatial_offsets):
                self.fail(f"load_hparams: feature_layers.size() {len(hp.feature_layers)} != proj_spatial_offsets.size() "
                          f"{len(hp.proj_spatial_offsets)}")
            hp.downsample_query_side = self.get_u32(KEY_PROJ_SAMPLE_QUERY_SIDE)
            hp.downsample_window_side = self.get_u32(KEY_PROJ_SAMPLE_WINDOW_SIDE)
            hp.warmup_image_size = hp.image_size
        elif proj_type == "kimivl":
            hp.rope_theta = 10000.0
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
            hp.set_limit_image_tokens(8, 1024)
            hp.set_warmup_n_tokens(256)
        elif proj_type == "glm4v":
            hp.rope_theta = 10000.0
            hp.n_merge = 2
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.set_limit_image_tokens(8, 4096)
            hp.set_warmup_n_tokens(46 * 46)
        elif proj_type in ("deepseekocr", "deepseekocr2"):
            hp.patch_size = 16
            hp.image_size = 1024
            hp.warmup_image_size = 1024
            hp.sam_n_layer = self.get_u32(KEY_SAM_N_BLOCK)
            hp.sam_n_head = self.get_u32(KEY_SAM_N_HEAD)
            hp.sam_n_embd = self.get_u32(KEY_SAM_N_EMBD)
            hp.attn_window_size = self.get_u32(KEY_ATTN_WINDOW_SIZE)
            hp.preproc_min_tiles = 2
            if proj_type == "deepseekocr":
                hp.preproc_max_tiles = 9
                hp.eps = 1e-5         # the CLIP/ViT body's layernorms (the SAM stage uses 1e-6)
            else:
                hp.preproc_max_tiles = 6
                hp.n_head_kv = self.get_u32(KEY_N_HEAD_KV % "vision")   # the qwen2 encoder is GQA
            # unlimited-ocr shares the v1 projector but tiles up to 32
            hp.preproc_min_tiles = self.get_u32(KEY_PREPROC_MIN_TILES, hp.preproc_min_tiles)
            hp.preproc_max_tiles = self.get_u32(KEY_PREPROC_MAX_TILES, hp.preproc_max_tiles)
            if not 0 <= hp.preproc_min_tiles <= hp.preproc_max_tiles <= 256:
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT(preproc_min_tiles >= 0 && preproc_min_tiles <= preproc_max_tiles && "
                                f"preproc_max_tiles <= 256)): {hp.preproc_min_tiles}, {hp.preproc_max_tiles}")
        elif proj_type == "exaone4_5":
            hp.n_merge = 2
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.n_wa_pattern = self.get_u32(KEY_WIN_ATTN_PATTERN, hp.n_wa_pattern)
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS)
            hp.image_max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS)
            hp.set_warmup_n_tokens(46 * 46)
            if hp.rope_theta <= 0.0:
                hp.rope_theta = 10000.0
            hp.n_head_kv = self.get_u32(KEY_N_HEAD_KV % "vision")
        elif proj_type == "kimik25":
            hp.rope_theta = 10000.0
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
            min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS, 0)
            max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS, 0)
            if min_pixels > 0 and max_pixels > 0:
                hp.image_min_pixels, hp.image_max_pixels = min_pixels, max_pixels
                hp.warmup_image_size = int(math.sqrt(max_pixels))
            else:
                hp.set_limit_image_tokens(2, 4096)
        elif proj_type == "minimax_m3":
            hp.n_merge = 2            # spatial_merge_size
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            if hp.n_merge <= 0:
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT(hparams.n_merge > 0))")
            hp.rope_theta = 10000.0
            hp.set_limit_image_tokens(8, 576)   # max_pixels 672^2: 576 merged tokens
            hp.set_warmup_n_tokens(16 * 16)
        elif proj_type == "deepseek4v":
            hp.rope_theta = 10000.0
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR)
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS)
            dsv4_max_n_token = 384
            patch_area = _i32(hp.patch_size * hp.patch_size * hp.n_merge * hp.n_merge)
            # --image-min/max-tokens: the max caps the whole token block (room kept for the resize solver)
            if hp.custom_image_min_tokens > 0:
                hp.image_min_pixels = _i32(hp.custom_image_min_tokens * patch_area)
            if hp.custom_image_max_tokens > 0:
                dsv4_max_n_token = max(hp.custom_image_max_tokens, 16)
            hp.image_max_pixels = _i32(dsv4_max_n_token * patch_area)
            hp.image_min_pixels = min(hp.image_min_pixels, hp.image_max_pixels)
            warmup_side = int(math.sqrt(min(256, dsv4_max_n_token)))   # avoid OOM on warmup
            hp.set_warmup_n_tokens(warmup_side * warmup_side)
        elif proj_type == "yasa2":
            hp.ffn_op = FFN_GELU_ERF
        elif proj_type == "glm5v":
            # glm4v's tower with a clamped SwiGLU and its own token budget
            hp.rope_theta = 10000.0
            hp.n_merge = 2
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            hp.swiglu_clamp = self.get_f32(KEY_SWIGLU_CLAMP)
            hp.image_min_pixels = self.get_u32(KEY_IMAGE_MIN_PIXELS)
            hp.image_max_pixels = self.get_u32(KEY_IMAGE_MAX_PIXELS)
            hp.set_limit_image_tokens_custom()
            hp.set_warmup_n_tokens(46 * 46)
        elif proj_type in ("gemma4v", "gemma4uv"):
            hp.rope_theta = 100.0
            hp.n_merge = 3            # pooling_kernel_size
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
            if proj_type == "gemma4uv":   # the unified variant merges tokens in its patch embedding
                hp.patch_size = _i32(hp.patch_size * hp.n_merge)
                hp.n_merge = 1
            hp.set_limit_image_tokens(70, 1120)
            hp.set_warmup_n_tokens(256)
        elif proj_type == "dots3note_a":
            hp.rope_theta = 10000.0
        elif proj_type == "granite_speech":
            hp.audio_chunk_size = self.get_u32(KEY_A_CHUNK_SIZE)
            # squared for the attention distances and masks: capped against int32 overflow
            if not 0 < hp.audio_chunk_size <= 8192:
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT(audio_chunk_size > 0 && audio_chunk_size <= 8192)): {hp.audio_chunk_size}")
            hp.audio_conv_kernel_size = self.get_u32(KEY_A_CONV_KERNEL_SIZE)
            hp.audio_max_pos_emb = self.get_u32(KEY_A_MAX_POS_EMB)
            hp.audio_proj_window_size = self.get_u32(KEY_A_PROJ_WINDOW_SIZE)
            hp.audio_proj_downsample_rate = self.get_u32(KEY_A_PROJ_DOWNSAMPLE_RATE)
            hp.audio_proj_head_count = self.get_u32(KEY_A_PROJ_HEAD_COUNT)
        elif proj_type == "parakeet":
            hp.subsampling_factor = self.get_u32(KEY_AUDIO_SUBSMPL_FACTOR)
            if hp.subsampling_factor != 8:
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT(subsampling_factor == 8), the graph's conv strides): {hp.subsampling_factor}")
            hp.audio_conv_kernel_size = self.get_u32(KEY_A_CONV_KERNEL_SIZE)
            if hp.audio_conv_kernel_size <= 0 or hp.audio_conv_kernel_size % 2 != 1:
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT: audio_conv_kernel_size must be a positive odd integer): "
                                f"{hp.audio_conv_kernel_size}")
        elif proj_type == "mimo_audio":
            hp.rvq_num_quantizers = self.get_u32(KEY_A_RVQ_NUM_QUANTIZERS, 0)
            hp.rvq_codebook_size = self.get_arr(KEY_A_RVQ_CODEBOOK_SIZE, INT32, False) or []
            if hp.rvq_num_quantizers <= 0:
                self.fail(f"load_hparams: mimo_audio: missing {KEY_A_RVQ_NUM_QUANTIZERS}")
            if len(hp.rvq_codebook_size) != hp.rvq_num_quantizers:
                self.fail(f"load_hparams: mimo_audio: {KEY_A_RVQ_CODEBOOK_SIZE} length ({len(hp.rvq_codebook_size)}) "
                          f"must equal {KEY_A_RVQ_NUM_QUANTIZERS} ({hp.rvq_num_quantizers})")
            hp.ffn_op = FFN_GELU_ERF
            hp.rope_theta = 10000.0
            hp.attn_window_size = self.get_u32(KEY_A_ATTN_WINDOW_SIZE)
            hp.wa_pattern_mode = self.get_arr(KEY_A_WA_PATTERN_MODE, INT32, True)
            if len(hp.wa_pattern_mode) != hp.n_layer:
                self.fail(f"load_hparams: mimo_audio: {KEY_A_WA_PATTERN_MODE} length ({len(hp.wa_pattern_mode)}) "
                          f"must equal n_layer ({hp.n_layer})")
            hp.audio_local_n_layer = self.get_u32(KEY_A_LOCAL_BLOCK_COUNT)
            hp.audio_local_group_size = self.get_u32(KEY_A_LOCAL_GROUP_SIZE)
            if hp.audio_local_group_size <= 0:
                self.fail(f"load_hparams: mimo_audio: {KEY_A_LOCAL_GROUP_SIZE} must be > 0")
        elif proj_type == "gemma4a":
            # conversion wrote a wrong rms_norm_eps; every gemma4a model uses 1e-6
            hp.eps = 1e-6
        elif proj_type == "gemma4ua":
            # encoder-free: the raw 16 kHz waveform in frames of 640 samples
            hp.eps = 1e-6
            hp.n_mel_bins = 640
        elif proj_type == "llama4":
            hp.rope_theta = 10000.0
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
        elif proj_type in ("ultravox", "qwen2a", "qwen3a", "glma", "voxtral", "meralion", "musicflamingo"):
            require_stack = proj_type in ("ultravox", "voxtral", "meralion", "glma")
            hp.proj_stack_factor = self.get_u32(KEY_A_PROJ_STACK_FACTOR, None if require_stack else 0)
            hp.ffn_op = FFN_GELU_ERF
        elif proj_type == "step3vl":
            hp.n_merge = 4            # two stride-2 downsamplers after patching
            hp.n_merge = self.get_u32(KEY_PROJ_SCALE_FACTOR, hp.n_merge)
            hp.rope_theta = 10000.0
            hp.image_longest_edge = self.get_u32(KEY_PREPROC_IMAGE_SIZE, hp.image_longest_edge) or 3024
            hp.warmup_image_size = hp.image_size
        elif proj_type in ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "ling3vl"):
            hp.n_merge = 2
            hp.n_merge = self.get_u32(KEY_SPATIAL_MERGE_SIZE, hp.n_merge)
            # only Qwen2.5-VL requires the window-attention pattern
            hp.n_wa_pattern = (self.get_u32(KEY_WIN_ATTN_PATTERN) if proj_type == "qwen2.5vl_merger"
                               else self.get_u32(KEY_WIN_ATTN_PATTERN, 0))
            hp.set_limit_image_tokens(8, 4096)
            hp.set_warmup_n_tokens(46 * 46)   # avoid OOM on warmup
        elif proj_type == "qwen3tts_gen":
            # clip.cpp's hard-coded code2wav sizes (the converter does not write them); the other
            # constants set there (rope thetas, eps, the sliding window) only matter to graphs never built here
            hp.wav_tfm_n_layer = 8
            hp.wav_upsample_n_block = 2
            hp.wav_dac_n_block = 4
            hp.wav_dac_n_res = 3
        elif proj_type in ("pockettts_spkenc", "pockettts_gen"):
            # the mimi front-end convolves the raw waveform (no mel); the SEANet ratios [6, 5, 4] of the
            # config, reversed by the encoder
            hp.seanet_ratios = [4, 5, 6]
            hp.seanet_n_stage = len(hp.seanet_ratios)
            hp.mimi_downsample = 16
            hp.mimi_tfm_context = 250    # the reference transformer's "context"
            hp.rope_theta = 10000.0

        # sanity checks
        if hp.image_size < 0:
            self.fail(f"load_hparams: image_size ({hp.image_size}) cannot be negative")
        if hp.image_size > 8192:
            self.fail(f"load_hparams: image_size ({hp.image_size}) is too large (max 8192)")
        if hp.patch_size <= 0 or hp.patch_size >= 65536:
            self.fail(f"load_hparams: patch_size ({hp.patch_size}) must be positive and less than 65536")
        if hp.n_embd <= 0:
            self.fail(f"load_hparams: n_embd ({hp.n_embd}) must be greater than 0")
        if hp.image_max_pixels < hp.image_min_pixels:
            self.fail(f"load_hparams: image_max_pixels ({hp.image_max_pixels}) is less than image_min_pixels "
                      f"({hp.image_min_pixels})")
        if hp.n_merge <= 0 or hp.n_merge >= 65536:
            self.fail(f"load_hparams: n_merge ({hp.n_merge}) must be greater than 0 and less than 65536")
        # gemma4ua's n_mel_bins is a raw-waveform frame size: no FFT, no upper bound
        fft_based = proj_type != "gemma4ua"
        if hp.attn_window_size > 4096:
            self.fail(f"load_hparams: attn_window_size ({hp.attn_window_size}) is too large (max 4096)")
        if modality == MODALITY_AUDIO and (hp.n_mel_bins <= 0 or (fft_based and hp.n_mel_bins > 256)):
            self.fail(f"load_hparams: n_mel_bins ({hp.n_mel_bins}) must be in range [1, 256]")

    # --- clip_model_loader::load_tensors ---------------------------------------------------------

    def load_tensors(self, ctx: ClipCtx) -> None:
        model, hp = ctx.model, ctx.model.hparams
        prefix = {MODALITY_AUDIO: "a", MODALITY_GEN_AUDIO: "a.gen.code"}.get(model.modality, "v")
        loaded: dict[str, Tensor] = {}   # in load order (tensors_to_load)
        device = ctx.backend.device_name

        def get_tensor(name: str, required: bool = True) -> Optional[Tensor]:
            if name in loaded:
                self.fail(f"load_tensors: tensor already loaded: {name}")
            info = self.header.tensor(name)
            if info is None:
                if required:
                    self.fail(f"load_tensors: unable to find tensor {name}")
                return None
            t = ggml.new_tensor(info.type, *info.ne)
            t.name = name
            loaded[name] = t
            # the weight memory counter: ggml_nbytes, on the projector's device
            ctx.mem_usage[device] = ctx.mem_usage.get(device, 0) + t.nbytes
            return t

        def mm_1_2(bias_required: bool) -> None:
            """mm.1 and mm.2, a LLaVA-style two-layer projector"""
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (1, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (1, "bias"), bias_required)
            model.mm_2_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_2_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"), bias_required)

        def load_seanet(is_decoder: bool) -> ClipSeanet:
            """load_tensors' load_seanet: the encoder's (a.seanet) or the decoder's (a.gen.wav.seanet) convs"""
            conv_in, conv_out, res1, res2, scale = (
                (TN_A_GEN_WAV_SEANET_CONV_IN, TN_A_GEN_WAV_SEANET_CONV_OUT, TN_A_GEN_WAV_SEANET_RES_CONV1,
                 TN_A_GEN_WAV_SEANET_RES_CONV2, TN_A_GEN_WAV_SEANET_SCALE_CONV) if is_decoder else
                (TN_A_SEANET_CONV_IN, TN_A_SEANET_CONV_OUT, TN_A_SEANET_RES_CONV1, TN_A_SEANET_RES_CONV2,
                 TN_A_SEANET_SCALE_CONV))
            head = [get_tensor(conv_in % "weight"), get_tensor(conv_in % "bias"), get_tensor(conv_out % "weight"),
                    get_tensor(conv_out % "bias")]
            stages = [ClipSeanetStage(*(get_tensor(fmt % (i, suffix)) for fmt in (res1, res2, scale)
                                        for suffix in ("weight", "bias"))) for i in range(hp.seanet_n_stage)]
            return ClipSeanet(*head, stages)

        model.class_embedding = get_tensor(TN_CLASS_EMBD, False)
        model.pre_ln_w = get_tensor(TN_LN_PRE % (prefix, "weight"), False)
        model.pre_ln_b = get_tensor(TN_LN_PRE % (prefix, "bias"), False)
        model.post_ln_w = get_tensor(TN_LN_POST % (prefix, "weight"), False)
        model.post_ln_b = get_tensor(TN_LN_POST % (prefix, "bias"), False)
        model.patch_bias = get_tensor(TN_PATCH_BIAS, False)
        model.patch_embeddings_0 = get_tensor(TN_PATCH_EMBD, False)
        model.patch_embeddings_1 = get_tensor(TN_PATCH_EMBD_1, False)
        model.norm_embd_w = get_tensor(TN_NORM_EMBD % "weight", False)
        model.norm_embd_b = get_tensor(TN_NORM_EMBD % "bias", False)
        model.position_embeddings = get_tensor(TN_POS_EMBD % prefix, False)

        n_layers_to_load = hp.n_layer if model.proj_type not in ("gemma3nv", "qwen3tts_spkenc", "pockettts_gen") else 0
        if n_layers_to_load > len(self.header.tensors):
            # each layer needs its attn_out: a block count past the file's tensors fails on the first missing one
            self.fail(f"load_tensors: unable to find tensor {TN_ATTN_OUTPUT % (prefix, len(self.header.tensors), 'weight')}")
        model.layers = [ClipLayer() for _ in range(n_layers_to_load)]
        for il, layer in enumerate(model.layers):
            def t(fmt: str, suffix: str, required: bool = False) -> Optional[Tensor]:
                return get_tensor(fmt % (prefix, il, suffix), required)
            layer.k_w = t(TN_ATTN_K, "weight")
            layer.q_w = t(TN_ATTN_Q, "weight")
            layer.v_w = t(TN_ATTN_V, "weight")
            layer.o_w = t(TN_ATTN_OUTPUT, "weight", True)
            layer.qkv_w = t(TN_ATTN_QKV, "weight")
            layer.k_norm = t(TN_ATTN_K_NORM, "weight")
            layer.q_norm = t(TN_ATTN_Q_NORM, "weight")
            layer.ln_1_w = t(TN_LN_1, "weight")
            layer.ln_2_w = t(TN_LN_2, "weight")
            layer.ls_1_w = t(TN_LS_1, "weight")
            layer.ls_2_w = t(TN_LS_2, "weight")
            layer.ls_out_w = t(TN_LS_OUT, "weight")
            layer.attn_post_norm_w = t(TN_ATTN_POST_NORM, "weight")
            layer.ff_post_norm_w = t(TN_FFN_POST_NORM, "weight")
            layer.k_b = t(TN_ATTN_K, "bias")
            layer.q_b = t(TN_ATTN_Q, "bias")
            layer.v_b = t(TN_ATTN_V, "bias")
            layer.o_b = t(TN_ATTN_OUTPUT, "bias")
            layer.qkv_b = t(TN_ATTN_QKV, "bias")
            layer.ln_1_b = t(TN_LN_1, "bias")
            layer.ln_2_b = t(TN_LN_2, "bias")
            layer.ff_gate_inp_w = t(TN_FFN_GATE_INP, "weight")
            layer.ff_gate_exps_w = t(TN_FFN_GATE_EXPS, "weight")
            layer.ff_up_exps_w = t(TN_FFN_UP_EXPS, "weight")
            layer.ff_down_exps_w = t(TN_FFN_DOWN_EXPS, "weight")
            layer.ff_exp_probs_b = t(TN_FFN_EXP_PROBS_B, "weight")
            is_moe = layer.ff_gate_exps_w is not None
            layer.ff_up_w = t(TN_FFN_UP, "weight", not is_moe)
            layer.ff_up_b = t(TN_FFN_UP, "bias")
            layer.ff_gate_w = t(TN_FFN_GATE, "weight")
            layer.ff_gate_b = t(TN_FFN_GATE, "bias")
            layer.ff_down_w = t(TN_FFN_DOWN, "weight", not is_moe)
            layer.ff_down_b = t(TN_FFN_DOWN, "bias")
            layer.attn_sinks = get_tensor(TN_ATTN_SINKS % (prefix, il), False)
            layer.deepstack_norm_w = get_tensor(TN_DEEPSTACK_NORM % (il, "weight"), False)
            layer.deepstack_norm_b = get_tensor(TN_DEEPSTACK_NORM % (il, "bias"), False)
            layer.deepstack_fc1_w = get_tensor(TN_DEEPSTACK_FC1 % (il, "weight"), False)
            layer.deepstack_fc1_b = get_tensor(TN_DEEPSTACK_FC1 % (il, "bias"), False)
            layer.deepstack_fc2_w = get_tensor(TN_DEEPSTACK_FC2 % (il, "weight"), False)
            layer.deepstack_fc2_b = get_tensor(TN_DEEPSTACK_FC2 % (il, "bias"), False)
            if layer.has_deepstack():
                model.n_deepstack_layers += 1
            # projectors exported with the legacy (swapped) FFN naming: up and down change places
            if (model.proj_type in SWAPPED_FFN_TYPES and layer.ff_up_w is not None and layer.ff_down_w is not None
                    and layer.ff_down_w.ne[0] == hp.n_embd):
                layer.ff_up_w, layer.ff_down_w = layer.ff_down_w, layer.ff_up_w
                layer.ff_up_b, layer.ff_down_b = layer.ff_down_b, layer.ff_up_b

        if model.proj_type in ("mlp", "mlp_norm"):
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"), False)
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"), False)
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (1, "weight"), False)    # Yi-type LLaVA
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (1, "bias"), False)
            model.mm_2_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"), False)    # missing in Yi-type LLaVA
            model.mm_2_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"), False)
            model.mm_3_w = get_tensor(TN_LLAVA_PROJ % (3, "weight"), False)
            model.mm_3_b = get_tensor(TN_LLAVA_PROJ % (3, "bias"), False)
            model.mm_4_w = get_tensor(TN_LLAVA_PROJ % (4, "weight"), False)
            model.mm_4_b = get_tensor(TN_LLAVA_PROJ % (4, "bias"), False)
            if model.mm_3_w is not None:     # clip.cpp's Yi-type LLaVA hack: the type becomes mlp_norm
                model.proj_type = "mlp_norm"
            model.image_newline = get_tensor(TN_IMAGE_NEWLINE, False)
        elif model.proj_type == "ldp":
            model.mm_model_mlp_1_w = get_tensor(TN_MVLM_PROJ_MLP % (1, "weight"))
            model.mm_model_mlp_1_b = get_tensor(TN_MVLM_PROJ_MLP % (1, "bias"))
            model.mm_model_mlp_3_w = get_tensor(TN_MVLM_PROJ_MLP % (3, "weight"))
            model.mm_model_mlp_3_b = get_tensor(TN_MVLM_PROJ_MLP % (3, "bias"))
            for blk in (1, 2):
                for field_, (i, suffix) in (("block_0_0_w", (0, "0.weight")), ("block_0_1_w", (0, "1.weight")),
                                            ("block_0_1_b", (0, "1.bias")), ("block_1_fc1_w", (1, "fc1.weight")),
                                            ("block_1_fc1_b", (1, "fc1.bias")), ("block_1_fc2_w", (1, "fc2.weight")),
                                            ("block_1_fc2_b", (1, "fc2.bias")), ("block_2_0_w", (2, "0.weight")),
                                            ("block_2_1_w", (2, "1.weight")), ("block_2_1_b", (2, "1.bias"))):
                    setattr(model, f"mm_model_block_{blk}_{field_}", get_tensor(TN_MVLM_PROJ_BLOCK % (blk, i, suffix)))
        elif model.proj_type == "ldpv2":
            model.mm_model_mlp_0_w = get_tensor(TN_MVLM_PROJ_MLP % (0, "weight"))
            model.mm_model_mlp_0_b = get_tensor(TN_MVLM_PROJ_MLP % (0, "bias"))
            model.mm_model_mlp_2_w = get_tensor(TN_MVLM_PROJ_MLP % (2, "weight"))
            model.mm_model_mlp_2_b = get_tensor(TN_MVLM_PROJ_MLP % (2, "bias"))
            model.mm_model_peg_0_w = get_tensor(TN_MVLM_PROJ_PEG % (0, "weight"))
            model.mm_model_peg_0_b = get_tensor(TN_MVLM_PROJ_PEG % (0, "bias"))
        elif model.proj_type == "minicpmv4_6":
            merger_required = hp.n_merge == 4

            def get_merger_tensor(name: str, required: bool = True) -> Optional[Tensor]:
                return get_tensor(name, merger_required and required)
            model.vit_merger_ln1_w = get_merger_tensor(TN_VIT_MERGER_LN1 % "weight")
            model.vit_merger_ln1_b = get_merger_tensor(TN_VIT_MERGER_LN1 % "bias")
            for x, fmt in (("q", TN_VIT_MERGER_ATTN_Q), ("k", TN_VIT_MERGER_ATTN_K), ("v", TN_VIT_MERGER_ATTN_V),
                           ("o", TN_VIT_MERGER_ATTN_O)):
                setattr(model, f"vit_merger_attn_{x}_w", get_merger_tensor(fmt % "weight"))
                setattr(model, f"vit_merger_attn_{x}_b", get_merger_tensor(fmt % "bias", False))
            model.vit_merger_ds_ln_w = get_merger_tensor(TN_VIT_MERGER_DS_LN % "weight")
            model.vit_merger_ds_ln_b = get_merger_tensor(TN_VIT_MERGER_DS_LN % "bias")
            model.vit_merger_ds_up_w = get_merger_tensor(TN_VIT_MERGER_DS_UP % "weight")
            model.vit_merger_ds_up_b = get_merger_tensor(TN_VIT_MERGER_DS_UP % "bias", False)
            model.vit_merger_ds_down_w = get_merger_tensor(TN_VIT_MERGER_DS_DOWN % "weight")
            model.vit_merger_ds_down_b = get_merger_tensor(TN_VIT_MERGER_DS_DOWN % "bias", False)
            # the final merger (DownsampleMLP)
            model.mm_input_norm_w = get_tensor(TN_MM_INP_NORM)
            model.mm_input_norm_b = get_tensor(TN_MM_INP_NORM_B, False)
            model.mm_ffn_up_w = get_tensor(TN_MM_UP % "weight")
            model.mm_ffn_up_b = get_tensor(TN_MM_UP % "bias", False)
            model.mm_ffn_down_w = get_tensor(TN_MM_DOWN % "weight")
            model.mm_ffn_down_b = get_tensor(TN_MM_DOWN % "bias", False)
        elif model.proj_type == "muse-glimmer":
            # fc -> GELU -> proj -> GELU -> vision_proj, no biases
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (1, "weight"))
            model.mm_2_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
        elif model.proj_type == "gemma3nv":
            model.mobilenet_stem_conv_w = get_tensor(TN_MNV5_STEM_CONV, False)
            model.mobilenet_stem_conv_b = get_tensor(TN_MNV5_STEM_BIAS, False)
            model.mobilenet_stem_norm_w = get_tensor(TN_MNV5_STEM_BN, False)
            model.msfa_ffn_expand_w = get_tensor(TN_MNV5_MSFA_FFN_EXP_W, False)
            model.msfa_ffn_expand_bn = get_tensor(TN_MNV5_MSFA_FFN_EXP_BN, False)
            model.msfa_ffn_project_w = get_tensor(TN_MNV5_MSFA_FFN_PROJ_W, False)
            model.msfa_ffn_project_bn = get_tensor(TN_MNV5_MSFA_FFN_PROJ_BN, False)
            model.msfa_concat_norm_w = get_tensor(TN_MNV5_MSFA_NORM, False)
            # the blocks, stage by stage, as long as a block's first tensor is there
            for stage in range(4):
                blocks_found_in_stage = 0
                blk_idx = 0
                while True:
                    def t(fmt: str) -> Optional[Tensor]:
                        return get_tensor(fmt % (stage, blk_idx), False)
                    block = MobilenetV5Block()
                    found_block = False
                    block.s0_conv_exp_w = t(TN_MNV5_BLK_S0_EXP_W)
                    if block.s0_conv_exp_w is not None:       # an edge residual
                        found_block = True
                        block.s0_bn1_w = t(TN_MNV5_BLK_S0_BN1_W)
                        block.s0_conv_pwl_w = t(TN_MNV5_BLK_S0_PWL_W)
                        block.s0_bn2_w = t(TN_MNV5_BLK_S0_BN2_W)
                    else:                                      # a universal inverted residual
                        block.dw_start_w = t(TN_MNV5_BLK_DW_START_W)
                        block.pw_exp_w = t(TN_MNV5_BLK_PW_EXP_W)
                        if block.dw_start_w is not None or block.pw_exp_w is not None:
                            found_block = True
                            if block.dw_start_w is not None:
                                block.dw_start_bn_w = t(TN_MNV5_BLK_DW_START_BN)
                            if block.pw_exp_w is not None:
                                block.pw_exp_bn_w = t(TN_MNV5_BLK_PW_EXP_BN)
                            block.dw_mid_w = t(TN_MNV5_BLK_DW_MID_W)
                            if block.dw_mid_w is not None:
                                block.dw_mid_bn_w = t(TN_MNV5_BLK_DW_MID_BN)
                            block.pw_proj_w = t(TN_MNV5_BLK_PW_PROJ_W)
                            if block.pw_proj_w is not None:
                                block.pw_proj_bn_w = t(TN_MNV5_BLK_PW_PROJ_BN)
                            block.layer_scale_w = t(TN_MNV5_BLK_LAYER_SCALE)
                    attn_q_check = t(TN_MNV5_ATTN_Q_W)         # an attention (MQA) block
                    if attn_q_check is not None:
                        found_block = True
                        block.attn_q_w = attn_q_check
                        block.attn_k_w = t(TN_MNV5_ATTN_K_W)
                        block.attn_v_w = t(TN_MNV5_ATTN_V_W)
                        block.attn_o_w = t(TN_MNV5_ATTN_O_W)
                        block.attn_k_dw_w = t(TN_MNV5_ATTN_K_DW)
                        block.attn_k_norm_w = t(TN_MNV5_ATTN_K_NORM)
                        block.attn_v_dw_w = t(TN_MNV5_ATTN_V_DW)
                        block.attn_v_norm_w = t(TN_MNV5_ATTN_V_NORM)
                        block.attn_norm_w = t(TN_MNV5_ATTN_NORM)
                        if block.layer_scale_w is None:
                            block.layer_scale_w = t(TN_MNV5_BLK_LAYER_SCALE)
                    if not found_block:
                        break
                    model.mobilenet_blocks.append(block)
                    blocks_found_in_stage += 1
                    blk_idx += 1
                if blocks_found_in_stage > 0:
                    model.mobilenet_stage_ends.append(len(model.mobilenet_blocks) - 1)
            model.mm_input_proj_w = get_tensor(TN_MM_INP_PROJ)
            model.mm_soft_emb_norm_w = get_tensor(TN_MM_SOFT_EMB_N)
        elif model.proj_type == "adapter":
            model.mm_model_adapter_conv_w = get_tensor(TN_GLM_ADAPER_CONV % "weight")
            model.mm_model_adapter_conv_b = get_tensor(TN_GLM_ADAPER_CONV % "bias")
            model.mm_model_mlp_0_w = get_tensor(TN_GLM_ADAPTER_LINEAR % "weight")
            model.mm_model_ln_q_w = get_tensor(TN_GLM_ADAPTER_NORM_1 % "weight")
            model.mm_model_ln_q_b = get_tensor(TN_GLM_ADAPTER_NORM_1 % "bias")
            model.mm_model_mlp_1_w = get_tensor(TN_GLM_ADAPTER_D_H_2_4H % "weight")
            model.mm_model_mlp_2_w = get_tensor(TN_GLM_ADAPTER_GATE % "weight")
            model.mm_model_mlp_3_w = get_tensor(TN_GLM_ADAPTER_D_4H_2_H % "weight")
            model.mm_boi = get_tensor(TN_TOK_GLM_BOI)
            model.mm_eoi = get_tensor(TN_TOK_GLM_EOI)
        elif model.proj_type == "resampler":
            model.mm_model_pos_embed_k = get_tensor(TN_MINICPMV_POS_EMBD_K)
            model.mm_model_query = get_tensor(TN_MINICPMV_QUERY)
            model.mm_model_proj = get_tensor(TN_MINICPMV_PROJ)
            model.mm_model_kv_proj = get_tensor(TN_MINICPMV_KV_PROJ)
            for x in ("q", "k", "v"):
                setattr(model, f"mm_model_attn_{x}_w", get_tensor(TN_MINICPMV_ATTN % (x, "weight")))
            for x in ("q", "k", "v"):
                setattr(model, f"mm_model_attn_{x}_b", get_tensor(TN_MINICPMV_ATTN % (x, "bias")))
            model.mm_model_attn_o_w = get_tensor(TN_MINICPMV_ATTN % ("out", "weight"))
            model.mm_model_attn_o_b = get_tensor(TN_MINICPMV_ATTN % ("out", "bias"))
            for x in ("q", "kv", "post"):
                setattr(model, f"mm_model_ln_{x}_w", get_tensor(TN_MINICPMV_LN % (x, "weight")))
                setattr(model, f"mm_model_ln_{x}_b", get_tensor(TN_MINICPMV_LN % (x, "bias")))
        elif model.proj_type == "nemotron_v2_vl":
            model.mm_0_w = get_tensor(TN_MVLM_PROJ_MLP % (0, "weight"))
            model.mm_1_w = get_tensor(TN_MVLM_PROJ_MLP % (1, "weight"))
            model.mm_3_w = get_tensor(TN_MVLM_PROJ_MLP % (3, "weight"))
        elif model.proj_type == "cogvlm":
            model.mm_model_proj = get_tensor(TN_MM_PROJECTOR % "weight")
            model.mm_post_fc_norm_w = get_tensor(TN_MM_POST_FC_NORM % "weight")
            model.mm_post_fc_norm_b = get_tensor(TN_MM_POST_FC_NORM % "bias")
            model.mm_h_to_4h_w = get_tensor(TN_MM_H_TO_4H % "weight")
            model.mm_gate_w = get_tensor(TN_MM_GATE % "weight")
            model.mm_4h_to_h_w = get_tensor(TN_MM_4H_TO_H % "weight")
            model.mm_boi = get_tensor(TN_TOK_BOI)
            model.mm_eoi = get_tensor(TN_TOK_EOI)
        elif model.proj_type == "janus_pro":
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"))
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (1, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (1, "bias"))
        elif model.proj_type == "phi4":
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"))
            model.mm_2_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_2_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"))
        elif model.proj_type == "ling3vl":
            model.mm_input_norm_w = get_tensor(TN_MM_INP_NORM)       # merger.norm
            model.mm_input_norm_b = get_tensor(TN_MM_INP_NORM_B)
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"))
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"))
        elif model.proj_type == "step3vl":
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"), False)
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (1, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (1, "bias"), False)
            model.mm_model_proj = get_tensor(TN_MM_PROJECTOR % "weight")
        elif model.proj_type in ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"):
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"))
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"))
        elif model.proj_type == "yasa2":
            # the patch conv and its bias: the tensors the common section loaded
            if model.patch_embeddings_0 is None:
                raise GGMLAbort(f"{self.path}: llama.cpp would abort loading the multimodal projector (clip.cpp "
                                f"GGML_ASSERT: yasa2 requires v.patch_embd.weight)")
            model.yasa_patch_ln_w = get_tensor(TN_YASA_PATCH_LN_W, False)
            model.yasa_patch_ln_b = get_tensor(TN_YASA_PATCH_LN_B, False)
            model.yasa_backbone_ln_w = get_tensor(TN_YASA_BACKBONE_LN_W, False)
            model.yasa_backbone_ln_b = get_tensor(TN_YASA_BACKBONE_LN_B, False)
            model.yasa_vision_pos_embed = get_tensor(TN_YASA_POS_EMBD, False)
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"), False)
            model.mm_2_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_2_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"), False)
            model.yasa_stages = []
            s = 0
            while True:      # stages until one has neither a downsample nor blocks
                stage = Yasa2Stage(get_tensor(TN_YASA_STAGE_DOWN_LN % (s, "weight"), False),
                                   get_tensor(TN_YASA_STAGE_DOWN_LN % (s, "bias"), False),
                                   get_tensor(TN_YASA_STAGE_DOWN_CONV % (s, "weight"), False),
                                   get_tensor(TN_YASA_STAGE_DOWN_CONV % (s, "bias"), False))
                bi = 0
                while (dw_w := get_tensor(TN_YASA_STAGE_BLK % (s, bi, "dw", "weight"), False)) is not None:
                    blk = Yasa2Block(dw_w)
                    for part in ("dw", "ln", "pw1", "grn", "pw2"):
                        if part != "dw":
                            setattr(blk, f"{part}_w", get_tensor(TN_YASA_STAGE_BLK % (s, bi, part, "weight"), False))
                        setattr(blk, f"{part}_b", get_tensor(TN_YASA_STAGE_BLK % (s, bi, part, "bias"), False))
                    stage.blocks.append(blk)
                    bi += 1
                if stage.down_conv_w is None and not stage.blocks:
                    break
                model.yasa_stages.append(stage)
                s += 1
        elif model.proj_type == "deepseek4v":
            mm_1_2(True)
            # the sentinel embeddings written into the output block
            model.image_newline = get_tensor(TN_IMAGE_NEWLINE)
            model.token_embd_img_start = get_tensor(TN_TOK_IMG_START)
            model.token_embd_img_end = get_tensor(TN_TOK_IMG_END)
            model.token_embd_img_pad = get_tensor(TN_TOK_IMG_PAD)
        elif model.proj_type == "minimax_m3":
            # the per-patch MLP mm.1 -> gelu -> mm.2, then the 2x2 merge MLP
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (1, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (1, "bias"))
            model.mm_2_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_2_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"))
            model.mm_merger_fc1_w = get_tensor(TN_MM_MERGER_FC1 % "weight")
            model.mm_merger_fc1_b = get_tensor(TN_MM_MERGER_FC1 % "bias")
            model.mm_merger_fc2_w = get_tensor(TN_MM_MERGER_FC2 % "weight")
            model.mm_merger_fc2_b = get_tensor(TN_MM_MERGER_FC2 % "bias")
        elif model.proj_type == "exaone4_5":
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"))
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"))
        elif model.proj_type == "gemma3":
            model.mm_input_proj_w = get_tensor(TN_MM_INP_PROJ)
            model.mm_soft_emb_norm_w = get_tensor(TN_MM_SOFT_EMB_N)
        elif model.proj_type == "idefics3":
            model.mm_fc_w = get_tensor(TN_MM_PROJECTOR % "weight")
        elif model.proj_type == "lfm2":
            model.mm_input_norm_w = get_tensor(TN_MM_INP_NORM, False)
            model.mm_input_norm_b = get_tensor(TN_MM_INP_NORM_B, False)
            mm_1_2(True)
        elif model.proj_type in ("kimivl", "paddleocr", "kimik25"):
            model.mm_input_norm_w = get_tensor(TN_MM_INP_NORM)
            model.mm_input_norm_b = get_tensor(TN_MM_INP_NORM_B)
            mm_1_2(True)
        elif model.proj_type == "pixtral":
            mm_1_2(False)
            model.token_embd_img_break = get_tensor(TN_TOK_IMG_BREAK)
            model.mm_input_norm_w = get_tensor(TN_MM_INP_NORM, False)       # Mistral Small 3.1's merger
            model.mm_patch_merger_w = get_tensor(TN_MM_PATCH_MERGER % "weight", False)
        elif model.proj_type == "lightonocr":     # Pixtral's tensors without [IMG_BREAK]
            mm_1_2(False)
            model.mm_input_norm_w = get_tensor(TN_MM_INP_NORM, False)
            model.mm_patch_merger_w = get_tensor(TN_MM_PATCH_MERGER % "weight", False)
        elif model.proj_type in ("glm4v", "glm5v"):
            model.mm_fc_w = get_tensor(TN_MM_PROJECTOR % "weight")
            model.mm_ffn_up_w = get_tensor(TN_MM_UP % "weight")
            model.mm_ffn_up_b = get_tensor(TN_MM_UP % "bias", False)
            model.mm_ffn_gate_w = get_tensor(TN_MM_GATE % "weight")
            model.mm_ffn_gate_b = get_tensor(TN_MM_GATE % "bias", False)
            model.mm_ffn_down_w = get_tensor(TN_MM_DOWN % "weight")
            model.mm_ffn_down_b = get_tensor(TN_MM_DOWN % "bias", False)
            model.mm_post_norm_w = get_tensor(TN_MM_POST_NORM % "weight")
            model.mm_post_norm_b = get_tensor(TN_MM_POST_NORM % "bias", False)
            model.mm_patch_merger_w = get_tensor(TN_MM_PATCH_MERGER % "weight")
            model.mm_patch_merger_b = get_tensor(TN_MM_PATCH_MERGER % "bias")
        elif model.proj_type == "internvl":
            model.mm_0_w = get_tensor(TN_MVLM_PROJ_MLP % (0, "weight"))
            model.mm_0_b = get_tensor(TN_MVLM_PROJ_MLP % (0, "bias"))
            model.mm_1_w = get_tensor(TN_MVLM_PROJ_MLP % (1, "weight"))
            model.mm_1_b = get_tensor(TN_MVLM_PROJ_MLP % (1, "bias"))
            model.mm_3_w = get_tensor(TN_MVLM_PROJ_MLP % (3, "weight"))
            model.mm_3_b = get_tensor(TN_MVLM_PROJ_MLP % (3, "bias"))
        elif model.proj_type == "gemma4uv":
            model.mm_input_proj_w = get_tensor(TN_MM_INP_PROJ)
            for i in (1, 2, 3):       # 3: pos_norm
                setattr(model, f"patch_norm_{i}_w", get_tensor(TN_PATCH_NORM % (i, "weight")))
                setattr(model, f"patch_norm_{i}_b", get_tensor(TN_PATCH_NORM % (i, "bias")))
        elif model.proj_type == "gemma4v":
            model.mm_input_proj_w = get_tensor(TN_MM_INP_PROJ)
            model.std_bias = get_tensor(TN_STD_BIAS, False)
            model.std_scale = get_tensor(TN_STD_SCALE, False)
            self.load_clamp_info(model, loaded)
        elif model.proj_type in ("ultravox", "voxtral", "qwen2a", "musicflamingo"):
            model.conv1d_1_w = get_tensor(TN_CONV1D % (1, "weight"))
            model.conv1d_1_b = get_tensor(TN_CONV1D % (1, "bias"))
            model.conv1d_2_w = get_tensor(TN_CONV1D % (2, "weight"))
            model.conv1d_2_b = get_tensor(TN_CONV1D % (2, "bias"))
            if model.proj_type == "qwen2a":
                model.mm_fc_w = get_tensor(TN_MM_AUDIO_FC % "weight")
                model.mm_fc_b = get_tensor(TN_MM_AUDIO_FC % "bias")
            else:
                model.mm_1_w = get_tensor(TN_MM_AUDIO_MLP % (1, "weight"))
                if model.proj_type == "musicflamingo":
                    model.mm_1_b = get_tensor(TN_MM_AUDIO_MLP % (1, "bias"))
                model.mm_2_w = get_tensor(TN_MM_AUDIO_MLP % (2, "weight"))
                if model.proj_type == "musicflamingo":
                    model.mm_2_b = get_tensor(TN_MM_AUDIO_MLP % (2, "bias"))
            if model.proj_type == "ultravox":
                model.mm_norm_pre_w = get_tensor(TN_MM_NORM_PRE % "weight")
                model.mm_norm_mid_w = get_tensor(TN_MM_NORM_MID % "weight")
        elif model.proj_type == "meralion":
            model.conv1d_1_w = get_tensor(TN_CONV1D % (1, "weight"))
            model.conv1d_1_b = get_tensor(TN_CONV1D % (1, "bias"))
            model.conv1d_2_w = get_tensor(TN_CONV1D % (2, "weight"))
            model.conv1d_2_b = get_tensor(TN_CONV1D % (2, "bias"))
            # the adaptor: frame compression (+ SiLU), gate and pool projections (a GLU), out projection
            model.mm_0_w = get_tensor(TN_MM_AUDIO_MLP % (0, "weight"))
            model.mm_0_b = get_tensor(TN_MM_AUDIO_MLP % (0, "bias"))
            model.mm_1_w = get_tensor(TN_MM_AUDIO_MLP % (1, "weight"))
            model.mm_1_b = get_tensor(TN_MM_AUDIO_MLP % (1, "bias"))
            model.mm_2_w = get_tensor(TN_MM_AUDIO_MLP % (2, "weight"))
            model.mm_2_b = get_tensor(TN_MM_AUDIO_MLP % (2, "bias"))
            model.mm_3_w = get_tensor(TN_MM_AUDIO_MLP % (3, "weight"))
            model.mm_3_b = get_tensor(TN_MM_AUDIO_MLP % (3, "bias"))
            model.mm_norm_pre_w = get_tensor(TN_MM_NORM_PRE % "weight")     # ln_speech
            model.mm_norm_pre_b = get_tensor(TN_MM_NORM_PRE % "bias")
        elif model.proj_type == "dots3note_a":
            model.conv2d_1_w = get_tensor(TN_CONV2D % (1, "weight"))
            model.conv2d_1_b = get_tensor(TN_CONV2D % (1, "bias"))
            model.conv2d_2_w = get_tensor(TN_CONV2D % (2, "weight"))
            model.conv2d_2_b = get_tensor(TN_CONV2D % (2, "bias"))
            model.conv2d_3_w = get_tensor(TN_CONV2D % (3, "weight"))
            model.conv2d_3_b = get_tensor(TN_CONV2D % (3, "bias"))
            model.conv_out_w = get_tensor(TN_CONV_OUT % "weight")     # no bias
            # adapter: LayerNorm -> Linear -> GELU -> Linear
            model.mm_norm_pre_w = get_tensor(TN_MM_NORM_PRE % "weight")
            model.mm_norm_pre_b = get_tensor(TN_MM_NORM_PRE % "bias")
            model.mm_1_w = get_tensor(TN_MM_AUDIO_MLP % (1, "weight"))
            model.mm_1_b = get_tensor(TN_MM_AUDIO_MLP % (1, "bias"))
            model.mm_2_w = get_tensor(TN_MM_AUDIO_MLP % (3, "weight"))
            model.mm_2_b = get_tensor(TN_MM_AUDIO_MLP % (3, "bias"))
        elif model.proj_type == "granite_speech":
            model.inp_proj_w = get_tensor(TN_INP_PROJ % "weight")
            model.inp_proj_b = get_tensor(TN_INP_PROJ % "bias")
            model.ctc_out_w = get_tensor(TN_CTC_OUT % "weight")
            model.ctc_out_b = get_tensor(TN_CTC_OUT % "bias")
            model.ctc_out_mid_w = get_tensor(TN_CTC_OUT_MID % "weight")
            model.ctc_out_mid_b = get_tensor(TN_CTC_OUT_MID % "bias")
            for il, layer in enumerate(model.layers):
                def t(fmt: str, suffix: str) -> Optional[Tensor]:
                    return get_tensor(fmt % (prefix, il, suffix))
                layer.attn_rel_pos_emb = get_tensor(TN_ATTN_REL_POS_EMB % (prefix, il))
                layer.ff_norm_w = t(TN_FFN_NORM, "weight")
                layer.ff_norm_b = t(TN_FFN_NORM, "bias")
                layer.ff_norm_1_w = t(TN_FFN_NORM_1, "weight")
                layer.ff_norm_1_b = t(TN_FFN_NORM_1, "bias")
                layer.ff_up_1_w = t(TN_FFN_UP_1, "weight")
                layer.ff_up_1_b = t(TN_FFN_UP_1, "bias")
                layer.ff_down_1_w = t(TN_FFN_DOWN_1, "weight")
                layer.ff_down_1_b = t(TN_FFN_DOWN_1, "bias")
                layer.norm_conv_w = t(TN_NORM_CONV, "weight")
                layer.norm_conv_b = t(TN_NORM_CONV, "bias")
                layer.conv_norm_w = t(TN_CONV_NORM, "weight")
                layer.conv_norm_b = t(TN_CONV_NORM, "bias")
                layer.conv_dw_w = t(TN_CONV_DW, "weight")
                layer.conv_pw1_w = t(TN_CONV_PW1, "weight")
                layer.conv_pw1_b = t(TN_CONV_PW1, "bias")
                layer.conv_pw2_w = t(TN_CONV_PW2, "weight")
                layer.conv_pw2_b = t(TN_CONV_PW2, "bias")
            qf = QfBlock()
            model.qf_proj_blocks = [qf]
            qf.qf_proj_query = get_tensor(TN_QF_PROJ_QUERY % prefix)
            qf.qf_proj_norm_w = get_tensor(TN_QF_PROJ_NORM % (prefix, "weight"))
            qf.qf_proj_norm_b = get_tensor(TN_QF_PROJ_NORM % (prefix, "bias"))
            qf.qf_proj_linear_w = get_tensor(TN_QF_PROJ_LINEAR % (prefix, "weight"))
            qf.qf_proj_linear_b = get_tensor(TN_QF_PROJ_LINEAR % (prefix, "bias"))
            qf.qf_proj_layers = [ClipLayer() for _ in range(2)]      # n_proj_layers
            for il, pl in enumerate(qf.qf_proj_layers):
                def q(fmt: str, suffix: str) -> Optional[Tensor]:
                    return get_tensor(fmt % (prefix, il, suffix))
                pl.q_w, pl.q_b = q(TN_QF_SELF_ATTN_Q, "weight"), q(TN_QF_SELF_ATTN_Q, "bias")
                pl.k_w, pl.k_b = q(TN_QF_SELF_ATTN_K, "weight"), q(TN_QF_SELF_ATTN_K, "bias")
                pl.v_w, pl.v_b = q(TN_QF_SELF_ATTN_V, "weight"), q(TN_QF_SELF_ATTN_V, "bias")
                pl.o_w, pl.o_b = q(TN_QF_SELF_ATTN_O, "weight"), q(TN_QF_SELF_ATTN_O, "bias")
                pl.ln_1_w, pl.ln_1_b = q(TN_QF_SELF_ATTN_N, "weight"), q(TN_QF_SELF_ATTN_N, "bias")
                pl.cross_attn_q_w, pl.cross_attn_q_b = q(TN_QF_CROSS_ATTN_Q, "weight"), q(TN_QF_CROSS_ATTN_Q, "bias")
                pl.cross_attn_k_w, pl.cross_attn_k_b = q(TN_QF_CROSS_ATTN_K, "weight"), q(TN_QF_CROSS_ATTN_K, "bias")
                pl.cross_attn_v_w, pl.cross_attn_v_b = q(TN_QF_CROSS_ATTN_V, "weight"), q(TN_QF_CROSS_ATTN_V, "bias")
                pl.cross_attn_o_w, pl.cross_attn_o_b = q(TN_QF_CROSS_ATTN_O, "weight"), q(TN_QF_CROSS_ATTN_O, "bias")
                pl.cross_attn_norm_w = q(TN_QF_CROSS_ATTN_N, "weight")
                pl.cross_attn_norm_b = q(TN_QF_CROSS_ATTN_N, "bias")
                pl.ff_up_w, pl.ff_up_b = q(TN_QF_FFN_UP, "weight"), q(TN_QF_FFN_UP, "bias")
                pl.ff_down_w, pl.ff_down_b = q(TN_QF_FFN_DOWN, "weight"), q(TN_QF_FFN_DOWN, "bias")
                pl.ln_2_w, pl.ln_2_b = q(TN_QF_FFN_NORM, "weight"), q(TN_QF_FFN_NORM, "bias")
        elif model.proj_type == "parakeet":
            hp.n_mel_filters = self.check_vector(TN_MEL_FILTERS)
            hp.n_window = self.check_vector(TN_WINDOW)
            for i in (0, 2, 3, 5, 6):
                model.pre_encode_conv_X_w[i] = get_tensor(TN_CONV1D % (i, "weight"))
                model.pre_encode_conv_X_b[i] = get_tensor(TN_CONV1D % (i, "bias"))
            model.pre_encode_out_w = get_tensor(TN_PRE_ENCODE_OUT % "weight")
            model.pre_encode_out_b = get_tensor(TN_PRE_ENCODE_OUT % "bias")
            model.mm_norm_pre_w = get_tensor(TN_MM_NORM_PRE % "weight", False)
            model.mm_0_w = get_tensor(TN_MM_AUDIO_MLP % (1, "weight"), False)
            model.mm_1_w = get_tensor(TN_MM_AUDIO_MLP % (2, "weight"), False)
            for il, layer in enumerate(model.layers):
                def t(fmt: str, suffix: str, required: bool = True) -> Optional[Tensor]:
                    return get_tensor(fmt % (prefix, il, suffix), required)
                layer.linear_pos_w = t(TN_LINEAR_POS, "weight")
                layer.pos_bias_u = get_tensor(TN_POS_BIAS_U % (prefix, il))
                layer.pos_bias_v = get_tensor(TN_POS_BIAS_V % (prefix, il))
                layer.conv_pw1_w = t(TN_CONV_PW1, "weight")
                layer.conv_pw1_b = t(TN_CONV_PW1, "bias", False)
                layer.conv_dw_w = t(TN_CONV_DW, "weight")
                layer.conv_dw_b = t(TN_CONV_DW, "bias", False)
                layer.conv_norm_w = t(TN_CONV_NORM, "weight")
                layer.conv_norm_b = t(TN_CONV_NORM, "bias")
                layer.conv_norm_mean = get_tensor(TN_CONV_NORM_MEAN % (prefix, il))
                layer.conv_norm_var = get_tensor(TN_CONV_NORM_VAR % (prefix, il))
                layer.conv_pw2_w = t(TN_CONV_PW2, "weight")
                layer.conv_pw2_b = t(TN_CONV_PW2, "bias", False)
                layer.ff_norm_w = t(TN_FFN_NORM, "weight")
                layer.ff_norm_b = t(TN_FFN_NORM, "bias")
                layer.ff_norm_1_w = t(TN_FFN_NORM_1, "weight")
                layer.ff_norm_1_b = t(TN_FFN_NORM_1, "bias")
                layer.ff_up_1_w = t(TN_FFN_UP_1, "weight")
                layer.ff_up_1_b = t(TN_FFN_UP_1, "bias", False)
                layer.ff_down_1_w = t(TN_FFN_DOWN_1, "weight")
                layer.ff_down_1_b = t(TN_FFN_DOWN_1, "bias", False)
                layer.norm_conv_w = t(TN_NORM_CONV, "weight")
                layer.norm_conv_b = t(TN_NORM_CONV, "bias")
            # the file's vision projector (Nemotron's mlp1), required by this loader too
            model.mm_model_mlp_1_w = get_tensor(TN_MVLM_PROJ_MLP % (0, "weight"))
            model.mm_model_mlp_2_w = get_tensor(TN_MVLM_PROJ_MLP % (1, "weight"))
            model.mm_model_mlp_3_w = get_tensor(TN_MVLM_PROJ_MLP % (3, "weight"))
        elif model.proj_type == "mimo_audio":
            model.conv1d_1_w = get_tensor(TN_CONV1D % (1, "weight"))
            model.conv1d_1_b = get_tensor(TN_CONV1D % (1, "bias"))
            model.conv1d_2_w = get_tensor(TN_CONV1D % (2, "weight"))
            model.conv1d_2_b = get_tensor(TN_CONV1D % (2, "bias"))
            model.downsample_conv_w = get_tensor(TN_A_DOWNSAMPLE_CONV % "weight")
            model.downsample_norm_w = get_tensor(TN_A_DOWNSAMPLE_NORM % "weight")
            model.downsample_norm_b = get_tensor(TN_A_DOWNSAMPLE_NORM % "bias")
            model.rvq_codebook = get_tensor(TN_A_RVQ_CODEBOOK % "weight", False)
            model.mm_a_code_embd = get_tensor(TN_MM_A_CODE_EMBD % "weight", False)
            if model.rvq_codebook is None or model.mm_a_code_embd is None:
                self.fail(f"load_tensors: mimo_audio: missing {TN_A_RVQ_CODEBOOK} or {TN_MM_A_CODE_EMBD}")
            # the metadata's bin counts bound by both tables (the graph's views read that many rows)
            for bins in hp.rvq_codebook_size:
                if bins <= 0 or bins > model.rvq_codebook.ne[1] or bins > model.mm_a_code_embd.ne[1]:
                    self.fail(f"load_tensors: mimo_audio: {KEY_A_RVQ_CODEBOOK_SIZE} entry ({bins}) out of range for "
                              f"codebook/code_embd tensors")
            model.mm_a_local_layers = [ClipLayer() for _ in range(hp.audio_local_n_layer)]
            for il, layer in enumerate(model.mm_a_local_layers):
                layer.q_w = get_tensor(TN_MM_A_LOCAL_ATTN_Q % (il, "weight"))
                layer.q_b = get_tensor(TN_MM_A_LOCAL_ATTN_Q % (il, "bias"))
                layer.k_w = get_tensor(TN_MM_A_LOCAL_ATTN_K % (il, "weight"))
                layer.k_b = get_tensor(TN_MM_A_LOCAL_ATTN_K % (il, "bias"))
                layer.v_w = get_tensor(TN_MM_A_LOCAL_ATTN_V % (il, "weight"))
                layer.v_b = get_tensor(TN_MM_A_LOCAL_ATTN_V % (il, "bias"))
                layer.o_w = get_tensor(TN_MM_A_LOCAL_ATTN_OUT % (il, "weight"))
                layer.ff_gate_w = get_tensor(TN_MM_A_LOCAL_FFN_GATE % (il, "weight"))
                layer.ff_up_w = get_tensor(TN_MM_A_LOCAL_FFN_UP % (il, "weight"))
                layer.ff_down_w = get_tensor(TN_MM_A_LOCAL_FFN_DOWN % (il, "weight"))
                layer.ln_1_w = get_tensor(TN_MM_A_LOCAL_LN1 % (il, "weight"))
                layer.ln_2_w = get_tensor(TN_MM_A_LOCAL_LN2 % (il, "weight"))
            model.mm_a_local_norm_w = get_tensor(TN_MM_A_LOCAL_NORM % "weight")
            model.mm_1_w = get_tensor(TN_MM_AUDIO_MLP % (1, "weight"))
            model.mm_2_w = get_tensor(TN_MM_AUDIO_MLP % (2, "weight"))
        elif model.proj_type == "glma":
            model.conv1d_1_w = get_tensor(TN_CONV1D % (1, "weight"))
            model.conv1d_1_b = get_tensor(TN_CONV1D % (1, "bias"))
            model.conv1d_2_w = get_tensor(TN_CONV1D % (2, "weight"))
            model.conv1d_2_b = get_tensor(TN_CONV1D % (2, "bias"))
            model.mm_1_w = get_tensor(TN_MM_AUDIO_MLP % (1, "weight"))
            model.mm_1_b = get_tensor(TN_MM_AUDIO_MLP % (1, "bias"))
            model.mm_2_w = get_tensor(TN_MM_AUDIO_MLP % (2, "weight"))
            model.mm_2_b = get_tensor(TN_MM_AUDIO_MLP % (2, "bias"))
            model.mm_norm_pre_w = get_tensor(TN_MM_NORM_PRE % "weight")
            model.mm_norm_pre_b = get_tensor(TN_MM_NORM_PRE % "bias")
            model.mm_boi = get_tensor(TN_TOK_BOI)
            model.mm_eoi = get_tensor(TN_TOK_EOI)
        elif model.proj_type == "qwen3a":
            model.conv2d_1_w = get_tensor(TN_CONV2D % (1, "weight"))
            model.conv2d_1_b = get_tensor(TN_CONV2D % (1, "bias"))
            model.conv2d_2_w = get_tensor(TN_CONV2D % (2, "weight"))
            model.conv2d_2_b = get_tensor(TN_CONV2D % (2, "bias"))
            model.conv2d_3_w = get_tensor(TN_CONV2D % (3, "weight"))
            model.conv2d_3_b = get_tensor(TN_CONV2D % (3, "bias"))
            model.conv_out_w = get_tensor(TN_CONV_OUT % "weight")     # no bias
            model.mm_1_w = get_tensor(TN_MM_AUDIO_MLP % (1, "weight"))
            model.mm_1_b = get_tensor(TN_MM_AUDIO_MLP % (1, "bias"))
            model.mm_2_w = get_tensor(TN_MM_AUDIO_MLP % (2, "weight"))
            model.mm_2_b = get_tensor(TN_MM_AUDIO_MLP % (2, "bias"))
        elif model.proj_type == "gemma4a":
            for i in range(2):
                model.sscp_conv_w[i] = get_tensor(TN_A_CONV1D % (i, "weight"))
                model.sscp_conv_b[i] = get_tensor(TN_A_CONV1D % (i, "bias"), False)
                model.sscp_norm_w[i] = get_tensor(TN_A_CONV1D_NORM % (i, "weight"), False)
            model.sscp_inp_proj_w = get_tensor(TN_A_INP_PROJ % "weight")
            model.sscp_inp_proj_b = get_tensor(TN_A_INP_PROJ % "bias", False)
            model.audio_out_proj_w = get_tensor(TN_A_OUT_PROJ % "weight", False)
            model.audio_out_proj_b = get_tensor(TN_A_OUT_PROJ % "bias", False)
            model.mm_soft_emb_norm_w = get_tensor(TN_A_MM_SOFT_EMB_N % "weight", False)
            model.mm_input_proj_w = get_tensor(TN_A_MM_INP_PROJ % "weight", False)
            for il, layer in enumerate(model.layers):
                def t(fmt: str, suffix: str, required: bool = False) -> Optional[Tensor]:
                    return get_tensor(fmt % (prefix, il, suffix), required)
                layer.ff_norm_w = t(TN_FFN_NORM, "weight", True)
                layer.attn_pre_norm_w = t(TN_A_ATTN_PRE_NORM, "weight")
                layer.per_dim_scale_w = t(TN_A_PER_DIM_SCALE, "weight")
                layer.per_dim_k_scale_w = t(TN_A_PER_DIM_K_SCALE, "weight")
                layer.attn_k_rel_w = t(TN_A_ATTN_K_REL, "weight")
                # conv_norm and norm_conv are swapped in the GGUF (tensor_mapping.py): read crosswise
                layer.norm_conv_w = t(TN_CONV_NORM, "weight")
                layer.norm_conv_b = t(TN_CONV_NORM, "bias")
                layer.conv_pw1_w = t(TN_CONV_PW1, "weight", True)
                layer.conv_pw1_b = t(TN_CONV_PW1, "bias")
                layer.conv_dw_w = t(TN_CONV_DW, "weight", True)
                layer.conv_dw_b = t(TN_CONV_DW, "bias")
                layer.conv_norm_w = t(TN_NORM_CONV, "weight")
                layer.conv_norm_b = t(TN_NORM_CONV, "bias")
                layer.conv_pw2_w = t(TN_CONV_PW2, "weight", True)
                layer.conv_pw2_b = t(TN_CONV_PW2, "bias")
                layer.ff_norm_1_w = t(TN_FFN_NORM_1, "weight", True)
                layer.ff_up_1_w = t(TN_FFN_UP_1, "weight", True)
                layer.ff_up_1_b = t(TN_FFN_UP_1, "bias")
                layer.ff_down_1_w = t(TN_FFN_DOWN_1, "weight", True)
                layer.ff_down_1_b = t(TN_FFN_DOWN_1, "bias")
                layer.ff_post_norm_1_w = t(TN_A_FFN_POST_NORM_1, "weight")
            self.load_clamp_info(model, loaded)
        elif model.proj_type == "lfm2a":
            for i in (0, 2, 3, 5, 6):
                model.pre_encode_conv_X_w[i] = get_tensor(TN_CONV1D % (i, "weight"))
                model.pre_encode_conv_X_b[i] = get_tensor(TN_CONV1D % (i, "bias"))
            model.pre_encode_out_w = get_tensor(TN_PRE_ENCODE_OUT % "weight")
            model.pre_encode_out_b = get_tensor(TN_PRE_ENCODE_OUT % "bias")
            model.mm_0_w = get_tensor(TN_MM_AUDIO_MLP % (0, "weight"))
            model.mm_0_b = get_tensor(TN_MM_AUDIO_MLP % (0, "bias"))
            model.mm_1_w = get_tensor(TN_MM_AUDIO_MLP % (1, "weight"))
            model.mm_1_b = get_tensor(TN_MM_AUDIO_MLP % (1, "bias"))
            model.mm_3_w = get_tensor(TN_MM_AUDIO_MLP % (3, "weight"))
            model.mm_3_b = get_tensor(TN_MM_AUDIO_MLP % (3, "bias"))
            for il, layer in enumerate(model.layers):
                def t(fmt: str, suffix: str) -> Optional[Tensor]:
                    return get_tensor(fmt % (prefix, il, suffix))
                layer.ff_norm_w = t(TN_FFN_NORM, "weight")
                layer.ff_norm_b = t(TN_FFN_NORM, "bias")
                layer.ff_norm_1_w = t(TN_FFN_NORM_1, "weight")
                layer.ff_norm_1_b = t(TN_FFN_NORM_1, "bias")
                layer.ff_up_1_w = t(TN_FFN_UP_1, "weight")
                layer.ff_up_1_b = t(TN_FFN_UP_1, "bias")
                layer.ff_down_1_w = t(TN_FFN_DOWN_1, "weight")
                layer.ff_down_1_b = t(TN_FFN_DOWN_1, "bias")
                layer.pos_bias_u = get_tensor(TN_POS_BIAS_U % (prefix, il))
                layer.pos_bias_v = get_tensor(TN_POS_BIAS_V % (prefix, il))
                layer.norm_conv_w = t(TN_NORM_CONV, "weight")
                layer.norm_conv_b = t(TN_NORM_CONV, "bias")
                layer.linear_pos_w = t(TN_LINEAR_POS, "weight")
                layer.conv_norm_w = t(TN_CONV_NORM, "weight")
                layer.conv_norm_b = t(TN_CONV_NORM, "bias")
                layer.conv_dw_w = t(TN_CONV_DW, "weight")
                layer.conv_dw_b = t(TN_CONV_DW, "bias")
                layer.conv_pw1_w = t(TN_CONV_PW1, "weight")
                layer.conv_pw1_b = t(TN_CONV_PW1, "bias")
                layer.conv_pw2_w = t(TN_CONV_PW2, "weight")
                layer.conv_pw2_b = t(TN_CONV_PW2, "bias")
        elif model.proj_type == "gemma4ua":
            model.mm_input_proj_w = get_tensor(TN_A_MM_INP_PROJ % "weight")
        elif model.proj_type == "youtuvl":
            model.mm_input_norm_w = get_tensor(TN_MM_INP_NORM)       # merger.ln_q (RMS norm)
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))  # merger.mlp.0
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"))
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))  # merger.mlp.2
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"))
        elif model.proj_type in ("dots_ocr", "dots3note_v"):
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"))
            model.mm_2_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_2_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"))
            model.mm_input_norm_w = get_tensor(TN_MM_INP_NORM)
            model.mm_input_norm_b = get_tensor(TN_MM_INP_NORM_B)
            # post_trunk_norm: after all ViT blocks, before the merger
            model.post_ln_w = get_tensor(TN_MM_POST_NORM % "weight")
        elif model.proj_type == "mimovl":
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"), False)
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"), False)
        elif model.proj_type in ("deepseekocr", "deepseekocr2"):
            model.pos_embed = get_tensor(TN_SAM_POS_EMBD % "weight")
            model.patch_embed_proj_w = get_tensor(TN_SAM_PATCH_EMBD % "weight")
            model.patch_embed_proj_b = get_tensor(TN_SAM_PATCH_EMBD % "bias")
            if hp.sam_n_layer > len(self.header.tensors):
                self.fail(f"load_tensors: unable to find tensor {TN_SAM_ATTN_QKV % (len(self.header.tensors), 'weight')}")
            model.sam_layers = [ClipLayer() for _ in range(hp.sam_n_layer)]
            for il, layer in enumerate(model.sam_layers):
                layer.qkv_w = get_tensor(TN_SAM_ATTN_QKV % (il, "weight"))
                layer.qkv_b = get_tensor(TN_SAM_ATTN_QKV % (il, "bias"))
                layer.o_w = get_tensor(TN_SAM_ATTN_OUT % (il, "weight"))
                layer.o_b = get_tensor(TN_SAM_ATTN_OUT % (il, "bias"))
                layer.ln_1_w = get_tensor(TN_SAM_PRE_NORM % (il, "weight"))
                layer.ln_1_b = get_tensor(TN_SAM_PRE_NORM % (il, "bias"))
                layer.ln_2_w = get_tensor(TN_SAM_POST_NORM % (il, "weight"))
                layer.ln_2_b = get_tensor(TN_SAM_POST_NORM % (il, "bias"))
                layer.rel_pos_h = get_tensor(TN_SAM_ATTN_POS_H % (il, "weight"))
                layer.rel_pos_w = get_tensor(TN_SAM_ATTN_POS_W % (il, "weight"))
                layer.ff_up_w = get_tensor(TN_SAM_FFN_UP % (il, "weight"))
                layer.ff_up_b = get_tensor(TN_SAM_FFN_UP % (il, "bias"))
                layer.ff_down_w = get_tensor(TN_SAM_FFN_DOWN % (il, "weight"))
                layer.ff_down_b = get_tensor(TN_SAM_FFN_DOWN % (il, "bias"))
            model.neck_0_w = get_tensor(TN_SAM_NECK % (0, "weight"))
            model.neck_1_b = get_tensor(TN_SAM_NECK % (1, "bias"))
            model.neck_1_w = get_tensor(TN_SAM_NECK % (1, "weight"))
            model.neck_2_w = get_tensor(TN_SAM_NECK % (2, "weight"))
            model.neck_3_b = get_tensor(TN_SAM_NECK % (3, "bias"))
            model.neck_3_w = get_tensor(TN_SAM_NECK % (3, "weight"))
            model.net_2 = get_tensor(TN_SAM_NET % (2, "weight"))
            model.net_3 = get_tensor(TN_SAM_NET % (3, "weight"))
            model.image_newline = get_tensor(TN_IMAGE_NEWLINE, False)
            model.view_seperator = get_tensor(TN_IMAGE_SEPERATOR)
            model.mm_fc_w = get_tensor(TN_MM_PROJECTOR % "weight")
            model.mm_fc_b = get_tensor(TN_MM_PROJECTOR % "bias")
            model.resample_query_768 = get_tensor(TN_RESMPL_QUERY % (768, "weight"), False)
            model.resample_query_1024 = get_tensor(TN_RESMPL_QUERY % (1024, "weight"), False)
        elif model.proj_type == "granite4_vision":
            model.image_newline = get_tensor(TN_IMAGE_NEWLINE)   # at the top level
            # the layerwise and spatial projectors, each one QFormer layer
            model.qf_proj_blocks = [QfBlock() for _ in hp.feature_layers]
            for bid, b in enumerate(model.qf_proj_blocks):
                b.qf_proj_img_pos = get_tensor(TN_MULTI_PROJ_IMG_POS % bid)
                b.qf_proj_query = get_tensor(TN_MULTI_PROJ_QUERY % (prefix, bid))
                b.qf_proj_linear_w = get_tensor(TN_MULTI_PROJ_LINEAR % (prefix, bid, "weight"))
                b.qf_proj_linear_b = get_tensor(TN_MULTI_PROJ_LINEAR % (prefix, bid, "bias"))
                b.qf_proj_norm_w = get_tensor(TN_MULTI_PROJ_NORM % (prefix, bid, "weight"))
                b.qf_proj_norm_b = get_tensor(TN_MULTI_PROJ_NORM % (prefix, bid, "bias"))
                b.qf_proj_post_norm_w = get_tensor(TN_MULTI_PROJ_POST_NORM % (prefix, bid, "weight"))
                b.qf_proj_post_norm_b = get_tensor(TN_MULTI_PROJ_POST_NORM % (prefix, bid, "bias"))
                pl = ClipLayer()
                b.qf_proj_layers = [pl]
                for attr, fmt in (("q", TN_QF_SELF_ATTN_Q), ("k", TN_QF_SELF_ATTN_K), ("v", TN_QF_SELF_ATTN_V),
                                  ("o", TN_QF_SELF_ATTN_O), ("ln_1", TN_QF_SELF_ATTN_N),
                                  ("cross_attn_q", TN_QF_CROSS_ATTN_Q), ("cross_attn_k", TN_QF_CROSS_ATTN_K),
                                  ("cross_attn_v", TN_QF_CROSS_ATTN_V), ("cross_attn_o", TN_QF_CROSS_ATTN_O),
                                  ("cross_attn_norm", TN_QF_CROSS_ATTN_N), ("ff_up", TN_QF_FFN_UP),
                                  ("ff_down", TN_QF_FFN_DOWN), ("ln_2", TN_QF_FFN_NORM)):
                    setattr(pl, f"{attr}_w", get_tensor(fmt % (prefix, bid, "weight")))
                    setattr(pl, f"{attr}_b", get_tensor(fmt % (prefix, bid, "bias")))
        elif model.proj_type == "hunyuanvl":
            # proj.0 -> mm.0 (conv1), proj.2 -> mm.2 (conv2), mlp -> mm.model.fc (linear)
            model.mm_0_w = get_tensor(TN_LLAVA_PROJ % (0, "weight"))
            model.mm_0_b = get_tensor(TN_LLAVA_PROJ % (0, "bias"))
            model.mm_1_w = get_tensor(TN_LLAVA_PROJ % (2, "weight"))
            model.mm_1_b = get_tensor(TN_LLAVA_PROJ % (2, "bias"))
            model.mm_model_proj = get_tensor(TN_MM_PROJECTOR % "weight")
            model.mm_model_proj_b = get_tensor(TN_MM_PROJECTOR % "bias")
            model.mm_pre_norm_w = get_tensor(TN_MM_PRE_NORM % "weight")
            model.mm_post_norm_w = get_tensor(TN_MM_POST_NORM % "weight")
            model.mm_img_begin = get_tensor(TN_MM_IMG_BEGIN)
            model.mm_img_end = get_tensor(TN_MM_IMG_END)
            model.image_newline = get_tensor(TN_IMAGE_NEWLINE)
            model.view_seperator = get_tensor(TN_IMAGE_SEPERATOR, False)
        elif model.proj_type == "qwen3tts_spkenc":
            model.conv1d_1_w = get_tensor(TN_CONV1D % (0, "weight"))    # the stem TDNN (block 0)
            model.conv1d_1_b = get_tensor(TN_CONV1D % (0, "bias"))
            # the SE-Res2Net blocks: GGUF bid 1..3, one per hparams.n_layer
            model.layers = [ClipLayer() for _ in range(hp.n_layer)]
            for il, layer in enumerate(model.layers):
                bid = il + 1
                layer.conv_pw1_w = get_tensor(TN_CONV_PW1 % (prefix, bid, "weight"))
                layer.conv_pw1_b = get_tensor(TN_CONV_PW1 % (prefix, bid, "bias"))
                layer.conv_pw2_w = get_tensor(TN_CONV_PW2 % (prefix, bid, "weight"))
                layer.conv_pw2_b = get_tensor(TN_CONV_PW2 % (prefix, bid, "bias"))
                layer.se_conv1_w = get_tensor(TN_A_SE_CONV1 % (bid, "weight"))
                layer.se_conv1_b = get_tensor(TN_A_SE_CONV1 % (bid, "bias"))
                layer.se_conv2_w = get_tensor(TN_A_SE_CONV2 % (bid, "weight"))
                layer.se_conv2_b = get_tensor(TN_A_SE_CONV2 % (bid, "bias"))
                for xid in range(7):
                    layer.res2_conv_w.append(get_tensor(TN_A_CONV_RES2 % (bid, xid, "weight")))
                    layer.res2_conv_b.append(get_tensor(TN_A_CONV_RES2 % (bid, xid, "bias")))
            model.conv_out_w = get_tensor(TN_CONV_OUT % "weight")      # multi-layer feature aggregation
            model.conv_out_b = get_tensor(TN_CONV_OUT % "bias")
            model.spk_asp_attn_w = get_tensor(TN_A_ASP_ATTN % "weight")  # attentive statistics pooling
            model.spk_asp_attn_b = get_tensor(TN_A_ASP_ATTN % "bias")
            model.spk_asp_tdnn_w = get_tensor(TN_A_ASP_TDNN % "weight")
            model.spk_asp_tdnn_b = get_tensor(TN_A_ASP_TDNN % "bias")
            model.mm_fc_w = get_tensor(TN_MM_AUDIO_FC % "weight")      # the speaker embedding projection
            model.mm_fc_b = get_tensor(TN_MM_AUDIO_FC % "bias")
        elif model.proj_type == "qwen3tts_gen":
            # the code predictor; proj_in is absent when the talker and the predictor share the hidden size
            model.gen_code_proj_in_w = get_tensor(TN_A_GEN_CODE_PROJ_IN % "weight", False)
            model.gen_code_proj_in_b = get_tensor(TN_A_GEN_CODE_PROJ_IN % "bias", False)
            model.gen_code_embd_w = get_tensor(TN_A_GEN_CODE_EMBD % "weight")
            model.gen_code_head_w = get_tensor(TN_A_GEN_CODE_HEAD % "weight")
            model.gen_code_out_embd_w = get_tensor(TN_A_GEN_CODE_OUT_EMBD % "weight")
            model.gen_code_norm_w = get_tensor(TN_A_GEN_CODE_NORM % "weight")
            # code2wav (RVQ codes to PCM) in the same context, in clip.cpp's load order
            names = [TN_A_GEN_WAV_QUANT_FIRST_IN % "weight", TN_A_GEN_WAV_QUANT_FIRST_OUT % "weight",
                     TN_A_GEN_WAV_QUANT_FIRST_CB % "weight", TN_A_GEN_WAV_QUANT_REST_IN % "weight",
                     TN_A_GEN_WAV_QUANT_REST_OUT % "weight", TN_A_GEN_WAV_QUANT_REST_CB % "weight",
                     TN_A_GEN_WAV_PRE_CONV % "weight", TN_A_GEN_WAV_PRE_CONV % "bias",
                     TN_A_GEN_WAV_TFM_IN_PROJ % "weight", TN_A_GEN_WAV_TFM_IN_PROJ % "bias",
                     TN_A_GEN_WAV_TFM_OUT_PROJ % "weight", TN_A_GEN_WAV_TFM_OUT_PROJ % "bias",
                     TN_A_GEN_WAV_TFM_OUT_NORM % "weight"]
            tfm = "a.gen.wav.tfm"
            for il in range(hp.wav_tfm_n_layer):
                names += [fmt % (tfm, il, "weight") for fmt in (TN_ATTN_Q, TN_ATTN_K, TN_ATTN_V, TN_ATTN_OUTPUT, TN_LN_1,
                                                                 TN_LN_2, TN_LS_1, TN_LS_2, TN_FFN_GATE, TN_FFN_UP,
                                                                 TN_FFN_DOWN)]
            for il in range(hp.wav_upsample_n_block):
                for fmt in (TN_A_GEN_WAV_UP_CONV, TN_A_GEN_WAV_UP_DWCONV, TN_A_GEN_WAV_UP_NORM, TN_A_GEN_WAV_UP_PW1,
                            TN_A_GEN_WAV_UP_PW2):
                    names += [fmt % (il, "weight"), fmt % (il, "bias")]
                names.append(TN_A_GEN_WAV_UP_GAMMA % il)
            names += [TN_A_GEN_WAV_DAC_ENTRY % "weight", TN_A_GEN_WAV_DAC_ENTRY % "bias"]
            for il in range(hp.wav_dac_n_block):
                names += [TN_A_GEN_WAV_DAC_SNAKE % (il, "alpha"), TN_A_GEN_WAV_DAC_SNAKE % (il, "beta"),
                          TN_A_GEN_WAV_DAC_CONV % (il, "weight"), TN_A_GEN_WAV_DAC_CONV % (il, "bias")]
                for ir in range(hp.wav_dac_n_res):
                    names += [TN_A_GEN_WAV_DAC_RES_ACT1 % (il, ir, "alpha"), TN_A_GEN_WAV_DAC_RES_ACT1 % (il, ir, "beta"),
                              TN_A_GEN_WAV_DAC_RES_CONV1 % (il, ir, "weight"), TN_A_GEN_WAV_DAC_RES_CONV1 % (il, ir, "bias"),
                              TN_A_GEN_WAV_DAC_RES_ACT2 % (il, ir, "alpha"), TN_A_GEN_WAV_DAC_RES_ACT2 % (il, ir, "beta"),
                              TN_A_GEN_WAV_DAC_RES_CONV2 % (il, ir, "weight"), TN_A_GEN_WAV_DAC_RES_CONV2 % (il, ir, "bias")]
            names += [TN_A_GEN_WAV_DAC_POST_SNAKE % "alpha", TN_A_GEN_WAV_DAC_POST_SNAKE % "beta",
                      TN_A_GEN_WAV_DAC_POST_CONV % "weight", TN_A_GEN_WAV_DAC_POST_CONV % "bias"]
            model.c2w = {name: get_tensor(name) for name in names}
        elif model.proj_type == "pockettts_spkenc":
            model.seanet = load_seanet(False)
            model.downsample_w = get_tensor(TN_A_DOWNSAMPLE_CONV % "weight")
            model.spk_proj_w = get_tensor(TN_A_SPEAKER_PROJ % "weight")
        elif model.proj_type == "pockettts_gen":
            names = [fmt % suffix for fmt in (TN_A_GEN_FLOW_INPUT_PROJ, TN_A_GEN_FLOW_COND_EMBD, TN_A_GEN_FLOW_FINAL_ADA,
                                              TN_A_GEN_FLOW_FINAL_PROJ) for suffix in ("weight", "bias")]
            for i in range(2):
                names += [TN_A_GEN_FLOW_TIME_FREQS % i, TN_A_GEN_FLOW_TIME_UP % (i, "weight"), TN_A_GEN_FLOW_TIME_UP % (i, "bias"),
                          TN_A_GEN_FLOW_TIME_DOWN % (i, "weight"), TN_A_GEN_FLOW_TIME_DOWN % (i, "bias"),
                          TN_A_GEN_FLOW_TIME_NORM % i]
            model.flow = {name: get_tensor(name) for name in names}
            # one AdaLN block per flow depth, the count known only from the tensors
            il = 0
            while (probe := get_tensor(TN_A_GEN_FLOW_BLK_NORM % (il, "weight"), False)) is not None:
                model.flow[probe.name] = probe
                for name in (TN_A_GEN_FLOW_BLK_NORM % (il, "bias"), TN_A_GEN_FLOW_BLK_UP % (il, "weight"),
                             TN_A_GEN_FLOW_BLK_UP % (il, "bias"), TN_A_GEN_FLOW_BLK_DOWN % (il, "weight"),
                             TN_A_GEN_FLOW_BLK_DOWN % (il, "bias"), TN_A_GEN_FLOW_BLK_ADA % (il, "weight"),
                             TN_A_GEN_FLOW_BLK_ADA % (il, "bias")):
                    model.flow[name] = get_tensor(name)
                il += 1
            model.gen_out_eos_w = get_tensor(TN_A_GEN_OUT_EOS % "weight")
            model.gen_out_eos_b = get_tensor(TN_A_GEN_OUT_EOS % "bias")
            model.gen_input_lin_w = get_tensor(TN_A_GEN_INPUT_LINEAR % "weight")
            model.gen_emb_mean = get_tensor(TN_A_GEN_EMB_MEAN)
            model.gen_emb_std = get_tensor(TN_A_GEN_EMB_STD)
            # the mimi decoder
            model.gen_quant_out_w = get_tensor(TN_A_GEN_WAV_QUANT_OUT % "weight")
            model.gen_upsample_w = get_tensor(TN_A_GEN_WAV_UPSAMPLE % "weight")
            model.seanet = load_seanet(True)
            model.gen_tfm_layers = [ClipLayer() for _ in range(hp.n_layer)]
            for il, layer in enumerate(model.gen_tfm_layers):
                def g(fmt: str, suffix: str) -> Tensor:
                    return get_tensor(fmt % ("a.gen.wav.tfm", il, suffix))
                layer.ln_1_w, layer.ln_1_b = g(TN_LN_1, "weight"), g(TN_LN_1, "bias")
                layer.q_w, layer.k_w, layer.v_w = g(TN_ATTN_Q, "weight"), g(TN_ATTN_K, "weight"), g(TN_ATTN_V, "weight")
                layer.o_w = g(TN_ATTN_OUTPUT, "weight")
                layer.ls_1_w = g(TN_LS_1, "weight")
                layer.ln_2_w, layer.ln_2_b = g(TN_LN_2, "weight"), g(TN_LN_2, "bias")
                layer.ff_up_w, layer.ff_down_w = g(TN_FFN_UP, "weight"), g(TN_FFN_DOWN, "weight")
                layer.ls_2_w = g(TN_LS_2, "weight")
        elif model.proj_type == "llama4":
            model.mm_model_proj = get_tensor(TN_MM_PROJECTOR % "weight")
            model.mm_model_mlp_1_w = get_tensor(TN_MVLM_PROJ_MLP % (1, "weight"))
            model.mm_model_mlp_2_w = get_tensor(TN_MVLM_PROJ_MLP % (2, "weight"))
        # ggml_backend_alloc_ctx_tensors_from_buft(ctx_data, buft): the weights in one buffer, in load
        # order (graph_optimize passes compare their byte ranges)
        ctx.weights = alloc_ctx_tensors(ctx.weights.buft, list(loaded.values()), "weights")

    def load_clamp_info(self, model: ClipModel, loaded: dict[str, Tensor]) -> None:
        """Gemma4ClippableLinear: every weight loaded so far is clamped, by its scalars or +-FLT_MAX."""
        for name in loaded:
            if name.endswith(".weight"):
                for suffix in (".input_max", ".input_min", ".output_max", ".output_min"):
                    self.check_scalar(name.replace(".weight", suffix))
                model.clamped.add(name)

    def check_vector(self, name: str) -> int:
        """get_vector's checks of a tensor it reads from the file, when there is one: its f32 values
        (none when absent)."""
        info = self.header.tensor(name)
        if info is None:
            return 0
        if info.type != ggml.T.F32:
            self.fail(f"load_tensors: {name} must be f32, was {ggml.type_name(info.type)}")
        if info.nbytes == 0:
            self.fail(f"load_tensors: tensor {name} is empty")
        return info.nbytes // 4

    def check_scalar(self, name: str) -> None:
        """get_scalar's checks of a scalar tensor it reads from the file, when there is one."""
        self.check_vector(name)
        info = self.header.tensor(name)
        if info is not None and info.n_elements != 1:
            self.fail(f"load_tensors: expected scalar tensor '{name}' but got {info.n_elements} elements")


# the projector types whose layers may carry ffn_up/ffn_down swapped (load_tensors' is_ffn_swapped)
SWAPPED_FFN_TYPES = frozenset({"mlp", "mlp_norm", "ldp", "ldpv2", "qwen2vl_merger", "qwen2.5vl_merger", "exaone4_5",
                               "adapter", "gemma3", "idefics3", "resampler", "minicpmv4_6"})


def clip_n_mmproj_embd(model: ClipModel) -> int:
    """clip_n_mmproj_embd: the text model's embedding size the projector's output must match."""
    p = model.proj_type
    if p == "ldp":
        return model.mm_model_block_1_block_2_1_b.ne[0]
    if p == "ldpv2":
        return model.mm_model_peg_0_b.ne[0]
    if p == "muse-glimmer":
        return model.mm_2_w.ne[1]
    if p in ("mlp", "phi4"):
        return _read(model.mm_2_w, "mm.2.weight").ne[1]
    if p == "mlp_norm":
        return _read(model.mm_3_b, "mm.3.bias").ne[0]
    if p == "resampler":
        return model.mm_model_proj.ne[0]
    if p == "adapter":
        return model.mm_model_mlp_3_w.ne[1]
    if p == "minicpmv4_6":
        return model.mm_ffn_down_w.ne[1]
    if p in ("janus_pro", "ling3vl"):
        return model.mm_1_b.ne[0]
    if p == "step3vl":
        return model.mm_model_proj.ne[1]
    if p in ("qwen2vl_merger", "qwen2.5vl_merger", "youtuvl", "exaone4_5"):
        return model.mm_1_b.ne[0]
    if p == "qwen3vl_merger":
        return model.mm_1_b.ne[0] * (1 + model.n_deepstack_layers)   # main path + deepstack paths
    if p in ("gemma3", "gemma3nv"):
        return model.mm_input_proj_w.ne[0]
    if p in ("gemma4v", "gemma4uv", "gemma4a", "gemma4ua"):
        if model.mm_input_proj_w is None:     # gemma4a loads it as optional, this reads it regardless
            raise GGMLAbort("llama.cpp would crash sizing the projector's output (clip_n_mmproj_embd): it has no "
                            "mm.a.input_projection.weight (a null tensor is read)")
        return model.mm_input_proj_w.ne[1]
    if p in ("ultravox", "voxtral", "musicflamingo", "qwen3a", "glma", "dots3note_a", "mimo_audio"):
        return model.mm_2_w.ne[1]
    if p == "granite_speech":
        return model.qf_proj_blocks[0].qf_proj_linear_w.ne[1]
    if p == "parakeet":
        if model.mm_1_w is None:
            raise GGMLAbort("llama.cpp would crash sizing the projector's output (clip_n_mmproj_embd): it has no "
                            "mm.a.mlp.2.weight (a null tensor is read)")
        return model.mm_1_w.ne[1]
    if p == "lfm2a":
        if model.position_embeddings is None:
            raise GGMLAbort("llama.cpp would crash sizing the projector's output (clip_n_mmproj_embd): it has no "
                            "a.position_embd.weight (a null tensor is read)")
        return model.position_embeddings.ne[0]
    if p == "meralion":
        return model.mm_3_w.ne[1]     # out_proj's output
    if p == "qwen2a":
        return model.mm_fc_w.ne[1]
    if p in ("pixtral", "lightonocr", "lfm2", "kimivl", "paddleocr", "dots_ocr", "dots3note_v", "kimik25", "deepseek4v",
             "yasa2"):
        return model.mm_2_w.ne[1]
    if p in ("idefics3", "deepseekocr", "deepseekocr2"):
        return model.mm_fc_w.ne[1]
    if p in ("internvl", "nemotron_v2_vl"):
        return model.mm_3_w.ne[1]
    if p == "cogvlm":
        return model.mm_4h_to_h_w.ne[1]
    if p == "minimax_m3":
        return model.mm_merger_fc2_b.ne[0]
    if p == "mimovl":
        return model.mm_1_w.ne[1]
    if p == "granite4_vision":
        return len(model.qf_proj_blocks) * model.hparams.projection_dim
    if p in ("llama4", "hunyuanvl"):
        return model.mm_model_proj.ne[1]
    if p in ("glm4v", "glm5v"):
        return model.mm_ffn_down_w.ne[1]
    if p == "qwen3tts_spkenc":
        return model.mm_fc_w.ne[2]
    if p == "qwen3tts_gen":
        return model.gen_code_out_embd_w.ne[0]
    if p == "pockettts_spkenc":
        return model.spk_proj_w.ne[1]
    if p == "pockettts_gen":
        return model.gen_input_lin_w.ne[1]
    raise AssertionError(f"clip_n_mmproj_embd: {p} is in GRAPH_BUILDERS but not here")


def _read(t: Optional[Tensor], name: str) -> Tensor:
    """A tensor clip.cpp reads without checking (LLaVA's optional mm.N): a file without it crashes llama.cpp."""
    if t is None:
        raise GGMLAbort(f"llama.cpp would crash loading the multimodal projector: it has no {name} (a null tensor "
                        f"is read)")
    return t


@dataclass
class BuildVitOpts:
    """build_vit_opts (clip-graph.h)"""
    attn_mask: Optional[Tensor] = None
    attn_mask_layers: list[Tensor] = field(default_factory=list)   # one per layer
    callback_layer_out: Optional[Callable[[Tensor, int], None]] = None
    skip_post_ln: bool = False


# --- clip_graph ------------------------------------------------------------------------------------

def set_name(t: Tensor, name: str) -> None:
    t.name = ggml._fmt(name)


class ClipGraph:
    """clip_graph: the image being encoded, the model's dimensions, and the shared builders. Each
    projector's graph is a subclass in planner/mtmd/models overriding build() (and build_mm where
    its C++ twin does)."""

    def __init__(self, ctx: ClipCtx, nx: int, ny: int, n_batch: int = 1):
        self.ctx = ctx
        self.model = model = ctx.model
        self.hparams = hp = model.hparams
        self.proj_type = model.proj_type
        self.nx, self.ny = nx, ny
        self.patch_size = hp.patch_size
        self.n_patches_x = _cdiv(nx, self.patch_size)
        self.n_patches_y = _cdiv(ny, self.patch_size)
        self.n_patches = self.n_patches_x * self.n_patches_y
        self.n_embd = hp.n_embd
        self.n_head = hp.n_head
        self.n_head_kv = hp.n_head_kv
        self.d_head = hp.n_embd_head if hp.n_embd_head > 0 else (_cdiv(self.n_embd, self.n_head) if self.n_head > 0 else 0)
        self.n_layer = hp.n_layer
        self.n_mmproj_embd = clip_n_mmproj_embd(model)
        self.eps = hp.eps
        self.kq_scale = 1.0 / math.sqrt(self.d_head) if self.d_head > 0 else 0.0
        self.flash_attn_type = ctx.flash_attn_type
        self.n_batch = n_batch
        self.gf = ggml.Cgraph()

    def build(self) -> ggml.Cgraph:
        raise NotImplementedError

    def build_mm(self, w: Tensor, x: Tensor) -> Tensor:
        return ggml.mul_mat(w, x)

    def cb(self, cur: Tensor, name: str, il: int) -> None:
        set_name(cur, f"{name}-{il}" if il >= 0 else name)

    def expand(self, t: Tensor) -> None:
        ggml.build_forward_expand(self.gf, t)

    def abort(self, what: str) -> GGMLAbort:
        return GGMLAbort(f"llama.cpp would abort building the projector's warm-up graph ({what})")

    def resize_position_embeddings(self, mode: int = ggml.SCALE_MODE_BILINEAR | ggml.SCALE_FLAG_ANTIALIAS) -> Tensor:
        """siglip2 naflex: the learned position embeddings interpolated to the image's patch grid."""
        pos_embd = self.model.position_embeddings
        if pos_embd is None:
            raise self.abort("clip.cpp resize_position_embeddings: no position embeddings")
        height, width = _cdiv(self.ny, self.patch_size), _cdiv(self.nx, self.patch_size)
        n_per_side = int(math.sqrt(pos_embd.ne[1]))
        if height == n_per_side and width == n_per_side:
            return pos_embd
        n_embd = self.n_embd
        pos_embd = ggml.reshape(pos_embd, n_embd, n_per_side, n_per_side)
        pos_embd = ggml.permute(pos_embd, 2, 0, 1, 3)
        pos_embd = ggml.interpolate(pos_embd, width, height, n_embd, 1, mode)
        pos_embd = ggml.permute(pos_embd, 1, 2, 0, 3)
        return ggml.cont(pos_embd, n_embd, width * height)

    def build_rope_2d(self, cur: Tensor, pos_a: Tensor, pos_b: Tensor, freq_base: float, interleave_freq: bool) -> Tensor:
        """clip_graph::build_rope_2d: two normal ropes, the first half of each head's dimensions at
        pos_a, the second at pos_b (ggml_rope_set_offset; only op params differ with interleave_freq)."""
        n_dim = cur.ne[0]
        cur = ggml.rope_ext(cur, pos_a, None, n_dim // 2, 0, 0)
        return ggml.rope_ext(cur, pos_b, None, n_dim // 2, 0, 0)

    def build_patch_merge_permute(self, cur: Tensor, scale_factor: int) -> Tensor:
        """pixel_shuffle / pixel_unshuffle / patch_merger (Kimi-VL): scale_factor^2 neighbouring
        patches side by side in the rows, the grid padded to a multiple of scale_factor."""
        if scale_factor <= 1:
            raise self.abort("clip.cpp build_patch_merge_permute GGML_ASSERT(scale_factor > 1)")
        n_embd = cur.ne[0]
        width, height = _cdiv(self.nx, self.patch_size), _cdiv(self.ny, self.patch_size)
        pad_width = _align(width, scale_factor) - width
        pad_height = _align(height, scale_factor) - height
        cur = ggml.reshape(cur, n_embd, width, height)
        if pad_width or pad_height:
            cur = ggml.pad(cur, 0, pad_width, pad_height, 0)
            width += pad_width
            height += pad_height
        cur = ggml.reshape(cur, n_embd * scale_factor, width // scale_factor, height)
        cur = ggml.permute(cur, 0, 2, 1, 3)
        cur = ggml.cont(cur, n_embd * scale_factor * scale_factor, height // scale_factor, width // scale_factor)
        cur = ggml.permute(cur, 0, 2, 1, 3)
        cur = ggml.cont(cur, cur.ne[0], cur.ne[1] * cur.ne[2])
        self.cb(cur, "pixel_shuffle", -1)
        return cur

    def build_stack(self, cur: Tensor, stack_factor: int, n_embed: int) -> Tensor:
        """StackAudioFrames (Ultravox): stack_factor frames per row, the last row zero-padded (to
        GGML_PAD's length; the rows are the whole ones of it)."""
        if stack_factor <= 1:
            return cur
        total = cur.nelements()
        stride = n_embed * stack_factor
        # GGML_PAD's bit mask: a multiple of stride only for a power of two (MERaLiON's 15 pads more)
        padded = (total + stride - 1) & ~(stride - 1)
        if padded - total > 0:
            cur = ggml.view(cur, (total,), (), 0)
            cur = ggml.pad(cur, padded - total, 0, 0, 0)
        return ggml.view(cur, (stride, padded // stride), (ggml.row_size(cur.type, stride),), 0)

    def build_vit(self, inp: Tensor, n_pos: int, norm_t: int, ffn_t: int, learned_pos_embd: Optional[Tensor],
                  add_pos: Optional[Callable[[Tensor, ClipLayer], Tensor]],
                  opts: Optional[BuildVitOpts] = None) -> Tensor:
        """clip_graph::build_vit: the standard ViT layers over [n_embd, n_pos, B]."""
        opts = opts or BuildVitOpts()
        model, n_embd, eps = self.model, self.n_embd, self.eps
        d_head, n_head, n_head_kv = self.d_head, self.n_head, self.n_head_kv
        B = inp.ne[2]
        if learned_pos_embd is not None:
            inp = ggml.add(inp, learned_pos_embd)
            self.cb(inp, "pos_embed", -1)
        inp = ggml.reshape(inp, n_embd, n_pos * B)
        inpL = inp
        if model.pre_ln_w is not None:
            inpL = self.build_norm(inpL, model.pre_ln_w, model.pre_ln_b, norm_t, eps, -1)
            self.cb(inpL, "pre_ln", -1)
        for il in range(self.n_layer):
            layer = model.layers[il]
            cur = inpL
            attn_mask = opts.attn_mask_layers[il] if len(opts.attn_mask_layers) > il else opts.attn_mask
            cur = self.build_norm(cur, layer.ln_1_w, layer.ln_1_b, norm_t, eps, il)
            self.cb(cur, "layer_inp_normed", il)
            if layer.qkv_w is not None:
                cur = self.build_mm(layer.qkv_w, cur)
                if layer.qkv_b is not None:
                    cur = ggml.add(cur, layer.qkv_b)
                row = ggml.row_size(cur.type, d_head)
                nb = (row, cur.nb[1], cur.nb[1] * n_pos)
                Qcur = ggml.view(cur, (d_head, n_head, n_pos, B), nb, 0)
                Kcur = ggml.view(cur, (d_head, n_head, n_pos, B), nb, ggml.row_size(cur.type, n_head * d_head))
                Vcur = ggml.view(cur, (d_head, n_head, n_pos, B), nb, ggml.row_size(cur.type, 2 * n_head * d_head))
                if layer.q_norm is not None:
                    Qcur = self.build_norm(Qcur, layer.q_norm, None, norm_t, eps, il)
                    self.cb(Qcur, "Qcur_norm", il)
                if layer.k_norm is not None:
                    Kcur = self.build_norm(Kcur, layer.k_norm, None, norm_t, eps, il)
                    self.cb(Kcur, "Kcur_norm", il)
            else:
                Qcur = self.build_mm(layer.q_w, cur)
                if layer.q_b is not None:
                    Qcur = ggml.add(Qcur, layer.q_b)
                Kcur = self.build_mm(layer.k_w, cur)
                if layer.k_b is not None:
                    Kcur = ggml.add(Kcur, layer.k_b)
                Vcur = self.build_mm(layer.v_w, cur)
                if layer.v_b is not None:
                    Vcur = ggml.add(Vcur, layer.v_b)
                # a norm of d_head values applies per head, after the reshape
                norm_per_head = layer.q_norm is not None and layer.q_norm.ne[0] == d_head
                if not norm_per_head:
                    if layer.q_norm is not None:
                        Qcur = self.build_norm(Qcur, layer.q_norm, None, norm_t, eps, il)
                        self.cb(Qcur, "Qcur_norm", il)
                    if layer.k_norm is not None:
                        Kcur = self.build_norm(Kcur, layer.k_norm, None, norm_t, eps, il)
                        self.cb(Kcur, "Kcur_norm", il)
                Qcur = ggml.reshape(Qcur, d_head, n_head, n_pos, B)
                Kcur = ggml.reshape(Kcur, d_head, n_head_kv, n_pos, B)
                Vcur = ggml.reshape(Vcur, d_head, n_head_kv, n_pos, B)
                if norm_per_head:
                    if layer.q_norm is not None:
                        Qcur = self.build_norm(Qcur, layer.q_norm, None, norm_t, eps, il)
                        self.cb(Qcur, "Qcur_norm_per_head", il)
                    if layer.k_norm is not None:
                        Kcur = self.build_norm(Kcur, layer.k_norm, None, norm_t, eps, il)
                        self.cb(Kcur, "Kcur_norm_per_head", il)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)
            if add_pos is not None:
                Qcur = add_pos(Qcur, layer)
                Kcur = add_pos(Kcur, layer)
                self.cb(Qcur, "Qcur_pos", il)
                self.cb(Kcur, "Kcur_pos", il)
            if self.proj_type == "gemma4v":
                Vcur = ggml.rms_norm(Vcur, eps)
                self.cb(Vcur, "Vcur_normed", il)
            cur = self.build_attn(layer.o_w, layer.o_b, Qcur, Kcur, Vcur, attn_mask, self.kq_scale, il)
            self.cb(cur, "attn_out", il)
            if layer.ls_1_w is not None:
                cur = ggml.mul(cur, layer.ls_1_w)
                self.cb(cur, "attn_out_scaled", il)
            if layer.attn_post_norm_w is not None:
                cur = self.build_norm(cur, layer.attn_post_norm_w, None, norm_t, eps, il)
                self.cb(cur, "attn_post_normed", il)
            cur = ggml.add(cur, inpL)
            inpL = cur
            if opts.callback_layer_out is not None:
                opts.callback_layer_out(cur, il)
            self.cb(cur, "ffn_inp", il)
            cur = self.build_norm(cur, layer.ln_2_w, layer.ln_2_b, norm_t, eps, il)
            self.cb(cur, "ffn_inp_normed", il)
            if layer.ff_gate_exps_w is not None:
                cur = self.build_moe_ffn(cur, layer, ffn_t, il)
            else:
                cur = self.build_ffn(cur, layer.ff_up_w, layer.ff_up_b, layer.ff_gate_w, layer.ff_gate_b,
                                     layer.ff_down_w, layer.ff_down_b, ffn_t, il)
            self.cb(cur, "ffn_out", il)
            if layer.ff_post_norm_w is not None:
                cur = self.build_norm(cur, layer.ff_post_norm_w, None, norm_t, eps, il)
                self.cb(cur, "ffn_post_normed", il)
            if layer.ls_2_w is not None:
                cur = ggml.mul(cur, layer.ls_2_w)
                self.cb(cur, "ffn_out_scaled", il)
            cur = ggml.add(inpL, cur)
            self.cb(cur, "layer_out", il)
            if layer.ls_out_w is not None:
                cur = ggml.mul(cur, layer.ls_out_w)
                self.cb(cur, "layer_out_scaled", il)
            inpL = cur
        if model.audio_has_avgpool():
            cur = ggml.cont(ggml.transpose(inpL))
            cur = ggml.pool_1d(cur, ggml.POOL_AVG, 2, 2, 0)
            inpL = ggml.cont(ggml.transpose(cur))
        if model.post_ln_w is not None and not opts.skip_post_ln:
            inpL = self.build_norm(inpL, model.post_ln_w, model.post_ln_b, norm_t, eps, -1)
        if inpL.ne[1] % B:
            raise self.abort("clip.cpp build_vit GGML_ASSERT(inpL->ne[1] % B == 0)")
        return ggml.reshape(inpL, n_embd, inpL.ne[1] // B, B)

    def build_inp(self) -> Tensor:
        """The patches after the conv2d: [n_embd, n_patches]."""
        inp_raw = self.build_inp_raw()
        p = self.patch_size
        inp = ggml.conv_2d(self._weight(self.model.patch_embeddings_0, TN_PATCH_EMBD), inp_raw, p, p, 0, 0, 1, 1)
        inp = ggml.reshape(inp, self.n_patches, self.n_embd, self.n_batch)
        inp = ggml.cont(ggml.transpose(inp))
        if self.model.patch_bias is not None:
            inp = ggml.add(inp, self.model.patch_bias)
            self.cb(inp, "patch_bias", -1)
        return inp

    def build_inp_raw(self, channels: int = 3) -> Tensor:
        inp_raw = ggml.new_tensor(ggml.T.F32, self.nx, self.ny, channels, self.n_batch)
        set_name(inp_raw, "inp_raw")
        inp_raw.set_input()
        return inp_raw

    def _weight(self, t: Optional[Tensor], name: str) -> Tensor:
        """A tensor the C++ dereferences without checking: a projector without it crashes llama.cpp."""
        if t is None:
            raise GGMLAbort(f"llama.cpp would crash building the projector's graph: it has no {name} (a null "
                            f"tensor is read)")
        return t

    def build_norm(self, cur: Tensor, mw: Optional[Tensor], mb: Optional[Tensor], type_: int, norm_eps: float,
                   il: int) -> Tensor:
        cur = ggml.rms_norm(cur, norm_eps) if type_ == NORM_TYPE_RMS else ggml.norm(cur, norm_eps)
        if mw is not None:
            cur = ggml.mul(cur, mw)
            self.cb(cur, "norm_w", il)
        if mb is not None:
            cur = ggml.add(cur, mb)
            self.cb(cur, "norm_b", il)
        return cur

    def build_ffn(self, cur: Tensor, up: Optional[Tensor], up_b: Optional[Tensor], gate: Optional[Tensor],
                  gate_b: Optional[Tensor], down: Optional[Tensor], down_b: Optional[Tensor], type_op: int,
                  il: int) -> Tensor:
        tmp = self.build_mm(up, cur) if up is not None else cur
        self.cb(tmp, "ffn_up", il)
        if up_b is not None:
            tmp = ggml.add(tmp, up_b)
            self.cb(tmp, "ffn_up_b", il)
        if gate is not None:
            cur = self.build_mm(gate, cur)
            self.cb(cur, "ffn_gate", il)
            if gate_b is not None:
                cur = ggml.add(cur, gate_b)
                self.cb(cur, "ffn_gate_b", il)
        else:
            cur = tmp
        if type_op == FFN_RELU_SQR:
            cur = ggml.sqr(ggml.unary(cur, "RELU"))
            self.cb(cur, "ffn_relu_sqr", il)
        elif gate is not None:
            glu, name = FFN_GLU[type_op]
            if type_op == FFN_SILU and self.hparams.swiglu_clamp > 0.0:
                glu = ggml.GLU_SWIGLU_CLAMP
            cur = ggml.glu_split(cur, tmp, glu)
            self.cb(cur, name, il)
        else:
            op, name = FFN_UNARY[type_op]
            cur = ggml.unary(cur, op)
            self.cb(cur, name, il)
        if down is not None:
            cur = self.build_mm(down, cur)
        if down_b is not None:
            self.cb(cur, "ffn_down", il)
            cur = ggml.add(cur, down_b)
        return cur

    def build_moe_ffn(self, cur: Tensor, layer: ClipLayer, type_op: int, il: int) -> Tensor:
        """clip_graph::build_moe_ffn (dots3note's vision pyramid blocks): a sigmoid router in F32, the
        top n_expert_used (exp_probs_b only moves the choice), their weights normalized, SwiGLU experts."""
        n_tokens = cur.ne[1]
        n_expert = layer.ff_gate_exps_w.ne[2]
        n_expert_used = min(self.hparams.n_expert_used, n_expert)
        if n_expert_used <= 0:
            raise self.abort("clip.cpp build_moe_ffn GGML_ASSERT(n_expert_used > 0)")
        if type_op != FFN_SILU:
            raise self.abort("clip.cpp build_moe_ffn GGML_ASSERT(type_op == FFN_SILU)")
        probs = ggml.unary(self.build_mm(self._weight(layer.ff_gate_inp_w, "ffn_gate_inp"), cur), "SIGMOID")
        sel = ggml.add(probs, layer.ff_exp_probs_b) if layer.ff_exp_probs_b is not None else probs
        selected = ggml.top_k(sel, n_expert_used)
        weights = ggml.get_rows(ggml.reshape(probs, 1, n_expert, n_tokens), selected)
        weights = ggml.reshape(weights, n_expert_used, n_tokens)
        weights = ggml.div(weights, ggml.sum_rows(weights))
        weights = ggml.reshape(weights, 1, n_expert_used, n_tokens)
        cur = ggml.reshape(cur, cur.ne[0], 1, n_tokens)
        gate = ggml.mul_mat_id(layer.ff_gate_exps_w, cur, selected)
        up = ggml.mul_mat_id(self._weight(layer.ff_up_exps_w, "ffn_up_exps"), cur, selected)
        cur = ggml.mul(ggml.unary(gate, "SILU"), up)
        cur = ggml.mul_mat_id(self._weight(layer.ff_down_exps_w, "ffn_down_exps"), cur, selected)
        cur = ggml.mul(cur, weights)
        out = None
        for i in range(n_expert_used):      # the sum over the selected experts
            v = ggml.view(cur, (cur.ne[0], n_tokens), (cur.nb[2],), i * cur.nb[1])
            out = ggml.add(out, v) if out is not None else v
        if n_expert_used == 1:
            out = ggml.cont(out)
        self.cb(out, "ffn_moe_out", il)
        return out

    def build_attn(self, wo: Optional[Tensor], wo_b: Optional[Tensor], q_cur: Tensor, k_cur: Tensor, v_cur: Tensor,
                   kq_mask: Optional[Tensor], kq_scale: float, il: int, sinks: Optional[Tensor] = None) -> Tensor:
        # q, k, v enter the graph together (ggml_build_forward_order): fewer splits
        for t in (q_cur, k_cur, v_cur):
            self.expand(t)
        q = ggml.permute(q_cur, 0, 2, 1, 3)
        k = ggml.permute(k_cur, 0, 2, 1, 3)
        if self.flash_attn_type == FLASH_ATTN_ENABLED:
            v = ggml.permute(v_cur, 0, 2, 1, 3)
            k = ggml.cast(k, ggml.T.F16)
            v = ggml.cast(v, ggml.T.F16)
            if kq_mask is not None:
                kq_mask = ggml.cast(kq_mask, ggml.T.F16)
            cur = ggml.flash_attn_ext(q, k, v, kq_mask, kq_scale, 0.0, 0.0)
            if sinks is not None:
                cur.src.append(sinks)
            cur = ggml.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            v = ggml.cont(ggml.permute(v_cur, 1, 2, 0, 3))
            kq = ggml.mul_mat(k, q)
            kq = ggml.soft_max_ext(kq, kq_mask, kq_scale, 0.0)
            if sinks is not None:
                kq.src.append(sinks)
            kqv = ggml.mul_mat(v, kq)
            cur = ggml.permute(kqv, 0, 2, 1, 3)
            cur = ggml.cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        self.cb(cur, "kqv_out", il)
        if wo is not None:
            cur = self.build_mm(wo, cur)
        if wo_b is not None:
            cur = ggml.add(cur, wo_b)
        return cur


# build_ffn's activation per ffn_op_type: with a gate (GLU op, name), without one (unary op, name)
FFN_GLU = {FFN_SILU: (ggml.GLU_SWIGLU, "ffn_swiglu"), FFN_GELU: (ggml.GLU_GEGLU, "ffn_geglu"),
           FFN_GELU_ERF: (ggml.GLU_GEGLU_ERF, "ffn_geglu_erf"), FFN_GELU_QUICK: (ggml.GLU_GEGLU_QUICK, "ffn_geglu_quick")}
FFN_UNARY = {FFN_SILU: ("SILU", "ffn_silu"), FFN_GELU: ("GELU", "ffn_gelu"), FFN_GELU_ERF: ("GELU_ERF", "ffn_gelu_erf"),
             FFN_GELU_QUICK: ("GELU_QUICK", "ffn_gelu_quick")}


def _align(x: int, n: int) -> int:
    """CLIP_ALIGN: x rounded up to a multiple of n (C ints)."""
    return _cdiv(x + n - 1, n) * n


def _cdiv(a: int, b: int) -> int:
    """C int division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def graph_builder(ctx: ClipCtx, nx: int, ny: int) -> ClipGraph:
    """clip_get_graph_builder for a batch of one image of nx x ny."""
    module = importlib.import_module(f".models.{GRAPH_BUILDERS[ctx.model.proj_type]}", __package__)
    return module.GRAPH_BUILDER(ctx, nx, ny)


# --- clip_init: load, warm up ------------------------------------------------------------------------

def warmup_size(ctx: ClipCtx) -> tuple[int, int]:
    """get_dummy_batch: the warm-up image (warmup_image_size square) or audio (warmup_audio_size x
    n_mel_bins)."""
    hp = ctx.model.hparams
    if ctx.model.modality == MODALITY_VISION:
        return hp.warmup_image_size, hp.warmup_image_size
    return hp.warmup_audio_size, hp.n_mel_bins


def reserve_compute_meta(ctx: ClipCtx, nx: int, ny: int) -> bool:
    """clip_model_loader::reserve_compute_meta: the warm-up graph reserved, mem_compute per device;
    True if the projector's backend runs every FLASH_ATTN_EXT."""
    gf = graph_builder(ctx, nx, ny).build()
    if len(gf.nodes) > 8192 or len(gf.leafs) > 8192:   # ggml_new_graph_custom(ctx0, max_nodes = 8192)
        raise GGMLAbort(f"llama.cpp would abort building the projector's warm-up graph: {len(gf.nodes)} nodes, "
                        f"{len(gf.leafs)} leafs, over the graph's 8192 (ggml.c GGML_ASSERT(cgraph->n_nodes < "
                        f"cgraph->size))")
    ctx.sched.reserve(gf)
    ctx.mem_compute = {}
    ctx.compute_buffers = {}
    for i, backend in enumerate(ctx.backend_ptrs):
        size = ctx.sched.get_vbuffer_size(i)
        if size > 1:
            ctx.compute_buffers[ctx.backend_buft[i].name] = size
        dev = backend.device_name
        ctx.mem_compute[dev] = ctx.mem_compute.get(dev, 0) + size
    ctx.n_splits, ctx.n_nodes = ctx.sched.n_splits, len(gf.nodes)
    return all(ctx.backend.supports_op(n) for n in gf.nodes if n.op == "FLASH_ATTN_EXT")


def warmup(ctx: ClipCtx) -> None:
    """clip_model_loader::warmup: with flash attention "auto", tried on, and reserved again off if
    the projector's backend cannot run it (the buffers keep the larger of the two)."""
    nx, ny = warmup_size(ctx)
    if ctx.flash_attn_type == FLASH_ATTN_AUTO:
        ctx.flash_attn_type = FLASH_ATTN_ENABLED
        if not reserve_compute_meta(ctx, nx, ny):
            ctx.flash_attn_type = FLASH_ATTN_DISABLED
            reserve_compute_meta(ctx, nx, ny)
    else:
        reserve_compute_meta(ctx, nx, ny)


@dataclass
class ClipInitResult:
    """clip_init_result: the vision, audio and audio-generation contexts."""
    ctx_v: Optional[ClipCtx]
    ctx_a: Optional[ClipCtx]
    ctx_gen_a: Optional[ClipCtx]
    path: str


def clip_init(path: str, devices: list[Backend], cparams: ClipContextParams, use_cache: bool = True) -> ClipInitResult:
    loader = ClipModelLoader(path, use_cache)
    ctx_v = ctx_a = None
    if loader.has_vision:
        model = ClipModel()
        ctx_v = new_clip_ctx(devices, cparams, model)
        loader.load_hparams(model, MODALITY_VISION)
        loader.load_tensors(ctx_v)
        graph_builder(ctx_v, *warmup_size(ctx_v))   # init_ctx: the builder made (its batching support read)
        if cparams.warmup:
            warmup(ctx_v)
    if loader.has_audio:
        model = ClipModel()
        ctx_a = new_clip_ctx(devices, cparams, model)
        loader.load_hparams(model, MODALITY_AUDIO)
        loader.load_tensors(ctx_a)
        graph_builder(ctx_a, *warmup_size(ctx_a))
        if cparams.warmup:
            warmup(ctx_a)
    ctx_gen_a = None
    if loader.has_gen_audio:
        # clip_init: the weights loaded, no init_ctx and no warm-up ("TODO: fix warmup"): no compute buffer
        model = ClipModel()
        ctx_gen_a = new_clip_ctx(devices, cparams, model)
        loader.load_hparams(model, MODALITY_GEN_AUDIO)
        loader.load_tensors(ctx_gen_a)
    return ClipInitResult(ctx_v, ctx_a, ctx_gen_a, path)
