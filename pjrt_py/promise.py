"""Promises: the results of asynchronous work.

A promise holds PJRT events. ``is_ready()`` asks them without blocking;
``value()`` waits for them with the GIL released, then returns the result or
raises the error of the asynchronous work. ``await promise`` and
``add_done_callback`` are driven by ``PJRT_Event_OnReady`` callbacks, never by
a polling thread.

Events are destroyed only when the promise's state is collected, so a thread
waiting on an event can never see it freed underneath it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from . import _runtime
from ._ffi import ffi, lib
from .errors import PjrtError, error_from_pjrt

if TYPE_CHECKING:
    from .buffer import Buffer

T = TypeVar("T")
_log = logging.getLogger("pjrt_py")

# Harvesting (reading the events' status once) is rare; one lock serves all.
_harvest_lock = threading.Lock()
# Promises waiting for OnReady notifications, kept alive until they arrive.
_watched: dict[int, tuple[Promise[Any], Any]] = {}


class _Events:
    """The PJRT events behind a promise, and what was learned from them.

    Made only when someone asks about readiness, so a promise nobody waits on
    costs no event and no finalizer. Destroys its events when collected; if
    they are not ready yet, host memory PJRT may still use (``keep``) goes to
    the process-wide holds instead of being freed.
    """

    __slots__ = ("api", "events", "keep", "done", "error", "callbacks", "pending")

    def __init__(self, api: Any, events: list[Any], keep: Any = None) -> None:
        self.api = api
        self.events = events
        self.keep = keep
        self.done = False
        self.error: PjrtError | None = None
        self.callbacks: list[Callable[[Any], None]] | None = None
        self.pending = 0

    def __del__(self) -> None:
        events = getattr(self, "events", None)
        if not events or _runtime.state.finalizing:
            return
        self.events = []
        api = self.api
        for event in events:
            if self.keep is not None and not self.done:
                _runtime.hold(api, event, self.keep)
            else:
                lib.pjrt_py_event_destroy(api, event)


class Promise(Generic[T]):
    """The result of asynchronous work: ``value()``, ``is_ready()``, ``await``."""

    __slots__ = ("_st", "__weakref__")

    _st: _Events | None

    # -- subclass hooks -------------------------------------------------
    def _make_state(self) -> _Events:
        raise NotImplementedError

    def _result(self) -> T:
        raise NotImplementedError

    # -- events ---------------------------------------------------------
    def _state(self) -> _Events:
        st = self._st
        if st is None:
            with _harvest_lock:
                if self._st is None:
                    self._st = self._make_state()
                st = self._st
        return st

    @staticmethod
    def _harvest(st: _Events) -> None:
        """Read the (ready) events' status once; keep the first error."""
        with _harvest_lock:
            if st.done:
                return
            api = st.api
            for event in st.events:
                error = lib.pjrt_py_event_error(api, event)
                if error:
                    exc = error_from_pjrt(api, error)
                    if st.error is None:
                        st.error = exc
            st.done = True

    def is_ready(self) -> bool:
        """True once the work is complete (or has failed). Never blocks."""
        st = self._state()
        if st.done:
            return True
        api = st.api
        for event in st.events:
            if not lib.pjrt_py_event_is_ready(api, event):
                return False
        self._harvest(st)
        return True

    def value(self, timeout: float | None = None) -> T:
        """Wait (GIL released) for the work and return its result.

        Raises
        ------
        TimeoutError
            If ``timeout`` seconds pass first. The work goes on.
        PjrtError
            The error of the asynchronous work, if it failed.
        """
        st = self._state()
        if not st.done:
            api = st.api
            if timeout is None:
                for event in st.events:
                    lib.pjrt_py_event_wait(api, event, -1.0)
            else:
                deadline = time.monotonic() + timeout
                for event in st.events:
                    left = max(0.0, deadline - time.monotonic())
                    if not lib.pjrt_py_event_wait(api, event, left):
                        raise TimeoutError(f"promise not ready after {timeout} s")
            self._harvest(st)
        if st.error is not None:
            raise st.error
        return self._result()

    def exception(self) -> PjrtError | None:
        """The error of the work once ready (blocks until then), else None."""
        try:
            self.value()
        except PjrtError as exc:
            return exc
        return None

    def block_until_ready(self) -> Promise[T]:
        """Wait for the work; raise its error if it failed. Returns self."""
        self.value()
        return self

    # -- notifications --------------------------------------------------
    def add_done_callback(self, fn: Callable[[Promise[T]], None]) -> None:
        """Call ``fn(promise)`` once the work is complete.

        Runs at once if the promise is ready, else on a PJRT thread when the
        last event fires: keep ``fn`` short and thread-safe.
        """
        st = self._state()
        with _harvest_lock:
            if st.done:
                register = None
            elif st.callbacks is None:
                st.callbacks = [fn]
                register = True
            else:
                st.callbacks.append(fn)
                register = False
        if register is None:
            _run_callback(fn, self)
        elif register:
            self._watch(st)

    def _watch(self, st: _Events) -> None:
        if not st.events:
            self._fire(st)
            return
        handle = ffi.new_handle(self)
        with _harvest_lock:
            st.pending = len(st.events)
            _watched[id(self)] = (self, handle)
        failed = 0
        for event in st.events:
            if lib.pjrt_py_event_notify(st.api, event, handle) != 0:
                failed += 1
        for _ in range(failed):  # OnReady refused: count those as fired
            self._notified()

    def _notified(self) -> None:
        st = self._st
        assert st is not None
        with _harvest_lock:
            st.pending -= 1
            last = st.pending == 0
            if last:
                _watched.pop(id(self), None)
        if last:
            self._fire(st)

    def _fire(self, st: _Events) -> None:
        self._harvest(st)
        with _harvest_lock:
            callbacks, st.callbacks = st.callbacks or [], None
        for fn in callbacks:
            _run_callback(fn, self)

    def __await__(self) -> Generator[Any, None, T]:
        if not self.is_ready():
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()

            def wake(_: Promise[T]) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(_resolve, future)

            self.add_done_callback(wake)
            yield from future.__await__()
        return self.value()

    def __repr__(self) -> str:
        state = "ready" if self.is_ready() else "pending"
        return f"<{type(self).__name__} {state}>"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _run_callback(fn: Callable[[Any], None], promise: Promise[Any]) -> None:
    try:
        fn(promise)
    except Exception:  # a callback's failure must not reach PJRT's thread
        _log.exception("exception in a pjrt_py promise callback")


