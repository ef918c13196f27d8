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
  ``#stablehlo.bounds``), gives ``@main``'s parameters those static types
  (each renamed, its old name defined at the top of the body by a convert),
  and has jaxlib's StableHLO shape refinement (``refine_polymorphic_shapes``)
  propagate them through every function.
  The static program is compiled like any other (the client's compile
  caches apply) and kept per shape signature (``specializations``).
- A ``shape_assertion`` in the program (what jax's shape-polymorphic export
  writes for its constraints) that fails for the given shapes is a
  ``ValueError`` with the assertion's message.
- **Dimension arguments.** jax's older exports (StableHLO's ``testdata/dynamic``
  programs among them) take each dimension's value as a leading scalar
  integer parameter, and build shapes from it. Shapes alone cannot make such
  a program static. When refinement from the shapes leaves dynamic shapes
  (or the plugin refuses the result: an op that needs constant operands,
  such as ``real_dynamic_slice``) and ``@main`` begins with scalar integer
  parameters, those parameters' values are written into the program as
  constants too, and specialize it with the shapes (one compile per shapes
  and values). The caller passes the
  values, as that convention asks; folding a value in is what the program
  would compute with it, so a value the shapes disagree with fails as the
  program would (a refinement error, or the program's own assertion).

Shape refinement is jaxlib's: without jaxlib installed, compiling such a
program raises ``UnsupportedError``.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..runtime.errors import ProgramError, UnsupportedError
from ..runtime.promise import BufferPromise
from .joined import run_joined
from .mlir_text import bytecode_to_text, main_body, main_signature, read_main, split_top_level
from .signature import ArgSpec

if TYPE_CHECKING:
    from ..runtime.client import RuntimeClient
    from .executable import Executable

_BOUNDS = re.compile(r"#stablehlo\.bounds<([^>]*)>")
_BOUNDED = re.compile(r",\s*#stablehlo\.bounds<[^>]*>")  # a type's bounds encoding


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


def specialize(
    text: str, shapes: Sequence[tuple[int, ...]], values: Mapping[int, int] | None = None
) -> str:
    """``text`` with ``@main``'s parameters of ``shapes``, every shape refined.

    ``values`` maps parameter indices to the values written into the program
    for them (scalar integer dimension arguments). Raises ``ValueError`` for
    a shape the program's constraints refuse, and ``UnsupportedError``
    without jaxlib.
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
    # @main is rewritten in place: a parameter whose type changes is renamed
    # and given its static type, and the body begins by defining the old name
    # (a convert from the static type, or a dimension argument's constant),
    # so refinement carries the static types and values through the body.
    params, prologue = [], []
    for i, (param, name, declared, shape) in enumerate(
        zip(main.params, main.names, main.param_types, shapes, strict=True)
    ):
        static = _static_type(declared, shape)
        value = None if values is None else values.get(i)
        if static == declared and value is None:
            params.append(param)
            continue
        rest = param[len(name) :].lstrip().removeprefix(":")  # type, attributes, location
        params.append(f"%pjrt_py_p{i}: " + rest.replace(declared, static, 1).lstrip())
        if value is not None:  # still taken, so calls look the same
            prologue.append(f"{name} = stablehlo.constant dense<{value}> : {declared}")
        else:
            prologue.append(f"{name} = stablehlo.convert %pjrt_py_p{i} : ({static}) -> {declared}")
    _, close = split_top_level(text, main.paren)
    signature = ", ".join(params)
    text = text[: main.paren + 1] + signature + text[close:]
    rewritten = read_main(text)
    assert rewritten is not None
    body = main_body(text, rewritten)
    wrapped = text[: body + 1] + "".join(f"\n    {line}" for line in prologue) + text[body + 1 :]
    try:
        refined = run_joined(  # jaxlib's C++: see joined
            _jax.mlir.refine_polymorphic_shapes,
            wrapped.encode(),
            enable_shape_assertions=True,
            validate_static_shapes=True,
        )
    except Exception as e:  # jaxlib's message: a failed shape_assertion, or why not static
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        given = f" and dimension values {dict(values)}" if values else ""
        raise ValueError(
            f"the program cannot run with argument shapes {list(shapes)}{given}: {message}"
        ) from None
    out = refined if isinstance(refined, str) else bytecode_to_text(bytes(refined))
    if out is None:
        raise UnsupportedError("jaxlib refined the program but its MLIR bindings cannot print it")
    return out


def _numpy_dtype(value: Any) -> np.dtype[Any] | None:
    """An array argument's dtype (numpy, a Buffer, jax); None for a Python
    scalar (weakly typed) or a dtype numpy does not name (torch's)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return None
    try:
        named: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        return None
    return named


def _scalar_int(spec: ArgSpec) -> bool:
    return spec.shape == () and spec.dtype is not None and spec.dtype.kind in "iu"


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
        self._specialized: dict[tuple[Any, ...], Executable] = {}
        self._lock = threading.Lock()
        # Leading scalar integer parameters: jax's dimension arguments, if
        # shapes alone do not make the program static (see the module doc).
        first_dynamic = next(i for i, s in enumerate(signature) if None in (s.shape or ()))
        self._dimension_args = tuple(
            itertools.takewhile(lambda i: _scalar_int(signature[i]), range(first_dynamic))
        )
        self._by_value: tuple[int, ...] = ()  # set once shapes alone fall short

    @property
    def specializations(self) -> dict[tuple[Any, ...], Executable]:
        """The executables compiled so far, by the argument shapes they take.

        A program specialized on its dimension arguments' values has each
        such argument's value (an int) where its shape, ``()``, would be.
        """
        return dict(self._specialized)

    def _values(self, args: Sequence[Any], indices: Sequence[int]) -> dict[int, int]:
        """The values of the dimension arguments at ``indices`` (read to the host)."""
        values = {}
        for i in indices:
            arg = args[i].buffer() if isinstance(args[i], BufferPromise) else args[i]
            array = np.asarray(arg.to_numpy() if hasattr(arg, "to_numpy") else arg)
            if array.shape != () or array.dtype.kind not in "iu":
                raise TypeError(
                    f"argument {i} ({self.input_signature[i].name}): a dimension's value, "
                    f"a scalar integer, is expected; got {array.dtype}{list(array.shape)}"
                )
            values[i] = int(array)
        return values

    @staticmethod
    def _keyed(shapes: tuple[tuple[int, ...], ...], values: Mapping[int, int]) -> tuple[Any, ...]:
        return tuple(values.get(i, shape) for i, shape in enumerate(shapes))

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
            dtype = _numpy_dtype(value) if i not in self._dimension_args else None  # _values checks
            if dtype is not None and spec.dtype is not None and dtype != spec.dtype:
                # refused before a specialization is compiled (and kept) for it
                raise TypeError(
                    f"argument {i} ({spec.name}): the program takes {spec.dtype}, got {dtype}"
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
        shapes = self._shapes(args)
        values = self._values(args, self._by_value)
        exe = self._specialized.get(self._keyed(shapes, values))
        if exe is None:
            with self._lock:
                exe = self._specialized.get(self._keyed(shapes, values))
                if exe is None:
                    exe = self._compile(shapes, values, args)
        return exe

    def _compile(
        self, shapes: tuple[tuple[int, ...], ...], values: dict[int, int], args: Sequence[Any]
    ) -> Executable:
        """Specialize and compile (with the lock held); keeps the result."""
        try:
            exe = self._recompile(specialize(self._text, shapes, values), **self._kwargs)
        except (ValueError, ProgramError):
            if self._by_value or not self._dimension_args:
                raise
            # Shapes alone leave it dynamic (refinement says so, or an op that
            # needs constant operands reaches the compiler): its leading
            # scalars are dimension arguments. Kept for later calls only if
            # their values make it compile.
            values = self._values(args, self._dimension_args)
            exe = self._recompile(specialize(self._text, shapes, values), **self._kwargs)
            self._by_value = self._dimension_args
        # Refinement prints the parameters as %arg0, %arg1: the names the
        # dynamic program gave them are the ones its callers know.
        if exe._signature is not None and len(exe._signature) == len(self.input_signature):
            exe._signature = [
                replace(spec, name=named.name) if named.name else spec
                for spec, named in zip(exe._signature, self.input_signature, strict=True)
            ]
        self._specialized[self._keyed(shapes, values)] = exe
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
