"""A llama-server command line as llama-server reads it: `schedplan fit -- llama-server ARGS`.

common/arg.cpp's common_params_parse_ex for LLAMA_EXAMPLE_SERVER, on the option table generated
from it (llama_server_options.py): the config files (/etc/llama.cpp/config.ini, then
${XDG_CONFIG_HOME:-~/.config}/llama.cpp/config.ini: their global section, then [default]), then
each option's environment variable (set_env; LLAMA_ARG_NO_... for the negative form of a bool
option), then the command line in order, a later flag overriding an earlier one as each handler
does. A flag llama-server does not know is refused as it refuses it ("invalid argument"), and so is a
value its handler would refuse (std::stoi of an int, a bool's truthy/falsey words, the memory flags'
own checks). Then tools/server/server.cpp's own defaults: -np unset (-1, auto) becomes 4 with a
unified KV cache (planner/server.py server_params, as `schedplan fit --server` plans it), and
--kv-unified-per-slot N without -c sizes the context to -np * N.

The memory flags become schedplan's Params (PLANNED below), the projector's flags its
MmprojParams and the speculative decoding flags SpecParams. Flags that change memory in ways
schedplan does not plan (REFUSED) stop with one line saying so; every other flag is accepted and
ignored, its value checked only for the handler's type (an int flag's value as std::stoi reads it).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import click

from .llama_server_options import OPTIONS, PRESET_ONLY
from .options import (INT32_MAX, INT32_MIN, LLM_FFN_DENSE_REGEX, LLM_FFN_EXPS_REGEX, _fit_targets, _parse_tensor_split,
                      lora_adapters)
from ..planner.devices import BadDevices
from ..planner.hparams import LLAMA_MAX_LAYERS, LLAMA_POOLING_TYPES
from ..planner.params import KV_TYPES, BadKvOverride, KvOverride, Params, parse_kv_overrides

if TYPE_CHECKING:
    from ..planner.mtmd.mtmd import MmprojParams
    from ..planner.server import SpecParams

UINT32_MAX = 2**32 - 1


class ServerArgsError(BadDevices):
    """A llama-server command line llama-server would refuse, or one schedplan cannot plan: one line."""


@dataclass(frozen=True)
class Option:
    args: tuple[str, ...]
    args_neg: tuple[str, ...]
    kind: str                  # void, bool, int, string, str_str
    value: bool                # takes a value
    env: Optional[str]
    line: int                  # in common/arg.cpp

    @property
    def key(self) -> str:
        return self.args[0]


SERVER_OPTIONS = [Option(*row) for row in OPTIONS]
PRESET_OPTIONS = [Option(*row) for row in PRESET_ONLY]
# common_params_parse_ex's arg_to_options: every flag and negative flag -> (option, is_positive)
BY_FLAG = {a: (o, True) for o in SERVER_OPTIONS for a in o.args} | \
          {a: (o, False) for o in SERVER_OPTIONS for a in o.args_neg}

# The options whose values decide memory, read into Params (apply() below), by their first flag
PLANNED = {"-c", "--kv-unified-per-slot", "-b", "-ub", "--swa-full", "-kvu", "-fa", "-np", "-ctk", "-ctv", "-kvo",
           "--repack", "--no-host", "--op-offload", "-ot", "-cmoe", "-ncmoe", "-ncffn", "-ngl", "-sm", "-ts", "-mg",
           "-fit", "-fitt", "-fitc", "--rpc", "-dev", "-lm", "-lzm", "-m", "-mu", "-hf", "-hff", "-hft",
           "--models-dir", "--models-preset", "-mm", "-mmu", "--mmproj-auto", "--mmproj-offload", "-mmdev",
           "--image-min-tokens", "--image-max-tokens", "--warmup", "--spec-type", "--spec-draft-model",
           "--spec-draft-hf", "--spec-draft-ngl", "--spec-draft-type-k", "--spec-draft-type-v",
           "--spec-draft-override-tensor", "--spec-draft-cpu-moe", "--spec-draft-n-cpu-moe", "--spec-draft-n-max",
           "--spec-ngram-mod-n-max", "--spec-ngram-simple-size-m", "--spec-ngram-map-k-size-m",
           "--spec-ngram-map-k4v-size-m", "--spec-default", "--embedding", "--rerank", "--pooling", "--override-kv",
           "--lora", "--lora-scaled", "--lora-init-without-apply", "--control-vector", "--control-vector-scaled",
           "--control-vector-layer-range", "--spec-draft-backend-sampling"}
# the n-gram types' draft lengths (common_speculative_n_max reads them): the option and its bounds
NGRAM_N_MAX_OPTIONS = {"--spec-ngram-mod-n-max": ("ngram-mod", 0, "ngram n-max"),
                       "--spec-ngram-simple-size-m": ("ngram-simple", 1, "ngram size M"),
                       "--spec-ngram-map-k-size-m": ("ngram-map-k", 1, "ngram size M"),
                       "--spec-ngram-map-k4v-size-m": ("ngram-map-k4v", 1, "ngram size M")}
# Options that change what llama-server allocates in ways schedplan does not plan, or that make it
# print something and exit: refused with the reason
REFUSED = {
    "-h": "prints the usage and exits", "--version": "prints its version and exits",
    "-cl": "lists the cached models and exits", "--completion-bash": "prints a completion script and exits",
    "--list-devices": "lists the devices and exits (see `schedplan devices`)",
    "-bs": ("samples on the backend (--backend-sampling): common_init_result gives the context a sampler per slot "
            "at creation, whose graph nodes and output buffer schedplan does not plan yet"),
    "--spec-draft-device": "places the draft model on devices of its own (-devd), which schedplan does not plan yet",
    "-dr": "loads a model from a Docker registry: give it with -m or -hf",
    "--embd-gemma-default": "sets a model and its flags in its handler: give them instead",
    "--fim-qwen-1.5b-default": "sets a model and its flags in its handler: give them instead",
    "--fim-qwen-3b-default": "sets a model and its flags in its handler: give them instead",
    "--fim-qwen-7b-default": "sets a model and its flags in its handler: give them instead",
    "--fim-qwen-7b-spec": "sets a model and its flags in its handler: give them instead",
    "--fim-qwen-14b-spec": "sets a model and its flags in its handler: give them instead",
    "--fim-qwen-30b-default": "sets a model and its flags in its handler: give them instead",
    "--gpt-oss-20b-default": "sets a model and its flags in its handler: give them instead",
    "--gpt-oss-120b-default": "sets a model and its flags in its handler: give them instead",
    "--vision-gemma-4b-default": "sets a model and its flags in its handler: give them instead",
    "--vision-gemma-12b-default": "sets a model and its flags in its handler: give them instead",
}


@dataclass(frozen=True)
class Event:
    """One handler call: the option, its value ("1"/"0" for a bool flag), and where it came from."""
    option: Option
    value: str
    source: str                # "-c" as written, "LLAMA_ARG_CTX_SIZE", "config.ini", ...


# --- reading values as llama.cpp's handlers read them --------------------------------------------

def is_truthy(v: str) -> bool:
    return v in ("on", "enabled", "true", "1")


def is_falsey(v: str) -> bool:
    return v in ("off", "disabled", "false", "0")


def is_autoy(v: str) -> bool:
    return v in ("auto", "-1")


_STOI_PREFIX = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")


def stoi(value: str, source: str, strict: bool) -> int:
    """std::stoi: leading whitespace, a sign, decimal digits; a value without digits or outside a
    32-bit int throws. strict (a planned flag): a value with anything after the number is refused
    too, where stoi would read its prefix ("12abc" as 12), as schedplan's own flags refuse it."""
    m = _STOI_PREFIX.match(value)
    if not m:
        raise ServerArgsError(f"{source} {value!r}: not an integer (std::stoi throws invalid_argument)")
    if strict and m.end() != len(value):
        raise ServerArgsError(f"{source} {value!r}: std::stoi would read only {m.group().strip()!r} of it; "
                              f"schedplan refuses it instead of guessing")
    n = int(m.group())
    if not INT32_MIN <= n <= INT32_MAX:
        raise ServerArgsError(f"{source} {value!r}: outside a 32-bit int (std::stoi throws out_of_range)")
    return n


