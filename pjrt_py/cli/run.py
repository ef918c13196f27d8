"""``pjrt-py run``: run a StableHLO/MLIR program (text or bytecode) on .npy inputs."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from typing import Any

import numpy as np


def command(args: argparse.Namespace) -> int:
    from .. import Client
    from ..programs.diagnostics import rename
    from ..runtime.discovery import find_plugin
    from ..runtime.dtypes import as_dtype_of
    from ..runtime.errors import ProgramError
    from ..tracing import trace

    program = _read_program(args.program)
    inputs = [_load_input(path) for path in args.input]  # before any compile
    # The resolver `pjrt-py test --plugin` uses too, so the two take the same names.
    client = Client(None if args.plugin is None else find_plugin(args.plugin, origin="--plugin"))
    with trace(args.trace) if args.trace else contextlib.nullcontext():
        try:  # a compiler crash is an error, not a death
            exe = client.compile(program, isolate=True)
        except ProgramError as e:  # its diagnostics, named after the file
            raise rename(e, "<stdin>" if args.program == "-" else args.program) from None
        if len(exe.devices) > 1:  # the Python API's execute_sharded takes one list per device
            print(
                f"error: the program runs on {len(exe.devices)} devices (its mhlo.num_replicas "
                "and mhlo.num_partitions); pjrt-py run runs one-device programs: from Python, "
                "call Executable.execute_sharded() with one argument list per device",
                file=sys.stderr,
            )
            return 2
        # bf16 / float8 .npy files hold raw bytes: the program says what they are.
        specs = exe.input_signature or []
        inputs = [
            as_dtype_of(a, specs[i].dtype if i < len(specs) else None) for i, a in enumerate(inputs)
        ]
        result = exe.execute(*inputs)
        outputs = [] if result is None else list(result) if isinstance(result, tuple) else [result]
        arrays = [b.to_numpy() for b in outputs]
    if args.output and len(args.output) != len(arrays):
        print(f"error: {len(arrays)} output(s) but {len(args.output)} -o path(s)", file=sys.stderr)
        return 2
    for i, array in enumerate(arrays):
        if args.output:
            with open(args.output[i], "wb") as f:  # np.save(name) would add ".npy"
                np.save(f, array)
            print(f"output {i}: {array.dtype}{list(array.shape)} -> {args.output[i]}")
        else:
            print(f"output {i}: {array.dtype}{list(array.shape)}")
            print(np.array2string(array, threshold=64))
    return 0


def _read_program(path: str) -> str | bytes:
    """The program in ``path`` (``-``: stdin): MLIR text, or MLIR bytecode as
    bytes. Refused with a ``ValueError`` naming it, before it is all read:
    a device or a folder (``/dev/zero`` would be read until memory ran out),
    and text with a NUL byte, which no MLIR text has, or that is not UTF-8."""
    from ..programs.mlir_text import is_bytecode

    name = "<stdin>" if path == "-" else path
    with contextlib.ExitStack() as stack:
        f = sys.stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
        mode = os.fstat(f.fileno()).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            raise ValueError(f"program {name!r} is not a file or a pipe")
        data = bytearray()
        while chunk := f.read(1 << 20):
            data += chunk
            if is_bytecode(data):
                continue
            if (at := chunk.find(0)) >= 0:
                offset = len(data) - len(chunk) + at
                raise ValueError(
                    f"program {name!r} is neither MLIR text (a NUL byte at offset "
                    f"{offset}) nor MLIR bytecode"
                )
    if is_bytecode(data):
        return bytes(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"program {name!r} is not UTF-8 MLIR text: {e}") from None


def _load_input(path: str) -> Any:
    """An -i file's array, in native byte order; errors name the file."""
    from ..conformance.cases import read_npy

    return read_npy(path, "input")
