"""The type stub of the native core, ``pjrt_py/_core.pyi``, agrees with the
built module (``mypy.stubtest``).

A stub that disagrees lets a call type-check that fails at runtime (a keyword
to a C method that takes none) or hides what exists. Differences that are
deliberate, or a fault of the runtime's own signature text, are listed with
the reason in ``tests/stubtest_allowlist.txt``; an entry that no longer
matches an error fails here too.

mypy is in the ``lint`` extra, not ``test``: where it is not installed (the
CI's ``pip install -e ".[test]"``) this test skips with the reason.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALLOWLIST = Path(__file__).resolve().parent / "stubtest_allowlist.txt"


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="needs mypy (the lint extra: pip install -e '.[lint]')",
)
def test_core_stub_matches_the_native_module(tmp_path: Path) -> None:
    config = tmp_path / "mypy.ini"
    # The stub's own imports (numpy) are read; anything they reach that has no
    # types is not this stub's business.
    config.write_text("[mypy]\nignore_missing_imports = True\n")
    command = [
        sys.executable,
        "-m",
        "mypy.stubtest",
        "pjrt_py._core",
        "--mypy-config-file",
        str(config),
        "--allowlist",
        str(ALLOWLIST),
    ]
    # From the repository root: the stub and the built extension are read from
    # the checkout, as the package is installed editable.
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, (
        f"stubtest found differences between pjrt_py/_core.pyi and pjrt_py._core "
        f"(exit {result.returncode}):\n{result.stdout}{result.stderr}"
    )
