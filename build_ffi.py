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

import importlib.util
import os
import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
DECL = HERE / "include" / "pjrt_py"
NATIVE = HERE / "native"

# Order matters: each cdef file may use the types of the ones before it.
CDEF_FILES = ["api.h", "client.h", "device.h", "buffer.h", "executable.h", "table.h", "slots.h"]


def find_header() -> Path:
    """Locate pjrt_c_api.h: $PJRT_PY_HEADER, else the CPU plugin wheel's copy."""
    override = os.environ.get("PJRT_PY_HEADER")
    if override:
        path = Path(override)
        if path.is_dir():
            path = path / "pjrt_c_api.h"
        if not path.is_file():
            raise FileNotFoundError(f"PJRT_PY_HEADER={override!r}: no pjrt_c_api.h there")
        return path
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "pjrt_c_api.h not found: install the 'xla-cpu-pjrt' wheel (a build "
            "requirement) or set PJRT_PY_HEADER to a pjrt_c_api.h"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "include" / "pjrt_c_api.h"
    if not path.is_file():
        raise FileNotFoundError(f"the xla-cpu-pjrt wheel has no {path}")
    return path


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
        "extra_compile_args": ["-O2", "-std=gnu11", "-Wall", "-Wno-unused-function"],
    }


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
