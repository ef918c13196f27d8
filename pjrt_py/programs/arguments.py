"""Argument checks for the calls the native dispatch path does not take.

Every call is checked before anything reaches the plugin (which would
otherwise reinterpret a same-sized buffer of another dtype without a word):
a wrong count, shape or dtype raises ``TypeError`` naming the parameter,
a dead or foreign buffer ``ValueError``. Host values (numpy arrays, Python
scalars) become buffers on the call's device only once every argument passed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..interop import foreign, jax_types
from ..runtime.buffer import Buffer, refuse_masked
from ..runtime.errors import PjrtError, ScalarOverflowError
from ..runtime.promise import BufferPromise
from .signature import ArgSpec, mismatch_message

if TYPE_CHECKING:
    from ..runtime.device import Device, Memory

    class _Client(Protocol):
        platform_name: str

        def buffer_async(
            self, value: Any, device: Device | None = None, *, memory: Memory | None = None
        ) -> BufferPromise: ...

    class _Executable(Protocol):  # what the checks read of an Executable
        _signature: list[ArgSpec] | None
        _parameter_memories: dict[int, Memory | None]

        @property
        def name(self) -> str: ...
        @property
        def client(self) -> _Client: ...


_PY_SCALARS = (bool, int, float, complex)


def own_buffer(arg: Buffer, client: Any, index: int) -> Buffer:
    """``arg``, checked to be a live Buffer of ``client`` (argument ``index``)."""
    if arg.client is not client:
        raise ValueError(f"argument {index}: buffer belongs to another client")
    try:
        arg._metadata()  # raises if the buffer is dead
    except ValueError as e:
        raise ValueError(f"argument {index}: {e}") from None
    return arg


def check_memory(buffer: Buffer, memory: Any, label: str) -> None:
    """ValueError where ``buffer`` is not in ``memory``, the one a program
    reads it from: no implicit copy between memories (docs/devices.md)."""
    if buffer.memory is not memory:
        raise ValueError(
            f"{label} is in {buffer.memory.kind!r} memory; the program reads it from "
            f"{memory.kind!r} memory (copy it with copy_to_memory({memory.kind!r}))"
        )


def _resolve(exe: _Executable, arg: Any, index: int) -> Any:
    """A Buffer of ours, a numpy array to transfer, or another framework's
    array taken through DLPack (placed once every argument passed), for one
    argument."""
    if isinstance(arg, BufferPromise):
        arg = arg.buffer()
    if isinstance(arg, Buffer):
        return own_buffer(arg, exe.client, index)
    # numpy scalars first: np.float64 and np.complex128 subclass Python's
    # float and complex, but are typed values that must match exactly.
    if isinstance(arg, (np.ndarray, np.generic)):
        refuse_masked(arg, f"argument {index}")
        return np.asarray(arg)  # a subclass (memmap, matrix) as its data
    if isinstance(arg, _PY_SCALARS):
        spec = exe._signature[index] if exe._signature else None
        if spec is not None and spec.dtype is not None:
            return weak_scalar(arg, spec.dtype, index)
        return np.asarray(arg)
    if isinstance(arg, foreign.Foreign):  # taken by pjrt_py.jit
        return arg
    if jax_types.without_dlpack(arg):  # int4 & co: no DLPack code, so a copy
        return np.asarray(arg)
    if jax_types.is_key(arg):  # a typed PRNG key: programs take its data, as jax's do
        return foreign.Foreign(jax_types.key_data(arg), exe.client)  # type: ignore[arg-type]
    if foreign.is_foreign(arg):
        try:
            return foreign.Foreign(arg, exe.client)  # type: ignore[arg-type]
        except (TypeError, BufferError) as e:
            raise type(e)(f"argument {index}: {e}") from None
    raise TypeError(
        f"argument {index}: expected a Buffer, a promise of one, a numpy "
        f"array/scalar or a DLPack producer (jax, torch, ...), got {type(arg).__name__}"
    )


# What each Python scalar type may be passed for (weak_scalar's rule).
_WEAK_FITS = {
    bool: "bool",
    int: "integer, floating and complex",
    float: "floating and complex",
    complex: "complex",
}


def weak_scalar(value: bool | int | float | complex, dtype: np.dtype[Any], index: int) -> Any:
    """A Python scalar as a parameter of ``dtype``, by jax's weak-type rules.

    A Python number takes the parameter's dtype only within its own kind: an
    int fits any number dtype, a float a floating or complex one, a complex
    only a complex one, a bool only bool. A value that would change (2.5 into
    an int, 300 into uint8, 0.5 into a bool, 2**200 into float32) is refused,
    never converted. A float rounds to its parameter's precision (1e300 into
    float32 is inf), as in jax.
    """
    kind = _kind(dtype)
    if isinstance(value, bool):
        allowed = kind == "b"
    elif isinstance(value, int):
        allowed = kind in "iufc"
        bounds = _int_range(dtype) if kind in "iu" else None
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            raise ScalarOverflowError(
                f"argument {index}: {value} does not fit the parameter's {dtype} "
                f"(range [{bounds[0]}, {bounds[1]}])"
            )
    elif isinstance(value, float):
        allowed = kind in "fc"
    else:
        allowed = kind == "c"
    if not allowed:
        kinds = _WEAK_FITS[type(value) if type(value) in _WEAK_FITS else complex]
        raise TypeError(
            f"argument {index}: a Python {type(value).__name__} ({value!r}) is not taken for "
            f"a {dtype} parameter: by jax's weak typing it fits {kinds} parameters only; "
            f"pass a numpy {dtype} value"
        )
    with np.errstate(over="ignore"):  # a float too large for its dtype is inf, as in jax
        if not isinstance(value, int) or kind not in "fc":
            return np.asarray(value, dtype=dtype)
        # An int into a float: jax raises OverflowError where it would not be finite.
        try:
            converted = np.asarray(value, dtype=dtype)
            fits = bool(np.isfinite(converted))
            why = f"it would be {converted.item()}"  # inf, or nan for a type without inf
        except (OverflowError, TypeError):  # past float64 (ml_dtypes raises TypeError)
            fits, why = False, f"{dtype} cannot take it"
    if not fits:
        raise ScalarOverflowError(
            f"argument {index}: {value} does not fit the parameter's {dtype} ({why})"
        )
    return converted


_ML_INT = re.compile(r"(u?)int(\d+)$")


def _kind(dtype: np.dtype[Any]) -> str:
    """numpy's kind letter, with ml_dtypes' types (kind ``V``) sorted into f / i / u."""
    if dtype.kind != "V":
        return str(dtype.kind)
    m = _ML_INT.match(dtype.name)
    if m:
        return "u" if m.group(1) else "i"
    return "f" if dtype.name.startswith(("bfloat", "float")) else "V"


def _int_range(dtype: np.dtype[Any]) -> tuple[int, int]:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    m = _ML_INT.match(dtype.name)
    assert m is not None
    bits = int(m.group(2))
    return (0, (1 << bits) - 1) if m.group(1) else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


def checked_row(
    exe: _Executable, args: Sequence[Any], device: Device, where: str = ""
) -> list[Buffer]:
    """Check one device's arguments and make them Buffers on ``device``.

    Everything is checked before the first transfer starts, so a rejected
    call sends nothing to the plugin. ``where`` names the device in messages
    when the program runs on several.
    """
    signature = exe._signature
    if signature is not None and len(args) != len(signature):
        raise TypeError(f"{exe.name} takes {len(signature)} argument(s){where}, {len(args)} given")
    resolved = [_resolve(exe, a, i) for i, a in enumerate(args)]
    if signature is not None:
        metas = [r._metadata() if isinstance(r, Buffer) else (r.shape, r.dtype) for r in resolved]
        message = mismatch_message(exe.name + where, signature, metas)
        if message:
            raise TypeError(message)
    # A buffer on another device is refused here: the plugin would refuse it
    # too, but on several devices only after launching the ones before it,
    # which then wait forever in their first collective.
    default = parameter_memory(exe, device)
    # Where each parameter is read from: a kind the program names (jax's host
    # offloading) or the default; None where not known (the plugin says).
    wants = [default] * len(resolved)
    for i, spec in enumerate(signature or []):
        if spec.memory_kind is not None:
            kinds = [m for m in device.memories if m.kind == spec.memory_kind]
            wants[i] = kinds[0] if kinds else None
    for i, (r, memory) in enumerate(zip(resolved, wants, strict=True)):
        if isinstance(r, Buffer) and r.device != device:
            raise ValueError(
                f"{exe.name}: argument {i}{where} is on {r.device}, not {device} "
                f"(copy it with copy_to_device)"
            )
        # Decision (docs/devices.md): no implicit copy between memories either,
        # as jax's compiled programs refuse an input of another memory kind.
        if isinstance(r, Buffer) and memory is not None:
            check_memory(r, memory, f"{exe.name}: argument {i}{where}")
    placed = [
        _place(exe, r, device, None if memory is default else memory)
        for r, memory in zip(resolved, wants, strict=True)
    ]
    if signature is not None and exe.client.platform_name == "cpu":
        pairs = enumerate(zip(placed, signature, strict=True))
        placed = [_laid_out(exe, b, spec, i) for i, (b, spec) in pairs]
    return placed


def parameter_memory(exe: _Executable, device: Device) -> Memory | None:
    """The memory ``exe`` reads its parameters from on ``device``, asked once.

    The device's default memory, for parameters with no ``mhlo.memory_kind``
    (``checked_row`` reads that kind's memory for the others). None where
    the plugin has no memory spaces.
    """
    memories = exe._parameter_memories
    if device._addr not in memories:
        try:
            memories[device._addr] = device.default_memory
        except PjrtError:  # UnsupportedError: a plugin without memory spaces
            memories[device._addr] = None
    return memories[device._addr]


def _laid_out(exe: _Executable, buf: Buffer, spec: ArgSpec, index: int) -> Buffer:
    """``buf`` in the layout the program reads parameter ``index`` in.

    PJRT runs a program on the bytes it is given: a buffer in another layout
    (a program's column-major output, say) is read as if it were in the
    compiled one, silently wrong. A CPU buffer the program wants row-major is
    copied into row-major; a parameter compiled for another explicit layout
    takes only a buffer already in it (the CPU builds do not lay out a host
    array in a requested layout reliably). ``"auto"`` is not checked.
    """
    want = spec.minor_to_major()
    if want is None:
        return buf
    got = buf._layout()
    if got is None or tuple(got) == want:
        return buf
    if spec.default_layout:
        return exe.client.buffer_async(buf.to_numpy(), buf.device).buffer()
    raise ValueError(
        f"argument {index}: the program reads it in layout {spec.layout} (minor to major), "
        f"the buffer is in {{{','.join(map(str, got))}}}"
    )


def _place(exe: _Executable, r: Any, device: Device, memory: Memory | None = None) -> Buffer:
    """``r`` as a Buffer on ``device``: host values go to ``memory`` (the default if None)."""
    if isinstance(r, Buffer):
        return r
    if isinstance(r, foreign.Foreign):  # zero-copy where the memory allows
        return foreign.place(exe.client, r, device, None)  # type: ignore[arg-type]
    if memory is not None:
        return exe.client.buffer_async(r, device, memory=memory).buffer()
    return exe.client.buffer_async(r, device).buffer()


def non_donatable_indices(
    donated: Sequence[int], rows: list[list[Buffer]], refused: Iterable[int] | None
) -> list[int]:
    """Parameter indices the plugin must not donate in this call.

    The caller's ``non_donatable``, plus any donated parameter given a buffer
    whose memory the host still owns (zero-copy, staged, or a DLPack view of
    another framework's array), or one lent right now (to a DLPack consumer,
    or read by a staged ``to_numpy_async``): donating it would hand memory
    someone else reads to the program's output.
    """
    n = len(rows[0]) if rows else 0
    if refused is None:
        refused = ()
    elif isinstance(refused, (int, np.integer, str, bytes)) or not isinstance(refused, Iterable):
        # non_donatable=0 once read as "none" (0 is falsy) and donated argument 0.
        raise TypeError(
            f"non_donatable takes a sequence of parameter indices (e.g. [0]), got {refused!r}"
        )
    indices = set()
    for i in refused:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
            raise ValueError(f"non_donatable: {i!r} is not a parameter index in [0, {n})")
        indices.add(int(i))
    for i in donated:
        if i not in indices and any(row[i]._host_aliased or row[i]._exports for row in rows):
            indices.add(i)
    for d, row in enumerate(rows):  # one buffer in two places, one of them donated
        for i in donated:
            if i in indices:
                continue
            twice = [j for j, b in enumerate(row) if j != i and b is row[i]]
            if twice:
                # The plugin refuses it on one device; fastatomstruct-xla-cpu
                # segfaulted on several; jax gets the plugin's INVALID_ARGUMENT.
                where = f" on device {d}" if len(rows) > 1 else ""
                raise ValueError(
                    f"argument {i} is donated, and the same buffer is also argument {twice[0]}"
                    f"{where}: a donated buffer can be passed once (pass a copy for the other)"
                )
    return sorted(indices)
