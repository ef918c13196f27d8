"""The run paths a shared library names for its dependencies.

A plugin can find the libraries it loads through ``DT_RPATH`` or
``DT_RUNPATH`` entries relative to its own directory (``$ORIGIN``): the CUDA
plugin ``jax-cuda13-pjrt`` names ``$ORIGIN/../../nvidia/cu13/lib`` and 15
more, and loads the CUDA libraries from them when a client is made, not
when the plugin is loaded. A copy of such a plugin (``library``) must keep
those paths working, so it needs to know them.

Read from the file itself (the dynamic segment and its string table), for
64-bit little-endian ELF, the format of every plugin build there is; for
anything else the answer is "none".
"""

from __future__ import annotations

import struct
from typing import BinaryIO

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 5, 15, 29
_ORIGINS = ("$ORIGIN", "${ORIGIN}")


def run_paths(path: str) -> list[str]:
    """The directories of the library's ``DT_RUNPATH`` (or, without one, its
    ``DT_RPATH``), as written, ``$ORIGIN`` unexpanded; [] if it names none,
    or is not a 64-bit little-endian ELF file, or cannot be read."""
    try:
        with open(path, "rb") as f:
            return _read(f)
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return []


def origin_relative(path: str) -> list[str]:
    """The run paths that start at the library's own directory, as paths
    relative to it (``"$ORIGIN/../lib"`` -> ``"../lib"``, ``"$ORIGIN"`` -> ``""``)."""
    relative = []
    for entry in run_paths(path):
        for origin in _ORIGINS:
            if entry == origin or entry.startswith(origin + "/"):
                relative.append(entry[len(origin) :].lstrip("/"))
                break
    return relative


def _read(f: BinaryIO) -> list[str]:
    ident = f.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return []
    phoff, phentsize, phnum = (
        struct.unpack_from("<Q", ident, 32)[0],
        *struct.unpack_from("<HH", ident, 54),
    )
    if phentsize < 56 or phnum > 4096:
        return []
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    loads, dynamic = [], None
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if kind == _PT_LOAD:
            loads.append((vaddr, filesz, offset))
        elif kind == _PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None or dynamic[1] > 1 << 20:
        return []
    f.seek(dynamic[0])
    raw = f.read(dynamic[1])
    strtab, rpath, runpath = None, None, None
    for tag, value in struct.iter_unpack("<qQ", raw[: len(raw) - len(raw) % 16]):
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_RPATH:
            rpath = value
        elif tag == _DT_RUNPATH:
            runpath = value
    chosen = runpath if runpath is not None else rpath
    if strtab is None or chosen is None:
        return []
    # The string table is named by its address once loaded: find it in the file.
    base = next((off + strtab - va for va, size, off in loads if va <= strtab < va + size), None)
    if base is None:
        return []
    f.seek(base + chosen)
    text = f.read(4096).split(b"\0", 1)[0].decode()
    return [entry for entry in text.split(":") if entry]


__all__ = ["origin_relative", "run_paths"]
