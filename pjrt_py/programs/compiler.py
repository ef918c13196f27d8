"""A client's compiler: compile with its caches and crash isolation, and load.

``pjrt_py.Client.compile`` and ``Client.deserialize`` are thin methods
over a ``Compiler``, one per client. It owns what compiling needs beyond
the plugin: the in-memory and disk caches (``pjrt_py.programs.cache``), the
helper process of isolated compiles (``pjrt_py.programs.isolate``), and the
checks run on a program before the plugin sees it. The client is passed in
on each call rather than kept, so a client and its compiler never hold each
other.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _core
from ..runtime import plugin_log
from ..runtime.capi import ffi, lib
from ..runtime.client import RuntimeClient
from ..runtime.device import Device
from ..runtime.errors import (
    NotFoundError,
    PjrtError,
    SerializationError,
    UnimplementedError,
    UnsupportedError,
)
from ..runtime.plugin import address
from . import diagnostics, form, serialization
from .bytecode_reader import BytecodeReader
from .cache import ENV_DIR, DiskCache, MemoryCache, disk_key
from .call_options import call_options
from .compile_options import program_bytes
from .compiled import CompiledProgram
from .debug_options import DebugValue
from .diagnostics import explain_compile_error
from .dynamic import DynamicExecutable, dynamic_signature
from .executable import Executable
from .exported import exported_text, is_exported
from .isolate import IsolatedCompiler, env_default
from .mlir_checks import check_program
from .mlir_text import find_main, main_signature
from .plugin_guards import check_for_plugin
from .signature import ArgSpec


class Compiler:
    """One client's compile state and the calls that use it.

    Parameters
    ----------
    plugin_path : str
        The plugin the client runs, for the isolated compile's helper.
    options : dict
        The client's create options, for the helper's own client.
    cache_dir, cache_max_bytes, isolate_compile
        As ``pjrt_py.Client`` takes them.
    """

    def __init__(
        self,
        plugin_path: str,
        options: dict[str, Any],
        *,
        cache_dir: str | os.PathLike[str] | bool | None = None,
        cache_max_bytes: int | None = None,
        isolate_compile: bool | None = None,
    ) -> None:
        self.cache = MemoryCache()
        self._plain_options: dict[str, bytes] = {}  # text -> options of compile(text)
        if cache_dir is None:
            cache_dir = os.environ.get(ENV_DIR) or False
        if cache_dir is True:
            raise ValueError("cache_dir takes a directory, None or False")
        self.disk: DiskCache | None = (
            DiskCache(cache_dir, cache_max_bytes) if cache_dir is not False else None
        )
        self._disk_identity: bytes | None = None
        if isolate_compile is None:
            isolate_compile = env_default()
        elif not isinstance(isolate_compile, bool):
            raise TypeError(f"isolate_compile must be a bool, got {isolate_compile!r}")
        self.isolate = isolate_compile
        self.helper = IsolatedCompiler(plugin_path, options)
        self.bytecode = BytecodeReader(self.helper)  # bytecode's text, read in the helper

    def compile(
        self,
        client: RuntimeClient,
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
        recompile: Any = None,
    ) -> Executable:
        """``Client.compile`` (documented there); ``recompile`` is the
        client's own ``compile``, which a dynamic program calls per shape."""
        client._check_open()
        if isinstance(program, (bytearray, memoryview)):
            program = bytes(program)
        if is_exported(program):  # jax.export's Exported: its program for this platform
            program = exported_text(program, client.platform_name, self.bytecode.text)
        if not isinstance(program, (str, bytes)):
            raise TypeError(
                f"program must be str (MLIR text), bytes or a jax.export.Exported, "
                f"got {type(program)}"
            )
        if isolate is None:
            isolate = self.isolate
        elif not isinstance(isolate, bool):
            raise TypeError(f"isolate must be True, False or None, got {isolate!r}")
        if isinstance(program, bytes):
            program, isolate = self.bytecode.plan(client, program, isolate)
        if isinstance(program, str) and "?" in program and dynamic_signature(program):
            # Dynamic dimensions: compiled per call's shapes (pjrt_py.dynamic).
            return DynamicExecutable(  # type: ignore[return-value]
                client,
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
                recompile,
            )
        options = call_options(
            client,
            program,
            self._plain_options,
            self.bytecode.text,
            num_replicas=num_replicas,
            num_partitions=num_partitions,
            device_assignment=device_assignment,
            compile_options=compile_options,
            device=device,
            debug_options=debug_options,
        )
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be True or False, got {ordered!r}")
        if isolate and client._spans_processes:
            raise UnsupportedError(
                "an isolated compile runs in a helper process, which cannot join this "
                "client's job of several processes: compile with isolate=False"
            )
        if not cache:
            compiled = self.compile_code(client, program, program_bytes(program), options, isolate)
        else:
            # A hit is a lookup by the program itself: a str's hash is
            # computed once per object, and nothing is encoded or parsed.
            # Text is keyed with the form it reaches the plugin in (form.py).
            key = (
                program,
                options,
                form.identity(client.plugin) if isinstance(program, str) else "",
            )
            compiled = self.cache.get(key)
            if compiled is None:
                compiled = self._compile_through_disk(
                    client, program, program_bytes(program), options, isolate
                )
                self.cache.put(key, compiled)
        # Each caller gets its own Executable sharing the compiled program,
        # so one caller's delete() cannot break another's.
        exe = Executable(compiled)
        if isinstance(program, str):
            exe._source = (program, options, isolate)
        if ordered:
            exe._ordered_form()
            exe._ordered = exe._blocked = True
        return exe

    def compile_code(
        self,
        client: RuntimeClient,
        program: str | bytes,
        code: bytes,
        options: bytes,
        isolate: bool = False,
        guard: bool = True,
    ) -> CompiledProgram:
        """Compile ``code`` (``program`` encoded) with the plugin: no cache involved.

        ``isolate``: in the compile helper process, loading what it serialized.
        ``guard``: refuse what this plugin build is known to abort on
        (``plugin_guards``); the helper process compiles without, since an
        abort there is a ``CompilerCrashError``."""
        # What the plugin could crash on is refused first (see mlir_text);
        # bytecode is read through jax's MLIR bindings where installed.
        text = program if isinstance(program, str) else self.bytecode.text(program)
        if text is not None:
            check_program(text)
            if find_main(text) is None:  # the plugin would print the module in generic form
                raise diagnostics.missing_main(text)
            if guard and not isolate:
                check_for_plugin(text, client.plugin.api_version, client.platform_name)
        if isolate:
            return self._load(client, self.helper.compile(program, code, options))
        signature = main_signature(text) if text is not None else None
        if isinstance(program, str):  # the form jaxlib's client sends (program_form)
            code = form.for_plugin(client.plugin, program) or code
        code_buf = ffi.new("char[]", code)
        fmt = ffi.new("char[]", b"mlir")
        prog = ffi.new("PJRT_Program*")
        prog.struct_size = lib.PJRT_Program_STRUCT_SIZE
        prog.code, prog.code_size = code_buf, len(code)
        prog.format, prog.format_size = fmt, 4
        opts = ffi.new("char[]", options)
        try:
            with plugin_log.captured():  # the plugin's lines to logging; a crash's still show
                return self._loaded(
                    client,
                    "PJRT_Client_Compile",
                    "executable",
                    signature,
                    program=prog,
                    compile_options=opts,
                    compile_options_size=len(options),
                )
        except (NotFoundError, UnimplementedError) as e:  # a target the plugin would not run
            explained = explain_compile_error(client, e)
            if explained is e:
                raise
            raise explained from e
        except PjrtError as e:  # diagnostics on the text: with its lines and carets
            readable = diagnostics.from_plugin(text, e) if text is not None else e
            if readable is e:
                raise
            raise readable from None

    def _loaded(
        self,
        client: RuntimeClient,
        function: str,
        result: str,
        signature: list[ArgSpec] | None,
        **fields: Any,
    ) -> CompiledProgram:
        """Run a PJRT call that makes a loaded executable, and take it over."""
        ptr, pin = client._pin()
        try:
            args = client.plugin.invoke(function, client=ffi.cast("PJRT_Client*", ptr), **fields)
            # The pin lets Loaded free the executable if close() ran meanwhile.
            loaded = _core.Loaded(client, address(getattr(args, result)), pin)
        finally:
            client._unpin(pin)
        return CompiledProgram(client, loaded, signature)

    def disk_key(
        self, client: RuntimeClient, program: str | bytes, code: bytes, options: bytes
    ) -> str:
        """The disk cache's entry name for ``program`` (encoded: ``code``)."""
        if self._disk_identity is None:
            self._disk_identity = serialization.disk_identity(client)
        identity = self._disk_identity
        if isinstance(program, str):  # the bytes sent depend on the form (form.py)
            identity += b"\0" + form.identity(client.plugin).encode()
        return disk_key(identity, code, options)

    def _compile_through_disk(
        self,
        client: RuntimeClient,
        program: str | bytes,
        code: bytes,
        options: bytes,
        isolate: bool = False,
    ) -> CompiledProgram:
        disk = self.disk
        if disk is None:
            return self.compile_code(client, program, code, options, isolate)
        key = self.disk_key(client, program, code, options)
        data = disk.get(key)
        if data is not None and serialization.cache_key_of(data) != key:
            disk.reject(key)  # filed under another key: another program's
            data = None
        if data is not None:
            try:
                compiled = self._load(client, data)
                disk.hits += 1
                return compiled
            except (SerializationError, PjrtError):
                disk.reject(key)  # damaged or unloadable: compile and rewrite
        compiled = self.compile_code(client, program, code, options, isolate)
        # An unwritable cache, or a plugin that cannot serialize, costs a compile.
        with contextlib.suppress(OSError, PjrtError):
            disk.put(key, compiled.serialize(compiled.signature, key))
        return compiled

    def deserialize(self, client: RuntimeClient, data: bytes, *, raw: bool = False) -> Executable:
        """``Client.deserialize`` (documented there)."""
        client._check_open()
        if not isinstance(raw, bool):
            raise TypeError(f"raw must be True or False, got {raw!r}")
        if raw:
            return Executable(self._load_raw(client, serialization.raw_payload(data)))
        return Executable(self._load(client, data))

    def _load_raw(self, client: RuntimeClient, payload: bytes) -> CompiledProgram:
        try:
            with plugin_log.captured():
                return self._loaded(
                    client,
                    "PJRT_Executable_DeserializeAndLoad",
                    "loaded_executable",
                    None,
                    serialized_executable=ffi.from_buffer(payload),
                    serialized_executable_size=len(payload),
                )
        except PjrtError as e:
            if diagnostics.missing_handler(e):  # a custom call with no handler here: not the bytes
                raise
            raise SerializationError(
                f"the {client.platform_name} plugin (PJRT {client.plugin.api_version[0]}."
                f"{client.plugin.api_version[1]}, {client.platform_version}) cannot load these "
                f"{len(payload)} bytes; raw bytes load only into the plugin build that made "
                f"them: {e}"
            ) from e

    def _load(self, client: RuntimeClient, data: bytes) -> CompiledProgram:
        made_by, signature, payload = serialization.unpack(data)
        problem = serialization.identity_mismatch(made_by, serialization.plugin_identity(client))
        if problem:
            raise SerializationError(problem)
        blob = ffi.from_buffer(payload)
        with plugin_log.captured():  # the AOT loader's lines go to logging (plugin_log)
            return self._loaded(
                client,
                "PJRT_Executable_DeserializeAndLoad",
                "loaded_executable",
                signature,
                serialized_executable=blob,
                serialized_executable_size=len(payload),
            )

    def close(self) -> None:
        """Drop the cached programs and stop the helper process."""
        self.cache.clear()
        self.helper.close()


__all__ = ["Compiler"]
