"""The plugin's log lines, through Python's ``logging``: a quiet happy path.

XLA's plugins log with absl straight to file descriptor 2, at levels of
their own choosing. On the happy path some builds write error-level lines
that are not errors (measured, this machine):

- ``fastatomstruct-xla-cpu`` on every executable it loads (``deserialize``,
  a disk cache hit, an isolated compile): two ``E ... cpu_aot_loader.cc``
  lines per load, each listing about 100 CPU features, because the compiler
  records LLVM's tuning flags ``+prefer-no-gather`` / ``+prefer-no-scatter``
  and the loader finds them among no instruction sets;
- ``xla-cpu-pjrt`` on every compile: ``E ... library_matcher.h] Unsupported
  fusion type: 5``;
- both, once: absl's "All log messages before absl::InitializeLog() is
  called are written to STDERR".

So while the plugin compiles or loads an executable, pjrt_py points its file
descriptor 2 at a file and hands each line to the logger ``pjrt_py.plugin``
at the plugin's own level (``I`` INFO, ``W`` WARNING, ``E`` ERROR, ``F``
CRITICAL), except the known lines above, which go at DEBUG. With no logging
configured, Python prints WARNING and above to stderr, so real errors still
show; ``logging.getLogger("pjrt_py.plugin")`` with a handler at DEBUG shows
everything. ``PJRT_PY_PLUGIN_LOG=raw`` leaves descriptor 2 alone.

Decisions:

- A crash keeps its last words. A compiler that fails a ``CHECK`` writes the
  reason to descriptor 2, then aborts: no Python runs after it. The native
  core (``native/stderr_replay.c``) therefore holds a fatal-signal handler
  (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, and SIGTERM where it
  would end the process) that, during a capture, copies what the file holds
  past the last delivered byte to the real stderr before the signal goes on
  to the handler it replaced (faulthandler's, or the default). A normal exit
  during a capture (another thread's ``sys.exit``) does the same from
  ``atexit``. Only ``SIGKILL`` and ``os._exit`` lose the captured lines.
- Descriptor 2 is process-wide, so overlapping captures share one (the first
  starts it, the last ends it), and other threads' output written meanwhile
  goes to the file too. A compile may take minutes, so a daemon thread
  delivers such lines to the real stderr every quarter second, rather than
  when the capture ends; the plugin's own lines go to ``logging`` when it ends
  (emitting them earlier would write the handler's output into the capture).
- Execution, transfers and ``serialize`` are not captured: no build logs
  there (measured), and execution is a hot path.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .. import _core

logger = logging.getLogger("pjrt_py.plugin")

ENV = "PJRT_PY_PLUGIN_LOG"
PUMP_SECONDS = 0.25  # how often other output written during a capture is delivered

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


class _Capture:
    """The process's one capture of descriptor 2 (guarded by ``cond``)."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.depth = 0  # captures open
        self.epoch = 0  # bumped when a capture is ended early (exit, fork)
        self.saved = -1  # a duplicate of the real stderr, while capturing
        self.fd = -1  # the capture file: unlinked, append-only, reused
        self.read = 0  # bytes of the file read so far
        self.held: list[str] = []  # the plugin's lines read, logged when the capture ends
        self.held_at = -1  # the file offset of the first held line
        self.pump: threading.Thread | None = None

    def start(self) -> bool:
        """Take descriptor 2; False (nothing taken) where it cannot be."""
        with contextlib.suppress(AttributeError, OSError, ValueError):  # None, or closed
            sys.stderr.flush()
        try:
            if self.fd < 0:
                fd, path = tempfile.mkstemp(prefix="pjrt_py-stderr-")
                os.unlink(path)
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
                self.fd = fd
            os.ftruncate(self.fd, 0)
            self.saved = os.dup(2)
        except OSError:  # no stderr (closed), or no temporary file: left as it is
            return False
        self.read, self.held, self.held_at = 0, [], -1
        _core.stderr_replay(self.fd, self.saved, 0)
        os.dup2(self.fd, 2)
        if self.pump is None:
            self.pump = threading.Thread(target=self._pump, name="pjrt_py-stderr", daemon=True)
            self.pump.start()
        self.cond.notify()
        return True

    def drain(self, final: bool) -> None:
        """Deliver what the file gained: other output to stderr, the plugin's lines held."""
        size = os.fstat(self.fd).st_size
        data = os.pread(self.fd, size - self.read, self.read) if size > self.read else b""
        if not final:  # a line still being written waits for its end
            data = data[: data.rfind(b"\n") + 1]
        at, other = self.read, []
        for raw in data.splitlines(keepends=True):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if _ABSL.match(line) or any(k.search(line) for k in _KNOWN):
                if not self.held:
                    self.held_at = at
                self.held.append(line)
            else:
                other.append(raw)
            at += len(raw)
        self.read += len(data)
        if other:
            with contextlib.suppress(OSError):  # a stderr refusing writes: as for the plugin's
                _write_all(self.saved, b"".join(other))
        # A crash replays from the first line not yet delivered.
        _core.stderr_replay(self.fd, self.saved, self.held_at if self.held else self.read)

    def stop(self) -> list[str]:
        """End the capture: the real stderr back; the plugin's lines to log."""
        self.drain(final=True)
        _core.stderr_replay(-1, -1, 0)
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.saved = -1
        held, self.held = self.held, []
        return held

    def _pump(self) -> None:
        with self.cond:
            while True:
                self.cond.wait(PUMP_SECONDS if self.depth else None)
                if self.depth and self.saved >= 0:
                    self.drain(final=False)


