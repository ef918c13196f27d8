"""Devices of a client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._ffi import ffi, lib
from .plugin import named_values

if TYPE_CHECKING:
    from .client import Client


class Device:
    """One device of a :class:`~pjrt_py.Client`.

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

    def __init__(self, client: Client, ptr: Any) -> None:
        self.client = client
        self._ptr = ptr
        plugin = client.plugin

        args = ffi.new("PJRT_Device_GetDescription_Args*")
        args.struct_size = lib.PJRT_Device_GetDescription_Args_STRUCT_SIZE
        args.device = ptr
        plugin.call("PJRT_Device_GetDescription", args)
        desc = args.device_description

        id_args = ffi.new("PJRT_DeviceDescription_Id_Args*")
        id_args.struct_size = lib.PJRT_DeviceDescription_Id_Args_STRUCT_SIZE
        id_args.device_description = desc
        plugin.call("PJRT_DeviceDescription_Id", id_args)
        self.id: int = id_args.id

        kind = ffi.new("PJRT_DeviceDescription_Kind_Args*")
        kind.struct_size = lib.PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE
        kind.device_description = desc
        plugin.call("PJRT_DeviceDescription_Kind", kind)
        self.kind: str = ffi.unpack(kind.device_kind, kind.device_kind_size).decode()

        proc = ffi.new("PJRT_DeviceDescription_ProcessIndex_Args*")
        proc.struct_size = lib.PJRT_DeviceDescription_ProcessIndex_Args_STRUCT_SIZE
        proc.device_description = desc
        plugin.call("PJRT_DeviceDescription_ProcessIndex", proc)
        self.process_index: int = proc.process_index

        attrs = ffi.new("PJRT_DeviceDescription_Attributes_Args*")
        attrs.struct_size = lib.PJRT_DeviceDescription_Attributes_Args_STRUCT_SIZE
        attrs.device_description = desc
        plugin.call("PJRT_DeviceDescription_Attributes", attrs)
        self.attributes: dict[str, Any] = named_values(attrs.attributes, attrs.num_attributes)

        addr = ffi.new("PJRT_Device_IsAddressable_Args*")
        addr.struct_size = lib.PJRT_Device_IsAddressable_Args_STRUCT_SIZE
        addr.device = ptr
        plugin.call("PJRT_Device_IsAddressable", addr)
        self.is_addressable: bool = bool(addr.is_addressable)

        self.local_hardware_id = -1
        if self.is_addressable:
            hw = ffi.new("PJRT_Device_LocalHardwareId_Args*")
            hw.struct_size = lib.PJRT_Device_LocalHardwareId_Args_STRUCT_SIZE
            hw.device = ptr
            plugin.call("PJRT_Device_LocalHardwareId", hw)
            self.local_hardware_id = hw.local_hardware_id

    @property
    def platform(self) -> str:
        return self.client.platform_name

    def __repr__(self) -> str:
        return (
            f"Device(id={self.id}, kind={self.kind!r}, platform={self.platform!r}, "
            f"local_hardware_id={self.local_hardware_id})"
        )
