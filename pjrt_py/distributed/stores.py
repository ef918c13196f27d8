"""Key-value stores for clients that span processes (``Client(kv_store=...)``).

A PJRT plugin that runs one computation across processes coordinates
through a key-value store it is given at client creation: three callbacks,
``get`` (blocking, with a timeout), ``try_get`` and ``put``. It exchanges
topologies through them while the client is made (keys such as
``local_topology/<platform>/<id>``), and on GPU collective ids later, from
its own threads. pjrt_py installs the callbacks (``native/kv_store.c``) over
any object with these methods:

* ``get(key: bytes, timeout_ms: int) -> bytes``: wait up to ``timeout_ms``;
* ``try_get(key: bytes) -> bytes``: answer at once;
* ``put(key: bytes, value: bytes) -> None``.

Keys may hold any bytes (the plugins' have spaces and brackets), and values
are binary. A store reports a missing key by raising ``KeyError`` (or
``NotFoundError``), a timeout by ``TimeoutError`` (or
``DeadlineExceededError``), and a key put twice by
``FileExistsError`` (or ``AlreadyExistsError``): the plugin
reads those codes. Anything else reaches the plugin as ``UNKNOWN`` with the
exception's text. The store's methods are called with the GIL, from any
thread, concurrently: they must be thread-safe, and they must not call
back into the client that is being created.

Two stores come with pjrt_py: ``InMemoryStore``, for several clients
in one process (and tests), and ``JaxCoordinationStore``, over jaxlib's
coordination service (what ``pjrt_py.distributed.initialize`` uses).
docs/distributed.md says how to put Redis or etcd behind the same protocol.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from ..runtime.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    NotFoundError,
    UnknownError,
)
from ..runtime.kv_store import KeyValueStore


class InMemoryStore:
    """A thread-safe store in this process: for several clients of one
    process (each a "node"), and for tests.

    Parameters
    ----------
    overwrite : bool
        Let ``put`` replace a key. Off by default: a second ``put`` of a key
        raises ``AlreadyExistsError``, as jaxlib's service does.
    """

    def __init__(self, overwrite: bool = False) -> None:
        self._data: dict[bytes, bytes] = {}
        self._changed = threading.Condition()
        self.overwrite = overwrite

    def get(self, key: bytes, timeout_ms: int) -> bytes:
        """The value of ``key``, waiting for a ``put`` up to ``timeout_ms``.

        Parameters
        ----------
        key : bytes
        timeout_ms : int
            Milliseconds to wait.

        Returns
        -------
        bytes

        Raises
        ------
        DeadlineExceededError
            If the key is not put in time.
        """
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)):
            raise TypeError(f"timeout_ms must be a number, not {type(timeout_ms).__name__}")
        if timeout_ms != timeout_ms:  # NaN: no deadline ever passes, and the wait spun
            raise ValueError("timeout_ms is NaN")
        key = _as_bytes("key", key)
        try:
            wait_s = max(timeout_ms, 0) / 1000
        except OverflowError:  # an int past any float: no deadline, as inf
            wait_s = math.inf
        deadline = time.monotonic() + wait_s  # inf: no deadline
        with self._changed:
            while key not in self._data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineExceededError(f"key {key!r} not put within {timeout_ms} ms")
                self._changed.wait(min(left, threading.TIMEOUT_MAX))
            return self._data[key]

    def try_get(self, key: bytes) -> bytes:
        """The value of ``key`` now.

        Parameters
        ----------
        key : bytes

        Returns
        -------
        bytes

        Raises
        ------
        NotFoundError
            If the key has not been put.
        """
        key = _as_bytes("key", key)
        with self._changed:
            if key not in self._data:
                raise NotFoundError(f"key {key!r} not found")
            return self._data[key]

    def put(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key`` and wake the gets waiting for it.

        Parameters
        ----------
        key, value : bytes

        Raises
        ------
        AlreadyExistsError
            If the key is there already and ``overwrite`` is off.
        """
        key, value = _as_bytes("key", key), _as_bytes("value", value)
        with self._changed:
            if key in self._data and not self.overwrite:
                raise AlreadyExistsError(f"key {key!r} already exists")
            self._data[key] = value
            self._changed.notify_all()

    def keys(self) -> list[bytes]:
        """Every key put so far, sorted.

        Returns
        -------
        list of bytes
        """
        with self._changed:
            return sorted(self._data)


def _as_bytes(what: str, x: object) -> bytes:
    """``x`` as bytes if it is bytes-like; TypeError otherwise. ``bytes(5)``
    is five zero bytes, so an int key was stored under b"\\0" * 5, past the
    no-overwrite check, which had looked for the int."""
    if not isinstance(x, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, not {type(x).__name__}")
    return bytes(x)


def _key(prefix: str, key: bytes) -> str:
    """A key as jaxlib's str keys can hold it: printable ASCII stays (the
    plugins' keys read the same in the service), every other byte and ``%``
    become ``%XX``. One to one, and the same in every process; measured: a
    raw NUL byte cut jaxlib's key short, so two keys collided."""
    return prefix + "".join(chr(b) if 32 <= b < 127 and b != 37 else f"%{b:02X}" for b in key)


def _jax_error(error: Exception, key: bytes) -> Exception:
    """jaxlib's status text as the error the plugin expects."""
    text = str(error)
    for name, kind in (
        ("NOT_FOUND", NotFoundError),
        ("DEADLINE_EXCEEDED", DeadlineExceededError),
        ("ALREADY_EXISTS", AlreadyExistsError),
    ):
        if name in text:
            return kind(f"{key!r}: {text}")
    return UnknownError(f"{key!r}: {text}")


class JaxCoordinationStore:
    """A store over jaxlib's coordination service client
    (``DistributedRuntimeClient``; jaxlib is an optional dependency).

    Every key is put under ``prefix`` (a job-scoped namespace: two jobs, or
    two clients of one job, must not share keys). The service itself keeps
    keys only for the job's lifetime.

    Parameters
    ----------
    client : jaxlib DistributedRuntimeClient
        A connected client of the service.
    prefix : str
        The job's namespace, put before every key.
    """

    def __init__(self, client: Any, prefix: str = "pjrt_py/") -> None:
        self.client = client
        self.prefix = prefix

    def get(self, key: bytes, timeout_ms: int) -> bytes:
        """The value of ``key`` from the service, waiting up to ``timeout_ms``.

        Raises
        ------
        NotFoundError, DeadlineExceededError, UnknownError
            jaxlib's status, as the plugin reads it.
        """
        try:
            value: bytes = self.client.blocking_key_value_get_bytes(
                _key(self.prefix, key), timeout_ms
            )
        except Exception as e:
            raise _jax_error(e, key) from None
        return value

    def try_get(self, key: bytes) -> bytes:
        """The value of ``key`` from the service now.

        Raises
        ------
        NotFoundError, UnknownError
            jaxlib's status, as the plugin reads it.
        """
        try:
            value: bytes = self.client.key_value_try_get_bytes(_key(self.prefix, key))
        except Exception as e:
            raise _jax_error(e, key) from None
        return value

    def put(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key`` in the service.

        Raises
        ------
        AlreadyExistsError, UnknownError
            jaxlib's status, as the plugin reads it.
        """
        try:
            self.client.key_value_set_bytes(_key(self.prefix, key), bytes(value))
        except Exception as e:
            raise _jax_error(e, key) from None


__all__ = ["InMemoryStore", "JaxCoordinationStore", "KeyValueStore"]
