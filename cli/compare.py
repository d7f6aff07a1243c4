"""`schedplan compare`: two plans (two flag sets, or two models) or the pp and tg graphs of one plan."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Optional

import click
from tabulate import tabulate

from .errors import die, fail_cleanly
from .flags import given_flags, label
from .options import model_options, parse_params, plan_options
from .reserve import count, mib, peak_at, signed
from ..planner.params import Params

KINDS = [("model", "model_buffers"), ("KV", "kv_buffers"), ("output", "output_buffers"),
         ("compute", "compute_buffers")]


@dataclass
class Side:
    label: str
    buffers: dict[tuple[str, str], int]   # (buffer type, kind) -> bytes
    counts: dict[str, int]                # graph nodes, splits, ...
    params: Optional[dict]                # effective parameters; None for one graph of a plan
    peaks: dict[str, dict]                # buffer type -> the peak that sizes its compute buffer, + "graph"


def plan_side(side_label: str, result: dict) -> Side:
    """A whole plan. A compute buffer is sized by the larger of the pp and tg graphs' needs (pp on a
    tie): its peak is that graph's."""
    buffers = {(buft, kind): size for kind, key in KINDS for buft, size in result[key].items()}
    counts = {f"{g} {k}": result["graphs"][g][k] for g in ("pp", "tg") for k in ("nodes", "splits")}
    peaks = {}
    for buft in result["compute_buffers"]:
        graph = max(("pp", "tg"), key=lambda g: result["graphs"][g]["buffers"].get(buft, 0))
        peaks[buft] = {**result["peaks"][graph][buft], "graph": graph}
    return Side(side_label, buffers, counts, result["params"], peaks)


def graph_side(result: dict, graph: str) -> Side:
    """One graph of a plan: what it alone needs per compute buffer type, and its peaks."""
    g = result["graphs"][graph]
    tokens = f"{g['n_tokens']} token{'s' if g['n_tokens'] != 1 else ''}"
    return Side(f"{graph} graph ({tokens})", {(buft, "compute"): s for buft, s in g["buffers"].items()},
                {k: g[k] for k in ("n_tokens", "n_outputs", "nodes", "splits")}, None,
                {buft: {**p, "graph": graph} for buft, p in result["peaks"][graph].items()})


@dataclass(frozen=True)
class Delta:
    name: str
    a: Optional[int]
    b: Optional[int]

    @property
    def delta(self) -> int:
        return (self.b or 0) - (self.a or 0)

    def pct(self) -> str:
        if not self.delta:
            return ""
        return f"{self.delta / self.a * 100:+.1f}%" if self.a else "new"


def buffer_deltas(a: Side, b: Side) -> list[tuple[str, str, Delta]]:
    order = {kind: i for i, (kind, _) in enumerate(KINDS)}
    keys = sorted(set(a.buffers) | set(b.buffers), key=lambda k: (k[0], order[k[1]]))
    return [(buft, kind, Delta(f"{buft} {kind}", a.buffers.get((buft, kind), 0), b.buffers.get((buft, kind), 0)))
            for buft, kind in keys if a.buffers.get((buft, kind)) or b.buffers.get((buft, kind))]


def _occurrences(tensors: list[dict]) -> dict[tuple[str, int], dict]:
    """Tensors by (name, how many of that name came before): names repeat across layers' reuses."""
    seen: dict[str, int] = {}
    out = {}
    for t in tensors:
        k = seen.get(t["name"], 0)
        seen[t["name"]] = k + 1
        out[(t["name"], k)] = t
    return out


def peak_deltas(pa: Optional[dict], pb: Optional[dict]) -> list[tuple[str, Delta]]:
    """The tensors alive at either side's peak, matched by name: (op, Delta), largest first."""
    ta, tb = _occurrences(pa["tensors"] if pa else []), _occurrences(pb["tensors"] if pb else [])
    keys = list(ta) + [k for k in tb if k not in ta]
    rows = [((ta.get(k) or tb[k])["op"], Delta(k[0], ta[k]["size"] if k in ta else None,
                                                 tb[k]["size"] if k in tb else None)) for k in keys]
    return sorted(rows, key=lambda r: -max(r[1].a or 0, r[1].b or 0))


def _d_mib(d: Delta) -> str:
    return f"{d.delta / 2**20:+.2f}" if d.delta else "0"


