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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def run_joined(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, on a non-daemon thread if this one is a daemon."""
    if not threading.current_thread().daemon:
        return fn(*args, **kwargs)
    outcome: list[tuple[bool, Any]] = []

    def call() -> None:
        try:
            outcome.append((True, fn(*args, **kwargs)))
        except BaseException as e:  # raised on the caller's thread below
            outcome.append((False, e))

    worker = threading.Thread(target=call, name="pjrt_py jaxlib call", daemon=False)
    worker.start()  # at shutdown: RuntimeError ("can't create new thread"), raised
    worker.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    result: T = value
    return result
