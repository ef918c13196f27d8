"""The benchmarks run (tiny sizes) and report well-formed results. No timing
is asserted here: speed is judged by the ratios the benchmarks print."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dispatch_benchmark_writes_well_formed_json(tmp_path: Path) -> None:
    out = tmp_path / "dispatch.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.dispatch",
            "--quick",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["benchmark"] == "dispatch"
    timings = report["us_per_call"]
    assert {"c_loop", "pjrt_py.execute_async"} <= set(timings)
    assert all(math.isfinite(v) and v > 0 for v in timings.values())
    assert report["ratio_to_c_loop"]["c_loop"] == 1.0
    assert "pjrt_py.execute_async" in result.stdout
