"""Compare a plan with a real llama.cpp run (both "schedplan.reserve/1" dicts).

    diff(plan, real) -> list[Row]                 # every scalar field, side by side
    first_tensor_mismatch(plan, real) -> dict | None

Tensors are matched by name, then among tensors of one name by shape and order. The real listing comes
from a decode of the reserve's pp ubatch, which reuses the reserve's offsets but builds tensors
whose shape depends on n_kv (KQ mask, K/V views, ...) smaller than at reserve time: their size is
compared only where both shapes (ne) are equal, and so is the offset of a view (its source is
compared on its own row).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

# the sections compared field by field; "source", "checks", "log", "tensors" and the model path are not
SECTIONS = ("model", "params", "compute_buffers", "kv_buffers", "output_buffers", "model_buffers", "graphs", "lora",
            "control_vector")
SKIP = {"model.path", "draft.model.path"}
MISSING = None


@dataclass(frozen=True)
class Row:
    field: str          # dotted path, e.g. "compute_buffers.CPU", "graphs.pp.nodes"
    plan: Any
    real: Any
    measured: bool = True   # False: a plan-only field the real run cannot measure (shown, not compared)

    @property
    def equal(self) -> bool:
        return self.plan == self.real

    @property
    def ok(self) -> bool:
        return self.equal or not self.measured


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, v in value.items():
            _flatten(v, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):     # lora.adapters: field by field, by position
            _flatten(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = value      # other lists (params.devices, ...) are compared whole


def flat_fields(result: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "schema" in result:
        out["schema"] = result["schema"]
    commit = result.get("llama_cpp", {}).get("commit")
    if commit is not None:
        out["llama_cpp.commit"] = commit
    for section in SECTIONS:
        if section in result:
            _flatten(result[section], section, out)
    for section in SECTIONS:   # a draft model's context (-md), compared as the model's
        if section in result.get("draft", {}):
            _flatten(result["draft"][section], f"draft.{section}", out)
    for key in SKIP:
        out.pop(key, None)
    return out


def diff(plan: dict, real: dict) -> list[Row]:
    """Every scalar field of either side, in the real result's order, then the plan's extras (fields
    the real run does not measure, e.g. per-graph buffer sizes: shown, never counted as differences).
    A field the real run has and the plan lacks is a difference."""
    p, r = flat_fields(plan), flat_fields(real)
    rows = [Row(f, p.get(f, MISSING), r[f]) for f in r]
    rows += [Row(f, p[f], MISSING, measured=False) for f in p if f not in r]
    return rows


# --------------------------------------------------------------------------------------------
# tensors
# --------------------------------------------------------------------------------------------

def _is_sched_bookkeeping(row: dict) -> bool:
    """Plan rows the real eval callback can never see: the scheduler's graph copy adds, per split
    input, an input_dep node (ggml_view_tensor: op NONE, a view) and allocation-dependency nodes of
    the same kind; the callback only walks the split graphs' own nodes."""
    return row.get("kind") == "node" and row.get("op") == "NONE" and row.get("view_of") is not None


def match_tensors(plan: dict, real: dict) -> tuple[list[dict], list[dict], list[tuple[int, Optional[int]]]]:
    """(plan rows, real rows, [(real position, plan position or None)]) in the real graph order.

    A real tensor pairs with the first unpaired plan tensor of its name, a scheduler's copy preferring
    one of its shape where the real copies of that name all differ in shape, else one of its shape
    at its buffer and offset (copies of one name and shape are visited in any order), a weight one in
    its buffer (a duplicated weight's copies share its name): names are unique but for
    those copies (two views of one node's output copied to another backend are both
    "<backend>#<node> (view)#0"), which the decode may visit in another order than the plan lists
    them, and for the inputs of an iswa cache (the base and the sliding-window attn_inp_kq_mask,
    k_idxs, v_idxs, and their copies), which pair in order: the decode shapes the base mask by its
    n_kv, the sliding-window mask's reserve shape when the window and a ubatch pad to as much (and
    the decode may list only one of them)."""
    plan_rows = [t for t in plan.get("tensors", []) if not _is_sched_bookkeeping(t)]
    real_rows = list(real.get("tensors", []))
    by_name: dict[str, list[int]] = {}
    for i, row in enumerate(plan_rows):
        by_name.setdefault(row["name"], []).append(i)
    real_shapes: dict[str, list[tuple]] = {}
    for row in real_rows:
        real_shapes.setdefault(row["name"], []).append(tuple(row.get("ne", [])))
    pairs = []
    for i, row in enumerate(real_rows):
        candidates = by_name.get(row["name"], [])
        shapes = real_shapes[row["name"]]
        same_shape = [j for j in candidates if list(plan_rows[j].get("ne", [])) == list(row.get("ne", []))
                      and "#" in row["name"] and len(set(shapes)) == len(shapes)]
        # a weight llama.cpp duplicates into each buffer type that reads it (TENSOR_DUPLICATED:
        # rope_freqs, token_embd as the output) is one name in several buffers: the copy of the
        # real one's buffer (the decode lists no copy that only feeds a split's input copy)
        same_buffer = [j for j in candidates if row.get("usage") == "weights" and
                       plan_rows[j].get("buffer") == row.get("buffer")]
        # copies of one name and shape are one multiset: the one at the real one's place, if any
        same_place = [j for j in (same_shape or candidates) if "#" in row["name"]
                      and (plan_rows[j].get("buffer"), plan_rows[j].get("offset")) == (row.get("buffer"), row.get("offset"))
                      and list(plan_rows[j].get("ne", [])) == list(row.get("ne", []))]
        j = (same_place or same_shape or same_buffer or candidates or [None])[0]
        if j is not None:
            candidates.remove(j)
        pairs.append((i, j))
    return plan_rows, real_rows, pairs


