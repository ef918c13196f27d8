"""Devices of a client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from . import memory as _memory
from ._ffi import ffi
from .errors import UnimplementedError
from .plugin import Plugin, address, named_values

if TYPE_CHECKING:
    from .memory import Memory


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
            self._memories = _memory.device_memories(self)
        return list(self._memories)

    @property
    def default_memory(self) -> Memory:
        """Where a transfer to this device lands when no memory is named."""
        return _memory.default_memory(self)

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
        return _memory.resolve(self, kind)

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
        if not plugin.supports("PJRT_Device_MemoryStats") or not self.is_addressable:
            return None
        try:
            with self.client._pinned():
                out = plugin.invoke("PJRT_Device_MemoryStats", device=self._ptr)
        except UnimplementedError:
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