def parse_bool_value(value: str, source: str) -> bool:
    if is_truthy(value):
        return True
    if is_falsey(value):
        return False
    raise ServerArgsError(f"{source}={value!r}: invalid boolean value (llama.cpp's parse_bool_value takes "
                          f"on/enabled/true/1 or off/disabled/false/0)")


# --- the sources of arguments, in common_params_parse_ex's order ---------------------------------

def config_files(environ: dict[str, str]) -> list[Path]:
    """common_params_apply_system_config: the system file, then the user's (fs_get_config_directory)."""
    home = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return [p for p in (Path("/etc/llama.cpp/config.ini"), Path(home) / "llama.cpp" / "config.ini") if p.exists()]


def env_events(environ: dict[str, str]) -> list[Event]:
    """common_arg::get_value_from_env for each option in table order; a bool option's LLAMA_ARG_NO_
    variable reads as "0". A void option's handler runs only for a truthy value."""
    out = []
    for o in SERVER_OPTIONS:
        if o.env is None:
            continue
        value, name = None, o.env
        if o.args_neg:
            neg = o.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
            if neg in environ:
                value, name = "0", neg
        if value is None and o.env in environ:
            value = environ[o.env]
        if value is None:
            continue
        if o.kind == "void" and not is_truthy(value):
            continue
        if o.kind == "bool":
            value = "1" if parse_bool_value(value, name) else "0"
        out.append(Event(o, value, name))
    return out


