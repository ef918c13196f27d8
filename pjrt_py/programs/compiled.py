"""A compiled program as pjrt_py sees it: metadata, signature, inspection.

One ``CompiledProgram`` stands for one ``PJRT_LoadedExecutable`` (owned
by a native ``Loaded`` object) and everything read from it once: name, output
count, devices, the parameter signature the calls are checked against, the
donated parameters, and the outputs' metadata. The ``Executable``
objects that ``Client.compile`` hands out for one cached program share it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from .. import _core
from ..runtime.buffer import intern_meta
from ..runtime.capi import ffi, lib
from ..runtime.dtypes import numpy_dtype
from ..runtime.errors import PjrtError, UnimplementedError, UnsupportedError
from ..runtime.plugin import named_values
from . import proto as _hlo_proto
from . import serialization
from .joined import run_joined
from .signature import ArgSpec, signature_from_shapes

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from ..runtime.device import Device
    from .serialization import Identified

    class _Client(Identified, Protocol):  # what a compiled program needs of its Client
        def _device_for(self, address: int) -> Device: ...
        def _pinned(self) -> AbstractContextManager[Any]: ...


_T = TypeVar("_T")
Meta = tuple[tuple[int, ...], np.dtype[Any]]


@dataclass(frozen=True)
class MemoryStats:
    """Compiled memory use, in bytes (``PJRT_Executable_GetCompiledMemoryStats``).

    ``host_*`` fields count host memory a device program uses; on the CPU
    plugin everything is in the default memory and they are zero.
    ``Executable.memory_analysis()`` makes one from the plugin's answer.

    Parameters
    ----------
    generated_code_size_in_bytes : int
        The compiled code.
    argument_size_in_bytes : int
        The arguments.
    output_size_in_bytes : int
        The outputs.
    alias_size_in_bytes : int
        The outputs that reuse an argument's memory (donated parameters).
    temp_size_in_bytes : int
        The temporary memory the program allocates while it runs.
    host_generated_code_size_in_bytes : int
        ``generated_code_size_in_bytes``, in host memory.
    host_argument_size_in_bytes : int
        ``argument_size_in_bytes``, in host memory.
    host_output_size_in_bytes : int
        ``output_size_in_bytes``, in host memory.
    host_alias_size_in_bytes : int
        ``alias_size_in_bytes``, in host memory.
    host_temp_size_in_bytes : int
        ``temp_size_in_bytes``, in host memory.
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


class CompiledProgram:
    """One loaded program and what pjrt_py read from it.

    ``signature`` is the compiled signature: names from the program text (or
    a serialized envelope), shapes and dtypes from the compiled module where
    the plugin reports one, else from the text.
    """

    def __init__(self, client: _Client, loaded: _core.Loaded, signature: list[ArgSpec] | None):
        self.client = client
        self.loaded: _core.Loaded | None = loaded  # None in a deleted executable's copy
        self.name: str = self._string("PJRT_Executable_Name", "executable_name")
        self.num_outputs: int = self._invoke("PJRT_Executable_NumOutputs").num_outputs
        devs = client.plugin.invoke(
            "PJRT_LoadedExecutable_AddressableDevices", executable=self._loaded_ptr
        )
        self.devices: list[Device] = [
            client._device_for(int(ffi.cast("uintptr_t", devs.addressable_devices[i])))
            for i in range(devs.num_addressable_devices)
        ]
        self.num_replicas: int = self._count("PJRT_Executable_NumReplicas", "num_replicas")
        self.num_partitions: int = self._count("PJRT_Executable_NumPartitions", "num_partitions")

        module = self._optimized_module()
        shape = None if module is None else _read(_hlo_proto.program_shape, module)
        # Parameters the program may donate (aliased to outputs, or donors).
        self.donated: tuple[int, ...] = (
            () if module is None else _read(_hlo_proto.donated_parameters, module) or ()
        )
        if shape is not None:
            signature = signature_from_shapes(signature, shape.parameters)
        self.signature = signature
        # Outputs of fixed shape get their metadata at creation, so a chained
        # call's check does not ask the plugin for it.
        self.out_metas: tuple[Meta, ...] | None = self._static_outputs(shape)
        self._places: tuple[tuple[int, ...], tuple[int | None, ...]] | None = None

    # -- PJRT queries ---------------------------------------------------
    def _handles(self) -> _core.Loaded:
        if self.loaded is None:
            raise ValueError("executable has been deleted")
        return self.loaded

    @property
    def _exe_ptr(self) -> Any:
        return ffi.cast("PJRT_Executable*", self._handles().executable)

    @property
    def _loaded_ptr(self) -> Any:
        return ffi.cast("PJRT_LoadedExecutable*", self._handles().address)

    def _invoke(self, function: str, **fields: Any) -> Any:
        """A query on the executable, with the client held for the call."""
        with self.client._pinned():
            return self.client.plugin.invoke(function, executable=self._exe_ptr, **fields)

    def _string(self, function: str, field: str) -> str:
        args = self._invoke(function)
        return str(ffi.unpack(getattr(args, field), getattr(args, f"{field}_size")).decode())

    def _count(self, function: str, field: str) -> int:
        if not self.client.plugin.supports(function):
            return 1
        return int(getattr(self._invoke(function), field))

    def _optimized_module(self) -> bytes | None:
        """The compiled ``HloModuleProto``, or None if the plugin cannot give one."""
        try:
            fmt, data = self.optimized_program()
            return _hlo_proto.hlo_module(data, fmt)
        except (PjrtError, _hlo_proto.ProtoError):
            return None  # unsupported or failing: fall back to the text's signature

    def _static_outputs(self, shape: _hlo_proto.ProgramShape | None) -> tuple[Meta, ...] | None:
        if shape is None or len(shape.results) != self.num_outputs:
            return None
        if any(r.dynamic or r.dtype is None or r.is_tuple for r in shape.results):
            return None
        metas = tuple(intern_meta((r.dims, r.dtype)) for r in shape.results if r.dtype is not None)
        # The module and PJRT's own answer must agree before one stands for the other.
        if [m[0] for m in metas] != self.output_shapes():
            return None
        return metas

    def dispatch_places(self) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
        """What the native dispatch paths compare an argument's place with, read once.

        Returns
        -------
        tuple
            The address of each device in execution order, and for each the
            address of the memory its parameters are read from there (the
            device's default memory), or None where that memory is not the
            device's alone or the plugin has no memory spaces: then the device
            is compared instead.
        """
        if self._places is None:
            memories: list[int | None] = []
            for device in self.devices:
                try:
                    memory = device.default_memory
                except PjrtError:  # UnsupportedError: a plugin without memory spaces
                    memories.append(None)
                    continue
                memories.append(memory._addr if memory.devices == [device] else None)
            self._places = (tuple(d._addr for d in self.devices), tuple(memories))
        return self._places

    def expected_metas(self) -> tuple[Meta, ...] | None:
        """One interned ``(shape, dtype)`` per parameter, the form a Buffer's
        metadata takes, so that matching arguments cost one comparison each;
        None where the signature is not fully static (every call is then
        checked the slow way)."""
        signature = self.signature
        if signature is None or not all(s.is_static for s in signature):
            return None
        return tuple(intern_meta((s.shape, s.dtype)) for s in signature)  # type: ignore[arg-type]

    # -- inspection -----------------------------------------------------
    def output_dtypes(self) -> list[np.dtype[Any]]:
        args = self._invoke("PJRT_Executable_OutputElementTypes")
        return [numpy_dtype(args.output_types[i]) for i in range(args.num_output_types)]

    def output_shapes(self) -> list[tuple[int, ...]]:
        args = self._invoke("PJRT_Executable_OutputDimensions")
        shapes, at = [], 0
        for i in range(args.num_outputs):
            n = args.dim_sizes[i]
            shapes.append(tuple(args.dims[at + j] for j in range(n)))
            at += n
        return shapes

    def fingerprint(self) -> str | None:
        try:
            args = self._invoke("PJRT_Executable_Fingerprint")
        except UnimplementedError:
            return None
        raw: bytes = ffi.unpack(args.executable_fingerprint, args.executable_fingerprint_size)
        return raw.decode("utf-8", "replace")

    def optimized_program(self) -> tuple[str, bytes]:
        program = ffi.new("PJRT_Program*")
        program.struct_size = lib.PJRT_Program_STRUCT_SIZE
        self._invoke("PJRT_Executable_OptimizedProgram", program=program)  # the size
        code = ffi.new("char[]", max(program.code_size, 1))
        program.code = code
        self._invoke("PJRT_Executable_OptimizedProgram", program=program)
        fmt = ffi.unpack(program.format, program.format_size).decode()
        return fmt, ffi.unpack(code, program.code_size)

    def as_text(self) -> str:
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
            text: str = run_joined(  # jaxlib's C++, parsed and printed on one thread: see joined
                lambda: _hlo.HloModule.from_serialized_hlo_module_proto(module).to_string()
            )
        except (_hlo_proto.ProtoError, ValueError, RuntimeError) as e:
            raise UnsupportedError(
                f"jaxlib cannot print this plugin's {fmt!r} program (a different XLA version?): {e}"
            ) from None
        return text

    def cost_analysis(self) -> dict[str, Any] | None:
        try:
            args = self._invoke("PJRT_Executable_GetCostAnalysis")
        except UnimplementedError:
            return None
        return named_values(args.properties, args.num_properties)

    def memory_analysis(self) -> MemoryStats | None:
        try:
            args = self._invoke("PJRT_Executable_GetCompiledMemoryStats")
        except UnimplementedError:
            return None
        return MemoryStats(**{f: int(getattr(args, f)) for f in MemoryStats.__dataclass_fields__})

    def serialize_raw(self) -> bytes:
        """The plugin's own serialized executable (``PJRT_Executable_Serialize``)."""
        with self.client._pinned():  # also while PJRT's bytes are freed
            args = self.client.plugin.invoke("PJRT_Executable_Serialize", executable=self._exe_ptr)
            try:
                payload: bytes = ffi.unpack(args.serialized_bytes, args.serialized_bytes_size)
            finally:
                args.serialized_executable_deleter(args.serialized_executable)
        return payload

    def serialize(self, signature: list[ArgSpec] | None, cache_key: str | None = None) -> bytes:
        identity = serialization.plugin_identity(self.client)
        return serialization.pack(identity, signature, self.serialize_raw(), cache_key)


def _read(reader: Callable[[bytes], _T], module: bytes) -> _T | None:
    try:
        return reader(module)
    except _hlo_proto.ProtoError:
        return None
