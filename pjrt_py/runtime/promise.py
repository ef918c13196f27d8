"""Promises: the results of asynchronous work.

The types are native (``native/promise.c``): ``Promise`` holds PJRT
events and answers ``is_ready()`` without blocking; ``value()`` waits for them
with the GIL released, in slices, so Ctrl-C raises ``KeyboardInterrupt``
while the work goes on; ``add_done_callback`` and ``await`` are driven by
``PJRT_Event_OnReady`` callbacks, never by a polling thread.

``BufferPromise`` is the promise of an execution's outputs (or of a
transfer); ``ArrayPromise`` the promise of a device-to-host copy.

Promises cannot be copied or pickled (``TypeError``): each stands for one
piece of work in flight; share the object, or copy its ``value()``.

This module supplies the two pieces the native types leave to Python: the
asyncio glue of ``await``, and the report of a callback's exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator
from typing import Any

from .. import _core
from .._core import ArrayPromise, BufferPromise, Promise

_log = logging.getLogger("pjrt_py")


def _await(promise: Promise[Any]) -> Generator[Any, None, Any]:
    """The iterator behind ``await promise``: an asyncio future woken by a done callback."""
    if not promise.is_ready():
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake(_: Promise[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, future)

        promise.add_done_callback(wake)
        yield from future.__await__()
    return promise.value()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _callback_error(fn: Any, exc: BaseException) -> None:
    """Report an exception a done callback raised (it never stops the others)."""
    _log.error("exception in pjrt_py promise callback %r", fn, exc_info=exc)


_core.set_hooks(await_=_await, callback_error=_callback_error)

__all__ = ["ArrayPromise", "BufferPromise", "Promise"]
