"""The helper process of isolated compiles: starting it, the pipe protocol, stopping it.

``_Worker`` is one running ``python -c "...compile_worker..."`` process and the
two pipes to it. A request is ``_REQUEST`` (kind, program size, options
size) followed by those bytes; a reply is ``_REPLY`` (status, payload size)
and the payload: a serialized executable, or a JSON description of the
exception raised. ``pjrt_py.programs.isolate`` decides when to start, reuse
or kill a worker; ``pjrt_py.programs.compile_worker`` is the other end.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, BinaryIO

from ..runtime import process as _runtime

ENV_TEST_CRASH = "PJRT_PY_ISOLATE_TEST_CRASH"


TEST_CRASH_MARKER = b"pjrt_py.isolate.test_crash"


_REQUEST = struct.Struct("<BQQ")  # kind, program bytes, options bytes


_REPLY = struct.Struct("<BQ")  # status, payload bytes


_TEXT, _BYTECODE = 1, 2  # compile a program
_READ = 3  # read a bytecode program as text (jax's MLIR bindings): the reply is it, or empty


_OK, _ERROR, _FATAL = 0, 1, 2  # _FATAL: the helper could not start and exits


_TAIL_BYTES = 8192  # of output read back after a crash


_TAIL_LINES = 40


_MAX_OUTPUT = 1 << 20  # the helper truncates its output file past this, between compiles


_STOP_GRACE = 5.0  # seconds a stopping or dying helper gets before SIGKILL


class _HelperDied(Exception):
    """The helper's pipe closed under a request: it died."""


class _Worker:
    """One running helper process and the parent's ends of its pipes."""

    def __init__(self, plugin_path: str, options: dict[str, Any]) -> None:
        self.owner = os.getpid()
        self.stopped = False
        # The helper's stdout and stderr (unlinked already): the crash report's tail.
        self.output: BinaryIO = tempfile.TemporaryFile(prefix="pjrt_py_compile_")  # noqa: SIM115
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # this very pjrt_py
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        command = [
            sys.executable,
            "-c",
            "from pjrt_py.programs.compile_worker import main; main()",
            str(req_r),
            str(resp_w),
            plugin_path,
            json.dumps(options),
        ]
        try:
            self.proc = subprocess.Popen(
                command,
                pass_fds=(req_r, resp_w),
                stdin=subprocess.DEVNULL,
                stdout=self.output,
                stderr=self.output,
                env=env,
            )
        except BaseException:
            self._close_fds()
            self.output.close()
            raise
        finally:
            os.close(req_r)
            os.close(resp_w)
        os.set_blocking(self.req_w, False)
        os.set_blocking(self.resp_r, False)
        _WORKERS.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return not self.stopped and self.proc.poll() is None

    # -- one request, one reply ------------------------------------------
    def exchange(
        self, kind: int, code: bytes, options: bytes, deadline: float | None
    ) -> tuple[int, bytes]:
        """Send a request and read its reply. ``_HelperDied`` if the helper
        went away, ``TimeoutError`` past ``deadline`` (``time.monotonic()``)."""
        try:
            for data in (_REQUEST.pack(kind, len(code), len(options)), code, options):
                self._write(data, deadline)
            status, size = _REPLY.unpack(self._read(_REPLY.size, deadline))
            return status, self._read(size, deadline)
        except TimeoutError:
            raise
        except OSError as e:  # a broken pipe, or pipes closed by close() from another thread
            raise _HelperDied from e

    def _wait(self, fd: int, events: int, deadline: float | None) -> None:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError
        poller = select.poll()
        poller.register(fd, events)
        poller.poll(None if remaining is None else remaining * 1000)

    def _write(self, data: bytes, deadline: float | None) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.req_w, view) :]
            except BlockingIOError:
                self._wait(self.req_w, select.POLLOUT, deadline)

    def _read(self, size: int, deadline: float | None) -> bytes:
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            try:
                n = os.readv(self.resp_r, [view[got:]])
            except BlockingIOError:
                self._wait(self.resp_r, select.POLLIN, deadline)
                continue
            if n == 0:
                raise _HelperDied
            got += n
        return bytes(buf)

    # -- ending ------------------------------------------------------------
    def output_tail(self) -> str:
        """The last lines the helper wrote to its stdout and stderr."""
        try:
            fd = self.output.fileno()
            size = os.fstat(fd).st_size
            start = max(0, size - _TAIL_BYTES)
            data = os.pread(fd, size - start, start)
        except (OSError, ValueError):
            return ""
        lines = data.decode("utf-8", "replace").splitlines()[-_TAIL_LINES:]
        return "\n".join(lines)

    def kill(self) -> None:
        """SIGKILL the helper (in the process that started it only)."""
        if os.getpid() == self.owner and self.proc.returncode is None:
            self.proc.kill()

    def reap(self) -> int:
        """Wait for the helper to end (SIGKILL after a grace period); its status."""
        try:
            return self.proc.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.stop()

    def stop(self) -> None:
        """End the helper: close its request pipe (it exits at once), wait
        for it, SIGKILL it after a grace period. Idempotent. In a forked
        child only the inherited pipes are closed: the helper is the parent's."""
        if self.stopped:
            return
        self.stopped = True
        _WORKERS.discard(self)
        self._close_fds()
        if os.getpid() != self.owner:
            return
        try:
            self.proc.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            self.output.close()

    def _close_fds(self) -> None:
        fds, self.req_w, self.resp_r = (self.req_w, self.resp_r), -1, -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


_WORKERS: weakref.WeakSet[_Worker] = weakref.WeakSet()


def _abandon_inherited() -> None:
    """In a child of ``os.fork()``: let go of the parent's helpers' pipes."""
    for worker in list(_WORKERS):
        worker.stop()


_runtime.reset_in_child(_abandon_inherited)
