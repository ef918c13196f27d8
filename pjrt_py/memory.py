"""Memory spaces: the memories a device can address, as the plugin reports them.

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

from typing import TYPE_CHECKING, Any

from ._ffi import ffi
from .errors import UnsupportedError
from .plugin import address

if TYPE_CHECKING:
    from .device import Device, Owner


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
