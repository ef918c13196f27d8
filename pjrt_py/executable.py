"""Compiled programs and their execution."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from . import _hlo_proto, _runtime, effects, serialization
from ._ffi import ffi, lib
from .buffer import DONATED, HOST_ALIASED, Buffer, deleted_message, intern_meta, wrap
from .dtypes import numpy_dtype
from .errors import PjrtError, UnimplementedError, UnsupportedError, error_from_pjrt
from .plugin import named_values
from .program import ArgSpec, mismatch_message, signature_from_shapes
from .promise import BufferPromise, _Events

if TYPE_CHECKING:
    from .client import Client
    from .device import Device

_NULL = ffi.NULL
_execute_n = lib.pjrt_py_execute_n
_execute1 = lib.pjrt_py_execute1
_take_error = lib.pjrt_py_take_error
_new = object.__new__
_PY_SCALARS = (bool, int, float, complex)
_T = TypeVar("_T")


@dataclass(frozen=True)
class MemoryStats:
    """Compiled memory use, in bytes (``PJRT_Executable_GetCompiledMemoryStats``).

    ``host_*`` fields count host memory a device program uses; on the CPU
    plugin everything is in the default memory and they are zero.
    """

    generated_code_size_in_bytes: int
    argument_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    temp_size_in_bytes: int
    host_generated_code_size_in_bytes: int
    host_argument_size_in_bytes: int
    host_output_size_in_bytes: int
    host_alias_size_in_bytes: int
    host_temp_size_in_bytes: int


class _Loaded:
    """Owns one ``PJRT_LoadedExecutable`` (and its ``PJRT_Executable``).

    Executables handed out for the same cached program share one; the PJRT
    objects are destroyed, and the client reference dropped, when the last
    holder lets go.
    """

    __slots__ = ("h", "ptr", "exe")

    def __init__(self, h: Any, ptr: Any) -> None:
        self.h, self.ptr, self.exe = h, ptr, None

    def __del__(self) -> None:
        if self.ptr is not None and not _runtime.state.finalizing:
            lib.pjrt_py_loaded_executable_destroy(self.h, self.ptr, self.exe or _NULL)


class Executable:
    """A program compiled for a client's device(s). Made by ``Client.compile``
    or ``Client.deserialize``.

    Call ``execute(*args)`` for outputs that are ready on return, or
    ``execute_async(*args)`` for a :class:`~pjrt_py.BufferPromise` at once.
    Arguments may be :class:`~pjrt_py.Buffer`, promises of one buffer, or
    numpy arrays / scalars (transferred to the executable's device first).

    Arguments are checked against :attr:`input_signature` before anything
    reaches the plugin: a wrong count, shape or dtype raises ``TypeError``.
    Python scalars take the dtype of their parameter, as JAX's weakly typed
    scalars do; numpy arrays and buffers must match exactly.
    """

    def __init__(self, client: Client, ptr: Any, signature: list[ArgSpec] | None) -> None:
        # The caller took a client reference for this executable: delete()
        # drops it, so self._h is set before anything here can fail.
        self._client = client
        self._api = client._api
        self._h = client._h
        self._owner: _Loaded | None = _Loaded(client._h, ptr)
        self._ptr = ptr
        self._exe = None
        invoke = client.plugin.invoke
        self._exe = invoke("PJRT_LoadedExecutable_GetExecutable", loaded_executable=ptr).executable
        self._owner.exe = self._exe
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
        self.num_replicas: int = self._count("PJRT_Executable_NumReplicas", "num_replicas")
        self.num_partitions: int = self._count("PJRT_Executable_NumPartitions", "num_partitions")

        # The compiled signature: names from the program text (or the
        # serialized envelope), shapes and dtypes from the compiled module
        # where the plugin reports one, else from the text.
        module = self._optimized_module()
        shape = None if module is None else self._read(_hlo_proto.program_shape, module)
        # Parameters the program may donate (aliased to outputs, or donors).
        self._donated: tuple[int, ...] = (
            () if module is None else self._read(_hlo_proto.donated_parameters, module) or ()
        )
        if shape is not None:
            signature = signature_from_shapes(signature, shape.parameters)
        self._signature = signature
        # What a call compares against: one (shape, dtype) per parameter, the
        # form Buffer._meta takes, so matching arguments cost one list compare.
        # None (no static signature) never equals a list: every call then
        # takes the slow path, which checks what can be checked.
        static = signature is not None and all(s.is_static for s in signature)
        self._expect = (
            [intern_meta((s.shape, s.dtype)) for s in signature]  # type: ignore[arg-type]
            if static and signature is not None
            else None
        )
        # Outputs of fixed shape get their metadata at creation, so a chained
        # call's check does not ask the plugin for it.
        self._out_meta = self._static_outputs(shape)
        self._out_meta1 = self._out_meta[0] if self._out_meta and self.num_outputs == 1 else None

        # Ordered execution (pjrt_py.effects): the program text and options,
        # set by Client.compile, from which a token-threaded form is compiled
        # on first use; _ordered makes every execution ordered.
        self._source: tuple[str, bytes] | None = None
        self._token_form: Executable | None = None
        self._ordered = False
        # Calls that cannot take the plain path: several devices, donation,
        # ordered, or deleted (see _dispatch_special).
        self._blocked = len(self.devices) != 1 or bool(self._donated)

    def _count(self, function: str, field: str) -> int:
        if not self._client.plugin.supports(function):
            return 1
        return int(getattr(self._client.plugin.invoke(function, executable=self._exe), field))

    def _optimized_module(self) -> bytes | None:
        """The compiled ``HloModuleProto``, or None if the plugin cannot give one."""
        try:
            fmt, data = self.optimized_program()
            return _hlo_proto.hlo_module(data, fmt)
        except (PjrtError, _hlo_proto.ProtoError):
            return None  # unsupported or failing: fall back to the text's signature

    @staticmethod
    def _read(reader: Callable[[bytes], _T], module: bytes) -> _T | None:
        try:
            return reader(module)
        except _hlo_proto.ProtoError:
            return None

    def _static_outputs(
        self, shape: _hlo_proto.ProgramShape | None
    ) -> list[tuple[tuple[int, ...], np.dtype[Any]]] | None:
        if shape is None or len(shape.results) != self.num_outputs:
            return None
        if any(r.dynamic or r.dtype is None or r.is_tuple for r in shape.results):
            return None
        metas = [intern_meta((r.dims, r.dtype)) for r in shape.results if r.dtype is not None]
        # The module and PJRT's own answer must agree before one stands for the other.
        if [m[0] for m in metas] != self.output_shapes:
            return None
        return metas

    # -- metadata -------------------------------------------------------
    @property
    def client(self) -> Client:
        return self._client

    @property
    def num_args(self) -> int | None:
        """The parameter count, or None where neither the program nor the plugin tells."""
        return None if self._signature is None else len(self._signature)

    @property
    def input_signature(self) -> list[ArgSpec] | None:
        """Name, shape and dtype of each parameter, as compiled (None if unknown).

        Names come from ``jax.arg_info`` or the ``%name`` in a text program's
        ``@main``; where there is no text (bytecode), parameters are named by
        position and shapes come from the compiled module.
        """
        return None if self._signature is None else list(self._signature)

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

    @property
    def fingerprint(self) -> str | None:
        """The plugin's fingerprint of the compiled program, or None if it has none.

        Per the PJRT header, compiling the same program with the same options
        and compiler gives the same fingerprint.
        """
        try:
            args = self._client.plugin.invoke(
                "PJRT_Executable_Fingerprint", executable=self._live_exe()
            )
        except UnimplementedError:
            return None
        raw: bytes = ffi.unpack(args.executable_fingerprint, args.executable_fingerprint_size)
        return raw.decode("utf-8", "replace")

    def optimized_program(self) -> tuple[str, bytes]:
        """``(format, bytes)`` of the program after optimization.

        XLA plugins answer ``"hlo_with_config"`` (a serialized
        ``HloModuleProtoWithConfig``) or ``"hlo"`` (an ``HloModuleProto``).
        Raises :class:`~pjrt_py.UnsupportedError` if the plugin cannot.
        """
        invoke = self._client.plugin.invoke
        program = ffi.new("PJRT_Program*")
        program.struct_size = lib.PJRT_Program_STRUCT_SIZE
        exe = self._live_exe()
        invoke("PJRT_Executable_OptimizedProgram", executable=exe, program=program)  # size
        code = ffi.new("char[]", max(program.code_size, 1))
        program.code = code
        invoke("PJRT_Executable_OptimizedProgram", executable=exe, program=program)
        fmt = ffi.unpack(program.format, program.format_size).decode()
        return fmt, ffi.unpack(code, program.code_size)

    def as_text(self) -> str:
        """The optimized program as HLO text.

        PJRT hands over a protobuf, not text; printing it takes XLA's HLO
        printer, which pjrt_py borrows from ``jaxlib`` when it is installed.
        Without jaxlib this raises :class:`~pjrt_py.UnsupportedError`;
        :meth:`optimized_program` still returns the raw module.
        """
        fmt, data = self.optimized_program()
        try:
            from jaxlib import _hlo  # type: ignore[attr-defined]
        except ImportError:
            raise UnsupportedError(
                "printing HLO text needs jaxlib's HLO printer (pip install jaxlib); "
                "optimized_program() returns the module as bytes"
            ) from None
        try:
            module = _hlo_proto.hlo_module(data, fmt)
            text: str = _hlo.HloModule.from_serialized_hlo_module_proto(module).to_string()
        except (_hlo_proto.ProtoError, ValueError, RuntimeError) as e:
            raise UnsupportedError(
                f"jaxlib cannot print this plugin's {fmt!r} program (a different XLA version?): {e}"
            ) from None
        return text

    def cost_analysis(self) -> dict[str, Any] | None:
        """The plugin's cost estimates (``flops``, ``bytes accessed``, ...), or None."""
        try:
            args = self._client.plugin.invoke(
                "PJRT_Executable_GetCostAnalysis", executable=self._live_exe()
            )
        except UnimplementedError:
            return None
        return named_values(args.properties, args.num_properties)

    def memory_analysis(self) -> MemoryStats | None:
        """Compiled memory statistics, or None where the plugin has none."""
        try:
            args = self._client.plugin.invoke(
                "PJRT_Executable_GetCompiledMemoryStats", executable=self._live_exe()
            )
        except UnimplementedError:
            return None
        return MemoryStats(**{f: int(getattr(args, f)) for f in MemoryStats.__dataclass_fields__})

    # -- serialization --------------------------------------------------
    def serialize(self) -> bytes:
        """The compiled program as bytes, for ``Client.deserialize`` later.

        Only a client of the same plugin build and devices can load them (see
        :mod:`pjrt_py.serialization`); the bytes carry a checksum and the
        parameter signature.
        """
        args = self._client.plugin.invoke("PJRT_Executable_Serialize", executable=self._live_exe())
        try:
            payload = ffi.unpack(args.serialized_bytes, args.serialized_bytes_size)
        finally:
            args.serialized_executable_deleter(args.serialized_executable)
        identity = serialization.plugin_identity(self._client)
        return serialization.pack(identity, self._signature, payload)

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
        """Release this executable. Idempotent; later calls on it raise.

        The compiled program is freed once nothing holds it: executables
        returned by ``Client.compile`` for the same program share it with the
        client's compile cache (``client.compile_cache.clear()`` drops the
        cache's hold). Deleting one never breaks another.
        """
        self._ptr = self._exe = None
        self._blocked = True
        self._owner = None  # the last holder's release destroys the PJRT objects

    close = delete

    def _share(self) -> Executable:
        """Another executable for the same compiled program (a cache hit)."""
        other: Executable = _new(Executable)
        # setattr, not __dict__.update: touching __dict__ would turn the new
        # object's attributes into a plain dict, and every attribute read on
        # the hot path would get slower (measured: about 0.1 us per call).
        for name, value in vars(self).items():
            setattr(other, name, value)
        return other

    def __enter__(self) -> Executable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    # -- argument checks --------------------------------------------------
    def _resolve(self, arg: Any, index: int) -> Any:
        """A Buffer of ours, or a numpy array to transfer, for one argument."""
        if isinstance(arg, BufferPromise):
            arg = arg.buffer()
        if isinstance(arg, Buffer):
            if arg._client is not self._client:
                raise ValueError(f"argument {index}: buffer belongs to another client")
            if arg._ptr is None:
                raise ValueError(f"argument {index}: {deleted_message(arg)}")
            return arg
        if isinstance(arg, _PY_SCALARS):
            spec = self._signature[index] if self._signature else None
            if spec is not None and spec.dtype is not None:
                return np.asarray(arg, dtype=spec.dtype)  # weakly typed, like JAX
            return np.asarray(arg)
        if isinstance(arg, (np.ndarray, np.generic)):
            return np.asarray(arg)
        raise TypeError(
            f"argument {index}: expected a Buffer, a promise of one, or a numpy "
            f"array/scalar, got {type(arg).__name__}"
        )

    def _buffers(self, args: Sequence[Any], device: Device, where: str = "") -> list[Buffer]:
        """Check one device's arguments and make them Buffers on ``device``.

        Everything is checked before the first transfer starts, so a rejected
        call sends nothing to the plugin.
        """
        signature = self._signature
        if signature is not None and len(args) != len(signature):
            raise TypeError(
                f"{self.name} takes {len(signature)} argument(s){where}, {len(args)} given"
            )
        resolved = [self._resolve(a, i) for i, a in enumerate(args)]
        if signature is not None:
            metas = [
                r._metadata() if isinstance(r, Buffer) else (r.shape, r.dtype) for r in resolved
            ]
            message = mismatch_message(self.name + where, signature, metas)
            if message:
                raise TypeError(message)
        if where:
            # Several devices: a buffer on the wrong one must be refused here.
            # The plugin would reject it only after launching the devices
            # before it, which then wait forever in their first collective.
            for i, r in enumerate(resolved):
                if isinstance(r, Buffer) and r.device != device:
                    raise ValueError(
                        f"{self.name}: argument {i}{where} is on {r.device}, not {device} "
                        f"(copy it with copy_to_device)"
                    )
        return [
            r if isinstance(r, Buffer) else self._client.buffer_async(r, device).buffer()
            for r in resolved
        ]

    def _non_donatable(self, rows: list[list[Buffer]], refused: Iterable[int] | None) -> list[int]:
        """Parameter indices the plugin must not donate in this call.

        The caller's ``non_donatable``, plus any donated parameter given a
        buffer whose memory the host still owns (zero-copy): donating it would
        hand host memory to the program's output.
        """
        n = len(rows[0]) if rows else 0
        indices = set()
        for i in refused or ():
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
                raise ValueError(f"non_donatable: {i!r} is not a parameter index in [0, {n})")
            indices.add(int(i))
        for i in self._donated:
            if i not in indices and any(row[i] in HOST_ALIASED for row in rows):
                indices.add(i)
        return sorted(indices)

    # -- execution ------------------------------------------------------
    def execute_async(
        self, *args: Any, ordered: bool = False, non_donatable: Iterable[int] | None = None
    ) -> BufferPromise:
        """Dispatch the program and return a promise of its outputs at once.

        ``ordered=True`` runs it after every earlier ordered execution of this
        thread has completed, on any device, without waiting on the host (see
        :mod:`pjrt_py.effects`). ``non_donatable`` lists parameters this call
        must not donate, though the program allows it.
        """
        # The hot path: everything that can be is precomputed in __init__;
        # anything unusual (promises, numpy arrays, errors) takes _buffers.
        client = self._client
        if client._closed or self._blocked or ordered or non_donatable is not None:
            return self._dispatch_special(args, ordered, non_donatable)
        try:
            ptrs, metas = [], []
            for a in args:  # AttributeError for anything but a Buffer
                if a._client is not client:
                    raise AttributeError
                ptrs.append(a._ptr)
                metas.append(a._meta)
            if metas != self._expect or None in ptrs:
                # A wrong count, metadata unknown, dynamic dimensions, no
                # signature, a mismatch or a deleted buffer: the slow path
                # says which.
                raise AttributeError
        except AttributeError:
            # `keep` holds buffers made from numpy arguments through the call.
            keep = self._buffers(args, self.devices[0])
            ptrs = [b._ptr for b in keep]
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
            buf._meta = self._out_meta1
            promise = _new(BufferPromise)
            promise._buffers = (buf,)
            promise._arity = 1
            promise._st = None
            return promise
        return self._run([ptrs], [])[0]

    def _dispatch_special(
        self, args: tuple[Any, ...], ordered: bool, non_donatable: Iterable[int] | None
    ) -> BufferPromise:
        """execute_async for a donating or ordered call (or a refused one)."""
        self._live_exe()
        if len(self.devices) != 1:
            raise ValueError(
                f"{self.name} runs on {len(self.devices)} devices: call "
                f"execute_sharded() with one argument list per device"
            )
        if ordered or self._ordered:
            return self._dispatch_ordered(args, non_donatable)
        return self._dispatch_rows([args], non_donatable)[0]

    def _dispatch_rows(
        self, arg_lists: Sequence[Sequence[Any]], non_donatable: Iterable[int] | None
    ) -> list[BufferPromise]:
        """Check, transfer, run on every device, and retire donated arguments."""
        many = len(self.devices) > 1
        rows = [
            self._buffers(args, d, f" on device {i}" if many else "")
            for i, (args, d) in enumerate(zip(arg_lists, self.devices, strict=True))
        ]
        refused = self._non_donatable(rows, non_donatable)
        promises = self._run([[b._ptr for b in row] for row in rows], refused)
        self._retire_donated(rows, refused)
        return promises

    def _run(self, ptr_rows: list[list[Any]], refused: list[int]) -> list[BufferPromise]:
        """One PJRT execution over ``ptr_rows`` (one row per device)."""
        client, n_out, n_dev = self._client, self.num_outputs, len(ptr_rows)
        flat = [p for row in ptr_rows for p in row]
        outs = ffi.new("PJRT_Buffer*[]", max(n_out * n_dev, 1))
        events = ffi.new("PJRT_Event*[]", n_dev) if n_out == 0 else _NULL
        skip = ffi.new("int64_t[]", refused) if refused else _NULL
        error = _execute_n(
            self._h, self._ptr, n_dev, flat, len(ptr_rows[0]), outs, n_out, events, skip,
            len(refused),
        )  # fmt: skip
        if error:
            raise error_from_pjrt(self._api, error)
        if n_out == 0:
            return [BufferPromise((), 0, _Events(self._api, [events[d]])) for d in range(n_dev)]
        metas: list[Any] = [None] * n_out if self._out_meta is None else self._out_meta
        return [
            BufferPromise(
                tuple([wrap(client, outs[d * n_out + i], metas[i]) for i in range(n_out)]), n_out
            )
            for d in range(n_dev)
        ]

    def _retire_donated(self, rows: list[list[Buffer]], refused: list[int]) -> None:
        """Mark the arguments PJRT consumed by donation dead in Python too.

        PJRT invalidates a donated buffer but the handle is still ours; it is
        released here, so any later use raises instead of reaching freed or
        reused memory. Asking PJRT (rather than assuming) covers a plugin
        that declines to donate.
        """
        for i in self._donated:
            if i in refused:
                continue
            for row in rows:
                buf = row[i]
                if buf._ptr is not None and lib.pjrt_py_buffer_is_deleted(self._api, buf._ptr):
                    DONATED.add(buf)
                    buf.delete()

    # -- ordered execution (pjrt_py.effects) ----------------------------
    def _ordered_form(self) -> Executable:
        """The token-threaded form of this program (compiled once, then kept)."""
        form = self._token_form
        if form is None:
            if self._source is None:
                raise ValueError(
                    f"{self.name}: ordered execution compiles a token-threaded form of "
                    f"the program, which needs the StableHLO text it was compiled from "
                    f"(this executable was deserialized or compiled from bytecode)"
                )
            program, options = self._source
            form = self._client.compile(
                effects.with_runtime_token(program), compile_options=options
            )
            self._token_form = form
        return form

    def _dispatch_ordered(
        self, args: tuple[Any, ...], non_donatable: Iterable[int] | None
    ) -> BufferPromise:
        form = self._ordered_form()
        device = self.devices[0]
        row = self._buffers(args, device)  # checked against this program's names
        token = effects.token_for(self._client, device)
        (promise,) = form._dispatch_rows([[*row, token]], non_donatable)
        *outputs, token_out = promise._buffers
        effects.set_token(self._client, token_out, device)
        if not outputs:
            # No outputs of its own: the promise is the token's readiness.
            return BufferPromise((token_out,), 0)
        return BufferPromise(tuple(outputs), len(outputs))

    def execute_sharded_async(
        self,
        per_device_args: Sequence[Sequence[Any]],
        *,
        non_donatable: Iterable[int] | None = None,
    ) -> list[BufferPromise]:
        """Run a replicated or partitioned program on all its devices at once.

        ``per_device_args[d]`` holds the arguments for ``self.devices[d]``
        (the executable's device order: replicas x partitions of its device
        assignment). Returns one promise per device, of that device's outputs.
        """
        self._live_exe()
        n = len(self.devices)
        if isinstance(per_device_args, (Buffer, BufferPromise, np.ndarray)) or not isinstance(
            per_device_args, Sequence
        ):
            raise TypeError("execute_sharded takes a list with one argument list per device")
        if len(per_device_args) != n:
            raise ValueError(
                f"{self.name} runs on {n} device(s) and takes one argument list per "
                f"device; got {len(per_device_args)} list(s)"
            )
        for i, args in enumerate(per_device_args):
            if isinstance(args, (str, bytes, np.ndarray)) or not isinstance(args, Sequence):
                raise TypeError(
                    f"execute_sharded: entry {i} must be a list of arguments, "
                    f"got {type(args).__name__}"
                )
        return self._dispatch_rows(per_device_args, non_donatable)

    def execute_sharded(
        self,
        per_device_args: Sequence[Sequence[Any]],
        *,
        non_donatable: Iterable[int] | None = None,
    ) -> list[list[Buffer]]:
        """``execute_sharded_async``, waited for: one list of output Buffers per device."""
        promises = self.execute_sharded_async(per_device_args, non_donatable=non_donatable)
        for p in promises:
            p.value()
        return [list(p._buffers) for p in promises]

    def execute(
        self, *args: Any, ordered: bool = False, non_donatable: Iterable[int] | None = None
    ) -> Any:
        """Run the program; outputs are ready on return.

        Returns a Buffer (one output), a tuple of Buffers, or None (no outputs).
        """
        return self.execute_async(*args, ordered=ordered, non_donatable=non_donatable).value()

    def __call__(self, *args: Any) -> Any:
        return self.execute(*args)

    def __repr__(self) -> str:
        state = "deleted" if self._ptr is None else f"{self.num_outputs} output(s)"
        return f"<Executable {self.name!r} {state}>"
