"""The built API reference documents every public name and method (issue 27).

Reads the built site's ``api/index.html`` (``$PJRT_PY_SITE``, which
``.ci/run`` sets after ``mkdocs build``); skips, saying so, without one.
Methods defined on the native bases (``Client.buffer_async``,
``Executable.execute_async``) count: they are the public classes' methods.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest

import pjrt_py

SITE = os.environ.get("PJRT_PY_SITE")
PAGE = Path(SITE or ".", "api", "index.html")

pytestmark = pytest.mark.skipif(
    not SITE or not PAGE.exists(),
    reason="no built site: set PJRT_PY_SITE to a `mkdocs build` output (.ci/run does)",
)


def _public_methods(cls: type) -> list[str]:
    """Methods and properties (data fields are in the class's own docstring)."""
    names = []
    for name in dir(cls):
        if name.startswith("_") or issubclass(cls, BaseException):
            continue
        owner = next((b for b in cls.__mro__ if b is not object and name in vars(b)), None)
        if owner is None:
            continue
        member = vars(owner)[name]
        if callable(member) or inspect.isdatadescriptor(member):
            names.append(name)
    return names


def _expected() -> list[tuple[str, ...]]:
    """Each public name's and method's anchor, with the other ids it may go by."""
    anchors: list[tuple[str, ...]] = []
    for name in pjrt_py.__all__:
        obj = getattr(pjrt_py, name)
        # A function sharing its name with a submodule is documented by its module's path.
        anchors.append((f"pjrt_py.{name}", f"{getattr(obj, '__module__', '')}.{name}"))
        if inspect.isclass(obj):
            anchors += [(f"pjrt_py.{name}.{m}",) for m in _public_methods(obj)]
    return anchors


def test_every_public_name_and_method_has_an_anchor() -> None:
    page = PAGE.read_text()
    found = set(re.findall(r'id="(pjrt_py\.[\w.]+)"', page))
    missing = [ids[0] for ids in _expected() if not found.intersection(ids)]
    assert not missing, missing


def test_no_private_name_is_shown() -> None:
    text = re.sub(r"<[^>]+>", " ", PAGE.read_text())
    assert "pjrt_py._core" not in text and "pjrt_py.runtime.process" not in text
    assert "Bases:" not in text
