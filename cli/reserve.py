"""`schedplan reserve`: what llama.cpp will reserve for a model, and why."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
from tabulate import tabulate

from .errors import fail_cleanly
from ..planner.devices import BadDevices
from .options import SERVER_NAMES, draft_options, fit_target_option, mmproj_options, model_options, plan_options
from ..planner.params import Params

MiB = 1024 * 1024


def mib(n: int) -> str:
    return f"{n / MiB:.2f}"


def count(n: int | None) -> str:
    """A figure with thousands separators; "-" where a side has none."""
    return "-" if n is None else f"{n:,}"


def signed(delta: int) -> str:
    """A change with its sign; plain "0" when nothing changed."""
    return f"{delta:+,}" if delta else "0"


@click.command()
@model_options()
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- llama-server ARGS]")
@plan_options
@mmproj_options
@draft_options
@click.option("--tensors", is_flag=True, help="List every tensor of the graph with its buffer and offset.")
@click.option("--peak", is_flag=True,
              help="For each compute buffer, the node at which the graph's allocation peaks (numbered as "
                   "--tensors numbers nodes) and the tensors holding memory then, by offset.")
@click.option("--graph", "graph", type=click.Choice(["pp", "tg"]), default="pp", show_default=True,
              help="Which graph --tensors and --peak show.")
@fit_target_option("Memory to keep free per device, in MiB, for the verdict on devices of known memory "
                   "(as --fit keeps it)  [default: 1024]")
@click.option("--json", "as_json", is_flag=True,
              help="Print the machine-readable result (peaks of both graphs included, under \"peaks\").")
def reserve(model: str, server_args: tuple[str, ...], params: Params, mmproj, draft, tensors: bool, peak: bool,
            graph: str, fit_target: list[int] | None, as_json: bool) -> None:
    """Plan the buffers llama.cpp reserves for MODEL (a GGUF file; only its header is read).

    MODEL may be the first part of a split GGUF (NAME-00001-of-0000N.gguf: the other parts are read
    beside it), or an http(s) URL of either (also as -mu URL), or the file llama.cpp picks in a
    Hugging Face repository (-hf USER/MODEL[:QUANT], -hff FILE): then only the header is fetched,
    by range requests, and cached (see --no-header-cache).

    Prints, per buffer type, the compute buffer (the worst case of the pp and tg graphs), the KV
    cache, the output buffer and the model weights, in MiB and bytes; pp and tg graph nodes and
    splits; and the effective parameters after llama.cpp's adjustments (n_ctx padding, flash
    attention resolution). Flags use llama.cpp's names and llama-server's defaults.

    When every device's memory is known (--device, --rpc-memory), also what the model would use on
    each against its free memory: fits with how much to spare beyond the -fitt margin, or short by
    how much (`schedplan fit` finds the flags that fit). Without --device and --rpc, the devices
    are this machine's (`schedplan devices`); `--device none`: the CPU alone.

    A llama-server command line as it is: `schedplan reserve -- llama-server -m MODEL ARGS` plans
    what that command reserves (llama-server's flags, LLAMA_ARG_* variables and defaults as
    `schedplan fit -- llama-server` reads them), with --fit off as given, or with the flags --fit
    picks; its projector as below. With speculative decoding the model's context is the one
    llama-server creates (MTP drafting: the NextN block loaded, recurrent-state snapshots).

    With a draft model (-md FILE, and -ngld, -ctkd, -ctvd; or llama-server's draft flags) also what
    llama-server creates after the model: the draft's weights and its context, at the model's
    context size, with its compute, KV and output buffers. A Gemma 4 assistant's context reads the
    model's token embedding and K/V cache (ctx_other): it holds no KV buffer of its own.

    With a multimodal projector (-mm FILE, -mmu URL, or the mmproj-*.gguf -hf picks unless
    --no-mmproj), also what llama-server loads beside the model: per encoder its weights and its
    warm-up graph's compute buffers per buffer type, and per device the bytes llama-server adds to
    --fit's targets (mtmd_get_memory_usage); the projector's device is chosen as llama-server
    chooses it (the first GPU device; --no-mmproj-offload, -mmdev).

    Example: schedplan reserve model.gguf -c 8192 -ub 512 -fa on
    """
    from . import detection
    from .devices import for_this_machine, needs_detection
    if Path(model).name not in SERVER_NAMES and not server_args and needs_detection(params):
        detection.start()    # the devices are detected while the planner imports and the header is read
    from ..planner.download import read_model_header
    from ..planner.reserve import reserve as plan

    from .run import with_draft

    header = None
    with fail_cleanly():
        if Path(model).name in SERVER_NAMES:
            if draft is not None:
                raise click.UsageError("with `-- llama-server ARGS`, give the draft model after llama-server")
            model, params, fit_target, mmproj, extra, server = server_plan(model, list(server_args), params)
        elif server_args:
            raise click.UsageError(f"got unexpected extra arguments ({' '.join(server_args)})")
        else:
            header = read_model_header(model, params.header_cache)
            params, _ = for_this_machine(params)
            params, extra = with_draft(model, params, draft)
            server = None
        result = plan(model, params, tensors=tensors, graph=graph, margins=fit_target, mmproj=mmproj, header=header,
                      draft=extra, server=server)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(render(result))
    if peak:
        click.echo("")
        click.echo(peaks_section(result["peaks"][graph], graph))


def server_plan(argv0: str, argv: list[str], declared: Params):
    """(model, Params, -fitt, projector, draft, ServerLife) of a llama-server command line: its
    context as llama-server creates it (cli/rank.py prepare), as given with --fit off, else with what
    --fit picks (what `schedplan fit -- llama-server` prints); the draft model llama-server then
    loads, or the MTP context over the model's own NextN block; and what decides its allocations
    after startup. After --fit the draft's tensor split is the fitted one: common_fit_params writes
    it into common_params::tensor_split, which common_base_params_to_speculative copies for the
    draft; the MTP context is created over the fitted model, with the fitted context parameters
    (common_fit_params measured it with the parameters as they were before fitting)."""
    from . import llama_server as ls
    from ..planner.server import SpecParams, draft_after_fit, draft_types_from_gguf
    from ..planner.server_life import ServerLife
    from .fit import given_options, server_jobs
    from .rank import fit_job, prepare

    extra = given_options({"devices", "rpc", "rpc_memory", "no_header_cache", "tensors", "peak", "graph", "as_json"})
    if extra:
        raise click.UsageError("with `-- llama-server ARGS`, give the plan flags after llama-server; before it only "
                               f"--device, --rpc, --rpc-memory (got {' '.join(extra)})")
    jobs, single = server_jobs(argv0, argv, declared, None, for_fit=False)
    if not jobs or not single:
        raise click.UsageError("reserve plans one model: give llama-server's -m, -mu or -hf (`schedplan fit` fits "
                               "router mode's models)")
    job = jobs[0]
    if job.error:
        raise BadDevices(job.error)
    params, draft, _ = prepare(job)
    parsed = ls.parse(argv).params
    server = ServerLife(draft_types_from_gguf(job.spec or SpecParams(), params.header_cache))
    if not parsed.fit:
        return job.model, params, job.margins, job.mmproj, draft, server
    try:
        result = fit_job(job).result
    except RuntimeError as e:
        raise BadDevices(str(e)) from None
    if result.status != 0:
        raise BadDevices(f"llama-server's --fit would fail ({result.message}); llama-server then loads the flags as "
                         f"given: add -fit off to plan those")
    if draft is not None:
        draft = draft_after_fit(draft, result.params)
    return job.model, result.params, job.margins, job.mmproj, draft, server


def render(result: dict) -> str:
    """The human-readable report of a reserve result (plan or real run: same schema)."""
    out = [_params_line(result), *(f"llama.cpp warns: {w}" for w in result.get("warnings", [])), "",
           buffers_table(result), *(["", *lora_lines(result["lora"])] if "lora" in result else []),
           *(["", cvec_line(result["control_vector"])] if "control_vector" in result else []), "",
           graphs_table(result)]
    if "projector" in result:
        out += ["", projector_section(result["projector"])]
    if "device_memory" in result:
        out += ["", device_memory_table(result["device_memory"])]
    if "splits" in result:
        out += ["", splits_table(result["splits"])]
    if "tensors" in result:
        out += ["", tensors_table(result["tensors"])]
    if "draft" in result:
        d = result["draft"]
        title = ("MTP context over the model's NextN block (the model's weights), created after the model's:"
                 if d.get("shares_model") else "draft model, its context created after the model's:")
        out += ["", title, _params_line(d), "", buffers_table(d), "", graphs_table(d)]
    if "after_startup" in result:
        out += ["", after_startup_section(result["after_startup"])]
    return "\n".join(out)


def after_startup_section(a: dict) -> str:
    """What llama-server allocates after the startup reservation (planner/server_life.py): per
    context, the output buffer after the draft's startup decode and the first request, and the
    compute buffers it reserves again; then the growth over the startup reservation."""
    out = ["after startup (llama-server: speculative decoding set up, the draft's startup decode, the first request):"]
    grown = 0
    for role in ("model", "draft"):
        if role not in a:
            continue
        c = a[role]
        sizes = " -> ".join(f"{mib(s)} MiB" for s in c["output_history"])
        buft = next(iter(c["output_buffers"]))
        turned_on = [f"last hidden state {c['embeddings_nextn']}" if c["embeddings_nextn"] else "",
                     f"inputs of layers {', '.join(map(str, c['layer_inp']))}" if c["layer_inp"] else "",
                     "backend samplers" if c["samplers"] else ""]
        turned_on = ", ".join(t for t in turned_on if t) or "nothing"
        out.append(f"  {role}: {turned_on}; {buft} output buffer {sizes} "
                   f"({c['output_history'][-1]:,} bytes, for {c['n_outputs_reserved']} outputs)")
        grown += c["output_history"][-1] - c["output_history"][0]
        if c["compute_reserved_again"]:
            sizes = ", ".join(f"{buft} {mib(size)} MiB ({size:,} bytes)" for buft, size in c.get("compute_buffers", {}).items())
            out.append(f"  {role}: compute buffers reserved again {c['compute_reserved_again']}"
                       + (f": {sizes}" if sizes else ""))
        if c.get("note"):
            out.append(f"  {role}: {c['note']}")
        if c.get("first_request_aborts"):
            out.append(f"  {role}: llama-server aborts at the first request: {c['first_request_aborts']}")
    unplanned = any(a[r]["compute_reserved_again"] and "compute_buffers" not in a[r] for r in a)
    out.append(f"  output buffers (host memory) grow by {mib(grown)} MiB ({grown:,} bytes) over the startup reservation"
               + ("; some compute buffers reserved again are not planned" if unplanned else ""))
    return "\n".join(out)


def projector_section(p: dict) -> str:
    """The projector's encoders (weights and warm-up compute buffers per buffer type), then the
    bytes per device llama-server adds to --fit's targets."""
    out = []
    for e in p["encoders"]:
        fa = "on" if e["flash_attn"] else "off"
        out.append(f"projector {p['path']}: {e['projector_type']} ({e['modality']}) on {e['device']}, output n_embd "
                   f"{e['n_embd']}, warm-up {e['warmup_size'][0]}x{e['warmup_size'][1]}: {e['nodes']} nodes, "
                   f"{e['splits']} splits, flash attention {fa}")
        bufts = sorted(set(e["weights"]) | set(e["compute_buffers"]))
        rows = []
        for buft in bufts:
            w, c = e["weights"].get(buft, 0), e["compute_buffers"].get(buft, 0)
            rows.append([buft, mib(w), mib(c), mib(w + c), f"{w + c:,}"])
        out.append(tabulate(rows, headers=["buffer type", "weights MiB", "compute MiB", "total MiB", "total bytes"],
                            disable_numparse=True, colalign=("left",) + ("right",) * 4))
    if "gen_audio" in p:
        g = p["gen_audio"]
        weights = ", ".join(f"{buft} {mib(size)} MiB ({size:,} bytes)" for buft, size in g["weights"].items())
        out.append(f"projector gen-audio part: {g['projector_type']} on {g['device']}, output n_embd {g['n_embd']}: "
                   f"weights {weights}, no warm-up (clip_init), not in mtmd_get_memory_usage")
    usage = ", ".join(f"{dev} {mib(size)} MiB ({size:,} bytes)" for dev, size in p["memory_usage"].items())
    out.append(f"per device, what llama-server adds to --fit's targets (mtmd_get_memory_usage): {usage}")
    return "\n".join(out)


def device_memory_table(rows: list[dict]) -> str:
    """Per device: what the plan uses there against its free memory and --fit's margin."""
    table = []
    for d in rows:
        spare = d["projected_free"] - d["target"]
        verdict = f"fits, {mib(spare)} MiB to spare" if spare >= 0 else f"short by {mib(-spare)} MiB"
        table.append([d["device"], mib(d["free"]), mib(d["model"] + d["context"] + d["compute"] + d.get("projector", 0)
                                                            + d.get("draft", 0) + d.get("adapters", 0)),
                      mib(d["projected_free"]), mib(d["target"]), verdict])
    return tabulate(table, headers=["device", "free MiB", "used MiB", "left MiB", "target MiB", "verdict"],
                    disable_numparse=True, stralign="right")


def _params_line(result: dict) -> str:
    m, p = result["model"], result["params"]
    fa = "on" if p["flash_attn"] else "off"
    return (f"{m['path']}: {m['arch']}, {m['n_layer']} layers, n_embd {m['n_embd']}, n_vocab {m['n_vocab']}\n"
            f"n_ctx {p['n_ctx']} (per sequence {p['n_ctx_seq']}), n_batch {p['n_batch']}, n_ubatch {p['n_ubatch']}, "
            f"n_seq_max {p['n_seq_max']}, flash attention {fa}, K {p['type_k']}, V {p['type_v']}, "
            f"sched copies {p['sched_copies']}")


def buffers_table(result: dict) -> str:
    kinds = [("model", "model_buffers"), ("KV", "kv_buffers"), ("output", "output_buffers"),
             ("compute", "compute_buffers")]
    sections = {key: result.get(key, {}) for _, key in kinds}
    if "control_vector" in result:     # the control vectors' buffers, beside the model's
        kinds.insert(1, ("cvec", "control_vector"))
        sections["control_vector"] = result["control_vector"].get("buffers", {})
    if "lora" in result:     # the LoRA adapters' buffers, beside the model's
        kinds.insert(1, ("LoRA", "lora"))
        sections["lora"] = result["lora"]["buffers"]
    bufts = sorted({b for _, key in kinds for b in sections[key]})
    rows = []
    for buft in bufts:
        sizes = [sections[key].get(buft, 0) for _, key in kinds]
        rows.append([buft, *(mib(s) for s in sizes), mib(sum(sizes)), f"{sum(sizes):,}"])
    totals = [sum(sections[key].values()) for _, key in kinds]
    rows.append(["total", *(mib(s) for s in totals), mib(sum(totals)), f"{sum(totals):,}"])
    headers = ["buffer type", *(f"{k} MiB" for k, _ in kinds), "total MiB", "total bytes"]
    return tabulate(rows, headers=headers, disable_numparse=True, colalign=("left",) + ("right",) * (len(kinds) + 2))


def cvec_line(c: dict) -> str:
    """The control vectors: their files, the layers they are added to, whether applied."""
    files = ", ".join(f"{f['path']} (strength {f['scale']:g})" for f in c["files"])
    if not c["applied"]:
        return f"control vectors {files}: not applied (llama.cpp could not: see its warnings)"
    return (f"control vectors {files}: added to layers {c['layer_range'][0]}..{c['layer_range'][1]}; the compute "
            f"buffers reserved again with them")


def lora_lines(lora: dict) -> list[str]:
    """Each LoRA adapter (its tensors and buffers), and whether the compute buffers are those of
    the graphs with its matmuls."""
    out = []
    for a in lora["adapters"]:
        bufs = ", ".join(f"{buft} {mib(size)} MiB ({size:,} bytes)" for buft, size in a["buffers"].items())
        out.append(f"LoRA adapter {a['path']}: scale {a['scale']:g}, alpha {a['alpha']:g}, {a['n_tensors']} tensors; "
                   f"{bufs or 'no buffer'}")
    before = ", ".join(f"{buft} {mib(size)} MiB" for buft, size in lora["compute_buffers_before"].items())
    if lora["applied"]:
        out.append(f"compute buffers: reserved again with the adapters applied (at the warm-up decode, a new "
                   f"scheduler); before, {before}")
    else:
        out.append("compute buffers: the adapters are loaded, not applied (the graphs have no LoRA matmuls)")
    return out


def graphs_table(result: dict) -> str:
    g = result["graphs"]
    rows = [[key, g["pp"][key], g["tg"][key]] for key in ("n_tokens", "n_seqs", "n_outputs", "nodes", "splits")]
    return tabulate(rows, headers=["graph", "pp", "tg"], disable_numparse=True)


def splits_table(splits: dict) -> str:
    rows = []
    for graph in ("pp", "tg"):
        for sp in splits[graph]:
            inputs = sp["inputs"]
            rows.append([graph, sp["index"], sp["backend"], f"{sp['nodes'][0]}-{sp['nodes'][1] - 1}",
                         f"{sp['first']} .. {sp['last']}", len(inputs), mib(sum(i["size"] for i in inputs))])
    return tabulate(rows, headers=["graph", "split", "backend", "nodes", "first .. last", "inputs", "inputs MiB"],
                    disable_numparse=True)


def tensors_table(tensors: list[dict]) -> str:
    rows = [[t["index"] if t["index"] is not None else "", t["name"], t["op"], "x".join(map(str, t["ne"])),
             t["type"], t.get("backend") or "", t["buffer"] or "", t["offset"] if t["offset"] is not None else "",
             t["size"], "*" if t.get("at_peak") else ""] for t in tensors]
    return tabulate(rows, headers=["#", "name", "op", "ne", "type", "backend", "buffer", "offset", "size", "peak"],
                    disable_numparse=True)


def peak_at(peak: dict) -> str:
    """Where a buffer peaks: its size and the node being allocated then."""
    where = (f"node {peak['node']} {peak['node_name']} ({peak['node_op']})" if peak["node"] >= 0
             else "before the first node (leafs and inputs)")
    return f"{mib(peak['size'])} MiB ({peak['size']:,} bytes) at {where}"


def peak_table(peak: dict) -> str:
    rows = [[f"{t['offset']:,}", f"{t['size']:,}", mib(t["size"]), t["name"], t["op"]] for t in peak["tensors"]]
    return tabulate(rows, headers=["offset", "size", "MiB", "tensor", "op"], disable_numparse=True,
                    colalign=("right", "right", "right", "left", "left"))


def peaks_section(peaks: dict, graph: str) -> str:
    """Per compute buffer type: where the graph's allocation peaks and the tensors alive then."""
    return "\n\n".join(f"{buft} compute buffer, {graph} graph: peak {peak_at(peak)}, "
                       f"{len(peak['tensors'])} tensors hold memory:\n{peak_table(peak)}" for buft, peak in peaks.items())
