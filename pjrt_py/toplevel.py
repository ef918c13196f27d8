"""The module-level shortcuts, on the default client: ``pjrt_py.buffer(x)``
is ``pjrt_py.default_client().buffer(x)``, and so on; ``value`` and
``is_ready`` take anything. Re-exported by ``pjrt_py``.
"""

from __future__ import annotations

from typing import Any

from .client import Client
from .defaults import default_client, default_client_for
from .interop.dlpack import GPU_PLATFORM_OF
from .interop.foreign import capsule_device, producer_device
from .programs.executable import Executable
from .runtime.buffer import Buffer
from .runtime.device import Device
from .runtime.promise import ArrayPromise, BufferPromise, Promise


def buffer(value: Any, device: Device | None = None) -> Buffer:
    """``default_client().buffer(value, device)``.

    Parameters
    ----------
    value : array_like
        A numpy array or scalar (anything ``np.asarray`` takes) of a supported
        dtype. Its data is copied.
    device : Device, optional
        A device of the default client; its first addressable device if None.

    Returns
    -------
    Buffer
        The buffer, its data on the device.

    Raises
    ------
    TypeError
        If the dtype is not supported, or ``device`` is not a ``Device``.
    ValueError
        If ``device`` belongs to another client or is not addressable.
    """
    return default_client().buffer(value, device)


def buffer_async(value: Any, device: Device | None = None) -> BufferPromise:
    """``default_client().buffer_async(value, device)``: returns at once.

    Parameters
    ----------
    value : array_like
        A numpy array or scalar (anything ``np.asarray`` takes) of a supported
        dtype. Its data is copied: changing it after this returns does not
        change the buffer.
    device : Device, optional
        A device of the default client; its first addressable device if None.

    Returns
    -------
    BufferPromise
        A promise of the buffer; the transfer may still be running.

    Raises
    ------
    TypeError
        If the dtype is not supported, or ``device`` is not a ``Device``.
    ValueError
        If ``device`` belongs to another client or is not addressable.
    """
    return default_client().buffer_async(value, device)


def from_dlpack(x: Any, device: Device | None = None, *, copy: bool | None = None) -> Buffer:
    """A Buffer from any DLPack producer (numpy, jax, torch, ...).

    Zero-copy on CPU where the memory allows. On ``device``'s client if given,
    else the default client's. See ``pjrt_py.dlpack``.

    Parameters
    ----------
    x : object
        An object with ``__dlpack__`` (numpy array, ``jax.Array``,
        ``torch.Tensor``, ...), a DLPack capsule, or a ``Buffer`` (or
        ``BufferPromise`` of one) of the same client, returned as is if it
        is on the target device and ``copy`` is not True, else copied there.
    device : Device, optional
        The device to place it on (its client takes it). If None: a tensor in
        a GPU's memory goes to the process-wide client of that platform
        (``default_client_for``), on the device with the tensor's hardware
        id; anything else to the default client's first addressable device.
    copy : bool, optional
        None (default): use the producer's memory in place where the client
        can (on CPU: compact row-major host memory, 64-byte aligned), else
        copy. True: always copy. False: never copy; raise instead.

    Returns
    -------
    Buffer
        The buffer; a view of the producer's memory if nothing was copied.

    Raises
    ------
    BufferError
        If ``copy=False`` and ``x`` cannot be used without a copy, if a tensor
        in device memory would have to be copied to another device type (or
        no plugin of its platform is installed), or
        if the producer's tensor is malformed (negative dimension, no data).
    TypeError
        If ``x`` is not a DLPack producer, its dtype has no PJRT element type,
        or ``copy`` is not True, False or None.
    """
    client = device.client if isinstance(device, Device) else _client_for_producer(x)
    assert isinstance(client, Client)
    return client.from_dlpack(x, device, copy=copy)


def _client_for_producer(x: Any) -> Client:
    """The client a tensor goes to when no device is named: the default one,
    unless the tensor is in a GPU's memory, which goes to a client of that GPU."""
    where = producer_device(x) or capsule_device(x)
    platform = None if where is None else GPU_PLATFORM_OF.get(where[0])
    if platform is None:
        return default_client()
    try:
        return default_client_for(platform)
    except FileNotFoundError as e:
        raise BufferError(
            f"a {type(x).__name__} in {platform} memory (DLPack device {where}) needs a "
            f"{platform} PJRT plugin, and none is installed ({e}); to use it on another "
            f"platform, move it to host memory first"
        ) from None