def tensor_differences(p: Optional[dict], r: dict, source_shapes_differ: bool = False) -> list[str]:
    """The fields in which a planned tensor differs from the real one."""
    if p is None:
        return ["missing in plan"]
    same_shape = list(p.get("ne", [])) == list(r.get("ne", []))
    out = [f for f in ("buffer", "offset") if p.get(f) != r.get(f)]
    if "offset" in out and not same_shape and r.get("view_of") is not None:
        # a view placed by shapes the decode sizes otherwise (DeepSeek-V4's second half of the
        # gathered compressor rows starts after as many rows as the ubatch has blocks): its
        # source's own row is compared
        out.remove("offset")
    # a view's size follows its source's strides: of a source the decode shapes otherwise (GLM5-Next's
    # selection mask, n_kv + n_sel rows wide) it differs with the same shape
    if same_shape and p.get("size") != r.get("size") and not source_shapes_differ:
        out.append("size")
    return out


def _view_sources_differ(plan: dict, real_rows: list[dict]) -> Callable[[Optional[dict], int], bool]:
    """For a matched pair (plan row, real position): whether the view's source has another shape
    in the plan than in the decode (the real source: the last row of that name before it)."""
    last: dict[str, int] = {}
    real_src: list[Optional[int]] = []
    for i, row in enumerate(real_rows):
        real_src.append(last.get(row["view_of"]) if row.get("view_of") is not None else None)
        last[row["name"]] = i
    all_plan = plan.get("tensors", [])

    def differ(p: Optional[dict], ri: int) -> bool:
        if p is None or p.get("view_src") is None or real_src[ri] is None:
            return False
        return list(all_plan[p["view_src"]].get("ne", [])) != list(real_rows[real_src[ri]].get("ne", []))
    return differ


def first_tensor_mismatch(plan: dict, real: dict, context: int = 2) -> Optional[dict]:
    """The first real tensor (graph order) whose planned buffer/offset/size differs, with its
    neighbours on both sides; None when every real tensor matches (or a side has no listing)."""
    if not plan.get("tensors") or not real.get("tensors"):
        return None
    plan_rows, real_rows, pairs = match_tensors(plan, real)
    differ = _view_sources_differ(plan, real_rows)
    last_plan = 0
    for ri, pi in pairs:
        p = plan_rows[pi] if pi is not None else None
        fields = tensor_differences(p, real_rows[ri], differ(p, ri))
        if not fields:
            last_plan = pi
            continue
        anchor = pi if pi is not None else last_plan
        return {
            "name": real_rows[ri]["name"],
            "op": real_rows[ri]["op"],
            "fields": fields,
            "real": real_rows[ri],
            "plan": p,
            "real_position": ri,
            "plan_position": pi,
            "real_neighbours": real_rows[max(0, ri - context): ri + context + 1],
            "plan_neighbours": plan_rows[max(0, anchor - context): anchor + context + 1],
        }
    return None


def tensor_summary(plan: dict, real: dict) -> dict[str, int]:
    """Counts: real tensors, matched by name, equal, differing, only in the plan."""
    plan_rows, real_rows, pairs = match_tensors(plan, real)
    matched = [(ri, pi) for ri, pi in pairs if pi is not None]
    differ = _view_sources_differ(plan, real_rows)
    differing = sum(1 for ri, pi in matched
                    if tensor_differences(plan_rows[pi], real_rows[ri], differ(plan_rows[pi], ri)))
    return {"real": len(real_rows), "matched": len(matched), "equal": len(matched) - differing,
            "differing": differing, "missing_in_plan": len(pairs) - len(matched),
            "only_in_plan": len(plan_rows) - len(matched)}
