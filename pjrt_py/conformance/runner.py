"""Running cases in a pool of persistent worker processes.

Each plugin build gets ``jobs`` worker processes (``.worker``), each
driven by one thread here that hands it one path at a time. A worker that
dies on a case (a signal, an exit) or passes the per-case timeout is that
case's ``crash`` / ``timeout``, with the signal's name and the tail of the
worker's stderr; it is killed if need be and replaced, and the run goes on.

Workers are forked from a zygote where that is safe (``.zygote``), else
started as fresh ``python -m pjrt_py.conformance.worker PLUGIN`` processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .targets import Target
from .zygote import Zygote

_RAISED = re.compile(r"\s*(?:\w+\.)*(\w+(?:Error|Exception)): (.+)")


def raised(output: str) -> str | None:
    """The exception a worker's traceback ended with ("FailedPreconditionError:
    No visible GPU devices."), or None: what a start failure is reported as."""
    for line in reversed(output.splitlines()):
        m = _RAISED.fullmatch(line.rstrip())
        if m:
            return f"{m.group(1)}: {m.group(2)}"
    return None


STATUSES = ("pass", "mismatch", "error", "crash", "timeout", "unsupported")
FAILING = ("mismatch", "error", "crash", "timeout")
STARTUP_TIMEOUT = 120.0
CLOSE_TIMEOUT = 10.0
TAIL_BYTES = 2000


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


# -- workers ------------------------------------------------------------------


class Worker:
    """One worker process for one plugin build, spoken to over pipes.

    The process starts at once; ``ready`` waits for its plugin to load."""

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
        else:  # not reaped yet, so the pid is still this worker's
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
    while the caller goes on (finding the files, say); ``trim`` stops
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
                    why = f"plugin failed to start: {raised(exc.output) or exc.message}"
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
