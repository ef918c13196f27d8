"""``xla.CompileOptionsProto``, encoded and checked in protobuf wire format by hand.

pjrt_py takes no protobuf dependency: the few fields it sets are written
directly, and options given as bytes are decoded just far enough to check
them. Field numbers are those of xla/pjrt/proto/compile_options.proto and
xla/xla.proto.

PJRT plugins CHECK-fail (abort the process) on options they cannot use, for
example empty options (replica count 0). Everything is validated here first,
whether it came as keywords or as bytes, and the encoding always carries
num_replicas and num_partitions.

By default the options are the ones ``jax.jit`` sends for the same program
(``like_jax=True``): jax's ``DebugOptions`` (recorded in ``_jax_options`` from
jaxlib; among them ``xla_cpu_enable_fast_min_max = false``, so
``max(1, NaN)`` is NaN as the StableHLO spec and jax say, where a plugin's own
default returns 1), SPMD partitioning on, and the few other build fields jax
sets. ``debug_options`` overrides single fields by name or number.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import _jax_options
from ._hlo_proto import ProtoError, fields, read_varint
from .mlir_text import bytecode_to_text, module_attribute_int

# CompileOptionsProto
_EXECUTABLE_BUILD_OPTIONS = 3
_COMPILE_PORTABLE_EXECUTABLE = 4
# ExecutableBuildOptionsProto
_DEVICE_ORDINAL = 1
_DEBUG_OPTIONS = 3
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

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


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


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _int_field(number: int, value: int) -> bytes:
    return _key(number, _VARINT) + _varint(value)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _key(number, _LEN) + _varint(len(payload)) + payload


def positive_count(name: str, value: object) -> int:
    """``value`` if it is a positive int (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if value >= 1 << 31:
        raise ValueError(f"{name} must be below 2**31, got {value}")
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


# -- debug options ---------------------------------------------------------

DebugValue = bool | int | float | str | bytes


def _raw_fields(data: bytes) -> list[tuple[int, bytes]]:
    """Each field of a message as (number, its exact encoding)."""
    out, at = [], 0
    while at < len(data):
        start = at
        key, at = read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, at = read_varint(data, at)
        elif wire == _LEN:
            size, at = read_varint(data, at)
            at += size
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
        else:
            raise ProtoError(f"unsupported wire type {wire}")
        if at > len(data):
            raise ProtoError("truncated field")
        out.append((number, data[start:at]))
    return out


def _debug_field(key: str | int, value: DebugValue) -> bytes:
    """One override, encoded; ValueError / TypeError for a bad name or value."""
    if isinstance(key, str):
        known = _jax_options.DEBUG_OPTION_FIELDS.get(key)
        if known is None:
            raise ValueError(
                f"unknown debug option {key!r}: pass a known name "
                f"(pjrt_py.compile_options.DEBUG_OPTION_NAMES) or its xla.DebugOptions "
                f"field number"
            )
        number, kind = known
        expected = {"bool": bool, "int": int, "str": str}[kind]
        if not isinstance(value, expected) or (kind == "int" and isinstance(value, bool)):
            raise TypeError(f"debug option {key!r} takes a {kind}, got {value!r}")
    elif isinstance(key, int) and not isinstance(key, bool) and 0 < key < 1 << 29:
        number = key
    else:
        raise TypeError(f"debug option keys are names or field numbers, got {key!r}")
    if isinstance(value, (bool, int)):
        if not -(1 << 63) <= int(value) < 1 << 64:
            raise ValueError(f"debug option {key!r}: {value} does not fit 64 bits")
        return _int_field(number, int(value))
    if isinstance(value, float):  # DebugOptions' floating fields are proto `float`
        return _key(number, _FIXED32) + struct.pack("<f", value)
    if isinstance(value, str):
        return _bytes_field(number, value.encode())
    if isinstance(value, bytes):
        return _bytes_field(number, value)
    raise TypeError(f"debug option {key!r}: unsupported value {value!r}")


DEBUG_OPTION_NAMES = frozenset(_jax_options.DEBUG_OPTION_FIELDS)


def encode_debug_options(
    overrides: Mapping[str | int, DebugValue] | None, *, like_jax: bool = True
) -> bytes:
    """``xla.DebugOptions``: jax's (``like_jax``) or none, with ``overrides`` set."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"debug_options must be a dict, got {type(overrides).__name__}")
    encoded = {}
    for key, value in (overrides or {}).items():
        field = _debug_field(key, value)
        number = _jax_options.DEBUG_OPTION_FIELDS[key][0] if isinstance(key, str) else key
        encoded[number] = field
    base = _raw_fields(_jax_options.DEBUG_OPTIONS) if like_jax else []
    kept = b"".join(raw for number, raw in base if number not in encoded)
    return kept + b"".join(encoded[n] for n in sorted(encoded))


# -- CompileOptionsProto -----------------------------------------------------


def encode_compile_options(
    *,
    num_replicas: int = 1,
    num_partitions: int = 1,
    device_assignment: Sequence[Sequence[int]] | None = None,
    use_spmd_partitioning: bool | None = None,
    use_shardy_partitioner: bool | None = None,
    compile_portable_executable: bool = False,
    debug_options: Mapping[str | int, DebugValue] | None = None,
    like_jax: bool = True,
) -> bytes:
    """Serialized ``CompileOptionsProto``.

    ``like_jax`` (default) writes what ``jax.jit`` sends besides the counts
    and placement: jax's ``DebugOptions``, SPMD partitioning on, and its other
    build fields. ``like_jax=False`` leaves the plugin its own defaults; with
    one replica and one partition that encodes to the 6 bytes
    ``1a 04 20 01 28 01``, the smallest options the CPU plugins accept.
    ``use_spmd_partitioning`` defaults to ``like_jax or num_partitions > 1``,
    ``use_shardy_partitioner`` to ``like_jax`` (as jax 0.10 does: a plugin
    falls back to GSPMD for a module with GSPMD shardings, checked on all
    three CPU builds).
    ``debug_options`` sets single ``xla.DebugOptions`` fields, by name
    (``DEBUG_OPTION_NAMES``) or by field number.

    Parameters
    ----------
    num_replicas, num_partitions : int, optional
        The replica and partition counts (default 1 each): positive ints
        below ``2**31``.
    device_assignment : sequence of sequences of int, optional
        ``device_assignment[replica][partition]`` is a device id: a
        ``num_replicas`` x ``num_partitions`` rectangle of distinct,
        non-negative ids. None leaves the placement to the plugin.
    use_spmd_partitioning : bool, optional
        ``ExecutableBuildOptions.use_spmd_partitioning``; None for the
        default above.
    use_shardy_partitioner : bool, optional
        ``ExecutableBuildOptions.use_shardy_partitioner``; None for the
        default above.
    compile_portable_executable : bool, optional
        Set ``CompileOptionsProto.compile_portable_executable`` (off by
        default).
    debug_options : mapping, optional
        ``xla.DebugOptions`` fields to set, by name or field number, each to
        a bool, int, float, str or bytes; they override jax's values where
        ``like_jax`` writes them.
    like_jax : bool, optional
        Write what ``jax.jit`` sends (default True); False leaves the plugin
        its own defaults for everything the other arguments do not set.

    Returns
    -------
    bytes
        The serialized ``CompileOptionsProto``, for ``Client.compile``'s
        ``compile_options``.

    Raises
    ------
    ValueError
        If a count is not a positive int below ``2**31``; if
        ``device_assignment`` is not a ``num_replicas`` x ``num_partitions``
        rectangle of distinct, non-negative int ids; or if ``debug_options``
        names an unknown field or gives an int that does not fit 64 bits.
    TypeError
        If ``debug_options`` is not a mapping, a key is neither a str nor an
        int field number in ``[1, 2**29)``, or a value is not of its field's
        type (a named field's bool, int or str; for a field number, one of
        the types above).
    """
    num_replicas = positive_count("num_replicas", num_replicas)
    num_partitions = positive_count("num_partitions", num_partitions)
    if use_spmd_partitioning is None:
        use_spmd_partitioning = like_jax or num_partitions > 1
    if use_shardy_partitioner is None:
        use_shardy_partitioner = like_jax
    build = b""
    if like_jax or debug_options:
        build += _bytes_field(
            _DEBUG_OPTIONS, encode_debug_options(debug_options, like_jax=like_jax)
        )
    build += _int_field(_NUM_REPLICAS, num_replicas) + _int_field(_NUM_PARTITIONS, num_partitions)
    if use_spmd_partitioning:
        build += _int_field(_USE_SPMD_PARTITIONING, 1)
    if use_shardy_partitioner:
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
    if like_jax:
        build += b"".join(_int_field(n, v) for n, v in _jax_options.BUILD_INT_FIELDS.items())
        build += b"".join(_bytes_field(n, v) for n, v in _jax_options.BUILD_BYTES_FIELDS.items())
    out = _bytes_field(_EXECUTABLE_BUILD_OPTIONS, build)
    if compile_portable_executable:
        out += _int_field(_COMPILE_PORTABLE_EXECUTABLE, 1)
    if like_jax:
        out += b"".join(_int_field(n, v) for n, v in _jax_options.TOP_INT_FIELDS.items())
    return out


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
        if number == _REPLICA_COUNT and isinstance(value, int):
            replicas = _signed(value)
        elif number == _COMPUTATION_COUNT and isinstance(value, int):
            partitions = _signed(value)
        elif number == _COMPUTATION_DEVICES and isinstance(value, bytes):
            ids: list[int] = []
            for inner, item in fields(value):
                if inner != _REPLICA_DEVICE_IDS:
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
            if number != _EXECUTABLE_BUILD_OPTIONS:
                continue
            if not isinstance(value, bytes):
                raise ValueError("compile_options: executable_build_options is not a message")
            for inner, item in fields(value):
                if inner == _NUM_REPLICAS and isinstance(item, int):
                    replicas = _signed(item)
                elif inner == _NUM_PARTITIONS and isinstance(item, int):
                    partitions = _signed(item)
                elif inner == _DEVICE_ASSIGNMENT and isinstance(item, bytes):
                    assignment = _decode_assignment(item)
                elif inner == _DEBUG_OPTIONS and isinstance(item, bytes):
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


# -- options for a program -------------------------------------------------


def module_count(program: str | bytes, name: str) -> int:
    """``mhlo.num_replicas`` / ``mhlo.num_partitions`` of a module, else 1.

    Text is read by a real lex of the module's attribute dictionary. Bytecode
    is read through jax's MLIR bindings when the attribute's name is in it;
    without them such bytecode is refused: compiling it for one replica
    would silently give other results.
    """
    attribute = f"mhlo.{name}"
    if isinstance(program, bytes):
        if attribute.encode() not in program:
            return 1  # the name is in the bytecode's string table if it is set
        text = bytecode_to_text(program)
        if text is None:
            raise ValueError(
                f"this bytecode program sets {attribute}, which pjrt_py reads with jax's "
                f"MLIR bindings (not installed, or they cannot read it): pass {name}= "
                f"explicitly, or compile the text form"
            )
        program = text
    value = module_attribute_int(program, attribute)
    return 1 if value is None else value


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
    debug_options: Mapping[str | int, DebugValue] | None = None,
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
    check_placement(Placement(replicas, partitions, assignment), device_ids)
    if assignment is None and replicas * partitions > 1:
        ids = list(device_ids)
        assignment = [ids[r * partitions : (r + 1) * partitions] for r in range(replicas)]
    return encode_compile_options(
        num_replicas=replicas,
        num_partitions=partitions,
        device_assignment=assignment,
        debug_options=debug_options,
    )
