"""Helpers shared by the benchmarks: timing, the C baseline build, reporting."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    try:
        spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    except ModuleNotFoundError:  # not even the xla_plugins namespace
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("install xla-cpu-pjrt (it ships pjrt_c_api.h)")
    return Path(next(iter(spec.submodule_search_locations))) / "include"


def build_c(source: str, out_dir: str | None = None) -> Path:
    """Compile benchmarks/<source> into a shared library; returns its path.

    Where $PJRT_PY_BENCH_LIBS names a folder holding it already built (the
    GPU check carries them: the machine it runs on has no pjrt_c_api.h, and
    perhaps no compiler), that one is used.
    """
    name = Path(source).stem + ".so"
    prebuilt = os.environ.get("PJRT_PY_BENCH_LIBS")
    if prebuilt and out_dir is None and (Path(prebuilt) / name).is_file():
        return Path(prebuilt) / name
    out = Path(out_dir or tempfile.mkdtemp(prefix="pjrt_py_bench_"))
    so = out / name
    cc = os.environ.get("CC", "cc")
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", f"-I{header_dir()}", str(HERE / source), "-o", str(so)],
        check=True,
    )
    return so


def load_c(source: str, cdef: str) -> tuple[Any, Any, Callable[[Any], Any]]:
    """Build benchmarks/<source> and load it with its own cffi FFI.

    Returns (ffi, lib, addr): ``addr`` turns the address of one of pjrt_py's
    PJRT handles (an int: ``plugin.address``, ``client._handle``,
    ``buffer._handle``, ...) into a ``void*`` of this FFI, for the C code.
    """
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(cdef)
    lib = ffi.dlopen(str(build_c(source)))

    def addr(address: int) -> Any:
        return ffi.cast("void*", address)

    return ffi, lib, addr


def per_call(fn: Callable[[int], None], n: int, repeats: int) -> float:
    """Median seconds per call of ``fn(n)`` (which makes n calls) over repeats."""
    return median_seconds(lambda: fn(n), repeats, warmup=0) / n


def interleaved(timers: dict[str, Callable[[int], None]], n: int, repeats: int) -> dict[str, float]:
    """Median microseconds per call of each timer, after a warm-up.

    Each ``timers[name](k)`` makes k calls. The timers take turns within every
    round, so noise on the machine falls on all of them alike and their
    ratios stay meaningful.
    """
    for fn in timers.values():
        fn(max(1, n // 10))
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, fn in timers.items():
            samples[name].append(per_call(fn, n, 1))
    return {name: statistics.median(s) * 1e6 for name, s in samples.items()}


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over repeats, after warm-up calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def target(name: str, value: float, limit: float, kind: str = "max") -> dict[str, Any]:
    """A performance target: ``value <= limit`` (kind "max") or ``>=`` ("min")."""
    met = value <= limit if kind == "max" else value >= limit
    return {"name": name, "value": value, "limit": limit, "kind": kind, "met": bool(met)}


def machine() -> dict[str, object]:
    return {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "platform": sys.platform,
        "processor": platform.machine(),
    }


def cli(description: str, run: Callable[..., dict[str, Any]]) -> None:
    """The command line every benchmark module shares: --quick, --json."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--json", help="write the report here")
    opts = parser.parse_args()
    report = run(quick=opts.quick)
    print_report(report)
    if opts.json:
        Path(opts.json).write_text(json.dumps(report, indent=2))


def print_report(report: dict[str, Any]) -> None:
    print(f"== {report['benchmark']}: {report.get('what', '')}")
    for row in report.get("table", []):
        print(
            "   " + "  ".join(f"{cell:>14}" if i else f"{cell:<44}" for i, cell in enumerate(row))
        )
    for t in report.get("targets", []):
        sign = "<=" if t["kind"] == "max" else ">="
        mark = "met" if t["met"] else "MISSED"
        print(f"   target {t['name']}: {t['value']:.3g} {sign} {t['limit']:g}  {mark}")
    for note in report.get("notes", []):
        print(f"   note: {note}")
