"""Ordered executions with runtime tokens, and ``effects_barrier``.

Asynchronous dispatch lets executions run in any order their data allows:
two programs on two devices with no data between them may finish either
way round. An *ordered* execution must not start before the previous
ordered execution of the same Python thread has completed, on any device.

The mechanism is a runtime token threaded through executions as data, the
design JAX uses (see docs/effects.md):

* The token is a ``bool[0]`` buffer. An ordered execution runs a
  token-threaded form of its program: the same ``@main`` with one more
  parameter and one more result, the token, both last.
  ``with_runtime_token`` writes that form from the program text; users
  never write it themselves.
* Each thread keeps the token of its last ordered execution. The next one
  takes it as an argument, so the plugin starts it only once that token is
  ready, which is when the whole previous execution has completed. On another
  device the token is first copied there (``PJRT_Buffer_CopyToDevice``),
  which also waits for it on the device side.
* Nothing waits on the host: an ordered ``execute_async`` returns at once.

``effects_barrier()`` waits for every execution dispatched before it, from
any thread, ordered or not, including those with no outputs. The C helpers
count executions from their completion events (``completion.c``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .. import _core
from ..runtime.buffer import Buffer
from ..runtime.errors import PjrtError
from .mlir_text import read_main, wrap_main

if TYPE_CHECKING:
    from ..runtime.device import Device
    from ..runtime.promise import BufferPromise

    class _Client(Protocol):  # what the tokens need of a Client
        _tokens: threading.local

        def buffer_async(self, value: Any, device: Device | None = None) -> BufferPromise: ...
        def _running(self) -> int: ...


TOKEN_TYPE = "tensor<0xi1>"
TOKEN_NAME = "%pjrt_py_token"
BODY_NAME = "@pjrt_py_body"


def effects_barrier() -> None:
    """Block until every execution dispatched so far, on every device, completed.

    Covers executions from every thread and every client of this process
    that something still refers to (closed or not), ordered or not, with or
    without outputs. Executions dispatched while the barrier waits (by other
    threads) do not extend the wait. The barrier does not raise the errors of
    the work it waits for: each execution reports its own at ``value()``.
    It waits with the GIL released, and Ctrl-C interrupts it
    (``KeyboardInterrupt``; the work goes on).
    """
    _core.effects_barrier()


def running(client: _Client) -> int:
    """Executions of ``client`` dispatched and not yet completed."""
    return int(client._running())


def token_for(client: _Client, device: Device) -> Buffer:
    """The calling thread's runtime token, on ``device``, for the next ordered execution.

    The first ordered execution of a thread gets a fresh (ready) token. The
    token of another device is copied here: the copy waits on the device side
    for the execution that produced it. Each client keeps its threads' tokens
    (``client._tokens``, a ``threading.local``).
    """
    held: tuple[Buffer, Device] | None = getattr(client._tokens, "last", None)
    if held is not None and not held[0].is_deleted and not _failed(held[0]):
        token, where = held
        if where is device:
            return token
        return token.copy_to_device_async(device).buffer()
    return client.buffer_async(np.zeros(0, np.bool_), device).buffer()


def _failed(token: Buffer) -> bool:
    """Whether the token's execution is known to have failed. Its error would
    fail every later ordered call of the thread; once known, the next call
    starts a fresh token instead (calls dispatched before that still fail)."""
    if not token.is_ready():
        return False
    try:
        token.block_until_ready()
    except PjrtError:
        return True
    return False


def set_token(client: _Client, token: Buffer, device: Device) -> None:
    client._tokens.last = (token, device)


def with_runtime_token(program: str) -> str:
    """``program`` rewritten so ``@main`` takes and returns a runtime token.

    The original ``@main`` becomes the private function ``@pjrt_py_body``; a
    new ``@main`` takes the same parameters (attributes kept, so donation
    still applies) plus ``%pjrt_py_token: tensor<0xi1>`` last, calls the
    body, and returns its results plus the token, last. Output indices are
    unchanged.

    Parameters
    ----------
    program : str
        A StableHLO program in MLIR text, with a ``func.func @main``.

    Returns
    -------
    str
        The token-threaded program text.

    Raises
    ------
    ValueError
        If ``@main`` cannot be found or read (a parameter, its brackets or its
        result types), or if the program already has a runtime token (it
        mentions ``@pjrt_py_body``).
    """
    main = read_main(program)
    if main is None:
        raise ValueError("ordered execution needs a text program with a func.func @main")
    if BODY_NAME in program:
        raise ValueError("program already has a runtime token (it mentions @pjrt_py_body)")
    return wrap_main(
        program,
        main,
        BODY_NAME,
        params=[*main.params, f"{TOKEN_NAME}: {TOKEN_TYPE}"],
        args=main.names,
        keep=list(range(len(main.result_types))),
        extra=((TOKEN_NAME, TOKEN_TYPE),),
    )
