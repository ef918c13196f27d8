"""The key-value store protocol a client coordinates processes through.

A PJRT plugin that runs one computation across processes is given three
callbacks at client creation: ``get`` (blocking, with a timeout), ``try_get``
and ``put``. ``native/kv_store.c`` implements them over any Python object
with those methods; this module checks such an object, makes the
``PJRT_Client_Create`` fields that install it, and turns the store's
exceptions into the error codes the plugin reads. The stores themselves
(``InMemoryStore``, ``JaxCoordinationStore``) and the protocol's full
description are in ``pjrt_py.distributed.stores``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .. import _core
from .capi import ffi
from .errors import PjrtError

# PJRT_Error_Code values the plugin reads.
CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS = 1, 2, 4, 5, 6
_GET, _TRY_GET, _PUT = 0, 1, 2


@runtime_checkable
class KeyValueStore(Protocol):
    """What ``Client(kv_store=...)`` takes (see the module documentation)."""

    def get(self, key: bytes, timeout_ms: int) -> bytes:
        """The value of ``key``, waiting up to ``timeout_ms`` for it to be put."""
        ...

    def try_get(self, key: bytes) -> bytes:
        """The value of ``key`` now; ``KeyError`` (or ``NotFoundError``) if absent."""
        ...

    def put(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key``; ``FileExistsError`` if it is there."""
        ...


def check_store(store: Any) -> None:
    """``TypeError`` unless ``store`` has callable get, try_get and put."""
    if isinstance(store, type):  # its methods are callable, but unbound
        raise TypeError(f"kv_store must be a store, not the class {store.__name__}: call it")
    missing = [m for m in ("get", "try_get", "put") if not callable(getattr(store, m, None))]
    if missing:
        raise TypeError(
            f"kv_store needs callable get, try_get and put; {type(store).__name__} lacks "
            + ", ".join(missing)
        )


def error_code(error: BaseException) -> int:
    """The PJRT error code a store's exception means to the plugin."""
    code = getattr(error, "code", None) if isinstance(error, PjrtError) else None
    if isinstance(code, int) and not isinstance(code, bool) and 1 <= code <= 16:
        return code  # a failure code (0 is OK, never a failure's)
    if isinstance(error, KeyError):
        return NOT_FOUND
    if isinstance(error, TimeoutError):
        return DEADLINE_EXCEEDED
    if isinstance(error, FileExistsError):
        return ALREADY_EXISTS
    if isinstance(error, KeyboardInterrupt):
        return CANCELLED
    return UNKNOWN


def _dispatch(store: Any, op: int, key: bytes, arg: Any) -> tuple[int, bytes | str, bool]:
    """Called by the native callbacks: (0, value) or (code, message), and
    whether a KeyboardInterrupt must go on to the main thread."""
    try:
        if op == _PUT:
            store.put(key, arg)
            return 0, b"", False
        value = store.get(key, arg) if op == _GET else store.try_get(key)
        if not isinstance(value, bytes):
            value = bytes(memoryview(value))  # TypeError for anything not bytes-like
        return 0, value, False
    except BaseException as e:  # every failure goes to the plugin as its code
        what = ("get", "try_get", "put")[op]
        text = f"key-value store {what}({key!r}) raised {type(e).__name__}: {_text_of(e)}"
        return error_code(e), text, isinstance(e, KeyboardInterrupt)


def _text_of(error: BaseException) -> str:
    """``str(error)``, or a placeholder where the exception cannot be printed."""
    try:
        return str(error)
    except Exception:
        return "<its message could not be printed>"


_core.kv_set_dispatch(_dispatch)


def calls() -> int:
    """How many store callbacks have reached Python in this process (tests)."""
    return int(_core.kv_calls())


def create_fields(store: Any) -> tuple[dict[str, Any], int | None]:
    """``PJRT_Client_Create`` fields installing ``store``'s callbacks, and the
    holder (their user_arg) the native client takes over."""
    if store is None:
        return {}, None
    holder: int = _core.kv_holder_new(store)
    get, try_get, put = _core.kv_callbacks()
    arg = ffi.cast("void*", holder)
    return {
        "kv_get_callback": ffi.cast("PJRT_KeyValueGetCallback", get),
        "kv_get_user_arg": arg,
        "kv_try_get_callback": ffi.cast("PJRT_KeyValueTryGetCallback", try_get),
        "kv_try_get_user_arg": arg,
        "kv_put_callback": ffi.cast("PJRT_KeyValuePutCallback", put),
        "kv_put_user_arg": arg,
    }, holder


__all__ = ["KeyValueStore", "calls", "check_store", "create_fields", "error_code"]
