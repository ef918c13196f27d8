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

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .jit_args import _converter
from .jitted import Jitted
from .runtime.buffer import Buffer

if TYPE_CHECKING:
    from .client import Client


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    client: Client | None = None,
    out: str | Callable[[Buffer], Any] = "buffer",
    donate_argnums: int | Sequence[int] = (),
    donate_argnames: str | Sequence[str] = (),
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
        hashable); each distinct value compiles once. As in ``jax.jit``, the
        one not given is inferred from the other (a static position's name
        is static too, and back); both given are taken as they are.
    client : Client, optional
        Where to compile and run; ``pjrt_py.default_client()`` if None.
    out : str or callable, optional
        What each output becomes: ``"buffer"`` (default: a pjrt_py Buffer,
        returned at once), ``"jax"`` (a ``jax.Array``), ``"torch"`` (a
        ``torch.Tensor``), both sharing the buffer's memory on CPU through
        DLPack, ``"numpy"`` (a copy), or any callable taking a Buffer. All but
        ``"buffer"`` wait for the result.
    donate_argnums, donate_argnames : int/str or sequences of them
        Arguments whose memory the program may reuse for its outputs, as in
        ``jax.jit``: a Buffer passed there is dead after the call (using it
        raises ``ValueError``). Arrays pjrt_py only views (another
        framework's, zero-copy ones) are never donated: the program copies
        them.

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
            donate_argnums=donate_argnums,
            donate_argnames=donate_argnames,
        )
    # Only what was given: jax infers names from numbers and back only for
    # the one it is not handed (an explicit () turns that off).
    donate = {
        k: v
        for k, v in (("donate_argnums", donate_argnums), ("donate_argnames", donate_argnames))
        if not (isinstance(v, (tuple, list)) and not v)
    }
    return Jitted(fn, static_argnums, static_argnames, client, convert, donate)


__all__ = ["Jitted", "jit"]
