"""The module paths of pjrt_py 0.1, kept working for one release.

pjrt_py 0.1 kept every module in one folder (``pjrt_py.buffer``,
``pjrt_py.executable``, ...). The layers now have folders of their own
(docs/architecture.md). ``import pjrt_py.executable`` and
``from pjrt_py.dlpack import to_torch`` still work: they give the module's
new home and warn once with a ``DeprecationWarning`` naming it. Names the
package itself exports (``pjrt_py.Buffer``, ...) never moved.

A path whose module was split in two (``pjrt_py.kv``) gives a stand-in
module that looks each name up in the new homes, in order.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

# old path -> the new modules holding its names, first one first.
MOVED: dict[str, tuple[str, ...]] = {
    "arguments": ("programs.arguments",),
    "buffer": ("runtime.buffer",),
    "cache": ("programs.cache",),
    "client_options": ("runtime.client_options",),
    "compile_options": (
        "programs.compile_options",
        "programs.debug_options",
        "programs.placement",
    ),
    "compiled": ("programs.compiled",),
    "demo": ("cli.demo",),
    "device": ("runtime.device",),
    "dlpack": ("interop.dlpack", "interop.foreign", "interop.frameworks"),
    "dtypes": ("runtime.dtypes",),
    "dynamic": ("programs.dynamic",),
    "effects": ("programs.effects",),
    "errors": ("runtime.errors",),
    "executable": ("programs.executable",),
    "ffi": ("callbacks.ffi", "programs.diagnostics"),
    "gpu_memory": ("runtime.gpu_memory",),
    "host_callback": ("callbacks.host_callback",),
    "isolate": ("programs.isolate", "programs.compile_process"),
    "kv": ("runtime.kv_store", "distributed.stores"),
    "memory": ("runtime.device",),
    "mlir_text": ("programs.mlir_text", "programs.mlir_checks"),
    "plugin": ("runtime.plugin", "runtime.discovery"),
    "plugin_log": ("runtime.plugin_log",),
    "program": ("programs.signature",),
    "program_errors": ("programs.diagnostics",),
    "program_form": ("programs.form",),
    "promise": ("runtime.promise",),
    "serialization": ("programs.serialization",),
}
_PACKAGE = __name__.rpartition(".")[0]
_warned: set[str] = set()


def _warn(old: str, homes: tuple[str, ...]) -> None:
    if old in _warned:
        return
    _warned.add(old)
    where = " and ".join(f"{_PACKAGE}.{home}" for home in homes)
    warnings.warn(
        f"{_PACKAGE}.{old} moved to {where}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=4,
    )


def _stand_in(old: str, homes: tuple[str, ...]) -> types.ModuleType:
    """The module an old path gives: the new one itself if there is one."""
    modules = [importlib.import_module(f"{_PACKAGE}.{home}") for home in homes]
    if len(modules) == 1:
        return modules[0]
    module = types.ModuleType(f"{_PACKAGE}.{old}", f"Moved to {', '.join(homes)}.")

    def __getattr__(name: str) -> Any:
        for home in modules:
            if hasattr(home, name):
                return getattr(home, name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__all__ = [n for m in modules for n in getattr(m, "__all__", ())]  # type: ignore[attr-defined]
    return module


class _Loader(importlib.abc.Loader):
    def __init__(self, old: str) -> None:
        self.old = old

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        homes = MOVED[self.old]
        _warn(self.old, homes)
        return _stand_in(self.old, homes)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, old = fullname.rpartition(".")
        if package != _PACKAGE or old not in MOVED:
            return None
        parent = sys.modules.get(_PACKAGE)
        if parent is not None and not isinstance(parent, _Package):
            # Only now, when an old path is imported: a package of another
            # class from the start hides its classes from documentation
            # tools that inspect it (griffe, so the API reference).
            parent.__class__ = _Package
        return importlib.machinery.ModuleSpec(fullname, _Loader(old))


class _Package(types.ModuleType):
    """The package's module type: importing an old path must not replace a
    public name of the same spelling (``pjrt_py.buffer`` is a function, and
    was a module too): Python sets the parent's attribute after an import."""

    def __setattr__(self, name: str, value: Any) -> None:
        current = self.__dict__.get(name)
        if (
            name in MOVED
            and isinstance(value, types.ModuleType)
            and current is not None
            and not isinstance(current, types.ModuleType)
        ):
            return
        super().__setattr__(name, value)


def install(package: types.ModuleType) -> None:
    """Let the old paths import (once per process).

    The package's class becomes ``_Package`` when an old path is first
    imported (``_Finder``), not here.
    """
    del package
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def attribute(name: str) -> types.ModuleType:
    """``pjrt_py.<old>`` read as an attribute: the module, with the warning."""
    if name not in MOVED:
        raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
    return importlib.import_module(f"{_PACKAGE}.{name}")
