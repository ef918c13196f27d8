"""``pjrt_py.jit``: trace a function with JAX, run it on pjrt_py.

JAX does the tracing and lowering to StableHLO; pjrt_py compiles the text on
its own client, caches the executable per call signature, and dispatches it.
jax is an optional dependency, imported on first use.

A call's signature is the structure of its arguments (a pytree), the shape
and dtype of each array argument, the type of each Python scalar (scalars are
weakly typed, as in JAX: one executable serves every value), and the values of
the static arguments. Calls with a signature seen before cost a dictionary
lookup and a dispatch; a new signature lowers and compiles once.

Like ``jax.jit``, a call returns at once: its outputs are pjrt_py
``Buffer`` objects in the structure the function returns, whose
work may still be running. Reading one (``to_numpy()``, ``np.asarray``) or
``block_until_ready()`` waits, and raises if the work failed. Outputs can be
passed straight to the next call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from . import _jax_callbacks, _jax_types, host_callback
from .buffer import Buffer
from .client import default_client
from .dlpack import Foreign, is_foreign, to_jax, to_torch
from .executable import Executable
from .promise import BufferPromise

if TYPE_CHECKING:
    from .client import Client

_SCALARS = (bool, int, float, complex)


_JAX: Any = None
_flatten: Any = None  # jax.tree_util.tree_flatten / tree_unflatten, bound on first use
_unflatten: Any = None


def _jax() -> Any:
    global _JAX, _flatten, _unflatten
    if _JAX is None:
        try:
            import jax
        except ImportError:
            raise ImportError(
                "pjrt_py.jit traces functions with JAX: pip install jax (or pjrt_py[test])"
            ) from None
        _JAX = jax
        _flatten, _unflatten = jax.tree_util.tree_flatten, jax.tree_util.tree_unflatten
    return _JAX


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    client: Client | None = None,
    out: str | Callable[[Buffer], Any] = "buffer",
) -> Any:
    """Compile ``fn`` with JAX's tracer and run it on pjrt_py.

    Arguments may be Buffers, numpy arrays and scalars, or other frameworks'
    arrays (jax, torch, any DLPack producer), which are used in place on CPU
    where their memory allows (see ``pjrt_py.dlpack``).

    Parameters
    ----------
    fn : callable
        A JAX-traceable function of arrays (and pytrees of them). Usable as a
        decorator, with or without arguments.
    static_argnums, static_argnames : int/str or sequences of them
        Arguments whose values are part of the compiled program (they must be
        hashable); each distinct value compiles once.
    client : Client, optional
        Where to compile and run; ``pjrt_py.default_client()`` if None.
    out : str or callable, optional
        What each output becomes: ``"buffer"`` (default: a pjrt_py Buffer,
        returned at once), ``"jax"`` (a ``jax.Array``), ``"torch"`` (a
        ``torch.Tensor``), both sharing the buffer's memory on CPU through
        DLPack, ``"numpy"`` (a copy), or any callable taking a Buffer. All but
        ``"buffer"`` wait for the result.

    Returns
    -------
    Jitted or callable
        The compiled function; with ``fn`` None, a decorator that takes the
        function and returns its ``Jitted``.

    Raises
    ------
    ValueError
        If ``out`` is neither one of the names above nor a callable.
    TypeError
        If ``fn`` is not callable (raised when it is given or decorated).
    ImportError
        If jax is not installed (raised when ``fn`` is given or decorated).
    """
    convert = _converter(out)
    if fn is None:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
            client=client,
            out=out,
        )
    return Jitted(fn, static_argnums, static_argnames, client, convert)


_CONVERTERS: dict[str, Callable[[Buffer], Any] | None] = {
    "buffer": None,
    "numpy": Buffer.to_numpy,
    "jax": to_jax,
    "torch": to_torch,
}


def _converter(out: str | Callable[[Buffer], Any]) -> Callable[[Buffer], Any] | None:
    if callable(out):
        return out
    if isinstance(out, str) and out in _CONVERTERS:
        return _CONVERTERS[out]
    raise ValueError(f"out must be one of {sorted(_CONVERTERS)} or a callable, got {out!r}")


_Entry = tuple[Executable, Any, bool, tuple[bool, ...]]


class _Call(NamedTuple):
    """One call's arguments, split and flattened (see Jitted._flatten_call)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dyn: tuple[Any, ...]  # the non-static positional arguments
    dyn_kw: dict[str, Any]  # the non-static keyword arguments
    static: tuple[Any, ...]  # hashable (position or name, value) pairs
    leaves: list[Any]  # flat arrays, converted as JAX would
    treedef: Any  # the structure of (dyn, dyn_kw)
    specs: tuple[Any, ...]  # one hashable (shape, dtype) or scalar type per leaf


