"""Running cases in a pool of persistent worker processes.

Each plugin build gets ``jobs`` worker processes (:mod:`.worker`), each
driven by one thread here that hands it one path at a time. A worker that
dies on a case (a signal, an exit) or passes the per-case timeout is that
case's ``crash`` / ``timeout``, with the signal's name and the tail of the
worker's stderr; it is killed if need be and replaced, and the run goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .targets import Target

STATUSES = ("pass", "mismatch", "error", "crash", "timeout", "unsupported")
FAILING = ("mismatch", "error", "crash", "timeout")
STARTUP_TIMEOUT = 120.0
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


class Worker:
    """One worker process for one plugin build, spoken to over pipes."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self._buffer = b""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "pjrt_py.conformance.worker", target.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self.info = self._receive(STARTUP_TIMEOUT, 0)

    def _size(self) -> int:
        return os.fstat(self._stderr.fileno()).st_size

    def _tail(self, since: int) -> str:
        # pread: the child shares this file's offset, so never seek it.
        size = self._size()
        start = max(since, size - TAIL_BYTES)
        data = os.pread(self._stderr.fileno(), size - start, start)
        return data.decode(errors="replace").strip()

    def _receive(self, timeout: float, since: int) -> dict[str, Any]:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                raise WorkerGone("timeout", f"no result after {timeout:g} s", self._tail(since))
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self._proc.wait()
                if code < 0:
                    name = signal.Signals(-code).name
                    message = f"worker killed by {name}"
                else:
                    message = f"worker exited with code {code}"
                raise WorkerGone("crash", message, self._tail(since))
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        record: dict[str, Any] = json.loads(line)
        return record

    def run(self, path: str, timeout: float) -> dict[str, Any]:
        """The worker's result record for ``path``; raises WorkerGone."""
        assert self._proc.stdin is not None
        since = self._size()
        try:
            self._proc.stdin.write((json.dumps({"path": path}) + "\n").encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: _receive reads the EOF and says how
        return self._receive(timeout, since)

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def close(self) -> None:
        """Let the worker finish (EOF on stdin), else kill it."""
        if self._proc.stdin:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        if self._proc.stdout:
            self._proc.stdout.close()
        self._stderr.close()


def _slot(
    target: Target,
    work: queue.Queue[str],
    timeout: float,
    report: Callable[[Result], None],
    broken: dict[str, str],
    versions: dict[str, str],
) -> None:
    worker: Worker | None = None
    try:
        while True:
            try:
                path = work.get_nowait()
            except queue.Empty:
                return
            if target.label in broken:
                report(Result(target.label, path, "error", broken[target.label]))
                continue
            if worker is None:
                try:
                    worker = Worker(target)
                    versions[target.label] = str(worker.info.get("pjrt", "?"))
                except WorkerGone as exc:
                    why = f"plugin failed to start: {exc.message}"
                    broken[target.label] = why
                    report(Result(target.label, path, "error", why, output=exc.output))
                    continue
            started = time.perf_counter()
            try:
                record = worker.run(path, timeout)
            except WorkerGone as exc:
                worker.close()
                worker = None
                seconds = time.perf_counter() - started
                report(Result(target.label, path, exc.status, exc.message, seconds, [], exc.output))
                continue
            report(
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
) -> tuple[list[Result], dict[str, str]]:
    """Run every path on every target; results in (target, path) order.

    Returns the results and each target's PJRT API version text.
    """
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
        for _ in range(max(1, min(jobs, len(paths)))):
            args = (target, work, timeout, collect, broken, versions)
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
