"""`schedplan baseline` and `schedplan check`: a plan's memory figures recorded once, checked in CI."""
from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Optional

import click
from tabulate import tabulate

from .errors import USER_ERRORS, die, fail_cleanly
from .flags import given_flags, label
from .options import model_options, parse_params, plan_options
from .reserve import count, signed
from ..planner import LLAMA_CPP_COMMIT
from ..planner.download import is_url
from ..planner.params import Params

BASELINE_SCHEMA = "schedplan.baseline/1"
BYTE_SECTIONS = ("compute_buffers", "kv_buffers", "output_buffers", "model_buffers")
UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3}


class BadInput(Exception):
    """A baseline or manifest that cannot be used."""


# --- figures and tolerance ----------------------------------------------------------------------

def figures(result: dict) -> dict[str, int]:
    """The checked figures of a reserve result: bytes per buffer type of each kind, named like
    reserve's JSON (`compute_buffers.CPU`), then nodes and splits of the pp and tg graphs."""
    out = {f"{section}.{buft}": size for section in BYTE_SECTIONS for buft, size in sorted(result[section].items())}
    for graph in ("pp", "tg"):
        for key in ("nodes", "splits"):
            out[f"graphs.{graph}.{key}"] = result["graphs"][graph][key]
    return out


@dataclass(frozen=True)
class Tolerance:
    text: str
    percent: Optional[Fraction] = None   # of the baseline figure
    nbytes: int = 0                      # used when percent is None

    def allowed(self, baseline: int) -> Fraction:
        """How many bytes a figure of this baseline value may grow."""
        return baseline * self.percent / 100 if self.percent is not None else Fraction(self.nbytes)

    def describe(self) -> str:
        if self.percent is not None:
            return f"{self.text} of each baseline figure"
        return f"{self.nbytes:,} bytes" if self.text.isdigit() else f"{self.text} = {self.nbytes:,} bytes"