def compile(program: str | bytes, **options: Any) -> Executable:  # noqa: A001
    """``default_client().compile(program, **options)``.

    Parameters
    ----------
    program : str or bytes
        A StableHLO/MLIR program: text (``str``) or bytecode (``bytes``).
    **options
        The keywords of ``Client.compile`` (``num_replicas``, ``device``,
        ``ordered``, ``cache``, ``isolate``, ...).

    Returns
    -------
    Executable
        The compiled program, loaded on the default client.

    Raises
    ------
    PjrtError
        With the compiler's message, if the program is invalid.
    CompilerCrashError
        If an isolated compile's helper process died.
    """
    return default_client().compile(program, **options)


def execute(executable: Executable, *args: Any, **options: Any) -> Any:
    """``executable.execute(*args, **options)``: outputs ready on return.

    Parameters
    ----------
    executable : Executable
        The program to run.
    *args
        Its arguments: Buffers, promises of one buffer, numpy arrays and
        scalars (transferred first), or other frameworks' arrays (DLPack).
    **options
        The keywords of ``Executable.execute`` (``ordered``,
        ``non_donatable``).

    Returns
    -------
    Buffer, tuple of Buffer, or None
        The output (one output), a tuple of them (several), or None (none).

    Raises
    ------
    PjrtError
        The error of the execution, if it failed.
    """
    return executable.execute(*args, **options)


def execute_async(executable: Executable, *args: Any, **options: Any) -> BufferPromise:
    """``executable.execute_async(*args, **options)``: a promise, at once.

    Parameters
    ----------
    executable : Executable
        The program to run.
    *args
        Its arguments: Buffers, promises of one buffer, numpy arrays and
        scalars (transferred first), or other frameworks' arrays (DLPack).
    **options
        The keywords of ``Executable.execute_async`` (``ordered``,
        ``non_donatable``).

    Returns
    -------
    BufferPromise
        A promise of the outputs: its ``value()`` is a Buffer (one output), a
        tuple of them (several), or None (none). An execution that fails
        raises its error there.
    """
    return executable.execute_async(*args, **options)


def to_numpy(x: Buffer | BufferPromise) -> Any:
    """Copy a buffer (or a promise of one) to a numpy array, waiting for it.

    Parameters
    ----------
    x : Buffer or BufferPromise
        The buffer to copy, or a promise of one buffer.

    Returns
    -------
    numpy.ndarray
        A new dense, row-major array with the buffer's shape and dtype.

    Raises
    ------
    TypeError
        If ``x`` is neither a Buffer nor a BufferPromise.
    PjrtError
        The error of the work that made the buffer, or of the copy, if it failed.
    """
    if isinstance(x, (Buffer, BufferPromise)):
        # The methods' own path: a ready host buffer is read in place, with
        # no copy to wait for (which a done callback may not do).
        return x.to_numpy()
    return to_numpy_async(x).value()  # its TypeError


def to_numpy_async(x: Buffer | BufferPromise) -> ArrayPromise:
    """Start a device-to-host copy of a buffer or a promise of one; returns at once.

    Parameters
    ----------
    x : Buffer or BufferPromise
        The buffer to copy, or a promise of one buffer: the copy starts when
        the work that makes it is done, with no host wait.

    Returns
    -------
    ArrayPromise
        A promise of the numpy array being filled.

    Raises
    ------
    TypeError
        If ``x`` is neither a Buffer nor a BufferPromise.
    """
    if isinstance(x, BufferPromise):
        return x.to_numpy_async()
    if isinstance(x, Buffer):
        return x.to_numpy_async()
    raise TypeError(f"expected a Buffer or a BufferPromise, got {type(x).__name__}")


def value(x: Any, timeout: float | None = None) -> Any:
    """Block until a promise is ready and return its value (anything else as is).

    Parameters
    ----------
    x : object
        A ``Promise``, whose ``value(timeout)`` is returned; anything
        else is returned unchanged.
    timeout : float, optional
        Seconds to wait for a promise (None or ``inf``: for ever).

    Returns
    -------
    object
        The promise's result, or ``x`` itself.

    Raises
    ------
    TimeoutError
        If ``timeout`` passes first (the work goes on).
    PjrtError
        The error of the promised work, if it failed.
    """
    return x.value(timeout) if isinstance(x, Promise) else x


def is_ready(x: Any) -> bool:
    """Whether a promise (or a buffer) is ready, without blocking.

    Parameters
    ----------
    x : object
        A ``Promise`` or ``Buffer``; anything else counts as ready.

    Returns
    -------
    bool
        True once the work is complete (or has failed) or the buffer's data is
        there; True for anything that is neither.
    """
    if isinstance(x, (Promise, Buffer)):
        return x.is_ready()
    return True
