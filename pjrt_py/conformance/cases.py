"""Finding and loading test cases.

A case is one ``.mlir`` file. Its sibling ``.npy`` files, named
``<stem>.input<N>.npy`` and ``<stem>.expected<N>.npy`` (N from 0, no gaps),
are ``@main``'s arguments and the expected values of its first results.
Check calls in ``@main`` (``pjrt_py.conformance.checks``) are honoured
either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

SUFFIX = ".mlir"


def discover(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The ``.mlir`` files named or found (recursively, sorted) under ``paths``.

    Raises
    ------
    FileNotFoundError
        For a path that does not exist.
    """
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob(f"*{SUFFIX}") if p.is_file())
        elif path.is_file():
            files = [path]
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")
        for file in files:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                found.append(file)
    return found


def _numbered(path: Path, role: str) -> list[Path]:
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.stem
    files: list[Path] = []
    while (candidate := path.with_name(f"{stem}.{role}{len(files)}.npy")).exists():
        files.append(candidate)
    return files


@dataclass
class Case:
    """A loaded case: program text, arguments, expected leading results."""

    path: Path
    text: str
    inputs: list[npt.NDArray[Any]]
    expected: list[npt.NDArray[Any]]


def read_npy(path: str | os.PathLike[str], role: str = "input") -> npt.NDArray[Any]:
    """The array in a ``.npy`` file, in native byte order; errors name the
    file. Never unpickles. A file that is no .npy at all was reported by
    numpy as pickled data to allow, and a big-endian expected result as a
    mismatch of ``>f4`` against ``float32``."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise ValueError(f"{role} {name!r} is not a .npy file (no numpy header)")
            f.seek(0)
            array: npt.NDArray[Any] = np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"{role} {name!r} does not exist") from None
    except (ValueError, OSError) as e:
        if str(e).startswith(f"{role} {name!r}"):
            raise
        raise ValueError(f"{role} {name!r} cannot be read as a .npy array: {e}") from None
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def load(path: Path) -> Case:
    """Read a case's program and its sibling ``.npy`` files."""
    data = path.read_bytes()
    if b"\0" in data:
        raise ValueError(f"case {str(path)!r} is not MLIR text (a NUL byte at {data.index(0)})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"case {str(path)!r} is not UTF-8 MLIR text: {e}") from None
    inputs = [read_npy(p, "input") for p in _numbered(path, "input")]
    expected = [read_npy(p, "expected result") for p in _numbered(path, "expected")]
    return Case(path, text, inputs, expected)
