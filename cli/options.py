"""The flags shared by every command that plans or runs a model (llama.cpp's names)."""
from __future__ import annotations

import functools
import re
import struct
from typing import Callable, Optional

import click

from .errors import fail_cleanly
from ..planner.devices import DEVICE_SPEC_HELP, BadDevices, parse_device, parse_size
from ..planner.download import is_url
from ..planner.hparams import LLAMA_MAX_LAYERS, LLAMA_POOLING_TYPES
from ..planner.params import KV_TYPES, BadKvOverride, KvOverride, Params, parse_csv_row, parse_kv_overrides



INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
LLAMA_MAX_DEVICES = 16              # llama_max_devices()
SERVER_NAMES = ("llama-server", "llama-server.exe")   # `reserve/fit -- llama-server ARGS`
FLT_MIN = 1.1754943508222875e-38    # the smallest normal float: below it strtof reports ERANGE

# What std::stoi / std::stof read in full (ASCII digits, C float syntax). They also accept a valid
# prefix ("12abc" is 12, "1_000" is 1): schedplan refuses those instead of guessing.
_C_INT = re.compile(r"\s*[+-]?[0-9]+\s*")
_C_FLOAT = re.compile(r"\s*[+-]?(inf(inity)?|nan|0x([0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(p[+-]?[0-9]+)?"
                      r"|([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?)\s*", re.IGNORECASE)


class Int32(click.ParamType):
    """An integer flag that llama.cpp's common/arg.cpp reads with std::stoi into an int: a value
    outside 32 bits (or outside [min, max]) is one line, not a number llama.cpp never sees."""
    name = "integer"

    def __init__(self, min: int = INT32_MIN, max: int = INT32_MAX):
        self.min, self.max = min, max

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            n = value
        elif isinstance(value, str) and _C_INT.fullmatch(value):
            n = int(value)
        else:
            self.fail(f"{value!r} is not an integer", param, ctx)
        if not INT32_MIN <= n <= INT32_MAX:
            self.fail(f"{n} does not fit the 32-bit int llama.cpp reads it into (std::stoi: "
                      f"{INT32_MIN}..{INT32_MAX})", param, ctx)
        if not self.min <= n <= self.max:
            self.fail(f"{n} is not in the range {self.min}..{self.max}", param, ctx)
        return n

    def __repr__(self) -> str:
        return f"Int32({self.min}, {self.max})"


def _stof(text: str) -> float:
    """std::stof of a whole number: C float syntax (nan and inf included), refused where stof
    throws out_of_range (beyond the float range, or below the smallest normal float)."""
    if not _C_FLOAT.fullmatch(text):
        raise ValueError(f"{text!r} is not a number")
    t = text.strip().lower()
    sign = -1.0 if t.startswith("-") else 1.0
    body = t.lstrip("+-")
    x = sign * (float.fromhex(body) if body.startswith("0x") else float(body))
    try:
        f = struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        raise ValueError(f"{text.strip()} is out of the range of a float") from None
    if f != 0.0 and abs(f) < FLT_MIN or f == 0.0 and x != 0.0:
        raise ValueError(f"{text.strip()} is out of the range of a float (below {FLT_MIN:g})")
    return f


