"""User-facing parameters, named after llama.cpp's common/arg.cpp flags.

Defaults follow llama-server where it differs from the C API (see the reserve-engine issue):
-c 0 (training context), -b 2048, -ub 512, -np 1, -fa auto, -ctk/-ctv f16, -kvu off, --swa-full off.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# the cache types -ctk/-ctv accept (common/arg.cpp kv_cache_types)
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


@dataclass(frozen=True)
class Params:
    n_ctx: int = 0                  # -c; 0 = n_ctx_train
    n_batch: int = 2048             # -b
    n_ubatch: int = 512             # -ub
    n_seq_max: int = 1              # -np
    flash_attn: str = "auto"        # -fa on|off|auto
    type_k: str = "f16"             # -ctk
    type_v: str = "f16"             # -ctv
    kv_unified: bool = False        # -kvu
    swa_full: bool = False          # --swa-full
    n_gpu_layers: int = -1          # -ngl; -1 = all (the C API's default)
    split_mode: str = "layer"       # -sm none|layer|row
    main_gpu: int = 0               # -mg
    tensor_split: tuple[float, ...] = ()   # -ts
    offload_kqv: bool = True        # -nkvo turns it off
    op_offload: bool = True         # --no-op-offload turns it off
    no_host: bool = False           # --no-host
    use_extra_bufts: bool = True    # --no-repack turns it off
    tensor_overrides: tuple[tuple[str, str], ...] = ()   # -ot REGEX=BUFTYPE
    rpc: tuple[str, ...] = ()       # --rpc HOST:PORT, repeatable
    devices: tuple[str, ...] = field(default=())         # --device (simulated), repeatable
    header_cache: bool = True       # --no-header-cache: fetch a URL's header again
    use_mmap: bool = True           # llama_model_loader::use_mmap; common/fit.cpp measures with it off
    rpc_memory: tuple[Optional[tuple[int, int]], ...] = ()   # per --rpc server, the (free, total) it reports
    n_outputs_max: int = 0          # llama_context_params::n_outputs_max; 0 = n_batch (llama-server sets it)
    load_mtp: bool = False          # llama_model_params::load_mtp: the NextN (MTP) blocks' weights are loaded
    ctx_type: str = "default"       # llama_context_params::ctx_type: "mtp" builds the MTP draft head's graph
    n_rs_seq: int = 0               # llama_context_params::n_rs_seq: recurrent-state snapshots per sequence
    embeddings: bool = False        # --embedding (--rerank): the context outputs embeddings
    pooling_type: str = "unspecified"   # --pooling none|mean|cls|last|rank; unspecified: the model's


@dataclass(frozen=True)
class MmprojParams:
    """llama-server's projector flags: -mm/-mmu (path), --no-mmproj-offload, -mmdev,
    --image-min-tokens, --image-max-tokens, --no-warmup."""
    path: str
    use_gpu: bool = True
    device: Optional[str] = None
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    warmup: bool = True
