"""Run every benchmark on the CPU plugin, print the tables, write the JSON,
and regenerate docs/performance.md with its plots.

    python -m benchmarks [--quick] [--only dispatch,small] [--out docs]

Each benchmark runs in its own process, so one's memory (256 MiB arrays, jax)
does not disturb another's timing or RSS.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .report import ORDER, generated_section, plot_all, write_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--only", help="comma-separated subset of: " + ", ".join(ORDER))
    parser.add_argument("--out", default="docs", help="where performance.md goes (default docs)")
    opts = parser.parse_args()
    names = opts.only.split(",") if opts.only else list(ORDER)
    unknown = set(names) - set(ORDER)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")

    reports = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            out = Path(tmp) / f"{name}.json"
            command = [sys.executable, "-m", f"benchmarks.{name}", "--json", str(out)]
            subprocess.run(command + (["--quick"] if opts.quick else []), check=True)
            reports[name] = json.loads(out.read_text())
    elapsed = time.perf_counter() - started

    docs = Path(opts.out)
    figures = docs / "performance"
    figures.mkdir(parents=True, exist_ok=True)
    (figures / "results.json").write_text(json.dumps(reports, indent=2))
    plots = plot_all(reports, figures)
    write_markdown(docs / "performance.md", generated_section(reports, plots))
    missed = [t["name"] for r in reports.values() for t in r.get("targets", []) if not t["met"]]
    print(f"\n{len(reports)} benchmarks in {elapsed:.0f} s; wrote {docs / 'performance.md'}")
    print("targets missed: " + (", ".join(missed) if missed else "none"))


if __name__ == "__main__":
    main()
