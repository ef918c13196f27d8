"""What a jax trace depends on beyond shapes and dtypes, for ``pjrt_py.jit``.

jax's own ``jit`` keys its trace cache on its configuration (x64, dtype
promotion, default device, and everything else its tracing reads) and on each
argument's weak type. ``pjrt_py.jit`` must key on the same, or a program
traced under an earlier configuration runs under a later one and gives
another answer than jax (measured: float32 ``inf`` where jax gave float64
``3e300`` after x64 was turned on; a cached result where strict promotion
raises).

- ``context()``: jax's own tuple of trace-relevant configuration
  (``jax._src.config.trace_context``, about 0.2 us), part of every cache key.
- ``canonical(dtype)``: the dtype jax gives an array of ``dtype`` under the
  configuration in force (64-bit types narrow unless x64 is on); asked each
  time, never cached across configurations.
- Weak types: a jax array with ``weak_type=True`` (``jnp.asarray(2.0)``) is
  traced as weak, as jax traces it, so ``weak f32 * f16`` is float16 in both.
  Outputs that jax would return weak are returned weak with ``out="jax"``.
  A pjrt_py ``Buffer`` carries no weak type: an output returned as a Buffer
  and passed back in is strong (documented in docs/aot.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.dtypes import TO_PJRT
from .dlpack import TO_DLPACK

_trace_context: Any = None


def context() -> Any:
    """A hashable value that changes whenever jax would trace differently."""
    global _trace_context
    if _trace_context is None:
        try:
            from jax._src.config import trace_context

            _trace_context = trace_context
        except ImportError:  # a jax without it: the settings that change dtypes
            import jax

            names = (
                "enable_x64",
                "numpy_dtype_promotion",
                "default_device",
                "numpy_rank_promotion",
            )

            def _fallback() -> Any:
                config: Any = jax.config
                return tuple(getattr(config, "jax_" + name, None) for name in names)

            _trace_context = _fallback
    return _trace_context()


def canonical(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype jax gives an array of ``dtype`` under the configuration in force."""
    import jax

    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def is_weak(x: Any) -> bool:
    """Whether ``x`` is a weakly typed jax array (only jax's arrays are asked)."""
    return type(x).__module__.startswith("jax") and getattr(x, "weak_type", False) is True


def abstract(spec: tuple[Any, ...]) -> Any:
    """The ``jax.ShapeDtypeStruct`` of a leaf's spec: (shape, dtype[, weak])."""
    import jax

    struct: Any = jax.ShapeDtypeStruct
    return struct(spec[0], spec[1], weak_type=len(spec) > 2 and spec[2])


def weak_outputs(jax_lowered: Any) -> tuple[bool, ...]:
    """Which outputs jax would return weakly typed, from its lowering ((): unknown)."""
    lowering = getattr(jax_lowered, "_lowering", None)
    avals = getattr(lowering, "compile_args", {}).get("global_out_avals") or ()
    return tuple(bool(getattr(a, "weak_type", False)) for a in avals)


_debug_states: Any = None  # jax's debug_nans and debug_infs settings, bound once


def debug_flags() -> tuple[bool, bool]:
    """``jax_debug_nans`` and ``jax_debug_infs`` as set now (two reads of
    jax's settings: a call of pjrt_py.jit pays them on every call)."""
    global _debug_states
    if _debug_states is None:
        try:
            from jax._src import config as _config

            _debug_states = (_config.debug_nans, _config.debug_infs)
        except (ImportError, AttributeError):  # a jax without them: never set
            _debug_states = ()
    if not _debug_states:
        return False, False
    return bool(_debug_states[0].value), bool(_debug_states[1].value)


def is_tracer(x: Any) -> bool:
    """Whether ``x`` is a jax tracer (an argument inside grad, vmap, jax.jit)."""
    if not type(x).__module__.startswith("jax"):
        return False
    from jax._src import core

    return isinstance(x, core.Tracer)


def is_key(x: Any) -> bool:
    """Whether ``x`` is a jax array of typed PRNG keys (``jax.random.key``)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or isinstance(dtype, np.dtype) or not type(x).__module__.startswith("jax"):
        return False  # every array but jax's extended dtypes, at once
    return is_key_dtype(dtype)


def is_key_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is one of jax's typed PRNG key dtypes."""
    if isinstance(dtype, np.dtype):
        return False
    import jax

    return bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))


def key_data(x: Any) -> Any:
    """The data of a typed PRNG key array (``is_key``): what programs take, as jax's do."""
    import jax

    return jax.random.key_data(x)


def without_dlpack(x: Any) -> bool:
    """Whether ``x`` is a jax array of a dtype pjrt_py moves but DLPack has no
    code for (int4, uint4, int2, uint2, float4_e2m1fn): jax's ``__dlpack__`` refuses it, so it
    is taken through numpy, a copy."""
    dtype = getattr(x, "dtype", None)
    return (
        isinstance(dtype, np.dtype)
        and dtype in TO_PJRT
        and dtype not in TO_DLPACK
        and type(x).__module__.startswith("jax")
    )


def key_outputs(jax_lowered: Any) -> tuple[Any, ...]:
    """Per flat output, its PRNG key dtype, or None; () when no output is a key.

    A program returns a key array as its data (``jax.random.key_data``'s
    uint32 array); the dtype says how to wrap it again."""
    import jax

    try:
        infos = jax.tree_util.tree_leaves(jax_lowered.out_info)
    except AttributeError:  # a jax without out_info has no typed keys to return
        return ()
    keys = tuple(
        i.dtype if jax.numpy.issubdtype(i.dtype, jax.dtypes.prng_key) else None for i in infos
    )
    return keys if any(k is not None for k in keys) else ()


def wrap_key(data: Any, dtype: Any) -> Any:
    """A jax key array of ``dtype`` over ``data`` (a jax.Array of its key data)."""
    import jax

    try:
        return jax.random.wrap_key_data(data, dtype=dtype)
    except TypeError:  # a jax whose wrap_key_data has no dtype=: the impl is the dtype's
        return jax.random.wrap_key_data(data, impl=dtype)


def as_weak(array: Any) -> Any:
    """``array`` (a jax.Array) marked weakly typed, sharing its memory."""
    from jax._src import core
    from jax._src.array import ArrayImpl

    try:
        aval = core.ShapedArray(array.shape, array.dtype, weak_type=True)
        return ArrayImpl(aval, array.sharding, array._arrays, committed=array._committed)
    except (AttributeError, TypeError):  # another jax's internals: jax's own conversion
        from jax._src.lax import lax

        return lax._convert_element_type(array, weak_type=True)
