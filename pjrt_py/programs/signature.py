"""Program signatures: reading ``@main`` of a text program, and checking calls.

An executable's signature is used to check every call's arguments in Python,
before anything reaches the plugin (which would otherwise reinterpret a
same-sized buffer of another dtype without a word). Names come from the text
(``jax.arg_info`` or ``%name``, read by ``.mlir_text``); bytecode programs
get shapes from the compiled module instead (see ``_hlo_proto``) and are named
by position.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .proto import Shape


@dataclass(frozen=True)
class ArgSpec:
    """One parameter of ``@main``: its name, shape (None dims are dynamic) and
    dtype, the ``mhlo.layout_mode`` it asks for, if any (``"{0,1}"``,
    ``"auto"``; None or ``"default"``: the platform's default layout), and
    the ``mhlo.memory_kind`` it is read from, if any (jax's host offloading:
    ``"pinned_host"``; None: the device's default memory).

    Parameters
    ----------
    name : str
        The parameter's name in the text (``jax.arg_info`` or ``%name``);
        empty where the program gives none (a bytecode program's parameters
        are named by position).
    shape : tuple of (int or None), or None
        The dimensions, None for a dynamic one. None where the shape is not
        known: a dynamic parameter of known dtype, or not a tensor.
    dtype : numpy.dtype or None
        The element type; None where it is not a tensor (e.g. a token).
    layout : str, optional
        The ``mhlo.layout_mode`` attribute's value; None (default) where the
        text sets none.
    memory_kind : str, optional
        The ``mhlo.memory_kind`` attribute's value; None (default) where the
        text sets none.
    """

    name: str
    shape: tuple[int | None, ...] | None  # None: not a tensor (e.g. a token)
    dtype: np.dtype[Any] | None
    layout: str | None = None
    memory_kind: str | None = None

    @property
    def default_layout(self) -> bool:
        """Whether ``layout`` asks for the platform's default (None or ``"default"``)."""
        return self.layout in (None, "default")

    def minor_to_major(self) -> tuple[int, ...] | None:
        """The layout this parameter is read in, where the text says it:
        row-major for the default, the given order for ``"{1,0}"``; None for
        ``"auto"`` (the compiler chose) or an unknown rank.

        Returns
        -------
        tuple of int or None
            The dimensions from minor to major: ``(rank - 1, ..., 0)`` for the
            default layout, the order the layout lists otherwise. None where
            the shape is unknown, or the layout is not a ``{...}`` list of every
            dimension once (``"auto"`` included).
        """
        if self.shape is None:
            return None
        if self.default_layout:
            return tuple(range(len(self.shape) - 1, -1, -1))
        m = re.fullmatch(r"\{\s*(\d+(?:\s*,\s*\d+)*)?\s*\}", self.layout or "")
        if m is None:
            return None
        order = tuple(int(v) for v in re.findall(r"\d+", m.group(1) or ""))
        return order if sorted(order) == list(range(len(self.shape))) else None

    def __str__(self) -> str:
        if self.dtype is None:
            return "<non-tensor>"
        return type_text(self.shape, self.dtype)

    @property
    def is_static(self) -> bool:
        """A tensor of known dtype and fixed shape: checked by one comparison."""
        return self.dtype is not None and self.shape is not None and None not in self.shape

    def accepts(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> bool:
        """Whether an argument of ``shape`` and ``dtype`` fits this parameter.

        Parameters
        ----------
        shape : tuple of int
            The argument's shape.
        dtype : numpy.dtype
            The argument's dtype.

        Returns
        -------
        bool
            True if ``dtype`` is this parameter's dtype and ``shape`` has its
            rank and every fixed dimension it has; only the dtype is compared
            where the shape is unknown, and anything fits a parameter whose
            dtype is unknown (a token or tuple).
        """
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
            spec = replace(spec, shape=param.dims, dtype=param.dtype)
        elif spec.dtype is None and param.dtype is not None and not param.is_tuple:
            spec = replace(spec, shape=None, dtype=param.dtype)
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
