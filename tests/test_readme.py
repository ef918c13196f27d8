"""The README's commands and quick start stay true."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    test_command = blocks[1].strip()
    assert "pytest" in test_command
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def test_quick_start_runs_and_prints_what_it_says(capsys) -> None:  # type: ignore[no-untyped-def]
    code = re.findall(r"```python\n(.*?)```", README, re.S)[0]
    exec(compile(code, "README quick start", "exec"), {})
    printed = capsys.readouterr().out.strip()
    np.testing.assert_array_equal(
        np.array(printed.strip("[]").split(), dtype=np.float32), [4, 6, 8]
    )


def test_ci_runs_the_suite_on_every_cpu_build() -> None:
    from pjrt_py.runtime.discovery import BUILDS

    ci = (ROOT / ".ci" / "run").read_text()
    matrix = re.search(r"for build in ([^;]+);", ci)
    assert matrix is not None
    cpu = [b.distribution for b in BUILDS if b.platform == "cpu"]
    # The README's command runs the default (first) build; the loop, the others.
    assert matrix.group(1).split() == cpu[1:]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"{cpu[0]}==' in pyproject  # the default is the install's dependency
    assert all(f'"{name}==' in pyproject for name in cpu[1:])  # the rest, the test extra
