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

Import (``import_dlpack``, behind ``pjrt_py.from_dlpack``,
``Client.from_dlpack`` and foreign arguments to ``execute``). A compact
row-major tensor becomes a Buffer viewing the producer's memory
(``PJRT_Client_CreateViewOfDeviceBuffer``) where the client can view it: on
CPU, host memory 64-byte aligned (what XLA's CPU client can view); on a GPU,
memory on the device of the same hardware id. For a GPU tensor pjrt_py asks
the plugin for the stream it tracks foreign memory on, passes it to the
producer's ``__dlpack__(stream=...)`` (so the producer orders its pending
writes before anything pjrt_py runs), and gives the same stream to the view.
A raw capsule carries no stream: its producer's work must be complete. PJRT
tells pjrt_py when it is done with the memory, and only then is the
producer's tensor released. Anything else is copied with ``copy=None`` and
refused with ``copy=False``. A view is never donated. The producer can still
write to memory it lent: a Buffer viewing it then changes too, and an
execution in flight may read a mix.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from . import _core
from .buffer import ZERO_COPY_ALIGNMENT, Buffer, host_to_device
from .dtypes import pjrt_type
from .errors import PjrtError
from .promise import BufferPromise

if TYPE_CHECKING:
    from .client import Client as _Client
    from .device import Device


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
    if buffer.memory.kind == "pinned_host":
        return (CUDA_HOST if kind == CUDA else ROCM_HOST), 0
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


