"""Just enough of XLA's HLO protobufs to read a compiled program's signature.

``PJRT_Executable_OptimizedProgram`` returns an ``HloModuleProtoWithConfig``
(format ``hlo_with_config``) or an ``HloModuleProto`` (``hlo``). pjrt_py takes
no protobuf dependency, so the few fields it needs are read from the wire
format here. Field numbers are those of xla/xla.proto, xla/xla_data.proto and
xla/service/hlo.proto.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

# HloModuleProtoWithConfig
_WITH_CONFIG_MODULE = 1
# HloModuleProto
_MODULE_NAME = 1
_MODULE_COMPUTATIONS = 3
_MODULE_PROGRAM_SHAPE = 4  # host_program_shape: before SPMD partitioning
_MODULE_ENTRY_ID = 6
_MODULE_ALIASES = 8  # input_output_alias
_MODULE_DONORS = 18  # buffer_donor
# HloComputationProto
_COMPUTATION_PROGRAM_SHAPE = 4
_COMPUTATION_ID = 5
# HloInputOutputAliasProto / HloBufferDonorProto
_ENTRIES = 1
_ALIAS_PARAMETER = 2  # AliasEntryProto.parameter_number
_DONOR_PARAMETER = 1  # BufferDonorEntryProto.parameter_number
# ProgramShapeProto
_PROGRAM_PARAMETERS = 1
_PROGRAM_RESULT = 2
# ShapeProto
_SHAPE_ELEMENT_TYPE = 2
_SHAPE_DIMENSIONS = 3
_SHAPE_TUPLE_SHAPES = 4
_SHAPE_IS_DYNAMIC = 6

_TUPLE = 13  # xla.PrimitiveType.TUPLE

# xla.PrimitiveType -> numpy dtype. These numbers differ from PJRT_Buffer_Type
# for BF16 and the complex types, so they get their own table.
_PRIMITIVE: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.bool_),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.uint8),
    7: np.dtype(np.uint16),
    8: np.dtype(np.uint32),
    9: np.dtype(np.uint64),
    10: np.dtype(np.float16),
    11: np.dtype(np.float32),
    12: np.dtype(np.float64),
    15: np.dtype(np.complex64),
    16: np.dtype(ml_dtypes.bfloat16),
    18: np.dtype(np.complex128),
    19: np.dtype(ml_dtypes.float8_e5m2),
    20: np.dtype(ml_dtypes.float8_e4m3fn),
}


class ProtoError(ValueError):
    """The bytes are not the protobuf message they were expected to be."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ProtoError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ProtoError("varint too long")


read_varint = _varint  # (value, next offset) of the varint at data[at]


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) for each field of one message: ints or bytes."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ProtoError("truncated field")
            yield number, data[at : at + size]
            at += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, data[at : at + width]
            at += width
        else:
            raise ProtoError(f"unsupported wire type {wire}")


def _packed(value: int | bytes) -> list[int]:
    if isinstance(value, int):  # one element written unpacked
        return [value]
    out, at = [], 0
    while at < len(value):
        item, at = _varint(value, at)
        out.append(item)
    return out


@dataclass(frozen=True)
class Shape:
    """An array shape from a ShapeProto; ``dtype`` is None for tokens and tuples."""

    dims: tuple[int, ...]
    dtype: np.dtype[Any] | None
    dynamic: bool  # any dimension only bounded, not fixed
    elements: tuple[Shape, ...] = ()  # the members of a tuple shape
    is_tuple: bool = False