def argv_events(argv: list[str]) -> list[Event]:
    """parse_cli_args: each flag looked up after '_' -> '-' in a "--" flag; a bool flag's value is
    whether it is the positive form; one value (or two) follows the others."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            arg = arg.replace("_", "-")
        if arg not in BY_FLAG:
            raise ServerArgsError(f"invalid argument: {argv[i]} (llama-server refuses it: not one of its flags)")
        o, positive = BY_FLAG[arg]
        if o.kind == "void":
            out.append(Event(o, "1", arg))
        elif o.kind == "bool":
            out.append(Event(o, "1" if positive else "0", arg))
        else:
            need = 2 if o.kind == "str_str" else 1
            if i + need >= len(argv):
                raise ServerArgsError(f"error while handling argument \"{arg}\": expected value for argument")
            out.append(Event(o, "\0".join(argv[i + 1:i + 1 + need]), arg))    # two values: NUL between
            i += need
        i += 1
    return out


# --- INI presets (common/preset.cpp) --------------------------------------------------------------

_INI_LINE = re.compile(r"""[ \t]*(?:
    \[[ \t]*(?P<section>[^]]*?)[ \t]*\]        # header-line
  | (?P<key>[a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*(?P<value>.*?)   # kv-line
  | )[ \t]*(?:[;#].*)?$""", re.VERBOSE)


def parse_ini(path: Path) -> dict[str, dict[str, str]]:
    """parse_ini_from_file: sections of key = value lines; ';' or '#' start a comment; keys before
    any section belong to "default"."""
    if not path.exists():
        raise ServerArgsError(f"preset file does not exist: {path}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ServerArgsError(f"failed to open server preset file: {path} ({e})") from None
    parsed: dict[str, dict[str, str]] = {}
    section = "default"
    for line in re.split(r"\r\n|\n|\r", text):
        m = _INI_LINE.fullmatch(line)
        if not m:
            raise ServerArgsError(f"failed to parse server config file: {path} (line {line!r})")
        if m.group("section") is not None:
            section = m.group("section")
            parsed[section] = {}
        elif m.group("key") is not None:
            parsed.setdefault(section, {})[m.group("key")] = m.group("value")
    return parsed


def _key_to_opt() -> dict[str, Option]:
    """get_map_key_opt: an option by its environment variable(s) and by each flag without its dashes."""
    out = {}
    for o in SERVER_OPTIONS + PRESET_OPTIONS:
        if o.env:
            out[o.env] = o
            if o.args_neg:
                out[o.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")] = o
        for a in o.args + o.args_neg:
            out[a.lstrip("-")] = o
    return out


KEY_TO_OPT = _key_to_opt()


@dataclass
class Preset:
    """common_preset: option -> value, applied as apply_to_params applies it (by table order)."""
    name: str
    options: dict[str, tuple[Option, str]] = field(default_factory=dict)     # by the option's key

    def merge(self, other: "Preset") -> None:
        self.options.update(other.options)

    def events(self, source: str) -> list[Event]:
        # std::map<common_arg, string> iterates by args[0] in strcmp order
        out = []
        for key in sorted(self.options, key=lambda k: k.encode()):
            o, value = self.options[key]
            if o in PRESET_OPTIONS:
                continue
            if o.kind == "bool":
                value = "1" if is_truthy(value) else "0"
            out.append(Event(o, value, f"{source} {o.args[-1].lstrip('-')}"))
        return out


def load_presets(path: Path, ignore_unknown: bool) -> tuple[Preset, dict[str, Preset]]:
    """common_preset_context::load_from_ini: (the "*" global preset, the others by name)."""
    presets, global_preset = {}, Preset("*")
    for section, kvs in parse_ini(path).items():
        name = section or "default"
        if name not in ("*", "default") and ":" in name:
            head, tag = name.rsplit(":", 1)
            m = re.search(r"[-.]([A-Z0-9_]+)$", tag, re.IGNORECASE)
            canon = (m.group(1) if m else tag).upper()
            name = f"{head}:{canon}"
        preset = Preset(name)
        for key, value in kvs.items():
            if key == "version":
                continue
            o = KEY_TO_OPT.get(key)
            if o is None:
                if ignore_unknown:
                    continue
                raise ServerArgsError(f"{path}: option '{key}' not recognized in preset '{name}'")
            if o.args_neg and any(a.lstrip("-") == key for a in o.args_neg):
                value = "false" if is_truthy(value) else "true"
            preset.options[o.key] = (o, value)
        if name == "default" and not preset.options:
            continue
        if name == "*":
            global_preset = preset
        else:
            presets[name] = preset
    return global_preset, presets


def config_events(environ: dict[str, str]) -> list[Event]:
    out = []
    for path in config_files(environ):
        global_preset, presets = load_presets(path, ignore_unknown=True)
        out += global_preset.events(str(path))
        if "default" in presets:
            out += presets["default"].events(str(path))
    return out


# --- applying the handlers ------------------------------------------------------------------------

@dataclass
class ServerParams:
    """The part of common_params the memory flags set, with LLAMA_EXAMPLE_SERVER's defaults."""
    n_ctx: int = 0
    n_ctx_set: bool = False
    kv_unified_per_slot: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    n_parallel: int = -1                  # the server's default: auto
    kv_unified: bool = False
    swa_full: bool = False
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    no_kv_offload: bool = False
    no_extra_bufts: bool = False
    no_host: bool = False
    no_op_offload: bool = False
    tensor_overrides: list[tuple[str, str]] = field(default_factory=list)
    n_gpu_layers: int = -1
    n_gpu_layers_set: bool = False
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    fit: bool = True
    fit_targets: Optional[list[int]] = None
    fit_min_ctx: int = 4096
    rpc: list[str] = field(default_factory=list)
    devices: Optional[list[str]] = None   # -dev: device names, [] for none
    use_mmap: bool = True
    model: str = ""
    model_url: str = ""
    hf_repo: str = ""
    hf_file: str = ""
    hf_token: str = ""
    models_dir: str = ""
    models_preset: str = ""
    mmproj: str = ""                      # -mm
    mmproj_url: str = ""                  # -mmu
    no_mmproj: bool = False
    mmproj_use_gpu: bool = True
    mmproj_device: Optional[str] = None   # -mmdev
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    warmup: bool = True
    draft_model: str = ""                 # -md (with -hfd: the file of that repository)
    draft_hf_repo: str = ""               # -hfd
    draft_n_gpu_layers: int = -1
    draft_type_k: str = "f16"
    draft_type_v: str = "f16"
    draft_overrides: list[tuple[str, str]] = field(default_factory=list)
    draft_n_max: int = 3
    draft_backend_sampling: bool = True     # --spec-draft-backend-sampling (common.h: on)
    spec_types: list[str] = field(default_factory=lambda: ["none"])
    embedding: bool = False               # --embedding, --rerank
    pooling_type: str = "unspecified"     # --pooling, --rerank (rank)
    ngram_n_max: dict[str, int] = field(default_factory=dict)   # the n-gram lengths the command set
    kv_overrides: list[KvOverride] = field(default_factory=list)   # --override-kv, appended in order
    lora: list[tuple[str, float]] = field(default_factory=list)   # --lora, --lora-scaled, in order
    lora_init_without_apply: bool = False
    control_vectors: list[tuple[str, float]] = field(default_factory=list)   # --control-vector(-scaled)
    control_vector_layer_range: tuple[int, int] = (0, 0)
    given: set[str] = field(default_factory=set)     # the planned options set by any source


def apply(p: ServerParams, e: Event) -> None:
    """The handler of e's option, for the planned ones; others only have their value's type checked."""
    o, v, src = e.option, e.value, e.source
    key = o.key
    if key in REFUSED:
        raise ServerArgsError(f"{src}: llama-server {REFUSED[key]}")
    if key not in PLANNED:
        if o.kind == "int":
            stoi(v, src, strict=False)
        return
    p.given.add(key)
    if key == "-c":
        p.n_ctx, p.n_ctx_set = stoi(v, src, True), True
        if p.n_ctx == 0:
            p.fit_min_ctx = UINT32_MAX    # disable context reduction: the full context was asked for
    elif key == "--kv-unified-per-slot":
        p.kv_unified_per_slot = stoi(v, src, True)
    elif key in ("-b", "-ub"):
        n = stoi(v, src, True)
        if n < 1:
            raise ServerArgsError(f"{src} {n}: schedplan plans batch sizes of at least 1, as its own {key} takes them")
        if key == "-b":
            p.n_batch = n
        else:
            p.n_ubatch = n
    elif key == "--swa-full":
        p.swa_full = True
    elif key == "-kvu":
        p.kv_unified = v == "1"
    elif key == "-fa":
        if not (is_truthy(v) or is_falsey(v) or is_autoy(v)):
            raise ServerArgsError(f"{src}: unknown value for --flash-attn: '{v}'")
        p.flash_attn = "on" if is_truthy(v) else "off" if is_falsey(v) else "auto"
    elif key == "-np":
        n = stoi(v, src, True)
        if n == 0:
            raise ServerArgsError(f"{src}: invalid value for n_parallel (0)")
        p.n_parallel = n
    elif key in ("-ctk", "-ctv"):
        if v not in KV_TYPES:
            raise ServerArgsError(f"{src}: Unsupported cache type: {v} (allowed: {', '.join(KV_TYPES)})")
        if key == "-ctk":
            p.type_k = v
        else:
            p.type_v = v
    elif key == "-kvo":
        p.no_kv_offload = v != "1"
    elif key == "--repack":
        p.no_extra_bufts = v != "1"
    elif key == "--no-host":
        p.no_host = True
    elif key == "--op-offload":
        p.no_op_offload = v != "1"
    elif key in ("-ot", "--spec-draft-override-tensor"):
        overrides = p.tensor_overrides if key == "-ot" else p.draft_overrides
        for item in v.split(","):
            pattern, sep, buft = item.partition("=")
            if not sep:
                raise ServerArgsError(f"{src} {v!r}: invalid value (expected <tensor name pattern>=<buffer type>)")
            overrides.append((pattern, buft))
    elif key in ("-cmoe", "--spec-draft-cpu-moe"):
        (p.tensor_overrides if key == "-cmoe" else p.draft_overrides).append((LLM_FFN_EXPS_REGEX, "CPU"))
    elif key in ("-ncmoe", "-ncffn", "--spec-draft-n-cpu-moe"):
        n = stoi(v, src, True)
        if n < 0:
            raise ServerArgsError(f"{src} {v}: invalid value")
        regex = LLM_FFN_DENSE_REGEX if key == "-ncffn" else LLM_FFN_EXPS_REGEX
        overrides = p.draft_overrides if key == "--spec-draft-n-cpu-moe" else p.tensor_overrides
        overrides += [(f"blk\\.{i}{regex}", "CPU") for i in range(min(n, LLAMA_MAX_LAYERS))]
    elif key == "-ngl":
        p.n_gpu_layers = -1 if v == "auto" else -2 if v == "all" else stoi(v, src, True)
        p.n_gpu_layers_set = True
    elif key == "-sm":
        if v not in ("none", "layer", "row", "tensor"):
            raise ServerArgsError(f"{src} {v!r}: invalid value (none, layer, row or tensor)")
        if v == "tensor":
            raise ServerArgsError(f"{src} tensor: split mode tensor (a meta device over the GPUs) is not planned "
                                  f"by schedplan yet")
        p.split_mode = v
    elif key == "-ts":
        try:
            p.tensor_split = _parse_tensor_split(v)
        except click.BadParameter as ex:
            raise ServerArgsError(f"{src}: {ex.message}") from None
    elif key == "-mg":
        p.main_gpu = stoi(v, src, True)
    elif key == "-fit":
        if not (is_truthy(v) or is_falsey(v)):
            raise ServerArgsError(f"{src}: unknown value for --fit: '{v}'")
        p.fit = is_truthy(v)
    elif key == "-fitt":
        try:
            p.fit_targets = _fit_targets(None, None, v)
        except click.BadParameter as ex:
            raise ServerArgsError(f"{src}: {ex.message}") from None
    elif key == "-fitc":
        p.fit_min_ctx = stoi(v, src, True) & UINT32_MAX
    elif key == "--rpc":
        servers = v.split(",")
        if not v:
            raise ServerArgsError(f"{src}: no RPC servers specified")
        p.rpc += servers
    elif key == "-dev":
        names = v.split(",")
        if not v:
            raise ServerArgsError(f"{src}: no devices specified")
        p.devices = [] if names == ["none"] else names
    elif key == "-lm":
        if v not in ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"):
            raise ServerArgsError(f"{src} {v!r}: invalid value")
        # llama_model_loader: use_mmap for mmap, mmap+mlock and auto (auto: unless a device cannot map,
        # which none of the devices schedplan plans is)
        p.use_mmap = v in ("auto", "mmap", "mmap+mlock")
    elif key == "-lzm":
        if v not in ("on", "auto", "off"):
            raise ServerArgsError(f"{src} {v!r}: invalid value")
        if v == "on":
            raise ServerArgsError(f"{src} on: reading lazily loaded tensors on demand is not planned by schedplan "
                                  f"yet (auto and off are)")
    elif key == "-m":
        p.model = v
    elif key == "-mu":
        p.model_url = v
    elif key == "-hf":
        p.hf_repo = v
    elif key == "-hff":
        p.hf_file = v
    elif key == "-hft":
        p.hf_token = v
    elif key == "--models-dir":
        p.models_dir = v
    elif key == "--models-preset":
        p.models_preset = v
    elif key == "-mm":
        p.mmproj = v
    elif key == "-mmu":
        p.mmproj_url = v
    elif key == "--mmproj-auto":
        p.no_mmproj = v != "1"
    elif key == "--mmproj-offload":
        p.mmproj_use_gpu = v == "1"
    elif key == "-mmdev":
        apply_mmproj_device(p, v, src)
    elif key in ("--image-min-tokens", "--image-max-tokens"):
        n = stoi(v, src, True)
        if key == "--image-min-tokens":
            p.image_min_tokens = n
        else:
            p.image_max_tokens = n
    elif key == "--warmup":
        p.warmup = v == "1"
    elif key == "--spec-draft-model":
        p.draft_model = v
    elif key == "--spec-draft-hf":
        p.draft_hf_repo = v
    elif key == "--spec-draft-ngl":
        p.draft_n_gpu_layers = -1 if v == "auto" else -2 if v == "all" else stoi(v, src, True)
    elif key in ("--spec-draft-type-k", "--spec-draft-type-v"):
        if v not in KV_TYPES:
            raise ServerArgsError(f"{src}: Unsupported cache type: {v} (allowed: {', '.join(KV_TYPES)})")
        if key == "--spec-draft-type-k":
            p.draft_type_k = v
        else:
            p.draft_type_v = v
    elif key == "--spec-draft-n-max":
        n = stoi(v, src, True)
        if n < 0:
            raise ServerArgsError(f"{src} {v}: invalid value")
        p.draft_n_max = n
    elif key == "--spec-draft-backend-sampling":
        p.draft_backend_sampling = v == "1"
    elif key == "--spec-type":
        from ..planner.server import spec_types_from_names
        try:
            p.spec_types += spec_types_from_names(v.split(","))
        except ValueError as ex:
            raise ServerArgsError(f"{src}: {ex}") from None
    elif key in NGRAM_N_MAX_OPTIONS:
        spec_type, low, what = NGRAM_N_MAX_OPTIONS[key]
        n = stoi(v, src, True)
        if not low <= n <= 1024:
            raise ServerArgsError(f"{src} {v}: {what} must be between {low} and 1024 inclusive")
        p.ngram_n_max[spec_type] = n
    elif key == "--embedding":
        p.embedding = True
    elif key == "--rerank":
        p.embedding, p.pooling_type = True, "rank"
    elif key == "--pooling":
        if v not in LLAMA_POOLING_TYPES:
            raise ServerArgsError(f"{src} {v!r}: invalid value (none, mean, cls, last or rank)")
        p.pooling_type = v
    elif key == "--override-kv":
        try:
            p.kv_overrides += parse_kv_overrides(v)
        except BadKvOverride as ex:
            raise ServerArgsError(f"{src} {v!r}: {ex} (llama-server refuses it: \"Invalid type for KV override\")") from None
    elif key in ("--lora", "--lora-scaled"):
        try:
            p.lora += lora_adapters([("lora_scaled" if key == "--lora-scaled" else "lora", v)])
        except ValueError as ex:
            raise ServerArgsError(f"{src}: {ex}") from None
    elif key == "--lora-init-without-apply":
        p.lora_init_without_apply = True
    elif key in ("--control-vector", "--control-vector-scaled"):
        try:
            p.control_vectors += lora_adapters([("control_vector_scaled" if key.endswith("-scaled")
                                                 else "control_vector", v)], "control_vector")
        except ValueError as ex:
            raise ServerArgsError(f"{src}: {ex}") from None
    elif key == "--control-vector-layer-range":
        start, _, end = v.partition("\0")
        p.control_vector_layer_range = (stoi(start, src, True), stoi(end, src, True))
    elif key == "--spec-default":
        # ngram-mod with its n_max 64 (and an n_min and n_match that decide no memory)
        p.spec_types.append("ngram-mod")
        p.ngram_n_max["ngram-mod"] = 64


def apply_mmproj_device(p: ServerParams, v: str, src: str) -> None:
    """-mmdev's handler: none runs the projector on the CPU; else one device (parse_device_list),
    which must exist when the flag is read: an RPC server's only after its --rpc."""
    if v == "none":
        p.mmproj_use_gpu, p.mmproj_device = False, None
        return
    names = v.split(",")
    if len(names) > 1:
        raise ServerArgsError(f"{src} {v}: only one device may be specified for mmproj")
    m = re.fullmatch(r"RPC(\d+)", v)
    if m and int(m.group(1)) >= len(p.rpc):
        raise ServerArgsError(f"{src} {v}: invalid device: {v} (llama-server registers an RPC server's device when "
                              f"it reads its --rpc, which must come before -mmdev)")
    p.mmproj_use_gpu, p.mmproj_device = True, v


# --- the whole command line -------------------------------------------------------------------------

@dataclass
class ServerCommand:
    argv: list[str]                 # the arguments after llama-server, as given
    params: ServerParams


def parse(argv: list[str], environ: Optional[dict[str, str]] = None) -> ServerCommand:
    """common_params_parse(argc, argv, params, LLAMA_EXAMPLE_SERVER), then the server's defaults."""
    environ = dict(os.environ) if environ is None else environ
    p = ServerParams()
    events = config_events(environ) + env_events(environ) + argv_events(argv)
    for e in events:
        apply(p, e)
    # common_params_parse_ex (arg.cpp:889): the projector's device defaults to -dev's first (none: the CPU)
    if p.mmproj_use_gpu and p.mmproj_device is None and p.devices is not None:
        p.mmproj_use_gpu, p.mmproj_device = bool(p.devices), p.devices[0] if p.devices else None
    server_defaults(p)
    return ServerCommand(list(argv), p)


def server_defaults(p: ServerParams) -> None:
    """tools/server/server.cpp before loading the model: with embeddings n_batch becomes n_ubatch
    where larger ("embeddings require all tokens to be processed in a single ubatch"; not in router
    mode, whose children each do it); --kv-unified-per-slot N without -c sizes the context to
    -np * N, -np unset counting as the 4 slots its "auto" becomes (that default itself, with its
    unified KV cache, is planner/server.py server_params')."""
    from ..planner.server import N_PARALLEL_AUTO

    is_router = not (p.model or p.model_url or p.hf_repo)
    if p.embedding and p.n_batch > p.n_ubatch and not is_router:
        p.n_batch = p.n_ubatch
    if p.kv_unified_per_slot > 0 and p.n_ctx == 0 and p.fit_min_ctx != UINT32_MAX:
        p.n_ctx = (p.n_parallel if p.n_parallel > 0 else N_PARALLEL_AUTO) * p.kv_unified_per_slot
        p.n_ctx_set = True


def to_mmproj(p: ServerParams) -> tuple[Optional["MmprojParams"], Optional["MmprojParams"]]:
    """(the projector the command loads: -mmu, whose file -mm would only name, else -mm; the
    settings of the one -hf picks, when -hf without --no-mmproj leaves it to the repository)."""
    from ..planner.mtmd.mtmd import MmprojParams

    settings = MmprojParams("", p.mmproj_use_gpu, p.mmproj_device, p.image_min_tokens, p.image_max_tokens, p.warmup)
    given = p.mmproj_url or p.mmproj
    if given:
        return replace(settings, path=given), None
    return None, settings if p.hf_repo and not p.no_mmproj else None


def to_spec(p: ServerParams, draft_path: Optional[str]) -> "SpecParams":
    """The speculative decoding of the command (common_params_speculative), with the draft model's
    file (-md, or the one -hfd picks)."""
    from ..planner.server import SPEC_NGRAM_N_MAX, SpecParams

    return SpecParams(tuple(p.spec_types), draft_path, p.draft_n_gpu_layers, p.draft_type_k, p.draft_type_v,
                      tuple(p.draft_overrides), p.draft_n_max, tuple((SPEC_NGRAM_N_MAX | p.ngram_n_max).items()),
                      p.draft_backend_sampling)


def to_params(p: ServerParams, devices: tuple[str, ...]) -> Params:
    """Params of the parsed command line for these local devices (--device specs)."""
    return Params(n_ctx=p.n_ctx, n_batch=p.n_batch, n_ubatch=p.n_ubatch, n_seq_max=max(p.n_parallel, 1),
                  flash_attn=p.flash_attn, type_k=p.type_k, type_v=p.type_v, kv_unified=p.kv_unified,
                  swa_full=p.swa_full, n_gpu_layers=p.n_gpu_layers, split_mode=p.split_mode, main_gpu=p.main_gpu,
                  tensor_split=p.tensor_split, offload_kqv=not p.no_kv_offload, op_offload=not p.no_op_offload,
                  no_host=p.no_host, use_extra_bufts=not p.no_extra_bufts,
                  tensor_overrides=tuple(p.tensor_overrides), rpc=tuple(p.rpc), devices=devices,
                  use_mmap=p.use_mmap, embeddings=p.embedding, pooling_type=p.pooling_type,
                  kv_overrides=tuple(p.kv_overrides), lora=tuple(p.lora),
                  lora_init_without_apply=p.lora_init_without_apply, control_vectors=tuple(p.control_vectors),
                  control_vector_layer_start=p.control_vector_layer_range[0],
                  control_vector_layer_end=p.control_vector_layer_range[1])


def fitted_command(command: list[str], fitted: str, given: frozenset) -> list[str]:
    """The command line to paste: llama-server and its arguments as given, then what fit chose
    where the command left it to fit (-c, -ngl, -ts, -ot) from its fitted line (cli/fit.py
    server_fit_args). given: the planned options the command set (from any source: flags,
    LLAMA_ARG_*, config files)."""
    import shlex

    user_set = {"-c": "-c" in given, "-ngl": "-ngl" in given, "-ts": "-ts" in given,
                "-ot": bool({"-ot", "-cmoe", "-ncmoe", "-ncffn"} & given)}
    extra = shlex.split(fitted)
    out = list(command)
    for flag, value in zip(extra[::2], extra[1::2]):
        if not user_set[flag]:
            out += [flag, value]
    return out


def select_devices(params: Params, names: Optional[list[str]]) -> Params:
    """-dev NAME,...: only these devices (none with `-dev none`). schedplan plans devices in
    llama.cpp's default order, RPC servers first, then each backend's devices by index, so a list
    must keep that order and take each backend's devices from its first (CUDA0, then CUDA1, ...)."""
    if names is None:
        return params
    from ..planner.devices import parse_device
    rpc = [f"RPC{i}" for i in range(len(params.rpc))]
    local = [s for s in params.devices if s != "none"]
    kinds = [parse_device(s).kind for s in local]
    ggml_names = {"cuda": "CUDA", "metal": "MTL", "vulkan": "Vulkan"}
    local_names = [f"{ggml_names[k]}{kinds[:i].count(k)}" for i, k in enumerate(kinds)]
    unknown = [n for n in names if n not in rpc + local_names]
    if unknown:
        raise ServerArgsError(f"-dev {','.join(names)}: invalid device: {unknown[0]} (devices here: "
                              f"{', '.join(rpc + local_names) or 'none'})")
    keep_rpc = [n for n in names if n in rpc]
    keep_local = [n for n in names if n in local_names]
    prefix = keep_rpc == rpc[:len(keep_rpc)] and all(
        [n for n in keep_local if n.startswith(g)] == [f"{g}{i}" for i in range(sum(n.startswith(g) for n in keep_local))]
        for g in ggml_names.values())
    if names != keep_rpc + keep_local or not prefix:
        raise ServerArgsError(f"-dev {','.join(names)}: schedplan plans devices in llama.cpp's default order (RPC "
                              "servers, then each backend's devices from its first): other orders and subsets are "
                              "not planned yet")
    rpc_memory = params.rpc_memory[:len(keep_rpc)] if params.rpc_memory else ()
    return replace(params, rpc=params.rpc[:len(keep_rpc)], rpc_memory=rpc_memory,
                   devices=tuple(s for s, n in zip(local, local_names) if n in keep_local) or ("none",))


# --- router mode (tools/server/server-models.cpp) ---------------------------------------------------

# unset_reserved_args: what the router does not pass to its children (with the model's own options
# when they come from the router's command line)
RESERVED = ("LLAMA_ARG_SSL_KEY_FILE", "LLAMA_ARG_SSL_CERT_FILE", "LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE",
            "LLAMA_ARG_MODELS_DIR", "LLAMA_ARG_MODELS_MAX", "LLAMA_ARG_MODELS_PRESET", "LLAMA_ARG_MODELS_AUTOLOAD")
RESERVED_MODEL = ("LLAMA_ARG_MODEL", "LLAMA_ARG_MMPROJ", "LLAMA_ARG_ALIAS", "LLAMA_ARG_HF_REPO")
DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")


def unset(preset: Preset, envs: tuple[str, ...]) -> None:
    for key in [k for k, (o, _) in preset.options.items() if o.env in envs]:
        del preset.options[key]


def set_option(preset: Preset, env: str, value: str) -> None:
    o = KEY_TO_OPT[env]
    preset.options[o.key] = (o, value)


def preset_from_args(argv: list[str]) -> Preset:
    """common_params_to_map: each flag to its option, "1"/"0" for a flag without a value."""
    preset = Preset("default")
    for e in argv_events(argv):
        preset.options[e.option.key] = (e.option, e.value)
    return preset


def to_args(preset: Preset) -> list[str]:
    """common_preset::to_args: each option's last (long) flag in std::map order, its value after
    it; a flag option with a falsey value becomes its negative flag, or is dropped."""
    out = []
    for key in sorted(preset.options, key=lambda k: k.encode()):
        o, value = preset.options[key]
        if o in PRESET_OPTIONS:
            continue
        if not o.value:
            if is_falsey(value):
                if o.args_neg:
                    out.append(o.args_neg[-1])
                continue
            out.append(o.args[-1])
        else:
            out += [o.args[-1], value]
    return out


def models_dir_presets(models_dir: str) -> dict[str, Preset]:
    """common_preset_context::load_from_models_dir: each .gguf file of the folder, and each subfolder
    (its first shard, else its model file; an mmproj file beside it; a draft file, mtp-/dspark-/dflash-)."""
    root = Path(models_dir)
    if not root.is_dir():
        raise ServerArgsError(f"'{models_dir}' does not exist or is not a directory")
    models: list[tuple[str, str, str, str]] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            model = shard = mmproj = draft = ""
            for f in sorted(entry.iterdir()):
                if f.is_dir() or not f.name.endswith(".gguf"):
                    continue
                if "mmproj" in f.name:
                    mmproj = str(f)
                elif f.name.startswith(DRAFT_PREFIXES):
                    draft = draft or str(f)
                elif "-00001-of-" in f.name:
                    shard = str(f)
                else:
                    model = str(f)
            if shard or model:
                models.append((entry.name, shard or model, mmproj, draft))
        elif entry.name.endswith(".gguf") and "mmproj" not in entry.name and not entry.name.startswith(DRAFT_PREFIXES):
            models.append((entry.name.replace(".gguf", ""), str(entry), "", ""))
    out = {}
    for name, path, mmproj, draft in models:
        preset = Preset(name)
        set_option(preset, "LLAMA_ARG_MODEL", path)
        if mmproj:
            set_option(preset, "LLAMA_ARG_MMPROJ", mmproj)
        if draft:
            set_option(preset, "LLAMA_ARG_SPEC_DRAFT_MODEL", draft)
        out[name] = preset
    return out


def router_children(argv: list[str], p: ServerParams) -> dict[str, list[str]]:
    """server_models::load_models: per model of --models-dir and --models-preset, the arguments its
    child llama-server gets (the HF cache's models, which the router also lists, are not read)."""
    base = preset_from_args(argv)
    unset(base, RESERVED + RESERVED_MODEL + ("LLAMA_ARG_LOG_FILE",))
    local = models_dir_presets(p.models_dir) if p.models_dir else {}
    global_preset, custom = load_presets(Path(p.models_preset), ignore_unknown=False) if p.models_preset \
        else (Preset("*"), {})

    def cascade(presets: dict[str, Preset]) -> dict[str, Preset]:
        out = {}
        for name, preset in presets.items():
            merged = Preset(name, dict(global_preset.options))
            merged.merge(preset)
            out[name] = merged
        return out

    final = cascade(local)
    for name, preset in cascade(custom).items():
        if name in final:
            final[name].merge(preset)
        else:
            final[name] = preset
    children = {}
    for name, preset in final.items():
        preset.merge(base)
        unset(preset, RESERVED)
        children[name] = to_args(preset)
    return children
