"""Device buffers and host transfers."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _runtime
from ._ffi import ffi, lib
from .dtypes import numpy_dtype, pjrt_type
from .errors import check, error_from_pjrt
from .promise import ArrayPromise, BufferPromise

if TYPE_CHECKING:
    from .client import Client
    from .device import Device

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
# the buffer and freed with it, so copy semantics are unchanged.
STAGED_COPY_BYTES = 32 << 20
# Up to this size, to_numpy_async copies a ready CPU buffer at once by a C
# helper reading the buffer's memory (pinned by an external reference)
# instead of asking the plugin, whose copy runs on a worker thread: waking
# that thread cost ~15 us, ten times the copy itself (benchmarks/small.py).
# Larger copies stay asynchronous; to_numpy, which waits anyway, reads
# directly at any size.
DIRECT_READ_BYTES = 256 << 10
_ANY_SIZE = 1 << 62
_direct_read_lock = threading.Lock()

_COPY = lib.PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
_ZERO_COPY = lib.PJRT_HostBufferSemantics_kImmutableZeroCopy


class Buffer:
    """An array on a device, owned by a :class:`~pjrt_py.Client`.

    Made by ``client.buffer`` / ``client.buffer_async`` or by executions.
    Shape, dtype and device are read from PJRT on first use.
    """

    # Kept to three slots: a Buffer is made for every output of every call.
    __slots__ = ("_ptr", "_client", "_meta", "__weakref__")

    _ptr: Any  # PJRT_Buffer*, None once deleted
    _client: Client
    _meta: tuple[tuple[int, ...], np.dtype[Any]] | None  # (shape, dtype), read lazily

    def __init__(self) -> None:
        raise TypeError("Buffers are made by Client.buffer() or by executing a program")

    # -- state ----------------------------------------------------------
    def _live(self) -> Any:
        ptr = self._ptr
        if ptr is None:
            raise ValueError(deleted_message(self))
        if self._client._closed:
            raise ValueError("buffer belongs to a closed client")
        return ptr

    @property
    def is_deleted(self) -> bool:
        return self._ptr is None

    def delete(self) -> None:
        """Free the device memory once pending work is done. Idempotent."""
        with _direct_read_lock:  # not while a direct read (below) uses it
            ptr, self._ptr = self._ptr, None
        if ptr is not None and not _runtime.state.finalizing:
            lib.pjrt_py_buffer_destroy(self._client._h, ptr)

    def __del__(self) -> None:
        ptr = getattr(self, "_ptr", None)
        if ptr is not None and not _state.finalizing:
            lib.pjrt_py_buffer_destroy(self._client._h, ptr)

    # -- metadata -------------------------------------------------------
    @property
    def client(self) -> Client:
        return self._client

    def _metadata(self) -> tuple[tuple[int, ...], np.dtype[Any]]:
        meta = self._meta
        if meta is None:
            # One C call: outputs of every execution come here on first use.
            ptr, api = self._live(), self._client._api
            dims, ndims, kind = ffi.new("int64_t[]", MAX_RANK), ffi.new("size_t*"), ffi.new("int*")
            error = lib.pjrt_py_buffer_meta(api, ptr, dims, MAX_RANK, ndims, kind)
            if error:
                raise error_from_pjrt(api, error)
            if ndims[0] > MAX_RANK:
                raise ValueError(f"buffer of rank {ndims[0]} (pjrt_py supports {MAX_RANK})")
            meta = (tuple(ffi.unpack(dims, ndims[0])), numpy_dtype(kind[0]))
            self._meta = meta
        return meta

    @property
    def shape(self) -> tuple[int, ...]:
        return self._metadata()[0]

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._metadata()[1]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def device(self) -> Device:
        args = self._client.plugin.invoke("PJRT_Buffer_Device", buffer=self._live())
        return self._client._device_for(args.device)

    def copy_to_device_async(self, device: Device) -> BufferPromise:
        """Start copying to another device of the same client; a promise at once.

        ``PJRT_Buffer_CopyToDevice``: the copy waits for this buffer's pending
        work on the device side, not on the host.
        """
        client = self._client
        target = client._target(device)
        args = client.plugin.invoke(
            "PJRT_Buffer_CopyToDevice", buffer=self._live(), dst_device=target._ptr
        )
        lib.pjrt_py_client_ref(client._h)  # the new buffer's reference
        return BufferPromise((wrap(client, args.dst_buffer, self._meta),))

    def copy_to_device(self, device: Device) -> Buffer:
        """Copy to another device of the same client, and wait until it is there."""
        result: Buffer = self.copy_to_device_async(device).value()
        return result

    def unsafe_pointer(self) -> int:
        """The buffer's device address as PJRT reports it (debugging only)."""
        args = self._client.plugin.invoke("PJRT_Buffer_UnsafePointer", buffer=self._live())
        return int(args.buffer_pointer)

    # -- readiness ------------------------------------------------------
    def _ready_event(self) -> Any:
        api = self._client._api
        event = ffi.new("PJRT_Event**")
        check(api, lib.pjrt_py_buffer_ready_event(api, self._live(), event))
        return event[0]

    def _promise(self) -> BufferPromise:
        return BufferPromise((self,))

    def is_ready(self) -> bool:
        """Whether the buffer's data is there (never blocks)."""
        return self._promise().is_ready()

    def block_until_ready(self) -> Buffer:
        """Wait until the data is there; raise the error of the work that made it."""
        self._promise().value()
        return self

    # -- device to host -------------------------------------------------
    def to_numpy_async(self) -> ArrayPromise:
        """Start copying to a new numpy array (dense, row-major); returns at once."""
        return self._copy_out(DIRECT_READ_BYTES)

    def _copy_out(self, direct_limit: int) -> ArrayPromise:
        ptr = self._live()
        api = self._client._api
        shape, dtype = self._metadata()
        array = np.empty(shape, dtype)
        if array.size == 0:
            return ArrayPromise(api, array, self, [])
        dst = ffi.from_buffer(array)
        if array.nbytes <= direct_limit and self._client._cpu_fast_paths:
            with _direct_read_lock:  # delete() from another thread waits
                ptr = self._live()
                if lib.pjrt_py_buffer_read_ready(api, ptr, dst, array.nbytes, len(shape)):
                    return ArrayPromise(api, array, self, [])
        event = ffi.new("PJRT_Event**")
        error = lib.pjrt_py_buffer_to_host(api, ptr, dst, array.nbytes, len(shape), event)
        if error:
            raise error_from_pjrt(api, error)
        return ArrayPromise(api, array, self, [event[0]])

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """Copy to a new numpy array, waiting for the data."""
        # The caller waits anyway, so a ready CPU buffer of any size is read
        # directly: that copy runs at memcpy speed, the plugin's did not.
        return self._copy_out(_ANY_SIZE).value()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        array = self.to_numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __repr__(self) -> str:
        if self._ptr is None:
            return "<Buffer deleted>"
        return f"<Buffer {self.dtype}{list(self.shape)} on {self.device!r}>"


