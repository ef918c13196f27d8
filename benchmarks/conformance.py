"""``pjrt-py test`` against a plain in-process loop over the same files.

Forty generated check-style programs (element-wise f32/f64/i32 arithmetic,
transcendentals checked in ulps, matrix products, reductions, comparisons,
complex numbers), each with two checks. Both sides start cold, as CI does:

- "in-process loop" is one fresh Python that loads the default CPU plugin and,
  for every file, rewrites, compiles, executes and compares it (the worker's
  own ``run_case``, so both sides do the same work);
- "pjrt-py test -j 2" is the command line in a fresh process: its worker
  pool on the same plugin, crash/timeout isolation and reporting included.

The two take turns within each round; the ratio is of the medians. Each
round also runs both sides on the first quarter of the files, which splits
each side's time into a fixed cost and a marginal cost per file (the
difference of the two medians over the difference in files).

    python -m benchmarks.conformance [--quick] [--json out.json]
"""  # noqa: E501

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import cli, machine, target

LOOP = "in-process loop"
RUNNER = "pjrt-py test -j 2"

# argv: the case directory. Loads the plugin and runs every case in order.
CHILD = """
import sys
from pathlib import Path
import pjrt_py
from pjrt_py.conformance.cases import discover
from pjrt_py.conformance.worker import run_case
client = pjrt_py.Client()
for path in discover([sys.argv[1]]):
    record = run_case(client, path)
    assert record["status"] == "pass", (path, record)
"""  # noqa: E501

_KINDS = ("add", "exp", "dot", "reduce", "compare", "complex", "f64")


def program(k: int) -> str:
    """The k-th generated check-style program (two checks, all passing)."""
    n = 4 + k % 13
    kind = _KINDS[k % len(_KINDS)]
    if kind == "add":
        return f"""func.func @main() -> tensor<{n}xf32> {{
  %a = stablehlo.iota dim = 0 : tensor<{n}xf32>
  %c = stablehlo.constant dense<{k}.5> : tensor<{n}xf32>
  %b = stablehlo.add %a, %c : tensor<{n}xf32>
  %d = stablehlo.subtract %b, %c : tensor<{n}xf32>
  stablehlo.custom_call @check.expect_eq(%d, %a) : (tensor<{n}xf32>, tensor<{n}xf32>) -> ()
  stablehlo.custom_call @check.expect_almost_eq(%b, %b) : (tensor<{n}xf32>, tensor<{n}xf32>) -> ()
  return %b : tensor<{n}xf32>
}}"""  # noqa: E501
    if kind == "exp":
        return f"""func.func @main() -> tensor<{n}xf32> {{
  %a = stablehlo.iota dim = 0 : tensor<{n}xf32>
  %s = stablehlo.constant dense<0.{k + 1}> : tensor<{n}xf32>
  %x = stablehlo.multiply %a, %s : tensor<{n}xf32>
  %e = stablehlo.exponential %x : tensor<{n}xf32>
  %l = stablehlo.log %e : tensor<{n}xf32>
  stablehlo.custom_call @check.expect_close(%l, %x) {{max_ulp_difference = 1000 : i64}} : (tensor<{n}xf32>, tensor<{n}xf32>) -> ()
  stablehlo.custom_call @check.expect_almost_eq(%l, %x) : (tensor<{n}xf32>, tensor<{n}xf32>) -> ()
  return %e : tensor<{n}xf32>
}}"""  # noqa: E501
    if kind == "dot":
        return f"""func.func @main() -> tensor<{n}x{n}xf32> {{
  %i = stablehlo.iota dim = 0 : tensor<{n}x{n}xf32>
  %j = stablehlo.iota dim = 1 : tensor<{n}x{n}xf32>
  %eye = stablehlo.compare EQ, %i, %j : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xi1>
  %one = stablehlo.constant dense<1.0> : tensor<{n}x{n}xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<{n}x{n}xf32>
  %id = stablehlo.select %eye, %one, %zero : tensor<{n}x{n}xi1>, tensor<{n}x{n}xf32>
  %p = stablehlo.dot_general %i, %id, contracting_dims = [1] x [0] : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
  stablehlo.custom_call @check.expect_almost_eq(%p, %i) : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> ()
  stablehlo.custom_call @check.expect_eq(%id, %id) : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> ()
  return %p : tensor<{n}x{n}xf32>
}}"""  # noqa: E501
    if kind == "reduce":
        total = n * (n - 1) // 2 + k * n
        return f"""func.func @main() -> tensor<i32> {{
  %a = stablehlo.iota dim = 0 : tensor<{n}xi32>
  %c = stablehlo.constant dense<{k}> : tensor<{n}xi32>
  %b = stablehlo.add %a, %c : tensor<{n}xi32>
  %z = stablehlo.constant dense<0> : tensor<i32>
  %s = stablehlo.reduce(%b init: %z) applies stablehlo.add across dimensions = [0] : (tensor<{n}xi32>, tensor<i32>) -> tensor<i32>
  stablehlo.custom_call @check.expect_eq_const(%s) {{value = dense<{total}> : tensor<i32>}} : (tensor<i32>) -> ()
  stablehlo.custom_call @check.expect_eq(%b, %b) : (tensor<{n}xi32>, tensor<{n}xi32>) -> ()
  return %s : tensor<i32>
}}"""  # noqa: E501
    if kind == "compare":
        return f"""func.func @main() -> tensor<{n}xi1> {{
  %a = stablehlo.iota dim = 0 : tensor<{n}xi32>
  %h = stablehlo.constant dense<{n // 2}> : tensor<{n}xi32>
  %lt = stablehlo.compare LT, %a, %h, SIGNED : (tensor<{n}xi32>, tensor<{n}xi32>) -> tensor<{n}xi1>
  %ge = stablehlo.compare GE, %a, %h, SIGNED : (tensor<{n}xi32>, tensor<{n}xi32>) -> tensor<{n}xi1>
  %nge = stablehlo.not %ge : tensor<{n}xi1>
  stablehlo.custom_call @check.expect_eq(%lt, %nge) : (tensor<{n}xi1>, tensor<{n}xi1>) -> ()
  stablehlo.custom_call @check.expect_eq(%ge, %ge) : (tensor<{n}xi1>, tensor<{n}xi1>) -> ()
  return %lt : tensor<{n}xi1>
}}"""  # noqa: E501
    if kind == "complex":
        return f"""func.func @main() -> tensor<2xcomplex<f32>> {{
  %a = stablehlo.constant dense<[({k}.0, 1.0), (2.0, -{k}.0)]> : tensor<2xcomplex<f32>>
  %b = stablehlo.multiply %a, %a : tensor<2xcomplex<f32>>
  %c = stablehlo.constant dense<[({k * k - 1}.0, {2 * k}.0), ({4 - k * k}.0, -{4 * k}.0)]> : tensor<2xcomplex<f32>>
  stablehlo.custom_call @check.expect_almost_eq(%b, %c) : (tensor<2xcomplex<f32>>, tensor<2xcomplex<f32>>) -> ()
  stablehlo.custom_call @check.expect_eq(%a, %a) : (tensor<2xcomplex<f32>>, tensor<2xcomplex<f32>>) -> ()
  return %b : tensor<2xcomplex<f32>>
}}"""  # noqa: E501
    return f"""func.func @main() -> tensor<{n}xf64> {{
  %a = stablehlo.iota dim = 0 : tensor<{n}xf64>
  %s = stablehlo.sqrt %a : tensor<{n}xf64>
  %q = stablehlo.multiply %s, %s : tensor<{n}xf64>
  stablehlo.custom_call @check.expect_almost_eq(%q, %a) : (tensor<{n}xf64>, tensor<{n}xf64>) -> ()
  stablehlo.custom_call @check.expect_close(%q, %a) {{max_ulp_difference = 4 : i64}} : (tensor<{n}xf64>, tensor<{n}xf64>) -> ()
  return %q : tensor<{n}xf64>
}}"""  # noqa: E501


