"""Regenerate ``pjrt_py/programs/jax_options.py`` from the installed jaxlib.

    python tools/gen_jax_options.py

It records what ``jax.jit`` sends to XLA with every compile (the
``DebugOptions`` inside ``ExecutableBuildOptionsProto`` and the build fields
jax sets), and the field number of each debug option that jaxlib's Python
``DebugOptions`` exposes by name, found by changing one at a time and seeing
which field of the encoding changes. pjrt_py has no jax dependency at run
time, so the bytes are data in the package; ``tests/test_compile_options.py``
checks them against the installed jaxlib.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import jaxlib
from jax._src import compiler
from jax._src.lib import xla_client as xc

from pjrt_py.programs.proto import fields

OUT = Path(__file__).resolve().parents[1] / "pjrt_py" / "programs" / "jax_options.py"


def _split(data: bytes) -> tuple[bytes, list[tuple[int, Any]], list[tuple[int, Any]]]:
    """(debug options bytes, other build fields, other top-level fields)."""
    debug, build, top = b"", [], []
    for number, value in fields(data):
        if number != 3:
            top.append((number, value))
            continue
        assert isinstance(value, bytes)
        for inner, item in fields(value):
            if inner == 3:
                assert isinstance(item, bytes)
                debug = item
            else:
                build.append((inner, item))
    return debug, build, top


def _named_fields() -> dict[str, tuple[int, str]]:
    base = dict(fields(_split(xc.CompileOptions().SerializeAsString())[0]))
    names: dict[str, tuple[int, str]] = {}
    probe = xc.CompileOptions().executable_build_options.debug_options
    for name in sorted(n for n in dir(probe) if n.startswith("xla_")):
        options = xc.CompileOptions()
        debug = options.executable_build_options.debug_options
        value = getattr(debug, name)
        if isinstance(value, bool):
            kind, changed = "bool", not value
        elif isinstance(value, int):
            kind, changed = "int", value + 7
        elif isinstance(value, str):
            kind, changed = "str", value + "~"
        else:
            continue  # enums: pass them by field number
        setattr(debug, name, changed)
        after = dict(fields(_split(options.SerializeAsString())[0]))
        diff = [k for k in set(after) | set(base) if after.get(k) != base.get(k)]
        if len(diff) == 1:
            names[name] = (diff[0], kind)
    return names


def main() -> None:
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    debug, build, top = _split(options.SerializeAsString())
    names = _named_fields()
    rows = "\n".join(f"    {name!r}: ({num}, {kind!r})," for name, (num, kind) in names.items())
    hex_lines = textwrap.wrap(debug.hex(), 88)
    debug_text = "\n".join(f'    "{line}"' for line in hex_lines)
    own = {4, 5, 6, 9, 19}  # counts, SPMD, placement, Shardy: encoded by pjrt_py
    build_ints = {n: v for n, v in build if isinstance(v, int) and n not in own}
    build_bytes = {n: v for n, v in build if isinstance(v, bytes)}
    top_ints = {n: v for n, v in top if isinstance(v, int)}
    OUT.write_text(  # formatted by `ruff format` afterwards
        f'''"""What jax {jaxlib.__version__} sends to XLA with every compile (generated).

Written by ``tools/gen_jax_options.py`` from jaxlib {jaxlib.__version__}; do not edit.
The numbers are field numbers of xla.DebugOptions, ExecutableBuildOptionsProto
and CompileOptionsProto; ``tests/test_compile_options.py`` checks them against
the installed jaxlib.
"""

JAXLIB_VERSION = {jaxlib.__version__!r}

# The xla.DebugOptions message jax sends (the defaults of XLA's flags, with
# xla_cpu_enable_fast_min_max = false among them), encoded.
DEBUG_OPTIONS = bytes.fromhex(
{debug_text}
)

# ExecutableBuildOptionsProto fields jax sets besides the debug options and the
# counts, placement and partitioner flags pjrt_py encodes itself.
BUILD_INT_FIELDS = {build_ints!r}
BUILD_BYTES_FIELDS = {build_bytes!r}
# CompileOptionsProto fields (5: profile_version = -1, "do not look one up").
TOP_INT_FIELDS = {top_ints!r}

# Debug options by name -> (field number, kind), for Client.compile(debug_options=...).
DEBUG_OPTION_FIELDS = {{
{rows}
    "xla_cpu_enable_fast_min_max": (140, "bool"),
}}
'''
    )


if __name__ == "__main__":
    main()
