"""``xla.DebugOptions``: jax's defaults, and single fields overridden by name or number.

``Client.compile(debug_options=...)`` and ``encode_compile_options`` take
overrides such as ``{"xla_cpu_enable_fast_min_max": True}``; they are
written over the ``DebugOptions`` jax sends (recorded from jaxlib in
``pjrt_py.programs.jax_options``), field by field in wire format.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping

from . import jax_options as _jax_options
from .proto import (
    FIXED32,
    FIXED64,
    LEN,
    VARINT,
    ProtoError,
    bytes_field,
    field_key,
    int_field,
    read_varint,
)

DebugValue = bool | int | float | str | bytes


def _raw_fields(data: bytes) -> list[tuple[int, bytes]]:
    """Each field of a message as (number, its exact encoding)."""
    out, at = [], 0
    while at < len(data):
        start = at
        key, at = read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            _, at = read_varint(data, at)
        elif wire == LEN:
            size, at = read_varint(data, at)
            at += size
        elif wire in (FIXED64, FIXED32):
            at += 8 if wire == FIXED64 else 4
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
        return int_field(number, int(value))
    if isinstance(value, float):  # DebugOptions' floating fields are proto `float`
        return field_key(number, FIXED32) + struct.pack("<f", value)
    if isinstance(value, str):
        return bytes_field(number, value.encode())
    if isinstance(value, bytes):
        return bytes_field(number, value)
    raise TypeError(f"debug option {key!r}: unsupported value {value!r}")


DEBUG_OPTION_NAMES = frozenset(_jax_options.DEBUG_OPTION_FIELDS)


@functools.cache
def _jax_fields() -> tuple[tuple[int, bytes], ...]:
    """jax's DebugOptions, split into fields once: splitting them took most
    of a compile-cache hit (150 us of it; every compile encodes its options
    before the lookup)."""
    return tuple(_raw_fields(_jax_options.DEBUG_OPTIONS))


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
    if like_jax and not encoded:
        return _jax_options.DEBUG_OPTIONS
    base = _jax_fields() if like_jax else ()
    kept = b"".join(raw for number, raw in base if number not in encoded)
    return kept + b"".join(encoded[n] for n in sorted(encoded))
