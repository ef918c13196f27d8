"""``pjrt-py run``: run a StableHLO/MLIR text program on .npy inputs."""

from __future__ import annotations

import argparse
import contextlib
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

    if args.program == "-":
        program = sys.stdin.read()
    else:
        with open(args.program) as f:
            program = f.read()
    inputs = [_load_input(path) for path in args.input]  # before any compile
    # The resolver `pjrt-py test --plugin` uses too, so the two take the same names.
    client = Client(None if args.plugin is None else find_plugin(args.plugin, origin="--plugin"))
    with trace(args.trace) if args.trace else contextlib.nullcontext():
        try:  # a compiler crash is an error, not a death
            exe = client.compile(program, isolate=True)
        except ProgramError as e:  # its diagnostics, named after the file
            raise rename(e, "<stdin>" if args.program == "-" else args.program) from None
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


def _load_input(path: str) -> Any:
    """An -i file's array; errors name the file."""
    try:
        with open(path, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise ValueError(f"input {path!r} is not a .npy file (no numpy header)")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"input {path!r} does not exist") from None
    except (ValueError, OSError) as e:
        if str(e).startswith(f"input {path!r}"):
            raise
        raise ValueError(f"input {path!r} cannot be read as a .npy array: {e}") from None
