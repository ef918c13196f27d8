"""Program signatures: reading ``@main`` of a text program, and checking calls.

An executable's signature is used to check every call's arguments in Python,
before anything reaches the plugin (which would otherwise reinterpret a
same-sized buffer of another dtype without a word). Names come from the text
(``jax.arg_info`` or ``%name``); bytecode programs get shapes from the compiled
module instead (see ``_hlo_proto``) and are named by position.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .dtypes import MLIR_NAMES

if TYPE_CHECKING:
    from ._hlo_proto import Shape

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
        if self.dtype is None:
            return "<non-tensor>"
        return type_text(self.shape, self.dtype)

    @property
    def is_static(self) -> bool:
        """A tensor of known dtype and fixed shape: checked by one comparison."""
        return self.dtype is not None and self.shape is not None and None not in self.shape

    def accepts(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> bool:
        """Whether an argument of ``shape`` and ``dtype`` fits this parameter."""
        if self.dtype is None:
            return True  # a token or tuple: nothing pjrt_py can check
        if dtype != self.dtype:
            return False
        if self.shape is None:
            return True  # only the dtype is known (a dynamic parameter)
        return len(shape) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, shape, strict=False)
        )


def type_text(shape: Sequence[int | None] | None, dtype: np.dtype[Any]) -> str:
    """``float32[2,3]``: the spelling used in argument errors."""
    if shape is None:
        return f"{dtype}[...]"
    dims = ",".join("?" if d is None else str(d) for d in shape)
    return f"{dtype}[{dims}]"


def signature_from_shapes(
    text: list[ArgSpec] | None, parameters: Sequence[Shape]
) -> list[ArgSpec] | None:
    """Merge a text signature (names) with a compiled module's parameter shapes.

    Names come from the text. A fixed shape comes from the module (for a
    partitioned program that is the per-device shape); a dynamic one, from
    the text where it has one. The module is the whole answer without text.
    """
    if text is not None and len(text) != len(parameters):
        return text  # cannot be matched up; keep what the text says
    merged = []
    for index, param in enumerate(parameters):
        spec = text[index] if text is not None else ArgSpec("", None, None)
        if param.dtype is not None and not param.is_tuple and not param.dynamic:
            # The compiled shape is what a call passes: after SPMD partitioning
            # it is one device's share, not the text's global shape.
            spec = ArgSpec(spec.name, param.dims, param.dtype)
        elif spec.dtype is None and param.dtype is not None and not param.is_tuple:
            spec = ArgSpec(spec.name, None, param.dtype)
        merged.append(spec)
    return merged


def mismatch_message(
    program: str, signature: Sequence[ArgSpec], metas: Sequence[Any]
) -> str | None:
    """The TypeError text for arguments that do not fit ``signature``, or None.

    ``metas`` holds one ``(shape, dtype)`` per argument.
    """
    lines = []
    for index, (spec, meta) in enumerate(zip(signature, metas, strict=False)):
        if meta is None or spec.accepts(*meta):
            continue
        label = repr(spec.name) if spec.name else str(index)
        lines.append(f"Argument {label} compiled with {spec} and called with {type_text(*meta)}")
    if not lines:
        return None
    return (
        f"{program}: the arguments differ from the types this program was compiled for:\n  "
        + "\n  ".join(lines)
    )


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
        name = info.group(1) if info else name_type.group(1).lstrip("%")
        shape, dtype = _tensor(type_text.strip())
        specs.append(ArgSpec(name or f"arg{index}", shape, dtype))
    return specs
