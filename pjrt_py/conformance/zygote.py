"""The zygote: the process ``pjrt-py test`` forks its workers from.

On Linux, while the runner is still single-threaded, it
forks a *zygote* (``Zygote``): a process that has the runner's imports
(pjrt_py, numpy, the worker code; shared copy-on-write) but has loaded no
plugin and made no client, and that stays single-threaded. Every worker,
replacements included, is forked from it on request and loads its plugin
itself, so a worker costs a fork and a plugin load, not an interpreter start
and its imports. The workers are the zygote's children; it hands their exit
status back. Elsewhere, or when the zygote is gone, a worker is a fresh
``python -m pjrt_py.conformance.worker PLUGIN``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

_PACKET = 65536


def _die_with_parent() -> None:
    """Linux: be killed when the process that forked this one ends (a runner
    killed with SIGKILL leaves no zygote, and no hanging worker, behind)."""
    parent = os.getppid()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the request
        os._exit(1)


def _worker_main(plugin: str, requests: int, replies: int, stderr: int) -> NoReturn:
    """A worker forked from the zygote: the same as ``worker.main``."""
    code = 0
    try:
        from ..runtime import process as _runtime
        from . import worker

        _die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's: it kills us
        os.dup2(requests, 0)
        os.dup2(stderr, 2)
        os.dup2(stderr, 1)  # the plugin's prints go to stderr, never into the protocol
        for fd in (requests, stderr):
            if fd > 2:
                os.close(fd)
        # Fresh stream objects: the inherited ones may hold the runner's buffers.
        sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        try:
            with open(replies, "w") as out:
                worker.serve(plugin, sys.stdin, out)
        finally:
            _runtime._at_exit()  # what a normal interpreter exit runs for pjrt_py
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)


def _zygote_main(sock: socket.socket) -> None:
    """Serve requests until the runner closes its end of the socket.

    ``{"op": "spawn", "plugin": P}`` with three fds (requests, replies,
    stderr) forks a worker and answers ``{"pid": N}``; ``{"op": "wait",
    "pid": N}`` answers ``{"code": C}`` (``os.waitstatus_to_exitcode``),
    ``null`` while the worker runs."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's
    children: set[int] = set()
    while True:
        data, fds, _, _ = socket.recv_fds(sock, _PACKET, 3)
        if not data:  # the runner is done (or gone): no worker outlives it
            for pid in children:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            return
        request = json.loads(data)
        reply: dict[str, Any]
        if request["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                sock.close()
                _worker_main(request["plugin"], *fds)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            reply = {"pid": pid}
        else:
            try:
                got, status = os.waitpid(request["pid"], os.WNOHANG)
                reply = {"code": os.waitstatus_to_exitcode(status) if got else None}
            except ChildProcessError:
                reply = {"code": None, "gone": True}
                got = request["pid"]
            if got:
                children.discard(got)
        sock.send(json.dumps(reply).encode())


class Zygote:
    """The process the workers are forked from (see the module's docstring)."""

    def __init__(self) -> None:
        from . import worker  # noqa: F401  (imported once, here, for every worker)

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()  # or a child could write the buffer out again
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ours.close()
                _zygote_main(theirs)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self.pid = pid
        self._sock = ours
        self._lock = threading.Lock()

    @staticmethod
    def usable() -> bool:
        """Whether forking one is safe and supported here: on Linux, in a
        process with one Python thread and no plugin loaded (so no plugin
        thread either)."""
        from ..runtime import plugin

        return (
            sys.platform.startswith("linux")
            and threading.active_count() == 1
            and not getattr(plugin, "_LOADED", None)
        )

    def _ask(self, request: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        """One request and its answer; OSError when the zygote is gone."""
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
            data = self._sock.recv(_PACKET)
        if not data:
            raise ConnectionError("the zygote is gone")
        answer: dict[str, Any] = json.loads(data)
        return answer

    def spawn(self, plugin: str, requests: int, replies: int, stderr: int) -> int:
        """Fork a worker for ``plugin`` on these fds; its pid."""
        return int(self._ask({"op": "spawn", "plugin": plugin}, [requests, replies, stderr])["pid"])

    def poll(self, pid: int) -> tuple[bool, int | None]:
        """(finished, exit code) of a worker; the code is None if unknown."""
        try:
            answer = self._ask({"op": "wait", "pid": pid})
        except OSError:
            return True, None
        if answer.get("gone"):
            return True, None
        code = answer["code"]
        return code is not None, code

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
