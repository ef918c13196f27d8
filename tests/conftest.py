"""Shared fixtures: one real CPU plugin client per session, and small programs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import pjrt_py

ADD_F32_8 = """
func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""

# A data-dependent loop: XLA cannot shorten it. Counts to %n.
COUNT_LOOP = """
func.func @main(%n: tensor<i64>) -> tensor<i64> {
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %one = stablehlo.constant dense<1> : tensor<i64>
  %r:2 = stablehlo.while(%i = %zero, %acc = %zero) : tensor<i64>, tensor<i64>
    cond {
      %c = stablehlo.compare LT, %i, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
    } do {
      %i1 = stablehlo.add %i, %one : tensor<i64>
      %a1 = stablehlo.add %acc, %i : tensor<i64>
      stablehlo.return %i1, %a1 : tensor<i64>, tensor<i64>
    }
  return %r#1 : tensor<i64>
}
"""


def matmul_chain(n: int, steps: int) -> str:
    """x -> tanh(x @ x) repeated: dense work the CPU plugin runs asynchronously."""
    t = f"tensor<{n}x{n}xf32>"
    lines = [f"func.func @main(%x0: {t}) -> {t} {{"]
    for i in range(steps):
        lines.append(
            f"  %d{i} = stablehlo.dot_general %x{i}, %x{i}, contracting_dims = [1] x [0]"
            f" : ({t}, {t}) -> {t}"
        )
        lines.append(f"  %x{i + 1} = stablehlo.tanh %d{i} : {t}")
    lines.append(f"  return %x{steps} : {t}")
    lines.append("}")
    return "\n".join(lines)


@pytest.fixture(scope="session")
def client() -> pjrt_py.Client:
    return pjrt_py.Client()


@pytest.fixture(scope="session")
def add_exe(client: pjrt_py.Client) -> pjrt_py.Executable:
    return client.compile(ADD_F32_8)


def installed_build(distribution: str) -> str | None:
    """The library of an installed plugin distribution (e.g. ``xla-cpu-pjrt``), if any."""
    found = [p.path for p in pjrt_py.plugins() if p.distribution == distribution]
    return found[0] if found else None


def needs_build(distribution: str) -> pytest.MarkDecorator:
    """Skip unless that plugin distribution is installed (the test extra has all three)."""
    return pytest.mark.skipif(
        installed_build(distribution) is None,
        reason=f"the {distribution} plugin (in the test extra) is not installed",
    )


def other_build() -> str:
    """A CPU build other than the one ``Client()`` loads (the plugin matrix changes that)."""
    mine = pjrt_py.plugin.find_plugin()
    others = [p.path for p in pjrt_py.plugins() if p.name == "cpu" and p.path != mine]
    if not others:
        pytest.skip("only one CPU plugin build is installed (the test extra has three)")
    return others[0]


def newer_plugin() -> str | None:
    """The PJRT 0.115 CPU plugin (lammps-jax-pjrt-cpu, in the test extra), if installed."""
    newer = [p.path for p in pjrt_py.plugins() if p.path.endswith("pjrt_c_api_cpu_plugin.so")]
    return newer[0] if newer else None


NEEDS_NEWER_PLUGIN = pytest.mark.skipif(
    newer_plugin() is None,
    reason="lammps-jax-pjrt-cpu (a PJRT 0.115 plugin, in the test extra) is not installed",
)


def in_threads(fn: Callable[[int], object], count: int, timeout: float = 60) -> list[BaseException]:
    """Run ``fn(0)`` ... ``fn(count - 1)`` on as many threads at once; what they raised."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            fn(k)
        except BaseException as e:  # handed to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return errors


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter (for exits, aborts and crashes)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )


def build_so(tmp_path: Path, name: str, source: str, include_header: bool = False) -> Path:
    """Compile a small C file into a shared library for plugin-loading tests."""
    src = tmp_path / f"{name}.c"
    src.write_text(textwrap.dedent(source))
    so = tmp_path / f"{name}.so"
    cmd = [os.environ.get("CC", "cc"), "-shared", "-fPIC", str(src), "-o", str(so)]
    if include_header:
        from benchmarks._common import header_dir  # noqa: PLC0415

        cmd.insert(1, f"-I{header_dir()}")
    subprocess.run(cmd, check=True)
    return so
