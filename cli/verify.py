"""`schedplan verify`: the plan against a real llama.cpp run of the same flags, field by field."""
from __future__ import annotations

import json

import click
from tabulate import tabulate

from .errors import fail_cleanly
from .options import draft_options, model_options, plan_options
from .run import local_model, local_rpc_option, real_run, with_draft, with_local_rpc
from ..planner.params import Params
from ..planner import reserve as planner


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "[]"
    return str(value)


def _tensor_line(t: dict | None) -> str:
    if t is None:
        return "(missing)"
    ne = "x".join(map(str, t.get("ne", [])))
    return (f"{t['name']} [{t['op']} {ne} {t.get('type', '')}] {t.get('buffer')} @ {t.get('offset')} "
            f"size {t.get('size')}")


def render_mismatch(m: dict) -> str:
    out = [f"first tensor mismatch: {m['name']} ({m['op']}): {', '.join(m['fields'])} differ",
           f"  plan: {_tensor_line(m['plan'])}", f"  real: {_tensor_line(m['real'])}",
           "  real neighbours:"]
    out += [("  > " if t is m["real"] else "    ") + _tensor_line(t) for t in m["real_neighbours"]]
    out.append("  plan neighbours:")
    out += [("  > " if t is m["plan"] else "    ") + _tensor_line(t) for t in m["plan_neighbours"]]
    return "\n".join(out)


@click.command("verify")
@model_options()
@plan_options
@draft_options
@local_rpc_option
@click.option("--json", "as_json", is_flag=True, help="Print rows and the first tensor mismatch as JSON.")
def verify(model: str, params: Params, draft, local_rpc: int, as_json: bool) -> None:
    """Plan MODEL and run it in real llama.cpp with the same flags; compare every field.

    Prints one table (field, plan, real, equal) and, when tensor placements differ, the first
    tensor in graph order whose planned buffer, offset or size is not the real one, with its
    neighbours on both sides. Exits 0 only if everything is equal.

    MODEL must be on disk, as for `schedplan run`: a URL, -mu or -hf stops with one line naming the
    file to download (schedplan downloads no model).

    Example: schedplan verify model.gguf -c 2048 -ub 512
    """
    from ..backends import llama_cpp_run as lcr
    from ..planner.diff import diff, first_tensor_mismatch, tensor_summary

    model = local_model(model)
    if not lcr.available():
        click.echo(lcr.MISSING_MESSAGE, err=True)
        raise SystemExit(2)
    with with_local_rpc(params, local_rpc) as p:
        with fail_cleanly():
            p, extra = with_draft(model, p, draft)
            plan = planner.reserve(model, p, tensors=True, draft=extra)
        real = real_run(model, p, tensors=True, draft=extra)
    rows = diff(plan, real)
    mismatch = first_tensor_mismatch(plan, real)
    summary = tensor_summary(plan, real) if plan.get("tensors") and real.get("tensors") else None
    ok = all(r.ok for r in rows) and mismatch is None
    if as_json:
        click.echo(json.dumps({"equal": ok, "rows": [{"field": r.field, "plan": r.plan, "real": r.real,
                                                      "equal": r.equal, "measured": r.measured} for r in rows],
                               "tensors": summary, "first_tensor_mismatch": mismatch}, indent=1))
    else:
        table = [[r.field, _fmt(r.plan), _fmt(r.real), "yes" if r.equal else "NO" if r.measured else "not measured"]
                 for r in rows]
        if summary is not None:
            table.append(["tensors (buffer, offset, size)", f"{summary['matched']:,} matched",
                          f"{summary['real']:,} seen", "yes" if mismatch is None else "NO"])
        elif "tensors_unmeasurable" in real:
            table.append(["tensors (buffer, offset, size)", f"{len(plan.get('tensors', [])):,} planned", "-",
                          "not measured"])
        click.echo(tabulate(table, headers=["field", "plan", "real", "equal"], disable_numparse=True,
                            colalign=("left", "right", "right", "left")))
        if mismatch is not None:
            click.echo("")
            click.echo(render_mismatch(mismatch))
        if "tensors_unmeasurable" in real:
            click.echo("")
            click.echo(f"tensors not measured: {real['tensors_unmeasurable']}")
        n_bad = sum(not r.ok for r in rows) + (mismatch is not None)
        click.echo("")
        click.echo("plan equals llama.cpp" if ok else f"plan differs from llama.cpp ({n_bad} difference(s))")
    raise SystemExit(0 if ok else 1)
