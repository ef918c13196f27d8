"""Small programs pjrt_py runs on a buffer's own device, for work the plugin's
copy calls do not do.

- ``convert_on_device``: a dtype conversion (``pjrt_py.jit`` narrows a 64-bit
  Buffer this way when x64 is off, as jax does).
- ``copy_on_device``: a copy of a buffer to where it already is, for plugins
  that refuse ``PJRT_Buffer_CopyToDevice`` / ``CopyToMemory`` to the buffer's
  own device or memory. The CPU builds make such a copy themselves; XLA's GPU
  client has refused it ("cannot accept the same source and destination
  devices"), which would leave ``copy.copy(buf)``, ``copy_to_device`` of the
  buffer's own device and DLPack's ``copy=True`` without a way on a GPU. jax
  copies an array the same way (a compiled copy). The program returns its
  parameter: a result never aliases an argument that is not donated, so XLA
  writes a new buffer.

Both compile through the client, so each (shape, dtype) is compiled once and
then comes from its compile cache; both dispatch without waiting.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.buffer import Buffer
from ..runtime.dtypes import MLIR_NAMES
from ..runtime.promise import BufferPromise

_MLIR = {dtype: name for name, dtype in MLIR_NAMES.items()}  # numpy dtype -> MLIR element


def _tensor(shape: tuple[int, ...], dtype: np.dtype[Any]) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + _MLIR[np.dtype(dtype)] + ">"


def convert_on_device(client: Any, source: Buffer, dtype: np.dtype[Any]) -> Buffer:
    """``source`` converted to ``dtype`` by a program on its own device,
    dispatched without waiting (the result may still be computing)."""
    given, wanted = _tensor(source.shape, source.dtype), _tensor(source.shape, dtype)
    convert = client.compile(
        f"func.func @main(%x: {given}) -> {wanted} {{\n"
        f"  %y = stablehlo.convert %x : ({given}) -> {wanted}\n  return %y : {wanted}\n}}",
        device=source.device,
    )
    result: Buffer = convert.execute_async(source).buffer()
    return result


def copy_on_device(client: Any, source: Buffer) -> BufferPromise:
    """A new buffer with ``source``'s data on its device, by a program; the
    promise of it, dispatched without waiting. Only a buffer in its device's
    default memory can be an argument (anything else raises)."""
    kind = _tensor(source.shape, source.dtype)
    identity = client.compile(
        f"func.func @main(%x: {kind}) -> {kind} {{\n  return %x : {kind}\n}}",
        device=source.device,
    )
    promise: BufferPromise = identity.execute_async(source)
    return promise
