"""The process-wide default clients: ``default_client()`` and ``default_client_for(platform)``.

The module-level functions (``pjrt_py.buffer``, ``pjrt_py.compile``, ...),
``register_callback`` and ``pjrt_py.jit`` use these when given no client.
A pickled ``Buffer`` is restored onto the default client.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import _core
from .client import Client
from .runtime import process
from .runtime.buffer import Buffer

_default: Client | None = None
_default_lock = threading.Lock()


def _new_default_lock() -> None:
    global _default_lock
    _default_lock = threading.Lock()


process.reset_in_child(_new_default_lock)


def default_client() -> Client:
    """The process-wide client the module-level functions use (made on first use).

    A closed default client is replaced; so is one inherited over ``os.fork()``.

    Returns
    -------
    Client
        A ``Client()``: the plugin named by ``$PJRT_PLUGIN``, else the CPU
        plugin, with the environment's cache and compile settings.
    """
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Client()
        return _default


_by_platform: dict[str, Client] = {}


def default_client_for(platform: str) -> Client:
    """The process-wide client of ``platform``: the default client if it is one.

    ``pjrt_py.from_dlpack`` uses this for a tensor in device memory given no
    device: the data is on a GPU, so it goes to a client of that GPU's
    platform, not to the default (CPU) client.

    Parameters
    ----------
    platform : str
        A platform name (``"cuda"``, ``"rocm"``, ...).

    Returns
    -------
    Client
        The default client if its platform is ``platform``; else one
        ``Client(platform)`` kept for the process (made on first use).

    Raises
    ------
    FileNotFoundError
        If no plugin of that platform is installed.
    """
    with _default_lock:
        if _default is not None and not _default.closed and _default.platform_name == platform:
            return _default
        client = _by_platform.get(platform)
        if client is None or client.closed:
            client = _by_platform[platform] = Client(platform)
        return client


def _unpickle_buffer(array: np.ndarray[Any, Any], device_id: int) -> Buffer:
    """A pickled Buffer, placed with the default client (on device ``device_id`` if it has one)."""
    client = default_client()
    device = next((d for d in client.addressable_devices if d.id == device_id), None)
    return client.buffer(array, device)


_core.set_hooks(unpickle=_unpickle_buffer)

__all__ = ["default_client", "default_client_for"]
