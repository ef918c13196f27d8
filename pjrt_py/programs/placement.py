"""Reading the placement back out of serialized compile options, and checking it.

Options given as bytes (``compile_options=``) are decoded just far enough to
find the replica and partition counts and the device assignment, which are
checked against the client's devices before the plugin sees them: a plugin
aborts the process on counts it cannot use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import option_fields as opt
from .proto import ProtoError, fields, read_varint


@dataclass(frozen=True)
class Placement:
    """What compile options say about replicas, partitions and devices."""

    num_replicas: int
    num_partitions: int
    device_assignment: list[list[int]] | None  # [replica][partition] = device id


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _decode_assignment(data: bytes) -> list[list[int]]:
    replicas = partitions = 0
    columns: list[list[int]] = []
    for number, value in fields(data):
        if number == opt.REPLICA_COUNT and isinstance(value, int):
            replicas = _signed(value)
        elif number == opt.COMPUTATION_COUNT and isinstance(value, int):
            partitions = _signed(value)
        elif number == opt.COMPUTATION_DEVICES and isinstance(value, bytes):
            ids: list[int] = []
            for inner, item in fields(value):
                if inner != opt.REPLICA_DEVICE_IDS:
                    continue
                if isinstance(item, int):
                    ids.append(_signed(item))
                else:
                    at = 0
                    while at < len(item):
                        raw, at = read_varint(item, at)
                        ids.append(_signed(raw))
            columns.append(ids)
    if replicas < 1 or partitions < 1:
        raise ValueError(
            f"compile_options: device_assignment has {replicas} replica(s) x "
            f"{partitions} partition(s); both must be positive"
        )
    if len(columns) != partitions or any(len(c) != replicas for c in columns):
        raise ValueError(
            f"compile_options: device_assignment is not {replicas} x {partitions} "
            f"(columns of {[len(c) for c in columns]} ids)"
        )
    return [[columns[p][r] for p in range(partitions)] for r in range(replicas)]


def decode_compile_options(data: bytes) -> Placement:
    """Read the placement of serialized options; ValueError if they are not options."""
    replicas = partitions = 0
    assignment = None
    try:
        for number, value in fields(data):
            if number != opt.EXECUTABLE_BUILD_OPTIONS:
                continue
            if not isinstance(value, bytes):
                raise ValueError("compile_options: executable_build_options is not a message")
            for inner, item in fields(value):
                if inner == opt.NUM_REPLICAS and isinstance(item, int):
                    replicas = _signed(item)
                elif inner == opt.NUM_PARTITIONS and isinstance(item, int):
                    partitions = _signed(item)
                elif inner == opt.DEVICE_ASSIGNMENT and isinstance(item, bytes):
                    assignment = _decode_assignment(item)
                elif inner == opt.DEBUG_OPTIONS and isinstance(item, bytes):
                    list(fields(item))  # framing only: its fields are the plugin's
    except ProtoError as e:
        raise ValueError(f"compile_options is not a serialized CompileOptionsProto: {e}") from None
    for name, value in (("num_replicas", replicas), ("num_partitions", partitions)):
        if value < 1:
            raise ValueError(
                f"compile_options sets {name} = {value} (a missing field reads as 0): the "
                f"plugin aborts on that; it must be a positive int"
            )
        positive_count(name, value)
    return Placement(replicas, partitions, assignment)


def check_placement(placement: Placement, device_ids: Sequence[int]) -> None:
    """The checks both the keyword and the bytes path make against the client."""
    replicas, partitions = placement.num_replicas, placement.num_partitions
    assignment = placement.device_assignment
    if assignment is None:
        if replicas * partitions > len(device_ids):
            raise ValueError(
                f"{replicas} replica(s) x {partitions} partition(s) need "
                f"{replicas * partitions} devices; this client has {len(device_ids)}"
            )
        return
    if len(assignment) != replicas or any(len(row) != partitions for row in assignment):
        raise ValueError(
            f"device_assignment must be {replicas} replicas x {partitions} partitions, "
            f"got {[len(r) for r in assignment]}"
        )
    ids = [i for row in assignment for i in row]
    unknown = [i for i in ids if i not in device_ids]
    if unknown:
        raise ValueError(f"device_assignment names unknown device id(s) {unknown}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"device_assignment uses a device twice: {ids}")


def check_compile_options(data: bytes, device_ids: Sequence[int]) -> None:
    """Options given as bytes get the keyword path's checks before the plugin sees them."""
    check_placement(decode_compile_options(data), device_ids)


def positive_count(name: str, value: object) -> int:
    """``value`` if it is a positive int (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if value >= 1 << 31:
        raise ValueError(f"{name} must be below 2**31, got {value}")
    return value
