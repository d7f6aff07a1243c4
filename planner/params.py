"""User-facing parameters, named after llama.cpp's common/arg.cpp flags.

Defaults follow llama-server where it differs from the C API (see the reserve-engine issue):
-c 0 (training context), -b 2048, -ub 512, -np 1, -fa auto, -ctk/-ctv f16, -kvu off, --swa-full off.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional, Union

# the cache types -ctk/-ctv accept (common/arg.cpp kv_cache_types)
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


@dataclass(frozen=True)
class KvOverride:
    """llama_model_kv_override: one --override-kv KEY=TYPE:VALUE. tag: int, float, bool or str (the
    llama_model_kv_override_type names override_type_to_str prints); value as llama.cpp stores it
    (val_i64, val_f64, val_bool, val_str). An empty key ends llama.cpp's list there."""
    key: str
    tag: str
    value: Union[int, float, bool, str]


class BadKvOverride(ValueError):
    """An --override-kv item string_parse_kv_override refuses (its COM_ERR line)."""


_ATOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_ATOF = re.compile(r"[ \t\n\v\f\r]*([+-]?)(?:(0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?[0-9]+)?)"
                   r"|((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)|(inf(?:inity)?)|(nan(?:\([0-9a-z_]*\))?))",
                   re.IGNORECASE)
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def c_atol(text: str) -> int:
    """std::atol (glibc: strtol into a 64-bit long): the longest integer prefix after white space,
    0 without one, clamped to the long's range."""
    m = _ATOL.match(text)
    return min(max(int(m.group(1)), INT64_MIN), INT64_MAX) if m else 0


def c_atof(text: str) -> float:
    """std::atof (strtod): the longest floating-point prefix after white space (decimal, hex,
    inf/infinity, nan), 0.0 without one, +-inf beyond a double's range."""
    m = _ATOF.match(text)
    if not m:
        return 0.0
    sign, hexa, dec, inf, nan = m.groups()
    x = float.fromhex(hexa) if hexa else float(dec) if dec else math.inf if inf else math.nan
    return -x if sign == "-" else x


def string_parse_kv_override(data: str) -> KvOverride:
    """common/common.cpp string_parse_kv_override: KEY=TYPE:VALUE, the key shorter than 128 bytes,
    TYPE int (atol), float (atof), bool (exactly true or false) or str (at most 127 bytes)."""
    key, sep, rest = data.partition("=")
    if not sep or len(key.encode()) >= 128:
        raise BadKvOverride(f"malformed KV override '{data}'")
    for tag in ("int", "float", "bool", "str"):
        if rest.startswith(tag + ":"):
            value = rest[len(tag) + 1:]
            break
    else:
        raise BadKvOverride(f"invalid type for KV override '{data}'")
    if tag == "int":
        return KvOverride(key, tag, c_atol(value))
    if tag == "float":
        return KvOverride(key, tag, c_atof(value))
    if tag == "bool":
        if value not in ("true", "false"):
            raise BadKvOverride(f"invalid boolean value for KV override '{data}'")
        return KvOverride(key, tag, value == "true")
    if len(value.encode()) > 127:
        raise BadKvOverride(f"malformed KV override '{data}', value cannot exceed 127 chars")
    return KvOverride(key, tag, value)


def parse_csv_row(text: str) -> list[str]:
    """common/arg.cpp parse_csv_row: fields split at commas outside double quotes; a quote opens a
    quoted field only at the field's start (elsewhere it is kept), "" inside one is a quote."""
    fields, field_, in_quotes, i = [], "", False, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if not in_quotes:
                if field_:
                    field_ += '"'
                else:
                    in_quotes = True
            elif text[i + 1:i + 2] == '"':
                field_ += '"'
                i += 1
            else:
                in_quotes = False
        elif ch == "," and not in_quotes:
            fields.append(field_)
            field_ = ""
        else:
            field_ += ch
        i += 1
    fields.append(field_)
    return fields


def parse_kv_overrides(value: str) -> list[KvOverride]:
    """--override-kv's handler: each comma-separated item (parse_csv_row) parsed in turn; the first
    llama.cpp refuses stops it ("error: Invalid type for KV override: ITEM", whatever the reason)."""
    return [string_parse_kv_override(item) for item in parse_csv_row(value)]


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
    kv_overrides: tuple[KvOverride, ...] = ()   # --override-kv KEY=TYPE:VALUE, in command-line order
    lora: tuple[tuple[str, float], ...] = ()   # --lora FILE (scale 1), --lora-scaled FILE SCALE, in order
    lora_init_without_apply: bool = False      # --lora-init-without-apply
    control_vectors: tuple[tuple[str, float], ...] = ()   # --control-vector FILE, --control-vector-scaled FILE:SCALE
    control_vector_layer_start: int = 0        # --control-vector-layer-range START END (<= 0: 1 and n_layer)
    control_vector_layer_end: int = 0


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