def _shape(data: bytes) -> Shape:
    kind, dims, dynamic, elements = 0, [], False, []
    for number, value in fields(data):
        if number == _SHAPE_ELEMENT_TYPE and isinstance(value, int):
            kind = value
        elif number == _SHAPE_DIMENSIONS:
            dims.extend(_packed(value))
        elif number == _SHAPE_IS_DYNAMIC:
            dynamic = dynamic or any(_packed(value))
        elif number == _SHAPE_TUPLE_SHAPES and isinstance(value, bytes):
            elements.append(_shape(value))
    # int64 dimensions: a negative one (dynamic in some encodings) wraps
    dims = [d - (1 << 64) if d >= 1 << 63 else d for d in dims]
    dynamic = dynamic or any(d < 0 for d in dims)
    return Shape(tuple(dims), _PRIMITIVE.get(kind), dynamic, tuple(elements), kind == _TUPLE)


@dataclass(frozen=True)
class ProgramShape:
    """The entry computation's parameters and results."""

    name: str
    parameters: tuple[Shape, ...]
    results: tuple[Shape, ...]  # a tuple result is flattened one level


def hlo_module(data: bytes, fmt: str) -> bytes:
    """The ``HloModuleProto`` inside an optimized program of format ``fmt``."""
    if fmt == "hlo":
        return data
    if fmt == "hlo_with_config":
        for number, value in fields(data):
            if number == _WITH_CONFIG_MODULE and isinstance(value, bytes):
                return value
        raise ProtoError("hlo_with_config without a module")
    raise ProtoError(f"optimized program format {fmt!r} is not an HLO proto")


def program_shape(module: bytes) -> ProgramShape:
    """The entry signature recorded in an ``HloModuleProto``.

    The entry computation's own shape is preferred: after SPMD partitioning
    it is one device's share, while the module's host shape is global.
    """
    name, shape, entry_id, computations = "", None, None, []
    for number, value in fields(module):
        if number == _MODULE_NAME and isinstance(value, bytes):
            name = value.decode("utf-8", "replace")
        elif number == _MODULE_PROGRAM_SHAPE and isinstance(value, bytes):
            shape = value
        elif number == _MODULE_ENTRY_ID and isinstance(value, int):
            entry_id = value
        elif number == _MODULE_COMPUTATIONS and isinstance(value, bytes):
            computations.append(value)
    for computation in computations if entry_id is not None else ():
        found = dict(fields(computation))
        if found.get(_COMPUTATION_ID) == entry_id:
            entry_shape = found.get(_COMPUTATION_PROGRAM_SHAPE)
            if isinstance(entry_shape, bytes):
                shape = entry_shape
            break
    if shape is None:
        raise ProtoError("module has no program shape")
    params, result = [], None
    for number, value in fields(shape):
        if number == _PROGRAM_PARAMETERS and isinstance(value, bytes):
            params.append(_shape(value))
        elif number == _PROGRAM_RESULT and isinstance(value, bytes):
            result = _shape(value)
    if result is None:
        results: tuple[Shape, ...] = ()
    elif result.is_tuple:
        results = result.elements
    else:
        results = (result,)
    return ProgramShape(name, tuple(params), results)


def donated_parameters(module: bytes) -> tuple[int, ...]:
    """Entry parameters the program may donate (aliased to an output, or donors)."""
    donated = set()
    for number, value in fields(module):
        if number not in (_MODULE_ALIASES, _MODULE_DONORS) or not isinstance(value, bytes):
            continue
        field = _ALIAS_PARAMETER if number == _MODULE_ALIASES else _DONOR_PARAMETER
        for entry_number, entry in fields(value):
            if entry_number == _ENTRIES and isinstance(entry, bytes):
                parameter = dict(fields(entry)).get(field, 0)  # proto3: 0 is not written
                if isinstance(parameter, int):
                    donated.add(parameter)
    return tuple(sorted(donated))


# ---- writing: the few fields pjrt_py encodes itself ------------------------------
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def write_varint(value: int) -> bytes:
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


def field_key(number: int, wire: int) -> bytes:
    return write_varint(number << 3 | wire)


def int_field(number: int, value: int) -> bytes:
    return field_key(number, VARINT) + write_varint(value)


def bytes_field(number: int, payload: bytes) -> bytes:
    return field_key(number, LEN) + write_varint(len(payload)) + payload
