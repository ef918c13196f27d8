"""A reader for XSpace, the profile format of XLA's profilers (tsl's ``xplane.proto``).

A plugin's PJRT profiler extension hands its record over as serialized
XSpace; jax's profiler writes the same bytes to ``*.xplane.pb``. This module
decodes them in pure Python (protobuf's wire format, no protobuf package):

::

    space = pjrt_py.xspace.parse(data)
    for plane in space.planes:           # a device, or the host
        for line in plane.lines:         # a stream, a thread, an op level
            for event in line.events:
                name = plane.event_name(event)
                start_ps = line.timestamp_ns * 1000 + event.offset_ps

Only what a timeline needs is kept: planes, lines, events, their stats and
the two metadata maps. Unknown fields are skipped (a newer schema still
reads). Anything that is not a well-formed message of this schema (cut
short, a field of the wrong wire type, a length past the end, a group)
raises ``ValueError`` naming where; nothing recurses on the input, so
nesting cannot go deeper than the schema's five levels.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

StatValue: TypeAlias = "float | int | str | bytes"

_U64 = (1 << 64) - 1
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


@dataclass(slots=True)
class XStat:
    """One statistic: ``metadata_id`` names it (the plane's ``stat_metadata``).

    ``is_ref`` says ``value`` is the id of a stat metadata whose name is the
    actual (string) value, which ``XPlane.stat_value`` resolves.
    """

    metadata_id: int = 0
    value: StatValue = 0
    is_ref: bool = False


@dataclass(slots=True)
class XEvent:
    """An event on a line: ``offset_ps`` from the line's start, or a count
    (``num_occurrences``, then it has no place on the timeline)."""

    metadata_id: int = 0
    offset_ps: int = 0
    num_occurrences: int | None = None
    duration_ps: int = 0
    stats: list[XStat] = field(default_factory=list)


@dataclass(slots=True)
class XLine:
    """A timeline of a plane: a stream, a thread, a level of ops."""

    id: int = 0
    display_id: int = 0
    name: str = ""
    display_name: str = ""
    timestamp_ns: int = 0
    duration_ps: int = 0
    events: list[XEvent] = field(default_factory=list)


@dataclass(slots=True)
class XEventMetadata:
    """What events with this id are: a name (and a display name), stats."""

    id: int = 0
    name: str = ""
    display_name: str = ""
    stats: list[XStat] = field(default_factory=list)


@dataclass(slots=True)
class XStatMetadata:
    """A statistic's name and description."""

    id: int = 0
    name: str = ""
    description: str = ""


@dataclass(slots=True)
class XPlane:
    """A device, or the host: its lines and the metadata their events refer to."""

    id: int = 0
    name: str = ""
    lines: list[XLine] = field(default_factory=list)
    event_metadata: dict[int, XEventMetadata] = field(default_factory=dict)
    stat_metadata: dict[int, XStatMetadata] = field(default_factory=dict)
    stats: list[XStat] = field(default_factory=list)

    def event_name(self, event: XEvent) -> str:
        """The event's display name, else its name, else ``"event <id>"``."""
        meta = self.event_metadata.get(event.metadata_id)
        if meta is None:
            return f"event {event.metadata_id}"
        return meta.display_name or meta.name or f"event {event.metadata_id}"

    def stat_name(self, stat: XStat) -> str:
        """The stat's name, or ``"stat <id>"`` where the plane has none."""
        meta = self.stat_metadata.get(stat.metadata_id)
        return meta.name if meta is not None and meta.name else f"stat {stat.metadata_id}"

    def stat_value(self, stat: XStat) -> StatValue:
        """The stat's value, a reference resolved to the name it refers to."""
        if stat.is_ref:
            meta = self.stat_metadata.get(int(stat.value))
            return meta.name if meta is not None else f"stat {stat.value!r}"
        return stat.value

    def stats_dict(self, stats: list[XStat]) -> dict[str, StatValue]:
        """``stats`` by name, references resolved."""
        return {self.stat_name(s): self.stat_value(s) for s in stats}


@dataclass(slots=True)
class XSpace:
    """A whole profile: planes, and what the profilers reported."""

    planes: list[XPlane] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)


