"""Handing buffers to torch and jax: ``to_torch`` and ``to_jax``, zero-copy where memory allows."""

from __future__ import annotations

from typing import Any

from ..runtime.buffer import Buffer
from ..runtime.errors import PjrtError
from ..runtime.promise import BufferPromise
from . import dlpack  # noqa: F401  (installs Buffer.__dlpack__)
from .dlpack import CPU, GPU_PLATFORM_OF, HOST_DEVICES, TO_DLPACK, dlpack_device


def to_torch(x: Buffer | BufferPromise) -> Any:
    """A ``torch.Tensor`` sharing the buffer's memory on CPU (``torch.from_dlpack``).

    Parameters
    ----------
    x : Buffer or BufferPromise
        The buffer, or a promise of one buffer (DLPack export waits until its
        data is there).

    Returns
    -------
    torch.Tensor
        The tensor; on CPU it views the buffer's memory (no copy).

    Raises
    ------
    TypeError
        If ``x`` is not a Buffer or a promise of one, or torch cannot take
        the buffer through DLPack (its dtype, say).
    ImportError
        If torch is not installed.
    PjrtError
        If the work that makes the buffer failed (its own error).
    """
    buffer = _buffer_of(x, "to_torch")
    import torch

    try:
        return torch.utils.dlpack.from_dlpack(buffer)
    except PjrtError:
        raise  # the work that made the buffer failed: its own error
    except (BufferError, RuntimeError) as e:
        raise TypeError(f"torch cannot take a {buffer.dtype} buffer through DLPack: {e}") from e


def to_jax(x: Buffer | BufferPromise) -> Any:
    """A ``jax.Array`` sharing the buffer's memory on CPU.

    jax's own ``jax.numpy.from_dlpack`` also does this, at some 100 us a
    call on a small CPU machine; this goes to the jaxlib call underneath
    (some 13 us) where it has the signature pjrt_py knows, and the dtype is
    one jax keeps as is (with x64 off, jax narrows 64-bit types: that copy is
    left to jax).

    Parameters
    ----------
    x : Buffer or BufferPromise
        The buffer, or a promise of one buffer (DLPack export waits until its
        data is there).

    Returns
    -------
    jax.Array
        The array; for a CPU buffer, on jax's CPU device and viewing the
        buffer's memory (no copy). Sub-byte types (int4, uint4, int2,
        uint2, float4_e2m1fn), which pjrt_py gives DLPack no codes for, are
        copied through the host.

    Raises
    ------
    TypeError
        If ``x`` is not a Buffer or a promise of one, or jax cannot take the
        buffer through DLPack (its dtype, say).
    ImportError
        If jax is not installed.
    PjrtError
        If the work that makes the buffer failed (its own error).
    """
    buffer = _buffer_of(x, "to_jax")
    import jax
    import jax.numpy as jnp

    if buffer.dtype not in TO_DLPACK:  # int4 & co: DLPack has no code, so a copy
        return jax.device_put(buffer.to_numpy(), _jax_device(buffer))
    fast = _jax_import()
    try:
        if fast is not None and dlpack_device(buffer)[0] == CPU:
            dtype = buffer.dtype
            # jax narrows only 64-bit types (with x64 off); asking costs a third
            # of a microsecond, so the narrower ones are not asked about.
            if dtype.itemsize <= 4 or jax.dtypes.canonicalize_dtype(dtype) == dtype:
                return fast(buffer.__dlpack__(), _jax_cpu(), None, None, CPU)
        return jnp.from_dlpack(buffer)
    except PjrtError:
        raise  # the work that made the buffer failed: its own error
    except (BufferError, RuntimeError) as e:
        raise TypeError(f"jax cannot take a {buffer.dtype} buffer through DLPack: {e}") from e


def _buffer_of(x: Any, what: str) -> Buffer:
    """The Buffer ``x`` is or promises; TypeError for anything else."""
    if isinstance(x, BufferPromise):
        return x.buffer()
    if not isinstance(x, Buffer):
        raise TypeError(
            f"{what} takes a pjrt_py Buffer or a promise of one, not {type(x).__name__} "
            "(make one with client.buffer)"
        )
    return x


def _jax_device(buffer: Buffer) -> Any:
    """jax's device for the buffer's (jax's default where it has none such)."""
    import jax

    kind, index = dlpack_device(buffer)
    if kind in HOST_DEVICES:
        return _jax_cpu()
    platform = GPU_PLATFORM_OF.get(kind)
    try:
        found = [d for d in jax.devices(platform) if d.local_hardware_id == index]
    except RuntimeError:  # jax has no backend of that platform
        found = []
    return found[0] if found else None


_JAX_IMPORT: list[Any] = []


def _jax_import() -> Any:
    """jaxlib's DLPack import (device, stream, copy, device type), or None."""
    if not _JAX_IMPORT:
        found = None
        try:
            from jax._src.lib import _jax, jaxlib_extension_version  # type: ignore[attr-defined]

            if jaxlib_extension_version >= 467:
                found = _jax.dlpack_managed_tensor_to_buffer
        except (ImportError, AttributeError):
            pass
        _JAX_IMPORT.append(found)
    return _JAX_IMPORT[0]


def _jax_cpu() -> Any:
    import jax

    return jax.devices("cpu")[0]


__all__ = ["to_jax", "to_torch"]
