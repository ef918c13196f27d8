"""Foreign arrays: DLPack producers becoming Buffers.

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

import contextlib
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from ..runtime.buffer import Buffer, host_to_device
from ..runtime.dtypes import PACKED, pjrt_type
from ..runtime.promise import BufferPromise
from .dlpack import (
    _PLATFORM_DEVICE,
    CPU,
    HOST_DEVICES,
    VERSION,
    VIEW_ALIGNMENT,
    _check_copy,
    numpy_dtype,
)
from .jax_types import without_dlpack

if TYPE_CHECKING:
    from ..runtime.client import RuntimeClient as _Client
    from ..runtime.device import Device


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
    name = type(x).__name__
    try:
        answer = method()
    except Exception as e:  # the producer's own reason, unless it is a deleted array
        deleted = getattr(x, "is_deleted", None)
        if callable(deleted) and deleted() is True:  # jax.Array.delete()
            raise BufferError(f"the {name} has been deleted") from None
        raise BufferError(f"{name}.__dlpack_device__() raised {type(e).__name__}: {e}") from e
    try:
        kind, device_id = answer
        return operator.index(kind), operator.index(device_id)
    except (TypeError, ValueError):
        raise BufferError(
            f"{name}.__dlpack_device__() must return (device type, id), not {answer!r:.80}"
        ) from None


def capsule_device(x: Any) -> tuple[int, int] | None:
    """A raw DLPack capsule's (device type, id), read without taking its
    tensor; None for anything else."""
    if type(x).__name__ != "PyCapsule":
        return None
    where: tuple[int, int] | None = _core.dlpack_capsule_device(x)
    return where


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


# XLA's GPU programs need their parameters this aligned (kEntryParameterAlignBytes).
GPU_PARAMETER_ALIGNMENT = 16


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
    with _on_producers_device(x):
        try:
            capsule = method(max_version=VERSION, **kwargs)
        except TypeError:  # a producer older than DLPack 1.0 takes no max_version
            capsule = method(**kwargs)
    return _core.dlpack_unpack(capsule)


def _on_producers_device(x: Any) -> Any:
    """torch's ``__dlpack__(stream=s)`` orders ``s`` after torch's current
    stream of its *current* device, not of the tensor's: for a tensor on
    cuda:1 while cuda:0 is current, the consumer's stream would not wait for
    the kernel that wrote it. Made current for the call, the tensor's device
    is the one whose work is waited for (found by reading torch's
    ``Tensor.__dlpack__``; jax's import has the same gap)."""
    if type(x).__module__.startswith("torch") and getattr(x, "is_cuda", False) is True:
        import torch  # noqa: PLC0415  (loaded: x is its tensor)

        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


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
    if platform != CPU and tensor.data % GPU_PARAMETER_ALIGNMENT:
        # XLA's GPU programs check their parameters' alignment at every run:
        # such a view would be made, then fail every execution that used it.
        return (
            f"its data at {tensor.data:#x} is not {GPU_PARAMETER_ALIGNMENT}-byte aligned, "
            "as XLA's GPU programs need their parameters"
        )
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
    if tensor.device[0] not in HOST_DEVICES:
        return _place_device_tensor(client, foreign, code, target, copy)
    reason = "copy=True" if copy else _why_not_view(client, tensor, target)
    if reason is None:
        meta = _core.intern_meta((foreign.shape, dtype))
        return client._view(tensor, code, target._addr, meta, 0)
    if copy is False:
        raise BufferError(f"cannot use a {foreign.source} without a copy (copy=False): {reason}")
    if 0 in foreign.shape:  # nothing to read: a new empty buffer
        return host_to_device(client, np.empty(foreign.shape, dtype), target, False).buffer()
    # A copy from host memory: a numpy array over the producer's memory keeps
    # the tensor alive until PJRT has read it.
    promise: BufferPromise = host_to_device(client, tensor.as_array(dtype), target, False)
    return promise.buffer()


def _place_device_tensor(
    client: _Client, foreign: Foreign, code: int, target: Device, copy: bool | None
) -> Buffer:
    """A tensor in a device's memory: a view on the device that holds it, then,
    for ``copy=True`` or another target device, a copy made on the devices.

    Decision: as jax's ``from_dlpack`` does, a copy of device memory is a
    view first and a device copy of that view (the plugin's copy, or an
    identity program where it refuses one to the same device); the view is
    kept until the copy is done. A tensor that cannot be viewed (strided,
    misaligned, empty, or not on this client's devices) is refused: pjrt_py
    copies from host memory only, so the producer has to make it compact.
    """
    tensor = foreign.tensor
    held_on = _device_with_hardware_id(client, tensor.device[1]) or target
    reason = _why_not_view(client, tensor, held_on)
    meta = _core.intern_meta((foreign.shape, foreign.dtype))
    if reason is None and held_on == target and not copy:
        # The stream the producer ordered its writes on (0: none to order on).
        return client._view(tensor, code, target._addr, meta, foreign.stream or 0)
    if copy is False:
        why = reason or f"its memory is on {held_on}, not on {target}"
        raise BufferError(f"cannot use a {foreign.source} without a copy (copy=False): {why}")
    if 0 in foreign.shape:  # nothing to read: a new empty buffer
        empty = np.empty(foreign.shape, foreign.dtype)
        return host_to_device(client, empty, target, False).buffer()
    if reason is not None:
        raise BufferError(
            f"cannot take a {foreign.source} from DLPack device type {tensor.device[0]} "
            f"({reason}), and pjrt_py copies only from host memory: pass a compact, "
            f"{GPU_PARAMETER_ALIGNMENT}-byte aligned tensor (torch: t.contiguous().clone()) "
            "or move it to the host"
        )
    view = client._view(tensor, code, held_on._addr, meta, foreign.stream or 0)
    promise = view.copy_to_device_async(target)

    def keep_the_view_until_done(_done: object, view: Buffer = view) -> None:
        del view  # held by this function until the copy is done

    promise.add_done_callback(keep_the_view_until_done)
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
            and x.dtype not in PACKED  # the device packs them, numpy gives each a byte
        )
        if copy is False and not viewable:
            why = f"the device packs {x.dtype}, " if x.dtype in PACKED else ""
            raise BufferError(
                f"cannot use this {x.dtype} array without a copy (copy=False): {why}only a "
                f"non-empty, {VIEW_ALIGNMENT}-byte aligned C-contiguous array of a type numpy and "
                "the device store alike, on a CPU client, is used in place"
            )
        return host_to_device(client, x, device, viewable and not copy).buffer()
    if without_dlpack(x):  # a jax int4 & co: jax exports no DLPack for them
        producer_device(x)  # a deleted array says so, as for any other dtype
        if copy is False:
            raise BufferError(
                f"cannot use a jax {x.dtype} array without a copy (copy=False): DLPack has no "
                "code for it, so it is copied through numpy"
            )
        return host_to_device(client, np.asarray(x), device, False).buffer()
    return place(client, Foreign(x, client), device, copy)


def is_foreign(x: Any) -> bool:
    """Whether an argument is another framework's array (a DLPack producer)."""
    return hasattr(type(x), "__dlpack__") and not isinstance(x, (np.ndarray, np.generic, Buffer))


__all__ = [
    "Foreign",
    "capsule_device",
    "import_dlpack",
    "is_foreign",
    "place",
    "producer_device",
    "take",
]
