"""How ``pjrt_py.jit`` reads a call: static argument numbers, the flattened
call, each leaf's shape and dtype, and how outputs are handed back."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .interop import jax_types
from .interop.dlpack import HOST_DEVICES
from .interop.foreign import Foreign, is_foreign, place
from .interop.frameworks import to_jax, to_torch
from .programs.arguments import check_memory, own_buffer
from .programs.device_programs import convert_on_device
from .runtime.buffer import Buffer, refuse_masked
from .runtime.dtypes import is_floating
from .runtime.promise import BufferPromise

_SCALARS = (bool, int, float, complex)


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


def narrowed(client: Any, foreign: Foreign, dtype: np.dtype[Any]) -> Any:
    """A foreign array converted to ``dtype``, as jax narrows 64-bit types
    with x64 off: a numpy copy from host memory, else a convert on the device
    (memory the host cannot read is never read by it)."""
    tensor = foreign.tensor
    if tensor.device[0] in HOST_DEVICES:
        return np.asarray(tensor.as_array(foreign.dtype), dtype=dtype)
    # A view on its own device (or BufferError), converted there.
    return convert_on_device(client, place(client, foreign, None, None), dtype)


def _checked(buf: Buffer, client: Any, index: int) -> Buffer:
    """A Buffer to narrow, checked as an argument is, so that what is wrong
    with it is said of the argument, not of the convert program."""
    own_buffer(buf, client, index)
    check_memory(buf, buf.device.default_memory, f"argument {index}")
    return buf


def leaf_specs(
    client_of: Callable[[], Any], leaves: list[Any], abstract_ok: bool = False
) -> tuple[Any, ...]:
    """One hashable spec per leaf of a call; converts leaves in place where
    JAX would. ``client_of()`` gives the client (made on first need).

    With ``abstract_ok`` (``lower``), a ``jax.ShapeDtypeStruct`` stands for
    an array of its shape and dtype, as in jax's AOT API; a call needs data.
    """
    specs: list[Any] = []
    for i, x in enumerate(leaves):
        t = type(x)
        if t is Buffer or t is BufferPromise:
            buf = x if t is Buffer else x.buffer()
            shape, dtype = buf._meta or buf._metadata()
            wanted = jax_types.canonical(dtype)
            if wanted != dtype:  # a 64-bit Buffer with x64 off: narrowed, as jax would
                buf = convert_on_device(client_of(), _checked(buf, client_of(), i), wanted)
            leaves[i] = buf
            specs.append((shape, wanted))
        elif t in _SCALARS:
            specs.append(t)  # weakly typed: the value is not part of the key
        elif isinstance(x, (np.ndarray, np.generic)):  # memmap, matrix: as their data
            refuse_masked(x, f"pjrt_py.jit argument {i}")
            x = np.asarray(x)
            if not x.dtype.isnative:  # jax's own message depends on the function
                raise TypeError(
                    f"pjrt_py.jit argument {i} is {x.dtype.str}, not in the machine's byte "
                    "order, which jax cannot trace: convert it, e.g. "
                    "x.astype(x.dtype.newbyteorder('='))"
                )
            dtype = jax_types.canonical(x.dtype)
            if dtype != x.dtype:
                x = x.astype(dtype)
            leaves[i] = x
            specs.append((x.shape, x.dtype))
        elif t.__name__ == "ShapeDtypeStruct" and t.__module__.startswith("jax"):
            # Before the checks below, which would read it as an array: a
            # key's or an int4's struct was refused, or lowered as object.
            if not abstract_ok:
                raise TypeError(
                    f"leaf {i} is a jax.ShapeDtypeStruct: it describes an argument for "
                    "lower(), a call needs its data"
                )
            shape = tuple(x.shape)
            if jax_types.is_key_dtype(x.dtype):  # as a key array's spec (below)
                specs.append((shape, x.dtype))
                continue
            dtype = jax_types.canonical(np.dtype(x.dtype))
            specs.append((shape, dtype, True) if x.weak_type else (shape, dtype))
        elif jax_types.is_tracer(x):
            raise TypeError(
                f"pjrt_py.jit argument {i} is a jax tracer: a pjrt_py.jit function runs on "
                "pjrt_py's client and cannot be transformed by jax (grad, vmap, jax.jit); "
                "apply the transformation inside it, e.g. pjrt_py.jit(jax.grad(f))"
            )
        elif isinstance(x, _SCALARS):  # IntEnum, a float subclass: its base type's weak scalar
            base: Any = next(b for b in _SCALARS if isinstance(x, b))
            leaves[i] = base(x)
            specs.append(base)
        elif jax_types.without_dlpack(x):  # int4 & co: no DLPack code, so a copy
            leaves[i] = x = np.asarray(x)
            specs.append((x.shape, x.dtype))
        elif jax_types.is_key(x):  # typed PRNG keys: the program takes their data
            leaves[i] = Foreign(jax_types.key_data(x), client_of())
            specs.append((x.shape, x.dtype))
        elif is_foreign(x):  # jax, torch, ...: taken through DLPack
            weak = jax_types.is_weak(x)  # traced weak, as jax traces it
            foreign = Foreign(x, client_of())
            dtype = jax_types.canonical(foreign.dtype)
            if dtype != foreign.dtype:  # as JAX would: narrowed, so copied
                leaves[i] = narrowed(client_of(), foreign, dtype)
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


def committed_device(leaves: list[Any], client: Any) -> Any:
    """The device a call runs on, as jax.jit picks it: the one device its
    Buffers are on (None for the client's default device, or no Buffer).
    Buffers on several devices are refused, as jax refuses arrays committed
    to different devices; numpy and other arguments follow the Buffers."""
    devices = {}
    for x in leaves:
        if type(x) is Buffer and x.client is client and not x.is_deleted:
            device = x.device  # others: execute's checks say what is wrong
            devices[id(device)] = device
    if len(devices) > 1:
        where = ", ".join(sorted(str(d.id) for d in devices.values()))
        raise ValueError(
            f"pjrt_py.jit arguments are Buffers on several devices ({where}): copy them "
            "to one device with copy_to_device (jax.jit refuses such arrays too)"
        )
    device = next(iter(devices.values()), None)
    return None if device is None or device == client.default_device else device


def _meta(x: Any) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """(shape, dtype) of a Buffer or an array."""
    if isinstance(x, Buffer):
        return x._metadata()
    return x.shape, x.dtype


def check_finite(name: str, outputs: Sequence[Any], nans: bool, infs: bool) -> None:
    """``FloatingPointError`` for a NaN (``jax_debug_nans``) or an inf
    (``jax_debug_infs``) in a floating output Buffer, as jax.jit raises it
    (waiting for the outputs, as jax does with these set)."""
    for b in outputs:
        if not isinstance(b, Buffer) or not (b.dtype.kind == "c" or is_floating(b.dtype)):
            continue
        values = b.to_numpy()
        if nans and np.isnan(values).any():
            raise FloatingPointError(f"invalid value (nan) encountered in pjrt_py.jit({name})")
        if infs and np.isinf(values).any():
            raise FloatingPointError(f"invalid value (inf) encountered in pjrt_py.jit({name})")