def parse_tolerance(text: str) -> Tolerance:
    """'1%', '0.5%' (of the baseline figure) or '4MiB', '512KiB', '1.5GiB', '4096' (bytes, rounded down)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%|[a-zA-Z]*)\s*", text)
    if not m or (m.group(2) != "%" and m.group(2).lower() not in UNITS):
        raise ValueError(f"expected a percentage such as 1% or a size such as 4MiB (B, KiB, MiB, GiB), got {text!r}")
    number, unit = Fraction(m.group(1)), m.group(2)
    if unit == "%":
        return Tolerance(text.strip(), percent=number)
    return Tolerance(text.strip(), nbytes=int(number * UNITS[unit.lower()]))


class ToleranceType(click.ParamType):
    name = "tolerance"

    def convert(self, value, param, ctx) -> Tolerance:
        if isinstance(value, Tolerance):
            return value
        try:
            return parse_tolerance(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


@dataclass(frozen=True)
class FigureCheck:
    figure: str
    baseline: Optional[int]   # None: not in the baseline (a new buffer type)
    new: Optional[int]        # None: not in the new plan (a buffer type that went away)
    verdict: str
    ok: bool

    @property
    def delta(self) -> int:
        return (self.new or 0) - (self.baseline or 0)


def judge(figure: str, baseline: Optional[int], new: Optional[int], tolerance: Tolerance) -> FigureCheck:
    """Bytes may grow up to the tolerance and may always shrink; nodes and splits must not change."""
    if figure.startswith("graphs."):
        return FigureCheck(figure, baseline, new, "same" if baseline == new else "CHANGED", baseline == new)
    delta = (new or 0) - (baseline or 0)
    if delta == 0:
        return FigureCheck(figure, baseline, new, "same", True)
    if delta < 0:
        return FigureCheck(figure, baseline, new, "shrank", True)
    if delta <= tolerance.allowed(baseline or 0):
        return FigureCheck(figure, baseline, new, "grew, within tolerance", True)
    return FigureCheck(figure, baseline, new, "REGRESSION", False)


def check_figures(baseline: dict[str, int], new: dict[str, int], tolerance: Tolerance) -> list[FigureCheck]:
    names = list(baseline) + [f for f in new if f not in baseline]
    return [judge(f, baseline.get(f), new.get(f), tolerance) for f in names]


# --- baselines, configurations, manifests -------------------------------------------------------

def baseline_document(model: str, flags: list[str], result: dict) -> dict:
    return {"schema": BASELINE_SCHEMA, "llama_cpp": result["llama_cpp"], "model": model, "flags": flags,
            "params": result["params"], "figures": figures(result)}


def load_baseline(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: not a JSON file ({e})")
    if not isinstance(doc, dict) or doc.get("schema") != BASELINE_SCHEMA:
        raise BadInput(f"{path}: not a schedplan baseline (schema {BASELINE_SCHEMA})")
    figs = doc.get("figures")
    if not isinstance(figs, dict) or not all(type(v) is int for v in figs.values()):
        raise BadInput(f"{path}: 'figures' must map figure names to integers")
    if not isinstance(doc.get("llama_cpp", {}), dict) or not isinstance(doc.get("params", {}), dict):
        raise BadInput(f"{path}: 'llama_cpp' and 'params' must be objects")
    return doc


@dataclass
class ConfigCheck:
    model: str
    flags: list[str]
    baseline: str
    figures: list[FigureCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def label(self) -> str:
        return label(self.model, self.flags)

    @property
    def status(self) -> str:
        return "error" if self.error else "pass" if all(f.ok for f in self.figures) else "fail"


def error_message(e: Exception) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror}"
    if isinstance(e, click.ClickException):
        return e.format_message()
    return str(e)


CONFIG_ERRORS = USER_ERRORS + (BadInput, click.ClickException)


def check_config(model: str, flags: list[str], params: Optional[Params], baseline_path: str,
                 tolerance: Tolerance) -> ConfigCheck:
    """Plan one configuration (params, or parsed from flags) and check it against its baseline."""
    from ..planner.reserve import reserve as plan

    out = ConfigCheck(model, flags, baseline_path)
    try:
        base = load_baseline(baseline_path)
        result = plan(model, params if params is not None else parse_params(flags))
    except CONFIG_ERRORS as e:
        out.error = error_message(e)
        return out
    out.figures = check_figures(base["figures"], figures(result), tolerance)
    commit = base.get("llama_cpp", {}).get("commit")
    if commit != LLAMA_CPP_COMMIT:
        out.notes.append(f"the baseline was planned for llama.cpp {commit}, this plan for {LLAMA_CPP_COMMIT}")
    old, new = base.get("params", {}), result["params"]
    changed = [f"{k} {old.get(k)} -> {new.get(k)}" for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    if changed:
        out.notes.append("effective parameters differ from the baseline's: " + ", ".join(changed))
    return out


@dataclass(frozen=True)
class Entry:
    model: str
    flags: list[str]
    baseline: str


def load_manifest(path: str) -> list[Entry]:
    """A JSON list of {model, flags, baseline}, or TOML [[check]] tables of the same keys; flags is a
    string or a list of strings; relative paths are relative to the manifest's folder."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not a text file ({e})")
    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError:
            raise BadInput(f"{path}: TOML manifests need Python 3.11 (tomllib); write it as JSON")
        try:
            entries = tomllib.loads(text).get("check")
        except tomllib.TOMLDecodeError as e:
            raise BadInput(f"{path}: not a TOML file ({e})")
    else:
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadInput(f"{path}: not a JSON file ({e})")
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"{path}: expected a non-empty list of {{model, flags, baseline}}"
                       + (" as [[check]] tables" if path.endswith(".toml") else ""))
    folder = Path(path).parent
    out = []
    for i, e in enumerate(entries, 1):
        if not isinstance(e, dict) or set(e) - {"model", "flags", "baseline"} or \
                not isinstance(e.get("model"), str) or not isinstance(e.get("baseline"), str):
            raise BadInput(f"{path}: entry {i}: expected keys model and baseline (strings) and optionally flags")
        flags = e.get("flags", [])
        if isinstance(flags, str):
            try:
                flags = shlex.split(flags)
            except ValueError as err:
                raise BadInput(f"{path}: entry {i}: cannot split flags {flags!r}: {err}")
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise BadInput(f"{path}: entry {i}: flags must be a string or a list of strings")
        model = e["model"] if is_url(e["model"]) else str(folder / e["model"])
        out.append(Entry(model, flags, str(folder / e["baseline"])))
    return out


