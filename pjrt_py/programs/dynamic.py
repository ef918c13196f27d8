"""Programs with dynamic dimensions: specialized to each call's shapes.

XLA compiles static shapes: a ``@main`` taking ``tensor<?xf32>`` fails in
every plugin (``Unbounded dynamism is disabled``; with
``#stablehlo.bounds<8>``, ``Custom call target PadToStatic is not
implemented``). jax runs such programs by refining their shapes before it
compiles, and so does pjrt_py:

- ``Client.compile`` of a program whose ``@main`` has a ``?`` dimension
  returns a ``DynamicExecutable``. Nothing is compiled yet.
- Each call reads its arguments' shapes, checks them against the program's
  signature (dtype, rank, the static dimensions, and any
  ``#stablehlo.bounds``), wraps the program in a ``@main`` of those static
  shapes, and has jaxlib's StableHLO shape refinement
  (``refine_polymorphic_shapes``) propagate them through every function.
  The static program is compiled like any other (the client's compile
  caches apply) and kept per shape signature (``specializations``).
- A ``shape_assertion`` in the program (what jax's shape-polymorphic export
  writes for its constraints) that fails for the given shapes is a
  ``ValueError`` with the assertion's message.

Shape refinement is jaxlib's: without jaxlib installed, compiling such a
program raises ``UnsupportedError``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..runtime.errors import UnsupportedError
from ..runtime.promise import BufferPromise
from .mlir_text import bytecode_to_text, main_signature, read_main, wrap_main
from .signature import ArgSpec

if TYPE_CHECKING:
    from ..runtime.client import RuntimeClient
    from .executable import Executable

_BOUNDS = re.compile(r"#stablehlo\.bounds<([^>]*)>")
_BOUNDED = re.compile(r",\s*#stablehlo\.bounds<[^>]*>")  # a type's bounds encoding
_BODY = "@pjrt_py_dynamic_main"


def dynamic_signature(text: str) -> list[ArgSpec] | None:
    """``@main``'s parameters if any has a dynamic dimension, else None."""
    signature = main_signature(text)
    if signature is None or not any(None in (s.shape or ()) for s in signature):
        return None
    return signature


def _bounds(param_type: str, rank: int) -> list[int | None]:
    """Each dimension's bound from ``#stablehlo.bounds<...>`` (None: unbounded)."""
    found = _BOUNDS.search(param_type)
    if found is None:
        return [None] * rank
    parts = [p.strip() for p in found.group(1).split(",")]
    return [None if p == "?" else int(p) for p in parts] if len(parts) == rank else [None] * rank


def _static_type(param_type: str, shape: tuple[int, ...]) -> str:
    """``tensor<?x4xf32, #...>`` with ``shape`` for its dimensions and no encoding."""
    body = re.match(r"\s*tensor<(.*)>\s*$", param_type, re.S)
    assert body is not None  # checked by main_signature
    element = re.sub(r",\s*#.*$", "", body.group(1), flags=re.S)
    element = re.sub(r"^(?:(?:\d+|\?)x)*", "", element)
    return "tensor<" + "".join(f"{d}x" for d in shape) + element + ">"


def specialize(text: str, shapes: Sequence[tuple[int, ...]]) -> str:
    """``text`` with ``@main``'s parameters of ``shapes``, every shape refined.

    Raises ``ValueError`` for a shape the program's constraints refuse, and
    ``UnsupportedError`` without jaxlib.
    """
    try:
        from jaxlib import _jax
    except ImportError:
        raise UnsupportedError(
            "a program with dynamic dimensions is specialized by jaxlib's shape refinement: "
            "pip install jaxlib"
        ) from None
    # Bounds were checked against the shapes (DynamicExecutable); refinement
    # makes every dimension static, and it does not refine bounded types.
    text = _BOUNDED.sub("", text)
    main = read_main(text)
    assert main is not None  # the caller found a dynamic @main
    params, args, prologue = [], [], []
    for i, (declared, shape) in enumerate(zip(main.param_types, shapes, strict=True)):
        static = _static_type(declared, shape)
        params.append(f"%pjrt_py_p{i}: {static}")
        if static == declared:
            args.append(f"%pjrt_py_p{i}")
        else:  # a convert as the only use: refinement gives the body static types
            prologue.append(
                f"%pjrt_py_a{i} = stablehlo.convert %pjrt_py_p{i} : ({static}) -> {declared}"
            )
            args.append(f"%pjrt_py_a{i}")
    wrapped = wrap_main(
        text,
        main,
        _BODY,
        params=params,
        args=args,
        keep=list(range(len(main.result_types))),
        prologue=tuple(prologue),
    )
    try:
        refined = _jax.mlir.refine_polymorphic_shapes(
            wrapped.encode(), enable_shape_assertions=True, validate_static_shapes=True
        )
    except Exception as e:  # jaxlib's message: a failed shape_assertion, or why not static
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"the program cannot run with argument shapes {list(shapes)}: {message}"
        ) from None
    out = refined if isinstance(refined, str) else bytecode_to_text(bytes(refined))
    if out is None:
        raise UnsupportedError("jaxlib refined the program but its MLIR bindings cannot print it")
    return out


