"""The public ``Client``: the runtime's client, with compile and DLPack import.

``Client`` is a ``RuntimeClient`` (``pjrt_py.runtime.client``: plugin,
devices, memories, transfers, close) whose ``compile`` and ``deserialize``
hand off to its ``Compiler`` (``pjrt_py.programs.compiler``) and whose
``from_dlpack`` hands off to ``pjrt_py.interop.foreign``. This module also
keeps the process-wide default clients.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .interop.foreign import import_dlpack
from .programs.cache import DiskCache, MemoryCache
from .programs.compiler import Compiler
from .programs.debug_options import DebugValue
from .programs.device_programs import copy_on_device
from .programs.executable import Executable
from .programs.isolate import IsolatedCompiler
from .runtime.buffer import Buffer
from .runtime.client import RuntimeClient
from .runtime.device import Device
from .runtime.plugin import Plugin
from .runtime.promise import BufferPromise


class Client(RuntimeClient):
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
        super().__init__(plugin, options, kv_store=kv_store)
        self._compiler = Compiler(
            self.plugin.path,
            self.options,
            cache_dir=cache_dir,
            cache_max_bytes=cache_max_bytes,
            isolate_compile=isolate_compile,
        )
        self._tokens = threading.local()  # each thread's ordered-execution token

    @property
    def compile_cache(self) -> MemoryCache:
        """This client's in-memory cache of compiled programs (``pjrt_py.programs.cache``)."""
        return self._compiler.cache

    @property
    def disk_cache(self) -> DiskCache | None:
        """The disk cache compiled programs are kept in, or None (``cache_dir``)."""
        return self._compiler.disk

    @property
    def isolate_compile(self) -> bool:
        """Whether ``compile`` runs in a helper process by default (see ``isolate``)."""
        return self._compiler.isolate

    @isolate_compile.setter
    def isolate_compile(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"isolate_compile must be a bool, got {value!r}")
        self._compiler.isolate = value

    @property
    def compile_helper(self) -> IsolatedCompiler:
        """The helper process isolated compiles run in (started on first use)."""
        return self._compiler.helper

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
          must then live on that device: one on another device is a
          ``ValueError`` before the call that says to ``copy_to_device`` it
          (no copy is made), and numpy arguments are transferred there.

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
        return self._compiler.compile(
            self,
            program,
            num_replicas=num_replicas,
            num_partitions=num_partitions,
            device_assignment=device_assignment,
            compile_options=compile_options,
            device=device,
            ordered=ordered,
            cache=cache,
            debug_options=debug_options,
            isolate=isolate,
            recompile=self.compile,
        )

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
        return self._compiler.deserialize(self, data, raw=raw)

    def _copy_by_program(self, buffer: Buffer) -> BufferPromise:
        # The native copies call this where the plugin refused to copy a
        # buffer to its own device or memory (programs/device_programs.py).
        return copy_on_device(self, buffer)

    def close(self) -> None:
        """Make the client unusable, and drop its own reference. Idempotent."""
        compiler = getattr(self, "_compiler", None)  # None if __init__ failed early
        if compiler is not None:
            compiler.close()
        super().close()

    def __enter__(self) -> Client:
        return self

    def __copy__(self) -> Client:
        return self

    def __deepcopy__(self, memo: Any) -> Client:
        return self


__all__ = ["Client"]
