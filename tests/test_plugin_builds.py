"""The wrong results known in particular CPU plugin builds, proven on those builds.

These test pjrt_py's runner and its table of builds (``pjrt_py.runtime.discovery.BUILDS``),
not the plugins: each defect must show on the build it is listed for and on
no other, so the default ("cpu" picks the build with none) rests on evidence.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import installed_build

import pjrt_py
from pjrt_py.runtime.discovery import BUILDS

ROOT = Path(__file__).resolve().parents[1]
GATHER = ROOT / "tests" / "data" / "known_wrong_gather.mlir"
CPU = [b.distribution for b in BUILDS if b.platform == "cpu"]


def _installed() -> list[str]:
    found = [name for name in CPU if installed_build(name)]
    if len(found) < 2:
        pytest.skip("fewer than two CPU plugin builds are installed (the test extra has three)")
    return found


def test_the_gather_is_wrong_on_the_081_build_only(tmp_path: Path) -> None:
    installed = _installed()
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pjrt_py", "test", str(GATHER), "--all-plugins", "--json",
         str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    statuses = {r["plugin"]: r["status"] for r in json.loads(report.read_text())["results"]}
    assert set(statuses) >= set(installed), statuses
    for name in installed:
        want = "mismatch" if name == "xla-cpu-pjrt" else "pass"
        assert statuses[name] == want, (name, statuses, result.stdout[-2000:])
    assert result.returncode == (1 if "xla-cpu-pjrt" in installed else 0)


def test_the_gather_programs_expected_value_is_numpys() -> None:
    # The constant the check compares with is what numpy computes (so a
    # mismatch is the plugin's, not the test's).
    operand = np.arange(30, dtype=np.float32).reshape(2, 3, 5)
    gathered = operand[:, [2, 2], :]  # offset dims 0 and 2, the index batch in the middle
    expected = np.where(np.array([True, False])[None, :, None], gathered, -1.0)
    text = GATHER.read_text()
    want = text[text.index("%want = stablehlo.constant dense<") :].split("dense<", 1)[1]
    values = [float(v) for v in want[: want.index(">")].replace("[", " ").replace("]", " ")
              .replace(",", " ").split()]  # fmt: skip
    np.testing.assert_array_equal(np.array(values, np.float32).reshape(2, 2, 5), expected)


@pytest.mark.parametrize("size", [49, 50, 64])
def test_atan_is_wrong_on_the_0115_build_from_50_elements(size: int) -> None:
    installed = _installed()
    t = f"tensor<{size}xf32>"
    program = (
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %0 = chlo.atan %x : {t} -> {t}\n"
        f"  return %0 : {t}\n}}"
    )
    x = np.linspace(-5, 5, size).astype(np.float32)
    for name in installed:
        got = pjrt_py.Client(name).compile(program).execute(x).to_numpy()
        error = np.abs(got - np.arctan(x))
        wrong = name == "lammps-jax-pjrt-cpu" and size >= 50
        # The wrong values are unrelated to atan, NaN among them: NaN counts as off.
        assert (not (error <= 0.1).all()) == wrong, (name, size, float(np.nanmax(error)))