class DynamicExecutable:
    """A program with dynamic dimensions, compiled per call's shapes.

    Made by ``Client.compile`` for a program whose ``@main`` has ``?``
    dimensions (see the module doc). Calls look like an ``Executable``'s.

    Parameters
    ----------
    client : Client
        The client to compile and run on.
    text : str
        The program (MLIR text) with dynamic dimensions in ``@main``.
    compile_kwargs : dict
        The keywords of ``Client.compile`` each specialization is compiled with.
    recompile : callable
        ``Client.compile`` of that client: called with each specialization's
        text and ``compile_kwargs``.

    Attributes
    ----------
    client : Client
        The client it compiles and runs on.
    input_signature : list of ArgSpec
        ``@main``'s parameters; dynamic dimensions are None.
    """

    def __init__(
        self,
        client: RuntimeClient,
        text: str,
        compile_kwargs: dict[str, Any],
        recompile: Callable[..., Executable],
    ) -> None:
        signature = dynamic_signature(text)
        assert signature is not None
        self.client = client
        self.input_signature: list[ArgSpec] = signature
        self._text = text
        self._kwargs = compile_kwargs
        self._recompile = recompile
        main = read_main(text)
        assert main is not None
        self._bounds = [
            _bounds(t, len(s.shape or ())) for t, s in zip(main.param_types, signature, strict=True)
        ]
        self._specialized: dict[tuple[tuple[int, ...], ...], Executable] = {}
        self._lock = threading.Lock()

    @property
    def specializations(self) -> dict[tuple[tuple[int, ...], ...], Executable]:
        """The executables compiled so far, by the argument shapes they take."""
        return dict(self._specialized)

    def _shapes(self, args: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
        if len(args) != len(self.input_signature):
            raise TypeError(
                f"the program takes {len(self.input_signature)} argument(s), {len(args)} given"
            )
        shapes = []
        for i, (arg, spec, bounds) in enumerate(
            zip(args, self.input_signature, self._bounds, strict=True)
        ):
            value = arg.buffer() if isinstance(arg, BufferPromise) else arg
            shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
            want = spec.shape or ()
            if len(shape) != len(want) or any(
                w is not None and w != d for w, d in zip(want, shape, strict=True)
            ):
                dims = "x".join("?" if d is None else str(d) for d in want)
                raise TypeError(
                    f"argument {i} ({spec.name}): the program takes shape [{dims}], "
                    f"got {list(shape)}"
                )
            for axis, (d, bound) in enumerate(zip(shape, bounds, strict=True)):
                if bound is not None and d > bound:
                    raise ValueError(
                        f"argument {i} ({spec.name}): dimension {axis} is {d}, over its "
                        f"bound {bound} (#stablehlo.bounds)"
                    )
            shapes.append(tuple(int(d) for d in shape))
        return tuple(shapes)

    def specialize(self, *args: Any) -> Executable:
        """The executable for these arguments' shapes (compiled on first use).

        Parameters
        ----------
        *args
            Arguments as for ``execute``, or anything with a ``shape``.

        Returns
        -------
        Executable
            The static program for those shapes.

        Raises
        ------
        TypeError
            If an argument's rank or static dimensions do not match.
        ValueError
            If a dimension is over its bound, or the program's own
            constraints (``shape_assertion``) refuse the shapes.
        """
        try:  # a shape signature seen before: one lookup (its checks passed then)
            exe = self._specialized.get(tuple([a.shape for a in args]))
        except (AttributeError, TypeError):
            exe = None
        if exe is not None:
            return exe
        key = self._shapes(args)
        exe = self._specialized.get(key)
        if exe is None:
            with self._lock:
                exe = self._specialized.get(key)
                if exe is None:
                    text = specialize(self._text, key)
                    exe = self._recompile(text, **self._kwargs)
                    self._specialized[key] = exe
        return exe

    def execute_async(self, *args: Any, **kwargs: Any) -> BufferPromise:
        """``Executable.execute_async`` on the specialization for these shapes.

        Parameters
        ----------
        *args, **kwargs
            As for ``Executable.execute_async``.

        Returns
        -------
        BufferPromise
            The outputs' promise.
        """
        return self.specialize(*args).execute_async(*args, **kwargs)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """``Executable.execute`` on the specialization for these shapes.

        Parameters
        ----------
        *args, **kwargs
            As for ``Executable.execute``.

        Returns
        -------
        Buffer, tuple of Buffer, or None
            The outputs, as ``Executable.execute`` gives them.
        """
        return self.specialize(*args).execute(*args, **kwargs)

    def __call__(self, *args: Any) -> Any:
        return self.execute(*args)

    def __repr__(self) -> str:
        return f"<DynamicExecutable {len(self._specialized)} specialization(s)>"


__all__ = ["DynamicExecutable", "dynamic_signature", "specialize"]
