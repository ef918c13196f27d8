"""Compiled programs and their execution."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import _runtime
from ._ffi import ffi, lib
from .buffer import Buffer, wrap
from .dtypes import numpy_dtype
from .errors import error_from_pjrt
from .program import ArgSpec
from .promise import BufferPromise, _Events

if TYPE_CHECKING:
    from .client import Client
    from .device import Device

_NULL = ffi.NULL
_execute = lib.pjrt_py_execute
_execute1 = lib.pjrt_py_execute1
_take_error = lib.pjrt_py_take_error
_new = object.__new__


class Executable:
    """A program compiled for a client's device(s). Made by ``Client.compile``.

    Call ``execute(*args)`` for outputs that are ready on return, or
    ``execute_async(*args)`` for a :class:`~pjrt_py.BufferPromise` at once.
    Arguments may be :class:`~pjrt_py.Buffer`, promises of one buffer, or
    numpy arrays / scalars (transferred to the executable's device first).
    """

    def __init__(self, client: Client, ptr: Any, signature: list[ArgSpec] | None) -> None:
        # The caller took a client reference for this executable: delete()
        # drops it, so self._h is set before anything here can fail.
        self._client = client
        self._api = client._api
        self._h = client._h
        self._ptr = ptr
        self._exe = None
        self.signature = signature
        invoke = client.plugin.invoke
        self._exe = invoke("PJRT_LoadedExecutable_GetExecutable", loaded_executable=ptr).executable
        name = invoke("PJRT_Executable_Name", executable=self._exe)
        self.name: str = ffi.unpack(name.executable_name, name.executable_name_size).decode()
        self.num_outputs: int = invoke(
            "PJRT_Executable_NumOutputs", executable=self._exe
        ).num_outputs
        devs = invoke("PJRT_LoadedExecutable_AddressableDevices", executable=ptr)
        self.devices: list[Device] = [
            client._device_for(devs.addressable_devices[i])
            for i in range(devs.num_addressable_devices)
        ]

        # Precomputed once so a call does no more than it must.
        self._num_args = -1 if signature is None else len(signature)  # -1: unknown
        self._out_type = f"PJRT_Buffer*[{max(self.num_outputs, 1)}]"
        self._blocked = len(self.devices) != 1  # or deleted; see _raise_blocked

    # -- metadata -------------------------------------------------------
    @property
    def client(self) -> Client:
        return self._client

    @property
    def num_args(self) -> int | None:
        """Parameter count from the program's ``@main`` (None for bytecode)."""
        return None if self._num_args < 0 else self._num_args

    @property
    def output_dtypes(self) -> list[np.dtype[Any]]:
        args = self._client.plugin.invoke(
            "PJRT_Executable_OutputElementTypes", executable=self._live_exe()
        )
        return [numpy_dtype(args.output_types[i]) for i in range(args.num_output_types)]

    @property
    def output_shapes(self) -> list[tuple[int, ...]]:
        args = self._client.plugin.invoke(
            "PJRT_Executable_OutputDimensions", executable=self._live_exe()
        )
        shapes, at = [], 0
        for i in range(args.num_outputs):
            n = args.dim_sizes[i]
            shapes.append(tuple(args.dims[at + j] for j in range(n)))
            at += n
        return shapes

    # -- lifetime -------------------------------------------------------
    def _live_exe(self) -> Any:
        if self._ptr is None:
            raise ValueError("executable has been deleted")
        if self._client._closed:
            raise ValueError("executable belongs to a closed client")
        return self._exe

    @property
    def is_deleted(self) -> bool:
        return self._ptr is None

    def delete(self) -> None:
        """Release the compiled program. Idempotent; later calls raise."""
        ptr, exe, self._ptr, self._exe = self._ptr, self._exe, None, None
        self._blocked = True
        if ptr is not None and not _runtime.state.finalizing:
            lib.pjrt_py_loaded_executable_destroy(self._h, ptr, exe or _NULL)

    close = delete

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            self.delete()

    def __enter__(self) -> Executable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    # -- execution ------------------------------------------------------
    def _raise_blocked(self) -> None:
        self._live_exe()
        raise NotImplementedError(
            f"{self.name} runs on {len(self.devices)} devices; execute() takes "
            f"single-device programs"
        )

    def _argument(self, arg: Any, index: int, keep: list[Any]) -> Any:
        """The PJRT_Buffer* for an argument that is not a plain Buffer of ours."""
        if isinstance(arg, BufferPromise):
            arg = arg.buffer()
        elif not isinstance(arg, Buffer):
            if isinstance(arg, (np.ndarray, np.generic, bool, int, float, complex)):
                arg = self._client.buffer_async(arg, self.devices[0]).buffer()
                keep.append(arg)
            else:
                raise TypeError(
                    f"argument {index}: expected a Buffer, a promise of one, or a numpy "
                    f"array/scalar, got {type(arg).__name__}"
                )
        if arg._client is not self._client:
            raise ValueError(f"argument {index}: buffer belongs to another client")
        if arg._ptr is None:
            raise ValueError(f"argument {index}: buffer has been deleted")
        return arg._ptr

    def execute_async(self, *args: Any) -> BufferPromise:
        """Dispatch the program and return a promise of its outputs at once."""
        # The hot path: everything that can be is precomputed in __init__;
        # anything unusual (promises, numpy arrays, errors) takes _argument.
        client = self._client
        if client._closed or self._blocked:
            self._raise_blocked()
        if len(args) != self._num_args and self._num_args >= 0:
            raise TypeError(f"{self.name} takes {self._num_args} argument(s), {len(args)} given")
        try:
            ptrs = []
            for a in args:  # AttributeError for anything but a Buffer
                if a._client is not client:
                    raise AttributeError
                ptrs.append(a._ptr)
            if None in ptrs:
                raise AttributeError
        except AttributeError:
            keep: list[Any] = []  # buffers made here from numpy arguments
            ptrs = [self._argument(a, i, keep) for i, a in enumerate(args)]
        n_out = self.num_outputs
        if n_out == 1:
            out = _execute1(self._h, self._ptr, ptrs, len(ptrs))
            if not out:
                raise error_from_pjrt(self._api, _take_error())
            # wrap() and BufferPromise() inlined: a call frame each is a
            # measurable share of a ~2 us dispatch.
            buf = _new(Buffer)
            buf._ptr = out
            buf._client = client
            buf._meta = None
            promise = _new(BufferPromise)
            promise._buffers = (buf,)
            promise._arity = 1
            promise._st = None
            return promise
        outs = ffi.new(self._out_type)
        if n_out:
            error = _execute(self._h, self._ptr, ptrs, len(ptrs), outs, n_out, _NULL)
            if error:
                raise error_from_pjrt(self._api, error)
            return BufferPromise(tuple([wrap(client, outs[i]) for i in range(n_out)]), n_out)
        done = ffi.new("PJRT_Event**")
        error = _execute(self._h, self._ptr, ptrs, len(ptrs), outs, 0, done)
        if error:
            raise error_from_pjrt(self._api, error)
        return BufferPromise((), 0, _Events(self._api, [done[0]]))

    def execute(self, *args: Any) -> Any:
        """Run the program; outputs are ready on return.

        Returns a Buffer (one output), a tuple of Buffers, or None (no outputs).
        """
        return self.execute_async(*args).value()

    def __call__(self, *args: Any) -> Any:
        return self.execute(*args)

    def __repr__(self) -> str:
        state = "deleted" if self._ptr is None else f"{self.num_outputs} output(s)"
        return f"<Executable {self.name!r} {state}>"
