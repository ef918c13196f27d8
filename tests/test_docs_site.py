"""The documentation site and the distributions stay wired up (issue 17).

``mkdocs build --strict`` and the wheel build run in ``.ci/run`` (they need
the docs extra and the network); these checks keep their inputs current."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import gen_api_page  # noqa: E402


def test_the_api_page_is_generated_from_all() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    assert page == gen_api_page.render(), "run: python tools/gen_api_page.py"
    import pjrt_py

    paths = [p for p in re.findall(r"^::: ([\w.]+)$", page, re.M) if p not in gen_api_page.MODULES]
    listed = [path.split(".")[-1] for path in paths]
    assert sorted(listed) == sorted(pjrt_py.__all__)


def test_every_page_is_in_the_site_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    in_nav = set(re.findall(r":\s*([\w/]+\.md)\s*$", config, re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == in_nav
    assert "strict: true" in config and "docstring_style: numpy" in config


def test_ci_builds_the_site_and_installs_the_wheel_without_a_compiler() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in ci
    assert "bash tools/build_dist.sh" in ci
    assert "CC=/bin/false" in ci and "--only-binary :all:" in ci
    script = (ROOT / "tools" / "build_dist.sh").read_text()
    assert "python -m build" in script and "auditwheel repair" in script
    assert "twine check --strict" in script


def test_the_sdist_carries_what_the_build_needs() -> None:
    manifest = (ROOT / "MANIFEST.in").read_text()
    for needed in ("build_ffi.py", "native", "include/pjrt_py"):
        assert needed in manifest
    # Every file setup.py compiles is under those paths.
    assert all(p.suffix in (".c", ".h") for p in (ROOT / "native").iterdir() if p.is_file())
