"""The built documentation site, served locally and opened in headless Chromium.

Shared by tests/test_site_render.py and tests/test_api_anchors.py. The site is
``$PJRT_PY_SITE`` (a ``mkdocs build --site-dir`` output, which ``.ci/run``
makes); Chromium is Debian's ``chromium`` package.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SITE = os.environ.get("PJRT_PY_SITE")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

NEEDS_SITE = pytest.mark.skipif(
    not SITE or not Path(SITE, "index.html").exists(),
    reason="no built site: set PJRT_PY_SITE to a `mkdocs build` output (.ci/run does)",
)
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)"
)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


class Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the site; records each request; serves ``extra`` pages from memory."""

    requested: list[tuple[str, int]] = []
    extra: dict[str, str] = {}

    def do_GET(self) -> None:  # noqa: N802  (the base class's name)
        page = type(self).extra.get(self.path)
        if page is None:
            super().do_GET()
            return
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        type(self).requested.append((self.path, int(code) if str(code).isdigit() else 0))


@contextmanager
def serving() -> Iterator[str]:
    """Serve the site on a free local port; yields its base URL."""
    handler = functools.partial(Handler, directory=SITE)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def chromium(*args: str) -> str:
    """Run headless Chromium with these arguments; its stdout (``--dump-dom``'s DOM)."""
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [CHROMIUM or "chromium", *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout
