"""Clients: one PJRT client of one plugin, its devices, compile and transfers."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from typing import Any

from . import _runtime, effects, serialization
from ._ffi import ffi, lib
from .buffer import Buffer, host_to_device
from .cache import ENV_DIR, DiskCache, MemoryCache, disk_key
from .compile_options import encode_compile_options, positive_count
from .device import Device
from .errors import PjrtError, SerializationError
from .executable import Executable
from .plugin import Plugin, encode_named_values, load_plugin
from .program import main_signature
from .promise import BufferPromise


class Client:
    """A PJRT client.

    Parameters
    ----------
    plugin : str, path or Plugin, optional
        ``"cpu"`` (default), ``"cuda"``, ``"tpu"``, ``"rocm"``, or a path to a
        plugin ``.so``. With none, ``$PJRT_PLUGIN`` is used if set.
    options : dict, optional
        Client create options, passed to the plugin as ``PJRT_NamedValue``s
        (e.g. ``{"cpu_device_count": 4}`` for the CPU plugin).
    cache_dir : str or path, optional
        Keep compiled programs on disk there, across processes (see
        :mod:`pjrt_py.cache`). With none, ``$PJRT_PY_CACHE_DIR`` is used if
        set; ``cache_dir=False`` turns the disk cache off whatever the
        environment says.
    cache_max_bytes : int, optional
        The disk cache's size bound (default ``$PJRT_PY_CACHE_MAX_BYTES``,
        else 1 GiB); least recently used entries go first.

    ``close()`` makes the client and everything made from it unusable at
    once. The PJRT client itself is destroyed when the last of its buffers and
    executables is gone (a reference count kept in C), so nothing can use it
    after it is freed, whatever order Python collects objects in.
    """

    def __init__(
        self,
        plugin: str | os.PathLike[str] | Plugin | None = None,
        options: dict[str, Any] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | bool | None = None,
        cache_max_bytes: int | None = None,
    ) -> None:
        self._ptr = None
        self._h = None
        self._closed = False
        self.compile_cache = MemoryCache()
        if cache_dir is None:
            cache_dir = os.environ.get(ENV_DIR) or False
        if cache_dir is True:
            raise ValueError("cache_dir takes a directory, None or False")
        self.disk_cache: DiskCache | None = (
            DiskCache(cache_dir, cache_max_bytes) if cache_dir is not False else None
        )
        self._disk_identity: bytes | None = None
        self.plugin = plugin if isinstance(plugin, Plugin) else load_plugin(plugin)
        self._api = self.plugin.api
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict, got {type(options).__name__}")
        options = options or {}
        values, keep = encode_named_values(options)
        self._closed = True  # until fully made: __del__ must not unref
        args = self.plugin.invoke(
            "PJRT_Client_Create", create_options=values, num_options=len(options)
        )
        del keep
        self._ptr = args.client
        self._h = lib.pjrt_py_client_wrap(self._api, self._ptr)
        if self._h == ffi.NULL:
            raise MemoryError("cannot allocate the client handle")
        self._closed = False
        _runtime.register_client(self)
        effects.register(self)

        self.platform_name: str = self._string("PJRT_Client_PlatformName", "platform_name")
        self.platform_version: str = self._string("PJRT_Client_PlatformVersion", "platform_version")
        # CPU-only transfer paths: staged large copies, direct small reads
        # (see STAGED_COPY_BYTES and DIRECT_READ_BYTES in buffer.py).
        self._cpu_fast_paths = self.platform_name == "cpu"
        self.process_index: int = self.plugin.invoke(
            "PJRT_Client_ProcessIndex", client=self._ptr
        ).process_index

        self._devices_by_ptr: dict[int, Device] = {}
        self.devices: list[Device] = self._device_list("PJRT_Client_Devices", "devices")
        self.addressable_devices: list[Device] = self._device_list(
            "PJRT_Client_AddressableDevices", "addressable_devices"
        )
        if not self.addressable_devices:
            raise RuntimeError(f"{self.plugin.path}: the client has no addressable devices")

    # -- construction helpers ------------------------------------------
    def _string(self, function: str, field: str) -> str:
        args = self.plugin.invoke(function, client=self._ptr)
        return str(ffi.unpack(getattr(args, field), getattr(args, f"{field}_size")).decode())

    def _device_list(self, function: str, field: str) -> list[Device]:
        args = self.plugin.invoke(function, client=self._ptr)
        count = getattr(args, f"num_{field}")
        ptrs = getattr(args, field)
        return [self._device_for(ptrs[i]) for i in range(count)]

    def _device_for(self, ptr: Any) -> Device:
        key = int(ffi.cast("uintptr_t", ptr))
        device = self._devices_by_ptr.get(key)
        if device is None:
            device = Device(self, ptr)
            self._devices_by_ptr[key] = device
        return device

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("client is closed")

    def _target(self, device: Device | None) -> Device:
        if device is None:
            return self.addressable_devices[0]
        if not isinstance(device, Device):
            raise TypeError(f"device must be a pjrt_py.Device, got {type(device).__name__}")
        if device.client is not self:
            raise ValueError(f"{device!r} belongs to another client")
        if not device.is_addressable:
            raise ValueError(f"{device!r} is not addressable from this client")
        return device

    # -- public API -----------------------------------------------------
    @property
    def default_device(self) -> Device:
        return self.addressable_devices[0]

    @property
    def closed(self) -> bool:
        return self._closed

    def compile(
        self,
        program: str | bytes,
        *,
        num_replicas: int | None = None,
        num_partitions: int | None = None,
        device_assignment: Sequence[Sequence[int | Device]] | None = None,
        compile_options: bytes | None = None,
        device: Device | None = None,
        ordered: bool = False,
        cache: bool = True,
    ) -> Executable:
        """Compile a StableHLO/MLIR program (text ``str`` or bytecode ``bytes``).

        ``compile_options`` takes a serialized ``CompileOptionsProto`` as is;
        otherwise one is encoded from the arguments:

        * ``num_replicas`` / ``num_partitions`` default to the module's
          ``mhlo.num_replicas`` / ``mhlo.num_partitions`` attributes (what jax
          writes), else 1. More than one partition turns on SPMD partitioning,
          and a program with Shardy (``sdy``) shardings gets the Shardy
          partitioner, as jax would ask.
        * ``device_assignment[replica][partition]`` names the device (an id or
          a :class:`Device`) of each; the default is the first
          ``replicas x partitions`` devices in order.
        * ``device`` targets one device (a one-device assignment). Arguments
          must then live on that device: one on another device is an
          ``InvalidArgumentError`` from the plugin (it does not copy), and
          numpy arguments are transferred there.

        ``ordered=True`` makes every execution ordered (see
        :mod:`pjrt_py.effects`); the token-threaded form is compiled now.

        Compiling the same program with the same options again takes the
        compiled program from this client's in-memory cache (each call gets
        its own :class:`Executable` sharing it), and, with a disk cache, a
        fresh process loads it instead of compiling.
        ``cache=False`` compiles anew and leaves both caches alone.

        Raises
        ------
        PjrtError
            With the compiler's message, if the program is invalid.
        """
        self._check_open()
        if isinstance(program, (bytearray, memoryview)):
            program = bytes(program)
        if not isinstance(program, (str, bytes)):
            raise TypeError(f"program must be str (MLIR text) or bytes, got {type(program)}")
        if compile_options is None:
            options = self._options(
                program, num_replicas, num_partitions, device_assignment, device
            )
        elif not isinstance(compile_options, (bytes, bytearray)) or not compile_options:
            raise ValueError("compile_options must be non-empty serialized CompileOptionsProto")
        elif (num_replicas, num_partitions, device_assignment, device) != (None,) * 4:
            raise ValueError(
                "compile_options is used as is: do not also pass num_replicas, "
                "num_partitions, device_assignment or device"
            )
        else:
            options = bytes(compile_options)
        if not cache:
            exe = self._compile(program, _program_bytes(program), options)
        else:
            # A hit is a lookup by the program itself: a str's hash is
            # computed once per object, and nothing is encoded or parsed.
            key = (program, options)
            cached = self.compile_cache.get(key)
            if cached is None:
                cached = self._compile_through_disk(program, _program_bytes(program), options)
                self.compile_cache.put(key, cached)
            # Each caller gets its own Executable sharing the compiled
            # program, so one caller's delete() cannot break another's.
            exe = cached._share()
        if isinstance(program, str):
            exe._source = (program, options)
        if ordered:
            exe._ordered_form()
            exe._ordered = exe._blocked = True
        return exe

    def _options(
        self,
        program: str | bytes,
        num_replicas: int | None,
        num_partitions: int | None,
        device_assignment: Sequence[Sequence[int | Device]] | None,
        device: Device | None,
    ) -> bytes:
        """The CompileOptionsProto for compile()'s keyword arguments."""
        # Validated first: the device counts below multiply them.
        replicas = positive_count(
            "num_replicas",
            _module_count(program, "num_replicas") if num_replicas is None else num_replicas,
        )
        partitions = positive_count(
            "num_partitions",
            _module_count(program, "num_partitions") if num_partitions is None else num_partitions,
        )
        assignment = None
        if device is not None:
            if device_assignment is not None or replicas * partitions != 1:
                raise ValueError(
                    "device= places a single-device program; for replicas or partitions "
                    "pass device_assignment"
                )
            assignment = [[self._target(device).id]]
        elif device_assignment is not None:
            assignment = [
                [self._target(d).id if isinstance(d, Device) else d for d in row]
                for row in device_assignment
            ]
        elif replicas * partitions > 1:
            devices = self.devices
            if replicas * partitions > len(devices):
                raise ValueError(
                    f"{replicas} replica(s) x {partitions} partition(s) need "
                    f"{replicas * partitions} devices; this client has {len(devices)}"
                )
            ids = [d.id for d in devices]
            assignment = [ids[r * partitions : (r + 1) * partitions] for r in range(replicas)]
        if assignment is not None:
            known = {d.id for d in self.devices}
            unknown = [i for row in assignment for i in row if i not in known]
            if unknown:
                raise ValueError(f"device_assignment names unknown device id(s) {unknown}")
        sharded = partitions > 1
        return encode_compile_options(
            num_replicas=replicas,
            num_partitions=partitions,
            device_assignment=assignment,
            use_spmd_partitioning=sharded,
            use_shardy_partitioner=sharded and _uses_shardy(program),
        )

    def _compile(self, program: str | bytes, code: bytes, options: bytes) -> Executable:
        """Compile ``code`` (``program`` encoded) with the plugin: no cache involved."""
        signature = main_signature(program) if isinstance(program, str) else None
        code_buf = ffi.new("char[]", code)
        fmt = ffi.new("char[]", b"mlir")
        prog = ffi.new("PJRT_Program*")
        prog.struct_size = lib.PJRT_Program_STRUCT_SIZE
        prog.code, prog.code_size = code_buf, len(code)
        prog.format, prog.format_size = fmt, 4
        opts = ffi.new("char[]", options)
        args = self.plugin.invoke(
            "PJRT_Client_Compile",
            client=self._ptr,
            program=prog,
            compile_options=opts,
            compile_options_size=len(options),
        )
        lib.pjrt_py_client_ref(self._h)  # the executable's reference
        return Executable(self, args.executable, signature)

    def _compile_through_disk(
        self, program: str | bytes, code: bytes, options: bytes
    ) -> Executable:
        disk = self.disk_cache
        if disk is None:
            return self._compile(program, code, options)
        if self._disk_identity is None:
            self._disk_identity = serialization.disk_identity(self)
        key = disk_key(self._disk_identity, code, options)
        data = disk.get(key)
        if data is not None:
            try:
                exe = self.deserialize(data)
                disk.hits += 1
                return exe
            except (SerializationError, PjrtError):
                disk.reject(key)  # damaged or unloadable: compile and rewrite
        exe = self._compile(program, code, options)
        # An unwritable cache, or a plugin that cannot serialize, costs a compile.
        with contextlib.suppress(OSError, PjrtError):
            disk.put(key, exe.serialize())
        return exe

    def deserialize(self, data: bytes) -> Executable:
        """Load an executable from ``Executable.serialize()`` bytes.

        Raises
        ------
        SerializationError
            If ``data`` is not such bytes, is damaged, or was made by a
            different plugin build or device set: checked before the plugin
            sees anything.
        """
        self._check_open()
        made_by, signature, payload = serialization.unpack(data)
        problem = serialization.identity_mismatch(made_by, serialization.plugin_identity(self))
        if problem:
            raise SerializationError(problem)
        blob = ffi.from_buffer(payload)
        args = self.plugin.invoke(
            "PJRT_Executable_DeserializeAndLoad",
            client=self._ptr,
            serialized_executable=blob,
            serialized_executable_size=len(payload),
        )
        lib.pjrt_py_client_ref(self._h)  # the executable's reference
        return Executable(self, args.loaded_executable, signature)

    def buffer_async(
        self, value: Any, device: Device | None = None, *, zero_copy: bool = False
    ) -> BufferPromise:
        """Start moving a numpy array or scalar to ``device``; returns a promise at once.

        The data is copied: changing ``value`` after this returns does not
        change the device buffer. ``zero_copy=True`` (CPU only, 64-byte
        aligned C-contiguous arrays) makes the buffer alias ``value`` instead:
        the array is kept alive with the buffer, and writing to it changes the
        buffer's contents -- the caller must not.
        """
        self._check_open()
        return host_to_device(self, value, device, zero_copy)

    def buffer(
        self, value: Any, device: Device | None = None, *, zero_copy: bool = False
    ) -> Buffer:
        """Move a numpy array or scalar to ``device`` and wait until it is there."""
        promise = self.buffer_async(value, device, zero_copy=zero_copy)
        result: Buffer = promise.value()
        return result

    def close(self) -> None:
        """Make the client unusable, and drop its own reference. Idempotent."""
        if not self._closed:
            self._closed = True
            self.compile_cache.clear()
            h = getattr(self, "_h", None)
            if h is not None and not _runtime.state.finalizing:
                lib.pjrt_py_client_unref(h)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            self.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return (
            f"<Client {self.platform_name} ({self.platform_version}) "
            f"{len(self.addressable_devices)} device(s){state}>"
        )


_MODULE_COUNT = {
    name: re.compile(rf"mhlo\.{name}\s*=\s*(\d+)") for name in ("num_replicas", "num_partitions")
}


def _module_count(program: str | bytes, name: str) -> int:
    """``mhlo.num_replicas`` / ``mhlo.num_partitions`` of a text module, else 1."""
    if isinstance(program, bytes):
        return 1
    head = program[: program.find("func.func")]  # module attributes come first
    m = _MODULE_COUNT[name].search(head)
    return int(m.group(1)) if m else 1


def _uses_shardy(program: str | bytes) -> bool:
    """Whether the program carries Shardy shardings (``sdy.mesh`` / ``sdy.sharding``)."""
    return ("sdy." if isinstance(program, str) else b"sdy.") in program  # type: ignore[operator]


def _program_bytes(program: str | bytes) -> bytes:
    """The bytes handed to the compiler; ValueError for an empty program."""
    code = program.encode() if isinstance(program, str) else program
    if not code:
        raise ValueError("program is empty")
    return code
