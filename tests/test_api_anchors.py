"""The built API reference documents every public name and method (issue 27).

Reads the built site's ``api/index.html`` (``$PJRT_PY_SITE``, which
``.ci/run`` sets after ``mkdocs build``); skips, saying so, without one.
Methods defined on the native bases (``Client.buffer_async``,
``Executable.execute_async``) count: they are the public classes' methods.

Two checks: the HTML as built (runs wherever the site is), and the page as a
reader gets it, in headless Chromium after the theme's scripts ran (where
Chromium is installed, as tests/test_site_render.py): each anchor is in the
live DOM, laid out (not hidden), titled with its name, with a permalink and
a rendered description, and a link to one lands on it.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from site_browser import NEEDS_CHROMIUM, SITE, Handler, chromium, serving

import pjrt_py

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


# Runs in a page of the same origin that loads the reference in a frame, then
# writes what it found into its own DOM, which --dump-dom prints.
_CHECK = """<!doctype html><meta charset="utf-8">
<iframe id="page" style="width:1280px;height:1600px" src="/api/#{deep}"></iframe>
<pre id="result">pending</pre>
<script>
const expected = {expected};
document.getElementById("page").addEventListener("load", () => setTimeout(() => {{
  const frame = document.getElementById("page");
  const doc = frame.contentDocument;
  const problems = {{missing: [], hidden: [], untitled: [], unlinked: [], empty: []}};
  for (const ids of expected) {{
    const el = ids.map((id) => doc.getElementById(id)).find((e) => e);
    if (!el) {{ problems.missing.push(ids[0]); continue; }}
    if (el.getClientRects().length === 0) problems.hidden.push(ids[0]);
    const name = el.querySelector(".doc-object-name");
    const last = el.id.split(".").pop();
    if (!name || name.textContent.trim() !== last) problems.untitled.push(ids[0]);
    const link = el.querySelector("a.headerlink");
    if (!link || link.getAttribute("href") !== "#" + el.id) problems.unlinked.push(ids[0]);
    const contents = el.parentElement.querySelector(":scope > .doc-contents");
    if (!contents || contents.innerText.trim() === "") problems.empty.push(ids[0]);
  }}
  const deep = doc.getElementById("{deep}");
  const top = deep ? deep.getBoundingClientRect().top : null;
  const text = doc.body.innerText;
  document.getElementById("result").textContent = JSON.stringify({{
    problems, deepTop: top, height: frame.contentWindow.innerHeight,
    anchors: doc.querySelectorAll('[id^="pjrt_py."]').length,
    privateShown: ["pjrt_py._core", "pjrt_py.runtime.process", "Bases:"]
      .filter((s) => text.includes(s)),
  }});
}}, 500));
</script>
"""


@pytest.fixture(scope="module")
def rendered() -> Iterator[dict[str, object]]:
    """What the reference page holds in Chromium, after its scripts ran."""
    deep = "pjrt_py.Executable.execute_async"  # a method of a native base, deep in the page
    Handler.extra["/anchor-check.html"] = _CHECK.format(expected=json.dumps(_expected()), deep=deep)
    try:
        with serving() as url:
            dom = chromium("--virtual-time-budget=10000", "--dump-dom", f"{url}/anchor-check.html")
    finally:
        Handler.extra.pop("/anchor-check.html", None)
    found = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
    assert found and found.group(1) != "pending", dom[-2000:]
    result: dict[str, object] = json.loads(found.group(1).replace("&amp;", "&"))
    yield result


@NEEDS_CHROMIUM
def test_every_public_name_and_method_renders_in_chromium(rendered: dict[str, object]) -> None:
    problems = rendered["problems"]
    assert isinstance(problems, dict)
    assert problems == {k: [] for k in problems}, problems
    assert isinstance(rendered["anchors"], int) and rendered["anchors"] >= len(_expected())
    assert rendered["privateShown"] == []


@NEEDS_CHROMIUM
def test_a_link_to_a_method_lands_on_it(rendered: dict[str, object]) -> None:
    top, height = rendered["deepTop"], rendered["height"]
    assert isinstance(top, (int, float)) and isinstance(height, (int, float)), rendered
    assert 0 <= top < height / 2, (top, height)  # scrolled to, below the sticky header
