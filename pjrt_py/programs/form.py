"""The form a program reaches the plugin in: portable bytecode where possible.

jaxlib's own client never hands a plugin StableHLO text. It serializes the
module as a portable artifact (versioned StableHLO bytecode, VHLO) for the
StableHLO version the plugin reports (its ``stablehlo_current_version``
attribute), and on the way expands CHLO ops (``chlo.digamma``, ``chlo.erf_inv``,
...) into StableHLO with its own decompositions. Text sent as is gets the
plugin's parser and the plugin's CHLO expansion instead, and those differ
from build to build (measured: ``xla-cpu-pjrt``'s parser cannot read an ``i1``
hex constant, and ``lammps-jax-pjrt-cpu`` expands digamma at +-0 to -inf
where jaxlib's expansion gives NaN).

So pjrt_py sends what jaxlib sends, where jaxlib is installed:

- **Portable bytecode** (``"bytecode"``): the text serialized by jaxlib's
  ``serialize_portable_artifact`` for the older of the plugin's StableHLO
  version and jaxlib's own. Used when jaxlib is importable and the plugin
  reports its version.
- **Text** (``"text"``): the fallback, and what a program jaxlib cannot
  serialize (it does not parse, say) is sent as, so the plugin's own error
  message reaches the caller. ``PJRT_PY_PROGRAM_FORM=text`` forces it.

Programs given as bytecode are sent as they are. ``pjrt-py info`` says which
form each plugin gets (``describe``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from typing import TYPE_CHECKING, Any

from .joined import run_joined

if TYPE_CHECKING:
    from ..runtime.plugin import Plugin

ENV = "PJRT_PY_PROGRAM_FORM"

_jaxlib: list[Any] = []  # [(serialize, jaxlib's StableHLO version)] or [None], once
_release: list[str | None] = []  # [a hash of jaxlib's version.py] or [None], once


def _serializer() -> tuple[Any, tuple[int, ...]] | None:
    if not _jaxlib:
        found = None
        try:
            from jaxlib import _jax
            from jaxlib.mlir.dialects import stablehlo

            version = tuple(int(v) for v in str(stablehlo.get_current_version()).split("."))
            found = (_jax.mlir.serialize_portable_artifact, version)
        except (ImportError, AttributeError, ValueError):
            pass
        _jaxlib.append(found)
    result: tuple[Any, tuple[int, ...]] | None = _jaxlib[0]
    return result


def _jaxlib_release() -> str | None:
    """Which jaxlib is installed, read from its ``version.py`` without
    importing it: a disk-cache hit in a fresh process would otherwise pay
    for jaxlib's import (measured: 6 ms hits became 40 ms)."""
    if not _release:
        text = None
        try:
            spec = importlib.util.find_spec("jaxlib")
            if spec is not None and spec.submodule_search_locations:
                path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
                with open(path, "rb") as f:
                    text = hashlib.sha256(f.read()).hexdigest()[:16]
        except (ImportError, OSError, ValueError):
            pass
        _release.append(text)
    return _release[0]


def target_version(plugin: Plugin) -> str | None:
    """The StableHLO version to serialize for ``plugin`` (``"1.13.3"``), or None
    if programs go to it as text (see ``describe``)."""
    if os.environ.get(ENV, "").lower() == "text":
        return None
    serializer = _serializer()
    reported = plugin.attributes.get("stablehlo_current_version")
    if serializer is None or not isinstance(reported, (list, tuple)) or len(reported) != 3:
        return None
    version = min(tuple(int(v) for v in reported), serializer[1])
    return ".".join(map(str, version))


def identity(plugin: Plugin) -> str:
    """What decides the bytes a text program reaches ``plugin`` as, for cache
    keys: ``"text"``, or the plugin's StableHLO version and the jaxlib whose
    serializer and CHLO expansions make the bytecode. Two forms of one
    program can compute different numbers (digamma at +-0 on
    ``lammps-jax-pjrt-cpu``), so a program compiled in one form must not be
    found by the other. Read without importing jaxlib (a jaxlib that is
    installed but fails to import has text sent under this identity until
    the import has failed, then under "text": both hold text programs)."""
    if os.environ.get(ENV, "").lower() == "text":
        return "text"
    reported = plugin.attributes.get("stablehlo_current_version")
    release = _jaxlib_release() if _jaxlib != [None] else None
    if release is None or not isinstance(reported, (list, tuple)) or len(reported) != 3:
        return "text"
    return f"bytecode for {'.'.join(map(str, reported))} by jaxlib {release}"


def for_plugin(plugin: Plugin, text: str) -> bytes | None:
    """``text`` as portable bytecode for ``plugin``; None to send the text itself."""
    version = target_version(plugin)
    if version is None:
        return None
    serialize = _serializer()
    assert serialize is not None
    try:
        data = run_joined(serialize[0], text, version)  # jaxlib's C++: see joined
    except Exception:  # jaxlib cannot read it: the plugin says why, from the text
        return None
    return bytes(data)


def describe(plugin: Plugin) -> str:
    """One line for ``pjrt-py info``: the form programs reach ``plugin`` in, and why."""
    if os.environ.get(ENV, "").lower() == "text":
        return f"text (${ENV}=text)"
    if _serializer() is None:
        return "text (jaxlib, which writes portable bytecode, is not installed)"
    version = target_version(plugin)
    if version is None:
        return "text (the plugin reports no StableHLO version)"
    return f"portable bytecode, StableHLO {version} (CHLO expanded by jaxlib)"
