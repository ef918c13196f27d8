"""Crash-isolated compiles: compile in a helper process, load the result here.

``client.compile(..., isolate=True)``, ``Client(isolate_compile=True)`` or
``$PJRT_PY_ISOLATE_COMPILE=1`` (the client default) compile in a helper
process that made a client of the same plugin with the same create options,
so it has the same devices. The helper compiles, serializes the executable
(``Executable.serialize()``'s envelope) and sends it back; the parent loads it
with the same identity check as ``Client.deserialize``. A compiler that
crashes takes down the helper only: the parent raises
``CompilerCrashError`` naming the signal, with the tail of the
helper's output (where XLA prints a failed ``CHECK``); the next isolated
compile starts a new helper. A compile error the helper raises (a
``PjrtError`` subclass, ``ValueError``, ...) is raised again in
the parent with the same class and message.

Protocol. Two pipes, one each way, in the helper as the file descriptors
named on its command line; its stdout and stderr go to an anonymous
temporary file the parent reads the tail of. A request is a header
``<BQQ`` (kind: MLIR text or bytecode, program size, options size), then the
program bytes, then the serialized ``CompileOptionsProto``. A reply is
``<BQ`` (status, size) and a payload: the serialized executable, or a JSON
description of the exception. The helper reads requests until its request
pipe closes, then exits at once (``os._exit``).

Lifetime. One helper per client (``IsolatedCompiler``, the client's
``compile_helper``), started on the first isolated compile and reused; a lock
keeps concurrent compiles from interleaving their messages. It stops when
the client closes (idempotent; after close, compiling raises ``ValueError``),
when the client is collected, and at interpreter exit. A helper that died
(crash, timeout, Ctrl-C during the wait, killed from outside) is reaped at
once, so none is left as a zombie. If the parent dies the helper reads the
end of its request pipe and exits. In a child of ``os.fork()`` the inherited
pipes are closed and the parent's helper is never signalled or waited for;
the child's own clients start their own helpers.

``$PJRT_PY_COMPILE_TIMEOUT`` (seconds, default none) bounds each isolated
compile, the helper's start included: past it the helper is killed and
``DeadlineExceededError`` is raised.

Test hook: a helper started with ``$PJRT_PY_ISOLATE_TEST_CRASH`` set to
``segv``, ``abort`` or ``hang`` kills itself with ``SIGSEGV``, aborts
(``SIGABRT``) or never answers when asked to compile a program containing
``TEST_CRASH_MARKER`` (e.g. in an MLIR ``//`` comment), so tests need no
real compiler bug.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import threading
import time
import weakref
from typing import Any

from ..runtime import errors
from ..runtime import process as _runtime
from ..runtime.errors import CompilerCrashError, DeadlineExceededError, PjrtError
from .compile_process import _BYTECODE, _FATAL, _OK, _READ, _TEXT, _HelperDied, _Worker

ENV_DEFAULT = "PJRT_PY_ISOLATE_COMPILE"
ENV_TIMEOUT = "PJRT_PY_COMPILE_TIMEOUT"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def env_default() -> bool:
    """Whether clients compile in isolation by default: ``$PJRT_PY_ISOLATE_COMPILE``."""
    text = os.environ.get(ENV_DEFAULT, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{ENV_DEFAULT} must be 1 or 0 (true/false), not {text!r}")


def compile_timeout() -> float | None:
    """Seconds an isolated compile may take (``$PJRT_PY_COMPILE_TIMEOUT``); None: no limit."""
    seconds = _runtime._env_number(ENV_TIMEOUT, 0.0, 1.0, "seconds")
    return seconds or None


class IsolatedCompiler:
    """A client's compile helper process: started on first use, then reused.

    Attributes
    ----------
    plugin_path : str
        The plugin the helper loads.
    options : dict
        The client create options the helper's client is made with.
    """

    def __init__(self, plugin_path: str, options: dict[str, Any]) -> None:
        self.plugin_path = plugin_path
        self.options = dict(options)
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The running helper's process id, or None if there is none."""
        worker = self._worker
        return worker.pid if worker is not None and worker.alive() else None

    @property
    def closed(self) -> bool:
        return self._closed

    def compile(self, program: str | bytes, code: bytes, options: bytes) -> bytes:
        """Compile ``code`` (``program`` encoded) in the helper; the serialized executable.

        Raises
        ------
        CompilerCrashError
            If the helper died while compiling.
        DeadlineExceededError
            If ``$PJRT_PY_COMPILE_TIMEOUT`` passed (the helper is killed).
        PjrtError, ValueError, ...
            What the compile raised in the helper: same class, same message.
        """
        return self._exchange(_TEXT if isinstance(program, str) else _BYTECODE, code, options)

    def read_bytecode(self, code: bytes) -> str | None:
        """``mlir_text.bytecode_to_text(code)``, run in the helper: jax's
        MLIR reader hangs or dies on some damaged bytecode, as a compiler
        can. Raises as ``compile`` does (``CompilerCrashError`` if it died)."""
        text = self._exchange(_READ, code, b"")
        return text.decode() if text else None

    def _exchange(self, kind: int, code: bytes, options: bytes) -> bytes:
        timeout = compile_timeout()
        what = "reading a bytecode program" if kind == _READ else "compiling"
        with self._lock:
            if self._closed:
                raise ValueError("the client is closed: its compile helper was stopped")
            deadline = None if timeout is None else time.monotonic() + timeout
            worker = self._worker
            if worker is None or not worker.alive():
                worker = self._start()
            try:
                status, payload = worker.exchange(kind, code, options, deadline)
            except _HelperDied:
                output = worker.output_tail()
                returncode = worker.reap()
                self._drop(worker)
                if self._closed:
                    raise ValueError("the client was closed during an isolated compile") from None
                raise _crash(worker.pid, returncode, output, what) from None
            except TimeoutError:
                output = worker.output_tail()
                worker.kill()
                worker.reap()
                self._drop(worker)
                raise DeadlineExceededError(
                    f"an isolated compile took longer than {timeout:g} s ({ENV_TIMEOUT}) "
                    f"while {what}; "
                    f"its helper process (pid {worker.pid}) was killed"
                    + (f". Its last output:\n{output}" if output else "")
                ) from None
            except BaseException:  # Ctrl-C mid-exchange: the pipes are out of step
                worker.kill()
                worker.reap()
                self._drop(worker)
                raise
            if self._closed:  # close() ran while this compile was starting or running
                self._drop(worker)
                raise ValueError("the client was closed during an isolated compile")
            if status == _OK:
                return payload
            if status == _FATAL:  # it could not start, and exits
                worker.reap()
                self._drop(worker)
            raise _rebuild(json.loads(payload))

    def _start(self) -> _Worker:
        if self._worker is not None:
            self._drop(self._worker)
        worker = _Worker(self.plugin_path, self.options)
        self._worker = worker
        self._finalizer = weakref.finalize(self, worker.stop)  # collected, or at exit
        return worker

    def _drop(self, worker: _Worker) -> None:
        worker.stop()
        if self._worker is worker:
            self._worker = None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None

    def close(self) -> None:
        """Stop the helper; later compiles raise ``ValueError``. Idempotent.

        A compile in flight on another thread has its helper killed, and
        raises ``ValueError``."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                if self._worker is not None:
                    self._drop(self._worker)
            finally:
                self._lock.release()
        elif self._worker is not None:
            self._worker.kill()  # the compiling thread sees it die, reaps and raises

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pid {self.pid}" if self.pid else "not started"
        return f"<IsolatedCompiler {self.plugin_path} ({state})>"


def _crash(pid: int, returncode: int, output: str, what: str) -> CompilerCrashError:
    sig: signal.Signals | None = None
    if returncode < 0:
        sig = signal.Signals(-returncode)
        how = f"was killed by {sig.name} ({signal.strsignal(sig) or sig.name})"
    else:
        how = f"exited with status {returncode}"
    message = f"the compiler crashed: the compile helper process (pid {pid}) {how} while {what}"
    message += f". Its last output:\n{output}" if output else " (it wrote no output)"
    return CompilerCrashError(message, signal=sig, returncode=returncode, output=output)


def _rebuild(desc: dict[str, Any]) -> Exception:
    """The exception a helper described: same class (pjrt_py's or a builtin), same message."""
    module, name, message = desc["module"], desc["name"], desc["message"]
    source = {errors.__name__: errors, "builtins": builtins}.get(module)
    cls = getattr(source, name, None) if source is not None else None
    if isinstance(cls, type) and issubclass(cls, PjrtError):
        code = desc.get("code")
        return cls(message, code if isinstance(code, int) else None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except TypeError:
            pass
    return PjrtError(f"{module}.{name} in the compile helper: {message}")
