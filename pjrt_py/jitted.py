"""``Jitted``: a function ``pjrt_py.jit`` wraps, with its executables cached per call signature.

See ``pjrt_py.jit`` for what a call's signature is and how calls run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .callbacks import host_callback
from .callbacks import jax_callbacks as _jax_callbacks
from .defaults import default_client
from .interop import jax_types as _jax_types
from .interop.frameworks import to_jax
from .jit_args import (
    _SCALARS,
    _absolute_argnums,
    _Call,
    check_finite,
    committed_device,
    leaf_specs,
)
from .lowered import Lowered
from .programs.executable import Executable
from .runtime.buffer import Buffer

if TYPE_CHECKING:
    from .client import Client


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


# (executable, output structure, whether it is one array, which outputs jax
# returns weakly typed, each output's PRNG key dtype or None (() if none is))
_Entry = tuple[Executable, Any, bool, tuple[bool, ...], tuple[Any, ...]]


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
    donate : dict, optional
        ``donate_argnums`` / ``donate_argnames``, handed to ``jax.jit``,
        which marks the donated parameters in the program.

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
        static_argnums: int | Sequence[int] | None,
        static_argnames: str | Sequence[str] | None,
        client: Client | None,
        convert: Callable[[Buffer], Any] | None = None,
        donate: dict[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"jit expects a callable, got {type(fn).__name__}")
        _jax()  # jax is needed from the first call on; say so now if it is missing
        self.fn = fn
        given = (static_argnums is not None, static_argnames is not None)
        if isinstance(static_argnums, int):
            static_argnums = (static_argnums,)
        if isinstance(static_argnames, str):
            static_argnames = (static_argnames,)
        nums, names = tuple(static_argnums or ()), tuple(static_argnames or ())
        self._params: list[inspect.Parameter] = []
        with contextlib.suppress(TypeError, ValueError):
            self._params = list(inspect.signature(fn).parameters.values())
        positional = [
            p.name for p in self._params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        nums = _absolute_argnums(nums, self._params, len(positional))
        # Like jax.jit: the one of the two not given is inferred from the
        # other, through the parameters that can be passed either way; both
        # given are taken as they are (so a position can stay dynamic when
        # passed by keyword, and a name when passed by position).
        either = [p.kind == p.POSITIONAL_OR_KEYWORD for p in self._params[: len(positional)]]
        if given == (True, False):
            names = tuple(positional[i] for i in nums if 0 <= i < len(either) and either[i])
        elif given == (False, True):
            nums = tuple(i for i, n in enumerate(positional) if either[i] and n in names)
        self.static_argnums = tuple(sorted(set(nums)))
        self.static_argnames = tuple(sorted(set(names)))
        self._client = client
        self._convert = convert  # applied to each output (jit's out=)
        self._donate = dict(donate or {})  # jax.jit's donate_argnums / donate_argnames
        # signature -> _Entry
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
        # Each value with its type, as jax keys them: 1, True, 1.0 and
        # np.int32(1) are equal and hash alike, but trace differently.
        static = tuple((i, type(args[i]), args[i]) for i in nums if i < len(args)) + tuple(
            sorted(((k, type(v), v) for k, v in kwargs.items() if k in names), key=lambda kv: kv[0])
        )
        try:
            hash(static)
        except TypeError as e:
            raise TypeError(f"static arguments must be hashable: {e}") from None
        return dyn, dyn_kw, static

    def _flatten_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], abstract_ok: bool = False
    ) -> _Call:
        """Split off the static arguments and flatten the rest (leaves converted)."""
        dyn, dyn_kw, static = self._split(args, kwargs)
        leaves, treedef = _flatten((dyn, dyn_kw))
        specs = leaf_specs(lambda: self.client, leaves, abstract_ok)
        return _Call(args, kwargs, dyn, dyn_kw, static, leaves, treedef, specs)

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
        """The cache entry for a call, and the call's flat arguments."""
        call = self._flatten_call(args, kwargs)
        # jax's configuration is part of the key, as in jax.jit (see _jax_types).
        context = _jax_types.context()
        device = committed_device(call.leaves, self.client)
        key = (call.treedef, call.specs, call.static, context, device)
        entry = self._cache.get(key)
        if entry is None:
            with self._lock:
                entry = self._cache.get(key)
                if entry is None:
                    lowered = self._lower(call)
                    out_tree = lowered.out_tree
                    single = out_tree == _jax().tree_util.tree_structure(0)
                    compiled = lowered.compile(device)
                    entry = (compiled, out_tree, single, lowered.weak_outputs, lowered.key_outputs)
                    self._cache[key] = entry
        leaves = call.leaves
        if (
            device is None
            and not kwargs
            and len(leaves) == len(args)
            and all(type(a) is Buffer and a is x for a, x in zip(args, leaves, strict=True))
        ):
            # Arguments that are all Buffers on the default device, taken as
            # they are (none narrowed), map to this entry without flattening.
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
                **self._donate,
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
        result = Lowered(self.client, text, call.treedef, lowered.out_tree, names, routes, ordered)
        result.weak_outputs = _jax_types.weak_outputs(lowered)
        result.key_outputs = _jax_types.key_outputs(lowered)
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
        call = self._flatten_call(args, kwargs, abstract_ok=True)
        lowered = self._lower(call)
        lowered.device = committed_device(call.leaves, self.client)  # compile() runs there
        return lowered

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
                    try:
                        promise = entry[0].execute_async(*args)
                    except ValueError:  # Buffers on another device: the full path follows them
                        promise = None
                    if promise is not None:  # dispatched: nothing after this may run it again
                        return self._outputs(entry, promise._buffers)
        entry, leaves = self._entry(args, kwargs)
        return self._outputs(entry, entry[0].execute_async(*leaves)._buffers)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """As an attribute of an instance: bound to it (its first argument), as
        ``jax.jit`` functions are; make ``self`` static with ``static_argnums=0``."""
        return self if obj is None else types.MethodType(self, obj)

    def _outputs(self, entry: _Entry, buffers: Sequence[Any]) -> Any:
        """The call's result: ``buffers`` converted (``out=``) in ``fn``'s structure."""
        _, out_tree, single, weak, keys = entry
        nans, infs = _jax_types.debug_flags()
        if nans or infs:  # as jax.jit: the call waits, and raises on what is found
            check_finite(getattr(self.fn, "__name__", "fn"), buffers, nans, infs)
        if self._convert is not None:
            convert = self._convert
            if keys:  # a key's data stays a Buffer until it is wrapped below
                buffers = [
                    convert(b) if k is None else b for b, k in zip(buffers, keys, strict=True)
                ]
            else:
                buffers = [convert(b) for b in buffers]
            if self._convert is to_jax and any(weak):  # weak where jax's would be
                buffers = [
                    _jax_types.as_weak(b) if w else b for b, w in zip(buffers, weak, strict=True)
                ]
        if keys:  # jax's key arrays, whatever out= says: no other type holds a key
            buffers = [
                b if k is None else _jax_types.wrap_key(to_jax(b), k)
                for b, k in zip(buffers, keys, strict=True)
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
