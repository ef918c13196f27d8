"""The runtime's client: one PJRT client of one plugin, its devices, memories and transfers.

``RuntimeClient`` is the part of ``pjrt_py.Client`` that only talks to the
plugin: creation (options, the key-value store, the device list), devices
and memories, host-to-device transfers, and close. The public ``Client``
(``pjrt_py/client.py``) adds compile, deserialize and DLPack import on top,
each a thin method over the layer that owns it; the layers below it take a
``RuntimeClient`` where they need a client.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from .. import _core
from . import memory_watch
from .buffer import Buffer, host_to_device
from .capi import ffi
from .client_options import checked_options, refuse_multiprocess_cpu
from .device import Device, Memory, of_client, require_memories, resolve
from .errors import PjrtError, UnsupportedError
from .gpu_memory import with_memory_policy
from .kv_store import check_store, create_fields
from .plugin import Plugin, address, encode_named_values, load_plugin
from .promise import BufferPromise
from .staging import configure_from_environment, settings_from_environment


class RuntimeClient(_core.ClientCore):
    """A PJRT client without compile: see ``pjrt_py.Client``, which is one of these."""

    def __init__(
        self,
        plugin: str | os.PathLike[str] | Plugin | None = None,
        options: dict[str, Any] | None = None,
        *,
        kv_store: Any = None,
    ) -> None:
        if isinstance(plugin, Plugin):  # from before a fork: this process's instance
            plugin = plugin if plugin.generation == _core.generation() else load_plugin(plugin.path)
        self.plugin = plugin if isinstance(plugin, Plugin) else load_plugin(plugin)
        # Checked against the types the plugin reads them as: a wrong one aborts.
        platform = self.plugin.platform
        # GPU memory: the caller's options, then jax's variables, then ours.
        options = checked_options(platform, with_memory_policy(platform, options))
        refuse_multiprocess_cpu(platform, options)
        staging = settings_from_environment()  # refused before the plugin is asked
        nodes = options.get("num_nodes")
        self._spans_processes = isinstance(nodes, int) and nodes > 1
        if kv_store is not None:
            check_store(kv_store)
        self.options: dict[str, Any] = dict(options)  # what a compile helper's client gets
        values, keep = encode_named_values(options)
        kv_fields, holder = create_fields(kv_store)
        try:
            args = self.plugin.invoke(
                "PJRT_Client_Create", create_options=values, num_options=len(options), **kv_fields
            )
        except BaseException:
            if holder is not None:
                _core.kv_holder_free(holder)
            raise
        del keep
        # From here the native core owns the PJRT client (and the store's
        # holder): if anything below fails, this object's collection destroys it.
        self._attach(self.plugin.address, address(args.client), False, holder)
        self.kv_store = kv_store
        self.platform_name: str = self._string("PJRT_Client_PlatformName", "platform_name")
        self.platform_version: str = self._string("PJRT_Client_PlatformVersion", "platform_version")
        # CPU-only transfer paths: staged large copies, direct reads of ready
        # buffers (see STAGED_COPY_BYTES and DIRECT_READ_BYTES in buffer.py).
        self._cpu_fast_paths = self.platform_name == "cpu"
        # Large copies through a ring of registered host memory (staging.py).
        configure_from_environment(self, staging)
        with self._pinned() as ptr:
            self.process_index: int = self.plugin.invoke(
                "PJRT_Client_ProcessIndex", client=ptr
            ).process_index
        self._devices_by_addr: dict[int, Device] = {}
        self._memories_by_addr: dict[int, Memory] = {}
        self.devices: list[Device] = self._device_list("PJRT_Client_Devices", "devices")
        self.addressable_devices: list[Device] = self._device_list(
            "PJRT_Client_AddressableDevices", "addressable_devices"
        )
        if not self.addressable_devices:
            raise RuntimeError(f"{self.plugin.path}: the client has no addressable devices")
        # The first is the default device; each with its default memory.
        self._set_devices(
            tuple((d._addr, _default_memory_address(d)) for d in self.addressable_devices)
        )
        self._check_processes(options)
        memory_watch.track(self)  # its devices are reported by memory_watch()

    def _check_processes(self, options: Mapping[str, Any]) -> None:
        """After creation: the plugin made the world that was asked for."""
        node = options.get("node_id", options.get("process_id"))
        nodes = options.get("num_nodes")
        wrong = None
        if node is not None and self.process_index != node:
            wrong = f"process_index {self.process_index}, asked node {node}"
        elif nodes is not None and nodes > 1 and len(self.devices) <= len(self.addressable_devices):
            wrong = f"{len(self.devices)} devices, all of them local, asked {nodes} nodes"
        if wrong is not None:
            self.close()
            raise UnsupportedError(
                f"{self.plugin.path} made a client that is not the one asked for ({wrong}): "
                "it does not run across processes this way"
            )

    # -- construction helpers ------------------------------------------
    @contextlib.contextmanager
    def _pinned(self) -> Iterator[Any]:
        """The ``PJRT_Client*``, held for a PJRT call: a concurrent ``close()``
        cannot free it, and the exit sequence waits for the call."""
        ptr, token = self._pin()
        try:
            yield ffi.cast("PJRT_Client*", ptr)
        finally:
            self._unpin(token)

    def _string(self, function: str, field: str) -> str:
        with self._pinned() as ptr:
            args = self.plugin.invoke(function, client=ptr)
            return str(ffi.unpack(getattr(args, field), getattr(args, f"{field}_size")).decode())

    def _device_list(self, function: str, field: str) -> list[Device]:
        with self._pinned() as ptr:
            args = self.plugin.invoke(function, client=ptr)
            count, ptrs = getattr(args, f"num_{field}"), getattr(args, field)
            return [self._device_for(address(ptrs[i])) for i in range(count)]

    def _device_for(self, addr: int) -> Device:
        """The Device at a ``PJRT_Device*`` address (made once per device)."""
        device = self._devices_by_addr.get(addr)
        if device is None:
            device = Device(self, ffi.cast("PJRT_Device*", addr))
            self._devices_by_addr[addr] = device
        return device

    def _memory_for(self, addr: int | None) -> Memory:
        """The Memory at a ``PJRT_Memory*`` address (made once per memory)."""
        if addr is None:  # the native core found no PJRT_Buffer_Memory
            self.plugin.require("PJRT_Buffer_Memory")
        assert addr is not None
        memory = self._memories_by_addr.get(addr)
        if memory is None:
            memory = Memory(self, ffi.cast("PJRT_Memory*", addr))
            self._memories_by_addr[addr] = memory
        return memory

    def _memory_target(self, memory: Memory | str, buffer: Buffer) -> Memory:
        """The Memory a copy of ``buffer`` goes to (called by copy_to_memory)."""
        self.plugin.require("PJRT_Buffer_CopyToMemory")
        if isinstance(memory, str):
            return resolve(buffer.device, memory)
        return of_client(self, memory)  # any device's: a copy may cross devices

    def _check_open(self) -> None:
        reason = self._closed_reason(None)  # closed, inherited over fork, or exiting
        if reason is not None:
            raise ValueError(reason)

    def _copy_through_host(self, buffer: Buffer, target: Device | Memory) -> BufferPromise:
        # The native copies call this where the plugin would copy ``buffer``
        # without its dimension order (xla-cpu-pjrt 0.81, native/memory.c):
        # to_numpy reads the order right, and the upload lays it out anew.
        array = buffer.to_numpy()
        if isinstance(target, Memory):
            device = buffer.device if buffer.device in target.devices else target.devices[0]
            return host_to_device(self, array, device, False, target)
        return host_to_device(self, array, target, False, None)

    def _target(self, device: Device | None) -> Device:
        if device is None:
            return self.addressable_devices[0]
        if not isinstance(device, Device):
            raise TypeError(f"device must be a pjrt_py.Device, got {type(device).__name__}")
        if device.client is not self:
            raise ValueError(f"{device!r} belongs to another client")
        if not device.is_addressable:
            raise ValueError(f"{device!r} is not addressable from this client")
        return device

    # -- public API -----------------------------------------------------
    @property
    def default_device(self) -> Device:
        """The first addressable device: where ``buffer`` places data when no device is named."""
        return self.addressable_devices[0]

    @property
    def memories(self) -> list[Memory]:
        """Every memory space addressable from this client (see ``pjrt_py.memory``)."""
        require_memories(self)
        with self._pinned() as ptr:
            args = self.plugin.invoke("PJRT_Client_AddressableMemories", client=ptr)
            found, count = args.addressable_memories, args.num_addressable_memories
            return [self._memory_for(address(found[i])) for i in range(count)]

    def _buffer_async_slow(
        self,
        value: Any,
        device: Device | None = None,
        *,
        zero_copy: bool = False,
        memory: Memory | str | None = None,
    ) -> BufferPromise:
        """buffer_async for everything its native path does not take."""
        self._check_open()
        return host_to_device(self, value, device, zero_copy, memory)

    def buffer(
        self,
        value: Any,
        device: Device | None = None,
        *,
        zero_copy: bool = False,
        memory: Memory | str | None = None,
    ) -> Buffer:
        """Move a numpy array or scalar to ``device`` and wait until it is there.

        ``memory``: a ``Memory`` of ``device`` or one of its kinds
        (``"pinned_host"``, ...); the device's default memory if None.

        Parameters
        ----------
        value : array_like
            A numpy array or scalar (anything ``np.asarray`` takes) of a
            supported dtype and rank at most 64. Its data is copied unless
            ``zero_copy`` is True.
        device : Device, optional
            An addressable device of this client; ``default_device`` if
            None.
        zero_copy : bool, optional
            Make the buffer alias ``value``'s memory instead of copying it
            (default False): CPU only, for a C-contiguous array whose data is
            64-byte aligned (see ``aligned_empty``). Writing to
            the array then changes the buffer.
        memory : Memory or str, optional
            The memory space to place the buffer in: a ``Memory``
            addressable by ``device``, or the kind of one of its memories.

        Returns
        -------
        Buffer
            The buffer, its data on the device.

        Raises
        ------
        TypeError
            If the dtype is not supported, ``value`` is already a
            ``Buffer`` or ``BufferPromise``, ``device`` is not a
            ``Device``, ``zero_copy`` is not a bool, or ``memory`` is
            neither a ``Memory`` nor a str.
        ValueError
            If the client is closed; ``device`` belongs to another client or is
            not addressable; the array's rank is above 64; ``zero_copy`` is
            asked for off CPU or for an array that is not C-contiguous and
            aligned; or ``memory`` is not a memory of ``device``.
        UnsupportedError
            If ``memory`` is given and the plugin does not report memory
            spaces, or placed the buffer in another memory.
        """
        if device is None and not zero_copy and memory is None:
            promise = self.buffer_async(value)  # keywords would leave the native path
        else:
            promise = self.buffer_async(value, device, zero_copy=zero_copy, memory=memory)
        result: Buffer = promise.value()
        return result

    def close(self) -> None:
        """Make the client unusable, and drop its own reference. Idempotent."""
        self._close()

    def __enter__(self) -> RuntimeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __copy__(self) -> RuntimeClient:
        return self

    def __deepcopy__(self, memo: Any) -> RuntimeClient:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(
            "a pjrt_py.Client cannot be pickled: it is this process's connection to a "
            "plugin; make a Client in the other process"
        )

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        name = getattr(self, "platform_name", "?")
        version = getattr(self, "platform_version", "?")
        count = len(getattr(self, "addressable_devices", ()))
        return f"<Client {name} ({version}) {count} device(s){state}>"


__all__ = ["RuntimeClient"]


def _default_memory_address(device: Device) -> int | None:
    """The address of ``device``'s default memory, which buffers put there
    without naming a memory are known to be in from the start; None where the
    plugin has no memory spaces."""
    try:
        return device.default_memory._addr
    except PjrtError:  # UnsupportedError: no memory spaces
        return None
