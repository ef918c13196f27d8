"""The built documentation site, opened in headless Chromium as a reader
would (issue 17): the home page, the API reference and the performance page
render, with highlighted code blocks and the benchmark plots loaded.

Needs a built site (``mkdocs build --site-dir DIR``, named by
``$PJRT_PY_SITE``) and Chromium (``/usr/bin/chromium``; Debian's
``chromium`` package). ``.ci/run`` builds the site, installs Chromium where
it can, and runs this file; elsewhere the tests skip, saying which is
missing. Screenshots go to ``$PJRT_PY_SITE_SHOTS`` when set.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from site_browser import NEEDS_CHROMIUM, NEEDS_SITE, Handler, chromium, serving

pytestmark = [NEEDS_SITE, NEEDS_CHROMIUM]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serving() as url:
        yield url


def screenshot(url: str, name: str) -> np.ndarray:
    import matplotlib.image

    shots = Path(os.environ.get("PJRT_PY_SITE_SHOTS") or tempfile.mkdtemp())
    shots.mkdir(parents=True, exist_ok=True)
    out = shots / f"{name}.png"
    chromium("--window-size=1280,1600", "--virtual-time-budget=5000", f"--screenshot={out}", url)
    pixels: np.ndarray = matplotlib.image.imread(out)
    return pixels


@pytest.mark.parametrize(
    ("page", "must_show"),
    [
        ("", ["pjrt_py", "Where to start"]),
        ("api/", ["API reference", "Client", "register_callback", "Parameters"]),
        ("performance/", ["Performance", "Targets"]),
    ],
    ids=["home", "api", "performance"],
)
def test_pages_render_with_their_code_and_plots(
    server: str, page: str, must_show: list[str]
) -> None:
    url = f"{server}/{page}"
    Handler.requested.clear()
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", url)
    for text in must_show:
        assert text in dom, f"{url}: {text!r} not rendered"
    # Material's stylesheet arrived: the page is styled, not bare HTML.
    assert any(p.endswith(".css") and code == 200 for p, code in Handler.requested)
    if page == "":
        assert 'class="highlight"' in dom and "<code" in dom  # a highlighted code block
    if page == "performance/":
        plots = [p for p, code in Handler.requested if p.endswith(".png") and code == 200]
        assert len(plots) >= 5, f"plots served: {plots}"
        assert dom.count("<img") >= 5
    pixels = screenshot(url, page.strip("/") or "home")
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1200
    assert float(pixels[..., :3].std()) > 0.05, "the screenshot is blank"
