"""Helpers shared by the benchmarks: timing, the C baseline build, reporting."""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent

ADD_F32_8 = """
func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


def header_dir() -> Path:
    """Directory of pjrt_c_api.h: $PJRT_PY_HEADER, else the CPU plugin wheel's."""
    override = os.environ.get("PJRT_PY_HEADER")
    if override:
        path = Path(override)
        return path if path.is_dir() else path.parent
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("install xla-cpu-pjrt (it ships pjrt_c_api.h)")
    return Path(next(iter(spec.submodule_search_locations))) / "include"


def build_c(source: str, out_dir: str | None = None) -> Path:
    """Compile benchmarks/<source> into a shared library; returns its path."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="pjrt_py_bench_"))
    so = out / (Path(source).stem + ".so")
    cc = os.environ.get("CC", "cc")
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", f"-I{header_dir()}", str(HERE / source), "-o", str(so)],
        check=True,
    )
    return so


def per_call(fn: Callable[[int], None], n: int, repeats: int) -> float:
    """Median seconds per call of ``fn(n)`` (which makes n calls) over repeats."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def machine() -> dict[str, object]:
    return {"python": sys.version.split()[0], "cpus": os.cpu_count(), "platform": sys.platform}
