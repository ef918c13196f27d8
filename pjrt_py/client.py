"""Clients: one PJRT client of one plugin, its devices, compile and transfers."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import _core, _runtime, plugin_log, program_errors, program_form, serialization
from ._ffi import ffi, lib
from .buffer import Buffer, host_to_device
from .cache import ENV_DIR, DiskCache, MemoryCache, disk_key
from .client_options import checked_options, refuse_multiprocess_cpu
from .compile_options import (
    DebugValue,
    check_compile_options,
    options_for_program,
    program_bytes,
)
from .compiled import CompiledProgram
from .device import Device
from .dlpack import import_dlpack
from .dynamic import DynamicExecutable, dynamic_signature
from .errors import NotFoundError, PjrtError, SerializationError, UnsupportedError
from .executable import Executable
from .ffi import explain_compile_error
from .gpu_memory import with_memory_policy
from .isolate import IsolatedCompiler, env_default
from .kv import check_store
from .memory import Memory, of_client, require_memories, resolve
from .mlir_text import bytecode_to_text, check_program, find_main, main_signature
from .plugin import Plugin, address, encode_named_values, load_plugin, plugin_info
from .program import ArgSpec
from .promise import BufferPromise


class Client(_core.ClientCore):
    """A PJRT client.

    ``close()`` makes the client and everything made from it unusable at
    once (``ValueError``). The PJRT client itself is destroyed when the last
    of its buffers, executables and calls in flight is gone (a reference
    count kept in C), so nothing can use it after it is freed, whatever order
    Python collects objects in. ``copy.copy`` / ``copy.deepcopy`` give the
    client itself; pickling raises ``TypeError``. In a process forked after
    the client was made, the client is closed (see docs/lifetimes.md).

    Parameters
    ----------
    plugin : str, path or Plugin, optional
        ``"cpu"`` (default), ``"cuda"``, ``"tpu"``, ``"rocm"``, or a path to a
        plugin ``.so``. With none, ``$PJRT_PLUGIN`` is used if set.
    options : dict, optional
        Client create options, passed to the plugin as ``PJRT_NamedValue``s
        (e.g. ``{"cpu_device_count": 4}`` for the CPU plugin). On a GPU
        plugin, ``preallocate``, ``memory_fraction`` and ``allocator`` decide
        how much device memory the client takes; unless given here or by
        jax's ``XLA_PYTHON_CLIENT_*`` variables, pjrt_py does not
        preallocate, so torch or jax can share the GPU (``pjrt_py.gpu_memory``).
    cache_dir : str or path, optional
        Keep compiled programs on disk there, across processes (see
        ``pjrt_py.cache``). With none, ``$PJRT_PY_CACHE_DIR`` is used if
        set; ``cache_dir=False`` turns the disk cache off whatever the
        environment says.
    cache_max_bytes : int, optional
        The disk cache's size bound (default ``$PJRT_PY_CACHE_MAX_BYTES``,
        else 1 GiB); least recently used entries go first.
    isolate_compile : bool, optional
        Compile in a helper process by default (``compile(isolate=...)``
        overrides it; see ``pjrt_py.isolate``). With none,
        ``$PJRT_PY_ISOLATE_COMPILE=1`` turns it on. The helper starts on the
        first isolated compile and stops at ``close()``.
    kv_store : object, optional
        A key-value store (``get``, ``try_get``, ``put``; see
        ``pjrt_py.kv``) the plugin coordinates processes through. It is
        kept until the PJRT client is destroyed. A CPU plugin cannot run
        across processes: options asking it to (``num_nodes`` > 1, a
        ``node_id`` or ``process_id`` > 0) raise ``UnsupportedError``.
    """

    def __init__(
        self,
        plugin: str | os.PathLike[str] | Plugin | None = None,
        options: dict[str, Any] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | bool | None = None,
        cache_max_bytes: int | None = None,
        isolate_compile: bool | None = None,
        kv_store: Any = None,
    ) -> None:
        self.compile_cache = MemoryCache()
        if cache_dir is None:
            cache_dir = os.environ.get(ENV_DIR) or False
        if cache_dir is True:
            raise ValueError("cache_dir takes a directory, None or False")
        self.disk_cache: DiskCache | None = (
            DiskCache(cache_dir, cache_max_bytes) if cache_dir is not False else None
        )
        self._disk_identity: bytes | None = None
        self._tokens = threading.local()  # each thread's ordered-execution token
        if isinstance(plugin, Plugin):  # from before a fork: this process's instance
            plugin = plugin if plugin.generation == _core.generation() else load_plugin(plugin.path)
        self.plugin = plugin if isinstance(plugin, Plugin) else load_plugin(plugin)
        # Checked against the types the plugin reads them as: a wrong one aborts.
        platform = plugin_info(self.plugin.path).name
        # GPU memory: the caller's options, then jax's variables, then ours.
        options = checked_options(platform, with_memory_policy(platform, options))
        refuse_multiprocess_cpu(platform, options)
        nodes = options.get("num_nodes")
        self._spans_processes = isinstance(nodes, int) and nodes > 1
        if kv_store is not None:
            check_store(kv_store)
        self.options: dict[str, Any] = dict(options)  # what a compile helper's client gets
        if isolate_compile is None:
            isolate_compile = env_default()
        elif not isinstance(isolate_compile, bool):
            raise TypeError(f"isolate_compile must be a bool, got {isolate_compile!r}")
        self.isolate_compile = isolate_compile
        self.compile_helper = IsolatedCompiler(self.plugin.path, self.options)
        values, keep = encode_named_values(options)
        kv_fields, holder = _kv_fields(kv_store)
        try:
            args = self.plugin.invoke(
                "PJRT_Client_Create", create_options=values, num_options=len(options), **kv_fields
            )
        except BaseException:
            if holder is not None:
                _core.kv_holder_free(holder)
            raise
        del keep
        # From here the native core owns the PJRT client (and the store's
        # holder): if anything below fails, this object's collection destroys it.
        self._attach(self.plugin.address, address(args.client), False, holder)
        self.kv_store = kv_store
        self.platform_name: str = self._string("PJRT_Client_PlatformName", "platform_name")
        self.platform_version: str = self._string("PJRT_Client_PlatformVersion", "platform_version")
        # CPU-only transfer paths: staged large copies, direct reads of ready
        # buffers (see STAGED_COPY_BYTES and DIRECT_READ_BYTES in buffer.py).
        self._cpu_fast_paths = self.platform_name == "cpu"
        with self._pinned() as ptr:
            self.process_index: int = self.plugin.invoke(
                "PJRT_Client_ProcessIndex", client=ptr
            ).process_index
        self._devices_by_addr: dict[int, Device] = {}
        self._memories_by_addr: dict[int, Memory] = {}
        self.devices: list[Device] = self._device_list("PJRT_Client_Devices", "devices")
        self.addressable_devices: list[Device] = self._device_list(
            "PJRT_Client_AddressableDevices", "addressable_devices"
        )
        if not self.addressable_devices:
            raise RuntimeError(f"{self.plugin.path}: the client has no addressable devices")
        self._set_default_device(self.addressable_devices[0]._addr)
        self._check_processes(options)

    def _check_processes(self, options: Mapping[str, Any]) -> None:
        """After creation: the plugin made the world that was asked for."""
        node = options.get("node_id", options.get("process_id"))
        nodes = options.get("num_nodes")
        wrong = None
        if node is not None and self.process_index != node:
            wrong = f"process_index {self.process_index}, asked node {node}"
        elif nodes is not None and nodes > 1 and len(self.devices) <= len(self.addressable_devices):
            wrong = f"{len(self.devices)} devices, all of them local, asked {nodes} nodes"
        if wrong is not None:
            self.close()
            raise UnsupportedError(
                f"{self.plugin.path} made a client that is not the one asked for ({wrong}): "
                "it does not run across processes this way"
            )

    # -- construction helpers ------------------------------------------
    @contextlib.contextmanager
    def _pinned(self) -> Iterator[Any]:
        """The ``PJRT_Client*``, held for a PJRT call: a concurrent ``close()``
        cannot free it, and the exit sequence waits for the call."""
        ptr, token = self._pin()
        try:
            yield ffi.cast("PJRT_Client*", ptr)
        finally:
            self._unpin(token)

    def _string(self, function: str, field: str) -> str:
        with self._pinned() as ptr:
            args = self.plugin.invoke(function, client=ptr)
            return str(ffi.unpack(getattr(args, field), getattr(args, f"{field}_size")).decode())

    def _device_list(self, function: str, field: str) -> list[Device]:
        with self._pinned() as ptr:
            args = self.plugin.invoke(function, client=ptr)
            count, ptrs = getattr(args, f"num_{field}"), getattr(args, field)
            return [self._device_for(address(ptrs[i])) for i in range(count)]

    def _device_for(self, addr: int) -> Device:
        """The Device at a ``PJRT_Device*`` address (made once per device)."""
        device = self._devices_by_addr.get(addr)
        if device is None:
            device = Device(self, ffi.cast("PJRT_Device*", addr))
            self._devices_by_addr[addr] = device
        return device

    def _memory_for(self, addr: int | None) -> Memory:
        """The Memory at a ``PJRT_Memory*`` address (made once per memory)."""
        if addr is None:  # the native core found no PJRT_Buffer_Memory
            self.plugin.require("PJRT_Buffer_Memory")
        assert addr is not None
        memory = self._memories_by_addr.get(addr)
        if memory is None:
            memory = Memory(self, ffi.cast("PJRT_Memory*", addr))
            self._memories_by_addr[addr] = memory
        return memory

    def _memory_target(self, memory: Memory | str, buffer: Buffer) -> Memory:
        """The Memory a copy of ``buffer`` goes to (called by copy_to_memory)."""
        self.plugin.require("PJRT_Buffer_CopyToMemory")
        if isinstance(memory, str):
            return resolve(buffer.device, memory)
        return of_client(self, memory)  # any device's: a copy may cross devices

    def _check_open(self) -> None:
        reason = self._closed_reason(None)  # closed, inherited over fork, or exiting
        if reason is not None:
            raise ValueError(reason)

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
        """The first addressable device: where ``buffer`` places data when no device is named."""
        return self.addressable_devices[0]

    @property
    def memories(self) -> list[Memory]:
        """Every memory space addressable from this client (see ``pjrt_py.memory``)."""
        require_memories(self)
        with self._pinned() as ptr:
            args = self.plugin.invoke("PJRT_Client_AddressableMemories", client=ptr)
            found, count = args.addressable_memories, args.num_addressable_memories
            return [self._memory_for(address(found[i])) for i in range(count)]

    def from_dlpack(
        self, x: Any, device: Device | None = None, *, copy: bool | None = None
    ) -> Buffer:
        """A Buffer of this client from any DLPack producer (see ``pjrt_py.dlpack``).

        Zero-copy on CPU where the memory allows (``copy=None``); ``copy=True``
        always copies, ``copy=False`` raises ``BufferError`` rather than copy.

        Parameters
        ----------
        x : object
            An object with ``__dlpack__`` (numpy array, ``jax.Array``,
            ``torch.Tensor``, ...), a DLPack capsule, or a ``Buffer`` (or
            ``BufferPromise`` of one) of this client, returned as is if it
            is on the target device and ``copy`` is not True, else copied there.
        device : Device, optional
            The device of this client to place it on. If None: for a tensor in
            device memory, the client's device with that hardware id if it has
            one; otherwise the client's first addressable device.
        copy : bool, optional
            None (default): use the producer's memory in place where the client
            can (on CPU: compact row-major host memory, 64-byte aligned), else
            copy. True: always copy. False: never copy; raise instead.

        Returns
        -------
        Buffer
            The buffer; a view of the producer's memory if nothing was copied.

        Raises
        ------
        ValueError
            If the client is closed, or ``device`` belongs to another client or
            is not addressable from this one.
        BufferError
            If ``copy=False`` and ``x`` cannot be used without a copy, if a
            tensor in device memory would have to be copied to another device
            type, or if the producer's tensor is malformed (negative dimension,
            no data).
        TypeError
            If ``x`` is not a DLPack producer, its dtype has no PJRT element
            type, ``device`` is not a ``Device``, or ``copy`` is not True,
            False or None.
        """
        self._check_open()
        return import_dlpack(self, x, device, copy)

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
        debug_options: Mapping[str | int, DebugValue] | None = None,
        isolate: bool | None = None,
    ) -> Executable:
        """Compile a StableHLO/MLIR program (text ``str`` or bytecode ``bytes``).

        ``compile_options`` takes a serialized ``CompileOptionsProto`` as is;
        otherwise one is encoded from the arguments:

        * ``num_replicas`` / ``num_partitions`` default to the module's
          ``mhlo.num_replicas`` / ``mhlo.num_partitions`` attributes (what jax
          writes), else 1. SPMD partitioning and the Shardy partitioner are
          on, as jax asks (a module with GSPMD shardings falls back to GSPMD
          in the plugin).
        * ``device_assignment[replica][partition]`` names the device (an id or
          a ``Device``) of each; the default is the first
          ``replicas x partitions`` devices in order.
        * ``device`` targets one device (a one-device assignment). Arguments
          must then live on that device: one on another device is an
          ``InvalidArgumentError`` from the plugin (it does not copy), and
          numpy arguments are transferred there.

        The options are those ``jax.jit`` sends for the same program (its
        ``DebugOptions`` included, so NaN propagates through ``max``/``min``
        as in jax); ``debug_options`` overrides single ``xla.DebugOptions``
        fields by name (``{"xla_cpu_enable_fast_min_max": True}``) or field
        number. They are part of the options, so of every cache key.
        ``compile_options`` bytes are checked like the keywords (replica and
        partition counts positive, the device assignment a rectangle of this
        client's devices) before the plugin sees them.

        ``ordered=True`` makes every execution ordered (see
        ``pjrt_py.effects``); the token-threaded form is compiled now.

        Compiling the same program with the same options again takes the
        compiled program from this client's in-memory cache (each call gets
        its own ``Executable`` sharing it), and, with a disk cache, a
        fresh process loads it instead of compiling.
        ``cache=False`` compiles anew and leaves both caches alone.

        ``isolate=True`` compiles in a helper process (see ``pjrt_py.isolate``),
        so a compiler crash raises ``CompilerCrashError`` instead of
        killing this process; the default is the client's ``isolate_compile``.
        The caches do not depend on it: a hit is a hit either way.

        Parameters
        ----------
        program : str or bytes
            The program: MLIR text (``str``) or bytecode (``bytes``; a
            ``bytearray`` or ``memoryview`` is copied to ``bytes``).
        num_replicas, num_partitions : int, optional
            The replica and partition counts: positive ints below ``2**31``.
            None (default) reads the module's ``mhlo.num_replicas`` /
            ``mhlo.num_partitions``, else takes 1.
        device_assignment : sequence of sequences of int or Device, optional
            ``device_assignment[replica][partition]``: a ``num_replicas`` x
            ``num_partitions`` rectangle of distinct devices of this client,
            each a device id or a ``Device``. None (default): the first
            ``replicas x partitions`` of ``devices``, in order.
        compile_options : bytes, optional
            A serialized ``CompileOptionsProto``, used as is instead of the
            options the other arguments encode (see
            ``encode_compile_options``); it excludes
            ``num_replicas``, ``num_partitions``, ``device_assignment``,
            ``device`` and ``debug_options``.
        device : Device, optional
            One addressable device of this client to compile a one-replica,
            one-partition program for.
        ordered : bool, optional
            Make every execution ordered (default False); needs the program's
            text.
        cache : bool, optional
            Look the program up in the caches and store it there (default
            True); False compiles anew and leaves both caches alone.
        debug_options : mapping, optional
            ``xla.DebugOptions`` fields to override, by name or field number,
            each to a bool, int, float, str or bytes.
        isolate : bool, optional
            Compile in a helper process; None (default) takes the client's
            ``isolate_compile``.

        Returns
        -------
        Executable
            The compiled program, loaded on this client's devices: a new
            ``Executable`` on every call, sharing a cached compiled
            program with the other calls that hit it.

        Raises
        ------
        PjrtError
            With the compiler's message, if the program is invalid.
        CompilerCrashError
            If an isolated compile's helper process died (e.g. ``SIGSEGV``).
        TypeError
            If ``program`` is neither ``str`` nor ``bytes``, ``device`` (or an
            entry of ``device_assignment``) is not a ``Device`` or an id,
            or ``debug_options`` has a key or value of the wrong type.
        ValueError
            If the client is closed; if the program is empty, or its text would
            crash the plugin (brackets nested too deep, a cycle of calls, a
            type whose size overflows int64); if
            ``compile_options`` is empty, not bytes, or given with the keywords
            it excludes; if a count is not a positive int, the placement does
            not fit this client's devices, or ``device`` is given for more than
            one replica or partition; if a ``Device`` belongs to another
            client or is not addressable; or if ``ordered=True`` for a
            bytecode program.
        UnsupportedError
            For an isolated compile on a client that spans processes (its
            helper process cannot join the job).
        """
        self._check_open()
        if isinstance(program, (bytearray, memoryview)):
            program = bytes(program)
        if not isinstance(program, (str, bytes)):
            raise TypeError(f"program must be str (MLIR text) or bytes, got {type(program)}")
        if isinstance(program, str) and "?" in program and dynamic_signature(program):
            # Dynamic dimensions: compiled per call's shapes (pjrt_py.dynamic).
            return DynamicExecutable(  # type: ignore[return-value]
                self,
                program,
                dict(
                    num_replicas=num_replicas,
                    num_partitions=num_partitions,
                    device_assignment=device_assignment,
                    compile_options=compile_options,
                    device=device,
                    ordered=ordered,
                    cache=cache,
                    debug_options=debug_options,
                    isolate=isolate,
                ),
            )
        if compile_options is None:
            options = options_for_program(
                program,
                num_replicas=num_replicas,
                num_partitions=num_partitions,
                device_assignment=None
                if device_assignment is None
                else [[self._device_id(d) for d in row] for row in device_assignment],
                device=None if device is None else self._target(device).id,
                device_ids=[d.id for d in self.devices],
                debug_options=debug_options,
            )
        elif not isinstance(compile_options, (bytes, bytearray)) or not compile_options:
            raise ValueError("compile_options must be non-empty serialized CompileOptionsProto")
        elif (num_replicas, num_partitions, device_assignment, device, debug_options) != (
            None,
        ) * 5:
            raise ValueError(
                "compile_options is used as is: do not also pass num_replicas, "
                "num_partitions, device_assignment, device or debug_options"
            )
        else:
            options = bytes(compile_options)
            check_compile_options(options, [d.id for d in self.devices])
        if isolate is None:
            isolate = self.isolate_compile
        elif not isinstance(isolate, bool):
            raise TypeError(f"isolate must be True, False or None, got {isolate!r}")
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be True or False, got {ordered!r}")
        if isolate and self._spans_processes:
            raise UnsupportedError(
                "an isolated compile runs in a helper process, which cannot join this "
                "client's job of several processes: compile with isolate=False"
            )
        if not cache:
            compiled = self._compile(program, program_bytes(program), options, isolate)
        else:
            # A hit is a lookup by the program itself: a str's hash is
            # computed once per object, and nothing is encoded or parsed.
            key = (program, options)
            compiled = self.compile_cache.get(key)
            if compiled is None:
                compiled = self._compile_through_disk(
                    program, program_bytes(program), options, isolate
                )
                self.compile_cache.put(key, compiled)
        # Each caller gets its own Executable sharing the compiled program,
        # so one caller's delete() cannot break another's.
        exe = Executable(compiled)
        if isinstance(program, str):
            exe._source = (program, options, isolate)
        if ordered:
            exe._ordered_form()
            exe._ordered = exe._blocked = True
        return exe

    def _device_id(self, device: int | Device) -> int:
        return self._target(device).id if isinstance(device, Device) else device

    def _compile(
        self, program: str | bytes, code: bytes, options: bytes, isolate: bool = False
    ) -> CompiledProgram:
        """Compile ``code`` (``program`` encoded) with the plugin: no cache involved.

        ``isolate``: in the compile helper process, loading what it serialized."""
        # What the plugin could crash on is refused first (see mlir_text);
        # bytecode is read through jax's MLIR bindings where installed.
        text = program if isinstance(program, str) else bytecode_to_text(program)
        if text is not None:
            check_program(text)
            if find_main(text) is None:  # the plugin would print the module in generic form
                raise program_errors.missing_main(text)
        if isolate:
            return self._load(self.compile_helper.compile(program, code, options))
        signature = main_signature(text) if text is not None else None
        if isinstance(program, str):  # the form jaxlib's client sends (program_form)
            code = program_form.for_plugin(self.plugin, program) or code
        code_buf = ffi.new("char[]", code)
        fmt = ffi.new("char[]", b"mlir")
        prog = ffi.new("PJRT_Program*")
        prog.struct_size = lib.PJRT_Program_STRUCT_SIZE
        prog.code, prog.code_size = code_buf, len(code)
        prog.format, prog.format_size = fmt, 4
        opts = ffi.new("char[]", options)
        try:
            return self._loaded(
                "PJRT_Client_Compile",
                "executable",
                signature,
                program=prog,
                compile_options=opts,
                compile_options_size=len(options),
            )
        except NotFoundError as e:  # a custom-call target the plugin would not run
            explained = explain_compile_error(self, e)
            if explained is e:
                raise
            raise explained from e
        except PjrtError as e:  # diagnostics on the text: with its lines and carets
            readable = program_errors.from_plugin(text, e) if text is not None else e
            if readable is e:
                raise
            raise readable from None

    def _loaded(
        self, function: str, result: str, signature: list[ArgSpec] | None, **fields: Any
    ) -> CompiledProgram:
        """Run a PJRT call that makes a loaded executable, and take it over."""
        with self._pinned() as ptr:
            args = self.plugin.invoke(function, client=ptr, **fields)
            loaded = _core.Loaded(self, address(getattr(args, result)))
        return CompiledProgram(self, loaded, signature)

    def _compile_through_disk(
        self, program: str | bytes, code: bytes, options: bytes, isolate: bool = False
    ) -> CompiledProgram:
        disk = self.disk_cache
        if disk is None:
            return self._compile(program, code, options, isolate)
        if self._disk_identity is None:
            self._disk_identity = serialization.disk_identity(self)
        key = disk_key(self._disk_identity, code, options)
        data = disk.get(key)
        if data is not None and serialization.cache_key_of(data) != key:
            disk.reject(key)  # filed under another key: another program's
            data = None
        if data is not None:
            try:
                compiled = self._load(data)
                disk.hits += 1
                return compiled
            except (SerializationError, PjrtError):
                disk.reject(key)  # damaged or unloadable: compile and rewrite
        compiled = self._compile(program, code, options, isolate)
        # An unwritable cache, or a plugin that cannot serialize, costs a compile.
        with contextlib.suppress(OSError, PjrtError):
            disk.put(key, compiled.serialize(compiled.signature, key))
        return compiled

    def deserialize(self, data: bytes, *, raw: bool = False) -> Executable:
        """Load an executable from ``Executable.serialize()`` bytes.

        Parameters
        ----------
        data : bytes
            What ``Executable.serialize`` returned: the plugin's
            serialized executable, wrapped with the identity of the plugin
            build and devices that made it, and the program's signature.
        raw : bool, optional
            ``data`` is a plugin's own serialized executable instead: from
            ``Executable.serialize(raw=True)``, another PJRT binding, jax's
            ``compiled.runtime_executable().serialize()``, or the output of
            ``jax.experimental.serialize_executable.serialize`` (read without
            running pickle's code). The plugin parses the bytes itself: load
            only bytes made by the same plugin build (``docs/aot.md``).

        Returns
        -------
        Executable
            The executable, loaded on this client.

        Raises
        ------
        ValueError
            If the client is closed.
        PjrtError
            If the plugin cannot load the executable.
        SerializationError
            If ``data`` is not such bytes, is damaged, or was made by a
            different plugin build or device set: checked before the plugin
            sees anything. With ``raw``: if ``data`` is pjrt_py's own format,
            or the plugin cannot load it (bytes of another platform or XLA
            version, say), with the plugin's message.
        """
        self._check_open()
        if not isinstance(raw, bool):
            raise TypeError(f"raw must be True or False, got {raw!r}")
        if raw:
            return Executable(self._load_raw(serialization.raw_payload(data)))
        return Executable(self._load(data))

    def _load_raw(self, payload: bytes) -> CompiledProgram:
        try:
            with plugin_log.captured():
                return self._loaded(
                    "PJRT_Executable_DeserializeAndLoad",
                    "loaded_executable",
                    None,
                    serialized_executable=ffi.from_buffer(payload),
                    serialized_executable_size=len(payload),
                )
        except PjrtError as e:
            raise SerializationError(
                f"the {self.platform_name} plugin (PJRT {self.plugin.api_version[0]}."
                f"{self.plugin.api_version[1]}, {self.platform_version}) cannot load these "
                f"{len(payload)} bytes; raw bytes load only into the plugin build that made "
                f"them: {e}"
            ) from e

    def _load(self, data: bytes) -> CompiledProgram:
        made_by, signature, payload = serialization.unpack(data)
        problem = serialization.identity_mismatch(made_by, serialization.plugin_identity(self))
        if problem:
            raise SerializationError(problem)
        blob = ffi.from_buffer(payload)
        with plugin_log.captured():  # the AOT loader's lines go to logging (plugin_log)
            return self._loaded(
                "PJRT_Executable_DeserializeAndLoad",
                "loaded_executable",
                signature,
                serialized_executable=blob,
                serialized_executable_size=len(payload),
            )

    def _buffer_async_slow(
        self,
        value: Any,
        device: Device | None = None,
        *,
        zero_copy: bool = False,
        memory: Memory | str | None = None,
    ) -> BufferPromise:
        """buffer_async for everything its native path does not take."""
        self._check_open()
        return host_to_device(self, value, device, zero_copy, memory)

    def buffer(
        self,
        value: Any,
        device: Device | None = None,
        *,
        zero_copy: bool = False,
        memory: Memory | str | None = None,
    ) -> Buffer:
        """Move a numpy array or scalar to ``device`` and wait until it is there.

        ``memory``: a ``Memory`` of ``device`` or one of its kinds
        (``"pinned_host"``, ...); the device's default memory if None.

        Parameters
        ----------
        value : array_like
            A numpy array or scalar (anything ``np.asarray`` takes) of a
            supported dtype and rank at most 64. Its data is copied unless
            ``zero_copy`` is True.
        device : Device, optional
            An addressable device of this client; ``default_device`` if
            None.
        zero_copy : bool, optional
            Make the buffer alias ``value``'s memory instead of copying it
            (default False): CPU only, for a C-contiguous array whose data is
            64-byte aligned (see ``aligned_empty``). Writing to
            the array then changes the buffer.
        memory : Memory or str, optional
            The memory space to place the buffer in: a ``Memory``
            addressable by ``device``, or the kind of one of its memories.

        Returns
        -------
        Buffer
            The buffer, its data on the device.

        Raises
        ------
        TypeError
            If the dtype is not supported, ``value`` is already a
            ``Buffer`` or ``BufferPromise``, ``device`` is not a
            ``Device``, ``zero_copy`` is not a bool, or ``memory`` is
            neither a ``Memory`` nor a str.
        ValueError
            If the client is closed; ``device`` belongs to another client or is
            not addressable; the array's rank is above 64; ``zero_copy`` is
            asked for off CPU or for an array that is not C-contiguous and
            aligned; or ``memory`` is not a memory of ``device``.
        UnsupportedError
            If ``memory`` is given and the plugin does not report memory
            spaces, or placed the buffer in another memory.
        """
        if device is None and not zero_copy and memory is None:
            promise = self.buffer_async(value)  # keywords would leave the native path
        else:
            promise = self.buffer_async(value, device, zero_copy=zero_copy, memory=memory)
        result: Buffer = promise.value()
        return result

    def close(self) -> None:
        """Make the client unusable, and drop its own reference. Idempotent."""
        if not self.closed:
            self.compile_cache.clear()
        helper = getattr(self, "compile_helper", None)  # None if __init__ failed early
        if helper is not None:
            helper.close()
        self._close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __copy__(self) -> Client:
        return self

    def __deepcopy__(self, memo: Any) -> Client:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(
            "a pjrt_py.Client cannot be pickled: it is this process's connection to a "
            "plugin; make a Client in the other process"
        )

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        name = getattr(self, "platform_name", "?")
        version = getattr(self, "platform_version", "?")
        count = len(getattr(self, "addressable_devices", ()))
        return f"<Client {name} ({version}) {count} device(s){state}>"


_default: Client | None = None
_default_lock = threading.Lock()


def _new_default_lock() -> None:
    global _default_lock
    _default_lock = threading.Lock()


_runtime.reset_in_child(_new_default_lock)


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

__all__ = ["Client", "default_client", "default_client_for"]


def _kv_fields(store: Any) -> tuple[dict[str, Any], int | None]:
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