# ---- the wire format -------------------------------------------------------


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ValueError(f"XSpace: a varint is cut short at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _U64, pos
        shift += 7
        if shift >= 70:
            raise ValueError(f"XSpace: a varint longer than 10 bytes ends at byte {pos}")


def _fields(data: bytes, pos: int, end: int, where: str) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or start, end) for each field in data[pos:end].

    A varint's or fixed field's value comes as the third item; a
    length-delimited field's bytes are data[third:fourth].
    """
    while pos < end:
        key = data[pos]  # one-byte varints (most keys and small values) read inline
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError(f"XSpace: field number 0 in {where} at byte {pos - 1}")
        if wire == _VARINT:
            if pos < end and data[pos] < 0x80:
                value, pos = data[pos], pos + 1
            else:
                value, pos = _varint(data, pos, end)
            yield number, wire, value, pos
        elif wire == _LENGTH:
            size, pos = _varint(data, pos, end)
            if size > end - pos:
                raise ValueError(
                    f"XSpace: {where} field {number} is {size} bytes long, "
                    f"but only {end - pos} are left at byte {pos}"
                )
            yield number, wire, pos, pos + size
            pos += size
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            if width > end - pos:
                raise ValueError(f"XSpace: {where} field {number} is cut short at byte {pos}")
            yield number, wire, int.from_bytes(data[pos : pos + width], "little"), pos + width
            pos += width
        else:
            raise ValueError(
                f"XSpace: wire type {wire} ({'a group' if wire in (3, 4) else 'invalid'}) "
                f"in {where}, field {number}, at byte {pos}"
            )


def _want(wire: int, expected: int, where: str, number: int) -> None:
    if wire != expected:
        raise ValueError(
            f"XSpace: {where} field {number} has wire type {wire}, the schema says {expected}"
        )


def _int64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


def _text(data: bytes, start: int, end: int) -> str:
    return data[start:end].decode("utf-8", "replace")


def _stat(data: bytes, pos: int, end: int) -> XStat:
    stat = XStat()
    for number, wire, a, b in _fields(data, pos, end, "XStat"):
        if number == 1:
            _want(wire, _VARINT, "XStat", number)
            stat.metadata_id = _int64(a)
        elif number == 2:
            _want(wire, _FIXED64, "XStat", number)
            stat.value = struct.unpack("<d", a.to_bytes(8, "little"))[0]
        elif number in (3, 4, 7):  # uint64, int64, ref
            _want(wire, _VARINT, "XStat", number)
            stat.value, stat.is_ref = (_int64(a) if number == 4 else a), number == 7
        elif number in (5, 6):  # string, bytes
            _want(wire, _LENGTH, "XStat", number)
            stat.value = _text(data, a, b) if number == 5 else data[a:b]
    return stat


def _event(data: bytes, pos: int, end: int) -> XEvent:
    event = XEvent()
    for number, wire, a, b in _fields(data, pos, end, "XEvent"):
        if number == 4:
            _want(wire, _LENGTH, "XEvent", number)
            event.stats.append(_stat(data, a, b))
        elif number in (1, 2, 3, 5):
            _want(wire, _VARINT, "XEvent", number)
            if number == 1:
                event.metadata_id = _int64(a)
            elif number == 2:
                event.offset_ps, event.num_occurrences = _int64(a), None
            elif number == 3:
                event.duration_ps = _int64(a)
            else:
                event.num_occurrences, event.offset_ps = _int64(a), 0
    return event


def _line(data: bytes, pos: int, end: int) -> XLine:
    line = XLine()
    for number, wire, a, b in _fields(data, pos, end, "XLine"):
        if number == 4:
            _want(wire, _LENGTH, "XLine", number)
            line.events.append(_event(data, a, b))
        elif number in (2, 11):
            _want(wire, _LENGTH, "XLine", number)
            if number == 2:
                line.name = _text(data, a, b)
            else:
                line.display_name = _text(data, a, b)
        elif number in (1, 3, 9, 10):
            _want(wire, _VARINT, "XLine", number)
            value = _int64(a)
            if number == 1:
                line.id = value
            elif number == 3:
                line.timestamp_ns = value
            elif number == 9:
                line.duration_ps = value
            else:
                line.display_id = value
    return line


def _event_metadata(data: bytes, pos: int, end: int) -> XEventMetadata:
    meta = XEventMetadata()
    for number, wire, a, b in _fields(data, pos, end, "XEventMetadata"):
        if number == 1:
            _want(wire, _VARINT, "XEventMetadata", number)
            meta.id = _int64(a)
        elif number in (2, 4, 5):
            _want(wire, _LENGTH, "XEventMetadata", number)
            if number == 5:
                meta.stats.append(_stat(data, a, b))
            elif number == 2:
                meta.name = _text(data, a, b)
            else:
                meta.display_name = _text(data, a, b)
    return meta


def _stat_metadata(data: bytes, pos: int, end: int) -> XStatMetadata:
    meta = XStatMetadata()
    for number, wire, a, b in _fields(data, pos, end, "XStatMetadata"):
        if number == 1:
            _want(wire, _VARINT, "XStatMetadata", number)
            meta.id = _int64(a)
        elif number in (2, 3):
            _want(wire, _LENGTH, "XStatMetadata", number)
            if number == 2:
                meta.name = _text(data, a, b)
            else:
                meta.description = _text(data, a, b)
    return meta


def _map_entry(data: bytes, pos: int, end: int, where: str) -> tuple[int, int, int]:
    """A map<int64, message> entry: (key, value start, value end)."""
    key, start, stop = 0, 0, 0
    for number, wire, a, b in _fields(data, pos, end, where):
        if number == 1:
            _want(wire, _VARINT, where, number)
            key = _int64(a)
        elif number == 2:
            _want(wire, _LENGTH, where, number)
            start, stop = a, b
    return key, start, stop


def _plane(data: bytes, pos: int, end: int) -> XPlane:
    plane = XPlane()
    for number, wire, a, b in _fields(data, pos, end, "XPlane"):
        if number == 1:
            _want(wire, _VARINT, "XPlane", number)
            plane.id = _int64(a)
            continue
        if number <= 6:
            _want(wire, _LENGTH, "XPlane", number)
        if number == 2:
            plane.name = _text(data, a, b)
        elif number == 3:
            plane.lines.append(_line(data, a, b))
        elif number == 4:
            key, start, stop = _map_entry(data, a, b, "XPlane.event_metadata")
            plane.event_metadata[key] = _event_metadata(data, start, stop)
        elif number == 5:
            key, start, stop = _map_entry(data, a, b, "XPlane.stat_metadata")
            plane.stat_metadata[key] = _stat_metadata(data, start, stop)
        elif number == 6:
            plane.stats.append(_stat(data, a, b))
    return plane


def parse(data: bytes | bytearray | memoryview) -> XSpace:
    """Decode a serialized XSpace.

    Parameters
    ----------
    data : bytes-like
        The bytes of a ``tensorflow.profiler.XSpace`` message (a
        ``*.xplane.pb`` file, or what a PJRT profiler extension collected).

    Returns
    -------
    XSpace
        Its planes, lines, events, metadata and stats.

    Raises
    ------
    ValueError
        If the bytes are not a well-formed XSpace message.
    TypeError
        If ``data`` is not bytes-like.
    """
    if isinstance(data, str) or not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"XSpace bytes expected, got {type(data).__name__}")
    data = bytes(data)
    space = XSpace()
    lists = {2: space.errors, 3: space.warnings, 4: space.hostnames}
    for number, wire, a, b in _fields(data, 0, len(data), "XSpace"):
        if number == 1:
            _want(wire, _LENGTH, "XSpace", number)
            space.planes.append(_plane(data, a, b))
        elif number in lists:
            _want(wire, _LENGTH, "XSpace", number)
            lists[number].append(_text(data, a, b))
    return space


__all__ = [
    "XEvent",
    "XEventMetadata",
    "XLine",
    "XPlane",
    "XSpace",
    "XStat",
    "XStatMetadata",
    "parse",
]