# --- output -------------------------------------------------------------------------------------

def _pct(f: FigureCheck) -> str:
    if f.figure.startswith("graphs.") or f.delta == 0:
        return ""
    return f"{f.delta / f.baseline * 100:+.2f}%" if f.baseline else "new"


def figures_table(c: ConfigCheck) -> str:
    rows = [[f.figure, count(f.baseline), count(f.new), signed(f.delta), _pct(f), f.verdict] for f in c.figures]
    return tabulate(rows, headers=["figure", "baseline", "new", "delta", "delta %", "verdict"], disable_numparse=True,
                    colalign=("left", "right", "right", "right", "right", "left"))


def summary_line(c: ConfigCheck) -> str:
    bad = [f for f in c.figures if not f.ok]
    shrank = sum(f.verdict == "shrank" for f in c.figures)
    note = f"; {shrank} shrank" if shrank else ""
    if not bad:
        return f"PASS: {len(c.figures)} figures, none grew beyond the tolerance{note}"
    what = ", ".join(f"{f.figure} {f.delta:+,}" for f in bad)
    return f"FAIL: {len(bad)} of {len(c.figures)} figures regressed ({what}){note}"


def render(c: ConfigCheck, tolerance: Tolerance) -> str:
    out = [f"{c.label} against {c.baseline} (tolerance {tolerance.describe()})", figures_table(c)]
    out += [f"note: {n}" for n in c.notes]
    out.append(summary_line(c))
    return "\n".join(out)


def as_json(c: ConfigCheck) -> dict:
    return {"model": c.model, "flags": c.flags, "baseline": c.baseline, "status": c.status, "error": c.error,
            "notes": c.notes,
            "figures": [{"figure": f.figure, "baseline": f.baseline, "new": f.new, "delta": f.delta,
                         "verdict": f.verdict, "ok": f.ok} for f in c.figures]}


def junit_xml(checks: list[ConfigCheck], tolerance: Tolerance) -> str:
    """One <testsuite> per configuration, one <testcase> per figure (a failed plan: one errored
    testcase named "plan")."""
    def counts(cs: list[ConfigCheck]) -> dict[str, str]:
        tests = sum(len(c.figures) or 1 for c in cs)
        failures = sum(not f.ok for c in cs for f in c.figures)
        return {"tests": str(tests), "failures": str(failures), "errors": str(sum(c.error is not None for c in cs))}

    root = ET.Element("testsuites", name="schedplan check", **counts(checks))
    for c in checks:
        suite = ET.SubElement(root, "testsuite", name=c.label, **counts([c]))
        if c.error is not None:
            case = ET.SubElement(suite, "testcase", classname=c.label, name="plan")
            ET.SubElement(case, "error", message=c.error)
        for f in c.figures:
            case = ET.SubElement(suite, "testcase", classname=c.label, name=f.figure)
            detail = f"baseline {count(f.baseline)}, new {count(f.new)}, delta {signed(f.delta)} {_pct(f)}".rstrip()
            if f.verdict == "REGRESSION":
                detail += f", tolerance {tolerance.describe()}"
            if not f.ok:
                ET.SubElement(case, "failure", message=f"{f.verdict}: {detail}")
            elif f.verdict != "same":
                ET.SubElement(case, "system-out").text = f"{f.verdict}: {detail}"
        for n in c.notes:
            ET.SubElement(suite, "system-out").text = f"note: {n}"
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


# --- commands -----------------------------------------------------------------------------------

@click.command()
@model_options()
@plan_options
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The baseline file to write (JSON).")
@click.option("--json", "print_json", is_flag=True, help="Print the baseline document instead of a table.")
def baseline(model: str, params: Params, output: str, print_json: bool) -> None:
    """Record the memory figures of MODEL's plan in a baseline for `check`.

    The figures of MODEL planned with these flags: bytes per buffer type of the compute, KV, output and model buffers, and the nodes
    and splits of the pp and tg graphs. The file also holds the effective parameters, the
    llama.cpp commit the plan reproduces, and the model path and flags as given.

    Example: schedplan baseline model.gguf -c 4096 -o model-c4096.json
    """
    from ..planner.reserve import reserve as plan

    flags = given_flags()
    with fail_cleanly():
        result = plan(model, params)
        doc = baseline_document(model, flags, result)
        Path(output).write_text(json.dumps(doc, indent=1) + "\n")
    if print_json:
        click.echo(json.dumps(doc, indent=1))
        return
    click.echo(f"{label(model, flags)}: {len(doc['figures'])} figures written to {output}")
    click.echo(tabulate([[k, f"{v:,}"] for k, v in doc["figures"].items()], headers=["figure", "value"],
                        disable_numparse=True, colalign=("left", "right")))


