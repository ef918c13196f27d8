"""``pjrt-py smoke``: compile and run a small program on each plugin, one process each."""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np

from .info import chosen

SMOKE_PROGRAM = """
func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.multiply %x, %y : tensor<4xf32>
  %1 = stablehlo.add %0, %x : tensor<4xf32>
  return %1 : tensor<4xf32>
}
"""


def _smoke_one(path: str) -> None:
    from .. import Client

    client = Client(path)
    exe = client.compile(SMOKE_PROGRAM)
    x = np.array([1, 2, 3, 4], np.float32)
    y = np.array([0.5, -1, 2, 0], np.float32)
    out = exe.execute_async(x, y).to_numpy_async().value()
    np.testing.assert_allclose(out, x * y + x)


def command(args: argparse.Namespace) -> int:
    from .. import plugins

    if args.only:  # the child process for one plugin
        _smoke_one(args.only)
        return 0
    found = chosen(plugins(), args.plugin)
    if not found:
        print("FAIL: no PJRT plugins found")
        return 1
    failures = 0
    for info in found:
        # One process per plugin: a plugin that aborts cannot take the rest down.
        proc = subprocess.run(
            [sys.executable, "-m", "pjrt_py", "smoke", "--only", info.path],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0:
            print(f"ok    {info.name}: {info.path}")
        else:
            failures += 1
            reason = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            print(f"FAIL  {info.name}: {info.path}: {reason}")
    return 1 if failures else 0
