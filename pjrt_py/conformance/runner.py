"""Running cases in a pool of persistent worker processes.

Each plugin build gets ``jobs`` worker processes (:mod:`.worker`), each
driven by one thread here that hands it one path at a time. A worker that
dies on a case (a signal, an exit) or passes the per-case timeout is that
case's ``crash`` / ``timeout``, with the signal's name and the tail of the
worker's stderr; it is killed if need be and replaced, and the run goes on.

Starting a worker. On Linux, while the runner is still single-threaded, it
forks a *zygote* (:class:`Zygote`): a process that has the runner's imports
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
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

from .targets import Target

STATUSES = ("pass", "mismatch", "error", "crash", "timeout", "unsupported")
FAILING = ("mismatch", "error", "crash", "timeout")
STARTUP_TIMEOUT = 120.0
CLOSE_TIMEOUT = 10.0
TAIL_BYTES = 2000
_PACKET = 65536


@dataclass
class Result:
    """One case's outcome on one plugin build."""

    target: str
    path: str
    status: str
    message: str = ""
    seconds: float = 0.0
    failures: list[dict[str, Any]] = field(default_factory=list)
    output: str = ""  # the worker's stderr tail, for crashes and timeouts


class WorkerGone(Exception):
    """The worker died or timed out; ``status`` is "crash" or "timeout"."""

    def __init__(self, status: str, message: str, output: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.output = output


# -- the zygote ---------------------------------------------------------------


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
        from .. import _runtime
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
        from .. import plugin

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


# -- workers ------------------------------------------------------------------


class Worker:
    """One worker process for one plugin build, spoken to over pipes.

    The process starts at once; :meth:`ready` waits for its plugin to load."""

    def __init__(self, target: Target, zygote: Zygote | None = None) -> None:
        self.target = target
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self._buffer = b""
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = 0
        self._code: int | None = None
        self._finished = False
        self._zygote = zygote
        self._stdin: IO[bytes]
        self.info: dict[str, Any] | None = None
        if zygote is not None:
            requests_r, requests_w = os.pipe()
            replies_r, replies_w = os.pipe()
            try:
                self._pid = zygote.spawn(target.path, requests_r, replies_w, self._stderr.fileno())
            except OSError:
                os.close(requests_w)
                os.close(replies_r)
                self._zygote = None
            else:
                self._stdin = os.fdopen(requests_w, "wb")
                self._stdout = replies_r
            finally:
                os.close(requests_r)
                os.close(replies_w)
        if self._zygote is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "pjrt_py.conformance.worker", target.path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
            )
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._stdin = self._proc.stdin
            self._stdout = self._proc.stdout.fileno()

    def ready(self) -> dict[str, Any]:
        """The worker's ``{"ready": ...}`` record; raises WorkerGone."""
        if self.info is None:
            self.info = self._receive(STARTUP_TIMEOUT, 0)
        return self.info

    def _size(self) -> int:
        return os.fstat(self._stderr.fileno()).st_size

    def _tail(self, since: int) -> str:
        # pread: the child shares this file's offset, so never seek it.
        size = self._size()
        start = max(since, size - TAIL_BYTES)
        data = os.pread(self._stderr.fileno(), size - start, start)
        return data.decode(errors="replace").strip()

    def _receive(self, timeout: float, since: int) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._stdout], [], [], left)[0]:
                self.kill()
                raise WorkerGone("timeout", f"no result after {timeout:g} s", self._tail(since))
            chunk = os.read(self._stdout, 65536)
            if not chunk:
                code = self._wait(CLOSE_TIMEOUT)
                if code is None:
                    message = "worker exited"
                elif code < 0:
                    message = f"worker killed by {signal.Signals(-code).name}"
                else:
                    message = f"worker exited with code {code}"
                raise WorkerGone("crash", message, self._tail(since))
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        record: dict[str, Any] = json.loads(line)
        return record

    def run(self, path: str, timeout: float) -> dict[str, Any]:
        """The worker's result record for ``path``; raises WorkerGone."""
        since = self._size()
        try:
            self._stdin.write(b'{"path": ' + json.dumps(path).encode() + b"}\n")
            self._stdin.flush()
        except BrokenPipeError:
            pass  # it died: _receive reads the EOF and says how
        return self._receive(timeout, since)

    def _poll(self) -> bool:
        """Whether the process has finished (reaped; its code in ``_code``)."""
        if self._finished:
            return True
        if self._proc is not None:
            self._code = self._proc.poll()
            self._finished = self._code is not None
        elif self._zygote is not None:
            self._finished, self._code = self._zygote.poll(self._pid)
        return self._finished

    def _wait(self, timeout: float) -> int | None:
        """The exit code, killing the process after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        pause = 0.001
        while not self._poll():
            if time.monotonic() >= deadline:
                self.kill()
                break
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        return self._code

    def kill(self) -> None:
        if self._poll():
            return
        if self._proc is not None:
            self._proc.kill()
            self._code = self._proc.wait()
            self._finished = True
            return
        # Not reaped yet, so the pid is still this worker's.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)
        while not self._poll():
            time.sleep(0.001)

    def close(self, wait: bool = True) -> None:
        """Let the worker finish (EOF on stdin), else kill it; ``wait=False``
        kills it at once (a worker never used)."""
        with contextlib.suppress(BrokenPipeError):
            self._stdin.close()
        if wait:
            self._wait(CLOSE_TIMEOUT)
        else:
            self.kill()
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        else:
            os.close(self._stdout)
        self._stderr.close()


class Pool:
    """Started workers waiting for their first case, and their zygote.

    Making one starts ``count`` workers per target, so their plugins load
    while the caller goes on (finding the files, say); :meth:`trim` stops
    the ones not needed. Close it (or use it as a context manager): every
    worker it made is killed if still running, busy ones included (a Ctrl-C
    stops the run at once), and ``closing`` tells the threads using them to
    report nothing more."""

    def __init__(self, targets: Sequence[Target], count: int) -> None:
        self.closing = threading.Event()
        self.zygote = Zygote() if Zygote.usable() else None
        self._lock = threading.Lock()
        self._made: list[Worker] = []
        self._idle = {t.label: [self._new(t) for _ in range(count)] for t in targets}

    def _new(self, target: Target) -> Worker:
        worker = Worker(target, self.zygote)
        with self._lock:
            self._made.append(worker)
        return worker

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def trim(self, count: int) -> None:
        """Keep at most ``count`` started workers per target."""
        for idle in self._idle.values():
            while len(idle) > count:
                idle.pop().close(wait=False)

    def worker(self, target: Target) -> Worker:
        """A started worker for ``target``: one waiting, else a new one."""
        with self._lock:
            idle = self._idle.get(target.label)
            if idle:
                return idle.pop(0)
        return self._new(target)

    def close(self) -> None:
        self.closing.set()
        self.trim(0)
        with self._lock:
            made, self._made = self._made, []
        for worker in made:
            worker.kill()  # a busy one's thread then reads EOF and closes it
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None


def _slot(
    target: Target,
    pool: Pool,
    work: queue.Queue[str],
    timeout: float,
    report: Callable[[Result], None],
    broken: dict[str, str],
    versions: dict[str, str],
) -> None:
    worker: Worker | None = None

    def emit(result: Result) -> None:
        if not pool.closing.is_set():  # the run was stopped (Ctrl-C): say nothing more
            report(result)

    try:
        while True:
            try:
                path = work.get_nowait()
            except queue.Empty:
                return
            if target.label in broken:
                emit(Result(target.label, path, "error", broken[target.label]))
                continue
            if worker is None:
                worker = pool.worker(target)
                try:
                    versions[target.label] = str(worker.ready().get("pjrt", "?"))
                except WorkerGone as exc:
                    worker.close()
                    worker = None
                    why = f"plugin failed to start: {exc.message}"
                    broken[target.label] = why
                    emit(Result(target.label, path, "error", why, output=exc.output))
                    continue
            started = time.perf_counter()
            try:
                record = worker.run(path, timeout)
            except WorkerGone as exc:
                worker.close()
                worker = None
                seconds = time.perf_counter() - started
                emit(Result(target.label, path, exc.status, exc.message, seconds, [], exc.output))
                continue
            emit(
                Result(
                    target.label,
                    path,
                    record["status"],
                    record.get("message", ""),
                    record.get("seconds", 0.0),
                    record.get("failures", []),
                )
            )
    finally:
        if worker is not None:
            worker.close()


def run(
    paths: list[str],
    targets: list[Target],
    jobs: int,
    timeout: float,
    report: Callable[[Result], None] = lambda result: None,
    pool: Pool | None = None,
) -> tuple[list[Result], dict[str, str]]:
    """Run every path on every target; results in (target, path) order.

    ``pool``: workers started earlier (the caller closes it); else a pool is
    made, and closed, here. Returns the results and each target's PJRT API
    version text.
    """
    slots = max(1, min(jobs, len(paths)))
    if pool is None:
        with Pool(targets, slots) as own:
            return run(paths, targets, jobs, timeout, report, own)
    pool.trim(min(jobs, len(paths)))
    results: list[Result] = []
    lock = threading.Lock()
    broken: dict[str, str] = {}
    versions: dict[str, str] = {}

    def collect(result: Result) -> None:
        with lock:
            results.append(result)
            report(result)

    threads = []
    for target in targets:
        work: queue.Queue[str] = queue.Queue()
        for path in paths:
            work.put(path)
        for _ in range(slots):
            args = (target, pool, work, timeout, collect, broken, versions)
            threads.append(threading.Thread(target=_slot, args=args, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    order = {(t.label, p): (i, j) for i, t in enumerate(targets) for j, p in enumerate(paths)}
    results.sort(key=lambda r: order[(r.target, r.path)])
    return results, versions


def path_label(path: str, base: Path | None = None) -> str:
    """``path`` relative to ``base`` (the working directory) where it can be."""
    try:
        return str(Path(path).resolve().relative_to((base or Path.cwd()).resolve()))
    except ValueError:
        return path