class Lowered:
    """A function lowered to StableHLO for one call signature (seed 004's stage 2).

    Made by ``Jitted.lower`` (and by a call with a new signature).

    Parameters
    ----------
    jitted : Jitted
        The function lowered; its client compiles the program.
    text : str
        The StableHLO (MLIR text) to compile: jax's, with its host callbacks
        pointed at pjrt_py's router and, for ordered effects, ``@main``'s
        token parameters and results made inside.
    in_tree : PyTreeDef
        The structure of the non-static arguments, ``(args, kwargs)``.
    out_tree : PyTreeDef
        The structure of the outputs.
    names : list of str
        A name per flat argument (``x``, ``params['w']``), given to the
        compiled executable's parameters for its argument errors.
    routes : Routes, optional
        jax's host callbacks the program calls (``pure_callback``,
        ``io_callback``, ``debug.print``), kept by the executable.
    ordered : bool, optional
        Whether the program has jax's ordered effects: every execution of the
        compiled executable is then ordered (see ``pjrt_py.effects``).
    """

    def __init__(
        self,
        jitted: Jitted,
        text: str,
        in_tree: Any,
        out_tree: Any,
        names: list[str],
        routes: _jax_callbacks.Routes | None = None,
        ordered: bool = False,
    ):
        self._jitted = jitted
        self._routes = routes  # jax's host callbacks, while an executable may call them
        self._ordered = ordered  # jax's ordered effects: executions run in order
        self._text = text
        self.in_tree = in_tree  # structure of the (non-static) arguments
        self.out_tree = out_tree  # structure of the outputs
        self.arg_names = names
        self.weak_outputs: tuple[bool, ...] = ()  # outputs jax returns weakly typed

    def as_text(self) -> str:
        """The StableHLO (MLIR text) handed to the compiler.

        Returns
        -------
        str
            The program text, as ``compile`` compiles it.
        """
        return self._text

    def compile(self) -> Executable:
        """Compile for the client: an ``Executable`` taking the
        flattened array arguments (static ones removed), in ``in_tree`` order.

        Returns
        -------
        Executable
            The compiled program, its parameters named after the arguments
            (``arg_names``); ordered on every execution if the function has
            jax's ordered effects. The client's compile cache may supply it.

        Raises
        ------
        PjrtError
            With the compiler's message, if the plugin refuses the program.
        """
        exe = self._jitted.client.compile(self._text)
        signature = exe.input_signature
        if signature is not None and len(signature) == len(self.arg_names):
            named = zip(self.arg_names, signature, strict=True)
            exe._signature = [dataclasses.replace(s, name=name) for name, s in named]
        if self._routes is not None:
            exe._host_routes = self._routes
        if self._ordered:
            exe._ordered = True
        return exe


def _absolute_argnums(
    nums: tuple[int, ...], params: list[inspect.Parameter], positional: int
) -> tuple[int, ...]:
    """``static_argnums`` with negative positions counted from the end, as jax does.

    A negative position needs a known number of positional parameters: with
    ``*args`` (or no readable signature) it is refused rather than guessed.
    """
    for i in nums:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"static_argnums must be ints, got {i!r}")
    if all(i >= 0 for i in nums):
        return nums
    if not params or any(p.kind == p.VAR_POSITIONAL for p in params):
        raise ValueError(
            f"static_argnums={nums} counts from the end, which needs a function with a fixed "
            "number of positional parameters (no *args): give non-negative positions"
        )
    out = tuple(i + positional if i < 0 else i for i in nums)
    if any(i < 0 for i in out):
        raise ValueError(
            f"static_argnums={nums}: the function takes {positional} positional argument(s)"
        )
    return out


