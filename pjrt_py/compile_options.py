"""``xla.CompileOptionsProto``, encoded in protobuf wire format by hand.

pjrt_py takes no protobuf dependency: the few fields it sets are written
directly. Field numbers are those of xla/pjrt/proto/compile_options.proto
and xla/xla.proto.

PJRT plugins CHECK-fail (abort the process) on options they cannot use, for
example empty options (replica count 0). Everything is validated here first,
and the encoding always carries num_replicas and num_partitions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# CompileOptionsProto
_EXECUTABLE_BUILD_OPTIONS = 3
_COMPILE_PORTABLE_EXECUTABLE = 4
# ExecutableBuildOptionsProto
_NUM_REPLICAS = 4
_NUM_PARTITIONS = 5
_USE_SPMD_PARTITIONING = 6
_DEVICE_ASSIGNMENT = 9
_USE_SHARDY_PARTITIONER = 19
# DeviceAssignmentProto
_REPLICA_COUNT = 1
_COMPUTATION_COUNT = 2
_COMPUTATION_DEVICES = 3
# DeviceAssignmentProto.ComputationDevice
_REPLICA_DEVICE_IDS = 1

_VARINT, _LEN = 0, 2


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 two's complement, as protobuf does
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3 | _VARINT) + _varint(value)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(payload)) + payload


def positive_count(name: str, value: object) -> int:
    """``value`` if it is a positive int (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def encode_device_assignment(assignment: Sequence[Sequence[int]]) -> bytes:
    """Encode ``assignment[replica][partition] = device id``."""
    replicas = len(assignment)
    if replicas == 0:
        raise ValueError("device_assignment needs at least one replica")
    partitions = len(assignment[0])
    if partitions == 0 or any(len(row) != partitions for row in assignment):
        raise ValueError("device_assignment must be a non-empty rectangle [replica][partition]")
    ids = [i for row in assignment for i in row]
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"device ids must be non-negative ints, got {ids}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"device_assignment uses a device twice: {ids}")
    out = _int_field(_REPLICA_COUNT, replicas) + _int_field(_COMPUTATION_COUNT, partitions)
    for p in range(partitions):
        packed = b"".join(_varint(assignment[r][p]) for r in range(replicas))
        out += _bytes_field(_COMPUTATION_DEVICES, _bytes_field(_REPLICA_DEVICE_IDS, packed))
    return out


def encode_compile_options(
    *,
    num_replicas: int = 1,
    num_partitions: int = 1,
    device_assignment: Sequence[Sequence[int]] | None = None,
    use_spmd_partitioning: bool = False,
    use_shardy_partitioner: bool = False,
    compile_portable_executable: bool = False,
) -> bytes:
    """Serialized ``CompileOptionsProto``.

    The defaults (one replica, one partition) encode to the 6 bytes
    ``1a 04 20 01 28 01``, the smallest options the CPU plugin accepts.
    """
    num_replicas = positive_count("num_replicas", num_replicas)
    num_partitions = positive_count("num_partitions", num_partitions)
    build = _int_field(_NUM_REPLICAS, num_replicas) + _int_field(_NUM_PARTITIONS, num_partitions)
    if use_spmd_partitioning:
        build += _int_field(_USE_SPMD_PARTITIONING, 1)
    if use_shardy_partitioner:  # for programs with sdy.* shardings (jax's default)
        build += _int_field(_USE_SHARDY_PARTITIONER, 1)
    if device_assignment is not None:
        if len(device_assignment) != num_replicas or any(
            len(row) != num_partitions for row in device_assignment
        ):
            raise ValueError(
                f"device_assignment must be {num_replicas} replicas x {num_partitions} "
                f"partitions, got {[len(r) for r in device_assignment]}"
            )
        build += _bytes_field(_DEVICE_ASSIGNMENT, encode_device_assignment(device_assignment))
    out = _bytes_field(_EXECUTABLE_BUILD_OPTIONS, build)
    if compile_portable_executable:
        out += _int_field(_COMPILE_PORTABLE_EXECUTABLE, 1)
    return out


# -- options for a program -------------------------------------------------

_MODULE_COUNT = {
    name: re.compile(rf"mhlo\.{name}\s*=\s*(\d+)") for name in ("num_replicas", "num_partitions")
}


def module_count(program: str | bytes, name: str) -> int:
    """``mhlo.num_replicas`` / ``mhlo.num_partitions`` of a text module, else 1."""
    if isinstance(program, bytes):
        return 1
    head = program[: program.find("func.func")]  # module attributes come first
    m = _MODULE_COUNT[name].search(head)
    return int(m.group(1)) if m else 1


def uses_shardy(program: str | bytes) -> bool:
    """Whether the program carries Shardy shardings (``sdy.mesh`` / ``sdy.sharding``)."""
    return ("sdy." if isinstance(program, str) else b"sdy.") in program  # type: ignore[operator]


def program_bytes(program: str | bytes) -> bytes:
    """The bytes handed to the compiler; ValueError for an empty program."""
    code = program.encode() if isinstance(program, str) else program
    if not code:
        raise ValueError("program is empty")
    return code


def options_for_program(
    program: str | bytes,
    *,
    num_replicas: int | None,
    num_partitions: int | None,
    device_assignment: Sequence[Sequence[int]] | None,
    device: int | None,
    device_ids: Sequence[int],
) -> bytes:
    """The CompileOptionsProto for ``Client.compile``'s keyword arguments.

    ``device_assignment`` and ``device`` are device ids here; ``device_ids``
    lists the client's devices (the default assignment takes them in order).
    """
    # Validated first: the device counts below multiply them.
    replicas = positive_count(
        "num_replicas",
        module_count(program, "num_replicas") if num_replicas is None else num_replicas,
    )
    partitions = positive_count(
        "num_partitions",
        module_count(program, "num_partitions") if num_partitions is None else num_partitions,
    )
    assignment: list[list[int]] | None = None
    if device is not None:
        if device_assignment is not None or replicas * partitions != 1:
            raise ValueError(
                "device= places a single-device program; for replicas or partitions "
                "pass device_assignment"
            )
        assignment = [[device]]
    elif device_assignment is not None:
        assignment = [list(row) for row in device_assignment]
    elif replicas * partitions > 1:
        if replicas * partitions > len(device_ids):
            raise ValueError(
                f"{replicas} replica(s) x {partitions} partition(s) need "
                f"{replicas * partitions} devices; this client has {len(device_ids)}"
            )
        ids = list(device_ids)
        assignment = [ids[r * partitions : (r + 1) * partitions] for r in range(replicas)]
    if assignment is not None:
        unknown = [i for row in assignment for i in row if i not in device_ids]
        if unknown:
            raise ValueError(f"device_assignment names unknown device id(s) {unknown}")
    sharded = partitions > 1
    return encode_compile_options(
        num_replicas=replicas,
        num_partitions=partitions,
        device_assignment=assignment,
        use_spmd_partitioning=sharded,
        use_shardy_partitioner=sharded and uses_shardy(program),
    )
