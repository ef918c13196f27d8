"""jaxlib's C++ called from a daemon thread, on a thread the exit waits for.

pjrt_py calls jaxlib for programs (``form``: portable bytecode; ``mlir_text``:
bytecode to text; ``dynamic``: shape refinement; ``compiled``: HLO text).
Those calls release the GIL inside jaxlib's C++ and take it back there. On
a daemon thread that is still inside one when the interpreter finalizes,
CPython (3.11 to 3.13) ends the thread as it asks for the GIL, with
``pthread_exit``; the unwinding crosses jaxlib's C++ frames, which end the
process: ``terminate called ... FATAL: exception not rethrown``, SIGABRT.
A hostile stress run saw it in 7 of 100 exits with two daemon threads
compiling, on the 0.106 and 0.115 builds; jaxlib alone does it too.

``run_joined`` makes such a call on a new thread that is not a daemon, and
waits for it. The interpreter's shutdown joins threads that are not daemons
before it finalizes, so the call ends first; the daemon thread waits in
CPython's own lock code, where ending it is safe. The main thread and other
non-daemon threads call directly: the shutdown waits for them anyway.

Once the shutdown has joined its threads (``threading._SHUTTING_DOWN``; the
atexit handlers, pjrt_py's exit sequence among them, run after that), a new
thread would not be joined, and the abort came back (a review made it 10 of
10 exits with an atexit handler running while daemon threads compiled). A
daemon thread that asks then does not call jaxlib at all: it waits for
good, in CPython's code, and the process ends around it. On Python 3.12 and
later, starting a thread then raises ``RuntimeError``; that waits the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


def _shutting_down() -> bool:
    return bool(getattr(threading, "_SHUTTING_DOWN", False))


def _wait_for_the_end() -> NoReturn:
    """Blocks a daemon thread until the process ends it (safely, in CPython)."""
    while True:
        threading.Event().wait()


def run_joined(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, on a non-daemon thread if this one is a daemon."""
    if not threading.current_thread().daemon:
        return fn(*args, **kwargs)
    if _shutting_down():
        _wait_for_the_end()
    outcome: list[tuple[bool | None, Any]] = []

    def call() -> None:
        if _shutting_down():  # begun after the shutdown joined its threads: none waits
            outcome.append((None, None))
            return
        try:
            outcome.append((True, fn(*args, **kwargs)))
        except BaseException as e:  # raised on the caller's thread below
            outcome.append((False, e))

    worker = threading.Thread(target=call, name="pjrt_py jaxlib call", daemon=False)
    try:
        worker.start()
    except RuntimeError:  # Python 3.12+: "can't create new thread at interpreter shutdown"
        if _shutting_down():
            _wait_for_the_end()
        raise
    worker.join()
    ok, value = outcome[0]
    if ok is None:
        _wait_for_the_end()
    if not ok:
        raise value
    result: T = value
    return result
