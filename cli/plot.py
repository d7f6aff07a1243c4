"""`schedplan plot`: the allocation timeline of each compute buffer (needs the `plot` extra)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from .errors import die, fail_cleanly
from .flags import given_flags, label
from .options import model_options, plan_options
from .reserve import peak_at
from ..planner.params import Params
from ..planner.timeline import Lifetime, alive_at, lifetimes

MISSING = "schedplan plot needs matplotlib: pip install 'schedplan[plot]'"
AT_PEAK, OTHER, PEAK = "#e8710a", "#7aa6d6", "#c5221f"
EDGE = {AT_PEAK: "#9c4a05", OTHER: "#3f6f9f"}
ZOOM_ABOVE, ZOOM_WIDTH = 120, 40   # graphs of more nodes get a panel this many nodes wide around the peak


@dataclass(frozen=True)
class Drawn:
    """What was drawn for one compute buffer, read back from the figure's artists."""
    buffer: str
    rectangles: int     # tensor rectangles
    peak_size: int      # height of the peak line, bytes
    peak_node: int      # node of the peak line


def _unit(size: int) -> tuple[str, int]:
    """A power-of-two unit for an axis up to size (so that values * unit are exact bytes)."""
    for name, unit in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= unit:
            return name, unit
    return "bytes", 1


