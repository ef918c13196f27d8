"""Loading PJRT plugins, and calling into their function tables.

A plugin is a shared library exporting ``GetPjrtApi``. It is loaded with
``dlopen`` once per process, initialised once, and never closed: clients,
buffers and callbacks running on the plugin's threads may outlive any Python
object that refers to it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from .. import _core
from . import process as _runtime
from .capi import ffi, lib
from .discovery import find_plugin, plugin_info
from .errors import PluginLoadError, UnsupportedError
from .library import load_library

# Every PJRT_Api slot the build header declares -> the offset where it ends.
_SLOT_END: dict[str, int] = {
    ffi.string(lib.pjrt_py_slots[i].name).decode(): lib.pjrt_py_slots[i].end
    for i in range(lib.pjrt_py_num_slots)
}


class Plugin:
    """A loaded and initialised PJRT plugin. Get one with ``load_plugin``.

    Parameters
    ----------
    path : str
        The plugin's shared library, loaded with ``dlopen`` (never closed).
    instance : int
        0 for the library itself; n > 0 for the n-th new instance of a library
        the process already has, loaded from a copy of the file: what
        ``load_plugin`` does in a child of ``os.fork()`` (see
        ``pjrt_py.runtime.library``).

    Attributes
    ----------
    path : str
        The shared library.
    api_version : tuple[int, int]
        ``(major, minor)`` of the PJRT C API the plugin was built with.
    instance : int
        Which instance of the library this is (0: the file itself).

    Raises
    ------
    PluginLoadError
        If the library cannot be loaded, has no ``GetPjrtApi``, or implements
        another major version of the PJRT C API than pjrt_py was built for.
    PjrtError
        If the plugin fails to initialise (``PJRT_Plugin_Initialize``).
    """

    def __init__(self, path: str, *, instance: int = 0) -> None:
        # PluginLoadError if it is not one.
        self.address: int = load_library(path, instance=instance)
        self.instance = instance
        self.path = path
        self.generation = _core.generation()  # the process (fork) it was loaded in
        self.api = ffi.cast("const PJRT_Api*", self.address)
        version = self.api.pjrt_api_version
        self.api_version: tuple[int, int] = (version.major_version, version.minor_version)
        if self.api_version[0] != lib.PJRT_API_MAJOR:
            raise PluginLoadError(
                f"{path} implements PJRT C API {self.version_text}, but pjrt_py was built "
                f"for major version {lib.PJRT_API_MAJOR}: the ABIs are incompatible"
            )
        size = self.api.struct_size
        self._supported = frozenset(n for n, end in _SLOT_END.items() if end <= size)
        self.invoke("PJRT_Plugin_Initialize")
        self._attributes: dict[str, Any] | None = None
        # The custom-call targets registered through pjrt_py with this plugin
        # instance: (FFI platform, name) -> handler address (callbacks.ffi).
        self.ffi_targets: dict[tuple[str, str], int] = {}

    @property
    def version_text(self) -> str:
        """The plugin's PJRT C API version as ``"major.minor"`` text."""
        return f"{self.api_version[0]}.{self.api_version[1]}"

    def supports(self, function: str) -> bool:
        """Whether the plugin's function table reaches ``function``'s slot.

        Parameters
        ----------
        function : str
            A PJRT C API function name, such as ``"PJRT_Client_Create"``.

        Returns
        -------
        bool
            True if the function is in the PJRT header pjrt_py was built with
            and the plugin's ``PJRT_Api`` (its ``struct_size``) is long enough to
            hold its slot.
        """
        return function in self._supported

    def require(self, function: str) -> None:
        """Raise ``UnsupportedError`` unless the plugin has ``function``.

        Parameters
        ----------
        function : str
            A PJRT C API function name, such as ``"PJRT_Client_Create"``.

        Raises
        ------
        UnsupportedError
            If ``function`` is not in the PJRT header pjrt_py was built with,
            or the plugin's function table does not reach its slot.
        """
        if function not in self._supported:
            if function not in _SLOT_END:
                raise UnsupportedError(
                    f"{function} is not in the PJRT header pjrt_py was built with "
                    f"({lib.PJRT_API_MAJOR}.{lib.PJRT_API_MINOR})"
                )
            raise UnsupportedError(
                f"{function} is not supported by this plugin (PJRT {self.version_text}, "
                f"{self.path})"
            )

    def call(self, function: str, args: Any) -> None:
        """The call boundary: check the slot, call, raise and free any error.

        Parameters
        ----------
        function : str
            The PJRT C API function to call, such as ``"PJRT_Client_Create"``.
        args : cffi cdata
            Its ``<function>_Args*`` struct, filled in; the function writes its
            outputs into it.

        Raises
        ------
        UnsupportedError
            If the plugin does not have ``function`` (see ``require``).
        PjrtError
            The subclass for the error's code, with the plugin's message, if
            the function returns a ``PJRT_Error`` (which is then destroyed).
        """
        self.require(function)
        error = getattr(self.api, function)(args)
        if error:
            raise _core.error_from_pjrt(self.address, address(error))

    def invoke(self, function: str, **fields: Any) -> Any:
        """Call ``function`` with an args struct built from ``fields``.

        Builds ``<function>_Args`` (zeroed, ``struct_size`` from the header),
        sets ``fields``, calls through ``call``, and returns the args struct
        with the function's outputs.

        Parameters
        ----------
        function : str
            The PJRT C API function to call, such as ``"PJRT_Client_Create"``.
        **fields
            Values for the fields of ``<function>_Args``, by field name; the
            others stay zero.

        Returns
        -------
        cffi cdata
            The ``<function>_Args*`` struct, with the function's outputs.

        Raises
        ------
        UnsupportedError
            If the plugin does not have ``function`` (see ``require``).
        PjrtError
            The subclass for the error's code, if the function returns an error.
        """
        args = ffi.new(f"{function}_Args*")
        args.struct_size = getattr(lib, f"{function}_Args_STRUCT_SIZE")
        for name, value in fields.items():
            setattr(args, name, value)
        self.call(function, args)
        return args

    @property
    def attributes(self) -> dict[str, Any]:
        """The plugin's attributes (``xla_version``, ``stablehlo_current_version``, ...)."""
        if self._attributes is None:
            if self.supports("PJRT_Plugin_Attributes"):
                args = self.invoke("PJRT_Plugin_Attributes")
                self._attributes = named_values(args.attributes, args.num_attributes)
            else:
                self._attributes = {}
        return self._attributes

    @property
    def platform(self) -> str:
        """The platform pjrt_py takes the plugin for: ``"cpu"``, ``"cuda"``, ... or ``"?"``.

        What ``plugins()`` lists for this file, else what the plugin shows of
        itself: a library that carries XLA's GPU custom-call extension is a
        GPU plugin, ROCm's if it names a ROCm version, else CUDA's (the two
        take the same create options). So a GPU plugin loaded from a path
        pjrt_py did not find gets the GPU memory policy and option checks.
        """
        name = plugin_info(self.path).name
        if name != "?" or "gpu_custom_call" not in self.extensions:
            return name
        return "rocm" if any("rocm" in key for key in self.attributes) else "cuda"

    @property
    def extensions(self) -> list[str]:
        """The PJRT extensions the plugin carries (``"ffi"``, ``"stream"``, ``"profiler"``, ...).

        Types this pjrt_py does not name are given as ``"type N"``.
        """
        types = _core.plugin_extensions(self.address)
        return [EXTENSION_NAMES.get(t, f"type {t}") for t in types]

    def __repr__(self) -> str:
        return f"<Plugin {self.path} PJRT {self.version_text}>"