class Jitted:
    """A function compiled per call signature; made by ``jit``.

    Parameters
    ----------
    fn : callable
        The JAX-traceable function.
    static_argnums : int or sequence of int
        Positions of the static arguments. A static position also makes its
        parameter's name static, as in ``jax.jit``.
    static_argnames : str or sequence of str
        Names of the static arguments; a static name also makes its position
        static.
    client : Client or None
        Where to compile and run; ``pjrt_py.default_client()`` (on first use)
        if None.
    convert : callable, optional
        Applied to each output Buffer (``jit``'s ``out=``); None returns the
        Buffers.

    Raises
    ------
    TypeError
        If ``fn`` is not callable.
    ImportError
        If jax is not installed.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        static_argnums: int | Sequence[int],
        static_argnames: str | Sequence[str],
        client: Client | None,
        convert: Callable[[Buffer], Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"jit expects a callable, got {type(fn).__name__}")
        _jax()  # jax is needed from the first call on; say so now if it is missing
        self.fn = fn
        nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        self._params: list[inspect.Parameter] = []
        with contextlib.suppress(TypeError, ValueError):
            self._params = list(inspect.signature(fn).parameters.values())
        # Like jax.jit: a static name also makes its position static, and back.
        positional = [
            p.name for p in self._params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        nums = _absolute_argnums(nums, self._params, len(positional))
        nums += tuple(positional.index(n) for n in names if n in positional)
        names += tuple(positional[i] for i in nums if 0 <= i < len(positional))
        self.static_argnums = tuple(sorted(set(nums)))
        self.static_argnames = tuple(sorted(set(names)))
        self._client = client
        self._convert = convert  # applied to each output (jit's out=)
        # signature -> (executable, output structure, whether it is one array,
        # which outputs jax returns weakly typed)
        self._cache: dict[Any, _Entry] = {}
        self._flat: dict[Any, _Entry] = {}  # all-Buffer calls, by (context, metadata)
        self._lock = threading.Lock()
        self._jax_jit: Any = None
        functools.update_wrapper(self, fn)

    @property
    def client(self) -> Client:
        """The client this function compiles and runs on (``default_client()`` if none)."""
        if self._client is None:
            self._client = default_client()
        return self._client

    # -- signatures -------------------------------------------------------
    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
        """(dynamic args, dynamic kwargs, hashable static values)."""
        nums, names = self.static_argnums, self.static_argnames
        if not nums and not names:
            return args, kwargs, ()
        dyn = tuple(a for i, a in enumerate(args) if i not in nums)
        dyn_kw = {k: v for k, v in kwargs.items() if k not in names}
        static = tuple((i, args[i]) for i in nums if i < len(args)) + tuple(
            sorted((k, v) for k, v in kwargs.items() if k in names)
        )
        try:
            hash(static)
        except TypeError as e:
            raise TypeError(f"static arguments must be hashable: {e}") from None
        return dyn, dyn_kw, static

    def _leaf_specs(self, leaves: list[Any]) -> tuple[Any, ...]:
        """One hashable spec per leaf; converts leaves in place where JAX would."""
        specs = []
        for i, x in enumerate(leaves):
            t = type(x)
            if t is Buffer:
                specs.append(x._meta or x._metadata())
            elif t in _SCALARS:
                specs.append(t)  # weakly typed: the value is not part of the key
            elif t is np.ndarray or isinstance(x, np.generic):
                x = np.asarray(x)
                dtype = _jax_types.canonical(x.dtype)
                if dtype != x.dtype:
                    x = x.astype(dtype)
                leaves[i] = x
                specs.append((x.shape, x.dtype))
            elif t is BufferPromise:
                leaves[i] = buf = x.buffer()
                specs.append(buf._metadata())
            elif is_foreign(x):  # jax, torch, ...: taken through DLPack
                weak = _jax_types.is_weak(x)  # traced weak, as jax traces it
                foreign = Foreign(x, self.client)
                dtype = _jax_types.canonical(foreign.dtype)
                if dtype != foreign.dtype:  # as JAX would: narrowed, so copied
                    leaves[i] = np.asarray(foreign.tensor.as_array(foreign.dtype), dtype=dtype)
                else:
                    leaves[i] = foreign
                specs.append((foreign.shape, dtype, True) if weak else (foreign.shape, dtype))
            else:
                raise TypeError(
                    f"pjrt_py.jit argument of type {t.__name__}: expected pjrt_py "
                    f"Buffers, promises, numpy arrays, Python/numpy scalars or DLPack "
                    f"producers (jax, torch, ...)"
                )
        return tuple(specs)

    def _flatten_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """Split off the static arguments and flatten the rest (leaves converted)."""
        dyn, dyn_kw, static = self._split(args, kwargs)
        leaves, treedef = _flatten((dyn, dyn_kw))
        specs = self._leaf_specs(leaves)
        return _Call(args, kwargs, dyn, dyn_kw, static, leaves, treedef, specs)

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
        """The cache entry for a call, and the call's flat arguments."""
        call = self._flatten_call(args, kwargs)
        # jax's configuration is part of the key, as in jax.jit (see _jax_types).
        context = _jax_types.context()
        key = (call.treedef, call.specs, call.static, context)
        entry = self._cache.get(key)
        if entry is None:
            with self._lock:
                entry = self._cache.get(key)
                if entry is None:
                    lowered = self._lower(call)
                    out_tree = lowered.out_tree
                    single = out_tree == _jax().tree_util.tree_structure(0)
                    entry = (lowered.compile(), out_tree, single, lowered.weak_outputs)
                    self._cache[key] = entry
        leaves = call.leaves
        if not kwargs and all(type(a) is Buffer for a in args) and len(leaves) == len(args):
            # Arguments that are all Buffers map to this entry without flattening.
            self._flat[(context, tuple(a._metadata() for a in args))] = entry
        return entry, leaves

    # -- stages -----------------------------------------------------------
    def _lower(self, call: _Call) -> Lowered:
        jax = _jax()
        if self._jax_jit is None:
            self._jax_jit = jax.jit(
                self.fn,
                static_argnums=self.static_argnums,
                static_argnames=self.static_argnames,
                keep_unused=True,  # every flat argument stays a parameter of @main
            )
        abstract = [
            x if type(x) in _SCALARS else _jax_types.abstract(spec)
            for x, spec in zip(call.leaves, call.specs, strict=True)
        ]
        abs_dyn, abs_kw = _unflatten(call.treedef, abstract)
        it = iter(abs_dyn)
        full = tuple(a if i in self.static_argnums else next(it) for i, a in enumerate(call.args))
        full_kw = {
            k: (v if k in self.static_argnames else abs_kw[k]) for k, v in call.kwargs.items()
        }
        lowered = self._lower_for_client(full, full_kw)
        compile_args = getattr(getattr(lowered, "_lowering", None), "compile_args", {})
        text = lowered.as_text()
        callbacks = list(compile_args.get("host_callbacks") or ())
        routes = None
        if callbacks:  # jax's pure_callback, io_callback, debug.print: see _jax_callbacks
            host_callback.install_router(self.client)
            routes = _jax_callbacks.Routes(callbacks)
            text = _jax_callbacks.route_callbacks(text, routes)
        ordered = bool(compile_args.get("ordered_effects"))
        if ordered:
            text = _jax_callbacks.without_main_tokens(text)
        names = self._arg_names(call.dyn, call.dyn_kw)
        result = Lowered(self, text, call.treedef, lowered.out_tree, names, routes, ordered)
        result.weak_outputs = _jax_types.weak_outputs(lowered)
        return result

    def _lower_for_client(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """jax's lowering for the client's platform, not for jax's default backend.

        Lowering rules differ by platform (a CUDA client must not run what jax
        lowered for its CPU). jax lowers a host callback for a platform only
        where it has a backend of it: without one (jax's CPU build next to a
        CUDA plugin), the default lowering is used, whose callbacks pjrt_py
        rewrites the same way (see ``_jax_callbacks``).
        """
        platform = self.client.platform_name
        trace = getattr(self._jax_jit, "trace", None)
        if trace is not None and platform in ("cpu", "cuda", "rocm"):
            try:
                return trace(*args, **kwargs).lower(lowering_platforms=(platform,))
            except (TypeError, RuntimeError, NotImplementedError) as e:
                if "backend" not in str(e).lower() and not isinstance(e, TypeError):
                    raise
        return self._jax_jit.lower(*args, **kwargs)

    def _arg_names(self, dyn: tuple[Any, ...], dyn_kw: dict[str, Any]) -> list[str]:
        """``x``, ``params['w']``: a name per flat argument, for argument errors."""
        tree_util = _jax().tree_util
        positional = [
            p.name for p in self._params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        dyn_names = [n for i, n in enumerate(positional) if i not in self.static_argnums]
        names = []
        for index, value in enumerate(dyn):
            base = dyn_names[index] if index < len(dyn_names) else f"args[{index}]"
            for path, _ in tree_util.tree_flatten_with_path(value)[0]:
                names.append(base + tree_util.keystr(path))
        for key in sorted(dyn_kw):
            for path, _ in tree_util.tree_flatten_with_path(dyn_kw[key])[0]:
                names.append(key + tree_util.keystr(path))
        return names

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lower for these arguments' signature without running (seed 004's stages).

        The function's cache is neither read nor filled; errors of jax's
        tracing and lowering pass through.

        Parameters
        ----------
        *args, **kwargs
            Arguments as for a call, static ones included; only their
            structure, shapes and dtypes (and the static values) matter.

        Returns
        -------
        Lowered
            The StableHLO for this signature, ready to ``compile``.

        Raises
        ------
        TypeError
            If a static argument is not hashable, or an argument is of a type
            ``jit`` cannot take.
        """
        return self._lower(self._flatten_call(args, kwargs))

    # -- calls --------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on pjrt_py; returns the outputs (Buffers, in ``fn``'s structure) at once."""
        if not kwargs and not self.static_argnums:
            # The common case, kept short: every argument a Buffer whose
            # metadata is known (e.g. an earlier call's output). No pytree to
            # flatten: the key is the arguments' (shape, dtype)s.
            metas = []
            for a in args:
                if type(a) is not Buffer or a._meta is None:
                    break
                metas.append(a._meta)
            else:
                entry = self._flat.get((_jax_types.context(), tuple(metas)))
                if entry is not None:
                    return self._outputs(entry, entry[0].execute_async(*args)._buffers)
        entry, leaves = self._entry(args, kwargs)
        return self._outputs(entry, entry[0].execute_async(*leaves)._buffers)

    def _outputs(self, entry: _Entry, buffers: Sequence[Any]) -> Any:
        """The call's result: ``buffers`` converted (``out=``) in ``fn``'s structure."""
        _, out_tree, single, weak = entry
        if self._convert is not None:
            buffers = [self._convert(b) for b in buffers]
            if self._convert is to_jax and any(weak):  # weak where jax's would be
                buffers = [
                    _jax_types.as_weak(b) if w else b for b, w in zip(buffers, weak, strict=True)
                ]
        return buffers[0] if single else _unflatten(out_tree, buffers)

    def cache_size(self) -> int:
        """How many signatures have been compiled.

        Returns
        -------
        int
            The number of call signatures in this function's cache.
        """
        return len(self._cache)

    def clear_cache(self) -> None:
        """Forget every compiled signature; the next call of each lowers and compiles again.

        Compiling again may take the program from the client's compile cache.
        """
        with self._lock:
            self._cache.clear()
            self._flat.clear()

    def __repr__(self) -> str:
        return f"<pjrt_py.jit {getattr(self.fn, '__qualname__', self.fn)!r}>"


def _meta(x: Any) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """(shape, dtype) of a Buffer or an array."""
    if isinstance(x, Buffer):
        return x._metadata()
    return x.shape, x.dtype