def write_cases(directory: Path, count: int) -> None:
    for k in range(count):
        (directory / f"case_{k:02d}.mlir").write_text(program(k))


def _seconds(command: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def run(quick: bool = False) -> dict[str, Any]:
    count, repeats = (8, 1) if quick else (40, 5)
    small = count // 4
    with tempfile.TemporaryDirectory(prefix="pjrt_py_conformance_") as tmp:
        full, part = Path(tmp, "all"), Path(tmp, "part")
        full.mkdir()
        part.mkdir()
        write_cases(full, count)
        write_cases(part, small)
        commands = {
            (name, size): command
            for size, directory in ((count, str(full)), (small, str(part)))
            for name, command in (
                (LOOP, [sys.executable, "-c", CHILD, directory]),
                (RUNNER, [sys.executable, "-m", "pjrt_py", "test", directory, "-j", "2"]),
            )
        }
        for command in commands.values():  # warm the page cache, check all pass
            _seconds(command)
        samples: dict[tuple[str, int], list[float]] = {key: [] for key in commands}
        for _ in range(repeats):
            for key, command in commands.items():
                samples[key].append(_seconds(command))
    medians = {key: statistics.median(s) for key, s in samples.items()}
    names = (LOOP, RUNNER)
    seconds = {name: medians[(name, count)] for name in names}
    marginal = {
        name: (medians[(name, count)] - medians[(name, small)]) / (count - small) for name in names
    }
    fixed = {name: seconds[name] - count * marginal[name] for name in names}
    ratio = seconds[RUNNER] / seconds[LOOP]
    return {
        "benchmark": "conformance",
        "what": f"{count} check-style files, cold process each side, median of {repeats}",
        "machine": machine(),
        "files": count,
        "seconds": seconds,
        "marginal_seconds_per_file": marginal,
        "fixed_seconds": fixed,
        "ratio": ratio,
        "table": [["", "seconds", "per file (ms)", "marginal (ms)", "fixed (s)"]]
        + [
            [
                name,
                f"{s:.2f}",
                f"{1000 * s / count:.1f}",
                f"{1000 * marginal[name]:.1f}",
                f"{fixed[name]:.2f}",
            ]
            for name, s in seconds.items()
        ]
        + [["pjrt-py test / in-process loop", f"{ratio:.2f}", "", "", ""]],
        "targets": [target("pjrt-py test / in-process loop", ratio, 1.5)],
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