# PJRT_Extension_Type values, in the header's order (pjrt_c_api.h). 0-15 are in
# every header from PJRT 0.81 on; 16-24 were read from the header at PJRT 0.108,
# where 24 is spelled AxlTransform (XlaTransform in later headers). Of the CPU
# builds, 0.106 and 0.115 carry 19 (its 40-byte struct is the shardings
# extension's: a base and two functions) and 0.115 carries 24 (the build holds
# XLA's transform pipeline, xla/service/xla_transform.cc).
EXTENSION_NAMES = dict(
    enumerate(
        (
            "gpu_custom_call",
            "profiler",
            "custom_partitioner",
            "stream",
            "layouts",
            "ffi",
            "memory_descriptions",
            "triton",
            "raw_buffer",
            "phase_compile",
            "example",
            "unknown",
            "cross_host_transfers",
            "executable_metadata",
            "callback",
            "host_allocator",
            "tpu_topology",
            "tpu_executable",
            "megascale",
            "shardings",
            "abi_version",
            "collectives",
            "multi_slice",
            "host_memory_allocator",
            "xla_transform",
        )
    )
)


def address(pointer: Any) -> int:
    """A cffi pointer as the integer the native core takes."""
    return int(ffi.cast("uintptr_t", pointer))


def named_values(values: Any, count: int) -> dict[str, Any]:
    """Decode an array of ``PJRT_NamedValue`` into a dict."""
    out: dict[str, Any] = {}
    for i in range(count):
        v = values[i]
        name = ffi.unpack(v.name, v.name_size).decode()
        if v.type == lib.PJRT_NamedValue_kString:
            out[name] = ffi.unpack(v.string_value, v.value_size).decode("utf-8", "replace")
        elif v.type == lib.PJRT_NamedValue_kInt64:
            out[name] = int(v.int64_value)
        elif v.type == lib.PJRT_NamedValue_kInt64List:
            out[name] = list(ffi.unpack(v.int64_array_value, v.value_size))
        elif v.type == lib.PJRT_NamedValue_kFloat:
            out[name] = float(v.float_value)
        elif v.type == lib.PJRT_NamedValue_kBool:
            out[name] = bool(v.bool_value)
    return out