@ffi.def_extern()  # type: ignore[untyped-decorator]
def _pjrt_py_event_ready(handle: Any) -> None:
    promise: Promise[Any] = ffi.from_handle(handle)
    promise._notified()


class BufferPromise(Promise[Any]):
    """Device buffers that may still be computing or transferring.

    ``value()`` gives a :class:`~pjrt_py.Buffer` (one output), a tuple of them
    (several outputs), or ``None`` (a program with no outputs). A promise of
    one buffer is a valid argument to the next execution: PJRT orders the work
    itself, with no host wait.
    """

    __slots__ = ("_buffers", "_arity")

    _buffers: tuple[Buffer, ...]
    _arity: int  # 1: value is a Buffer; 0: None; else a tuple

    def __init__(
        self, buffers: tuple[Buffer, ...], arity: int = 1, state: _Events | None = None
    ) -> None:
        self._buffers = buffers
        self._arity = arity
        self._st = state

    def _make_state(self) -> _Events:
        bufs = self._buffers
        return _Events(bufs[0]._client._api, [b._ready_event() for b in bufs])

    def _result(self) -> Any:
        if self._arity == 1:
            return self._buffers[0]
        if self._arity == 0:
            return None
        return self._buffers

    def __len__(self) -> int:
        return len(self._buffers)

    def __getitem__(self, index: int) -> BufferPromise:
        """A promise of output ``index`` alone."""
        return BufferPromise((self._buffers[index],))

    def buffer(self) -> Buffer:
        """The single buffer, without waiting (for chaining)."""
        if len(self._buffers) != 1:
            raise ValueError(
                f"this promise holds {len(self._buffers)} buffers; pick one with promise[i]"
            )
        return self._buffers[0]

    def to_numpy_async(self) -> ArrayPromise:
        """Chain a device-to-host copy after the work; returns at once."""
        return self.buffer().to_numpy_async()

    def to_numpy(self) -> np.ndarray[Any, Any]:
        return self.to_numpy_async().value()


class ArrayPromise(Promise[np.ndarray[Any, Any]]):
    """A numpy array being filled by a device-to-host copy."""

    __slots__ = ("_array",)

    def __init__(
        self, api: Any, array: np.ndarray[Any, Any], source: Buffer, events: list[Any]
    ) -> None:
        self._array = array
        # The array and its source buffer stay alive until the copy is done.
        self._st = _Events(api, events, keep=(array, source))

    def _result(self) -> np.ndarray[Any, Any]:
        return self._array
