"""Whether MLIR bytecode is safe to hand to jax's MLIR bindings in-process.

pjrt_py reads bytecode programs with jaxlib's MLIR bindings to check them
and take their signature (``mlir_text.bytecode_to_text``). Those bindings
end the process when a parse fails with a diagnostic that is not UTF-8:
nanobind's string conversion throws inside the error it is building, and
the C++ runtime aborts (``conversion error!``). A diagnostic quotes the
producer string on every failure, and names, dialect names and assembly
text from the bytecode where they are wrong. One corrupted byte in any of
those killed ``Client.compile`` (found by flipping bytes of a portable
artifact; the plugins themselves report such bytecode as an error).

``text_is_utf8`` walks the bytecode's structure (MLIR's ``BytecodeFormat``)
far enough to find every place such text lives: the producer, the string
section, and the attributes and types stored as assembly text. Bytecode
whose structure cannot be followed, or whose text is not UTF-8, is not read
with jax's bindings; the compile helper then hands it to the plugin as it
is, which reports what is wrong with it (``bytecode_reader``).
"""

from __future__ import annotations

MAGIC = b"ML\xefR"
_STRINGS, _ATTR_TYPE, _ATTR_TYPE_OFFSETS = 0, 2, 3
_PADDING = 0xCB


class _Malformed(Exception):
    """The bytecode's structure cannot be followed."""


class _Reader:
    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data, self.pos = data, pos
        self.end = len(data) if end is None else end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise _Malformed
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        """MLIR's prefix varint: the first byte's trailing zeros count the
        bytes that follow; 0 means eight more, holding the whole value."""
        first = self.byte()
        extra = 8 if first == 0 else (first & -first).bit_length() - 1
        if self.pos + extra > self.end:
            raise _Malformed
        raw = int.from_bytes(self.data[self.pos - 1 : self.pos + extra], "little")
        self.pos += extra
        return raw >> 8 if first == 0 else raw >> (extra + 1)

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > self.end:
            raise _Malformed
        self.pos += size
        return self.data[self.pos - size : self.pos]

    def cstring(self) -> bytes:
        nul = self.data.find(0, self.pos, self.end)
        if nul < 0:
            raise _Malformed
        text = self.data[self.pos : nul]
        self.pos = nul + 1
        return text


def _sections(reader: _Reader) -> dict[int, tuple[int, int]]:
    """Each section's id -> (start, end) of its data."""
    sections: dict[int, tuple[int, int]] = {}
    while reader.pos < reader.end:
        tag = reader.byte()
        size = reader.varint()
        if tag & 0x80:
            alignment = reader.varint()
            if alignment == 0 or alignment & (alignment - 1):
                raise _Malformed
            while reader.pos % alignment:
                if reader.byte() != _PADDING:
                    raise _Malformed
        start = reader.pos
        reader.take(size)
        sections[tag & 0x7F] = (start, reader.pos)
    return sections


def _utf8(text: bytes) -> None:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed from None


def _check_strings(data: bytes, start: int, end: int) -> None:
    reader = _Reader(data, start, end)
    count = reader.varint()
    total = sum(reader.varint() for _ in range(count))
    _utf8(reader.take(total))


def _check_assembly_entries(data: bytes, sections: dict[int, tuple[int, int]]) -> None:
    """Attributes and types written as assembly text (no custom encoding)."""
    if _ATTR_TYPE_OFFSETS not in sections:
        return
    offsets = _Reader(data, *sections[_ATTR_TYPE_OFFSETS])
    entries = _Reader(data, *sections.get(_ATTR_TYPE, (0, 0)))
    remaining = offsets.varint() + offsets.varint()  # attributes, then types
    while remaining > 0:
        offsets.varint()  # the dialect
        count = offsets.varint()
        if count > remaining:
            raise _Malformed
        remaining -= count
        for _ in range(count):
            word = offsets.varint()
            entry = entries.take(word >> 1)
            if not word & 1:  # assembly text, NUL-terminated
                _utf8(entry.rstrip(b"\0"))


def producer(code: bytes) -> bytes | None:
    """The producer string of bytecode ``code`` (``b"StableHLO_v1.16.1"``),
    or None if ``code`` is not bytecode or has none."""
    if code[:4] != MAGIC:
        return None
    try:
        reader = _Reader(code, 4)
        reader.varint()  # the bytecode version
        return reader.cstring()
    except _Malformed:
        return None


def text_is_utf8(code: bytes) -> bool:
    """Whether ``code`` is bytecode whose structure can be followed and all
    of whose text (producer, strings, assembly-format entries) is UTF-8."""
    if code[:4] != MAGIC:
        return False
    try:
        reader = _Reader(code, 4)
        reader.varint()  # the bytecode version
        _utf8(reader.cstring())  # the producer, quoted by every failure
        sections = _sections(reader)
        if _STRINGS in sections:
            _check_strings(code, *sections[_STRINGS])
        _check_assembly_entries(code, sections)
    except _Malformed:
        return False
    return True


__all__ = ["MAGIC", "producer", "text_is_utf8"]