def encode_named_values(options: dict[str, Any]) -> tuple[Any, list[Any]]:
    """Encode a dict as a ``PJRT_NamedValue[]``; returns it and the cdata to keep alive."""
    values = ffi.new("PJRT_NamedValue[]", len(options))
    keep: list[Any] = [values]
    for i, (name, value) in enumerate(options.items()):
        if not isinstance(name, str):
            raise TypeError(f"option names must be str, got {name!r}")
        v = values[i]
        v.struct_size = lib.PJRT_NamedValue_STRUCT_SIZE
        key = ffi.new("char[]", name.encode())
        keep.append(key)
        v.name, v.name_size = key, len(name.encode())
        if isinstance(value, bool):
            v.type, v.bool_value, v.value_size = lib.PJRT_NamedValue_kBool, value, 1
        elif isinstance(value, int):
            if not -(1 << 63) <= value < 1 << 63:
                raise ValueError(f"option {name!r}: {value} does not fit in int64")
            v.type, v.int64_value, v.value_size = lib.PJRT_NamedValue_kInt64, value, 1
        elif isinstance(value, float):
            v.type, v.float_value, v.value_size = lib.PJRT_NamedValue_kFloat, value, 1
        elif isinstance(value, str):
            text = value.encode()
            data = ffi.new("char[]", text)
            keep.append(data)
            v.type, v.string_value, v.value_size = lib.PJRT_NamedValue_kString, data, len(text)
        elif isinstance(value, (list, tuple)) and all(
            isinstance(x, int) and not isinstance(x, bool) and -(1 << 63) <= x < 1 << 63
            for x in value
        ):
            data = ffi.new("int64_t[]", list(value))
            keep.append(data)
            v.type, v.int64_array_value = lib.PJRT_NamedValue_kInt64List, data
            v.value_size = len(value)
        else:
            raise TypeError(
                f"option {name!r}: unsupported value {value!r} (use bool, int, float, str "
                f"or a list of ints)"
            )
    return values, keep


_LOADED: dict[str, Plugin] = {}
_LOAD_LOCK = threading.Lock()
# Called with each plugin newly loaded (tracing starts a device profiler on it).
LOAD_LISTENERS: list[Callable[[Plugin], None]] = []


def loaded_plugins() -> list[Plugin]:
    """The plugins this process has loaded (in this fork generation), in load order."""
    with _LOAD_LOCK:
        return [p for p in _LOADED.values() if p.generation == _core.generation()]


def _new_load_lock() -> None:
    global _LOAD_LOCK
    _LOAD_LOCK = threading.Lock()


_runtime.reset_in_child(_new_load_lock)


def load_plugin(spec: str | os.PathLike[str] | None = None) -> Plugin:
    """Load (once per process) and return the plugin named by ``spec``.

    In a child of ``os.fork()``, a plugin the parent had loaded is loaded
    again as a new instance, from a copy of the file that every such child
    shares (``pjrt_py.runtime.library``): the inherited one's worker threads
    are gone and its locks may be held for ever (measured: compiling in the
    child aborted, or hung, on all three CPU plugin builds).

    Parameters
    ----------
    spec : str or path, optional
        A path to a plugin library; a platform name (``"cpu"``, ``"cuda"``,
        ``"tpu"``, ``"rocm"``), which picks that platform's default build
        (see ``plugins``); or the PyPI distribution name of an installed
        plugin (``"xla-cpu-pjrt"``). With none, the ``PJRT_PLUGIN``
        environment variable (any of those), else ``"cpu"``.

    Returns
    -------
    Plugin
        The plugin, loaded and initialised: the same object for the same
        library on every call (in a forked child, a new instance once).

    Raises
    ------
    FileNotFoundError
        If ``spec`` names no installed plugin and no file.
    PluginLoadError
        If the library cannot be loaded, has no ``GetPjrtApi``, or implements
        another major version of the PJRT C API than pjrt_py was built for.
    PjrtError
        If the plugin fails to initialise (``PJRT_Plugin_Initialize``).
    """
    path = find_plugin(spec)
    with _LOAD_LOCK:
        plugin = _LOADED.get(path)
        if plugin is not None and plugin.generation == _core.generation():
            return plugin
        plugin = Plugin(path, instance=0 if plugin is None else plugin.instance + 1)
        _LOADED[path] = plugin
    for listener in list(LOAD_LISTENERS):
        listener(plugin)
    return plugin
