"""Argument checks for the calls the native dispatch path does not take.

Every call is checked before anything reaches the plugin (which would
otherwise reinterpret a same-sized buffer of another dtype without a word):
a wrong count, shape or dtype raises ``TypeError`` naming the parameter,
a dead or foreign buffer ``ValueError``. Host values (numpy arrays, Python
scalars) become buffers on the call's device only once every argument passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .buffer import Buffer
from .program import ArgSpec, mismatch_message
from .promise import BufferPromise

if TYPE_CHECKING:
    from .device import Device

    class _Client(Protocol):
        def buffer_async(self, value: Any, device: Device | None = None) -> BufferPromise: ...

    class _Executable(Protocol):  # what the checks read of an Executable
        _signature: list[ArgSpec] | None

        @property
        def name(self) -> str: ...
        @property
        def client(self) -> _Client: ...


_PY_SCALARS = (bool, int, float, complex)


def _resolve(exe: _Executable, arg: Any, index: int) -> Any:
    """A Buffer of ours, or a numpy array to transfer, for one argument."""
    if isinstance(arg, BufferPromise):
        arg = arg.buffer()
    if isinstance(arg, Buffer):
        if arg.client is not exe.client:
            raise ValueError(f"argument {index}: buffer belongs to another client")
        try:
            arg._metadata()  # raises if the buffer is dead
        except ValueError as e:
            raise ValueError(f"argument {index}: {e}") from None
        return arg
    if isinstance(arg, _PY_SCALARS):
        spec = exe._signature[index] if exe._signature else None
        if spec is not None and spec.dtype is not None:
            return np.asarray(arg, dtype=spec.dtype)  # weakly typed, like JAX
        return np.asarray(arg)
    if isinstance(arg, (np.ndarray, np.generic)):
        return np.asarray(arg)
    raise TypeError(
        f"argument {index}: expected a Buffer, a promise of one, or a numpy "
        f"array/scalar, got {type(arg).__name__}"
    )


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
    if where:
        # Several devices: a buffer on the wrong one must be refused here.
        # The plugin would reject it only after launching the devices before
        # it, which then wait forever in their first collective.
        for i, r in enumerate(resolved):
            if isinstance(r, Buffer) and r.device != device:
                raise ValueError(
                    f"{exe.name}: argument {i}{where} is on {r.device}, not {device} "
                    f"(copy it with copy_to_device)"
                )
    return [
        r if isinstance(r, Buffer) else exe.client.buffer_async(r, device).buffer()
        for r in resolved
    ]


def non_donatable_indices(
    donated: Sequence[int], rows: list[list[Buffer]], refused: Iterable[int] | None
) -> list[int]:
    """Parameter indices the plugin must not donate in this call.

    The caller's ``non_donatable``, plus any donated parameter given a buffer
    whose memory the host still owns (zero-copy, or staged): donating it
    would hand host memory to the program's output.
    """
    n = len(rows[0]) if rows else 0
    indices = set()
    for i in refused or ():
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
            raise ValueError(f"non_donatable: {i!r} is not a parameter index in [0, {n})")
        indices.add(int(i))
    for i in donated:
        if i not in indices and any(row[i]._host_aliased for row in rows):
            indices.add(i)
    return sorted(indices)
