"""Process-wide state: host memory PJRT may still read, and interpreter exit.

PJRT may read host memory (a numpy array handed to a transfer, a zero-copy
source) or write it (a device-to-host destination) after the call that
handed it over has returned. Such memory is kept here, next to the event that
says PJRT is done with it, and released once the event is ready.

At exit, pjrt_py stops PJRT callbacks from entering Python and stops
finalizers from calling PJRT, then destroys every live client so the
plugin's threads finish their work while host memory is still alive (see
_at_exit).
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any

from ._ffi import ffi, lib


class _State:
    finalizing = False


state = _State()

# Every live client's handle, for the exit sequence.
_clients: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

_holds: list[tuple[Any, Any, Any]] = []  # (api, event, objects to keep alive)
_holds_lock = threading.Lock()
_sweep_at = 64


def _configure_spin() -> None:
    """$PJRT_PY_SPIN_US: how long a wait polls before it blocks (see event.c)."""
    text = os.environ.get("PJRT_PY_SPIN_US")
    if text is None:
        return
    try:
        micros = float(text)
    except ValueError:
        message = f"PJRT_PY_SPIN_US must be a number of microseconds, not {text!r}"
        raise ValueError(message) from None
    if not micros >= 0:
        raise ValueError(f"PJRT_PY_SPIN_US must be >= 0, not {text!r}")
    lib.pjrt_py_set_spin_ns(int(micros * 1000))


_configure_spin()


def hold(api: Any, event: Any, keep: Any) -> None:
    """Keep ``keep`` alive until ``event`` is ready; then destroy the event."""
    global _sweep_at
    if not event:
        return
    if lib.pjrt_py_event_is_ready(api, event):
        lib.pjrt_py_event_destroy(api, event)
        return
    with _holds_lock:
        _holds.append((api, event, keep))
        if len(_holds) >= _sweep_at:
            _sweep_locked()
            _sweep_at = max(64, 2 * len(_holds))


def _sweep_locked() -> None:
    _destroy_released_locked()
    still: list[tuple[Any, Any, Any]] = []
    for api, event, keep in _holds:
        if lib.pjrt_py_event_is_ready(api, event):
            lib.pjrt_py_event_destroy(api, event)
        else:
            still.append((api, event, keep))
    _holds[:] = still


class _Release:
    """Keeps host memory alive until PJRT's OnReady callback says it is free.

    For memory that may stay in use for a long time (a zero-copy source lives
    as long as its buffer), so that it goes the moment the buffer does rather
    than at the next sweep. The callback runs on whichever thread frees the
    buffer; it only drops the memory, and leaves the event to the next sweep
    (an event is not destroyed from inside its own callback).
    """

    __slots__ = ("api", "event", "keep")

    def __init__(self, api: Any, event: Any, keep: Any) -> None:
        self.api, self.event, self.keep = api, event, keep

    def _notified(self) -> None:
        with _holds_lock:
            _released.append((self.api, self.event))
            _notify_pending.pop(id(self), None)
        self.keep = None


_notify_pending: dict[int, tuple[_Release, Any]] = {}  # id -> (release, its handle)
_released: list[tuple[Any, Any]] = []  # (api, event) whose callbacks have run


def _destroy_released_locked() -> None:
    for api, event in _released:
        lib.pjrt_py_event_destroy(api, event)
    _released.clear()


def hold_until_freed(api: Any, event: Any, keep: Any) -> None:
    """Like :func:`hold`, but releases ``keep`` from PJRT's callback at once."""
    if not event:
        return
    if lib.pjrt_py_event_is_ready(api, event):
        lib.pjrt_py_event_destroy(api, event)
        return
    release = _Release(api, event, keep)
    handle = ffi.new_handle(release)
    with _holds_lock:
        _destroy_released_locked()
        _notify_pending[id(release)] = (release, handle)
    if lib.pjrt_py_event_notify(api, event, handle) != 0:  # no callback will come
        with _holds_lock:
            _notify_pending.pop(id(release), None)
        hold(api, event, keep)


def register_client(client: Any) -> None:
    _clients[id(client)] = client


def pending_holds() -> int:
    """How many host-memory holds are still waiting for PJRT (for tests)."""
    with _holds_lock:
        _sweep_locked()
        return len(_holds) + len(_notify_pending)


@atexit.register
def _at_exit() -> None:
    """Quiesce PJRT before the interpreter and the process tear down.

    1. Stop PJRT callbacks from entering Python (waiting out running ones).
    2. Stop all further PJRT calls from finalizers.
    3. Destroy every live client. That drains and joins the plugin's worker
       threads: in-flight executions and transfers (which may still read or
       write numpy memory) finish now, while that memory is alive. Without
       it the workers run on while the process destroys the plugin's static
       objects (a crash).

    Host-memory holds are then simply kept: nothing can touch them any more.
    They are not waited for: a zero-copy source is released only when its
    buffer is freed, which at exit never happens.
    """
    lib.pjrt_py_shutdown()
    state.finalizing = True
    for client in list(_clients.values()):
        h = getattr(client, "_h", None)
        if h is not None:
            lib.pjrt_py_client_destroy_at_exit(h)