def _kv_overrides(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[KvOverride, ...]:
    """--override-kv KEY=TYPE:VALUE[,...], repeatable: each flag's handler appends its items in order."""
    out = []
    for value in values:
        try:
            out += parse_kv_overrides(value)
        except BadKvOverride as e:
            raise click.BadParameter(f"{e} (llama.cpp refuses it: \"Invalid type for KV override\")") from None
    return tuple(out)


def _parse_tensor_split(value: str | None) -> tuple[float, ...]:
    """-ts as common/arg.cpp reads it: split on runs of ',' and '/', at most LLAMA_MAX_DEVICES - 1
    proportions, each a float (std::stof)."""
    if not value:
        return ()
    parts = re.split(r"[,/]+", value)
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()                          # std::sregex_token_iterator drops an empty last field
    if len(parts) >= LLAMA_MAX_DEVICES:
        raise click.BadParameter(f"got {len(parts)} proportions, but llama.cpp allows at most "
                                 f"{LLAMA_MAX_DEVICES - 1} (llama_max_devices() is {LLAMA_MAX_DEVICES})",
                                 param_hint="'-ts' / '--tensor-split'")
    try:
        return tuple(_stof(x) for x in parts)
    except ValueError as e:
        raise click.BadParameter(f"{e}; expected numbers separated by ',' or '/', got {value!r}",
                                 param_hint="'-ts' / '--tensor-split'") from None

# common.h: the patterns --cpu-moe / --n-cpu-moe / --n-cpu-ffn add as tensor overrides to the CPU
LLM_FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
LLM_FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."


def _overrides(ctx: click.Context) -> list[tuple[str, str]]:
    """The tensor overrides in the order their flags first appear (click processes given options
    in command-line order), as common/arg.cpp appends them."""
    return ctx.meta.setdefault("schedplan.tensor_overrides", [])


def _add_overrides(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """-ot REGEX=BUFTYPE[,REGEX=BUFTYPE...] (parse_tensor_buffer_overrides)"""
    for value in values:
        for item in value.split(","):
            pattern, sep, buft = item.partition("=")
            if not sep or not pattern or not buft:
                raise click.BadParameter(f"expected REGEX=BUFTYPE, got {item!r}")
            _overrides(ctx).append((pattern, buft))
    return values


def _add_cpu_moe(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    """-cmoe: llm_ffn_exps_cpu_override()"""
    if value:
        _overrides(ctx).append((LLM_FFN_EXPS_REGEX, "CPU"))
    return value


def _add_n_cpu(regex: str):
    def callback(ctx: click.Context, param: click.Parameter, value: int) -> int:
        """llm_add_n_cpu_ffn_overrides: one 'blk\\.i<regex>' per layer i < N (no layer is numbered
        LLAMA_MAX_LAYERS or more, so patterns past it would match nothing)"""
        _overrides(ctx).extend((f"blk\\.{i}{regex}", "CPU") for i in range(min(value, LLAMA_MAX_LAYERS)))
        return value
    return callback


def _rpc_memory(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """--rpc-memory HOST:PORT=FREE[/TOTAL]: what that server would report (RPC_CMD_GET_DEVICE_MEMORY)."""
    out = {}
    for value in values:
        endpoint, sep, sizes = value.rpartition("=")
        free, _, total = sizes.partition("/")
        try:
            if not sep or not endpoint:
                raise BadDevices(f"expected HOST:PORT=FREE[/TOTAL], got {value!r}")
            out[endpoint] = (parse_size(free), parse_size(total or free))
        except BadDevices as e:
            raise click.BadParameter(str(e))
    return out


def _rpc_memory_list(rpc: tuple[str, ...], memory: dict[str, tuple[int, int]]) -> tuple:
    unknown = sorted(set(memory) - set(rpc))
    if unknown:
        raise click.BadParameter(f"{unknown[0]} is not one of the --rpc servers", param_hint="'--rpc-memory'")
    return tuple(memory.get(e) for e in rpc) if memory else ()


def _fit_targets(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[list[int]]:
    """-fitt MiB0,MiB1,... (common/arg.cpp): split on ',' and '/', each std::stoull MiB; one value
    applies to every device; at most llama_max_devices() - 1 values."""
    if value is None:
        return None
    parts = re.split(r"[,/]+", value)
    if len(parts) >= LLAMA_MAX_DEVICES:
        raise click.BadParameter(f"got {len(parts)} input configs, but system only has {LLAMA_MAX_DEVICES} devices")
    if not all(re.fullmatch(r"\s*\+?[0-9]+", p) for p in parts) or any(int(p) >= 2**64 // 2**20 for p in parts):
        raise click.BadParameter(f"{value!r} is not a list of MiB values")
    return [int(p) * 2**20 for p in parts]


def fit_target_option(help_text: str) -> Callable:
    """-fitt/--fit-target, the free memory --fit keeps per device; the command receives fit_target."""
    return click.option("-fitt", "--fit-target", "fit_target", metavar="MiB0,MiB1,...", callback=_fit_targets,
                        help=help_text)


def _check_devices(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """--device specs; `--device none` alone: no local devices (llama.cpp's -dev none), and none
    detected either."""
    if "none" in values:
        if len(values) > 1:
            raise click.BadParameter("'none' (no local devices) cannot be given with other devices")
        return ("none",)
    for value in values:
        try:
            parse_device(value)
        except BadDevices as e:
            raise click.BadParameter(str(e))
    return tuple(values)


def _rpc_endpoints(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """--rpc as common/arg.cpp's add_rpc_devices reads it: comma-separated servers, each one
    HOST:PORT as ggml-rpc's parse_endpoint accepts it (a ':' then what std::stoi reads as an int)."""
    endpoints = []
    for value in values:
        for endpoint in value.split(","):
            port = endpoint.partition(":")[2]
            digits = _C_INT.match(port)     # std::stoi reads the leading integer
            if ":" not in endpoint or not digits or not INT32_MIN <= int(digits.group()) <= INT32_MAX:
                raise click.BadParameter(f"'{endpoint}' is not HOST:PORT (ggml-rpc: failed to parse endpoint)")
            endpoints.append(endpoint)
    return tuple(endpoints)


POOLING_ORDER = "schedplan.pooling_order"
LORA_ORDER = "schedplan.lora_order"
CVEC_ORDER = "schedplan.control_vector_order"


class _InOrder(click.Option):
    """--pooling and --rerank (--lora and --lora-scaled): common/arg.cpp runs each flag's handler in
    command-line order, so the later one's pooling wins (the adapters are listed in that order); click
    keeps one value per option, so every occurrence is noted as the parser meets it, in
    ctx.meta[order_key] as (option name, value)."""

    def __init__(self, *args, order_key: str = POOLING_ORDER, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.order_key = order_key

    def add_to_parser(self, parser, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        for opt in self.opts:
            option = parser._long_opt.get(opt) or parser._short_opt.get(opt)
            option.process = _noting(option.process, ctx, self.name, self.order_key)


def _noting(process: Callable, ctx: click.Context, name: str, order_key: str) -> Callable:
    def noted(value, state) -> None:
        process(value, state)
        ctx.meta.setdefault(order_key, []).append((name, value))
    return noted


_STOF_PREFIX = re.compile(r"[ \t\n\v\f\r]*[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", re.I)


def lora_adapters(order: list[tuple[str, str]], what: str = "lora") -> tuple[tuple[str, float], ...]:
    """The adapters of --lora FNAME[,...] (scale 1) and --lora-scaled FNAME:SCALE[,...] in command-line
    order, as their handlers push them (common/arg.cpp: string_split on ':', std::stof of the scale);
    what="control_vector": --control-vector and --control-vector-scaled, alike.
    order: (option name, value), the scaled option's name ending in "_scaled". ValueError: a value
    the handler refuses."""
    out = []
    for name, value in order:
        for item in parse_csv_row(value):
            if not name.endswith("_scaled"):
                out.append((item, 1.0))
                continue
            parts = item.split(":")
            if len(parts) != 2:
                raise ValueError(f"{item!r}: {what.replace('_', '-')}-scaled format: FNAME:SCALE")
            m = _STOF_PREFIX.match(parts[1])
            if not m:
                raise ValueError(f"{item!r}: the scale is not a number (std::stof throws invalid_argument)")
            out.append((parts[0], float(m.group(0))))
    return tuple(out)


def plan_options(func: Callable) -> Callable:
    """Add llama.cpp's context and model flags; the command receives `params: Params`."""
    options = [
        click.option("-c", "--ctx-size", "n_ctx", type=Int32(min=0), default=0, show_default=True,
                     help="Context size; 0 = the model's training context."),
        click.option("-b", "--batch-size", "n_batch", type=Int32(min=1), default=2048, show_default=True,
                     help="Logical batch size."),
        click.option("-ub", "--ubatch-size", "n_ubatch", type=Int32(min=1), default=512, show_default=True,
                     help="Physical batch size: the pp graph is built for this many tokens."),
        click.option("-np", "--parallel", "n_seq_max", type=Int32(min=1, max=256), default=1,
                     show_default=True, help="Number of sequences (slots)."),
        click.option("-fa", "--flash-attn", "flash_attn", type=click.Choice(["on", "off", "auto"]), default="auto",
                     show_default=True, help="Flash attention."),
        click.option("-ctk", "--cache-type-k", "type_k", type=click.Choice(KV_TYPES), default="f16",
                     show_default=True, help="K cache type."),
        click.option("-ctv", "--cache-type-v", "type_v", type=click.Choice(KV_TYPES), default="f16",
                     show_default=True, help="V cache type."),
        click.option("-kvu", "--kv-unified", "kv_unified", is_flag=True,
                     help="One KV buffer shared by all sequences."),
        click.option("--swa-full", "swa_full", is_flag=True, help="Full-size SWA cache."),
        click.option("--embedding", "--embeddings", "embeddings", is_flag=True,
                     help="Compute embeddings (llama-server --embedding): the output buffer holds them too, the "
                     "graph ends in the pooling; -b becomes -ub where it is larger, as llama-server sets it."),
        click.option("--pooling", "pooling_type", cls=_InOrder, type=click.Choice(list(LLAMA_POOLING_TYPES)),
                     default=None, help="Pooling of the embeddings; default: the model's (none if it names none). "
                     "With --rerank, the later flag's pooling wins, as in llama.cpp."),
        click.option("--rerank", "--reranking", "rerank", cls=_InOrder, is_flag=True,
                     help="Reranking: --embedding with --pooling rank (the classification head)."),
        click.option("-ngl", "--n-gpu-layers", "n_gpu_layers", type=Int32(), default=-1, show_default=True,
                     help="Layers to offload to devices; -1 = all (the output layer counts as one)."),
        click.option("-sm", "--split-mode", "split_mode", type=click.Choice(["none", "layer", "row"]),
                     default="layer", show_default=True, help="How to split the model across devices."),
        click.option("-mg", "--main-gpu", "main_gpu", type=Int32(), default=0, show_default=True,
                     help="Device for the whole model with -sm none; negative: none (all on the CPU)."),
        click.option("-ts", "--tensor-split", "tensor_split", default=None,
                     help="Proportions of the model per device, e.g. 3,1."),
        click.option("-nkvo", "--no-kv-offload", "no_kv_offload", is_flag=True, help="Keep the KV cache on the CPU."),
        click.option("--no-op-offload", "no_op_offload", is_flag=True,
                     help="Do not offload host-weight ops to devices."),
        click.option("--no-host", "no_host", is_flag=True, help="Bypass host buffer types."),
        click.option("--no-repack", "no_repack", is_flag=True, help="Disable weight repacking (extra buffer types)."),
        click.option("-ot", "--override-tensor", "override_tensor", multiple=True, callback=_add_overrides,
                     help="REGEX=BUFTYPE: place matching weights in that buffer type (repeatable; "
                     "with -cmoe/-ncmoe/-ncffn, the first matching pattern in command-line order wins)."),
        click.option("-cmoe", "--cpu-moe", "cpu_moe", is_flag=True, callback=_add_cpu_moe,
                     help="Keep all mixture-of-experts weights on the CPU (-ot with llama.cpp's expert pattern)."),
        click.option("-ncmoe", "--n-cpu-moe", "n_cpu_moe", type=Int32(min=0), default=0,
                     callback=_add_n_cpu(LLM_FFN_EXPS_REGEX), metavar="N",
                     help="Keep the expert weights of the first N layers on the CPU."),
        click.option("-ncffn", "--n-cpu-ffn", "n_cpu_ffn", type=Int32(min=0), default=0,
                     callback=_add_n_cpu(LLM_FFN_DENSE_REGEX), metavar="N",
                     help="Keep the dense FFN weights of the first N layers on the CPU."),
        click.option("--override-kv", "kv_overrides", multiple=True, metavar="KEY=TYPE:VALUE[,...]",
                     callback=_kv_overrides,
                     help="Override the model's metadata as llama.cpp loads it (types int, float, bool, str; "
                     "comma-separated or repeated; the first override of a key wins), e.g. "
                     "qwen3moe.expert_used_count=int:4 or llama.context_length=int:8192."),
        click.option("--rpc", "rpc", multiple=True, metavar="HOST:PORT[,...]", callback=_rpc_endpoints,
                     help="ggml RPC servers to use as devices, comma-separated as llama.cpp takes them (repeatable)."),
        click.option("--rpc-memory", "rpc_memory", multiple=True, metavar="HOST:PORT=FREE[/TOTAL]",
                     callback=_rpc_memory,
                     help="The memory an RPC server reports (e.g. 127.0.0.1:50052=24GiB/32GiB; TOTAL defaults to "
                     "FREE), for a server that is not running: without -ts, layers are split in proportion to "
                     "the free memory, as llama.cpp does. `fit` asks running servers itself."),
        click.option("--no-header-cache", "no_header_cache", is_flag=True,
                     help="For a MODEL given as an http(s) URL: fetch its header again instead of using the copy "
                     "cached under ~/.cache/schedplan/headers (keyed by URL and ETag or size)."),
        click.option("--lora", "lora", cls=_InOrder, order_key=LORA_ORDER, multiple=True, metavar="FNAME[,...]",
                     help="LoRA adapters (scale 1), loaded and applied as llama-server does: their buffers, and the "
                     "compute buffers the graphs with their matmuls reserve."),
        click.option("--lora-scaled", "lora_scaled", cls=_InOrder, order_key=LORA_ORDER, multiple=True,
                     metavar="FNAME:SCALE[,...]",
                     help="LoRA adapters with their scales (a scale of 0 is not applied)."),
        click.option("--lora-init-without-apply", "lora_init_without_apply", is_flag=True,
                     help="Load the LoRA adapters without applying them (the compute buffers stay the plain graphs')."),
        click.option("--control-vector", "control_vector", cls=_InOrder, order_key=CVEC_ORDER, multiple=True,
                     metavar="FNAME[,...]", help="Control vectors (strength 1), applied as llama-server applies them: "
                     "one n_embd f32 tensor per layer 1..n_layer-1, and the graphs reserved again with their adds."),
        click.option("--control-vector-scaled", "control_vector_scaled", cls=_InOrder, order_key=CVEC_ORDER,
                     multiple=True, metavar="FNAME:SCALE[,...]", help="Control vectors with their strengths."),
        click.option("--control-vector-layer-range", "control_vector_layer_range", type=(Int32(), Int32()),
                     default=(0, 0), metavar="START END",
                     help="The layers the control vectors are added to (inclusive; default 1 to n_layer)."),
        click.option("--device", "devices", multiple=True, metavar="KIND:MEMORY[:KEY=VALUE...]",
                     callback=_check_devices,
                     help=DEVICE_SPEC_HELP + " total=SIZE: the device's total memory (default MEMORY). Without "
                     "--device and --rpc, `reserve` and `fit` plan for this machine's devices (`schedplan "
                     "devices`); `--device none`: for the CPU alone."),
    ]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        for name in ("override_tensor", "cpu_moe", "n_cpu_moe", "n_cpu_ffn"):   # gathered by their callbacks
            kwargs.pop(name)
        kwargs.pop("pooling_type")      # gathered in order (_InOrder)
        kwargs.pop("lora"), kwargs.pop("lora_scaled")
        kwargs.pop("control_vector"), kwargs.pop("control_vector_scaled")
        meta = click.get_current_context().meta
        try:
            lora = lora_adapters(meta.get(LORA_ORDER, []))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--lora-scaled'") from None
        try:
            cvecs = lora_adapters(meta.get(CVEC_ORDER, []), "control_vector")
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--control-vector-scaled'") from None
        cvec_start, cvec_end = kwargs.pop("control_vector_layer_range")
        embeddings, pooling_type = _embeddings(kwargs.pop("embeddings"), kwargs.pop("rerank"),
                                               meta.get(POOLING_ORDER, []))
        n_batch, n_ubatch = kwargs.pop("n_batch"), kwargs.pop("n_ubatch")
        if embeddings:   # tools/server/server.cpp: "setting n_batch = n_ubatch to avoid assertion failure"
            n_batch = min(n_batch, n_ubatch)
        kwargs["params"] = Params(
            n_ctx=kwargs.pop("n_ctx"), n_batch=n_batch, n_ubatch=n_ubatch, embeddings=embeddings, pooling_type=pooling_type,
            n_seq_max=kwargs.pop("n_seq_max"), flash_attn=kwargs.pop("flash_attn"),
            type_k=kwargs.pop("type_k"), type_v=kwargs.pop("type_v"), kv_unified=kwargs.pop("kv_unified"),
            swa_full=kwargs.pop("swa_full"), n_gpu_layers=kwargs.pop("n_gpu_layers"),
            split_mode=kwargs.pop("split_mode"), main_gpu=kwargs.pop("main_gpu"),
            tensor_split=_parse_tensor_split(kwargs.pop("tensor_split")),
            offload_kqv=not kwargs.pop("no_kv_offload"), op_offload=not kwargs.pop("no_op_offload"),
            no_host=kwargs.pop("no_host"), use_extra_bufts=not kwargs.pop("no_repack"),
            tensor_overrides=tuple(_overrides(click.get_current_context())), rpc=tuple(kwargs["rpc"]),
            rpc_memory=_rpc_memory_list(kwargs.pop("rpc"), kwargs.pop("rpc_memory")),
            devices=kwargs.pop("devices"), header_cache=not kwargs.pop("no_header_cache"),
            kv_overrides=kwargs.pop("kv_overrides"),
            lora=lora, lora_init_without_apply=kwargs.pop("lora_init_without_apply"), control_vectors=cvecs,
            control_vector_layer_start=cvec_start, control_vector_layer_end=cvec_end,
        )
        return func(*args, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def _embeddings(embedding: bool, rerank: bool, order: list[tuple[str, str]]) -> tuple[bool, str]:
    """(embeddings, pooling type) of --embedding, --rerank and --pooling as common/arg.cpp's handlers set
    them, in command-line order: --rerank sets embedding and pooling rank, --pooling the pooling (each
    value checked as its handler checks it: "invalid value"); the later one's pooling wins."""
    pooling = "unspecified"
    for name, value in order:
        if name == "rerank":
            pooling = "rank"
        elif value in LLAMA_POOLING_TYPES:
            pooling = value
        else:
            raise click.BadParameter(f"{value!r} is not one of {', '.join(map(repr, LLAMA_POOLING_TYPES))}",
                                     param_hint="'--pooling'")
    return embedding or rerank, pooling


def parse_params(args: list[str]) -> Params:
    """Params from llama.cpp-style flags, parsed exactly as the CLI parses them."""

    @click.command()
    @plan_options
    def _collect(params: Params) -> Params:
        return params

    return _collect.main(list(args), standalone_mode=False)


def parse_params_mmproj(args: list[str]):
    """(Params, MmprojParams or None) from llama.cpp-style flags, -mm FILE among them, parsed as the
    CLI parses them."""

    @click.command()
    @plan_options
    @mmproj_options
    def _collect(params: Params, mmproj):
        return params, mmproj

    return _collect.main(list(args), standalone_mode=False)


DRAFT_OVERRIDES = "schedplan.draft_overrides"   # click context meta: -otd/-cmoed/-ncmoed in command-line order


def _draft_overrides(ctx: click.Context, param: click.Parameter, value):
    """-otd REGEX=BUFTYPE[,...], -cmoed, -ncmoed N: the draft model's tensor overrides, appended in
    command-line order as common/arg.cpp appends them."""
    out = ctx.meta.setdefault(DRAFT_OVERRIDES, [])
    if param.name == "draft_override_tensor":
        for v in value:
            for item in v.split(","):
                pattern, sep, buft = item.partition("=")
                if not sep or not pattern or not buft:
                    raise click.BadParameter(f"expected REGEX=BUFTYPE, got {item!r}")
                out.append((pattern, buft))
    elif param.name == "draft_cpu_moe" and value:
        out.append((LLM_FFN_EXPS_REGEX, "CPU"))
    elif param.name == "draft_n_cpu_moe":
        out.extend((f"blk\\.{i}{LLM_FFN_EXPS_REGEX}", "CPU") for i in range(min(value, LLAMA_MAX_LAYERS)))
    return value


def _ngl_draft(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> int:
    """-ngld N|auto|all (common/arg.cpp): auto -1, all -2, else std::stoi."""
    if value is None or value == "auto":
        return -1
    if value == "all":
        return -2
    return Int32().convert(value, param, ctx)


def _spec_types(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """--spec-type a,b (repeatable): each value's types appended to the default ["none"], as
    common/arg.cpp appends them (common_speculative_types_from_names)."""
    from ..planner.server import spec_types_from_names

    types = ["none"]
    for value in values:
        try:
            types += spec_types_from_names(value.split(","))
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return tuple(types)


def spec_options(func: Callable) -> Callable:
    """llama-server's speculative decoding flags; the command receives `spec`: SpecParams (the
    draft model's file picked as -hf picks a model's, for -hfd)."""
    options = [
        click.option("-md", "--spec-draft-model", "--model-draft", "draft_model", metavar="FNAME",
                     help="A draft model for speculative decoding: llama-server fits it beside the model, its "
                     "context following the model's."),
        click.option("-hfd", "-hfrd", "--spec-draft-hf", "--hf-repo-draft", "draft_hf", metavar="<user>/<model>[:quant]",
                     help="The draft model as a Hugging Face repository (-md then names its file)."),
        click.option("-ngld", "--spec-draft-ngl", "--gpu-layers-draft", "--n-gpu-layers-draft", "draft_ngl",
                     metavar="N|auto|all", callback=_ngl_draft, help="The draft model's layers on devices (default: auto)."),
        click.option("-ctkd", "--spec-draft-type-k", "--cache-type-k-draft", "draft_type_k", type=click.Choice(KV_TYPES),
                     default="f16", show_default=True, help="The draft context's K cache type."),
        click.option("-ctvd", "--spec-draft-type-v", "--cache-type-v-draft", "draft_type_v", type=click.Choice(KV_TYPES),
                     default="f16", show_default=True, help="The draft context's V cache type."),
        click.option("-otd", "--spec-draft-override-tensor", "--override-tensor-draft", "draft_override_tensor",
                     multiple=True, callback=_draft_overrides, help="REGEX=BUFTYPE for the draft model's weights."),
        click.option("-cmoed", "--spec-draft-cpu-moe", "--cpu-moe-draft", "draft_cpu_moe", is_flag=True,
                     callback=_draft_overrides, help="Keep the draft model's experts on the CPU."),
        click.option("-ncmoed", "--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "--n-cpu-moe-draft", "draft_n_cpu_moe",
                     type=Int32(min=0), default=0, callback=_draft_overrides, metavar="N",
                     help="Keep the experts of the draft model's first N layers on the CPU."),
        click.option("--spec-draft-n-max", "draft_n_max", type=Int32(min=0), default=3, show_default=True,
                     help="Tokens drafted per step: with a draft type, llama-server keeps 1 + N outputs per slot."),
        click.option("--spec-type", "spec_types", multiple=True, callback=_spec_types,
                     help="Speculative decoding types, comma-separated (draft-simple, ngram-mod, ...)."),
    ]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from ..planner.server import SpecParams

        path, repo = kwargs.pop("draft_model"), kwargs.pop("draft_hf")
        for name in ("draft_override_tensor", "draft_cpu_moe", "draft_n_cpu_moe"):
            kwargs.pop(name)
        if repo:
            from ..planner.hf import common_download_get_hf_plan
            with fail_cleanly():
                path = common_download_get_hf_plan(repo, path or "").primary.url
        kwargs["spec"] = SpecParams(kwargs.pop("spec_types"), path, kwargs.pop("draft_ngl"), kwargs.pop("draft_type_k"),
                                    kwargs.pop("draft_type_v"),
                                    tuple(click.get_current_context().meta.get(DRAFT_OVERRIDES, [])),
                                    kwargs.pop("draft_n_max"))
        return func(*args, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


HF_PLAN = "schedplan.hf_plan"   # click context meta: the -hf plan, for the projector it picks
MMPROJ_DEVICE = "schedplan.mmproj_device"   # click context meta: (use_gpu, device) as the flags leave them
# click context meta: the projector settings for the one each -hf repository picks (path left empty),
# for commands that resolve -hf themselves (fit's several models); None: -mm, -mmu or --no-mmproj
MMPROJ_AUTO = "schedplan.mmproj_auto"


def _mmproj_device(ctx: click.Context, param: click.Parameter, value):
    """--[no-]mmproj-offload and -mmdev in command-line order, as common/arg.cpp applies them:
    -mmdev DEVICE turns offloading on (none: off), --no-mmproj-offload turns it off and keeps the
    device."""
    if value is None:
        return value
    use_gpu, device = ctx.meta.get(MMPROJ_DEVICE, (True, None))
    if param.name == "mmproj_offload":
        use_gpu = value
    elif value == "none":
        use_gpu, device = False, None
    else:
        use_gpu, device = True, value
    ctx.meta[MMPROJ_DEVICE] = (use_gpu, device)
    return value


def mmproj_options(func: Callable) -> Callable:
    """llama-server's projector flags; the command receives `mmproj`: MmprojParams, or None when no
    projector is loaded. -hf picks the repository's mmproj-*.gguf beside the model file as
    llama.cpp does (common/download.cpp find_best_mmproj) unless --no-mmproj, -mm or -mmu."""
    options = [
        click.option("-mm", "--mmproj", "mmproj_path", metavar="FILE",
                     help="A multimodal projector file (mmproj-*.gguf; also an http(s) URL): llama-server adds its "
                     "memory, weights and warm-up compute buffers per device, to the --fit targets."),
        click.option("-mmu", "--mmproj-url", "mmproj_url", metavar="URL",
                     help="The projector as an http(s) URL: only its header is fetched."),
        click.option("--mmproj-auto/--no-mmproj", " /--no-mmproj-auto", "mmproj_auto", default=True,
                     help="With -hf: load the projector llama.cpp picks in the repository (default: yes)."),
        click.option("--mmproj-offload/--no-mmproj-offload", "mmproj_offload", default=None, callback=_mmproj_device,
                     help="Run the projector on the first GPU device (default), or on the CPU."),
        click.option("-mmdev", "--mmproj-device", "mmproj_device", metavar="DEVICE", callback=_mmproj_device,
                     help="The device for the projector (RPC0, CUDA1, ...; none: the CPU)."),
        click.option("--image-min-tokens", "image_min_tokens", type=Int32(), default=-1, metavar="N",
                     help="Minimum tokens per image (dynamic-resolution vision models)."),
        click.option("--image-max-tokens", "image_max_tokens", type=Int32(), default=-1, metavar="N",
                     help="Maximum tokens per image (dynamic-resolution vision models)."),
        click.option("--warmup/--no-warmup", "warmup", default=True,
                     help="--no-warmup: no warm-up run, so the projector reserves no compute buffers."),
    ]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from ..planner.params import MmprojParams

        path, url, auto = kwargs.pop("mmproj_path"), kwargs.pop("mmproj_url"), kwargs.pop("mmproj_auto")
        kwargs.pop("mmproj_offload"), kwargs.pop("mmproj_device")
        use_gpu, device = click.get_current_context().meta.get(MMPROJ_DEVICE, (True, None))
        extra = {k: kwargs.pop(k) for k in ("image_min_tokens", "image_max_tokens", "warmup")}
        if path and url:
            raise click.UsageError("-mm and -mmu each name the projector: give one of them")
        if url and not is_url(url):
            raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="'-mmu' / '--mmproj-url'")
        auto = auto and not (path or url)
        click.get_current_context().meta[MMPROJ_AUTO] = MmprojParams("", use_gpu, device, **extra) if auto else None
        if auto:
            hf_plan = click.get_current_context().meta.get(HF_PLAN)
            if hf_plan is not None and hf_plan.mmproj is not None:
                url = hf_plan.mmproj.url
        kwargs["mmproj"] = MmprojParams(path or url, use_gpu, device, **extra) if (path or url) else None
        return func(*args, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def model_options(required: bool = True, then: Optional[str] = None) -> Callable:
    """MODEL, or llama.cpp's -mu URL or -hf USER/MODEL[:QUANT] (-hff FILE) in its place; the command
    receives `model`: the path or URL, for -hf the resolve URL of the file llama.cpp would download
    (planner/hf.py), None when it is not required and not given. `then` names the command's next
    positional argument (compare's MODEL_B): with -mu or -hf, a lone positional is that one."""
    options = [
        click.argument("model", required=False, type=click.Path(dir_okay=False)),
        click.option("-mu", "--model-url", "model_url", metavar="URL",
                     help="The model as an http(s) URL (of a file or a split's first part), as MODEL may also be "
                     "given: only its header is fetched, by range requests."),
        click.option("-hf", "-hfr", "--hf-repo", "hf_repo", metavar="<user>/<model>[:quant]",
                     help="The model as a Hugging Face repository: the file llama.cpp picks (the first GGUF "
                     "whose name has the quant, case-insensitive, followed by '.' or '-'; default Q4_K_M, then "
                     "Q8_0, then the first GGUF; a split's first part) is planned from its header, fetched by "
                     "range requests. HF_TOKEN authorizes, MODEL_ENDPOINT or HF_ENDPOINT replaces "
                     "https://huggingface.co/."),
        click.option("-hff", "--hf-file", "hf_file", metavar="FILE",
                     help="The file of the -hf repository to plan (its path in the repository), instead of the quant."),
    ]

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            model, url, repo, file = kwargs["model"], kwargs.pop("model_url"), kwargs.pop("hf_repo"), kwargs.pop("hf_file")
            if then is not None and (url or repo) and model is not None and kwargs[then] is None:
                model, kwargs[then] = None, model
            given = [name for name, value in (("MODEL", model), ("-mu", url), ("-hf", repo)) if value]
            if len(given) > 1:
                raise click.UsageError(f"{' and '.join(given)} each name the model: give one of them")
            if file and not repo:
                raise click.UsageError("-hff names a file of the -hf repository: give -hf too")
            if url and not is_url(url):
                raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="'-mu' / '--model-url'")
            if repo:
                from ..planner.hf import common_download_get_hf_plan
                with fail_cleanly():
                    plan = common_download_get_hf_plan(repo, file or "", download_mmproj=True)
                model = plan.primary.url
                click.get_current_context().meta[HF_PLAN] = plan   # mmproj_options reads the projector
            kwargs["model"] = model or url
            if required and kwargs["model"] is None:
                raise click.UsageError("missing MODEL (a GGUF file or http(s) URL), or -hf or -mu in its place")
            return func(*args, **kwargs)

        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper
    return decorate


def draft_options(func: Callable) -> Callable:
    """llama-server's draft-model flags; the command receives `draft`: the draft model's SpecParams
    (its file, -ngld, -ctkd, -ctvd; the speculative type as llama-server reads it from the draft's
    header), or None without -md."""
    options = [
        click.option("-md", "--model-draft", "--spec-draft-model", "draft_path", type=click.Path(dir_okay=False),
                     help="A draft model (speculative decoding), loaded after the model as llama-server loads it: "
                     "its weights and its context at the model's context size, beside the model's (a Gemma 4 "
                     "assistant reads the model's token embedding and K/V cache)."),
        click.option("-ngld", "--gpu-layers-draft", "--spec-draft-ngl", "draft_n_gpu_layers", type=Int32(), default=-1,
                     show_default=True, help="Layers of the draft model to offload to devices; -1 = all."),
        click.option("-ctkd", "--cache-type-k-draft", "--spec-draft-type-k", "draft_type_k", type=click.Choice(KV_TYPES),
                     default="f16", show_default=True, help="K cache type of the draft context."),
        click.option("-ctvd", "--cache-type-v-draft", "--spec-draft-type-v", "draft_type_v", type=click.Choice(KV_TYPES),
                     default="f16", show_default=True, help="V cache type of the draft context."),
    ]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        path, ngl = kwargs.pop("draft_path"), kwargs.pop("draft_n_gpu_layers")
        type_k, type_v = kwargs.pop("draft_type_k"), kwargs.pop("draft_type_v")
        draft = None
        if path:
            from ..planner.server import SpecParams, draft_types_from_gguf   # only here: it imports fit and mtmd
            with fail_cleanly():
                draft = draft_types_from_gguf(SpecParams(draft_path=path, n_gpu_layers=ngl, type_k=type_k,
                                                         type_v=type_v))
        return func(*args, draft=draft, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper
