"""pjrt_py: a thin, fast, asynchronous Python binding over the PJRT C API.

>>> import numpy as np, pjrt_py
>>> client = pjrt_py.Client()                  # the CPU plugin
>>> exe = client.compile(PROGRAM)              # StableHLO text or bytecode
>>> out = exe.execute_async(np.ones(8, np.float32))   # returns at once
>>> pjrt_py.value(pjrt_py.to_numpy_async(out))         # blocks here
"""

from __future__ import annotations

from typing import Any

from . import _runtime  # noqa: F401  (fork and exit handling)
from .buffer import Buffer, aligned_empty
from .client import Client, default_client
from .compile_options import encode_compile_options
from .device import Device
from .dlpack import to_jax, to_torch
from .dtypes import SUPPORTED as supported_dtypes
from .effects import effects_barrier, with_runtime_token
from .errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    CompilerCrashError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    PjrtError,
    PluginLoadError,
    ResourceExhaustedError,
    SerializationError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
    UnsupportedError,
)
from .executable import Executable, MemoryStats
from .ffi import register_ffi_target
from .host_callback import in_host_callback, register_callback
from .jit import Jitted, Lowered, jit
from .memory import Memory
from .plugin import Plugin, PluginInfo, load_plugin, plugins
from .program import ArgSpec
from .promise import ArrayPromise, BufferPromise, Promise

__version__ = "0.1.0"


def buffer(value: Any, device: Device | None = None) -> Buffer:
    """``default_client().buffer(value, device)``."""
    return default_client().buffer(value, device)


def buffer_async(value: Any, device: Device | None = None) -> BufferPromise:
    """``default_client().buffer_async(value, device)``: returns at once."""
    return default_client().buffer_async(value, device)


def from_dlpack(x: Any, device: Device | None = None, *, copy: bool | None = None) -> Buffer:
    """A Buffer from any DLPack producer (numpy, jax, torch, ...): zero-copy on CPU
    where the memory allows. On ``device``'s client if given, else the default
    client's. See :mod:`pjrt_py.dlpack`."""
    client = device.client if isinstance(device, Device) else default_client()
    assert isinstance(client, Client)
    return client.from_dlpack(x, device, copy=copy)


def compile(program: str | bytes, **options: Any) -> Executable:  # noqa: A001
    """``default_client().compile(program, **options)``."""
    return default_client().compile(program, **options)


def execute(executable: Executable, *args: Any, **options: Any) -> Any:
    """``executable.execute(*args, **options)``: outputs ready on return."""
    return executable.execute(*args, **options)


def execute_async(executable: Executable, *args: Any, **options: Any) -> BufferPromise:
    """``executable.execute_async(*args, **options)``: a promise, at once."""
    return executable.execute_async(*args, **options)


def to_numpy(x: Buffer | BufferPromise) -> Any:
    """Copy a buffer (or a promise of one) to a numpy array, waiting for it."""
    return to_numpy_async(x).value()


def to_numpy_async(x: Buffer | BufferPromise) -> ArrayPromise:
    """Start a device-to-host copy of a buffer or a promise of one; returns at once."""
    if isinstance(x, BufferPromise):
        return x.to_numpy_async()
    if isinstance(x, Buffer):
        return x.to_numpy_async()
    raise TypeError(f"expected a Buffer or a BufferPromise, got {type(x).__name__}")


def value(x: Any, timeout: float | None = None) -> Any:
    """Block until a promise is ready and return its value (anything else as is)."""
    return x.value(timeout) if isinstance(x, Promise) else x


def is_ready(x: Any) -> bool:
    """Whether a promise (or a buffer) is ready, without blocking."""
    if isinstance(x, (Promise, Buffer)):
        return x.is_ready()
    return True


__all__ = [
    "Memory",
    "register_ffi_target",
    "register_callback",
    "in_host_callback",
    "from_dlpack",
    "to_jax",
    "to_torch",
    "AbortedError",
    "AlreadyExistsError",
    "ArgSpec",
    "ArrayPromise",
    "Buffer",
    "BufferPromise",
    "CancelledError",
    "Client",
    "CompilerCrashError",
    "DataLossError",
    "DeadlineExceededError",
    "Device",
    "Executable",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "Jitted",
    "Lowered",
    "MemoryStats",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "PjrtError",
    "Plugin",
    "PluginInfo",
    "PluginLoadError",
    "Promise",
    "ResourceExhaustedError",
    "SerializationError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "UnsupportedError",
    "aligned_empty",
    "buffer",
    "buffer_async",
    "compile",
    "default_client",
    "effects_barrier",
    "encode_compile_options",
    "execute",
    "execute_async",
    "is_ready",
    "jit",
    "load_plugin",
    "plugins",
    "supported_dtypes",
    "to_numpy",
    "to_numpy_async",
    "value",
    "with_runtime_token",
]
