"""Devices of a client, and their memory spaces (``Memory``).

A device and its memories refer to each other, so both live here.

Memory spaces: the memories a device can address, as the plugin reports them.

A PJRT plugin names each memory by a *kind*: ``"device"`` (the accelerator's
own memory; on CPU, ordinary host memory), ``"pinned_host"`` (page-locked
host memory the device reaches by DMA), ``"unpinned_host"``, and whatever
else a plugin offers. pjrt_py reports them as the plugin does; it does not
invent kinds. All three CPU builds give each device one memory of each of the
three kinds, ``"device"`` the default (``docs/interop.md`` has the table).

Place data with ``client.buffer(x, memory=...)`` (a ``Memory`` or a kind
of the target device) and move it with ``Buffer.copy_to_memory``. Where the
plugin lacks the calls, both raise ``UnsupportedError``.
"""

from __future__ import annotations

from typing import Any, Protocol

from .capi import ffi
from .errors import UnimplementedError, UnsupportedError
from .plugin import Plugin, address, named_values

# The statistics a plugin may leave unset (PJRT_Device_MemoryStats_Args).
_OPTIONAL_STATS = (
    "peak_bytes_in_use",
    "num_allocs",
    "largest_alloc_size",
    "bytes_limit",
    "bytes_reserved",
    "peak_bytes_reserved",
    "bytes_reservable_limit",
    "largest_free_block_bytes",
    "pool_bytes",
    "peak_pool_bytes",
)


class Owner(Protocol):
    """What a Device (or a Memory) reads of the Client that made it (a ``pjrt_py.Client``)."""

    @property
    def plugin(self) -> Plugin: ...
    @property
    def platform_name(self) -> str: ...

    def _pinned(self) -> Any: ...
    def _device_for(self, addr: int) -> Device: ...
    def _memory_for(self, addr: int) -> Memory: ...


class Device:
    """One device of a ``Client``.

    A client makes one Device per PJRT device (its ``devices`` and
    ``addressable_devices``); there is no need to make one directly.

    Parameters
    ----------
    client : Client
        The client the device belongs to.
    ptr : cffi pointer
        The ``PJRT_Device*`` of the device; its description is read here.

    Attributes
    ----------
    id : int
        Unique among the client's devices.
    kind : str
        Vendor-specific kind, e.g. ``"cpu"`` or a GPU model name.
    local_hardware_id : int
        Opaque hardware id (e.g. the CUDA ordinal); -1 if undefined.
    process_index : int
        The process the device is addressable from.
    is_addressable : bool
        Whether this client can run work on it.
    attributes : dict
        Plugin-specific attributes.
    """

    def __init__(self, client: Owner, ptr: Any) -> None:
        self.client = client
        self._ptr = ptr
        self._addr = address(ptr)  # what the native core takes
        invoke = client.plugin.invoke
        desc = invoke("PJRT_Device_GetDescription", device=ptr).device_description

        self.id: int = invoke("PJRT_DeviceDescription_Id", device_description=desc).id
        kind = invoke("PJRT_DeviceDescription_Kind", device_description=desc)
        self.kind: str = ffi.unpack(kind.device_kind, kind.device_kind_size).decode()
        self.process_index: int = invoke(
            "PJRT_DeviceDescription_ProcessIndex", device_description=desc
        ).process_index
        attrs = invoke("PJRT_DeviceDescription_Attributes", device_description=desc)
        self.attributes: dict[str, Any] = named_values(attrs.attributes, attrs.num_attributes)
        self.is_addressable: bool = bool(
            invoke("PJRT_Device_IsAddressable", device=ptr).is_addressable
        )
        self._memories: list[Memory] | None = None
        self._no_stats = not self.is_addressable  # memory_stats() is None
        self.local_hardware_id = -1
        if self.is_addressable:
            self.local_hardware_id = invoke(
                "PJRT_Device_LocalHardwareId", device=ptr
            ).local_hardware_id

    @property
    def platform(self) -> str:
        """The platform name of the device's client (``"cpu"``, ``"cuda"``, ...)."""
        return self.client.platform_name

    @property
    def memories(self) -> list[Memory]:
        """The memory spaces this device can address (see ``pjrt_py.memory``)."""
        if self._memories is None:
            self._memories = device_memories(self)
        return list(self._memories)

    @property
    def default_memory(self) -> Memory:
        """Where a transfer to this device lands when no memory is named."""
        return default_memory(self)

    def memory(self, kind: str) -> Memory:
        """This device's memory of ``kind`` (``ValueError`` if it has none).

        Parameters
        ----------
        kind : str
            A memory kind: ``"device"``, ``"pinned_host"``, ``"unpinned_host"``,
            or another the plugin reports.

        Returns
        -------
        Memory
            The first of ``memories`` of that kind.

        Raises
        ------
        ValueError
            If the device has no memory of ``kind``.
        UnsupportedError
            If the plugin does not report memory spaces.
        """
        return resolve(self, kind)

    def memory_stats(self) -> dict[str, int] | None:
        """The plugin's allocator statistics for this device, or None where it keeps none.

        The figures are the plugin's own (``PJRT_Device_MemoryStats``), as
        ``jax.Device.memory_stats()`` reports them: ``bytes_in_use`` always,
        and each of ``peak_bytes_in_use``, ``num_allocs``,
        ``largest_alloc_size``, ``bytes_limit``, ``bytes_reserved``,
        ``peak_bytes_reserved``, ``bytes_reservable_limit``,
        ``largest_free_block_bytes``, ``pool_bytes`` and ``peak_pool_bytes``
        only where the plugin sets it. CPU plugins keep no statistics.

        Returns
        -------
        dict or None
            Statistic name to bytes (or a count, for ``num_allocs``); None if
            the plugin has no statistics for this device (no such function,
            or it answers that it keeps none).

        Raises
        ------
        ValueError
            If the device's client is closed.
        PjrtError
            Any other error the plugin reports.
        """
        plugin = self.client.plugin
        if self._no_stats or not plugin.supports("PJRT_Device_MemoryStats"):
            return None
        try:
            with self.client._pinned():
                out = plugin.invoke("PJRT_Device_MemoryStats", device=self._ptr)
        except UnimplementedError:
            self._no_stats = True  # a plugin that keeps none never will (memory_watch asks often)
            return None
        stats = {"bytes_in_use": int(out.bytes_in_use)}
        for name in _OPTIONAL_STATS:
            if getattr(out, name + "_is_set"):
                stats[name] = int(getattr(out, name))
        return stats

    # A device is a handle to one device of one client: copies are the
    # device itself; pickling refuses (it has no meaning in another process).
    def __copy__(self) -> Device:
        return self

    def __deepcopy__(self, memo: Any) -> Device:
        return self

    def __reduce__(self) -> Any:
        raise TypeError("a pjrt_py.Device cannot be pickled: pickle its id instead")

    def __repr__(self) -> str:
        return (
            f"Device(id={self.id}, kind={self.kind!r}, platform={self.platform!r}, "
            f"local_hardware_id={self.local_hardware_id})"
        )


