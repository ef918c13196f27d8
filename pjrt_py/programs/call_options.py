"""The compile options of one ``Client.compile`` call (see ``call_options``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..runtime.client import RuntimeClient
from ..runtime.device import Device
from .compile_options import options_for_program
from .debug_options import DebugValue
from .placement import check_compile_options

# Texts whose plain compile options are kept (then all are forgotten at once).
PLAIN_OPTIONS_KEPT = 256


def _device_id(client: RuntimeClient, device: int | Device) -> int:
    return client._target(device).id if isinstance(device, Device) else device


def call_options(
    client: RuntimeClient,
    program: str | bytes,
    plain_options: dict[str, bytes],
    read: Callable[[bytes], str | None],
    *,
    num_replicas: int | None,
    num_partitions: int | None,
    device_assignment: Sequence[Sequence[int | Device]] | None,
    compile_options: bytes | None,
    device: Device | None,
    debug_options: Mapping[str | int, DebugValue] | None,
) -> bytes:
    """The serialized CompileOptionsProto of one ``compile`` call: the
    caller's bytes, checked, or built from the call's arguments. Those of a
    plain ``compile(text)`` depend on the text and the client's devices only,
    so they are kept in ``plain_options`` per text: building them took most
    of a compile-cache hit (jax's DebugOptions are hundreds of fields)."""
    plain = compile_options is None and debug_options is None and device is None
    plain = plain and (num_replicas, num_partitions, device_assignment) == (None, None, None)
    text = program if plain and isinstance(program, str) else None  # the memo's key
    if text is not None and text in plain_options:
        return plain_options[text]
    if compile_options is None:
        options = options_for_program(
            program,
            num_replicas=num_replicas,
            num_partitions=num_partitions,
            device_assignment=None
            if device_assignment is None
            else [[_device_id(client, d) for d in row] for row in device_assignment],
            device=None if device is None else client._target(device).id,
            device_ids=[d.id for d in client.devices],
            debug_options=debug_options,
            read=read,
        )
    elif not isinstance(compile_options, (bytes, bytearray)) or not compile_options:
        raise ValueError("compile_options must be non-empty serialized CompileOptionsProto")
    elif (num_replicas, num_partitions, device_assignment, device, debug_options) != (None,) * 5:
        raise ValueError(
            "compile_options is used as is: do not also pass num_replicas, "
            "num_partitions, device_assignment, device or debug_options"
        )
    else:
        options = bytes(compile_options)
        check_compile_options(options, [d.id for d in client.devices])
    if text is not None:
        if len(plain_options) >= PLAIN_OPTIONS_KEPT:
            plain_options.clear()
        plain_options[text] = options
    return options
