"""Build definitions for pjrt_py's two extension modules.

* ``pjrt_py._pjrt_cffi`` (cffi, API mode, out-of-line): the PJRT structs and
  function table, for the broad API (plugin queries, compile, executables).
* ``pjrt_py._core`` (CPython, ``native/``): buffers, promises, dispatch and
  every lifetime; all of pjrt_py's C lives there, once.

Both compile against the same PJRT header, which is not part of this
repository: it is taken from the installed ``xla-cpu-pjrt`` wheel (a build
requirement), or from the file or directory named by ``PJRT_PY_HEADER``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
DECL = HERE / "include" / "pjrt_py"
NATIVE = HERE / "native"

# Order matters: each cdef file may use the types of the ones before it.
CDEF_FILES = [
    "api.h",
    "client.h",
    "device.h",
    "memory.h",
    "buffer.h",
    "executable.h",
    "table.h",
    "slots.h",
]


# Where installed wheels keep a pjrt_c_api.h, relative to a sys.path entry.
HEADER_GLOBS = [
    "*/include/pjrt_c_api.h",  # xla-cpu-pjrt: xla_plugins/xla_cpu_pjrt/include
    "*/*/include/pjrt_c_api.h",
    "*/include/xla/pjrt/c/pjrt_c_api.h",  # wheels shipping XLA's include tree
]


def header_version(path: Path) -> tuple[int, int]:
    """``(PJRT_API_MAJOR, PJRT_API_MINOR)`` of a pjrt_c_api.h."""
    text = path.read_text(errors="replace")
    found = [re.search(rf"#define\s+PJRT_API_{part}\s+(\d+)", text) for part in ("MAJOR", "MINOR")]
    if found[0] is None or found[1] is None:
        raise ValueError(f"{path} does not define PJRT_API_MAJOR / PJRT_API_MINOR")
    return int(found[0].group(1)), int(found[1].group(1))


def installed_headers() -> list[Path]:
    """Every pjrt_c_api.h an installed wheel carries."""
    found: dict[Path, None] = {}
    for entry in sys.path:
        root = Path(entry or ".")
        if not root.is_dir():
            continue
        for pattern in HEADER_GLOBS:
            for path in sorted(root.glob(pattern)):
                found[path.resolve()] = None
    return list(found)


def find_header() -> Path:
    """Locate pjrt_c_api.h: $PJRT_PY_HEADER, else the newest an installed wheel has.

    Building against the newest header lets pjrt_py reach every slot a newer
    plugin has; older plugins keep working, since each call checks that the
    plugin's function table reaches its slot. In a build-isolated install the
    build requirement ``xla-cpu-pjrt`` (PJRT 0.81) is the only wheel with a
    header on PyPI that we know of; set PJRT_PY_HEADER for a newer one.
    """
    override = os.environ.get("PJRT_PY_HEADER")
    if override:
        path = Path(override)
        if path.is_dir():
            path = path / "pjrt_c_api.h"
        if not path.is_file():
            raise FileNotFoundError(f"PJRT_PY_HEADER={override!r}: no pjrt_c_api.h there")
        return path
    versions = {}
    for path in installed_headers():
        try:
            versions[path] = header_version(path)
        except ValueError:
            continue
    if not versions:
        raise FileNotFoundError(
            "pjrt_c_api.h not found: install the 'xla-cpu-pjrt' wheel (a build "
            "requirement) or set PJRT_PY_HEADER to a pjrt_c_api.h"
        )
    return max(versions, key=lambda p: versions[p])


def slot_table(header: Path) -> str:
    """C source for pjrt_py_slots: every PJRT_Api slot the header declares."""
    names = re.findall(r"_PJRT_API_STRUCT_FIELD\((PJRT_\w+)\)", header.read_text())
    rows = "\n".join(
        f'  {{"{n}", offsetof(PJRT_Api, {n}) + sizeof(((PJRT_Api*)0)->{n})}},' for n in names
    )
    return (
        "const pjrt_py_slot pjrt_py_slots[] = {\n"
        f"{rows}\n}};\n"
        f"const size_t pjrt_py_num_slots = {len(names)};\n"
    )


def make_builder() -> FFI:
    header = find_header()
    ffi = FFI()
    ffi.cdef("\n".join((DECL / name).read_text() for name in CDEF_FILES))
    source = "\n".join(
        [
            "#include <stddef.h>",
            "#include <stdbool.h>",
            "#include <stdint.h>",
            '#include "pjrt_c_api.h"',
            "typedef struct { const char* name; size_t end; } pjrt_py_slot;",
            slot_table(header),
        ]
    )
    ffi.set_source(
        "pjrt_py._pjrt_cffi",
        source,
        include_dirs=[str(header.parent)],
        extra_compile_args=["-O2", "-std=gnu11"],
    )
    return ffi


# The native core is built for CPython's stable ABI (the limited API of 3.10):
# one binary for every CPython from 3.10, like the cffi module. Measured in one
# session, the same source built both ways: dispatch 1.298/1.304 (stable ABI)
# against 1.306/1.310 (version-specific) times the C loop; buffer_async
# 1.27/1.28 against 1.26/1.26 and to_numpy 2.11/2.11 against 2.09/2.09 times
# their C floors: within the run-to-run spread of either build.
LIMITED_API = "0x030A0000"


def core_extension() -> dict[str, object]:
    """Keyword arguments for setuptools.Extension("pjrt_py._core", ...)."""
    import numpy

    header = find_header()
    return {
        "sources": [str((NATIVE / "core.c").relative_to(HERE))],
        "depends": [str(p.relative_to(HERE)) for p in sorted(NATIVE.glob("*.[ch]"))],
        "include_dirs": [str(header.parent), numpy.get_include(), str(NATIVE)],
        "libraries": ["dl", "pthread"],
        "define_macros": [("Py_LIMITED_API", LIMITED_API)],
        "py_limited_api": True,
        "extra_compile_args": [
            "-O2",
            "-std=gnu11",
            "-Wall",
            "-Wno-unused-function",
            "-Werror=implicit-function-declaration",
        ],
    }


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