_state = _Capture()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


@contextmanager
def captured() -> Iterator[None]:
    """Route the plugin's log lines written in the block to ``logging``."""
    if os.environ.get(ENV, "").lower() == "raw":
        yield
        return
    state = _state
    with state.cond:
        if state.depth == 0 and not state.start():
            taken = False
        else:
            taken = True
            state.depth += 1
        epoch = state.epoch
    if not taken:
        yield
        return
    try:
        yield
    finally:
        held: list[str] = []
        with state.cond:
            if state.epoch == epoch:  # not already ended (exit, fork)
                state.depth -= 1
                if state.depth == 0:
                    held = state.stop()
        _log(held)


def _log(lines: list[str]) -> None:
    for line in lines:
        absl = _ABSL.match(line)
        if any(k.search(line) for k in _KNOWN):
            logger.debug("%s", line)
        elif absl:
            logger.log(_LEVELS[absl.group(1)], "%s", line)


def forward(text: str) -> None:
    """Hand captured lines on: the plugin's to the logger, others back to fd 2."""
    plugin: list[str] = []
    other: list[str] = []
    for line in text.splitlines():
        known = _ABSL.match(line) or any(k.search(line) for k in _KNOWN)
        (plugin if known else other).append(line)
    _log(plugin)
    if other:
        _write_all(2, ("\n".join(other) + "\n").encode())


def _end_early() -> list[str]:
    """End an open capture now, whoever opened it (with the lock held)."""
    state = _state
    if state.depth == 0:
        return []
    state.depth = 0
    state.epoch += 1
    return state.stop()


def _at_exit() -> None:
    """A normal exit during a capture (another thread compiling) shows what it holds."""
    if not _state.cond.acquire(timeout=1.0):
        return
    try:
        held = _end_early()
    finally:
        _state.cond.release()
    _log(held)


def _after_fork_in_child() -> None:
    """A child forked mid-capture gets its own stderr back, and its own file later."""
    global _state
    old = _state  # its lock may be held by a thread the child does not have
    if old.depth:
        _core.stderr_replay(-1, -1, 0)
        os.dup2(old.saved, 2)
        os.close(old.saved)
    if old.fd >= 0:
        os.close(old.fd)  # the parent's file: shared offset and contents
    old.depth, old.epoch = 0, old.epoch + 1
    _state = _Capture()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["ENV", "PUMP_SECONDS", "captured", "forward", "logger"]
