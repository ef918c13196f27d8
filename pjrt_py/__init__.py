"""pjrt_py: a thin, fast, asynchronous Python binding over the PJRT C API.

>>> import numpy as np, pjrt_py
>>> client = pjrt_py.Client()                  # the CPU plugin
>>> exe = client.compile(PROGRAM)              # StableHLO text or bytecode
>>> out = exe.execute_async(np.ones(8, np.float32))   # returns at once
>>> pjrt_py.value(pjrt_py.to_numpy_async(out))         # blocks here
"""

from __future__ import annotations

import sys

from . import _moved
from .callbacks.ffi import register_ffi_target
from .callbacks.host_callback import in_host_callback, register_callback
from .client import Client
from .defaults import default_client, default_client_for
from .interop.frameworks import to_jax, to_torch
from .jit import jit
from .jitted import Jitted
from .lowered import Lowered
from .programs.compile_options import encode_compile_options
from .programs.dynamic import DynamicExecutable
from .programs.effects import effects_barrier, with_runtime_token
from .programs.executable import Executable, MemoryStats
from .programs.signature import ArgSpec
from .runtime import process as _runtime  # noqa: F401  (fork and exit handling)
from .runtime.buffer import Buffer, aligned_empty
from .runtime.device import Device, Memory
from .runtime.discovery import PluginInfo, plugins
from .runtime.dtypes import SUPPORTED as supported_dtypes
from .runtime.errors import (
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
    ProgramError,
    ResourceExhaustedError,
    ScalarOverflowError,
    SerializationError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
    UnsupportedError,
)
from .runtime.memory_watch import DeviceMemory, MemoryWatch, memory_watch
from .runtime.plugin import Plugin, load_plugin
from .runtime.promise import ArrayPromise, BufferPromise, Promise
from .toplevel import (
    buffer,
    buffer_async,
    compile,
    execute,
    execute_async,
    from_dlpack,
    is_ready,
    to_numpy,
    to_numpy_async,
    value,
)
from .tracing import trace

__version__ = "0.1.0"


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
    "DeviceMemory",
    "DynamicExecutable",
    "Executable",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "Jitted",
    "Lowered",
    "MemoryStats",
    "MemoryWatch",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "PjrtError",
    "Plugin",
    "PluginInfo",
    "PluginLoadError",
    "ProgramError",
    "Promise",
    "ResourceExhaustedError",
    "ScalarOverflowError",
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
    "default_client_for",
    "effects_barrier",
    "encode_compile_options",
    "execute",
    "execute_async",
    "is_ready",
    "jit",
    "load_plugin",
    "memory_watch",
    "plugins",
    "supported_dtypes",
    "to_numpy",
    "trace",
    "to_numpy_async",
    "value",
    "with_runtime_token",
]

_moved.install(sys.modules[__name__])


def __getattr__(name: str) -> object:
    """``pjrt_py.<module>`` of a module that moved (see ``pjrt_py._moved``)."""
    return _moved.attribute(name)