def draw(result: dict, graph: str, title: str, path: str) -> list[Drawn]:
    """Save the allocation timeline of `graph`'s compute buffers (one row per buffer type):
    x is the node index, y the offset; each compute tensor is a rectangle from the node at which it
    gets its memory to the last node at which it holds it; the tensors alive at the peak are
    highlighted and the peak is marked. Graphs of more than ZOOM_ABOVE nodes get a second panel
    with the nodes around the peak."""
    from matplotlib.collections import PatchCollection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    spans = lifetimes(result["tensors"])
    n_nodes = sum(t["kind"] == "node" for t in result["tensors"])
    peaks = result["peaks"][graph]
    zoom = n_nodes > ZOOM_ABOVE
    fig = Figure(figsize=(14, 1.2 + 4.2 * len(peaks)), layout="constrained")
    fig.suptitle(title, fontsize=11)
    axes = fig.subplots(len(peaks), 2 if zoom else 1, squeeze=False, width_ratios=[3, 1] if zoom else None)
    drawn = []
    for k, (row, (buft, peak)) in enumerate(zip(axes, peaks.items())):
        unit_name, unit = _unit(peak["size"])
        mine = [s for s in spans if s.buffer == buft]
        hot = {s.position for s in alive_at(mine, peak["node"])}
        panels = [(row[0], -1.5, n_nodes + 0.5)]
        if zoom:
            x0 = max(-1.5, min(n_nodes + 0.5, peak["node"] + ZOOM_WIDTH // 4) - ZOOM_WIDTH)
            panels.append((row[1], x0, x0 + ZOOM_WIDTH))
        for ax, x0, x1 in panels:
            rects = PatchCollection(
                [Rectangle((s.first, s.offset / unit), s.last + 1 - s.first, s.size / unit) for s in mine],
                facecolors=[AT_PEAK if s.position in hot else OTHER for s in mine],
                edgecolors=[EDGE[AT_PEAK] if s.position in hot else EDGE[OTHER] for s in mine], linewidths=0.4,
                gid=f"tensors-{k}" if ax is row[0] else None)
            ax.add_collection(rects)
            line = ax.axhline(peak["size"] / unit, color=PEAK, linestyle="--", linewidth=1.2)
            ax.axvline(peak["node"] + 0.5, color=PEAK, linestyle=":", linewidth=1.2)
            ax.set_xlim(x0, x1)
            ax.set_ylim(0, peak["size"] / unit * 1.1)
            ax.set_xlabel("node")
            if ax is row[0]:
                drawn.append(Drawn(buft, len(rects.get_paths()), int(line.get_ydata()[0] * unit), peak["node"]))
        main, last = row[0], panels[-1][0]
        _label_peak_tensors(last, [s for s in mine if s.position in hot], peak, (unit_name, unit),
                            left=peak["node"] > (panels[-1][1] + panels[-1][2]) / 2)
        main.set_xlabel("node (in the scheduler's graph; -1: leafs and inputs, allocated before the first node)")
        main.set_ylabel(f"offset ({unit_name})")
        main.set_title(f"{buft} compute buffer, {graph} graph: {len(mine)} tensors, {len(hot)} alive at the peak\n"
                       f"peak {peak_at(peak)}", fontsize=10, loc="left")
        if zoom:
            last.set_title("around the peak", fontsize=10, loc="left")
    fig.legend(handles=[Patch(facecolor=AT_PEAK, edgecolor=EDGE[AT_PEAK], label="alive at the peak"),
                        Patch(facecolor=OTHER, edgecolor=EDGE[OTHER], label="other tensors"),
                        Line2D([], [], color=PEAK, linestyle="--", label="peak size"),
                        Line2D([], [], color=PEAK, linestyle=":", label="peak node")],
               loc="outside lower center", ncols=4, fontsize=9, frameon=False)
    fig.savefig(path, dpi=130)
    return drawn


def _label_peak_tensors(ax, hot: list[Lifetime], peak: dict, unit: tuple[str, int], left: bool) -> None:
    """Names of the tensors alive at the peak that are tall enough to hold a line of text, beside the
    peak line (on its left when the peak is in the right half)."""
    name, n = unit
    for s in hot:
        if s.size >= 0.04 * peak["size"]:
            ax.annotate(f"{s.name} {s.size / n:.2f} {name}", (peak["node"] + 0.5, (s.offset + s.size / 2) / n),
                        xytext=(-6 if left else 6, 0), textcoords="offset points", va="center",
                        ha="right" if left else "left", fontsize=8,
                        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "linewidth": 0})


@click.command()
@model_options()
@plan_options
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The image to write: FILE.png or FILE.svg.")
@click.option("--graph", "graph", type=click.Choice(["pp", "tg"]), default="pp", show_default=True,
              help="Which graph to draw.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the drawn data: per buffer type, the peak and each tensor's offset, size and node range.")
def plot(model: str, params: Params, output: str, graph: str, as_json: bool) -> None:
    """Draw the allocation timeline of each compute buffer (PNG or SVG).

    Needs matplotlib: pip install 'schedplan[plot]'. One panel per compute buffer type: x is the
    node index in the graph, y the offset in the buffer. Each compute tensor is a rectangle from
    the node at which the allocator gives it memory (leafs and inputs: before the first node) to
    the last node at which it holds it (its last consumer, or the last node for graph outputs; an
    in-place op takes its parent's memory over). The tensors alive at the peak are highlighted;
    the dashed line is the peak size, the dotted line the node at which it is reached. Graphs of
    more than 120 nodes get a second panel with the nodes around the peak.

    Example: schedplan plot model.gguf -c 8192 -o timeline.png --graph pp
    """
    if Path(output).suffix.lower() not in (".png", ".svg"):
        die(f"{output}: the image must be a .png or .svg file")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        die(MISSING)
    from ..planner.reserve import reserve as plan

    with fail_cleanly():
        result = plan(model, params, tensors=True, graph=graph)
        p = result["params"]
        n_tokens = result["graphs"][graph]["n_tokens"]
        title = (f"{label(model, given_flags())}: {graph} graph ({n_tokens} token{'s' if n_tokens != 1 else ''}), "
                 f"n_ctx {p['n_ctx']}, flash attention {'on' if p['flash_attn'] else 'off'}")
        drawn = draw(result, graph, title, output)
    if as_json:
        spans = lifetimes(result["tensors"])
        click.echo(json.dumps({"output": output, "graph": graph, "buffers": {
            d.buffer: {"peak": result["peaks"][graph][d.buffer],
                       "tensors": [asdict(s) for s in spans if s.buffer == d.buffer]} for d in drawn}}, indent=1))
        return
    for d in drawn:
        click.echo(f"{output}: {d.buffer} compute buffer, {d.rectangles} tensors, "
                   f"peak {peak_at(result['peaks'][graph][d.buffer])}")
