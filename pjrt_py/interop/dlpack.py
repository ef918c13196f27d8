"""DLPack: exchanging arrays with numpy, jax, torch and any other producer.

Export (``Buffer.__dlpack__``, the Python array API protocol). The consumer
gets the buffer's own memory: no copy. On the host, pjrt_py waits until the
buffer's data is there before handing out the pointer, so the consumer never
reads a half-written result. On a GPU it follows the protocol's streams
instead: the consumer's ``stream`` (``None`` is CUDA's legacy default stream,
``-1`` asks for no synchronisation, ``0`` is refused as ambiguous on CUDA) is
made to wait for the buffer on the device, through the plugin's stream
extension (``native/stream.c``), and the host does not wait. A plugin without
that extension gets the host wait. While a consumer holds the tensor, the
buffer keeps a PJRT external reference: ``delete()`` makes the Buffer unusable
at once but frees the memory only when the last consumer lets go, and
donating it to an execution does not donate (the program copies). A versioned
(DLPack 1.x) tensor is marked read-only: PJRT buffers are immutable, and a
consumer that honours the flag (numpy) refuses to write. One that ignores it
can write into the buffer, changing what later executions read; see
``docs/interop.md``.

Importing is ``pjrt_py.interop.foreign``'s; handing buffers to torch and jax
is ``pjrt_py.interop.frameworks``'s.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from .. import _core
from ..runtime.buffer import ZERO_COPY_ALIGNMENT, Buffer
from ..runtime.dtypes import pjrt_type

if TYPE_CHECKING:
    pass


# DLPack device types (DLDeviceType).
CPU, CUDA, CUDA_HOST, ROCM, ROCM_HOST, CUDA_MANAGED = 1, 2, 3, 10, 11, 13
HOST_DEVICES = frozenset({CPU, CUDA_HOST, ROCM_HOST, CUDA_MANAGED})  # memory the CPU reads
_PLATFORM_DEVICE = {"cpu": CPU, "cuda": CUDA, "gpu": CUDA, "rocm": ROCM}
GPU_PLATFORM_OF = {CUDA: "cuda", ROCM: "rocm"}  # a device type's client platform

# What pjrt_py writes: DLPack 1.1 (the first with float8 type codes).
VERSION = (1, 1)
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2

# numpy dtype <-> DLPack (type code, bits), from the DLPack specification.
_CODES: list[tuple[Any, tuple[int, int]]] = [
    (np.bool_, (6, 8)),
    (np.int8, (0, 8)),
    (np.int16, (0, 16)),
    (np.int32, (0, 32)),
    (np.int64, (0, 64)),
    (np.uint8, (1, 8)),
    (np.uint16, (1, 16)),
    (np.uint32, (1, 32)),
    (np.uint64, (1, 64)),
    (np.float16, (2, 16)),
    (np.float32, (2, 32)),
    (np.float64, (2, 64)),
    (ml_dtypes.bfloat16, (4, 16)),
    (np.complex64, (5, 64)),
    (np.complex128, (5, 128)),
    (ml_dtypes.float8_e3m4, (7, 8)),
    (ml_dtypes.float8_e4m3, (8, 8)),
    (ml_dtypes.float8_e4m3b11fnuz, (9, 8)),
    (ml_dtypes.float8_e4m3fn, (10, 8)),
    (ml_dtypes.float8_e4m3fnuz, (11, 8)),
    (ml_dtypes.float8_e5m2, (12, 8)),
    (ml_dtypes.float8_e5m2fnuz, (13, 8)),
    (ml_dtypes.float8_e8m0fnu, (14, 8)),
]
TO_DLPACK: dict[np.dtype[Any], tuple[int, int]] = {np.dtype(d): c for d, c in _CODES}
FROM_DLPACK: dict[tuple[int, int], np.dtype[Any]] = {c: np.dtype(d) for d, c in _CODES}
_FIRST_MINOR_WITH = {np.dtype(d): 1 for d, (code, _) in _CODES if code >= 7}  # float8: 1.1

# XLA's CPU client views only memory this aligned (PJRT says so otherwise):
# the same minimum as a zero-copy host buffer.
VIEW_ALIGNMENT = ZERO_COPY_ALIGNMENT


# ---- export ---------------------------------------------------------------------


def dlpack_device(buffer: Buffer) -> tuple[int, int]:
    """``Buffer.__dlpack_device__``: (device type, id). A CPU buffer is (1, 0)."""
    platform = buffer.client.platform_name
    kind = _PLATFORM_DEVICE.get(platform)
    if kind is None:
        raise BufferError(f"pjrt_py cannot describe a {platform!r} buffer to DLPack")
    if kind == CPU:
        return CPU, 0
    where = buffer.memory  # None where the plugin cannot say: its default, device memory
    memory = "device" if where is None else where.kind
    if memory == "pinned_host":
        return (CUDA_HOST if kind == CUDA else ROCM_HOST), 0
    if memory == "unpinned_host":  # ordinary host memory, on a GPU client too
        return CPU, 0
    if memory != "device":
        raise BufferError(f"pjrt_py cannot describe a buffer in {memory!r} memory to DLPack")
    return kind, buffer.device.local_hardware_id


def _version(max_version: Any) -> tuple[int, int] | None:
    if max_version is None:
        return None
    try:
        major, minor = (operator.index(v) for v in max_version)
    except (TypeError, ValueError):
        raise TypeError(f"max_version must be a (major, minor) pair, got {max_version!r}") from None
    return major, minor


def _check_copy(copy: Any) -> None:
    if copy is not None and not isinstance(copy, bool):
        raise TypeError(f"copy must be True, False or None, got {copy!r}")


def export(
    buffer: Buffer,
    *,
    stream: Any = None,
    max_version: Any = None,
    dl_device: Any = None,
    copy: Any = None,
) -> Any:
    """``Buffer.__dlpack__``: a DLPack capsule of ``buffer`` (see the module doc)."""
    _check_copy(copy)
    version = _version(max_version)
    versioned = version is not None and version[0] >= 1
    own = dlpack_device(buffer)
    if dl_device is not None and tuple(dl_device) != own:
        if tuple(dl_device) != (CPU, 0) or copy is False:
            raise BufferError(
                f"cannot export a buffer on DLPack device {own} to {tuple(dl_device)}"
                + (" without a copy (copy=False)" if copy is False else "")
            )
        return _host_copy(buffer, version)
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int)):
        raise TypeError(f"stream must be an int or None, got {type(stream).__name__}")
    if own[0] in HOST_DEVICES and stream not in (None, -1):
        raise BufferError(f"stream must be None for a CPU buffer, got {stream!r}")
    dtype = buffer.dtype
    code = TO_DLPACK.get(dtype)
    if code is None:
        raise TypeError(f"dtype {dtype} has no DLPack type code")
    if versioned and version is not None and version[1] < _FIRST_MINOR_WITH.get(dtype, 0):
        raise TypeError(
            f"dtype {dtype} has no type code in DLPack {version[0]}.{version[1]}, the newest "
            f"the consumer reads (float8 codes are DLPack 1.1)"
        )
    flags = FLAG_READ_ONLY
    if copy:
        buffer = buffer.copy_to_device(buffer.device)  # memory no one else sees
        flags = FLAG_IS_COPIED
    if not buffer._dlpack_layout_ok():
        if copy is False:
            raise BufferError(
                "the buffer's on-device layout is not dense row-major, so it cannot be lent "
                "without a copy (copy=False)"
            )
        return _host_copy(buffer, version)
    ordered = own[0] not in HOST_DEVICES and order_for_consumer(buffer, own[0], stream)
    if not ordered:
        buffer.block_until_ready()  # raises the error of the work that made it
    return buffer._dlpack(code[0], code[1], own[0], own[1], versioned, flags, ordered)


def host_view(buffer: Buffer, dtype: Any = None) -> np.ndarray[Any, Any]:
    """``np.asarray(buffer, copy=False)``: a read-only view of the buffer's memory.

    numpy 2's ``copy=False`` means a view or ``ValueError``, never a silent
    copy (``jax.Array`` behaves the same on CPU). The view is lent like any
    DLPack export: it waits for the data, and ``delete()`` frees the memory
    only when the view is gone. Memory the host cannot read in place (a GPU's),
    a layout that is not dense row-major, and a ``dtype`` other than the
    buffer's all need a copy, so they are a ``ValueError``; ``np.asarray``
    without ``copy=False`` makes that copy.
    """
    own = buffer.dtype
    if dtype is not None and np.dtype(dtype) != own:
        raise ValueError(
            f"a {own} buffer cannot be viewed as {np.dtype(dtype)} without a copy "
            "(copy=False); np.asarray(buffer, dtype) copies"
        )
    try:
        kind = dlpack_device(buffer)[0]
        if kind not in HOST_DEVICES:
            raise BufferError(f"its memory is on a device (DLPack device type {kind})")
        capsule = export(buffer, max_version=VERSION, copy=False)
    except (BufferError, TypeError) as e:
        raise ValueError(
            f"this buffer cannot be viewed without a copy (copy=False): {e}; "
            "np.asarray(buffer) copies"
        ) from e
    view: np.ndarray[Any, Any] = _core.dlpack_unpack(capsule).as_array(own)
    return view


def consumer_stream(kind: int, stream: int | None) -> int:
    """The stream a consumer of device memory named, by the array API's rules.

    ``None`` is the legacy default stream on CUDA (1) and the default stream
    on ROCm (0); ``-1`` means no synchronisation; CUDA's ``0`` is ambiguous
    (legacy or per-thread default) and refused, as are ``1`` and ``2`` on
    ROCm, which has no such streams.
    """
    if stream is None:
        return 1 if kind == CUDA else 0
    if stream == 0 and kind == CUDA:
        raise BufferError(
            "stream=0 is ambiguous on CUDA: pass 1 (the legacy default stream), 2 (the "
            "per-thread default stream) or the consumer's stream handle"
        )
    if stream in (1, 2) and kind == ROCM:
        raise BufferError(
            f"stream={stream} names one of CUDA's default streams; ROCm has none such "
            "(the array API): pass 0 or None (the default stream) or a stream handle"
        )
    if stream < -1:
        raise BufferError(f"stream must be -1, None or a stream handle, got {stream}")
    return stream


def order_for_consumer(buffer: Buffer, kind: int, stream: int | None) -> bool:
    """Make the consumer's stream wait for ``buffer`` on the device; False if the
    plugin cannot (no stream extension), and the host must wait instead."""
    handle = consumer_stream(kind, stream)
    if buffer.is_ready():
        buffer.block_until_ready()  # a failed producer raises its own error here
    if handle == -1:
        return True  # the consumer synchronises itself
    return bool(buffer._wait_on_stream(handle))


def _host_copy(buffer: Buffer, version: tuple[int, int] | None) -> Any:
    """A capsule of a dense host copy (numpy's export, so numpy's dtypes only)."""
    array = buffer.to_numpy()
    try:
        if version is None:
            return array.__dlpack__()
        return array.__dlpack__(max_version=version, copy=True)
    except (BufferError, TypeError) as e:
        raise BufferError(f"cannot export a host copy of a {buffer.dtype} buffer: {e}") from None


# ---- the format's types ---------------------------------------------------------


_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque", 4: "bfloat", 5: "complex"}
_CODE_NAMES.update({6: "bool", 15: "float6_e2m3fn", 16: "float6_e3m2fn", 17: "float4_e2m1fn"})


def dlpack_type_name(code: int, bits: int, lanes: int = 1) -> str:
    """A readable name for a DLPack type (``complex32``, ``float4_e2m1fn``, ...)."""
    name = _CODE_NAMES.get(code)
    if name is None:
        found = [d for (c, _), d in zip(TO_DLPACK.values(), TO_DLPACK, strict=True) if c == code]
        name = str(found[0]) if found else f"type code {code}"
    elif code < 6:
        name += str(bits)
    return name if lanes == 1 else f"{name}x{lanes}"


def numpy_dtype(tensor: Any, source: str) -> np.dtype[Any]:
    code, bits, lanes = tensor.dtype
    dtype = FROM_DLPACK.get((code, bits))
    if dtype is None or lanes != 1:
        why = (
            "it is packed, and pjrt_py takes sub-byte types through numpy only "
            "(np.asarray(x) first)"
            if bits < 8 and lanes == 1
            else "it has no PJRT element type"
        )
        raise TypeError(
            f"pjrt_py cannot take a {source} of dtype {dlpack_type_name(code, bits, lanes)} "
            f"(DLPack code {code}, {bits} bits, {lanes} lanes): {why}"
        )
    return dtype


_core.set_hooks(dlpack=export, dlpack_device=dlpack_device, host_view=host_view)
# The dispatch fast path views foreign arguments itself (native/foreign.c).
_core.set_dlpack_codes([(pjrt_type(d), code, bits) for d, (code, bits) in TO_DLPACK.items()])

__all__ = [
    "consumer_stream",
    "dlpack_device",
    "dlpack_type_name",
    "export",
    "host_view",
    "numpy_dtype",
]