def consumer_stream(kind: int, stream: int | None) -> int:
    """The stream a consumer of device memory named, by the array API's rules.

    ``None`` is the legacy default stream on CUDA (1) and the default stream
    on ROCm (0); ``-1`` means no synchronisation; CUDA's ``0`` is ambiguous
    (legacy or per-thread default) and refused.
    """
    if stream is None:
        return 1 if kind == CUDA else 0
    if stream == 0 and kind == CUDA:
        raise BufferError(
            "stream=0 is ambiguous on CUDA: pass 1 (the legacy default stream), 2 (the "
            "per-thread default stream) or the consumer's stream handle"
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


# ---- import ---------------------------------------------------------------------


class Foreign:
    """A producer's tensor, taken but not yet placed: an argument being checked.

    ``shape`` and ``dtype`` are what the signature check reads; ``place``
    makes the Buffer. Dropping it releases the producer's tensor.
    """

    __slots__ = ("dtype", "lazy", "shape", "source", "stream", "tensor")

    def __init__(self, x: Any, client: _Client | None = None) -> None:
        self.source = type(x).__name__
        self.lazy = lazy_bits(x)  # resolved by take() into a copy
        # On a GPU client, the stream the plugin tracks foreign memory on for
        # the producer's device: the producer orders its writes before it.
        self.stream = _import_stream(client, producer_device(x))
        self.tensor = take(x, self.stream)
        self.shape: tuple[int, ...] = tuple(self.tensor.shape)
        self.dtype = numpy_dtype(self.tensor, self.source)
        # What the plugin would abort on, from a producer that got it wrong.
        size = 1
        for d in self.shape:
            if d < 0:
                raise BufferError(f"a {self.source} with a negative dimension: {self.shape}")
            size *= d
        if size * self.dtype.itemsize >= 1 << 62:
            raise BufferError(f"a {self.source} of shape {self.shape} is too large to address")
        if size and not self.tensor.data:
            raise BufferError(f"a {self.source} of shape {self.shape} with no data (NULL)")


def producer_device(x: Any) -> tuple[int, int] | None:
    """``x.__dlpack_device__()`` as (device type, id); None for a capsule or a
    producer that does not say."""
    method = getattr(x, "__dlpack_device__", None)
    if method is None:
        return None
    try:
        kind, device_id = method()
        return operator.index(kind), operator.index(device_id)
    except (TypeError, ValueError):
        raise BufferError(
            f"{type(x).__name__}.__dlpack_device__() must return (device type, id)"
        ) from None


def _import_stream(client: _Client | None, where: tuple[int, int] | None) -> int | None:
    """The stream a GPU client takes ``where``'s memory on (None: no ordering to do)."""
    if client is None or where is None or where[0] in HOST_DEVICES:
        return None
    if _PLATFORM_DEVICE.get(client.platform_name) != where[0]:
        return None
    device = _device_with_hardware_id(client, where[1])
    if device is None:
        return None
    stream: int | None = client._ready_stream(device._addr)
    return stream


def _device_with_hardware_id(client: _Client, hardware_id: int) -> Device | None:
    return next((d for d in client.addressable_devices if d.local_hardware_id == hardware_id), None)


# torch's lazy bits: flags under which a tensor's memory does not hold its
# values (c.conj().imag is negated memory). DLPack cannot say so, and torch
# exports the memory as it is, so such a tensor is resolved into a copy first
# (a correct read; with copy=False, place() refuses it). Only torch's types
# are asked, as in native/foreign.c.
_LAZY_BITS = (("is_conj", "resolve_conj", "conjugation"), ("is_neg", "resolve_neg", "negation"))


def lazy_bits(x: Any) -> list[str]:
    """The lazy bits set on a torch tensor (``["negation"]``, ...); [] for anything else."""
    if not type(x).__module__.startswith("torch"):
        return []
    return [name for test, _, name in _LAZY_BITS if getattr(x, test, None) and getattr(x, test)()]


def _resolve_lazy_bits(x: Any, method: Any) -> tuple[Any, Any]:
    """``x`` and its ``__dlpack__``, with torch's lazy bits resolved into a copy."""
    if not lazy_bits(x):
        return x, method
    for test, resolve, _ in _LAZY_BITS:
        if getattr(x, test)():
            x = getattr(x, resolve)()
    return x, x.__dlpack__


def take(x: Any, stream: int | None = None) -> Any:
    """The producer's DLPack tensor (a ``_core.DLPackTensor``), taken from ``x``.

    ``stream``: the consumer's stream for a producer in device memory. None
    asks for none, which for a CUDA producer means the legacy default stream
    (the array API's rule); host producers take no stream.
    """
    if type(x).__name__ == "PyCapsule":
        return _core.dlpack_unpack(x)
    method = getattr(x, "__dlpack__", None)
    if method is None:
        raise TypeError(f"{type(x).__name__} is not a DLPack producer (it has no __dlpack__)")
    kwargs = {} if stream is None else {"stream": stream}
    x, method = _resolve_lazy_bits(x, method)
    try:
        capsule = method(max_version=VERSION, **kwargs)
    except TypeError:  # a producer older than DLPack 1.0 takes no max_version
        capsule = method(**kwargs)
    return _core.dlpack_unpack(capsule)


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
        raise TypeError(
            f"pjrt_py cannot take a {source} of dtype {dlpack_type_name(code, bits, lanes)} "
            f"(DLPack code {code}, {bits} bits, {lanes} lanes): it has no PJRT element type"
        )
    return dtype


def _why_not_view(client: _Client, tensor: Any, target: Device) -> str | None:
    """Why the tensor cannot be viewed in place by ``client`` (None: it can)."""
    kind = tensor.device[0]
    platform = _PLATFORM_DEVICE.get(client.platform_name)
    if platform == CPU and kind not in HOST_DEVICES:
        return f"its memory is on DLPack device type {kind}, not the host"
    if platform != CPU and kind != platform:
        return f"its memory is on DLPack device type {kind}, not this {client.platform_name}"
    if platform != CPU and tensor.device[1] != target.local_hardware_id:
        return f"its memory is on device {tensor.device[1]}, not on {target}"
    shape, strides = tensor.shape, tensor.strides
    if 0 in shape:
        return "it is empty"
    if strides is not None:
        step = 1
        for size, stride in zip(reversed(shape), reversed(strides), strict=True):
            if size != 1 and stride != step:
                return f"its strides {strides} are not compact row-major"
            step *= size
    if platform == CPU and tensor.data % VIEW_ALIGNMENT:
        return f"its data at {tensor.data:#x} is not {VIEW_ALIGNMENT}-byte aligned"
    if not client.plugin.supports("PJRT_Client_CreateViewOfDeviceBuffer"):
        return "the plugin cannot view memory it does not own"
    return None


def place(client: _Client, foreign: Foreign, device: Device | None, copy: bool | None) -> Buffer:
    """The Buffer for a taken tensor: a view where possible, else a copy."""
    tensor, dtype = foreign.tensor, foreign.dtype
    code = pjrt_type(dtype)
    if device is None and tensor.device[0] not in HOST_DEVICES:
        device = _device_with_hardware_id(client, tensor.device[1])
    target = client._target(device)
    if copy is False and foreign.lazy:
        raise BufferError(
            f"cannot use a {foreign.source} without a copy (copy=False): its "
            f"{' and '.join(foreign.lazy)} bit is set, so its memory does not hold its values "
            "(resolve it first, e.g. tensor.resolve_neg())"
        )
    reason = "copy=True" if copy else _why_not_view(client, tensor, target)
    if reason is None:
        meta = _core.intern_meta((foreign.shape, dtype))
        # The stream the producer ordered its writes on (0: none to order on).
        return client._view(tensor, code, target._addr, meta, foreign.stream or 0)
    if copy is False:
        raise BufferError(f"cannot use a {foreign.source} without a copy (copy=False): {reason}")
    if tensor.device[0] not in HOST_DEVICES:
        raise BufferError(
            f"cannot copy a {foreign.source} from DLPack device type {tensor.device[0]} to "
            f"{client.platform_name}: move it to the host first ({reason})"
        )
    # A copy from host memory: a numpy array over the producer's memory keeps
    # the tensor alive until PJRT has read it.
    promise: BufferPromise = host_to_device(client, tensor.as_array(dtype), target, False)
    return promise.buffer()


def import_dlpack(client: _Client, x: Any, device: Device | None, copy: bool | None) -> Buffer:
    """``Client.from_dlpack``: a Buffer from a DLPack producer, a capsule, or a Buffer."""
    _check_copy(copy)
    if isinstance(x, BufferPromise):
        x = x.buffer()
    if isinstance(x, Buffer) and x.client is client:
        target = client._target(device)
        if copy or x.device != target:
            if copy is False:
                raise BufferError(f"the buffer is on {x.device}, not {target} (copy=False)")
            return x.copy_to_device(target)
        x._metadata()  # a deleted buffer raises here
        return x
    if isinstance(x, np.ndarray):
        # Taken directly: numpy cannot export ml_dtypes' types (bfloat16,
        # float8) through DLPack, and this needs no capsule.
        viewable = (
            client.platform_name == "cpu"
            and x.size > 0
            and x.flags.c_contiguous
            and x.ctypes.data % VIEW_ALIGNMENT == 0
        )
        if copy is False and not viewable:
            raise BufferError(
                f"cannot use this {x.dtype} array without a copy (copy=False): only a non-empty, "
                f"{VIEW_ALIGNMENT}-byte aligned C-contiguous array on a CPU client is used in place"
            )
        return host_to_device(client, x, device, viewable and not copy).buffer()
    return place(client, Foreign(x, client), device, copy)


def is_foreign(x: Any) -> bool:
    """Whether an argument is another framework's array (a DLPack producer)."""
    return hasattr(type(x), "__dlpack__") and not isinstance(x, (np.ndarray, np.generic, Buffer))


_core.set_hooks(dlpack=export, dlpack_device=dlpack_device)
# The dispatch fast path views foreign arguments itself (native/foreign.c).
_core.set_dlpack_codes([(pjrt_type(d), code, bits) for d, (code, bits) in TO_DLPACK.items()])

__all__ = [
    "Foreign",
    "consumer_stream",
    "dlpack_device",
    "export",
    "import_dlpack",
    "is_foreign",
    "place",
    "producer_device",
    "take",
]


# ---- handing results to other frameworks ------------------------------------------


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
        If torch cannot take the buffer through DLPack (its dtype, say).
    ImportError
        If torch is not installed.
    PjrtError
        If the work that makes the buffer failed (its own error).
    """
    import torch

    buffer = x.buffer() if isinstance(x, BufferPromise) else x
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
        buffer's memory (no copy).

    Raises
    ------
    TypeError
        If jax cannot take the buffer through DLPack (its dtype, say).
    ImportError
        If jax is not installed.
    PjrtError
        If the work that makes the buffer failed (its own error).
    """
    import jax
    import jax.numpy as jnp

    buffer = x.buffer() if isinstance(x, BufferPromise) else x
    fast = _jax_import()
    try:
        if fast is not None and dlpack_device(buffer)[0] == CPU:
            dtype = buffer.dtype
            if jax.dtypes.canonicalize_dtype(dtype) == dtype:
                return fast(buffer.__dlpack__(), _jax_cpu(), None, None, CPU)
        return jnp.from_dlpack(buffer)
    except PjrtError:
        raise  # the work that made the buffer failed: its own error
    except (BufferError, RuntimeError) as e:
        raise TypeError(f"jax cannot take a {buffer.dtype} buffer through DLPack: {e}") from e


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