# Buffers whose memory the host still owns (zero-copy), which pjrt_py never
# lets a program donate, and buffers a program consumed by donation (for the
# error message of a later use). Weak: neither keeps a buffer alive.
HOST_ALIASED: weakref.WeakSet[Buffer] = weakref.WeakSet()
DONATED: weakref.WeakSet[Buffer] = weakref.WeakSet()


def deleted_message(buf: Buffer) -> str:
    if buf in DONATED:
        return "buffer was donated to an execution and is no longer valid"
    return "buffer has been deleted"


def wrap(client: Client, ptr: Any, meta: Any = None) -> Buffer:
    """A Buffer owning ``ptr`` (a ``PJRT_Buffer*`` PJRT handed over, with a
    client reference taken by the helper that made it)."""
    buf: Buffer = _new(Buffer)
    buf._ptr = ptr
    buf._client = client
    buf._meta = meta
    return buf


_new = object.__new__
_state = _runtime.state
_METAS: dict[Any, Any] = {}


def intern_meta(meta: tuple[tuple[int, ...], np.dtype[Any]]) -> Any:
    """One shared ``(shape, dtype)`` object per distinct value.

    Executables compare their arguments' metadata to the signature by list
    equality, which is quickest when the tuples are the same objects. Bounded,
    so a program fed ever-new shapes does not grow it without end.
    """
    shared = _METAS.get(meta)
    if shared is None:
        if len(_METAS) >= 4096:
            return meta
        shared = _METAS.setdefault(meta, meta)
    return shared


def host_to_device(
    client: Client, value: Any, device: Device | None, zero_copy: bool
) -> BufferPromise:
    """Start a host-to-device transfer of a numpy array or scalar."""
    if isinstance(value, (Buffer, BufferPromise)):
        raise TypeError("value is already a device buffer, not a host array")
    array = np.asarray(value)
    dtype = array.dtype
    code = pjrt_type(dtype)
    if array.ndim > MAX_RANK:
        raise ValueError(f"arrays of rank {array.ndim} are not supported (max {MAX_RANK})")
    if zero_copy:
        _check_zero_copy(client, array)
        semantics = _ZERO_COPY
    elif array.nbytes >= STAGED_COPY_BYTES and client._cpu_fast_paths:
        staged_array = aligned_empty(array.shape, dtype)
        np.copyto(staged_array, array, casting="no")
        array, semantics = staged_array, _ZERO_COPY
    else:
        semantics = _COPY
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
    target = client._target(device)
    out = ffi.new("PJRT_Buffer**")
    done = ffi.new("PJRT_Event**")
    data = ffi.from_buffer(array, require_writable=False) if array.size else ffi.NULL
    error = lib.pjrt_py_buffer_from_host(
        client._h,
        data,
        code,
        array.shape,
        array.ndim,
        semantics,
        target._ptr,
        out,
        done,
    )
    if error:
        raise error_from_pjrt(client._api, error)
    buf = wrap(client, out[0], intern_meta((array.shape, dtype)))
    if semantics == _COPY:
        _runtime.hold(client._api, done[0], (array, data))
    else:  # aliased by the buffer until it is freed
        _runtime.hold_until_freed(client._api, done[0], (array, data))
        HOST_ALIASED.add(buf)
    return BufferPromise((buf,))


def _check_zero_copy(client: Client, array: np.ndarray[Any, Any]) -> None:
    if client.platform_name != "cpu":
        raise ValueError(f"zero_copy is only available on CPU, not {client.platform_name!r}")
    if not array.flags.c_contiguous:
        raise ValueError("zero_copy needs a C-contiguous array")
    address = array.__array_interface__["data"][0]
    if address % ZERO_COPY_ALIGNMENT:
        raise ValueError(
            f"zero_copy needs data aligned to {ZERO_COPY_ALIGNMENT} bytes (this array is at "
            f"{address:#x}); use pjrt_py.aligned_empty() or copy semantics"
        )


def aligned_empty(
    shape: Any, dtype: Any = np.float32, alignment: int = ZERO_COPY_ALIGNMENT
) -> np.ndarray[Any, Any]:
    """An uninitialised C-contiguous array whose data is ``alignment``-aligned."""
    dtype = np.dtype(dtype)
    dims = tuple(int(d) for d in np.atleast_1d(shape)) if not isinstance(shape, tuple) else shape
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    offset = -raw.ctypes.data % alignment
    out: np.ndarray[Any, Any] = raw[offset : offset + nbytes].view(dtype).reshape(dims)
    return out