@click.command()
@model_options(required=False)
@plan_options
@click.option("--baseline", "baseline_path", metavar="FILE", help="The baseline to check against (from `baseline`).")
@click.option("--manifest", metavar="FILE",
              help="Check every configuration a manifest lists instead: a JSON list of {\"model\", \"flags\", "
                   "\"baseline\"} objects, or a .toml file of [[check]] tables with those keys. flags is a "
                   "string (\"-c 4096 -fa on\") or a list; relative paths are relative to the manifest; "
                   "model may be an http(s) URL.")
@click.option("--tolerance", type=ToleranceType(), default="0", show_default=True,
              help="How much a byte figure may grow: N% of its baseline value (1%, 0.5%) or an absolute size "
                   "in bytes, KiB, MiB or GiB (4096, 512KiB, 4MiB). Growth equal to the tolerance passes.")
@click.option("--json", "print_json", is_flag=True, help="Print the results as JSON.")
@click.option("--junit", "junit_path", metavar="FILE", type=click.Path(dir_okay=False),
              help="Also write JUnit XML: a testsuite per configuration, a testcase per figure.")
def check(model: Optional[str], params: Params, baseline_path: Optional[str], manifest: Optional[str],
          tolerance: Tolerance, print_json: bool, junit_path: Optional[str]) -> None:
    """Plan MODEL again and check its figures against a baseline (for CI).

    Each figure of the baseline (see `schedplan baseline --help`) is printed with its baseline and
    new value, the delta and a verdict. A byte figure that grew by more than --tolerance is a
    REGRESSION; one that shrank is reported and passes; a buffer type new since the baseline counts
    as growth from 0. Nodes and splits must be equal. Notes tell when the effective parameters or
    the llama.cpp commit differ from the baseline's.

    Exit status: 0 when every figure passes, 1 on a regression, 2 on an error (a missing or bad
    model, baseline or manifest; with --manifest, an error in any configuration).

    \b
    Examples:
      schedplan check model.gguf -c 4096 --baseline model-c4096.json --tolerance 1%
      schedplan check --manifest memory.toml --tolerance 4MiB --junit memory.xml
    """
    flags = given_flags()
    if manifest is not None:
        if model is not None or flags or baseline_path is not None:
            die("--manifest lists the configurations to check: give no MODEL, flags or --baseline with it")
        try:
            entries = load_manifest(manifest)
        except (BadInput, *USER_ERRORS) as e:
            die(error_message(e))
        checks = [check_config(e.model, e.flags, None, e.baseline, tolerance) for e in entries]
        where = [f"{manifest}, entry {i}: " for i in range(1, len(checks) + 1)]
    else:
        if model is None or baseline_path is None:
            die("check needs MODEL and --baseline FILE, or --manifest FILE")
        checks = [check_config(model, flags, params, baseline_path, tolerance)]
        where = [""]

    if junit_path is not None:
        with fail_cleanly():
            Path(junit_path).write_text(junit_xml(checks, tolerance))
    status = 2 if any(c.error for c in checks) else 1 if any(c.status == "fail" for c in checks) else 0
    if print_json:
        click.echo(json.dumps({"status": ["pass", "fail", "error"][status], "tolerance": tolerance.text,
                               "configs": [as_json(c) for c in checks]}, indent=1))
    else:
        blocks = [render(c, tolerance) for c in checks if c.error is None]
        if blocks:
            click.echo("\n\n".join(blocks))
        if len(checks) > 1:
            n = {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "error")}
            click.echo(f"\n{len(checks)} configurations: {n['pass']} passed, {n['fail']} failed, "
                       f"{n['error']} could not be checked")
    for c, w in zip(checks, where):
        if c.error is not None:
            click.echo(f"error: {w}{c.error}", err=True)
    raise SystemExit(status)
