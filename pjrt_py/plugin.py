"""Finding and loading PJRT plugins.

A plugin is a shared library exporting ``GetPjrtApi``. It is loaded with
``dlopen`` once per process, initialised once, and never closed: clients,
buffers and callbacks running on the plugin's threads may outlive any Python
object that refers to it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from . import _core, _runtime
from ._ffi import ffi, lib
from .errors import PluginLoadError, UnsupportedError


@dataclass(frozen=True)
class Build:
    """A plugin build pjrt_py knows, with what was measured of it.

    ``defects`` lists wrong results found in that build by pjrt_py's tests
    (``tests/test_differential.py``, ``tests/test_plugin_builds.py``;
    ``docs/plugins.md`` gives the evidence): values unrelated to the right
    ones on ordinary inputs. They decide the default. ``edge_cases`` lists
    where it differs from ``jax.jit`` only at subnormals or poles, or by a few
    ulps; every CPU build has some, so they do not (``docs/plugin_defects.md``).
    """

    distribution: str  # the PyPI name
    platform: str
    package: str  # the import package that holds the library
    pattern: str  # glob for the library inside it
    api: tuple[int, int] | None  # the PJRT C API it implements, as measured
    defects: tuple[str, ...] = ()
    edge_cases: tuple[str, ...] = ()


_ATAN_F64_SUBNORMAL = "f64 atan flushes a subnormal input to 0"

# Every build pjrt_py can find installed, in the order a platform name picks
# them: builds with no known wrong result first, then the newest API. The
# order is written out (and checked by tests against the rule) rather than
# computed, so that it reads as the decision it is.
BUILDS: tuple[Build, ...] = (
    Build(
        "fastatomstruct-xla-cpu",
        "cpu",
        "fastatomstruct_xla_cpu",
        "libpjrt_cpu.so",
        (0, 106),
        (),
        (_ATAN_F64_SUBNORMAL,),
    ),
    Build(
        "lammps-jax-pjrt-cpu",
        "cpu",
        "lammps_jax_pjrt_cpu",
        "pjrt_c_api_cpu_plugin.so",
        (0, 115),
        (
            "atan of an array of 50 or more elements is wrong in every float dtype "
            "(f32: up to 3.6 off at 64 elements)",
        ),
        (
            "digamma is -inf where jax has NaN at 0 and subnormals",
            "a subnormal bf16 converts to bool False",
            "f64 log1p, atanh and normal rng differ by 8-90 ulps (the plugin is closer to libm)",
        ),
    ),
    Build(
        "xla-cpu-pjrt",
        "cpu",
        "xla_plugins.xla_cpu_pjrt",
        "xla_cpu_pjrt.so",
        (0, 81),
        (
            "a gather of a constant operand can come back with two result dimensions "
            "swapped (tests/data/known_wrong_gather.mlir)",
        ),
        (_ATAN_F64_SUBNORMAL, "cbrt of subnormals differs from jax (both are wrong)"),
    ),
    Build("jax-cuda13-pjrt", "cuda", "jax_plugins", "xla_cuda13/xla_cuda_plugin.so", None),
    Build("jax-cuda12-pjrt", "cuda", "jax_plugins", "xla_cuda12/xla_cuda_plugin.so", None),
    Build("libtpu", "tpu", "libtpu", "libtpu.so", None),
    Build("jax-rocm-pjrt", "rocm", "jax_plugins", "xla_rocm*/xla_rocm_plugin.so", None),
)
PLATFORMS = ("cpu", "cuda", "tpu", "rocm")

# Every PJRT_Api slot the build header declares -> the offset where it ends.
_SLOT_END: dict[str, int] = {
    ffi.string(lib.pjrt_py_slots[i].name).decode(): lib.pjrt_py_slots[i].end
    for i in range(lib.pjrt_py_num_slots)
}


@dataclass(frozen=True)
class PluginInfo:
    """A plugin found on this machine (nothing is loaded to find it).

    ``distribution`` is the PyPI distribution that installed it and
    ``version`` that distribution's version; ``api`` the PJRT C API version
    measured for that build, ``defects`` the wrong results known in it and
    ``edge_cases`` its differences at subnormals, poles or by ulps (see
    ``BUILDS``); ``default`` says whether its platform name picks it.

    Parameters
    ----------
    name : str
        The platform: ``"cpu"``, ``"cuda"``, ``"tpu"`` or ``"rocm"`` (``"?"``
        for a library no known build matches).
    path : str
        The plugin library's resolved path.
    distribution : str, optional
        The PyPI distribution that installed it.
    version : str, optional
        That distribution's installed version.
    api : tuple of (int, int), optional
        ``(major, minor)`` of the PJRT C API measured for the build; None if
        not measured.
    defects : tuple of str
        Wrong results known in the build.
    default : bool
        Whether the platform name picks this plugin.
    edge_cases : tuple of str
        Differences from ``jax.jit`` at subnormals, poles or by a few ulps.
    """

    name: str  # the platform: cpu, cuda, tpu, rocm
    path: str
    distribution: str | None = None
    version: str | None = None
    api: tuple[int, int] | None = None
    defects: tuple[str, ...] = ()
    default: bool = False
    edge_cases: tuple[str, ...] = ()


def _package_dirs(package: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def plugins() -> list[PluginInfo]:
    """The plugins installed as wheels; for each platform, the default first.

    Only the known builds (``BUILDS``) are looked for, in their import
    packages; nothing is loaded.

    Returns
    -------
    list of PluginInfo
        One entry per library found, in the order of ``BUILDS``; the first
        of each platform has ``default=True``.
    """
    found: list[PluginInfo] = []
    seen: set[str] = set()
    for build in BUILDS:
        for directory in _package_dirs(build.package):
            for so in sorted(directory.glob(build.pattern)):
                path = str(so.resolve())
                if path in seen:
                    continue
                seen.add(path)
                first = not any(i.name == build.platform for i in found)
                found.append(
                    PluginInfo(
                        build.platform,
                        path,
                        build.distribution,
                        _version(build.distribution),
                        build.api,
                        build.defects,
                        default=first,
                        edge_cases=build.edge_cases,
                    )
                )
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _from_distribution(name: str) -> str | None:
    """The library a distribution installed: a known build's, or its only ``.so``
    (of several, its only one named like a PJRT plugin, ``*pjrt*.so``)."""
    for info in plugins():
        if info.distribution is not None and _normal(info.distribution) == _normal(name):
            return info.path
    try:
        files = metadata.distribution(name).files or []
    except metadata.PackageNotFoundError:
        return None
    libraries = [f for f in files if f.name.endswith(".so")]
    if len(libraries) > 1:
        libraries = [f for f in libraries if "pjrt" in f.name.lower()]
    if len(libraries) != 1:
        return None
    return str(Path(str(libraries[0].locate())).resolve())


def find_plugin(spec: str | os.PathLike[str] | None = None, *, origin: str | None = None) -> str:
    """Resolve a plugin spec to a ``.so`` path.

    A spec is a path to a plugin library; a platform name (``"cpu"``,
    ``"cuda"``, ``"tpu"``, ``"rocm"``), which picks that platform's default
    build (the first of ``plugins``: no known wrong result first, then
    the newest PJRT API); or the PyPI distribution name of an installed
    plugin (``"xla-cpu-pjrt"``). With no spec, the ``PJRT_PLUGIN``
    environment variable (any of those), else ``"cpu"``. Every way of naming
    a plugin (``Client``, ``pjrt-py run --plugin``, ``pjrt-py test --plugin``)
    comes here.

    Parameters
    ----------
    spec : str or path, optional
        The plugin, as above.
    origin : str, optional
        Where ``spec`` came from (``"--plugin"``), for the error message;
        ``$PJRT_PLUGIN`` when it came from there.

    Raises
    ------
    FileNotFoundError
        If ``spec`` names no installed plugin and no file.
    """
    if spec is None and os.environ.get("PJRT_PLUGIN"):
        spec, origin = os.environ["PJRT_PLUGIN"], "$PJRT_PLUGIN"
    text = os.fspath("cpu" if spec is None else spec)
    named = f"{text!r}" if origin is None else f"{text!r} (from {origin})"
    if text in PLATFORMS:
        for info in plugins():
            if info.name == text:
                return info.path
        raise FileNotFoundError(
            f"PJRT plugin {named}: no {text} plugin is installed; found: "
            f"{[i.distribution for i in plugins()] or 'none'} (pass a path to a plugin .so, "
            f"a distribution name, or set PJRT_PLUGIN)"
        )
    path = Path(text).expanduser()
    if path.is_file():
        return str(path.resolve())
    if "/" not in text:
        found = _from_distribution(text)
        if found is not None:
            return found
    raise FileNotFoundError(
        f"PJRT plugin {named}: no such file or installed plugin distribution (expected a "
        f"path to a .so, one of {list(PLATFORMS)}, or a distribution such as "
        f"{[b.distribution for b in BUILDS if b.platform == 'cpu']})"
    )


def plugin_info(path: str) -> PluginInfo:
    """What ``plugins`` knows of the library at ``path`` (a bare entry if nothing)."""
    for info in plugins():
        if info.path == path:
            return info
    return PluginInfo("?", path)


class Plugin:
    """A loaded and initialised PJRT plugin. Get one with ``load_plugin``.

    Parameters
    ----------
    path : str
        The plugin's shared library, loaded with ``dlopen`` (never closed).
    fresh : bool
        Load a new instance of a library this process already loaded, in a
        link-map namespace of its own (glibc's ``dlmopen``): what
        ``load_plugin`` does in a child of ``os.fork()``.

    Attributes
    ----------
    path : str
        The shared library.
    api_version : tuple[int, int]
        ``(major, minor)`` of the PJRT C API the plugin was built with.

    Raises
    ------
    PluginLoadError
        If the library cannot be loaded, has no ``GetPjrtApi``, or implements
        another major version of the PJRT C API than pjrt_py was built for.
    PjrtError
        If the plugin fails to initialise (``PJRT_Plugin_Initialize``).
    """

    def __init__(self, path: str, *, fresh: bool = False) -> None:
        # PluginLoadError if it is not one. fresh: a new instance of a library
        # this process already loaded (see load_plugin).
        self.address: int = _core.load_plugin(path, fresh)
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
    def extensions(self) -> list[str]:
        """The PJRT extensions the plugin carries (``"ffi"``, ``"stream"``, ``"profiler"``, ...).

        Types this pjrt_py does not name are given as ``"type N"``.
        """
        types = _core.plugin_extensions(self.address)
        return [EXTENSION_NAMES.get(t, f"type {t}") for t in types]

    def __repr__(self) -> str:
        return f"<Plugin {self.path} PJRT {self.version_text}>"


# PJRT_Extension_Type values, in the header's order.
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


def _new_load_lock() -> None:
    global _LOAD_LOCK
    _LOAD_LOCK = threading.Lock()


_runtime.reset_in_child(_new_load_lock)


def load_plugin(spec: str | os.PathLike[str] | None = None) -> Plugin:
    """Load (once per process) and return the plugin named by ``spec``.

    In a child of ``os.fork()``, a plugin the parent had loaded is loaded
    again as a new instance (glibc's ``dlmopen``, a link-map namespace of its
    own): the inherited one's worker threads are gone and its locks may be
    held for ever (measured: compiling in the child aborted, or hung, on all
    three CPU plugin builds). The file is not copied. glibc allows 16
    namespaces, so about 15 generations of forks that each load it.

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
        if plugin is None or plugin.generation != _core.generation():
            plugin = Plugin(path, fresh=plugin is not None)
            _LOADED[path] = plugin
        return plugin
