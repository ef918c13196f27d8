"""The build picks the newest PJRT header an installed wheel carries."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import build_ffi
except FileNotFoundError as e:  # it looks for the header at import
    pytest.skip(f"needs pjrt_c_api.h, the build's input: {e}", allow_module_level=True)


def _fake_header(root: Path, rel: str, minor: int) -> Path:
    real = build_ffi.installed_headers()[0].read_text()
    text, count = build_ffi.re.subn(
        r"#define\s+PJRT_API_MINOR\s+\d+", f"#define PJRT_API_MINOR {minor}", real
    )
    assert count == 1
    path = root / rel
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_the_newest_installed_header_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PJRT_PY_HEADER", raising=False)
    newer = _fake_header(tmp_path, "some_plugin/include/pjrt_c_api.h", 999)
    _fake_header(tmp_path, "xla_tree/include/xla/pjrt/c/pjrt_c_api.h", 5)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert build_ffi.find_header() == newer.resolve()
    assert build_ffi.header_version(newer) == (0, 999)


def test_an_explicit_header_wins_over_newer_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_header(tmp_path, "some_plugin/include/pjrt_c_api.h", 999)
    chosen = _fake_header(tmp_path, "mine/pjrt_c_api.h", 1)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setenv("PJRT_PY_HEADER", str(chosen.parent))
    assert build_ffi.find_header() == chosen


def test_the_build_header_matches_the_compiled_module() -> None:
    import pjrt_py.runtime.capi as ffi_module

    header = build_ffi.find_header()
    assert build_ffi.header_version(header) == (
        ffi_module.lib.PJRT_API_MAJOR,
        ffi_module.lib.PJRT_API_MINOR,
    )
