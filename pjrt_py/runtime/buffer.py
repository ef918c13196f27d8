"""Device buffers and host-to-device transfers.

``Buffer`` is native (``native/buffer.c``): it owns one ``PJRT_Buffer``
and frees it exactly once, never while a call is using it. ``delete()`` from
one thread while another uses the buffer makes it dead to Python at once and
frees the memory when that use ends.

The common transfer (a C-contiguous numpy array of a supported dtype, to the
default device) runs in C from ``Client.buffer_async``; this module handles
every other case and decides the copy semantics.

Copies and pickling follow ``jax.Array``: ``copy.copy`` / ``copy.deepcopy``
make a new buffer with the same data on the same device; ``pickle`` stores
the data and device id, and unpickling places the data with
``pjrt_py.default_client`` (on the device of that id if it has one; see
``client._unpickle_buffer``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .. import _core
from .._core import Buffer
from .capi import lib
from .device import resolve
from .dtypes import FROM_PJRT, PACKED, pjrt_type
from .errors import ScalarOverflowError, UnsupportedError
from .promise import BufferPromise

if TYPE_CHECKING:
    from .device import Device, Memory

    class _Client(Protocol):  # what host_to_device needs of a Client
        _cpu_fast_paths: bool

        @property
        def platform_name(self) -> str: ...

        def _target(self, device: Device | None) -> Device: ...
        def _from_host(
            self,
            array: Any,
            code: int,
            semantics: int,
            device: int,
            meta: Any,
            held: int,
            memory: int | None = None,
        ) -> Buffer: ...


MAX_RANK = 64
# CPU plugins alias host memory only when it is this aligned (XLA's minimum
# for CPU buffers); pjrt_py refuses zero-copy below it instead of silently
# copying.
ZERO_COPY_ALIGNMENT = 64
# From this size up, a copy to a CPU device is made by numpy into aligned
# memory that the plugin then aliases (zero-copy), instead of by the plugin.
# Measured on the xla-cpu-pjrt plugin (benchmarks/bandwidth.py, with a C
# baseline): up to 24 MiB both cost the same; from 32 MiB the plugin's own
# copy runs at a quarter of np.copy's speed. The staged memory is private to
# the buffer and freed with it, so copy semantics are unchanged. (The native
# fast path leaves arrays this large to this module: PJRT_PY_STAGED_COPY_BYTES.)
STAGED_COPY_BYTES = 32 << 20
# Up to this size, to_numpy_async copies a ready CPU buffer at once by
# reading the buffer's memory (pinned by an external reference) instead of
# asking the plugin, whose copy runs on a worker thread: waking that thread
# cost ~15 us, ten times the copy itself (benchmarks/small.py). Larger copies
# stay asynchronous; to_numpy, which waits anyway, reads directly at any
# size. (Used in native/buffer.c as PJRT_PY_DIRECT_READ_BYTES.)
DIRECT_READ_BYTES = 256 << 10

_COPY = lib.PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
_ZERO_COPY = lib.PJRT_HostBufferSemantics_kImmutableZeroCopy
# What _from_host's `held` says (host_to_device in native/host.c).
_A_COPY, _ALIAS_OF_CALLERS, _ALIAS_OF_OURS = 0, 1, 2


def intern_meta(meta: tuple[tuple[int, ...], np.dtype[Any]]) -> Any:
    """The one shared ``(shape, dtype)`` object equal to ``meta``.

    Executables check a call's arguments by comparing each buffer's metadata
    with the signature's, which is a pointer comparison when both are the
    shared object. Bounded, so a program fed ever-new shapes does not grow it
    without end.
    """
    return _core.intern_meta(meta)


def refuse_masked(value: Any, what: str = "value") -> None:
    """``ValueError`` for a numpy masked array: taking its data would drop
    the mask without a word (jax refuses them the same way)."""
    if isinstance(value, np.ma.MaskedArray):
        raise ValueError(
            f"{what}: numpy masked arrays are not taken, since the device would get their "
            "data without the mask; pass arr.filled(value) or arr.data"
        )


def host_to_device(
    client: _Client,
    value: Any,
    device: Device | None,
    zero_copy: bool,
    memory: Memory | str | None = None,
) -> BufferPromise:
    """Start a host-to-device transfer of a numpy array or scalar.

    ``memory``: a Memory of the target device, or one of its kinds; checked
    here, and the result's memory checked after (a plugin too old to read
    the field would otherwise place it in the default memory without a word).
    """
    if isinstance(value, (Buffer, BufferPromise)):
        raise TypeError("value is already a device buffer, not a host array")
    if not isinstance(zero_copy, bool):
        raise TypeError(f"zero_copy must be a bool, got {zero_copy!r}")
    refuse_masked(value)
    array = np.asarray(value)
    dtype = array.dtype
    if dtype.kind == "O" and isinstance(value, int) and not isinstance(value, bool):
        # numpy made an object array of it ("dtype object is not supported")
        raise ScalarOverflowError(f"{value} does not fit int64 or uint64")
    code = pjrt_type(dtype)
    if array.ndim > MAX_RANK:
        raise ValueError(f"arrays of rank {array.ndim} are not supported (max {MAX_RANK})")
    # How the buffer holds the memory: a copy, an alias of the caller's array
    # (not pjrt_py's memory: memory_watch does not count it), or an alias of
    # a staged copy pjrt_py made for it (counted). Aliases are never donated
    # (see docs/devices.md).
    if zero_copy:
        _check_zero_copy(client, array)
        semantics, held = _ZERO_COPY, _ALIAS_OF_CALLERS
    elif (
        array.nbytes >= STAGED_COPY_BYTES
        and client._cpu_fast_paths
        and dtype not in PACKED  # the plugin packs a copy of its own
        and not (memory is None and _core.staging_wanted(client, array.nbytes))
    ):
        array, semantics, held = _staged(array), _ZERO_COPY, _ALIAS_OF_OURS
    else:
        semantics, held = _COPY, _A_COPY
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
    target = client._target(device)
    place = None if memory is None else resolve(target, memory)
    # The table's dtype, not the caller's: interned metadata is shared by
    # every buffer of its shape and type, and a dtype carrying numpy
    # metadata (or uint64 spelled "L") became every later buffer's.
    meta = intern_meta((array.shape, FROM_PJRT[code]))
    # The native core keeps `array` referenced until PJRT is done with it:
    # at once for a copy, when the buffer is freed for an alias.
    buf = client._from_host(
        array, code, semantics, target._addr, meta, held, None if place is None else place._addr
    )
    if place is not None:
        got = buf.memory
        if got is not place:
            buf.delete()
            raise UnsupportedError(f"the plugin placed the buffer in {got!r}, not {place!r}")
    return BufferPromise((buf,))


# Staging copies a C-contiguous array this many bytes at a time. One large
# memcpy into the 64-byte aligned staging memory ran at a third of np.copy's
# speed when the source was aligned differently (a numpy array is at 16 mod
# 64): 124 ms against 41 ms for 256 MiB; in 4 MiB pieces it took 35 ms.
STAGE_CHUNK_BYTES = 4 << 20


def _staged(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A copy of ``array`` in fresh, aligned memory the plugin can alias."""
    staged = aligned_empty(array.shape, array.dtype)
    if not array.flags.c_contiguous:
        np.copyto(staged, array, casting="no")
        return staged
    src, dst = array.reshape(-1), staged.reshape(-1)
    step = max(1, STAGE_CHUNK_BYTES // array.itemsize)
    for start in range(0, src.size, step):
        np.copyto(dst[start : start + step], src[start : start + step], casting="no")
    return staged


def _check_zero_copy(client: _Client, array: np.ndarray[Any, Any]) -> None:
    if client.platform_name != "cpu":
        raise ValueError(f"zero_copy is only available on CPU, not {client.platform_name!r}")
    if not array.flags.c_contiguous:
        raise ValueError("zero_copy needs a C-contiguous array")
    if array.dtype in PACKED:
        raise ValueError(
            f"zero_copy cannot alias a {array.dtype} array: the device packs {array.dtype}, "
            "numpy stores one per byte; use copy semantics"
        )
    address = array.__array_interface__["data"][0]
    if address % ZERO_COPY_ALIGNMENT:
        raise ValueError(
            f"zero_copy needs data aligned to {ZERO_COPY_ALIGNMENT} bytes (this array is at "
            f"{address:#x}); use pjrt_py.aligned_empty() or copy semantics"
        )


def aligned_empty(
    shape: Any, dtype: Any = np.float32, alignment: int = ZERO_COPY_ALIGNMENT
) -> np.ndarray[Any, Any]:
    """An uninitialised C-contiguous array whose data is ``alignment``-aligned.

    Fill it and pass it to ``buffer(..., zero_copy=True)``, which on CPU needs
    data aligned to ``ZERO_COPY_ALIGNMENT`` bytes.

    Parameters
    ----------
    shape : int or sequence of int
        The array's shape; a tuple is used as is.
    dtype : data-type
        Anything ``np.dtype`` takes (default ``float32``).
    alignment : int
        The data's address is a multiple of this many bytes (default 64).

    Returns
    -------
    numpy.ndarray
        A view into a slightly larger ``uint8`` array that owns the memory.
    """
    dtype = np.dtype(dtype)
    dims = tuple(int(d) for d in np.atleast_1d(shape)) if not isinstance(shape, tuple) else shape
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    # An empty array keeps one element's bytes: numpy moves the data pointer of
    # a zero-byte view, and an empty array's address is checked like any other.
    held = max(nbytes, dtype.itemsize)
    raw = np.empty(held + alignment, np.uint8)
    offset = -raw.ctypes.data % alignment
    flat = raw[offset : offset + held].view(dtype)[: nbytes // max(dtype.itemsize, 1)]
    out: np.ndarray[Any, Any] = flat.reshape(dims)
    return out


__all__ = ["Buffer", "aligned_empty", "host_to_device", "intern_meta"]