# ---- memory spaces ----------------------------------------------------------------


class Memory:
    """One memory space of a client.

    A client makes one Memory per PJRT memory (its ``memories``, a device's
    ``memories``); there is no need to make one directly.

    Parameters
    ----------
    client : Client
        The client the memory belongs to.
    ptr : cffi pointer
        The ``PJRT_Memory*`` of the memory; its id, kind and debug string are
        read here.

    Attributes
    ----------
    id : int
        Unique among the client's memories.
    kind : str
        The plugin's name for this kind of memory (``"device"``,
        ``"pinned_host"``, ``"unpinned_host"``, ...).
    kind_id : int or None
        The plugin's number for the kind (None where it has no such call).
    debug_string : str
        The plugin's description of this memory (``PJRT_Memory_DebugString``).
    """

    def __init__(self, client: Owner, ptr: Any) -> None:
        self.client = client
        self._ptr = ptr
        self._addr = address(ptr)
        invoke = client.plugin.invoke
        self.id: int = invoke("PJRT_Memory_Id", memory=ptr).id
        kind = invoke("PJRT_Memory_Kind", memory=ptr)
        self.kind: str = ffi.unpack(kind.kind, kind.kind_size).decode()
        self.kind_id: int | None = None
        if client.plugin.supports("PJRT_Memory_Kind_Id"):
            self.kind_id = invoke("PJRT_Memory_Kind_Id", memory=ptr).kind_id
        text = invoke("PJRT_Memory_DebugString", memory=ptr)
        self.debug_string: str = ffi.unpack(text.debug_string, text.debug_string_size).decode()

    @property
    def devices(self) -> list[Device]:
        """The devices that can address this memory."""
        args = self.client.plugin.invoke("PJRT_Memory_AddressableByDevices", memory=self._ptr)
        return [self.client._device_for(address(args.devices[i])) for i in range(args.num_devices)]

    def __copy__(self) -> Memory:
        return self

    def __deepcopy__(self, memo: Any) -> Memory:
        return self

    def __reduce__(self) -> Any:
        raise TypeError("a pjrt_py.Memory cannot be pickled: pickle its kind instead")

    def __repr__(self) -> str:
        return f"Memory(id={self.id}, kind={self.kind!r})"


def require_memories(client: Owner) -> None:
    """Raise UnsupportedError unless the plugin reports memory spaces."""
    for function in ("PJRT_Device_AddressableMemories", "PJRT_Memory_Kind", "PJRT_Memory_Id"):
        if not client.plugin.supports(function):
            raise UnsupportedError(
                f"this plugin (PJRT {client.plugin.version_text}) does not report memory "
                f"spaces: it has no {function}"
            )


def device_memories(device: Device) -> list[Memory]:
    """The memories ``device`` can address, in the plugin's order."""
    client = device.client
    require_memories(client)
    args = client.plugin.invoke("PJRT_Device_AddressableMemories", device=device._ptr)
    return [client._memory_for(address(args.memories[i])) for i in range(args.num_memories)]


def default_memory(device: Device) -> Memory:
    """The memory a transfer to ``device`` lands in when none is named."""
    client = device.client
    require_memories(client)
    client.plugin.require("PJRT_Device_DefaultMemory")
    args = client.plugin.invoke("PJRT_Device_DefaultMemory", device=device._ptr)
    return client._memory_for(address(args.memory))


def of_client(client: Owner, memory: Any) -> Memory:
    """``memory``, checked to be a Memory of ``client``."""
    if not isinstance(memory, Memory):
        raise TypeError(
            f"memory must be a pjrt_py.Memory or a memory kind string, got {type(memory).__name__}"
        )
    if memory.client is not client:
        raise ValueError(f"{memory!r} belongs to another client")
    return memory


def resolve(device: Device, memory: Memory | str) -> Memory:
    """A Memory of ``device``: a Memory (checked) or a kind of the device's memories."""
    if isinstance(memory, str):
        found = [m for m in device.memories if m.kind == memory]
        if not found:
            kinds = ", ".join(repr(m.kind) for m in device.memories)
            raise ValueError(f"{device!r} has no memory of kind {memory!r} (it has {kinds})")
        return found[0]
    memory = of_client(device.client, memory)
    if all(m is not memory for m in device.memories):
        raise ValueError(f"{memory!r} is not addressable by {device!r}")
    return memory


__all__ = ["Memory", "default_memory", "device_memories", "of_client", "resolve"]
