"""Reading a StableHLO/MLIR text program's ``@main`` signature.

Used to check argument counts (and later shapes) in Python, before anything
reaches the plugin. Bytecode programs have no readable signature; for those
the plugin's own checks apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import MLIR_NAMES

_MAIN = re.compile(r"func\.func\s+(?:public\s+|private\s+)?@main\s*\(")
_ARG_INFO = re.compile(r'jax\.arg_info\s*=\s*"([^"]*)"')
_OPEN, _CLOSE = "([{<", ")]}>"


@dataclass(frozen=True)
class ArgSpec:
    """One parameter of ``@main``: its name, shape (None dims are dynamic) and dtype."""

    name: str
    shape: tuple[int | None, ...] | None  # None: not a tensor (e.g. a token)
    dtype: np.dtype[Any] | None

    def __str__(self) -> str:
        if self.shape is None or self.dtype is None:
            return "<non-tensor>"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


def _split_top_level(text: str, start: int) -> tuple[list[str], int]:
    """Split the parenthesised list opening at text[start] on top-level commas."""
    depth, i, parts, begin = 0, start, [], start + 1
    in_string = False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "-" and text.startswith("->", i):
            i += 1  # an arrow inside a type is not a closing '>'
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                parts.append(text[begin:i])
                return [p.strip() for p in parts if p.strip()], i
        elif c == "," and depth == 1:
            parts.append(text[begin:i])
            begin = i + 1
        i += 1
    raise ValueError("unbalanced brackets in @main's signature")


def _tensor(type_text: str) -> tuple[tuple[int | None, ...] | None, np.dtype[Any] | None]:
    m = re.match(r"tensor<(.*)>$", type_text.strip())
    if not m:
        return None, None
    body = m.group(1)
    body = re.sub(r",\s*#.*$", "", body)  # drop an encoding such as #stablehlo.bounds
    if body.startswith("complex<") or "x" not in body.replace("complex<", ""):
        dims_text, elem = "", body
    else:
        # dims are leading "NNx" / "?x" groups; the rest is the element type
        dm = re.match(r"((?:(?:\d+|\?)x)*)(.*)$", body)
        assert dm is not None
        dims_text, elem = dm.group(1), dm.group(2)
    dims = tuple(None if d == "?" else int(d) for d in dims_text.split("x") if d)
    return dims, MLIR_NAMES.get(elem.strip())


def main_signature(program: str) -> list[ArgSpec] | None:
    """The parameters of ``@main`` in a text program, or None if not found."""
    m = _MAIN.search(program)
    if m is None:
        return None
    try:
        parts, _ = _split_top_level(program, m.end() - 1)
    except ValueError:
        return None
    specs = []
    for index, part in enumerate(parts):
        name_type = re.match(r"(%[\w.$-]+)\s*:\s*", part)
        if name_type is None:
            return None
        rest = part[name_type.end() :]
        attrs_at = rest.find("{")
        type_text = rest if attrs_at < 0 else rest[:attrs_at]
        info = _ARG_INFO.search(rest)
        name = info.group(1) if info else name_type.group(1)
        shape, dtype = _tensor(type_text.strip())
        specs.append(ArgSpec(name or f"arg{index}", shape, dtype))
    return specs
