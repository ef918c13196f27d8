"""The plugin's log lines, through Python's ``logging``: a quiet happy path.

XLA's plugins log with absl straight to file descriptor 2, at levels of
their own choosing. On the happy path some builds write error-level lines
that are not errors (measured, this machine):

- ``fastatomstruct-xla-cpu`` on every executable it loads (``deserialize``,
  a disk cache hit, an isolated compile): two ``E ... cpu_aot_loader.cc``
  lines per load, each listing about 100 CPU features, because the compiler
  records LLVM's tuning flags ``+prefer-no-gather`` / ``+prefer-no-scatter``
  and the loader finds them among no instruction sets;
- ``xla-cpu-pjrt`` on a first compile: ``E ... library_matcher.h] Unsupported
  fusion type: 5`` (left as it is: see below);
- both, once: absl's "All log messages before absl::InitializeLog() is
  called are written to STDERR".

So while the plugin loads an executable, pjrt_py takes its file descriptor
2 into a temporary file and hands each line to the logger
``pjrt_py.plugin`` at the plugin's own level (``I`` INFO, ``W`` WARNING,
``E`` ERROR, ``F`` CRITICAL), except the known lines above, which go at
DEBUG. With no logging configured, Python prints WARNING and above to
stderr, so real errors still show; ``logging.getLogger("pjrt_py.plugin")``
with a handler at DEBUG shows everything. Lines that are not the plugin's
log format (another thread's output) go back to descriptor 2 as they were.

Decisions: compiles are not captured: a compiler that crashes writes its
last words (a ``CHECK`` failure) to descriptor 2 and they must stay there
(the 0.81 build's one line per process remains). Descriptor 2 is
process-wide, so overlapping loads share one
capture (the first starts it, the last ends it and forwards what came), and
another thread's stderr written meanwhile is delayed until then, never
lost. ``PJRT_PY_PLUGIN_LOG=raw`` leaves descriptor 2 alone.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

logger = logging.getLogger("pjrt_py.plugin")

ENV = "PJRT_PY_PLUGIN_LOG"

_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
_ABSL = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w./+-]+:\d+)\] ")
# Lines measured to be noise on the happy path (see the module doc).
_KNOWN = [
    re.compile(
        r"cpu_aot_loader\.cc:\d+\] Loading XLA:CPU AOT result\. Target machine feature "
        r"\+prefer-no-(gather|scatter) is not +supported"
    ),
    re.compile(r"library_matcher\.h:\d+\] Unsupported fusion type"),
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called"),
]

_lock = threading.Lock()
_depth = 0
_saved_fd = -1
_file: IO[bytes] | None = None


def _start() -> None:
    global _saved_fd, _file
    sys.stderr.flush()
    _file = tempfile.TemporaryFile()  # noqa: SIM115  (kept open until the last capture ends)
    _saved_fd = os.dup(2)
    os.dup2(_file.fileno(), 2)


def _stop() -> bytes:
    global _saved_fd, _file
    assert _file is not None
    os.dup2(_saved_fd, 2)
    os.close(_saved_fd)
    _saved_fd = -1
    _file.seek(0)
    data = _file.read()
    _file.close()
    _file = None
    return data


@contextmanager
def captured() -> Iterator[None]:
    """Route the plugin's log lines written in the block to ``logging``."""
    global _depth
    if os.environ.get(ENV, "").lower() == "raw":
        yield
        return
    with _lock:
        if _depth == 0:
            _start()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            data = _stop() if _depth == 0 else b""
        if data:
            forward(data.decode("utf-8", "replace"))


def forward(text: str) -> None:
    """Hand captured lines on: the plugin's to the logger, others back to fd 2."""
    passthrough = []
    for line in text.splitlines():
        absl = _ABSL.match(line)
        known = any(k.search(line) for k in _KNOWN)
        if known:
            logger.debug("%s", line)
        elif absl:
            logger.log(_LEVELS[absl.group(1)], "%s", line)
        else:
            passthrough.append(line)
    if passthrough:
        os.write(2, ("\n".join(passthrough) + "\n").encode())


def _after_fork_in_child() -> None:
    """A child forked mid-capture gets its own stderr back (the file stays the parent's)."""
    global _depth, _saved_fd, _file, _lock
    _lock = threading.Lock()
    if _depth:
        os.dup2(_saved_fd, 2)
        os.close(_saved_fd)
    _depth, _saved_fd, _file = 0, -1, None


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["ENV", "captured", "forward", "logger"]