def render(a: Side, b: Side) -> str:
    out = [f"A: {a.label}", f"B: {b.label}", ""]
    rows = []
    for buft, kind, d in buffer_deltas(a, b):
        rows.append([buft, kind, mib(d.a), mib(d.b), _d_mib(d), count(d.a), count(d.b), signed(d.delta), d.pct()])
    ta, tb = sum(a.buffers.values()), sum(b.buffers.values())
    total = Delta("total", ta, tb)
    rows.append(["total", "", mib(ta), mib(tb), _d_mib(total), count(ta), count(tb), signed(total.delta), total.pct()])
    out.append(tabulate(rows, headers=["buffer type", "kind", "A MiB", "B MiB", "delta MiB", "A bytes", "B bytes",
                                       "delta bytes", "delta %"], disable_numparse=True,
                        colalign=("left", "left") + ("right",) * 7))
    out.append("")
    out.append(tabulate([[k, count(a.counts.get(k)), count(b.counts.get(k)), signed(Delta(k, a.counts.get(k), b.counts.get(k)).delta)]
                         for k in dict.fromkeys([*a.counts, *b.counts])],
                        headers=["graph", "A", "B", "delta"], disable_numparse=True,
                        colalign=("left", "right", "right", "right")))
    if a.params is not None and b.params is not None:
        changed = [f"{k} {a.params.get(k)} -> {b.params.get(k)}" for k in dict.fromkeys([*a.params, *b.params])
                   if a.params.get(k) != b.params.get(k)]
        out += ["", "effective parameters: " + (", ".join(changed) if changed else "the same")]
    for buft in sorted(set(a.peaks) | set(b.peaks)):
        pa, pb = a.peaks.get(buft), b.peaks.get(buft)
        out += ["", f"{buft} compute buffer peak",
                f"  A: {peak_at(pa)}, {pa['graph']} graph" if pa else "  A: no compute buffer",
                f"  B: {peak_at(pb)}, {pb['graph']} graph" if pb else "  B: no compute buffer"]
        rows = [[d.name, op, count(d.a), count(d.b), signed(d.delta), d.pct()] for op, d in peak_deltas(pa, pb)]
        out.append(tabulate(rows, headers=["tensor at the peak", "op", "A bytes", "B bytes", "delta", "delta %"],
                            disable_numparse=True, colalign=("left", "left", "right", "right", "right", "right")))
    return "\n".join(out)


def to_json(a: Side, b: Side) -> dict:
    def side(s: Side) -> dict:
        return {"label": s.label, "params": s.params, "peaks": s.peaks}

    return {
        "a": side(a), "b": side(b),
        "buffers": [{"buffer_type": buft, "kind": kind, "a": d.a, "b": d.b, "delta": d.delta}
                    for buft, kind, d in buffer_deltas(a, b)],
        "graphs": [{"name": k, "a": a.counts.get(k), "b": b.counts.get(k)}
                   for k in dict.fromkeys([*a.counts, *b.counts])],
        "peak_tensors": {buft: [{"name": d.name, "op": op, "a": d.a, "b": d.b, "delta": d.delta}
                                for op, d in peak_deltas(a.peaks.get(buft), b.peaks.get(buft))]
                         for buft in sorted(set(a.peaks) | set(b.peaks))},
    }


def _side_flags(shared: list[str], extra: str) -> list[str]:
    try:
        return shared + shlex.split(extra)
    except ValueError as e:
        die(f"cannot split {extra!r} into flags: {e}")


@click.command()
@model_options(then="model_b")
@click.argument("model_b", required=False, type=click.Path(dir_okay=False))
@plan_options
@click.option("--a", "flags_a", default="", metavar="FLAGS",
              help="Flags for side A only, quoted, after the shared flags (they win): --a '-c 4096'.")
@click.option("--b", "flags_b", default="", metavar="FLAGS", help="Flags for side B only: --b '-c 8192'.")
@click.option("--pp-vs-tg", "pp_vs_tg", is_flag=True,
              help="Compare the pp graph (A) with the tg graph (B) of one plan: what each alone needs per "
                   "compute buffer type, nodes, splits and peaks.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare(model: str, model_b: Optional[str], params: Params, flags_a: str, flags_b: str, pp_vs_tg: bool,
            as_json: bool) -> None:
    """Compare two plans, or the pp and tg graphs of one plan.

    Side A plans MODEL with the shared flags then --a; side B plans MODEL_B (default: MODEL) with
    the shared flags then --b (with -hf or -mu in MODEL's place, a single positional is MODEL_B).
    With --pp-vs-tg, A is the pp graph and B the tg graph of one plan.

    Prints, side by side with deltas: bytes per buffer type and kind (model, KV, output, compute),
    graph nodes and splits, the effective parameters that differ, and for each compute buffer the
    peak that sizes it (node, graph; see `reserve --peak`) with the tensors alive at either
    side's peak and how their sizes changed (largest first; "-": not alive at that side's peak).

    \b
    Examples:
      schedplan compare model.gguf --a '-c 4096' --b '-c 8192'
      schedplan compare model-q4_0.gguf model-q8_0.gguf -c 4096 -fa on
      schedplan compare model.gguf -c 4096 --pp-vs-tg
    """
    from ..planner.reserve import reserve as plan

    if pp_vs_tg and (model_b is not None or flags_a or flags_b):
        die("--pp-vs-tg compares the graphs of one plan: give no MODEL_B, --a or --b with it")
    if not pp_vs_tg and model_b is None and not flags_a and not flags_b:
        die("nothing to compare: give MODEL_B, --a/--b flags, or --pp-vs-tg")
    shared = given_flags()
    if pp_vs_tg:
        with fail_cleanly():
            result = plan(model, params)
        a, b = graph_side(result, "pp"), graph_side(result, "tg")
        a.label, b.label = f"{label(model, shared)}: {a.label}", f"{label(model, shared)}: {b.label}"
    else:
        sides = []
        for path, extra in ((model, flags_a), (model_b or model, flags_b)):
            flags = _side_flags(shared, extra)
            with fail_cleanly():
                sides.append(plan_side(label(path, flags), plan(path, parse_params(flags) if extra else params)))
        a, b = sides
    click.echo(json.dumps(to_json(a, b), indent=1) if as_json else render(a, b))
