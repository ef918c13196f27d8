"""A lexer for MLIR text, enough to read it safely: comments and strings blanked, bracket depths.

``lex(text)`` gives a ``Lexed``: the text with comments and string
contents blanked (so a bracket or keyword inside them is not seen), the
bracket depth at each position, and the strings themselves. It is written
with numpy over the whole text, so it stays linear on programs of any
size and nesting (``pjrt_py.programs.mlir_checks`` refuses what would
crash the plugin's own parser).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

# A comment, or a string literal (with escapes). A regex that starts with a
# literal, or a small set of characters, is searched for at C speed: hence no
# look-behinds, and the character before a keyword is checked in Python.
_NOISE = re.compile(r'//[^\n]*|"(?:[^"\\]|\\.)*"', re.S)


_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.$@%#!-")


_LIST_PUNCT = re.compile(r"[()\[\]{}<>,]")
_STEP = np.zeros(256, np.int8)
_STEP[np.frombuffer(b"([{<", np.uint8)] = 1
_STEP[np.frombuffer(b")]}>", np.uint8)] = -1


_ESCAPE = re.compile(r"\\(?:([0-9a-fA-F]{2})|(.))", re.S)


class Lexed:
    """``text``, and ``clean``: the same text with comments and strings blanked."""

    def __init__(self, text: str) -> None:
        self.text = text
        codes = np.frombuffer(text.encode("utf-32-le"), np.uint32).copy()  # one per character
        spans = np.array([m.span() for m in _NOISE.finditer(text)], np.intp).reshape(-1, 2)
        starts, ends = spans[:, 0], spans[:, 1]
        # @"quoted name" stays a symbol of the same length: @$$$$$
        quoted = (starts > 0) & (codes[starts - 1] == ord("@"))
        keep = codes != ord("\n")
        codes[_inside(starts, ends, codes.size) & keep] = ord(" ")
        codes[_inside(starts[quoted], ends[quoted], codes.size) & keep] = ord("$")
        codes[1:][(codes[:-1] == ord("-")) & (codes[1:] == ord(">"))] = ord(" ")  # not a bracket
        self.clean = codes.tobytes().decode("utf-32-le")
        # The brackets' offsets, and the depth after each one. A stray closer
        # never takes the depth below 0 (so it cannot hide openers after it).
        steps = _STEP[np.minimum(codes, 255)]
        self.bracket_at = np.flatnonzero(steps)
        total = np.cumsum(steps[self.bracket_at], dtype=np.int64)
        self.depth = total - np.minimum.accumulate(np.minimum(total, 0))

    def depths_at(self, offsets: list[int]) -> list[int]:
        """The depth just before each of ``offsets``."""
        before = np.searchsorted(self.bracket_at, np.asarray(offsets, np.intp))
        return [int(self.depth[k - 1]) if k else 0 for k in before.tolist()]

    def starts_word(self, pos: int) -> bool:
        """Whether a keyword at ``pos`` is not the tail of a longer name."""
        return pos == 0 or self.clean[pos - 1] not in _WORD_CHARS

    def line(self, pos: int) -> int:
        return self.text.count("\n", 0, pos) + 1

    def spans(self, open_at: int) -> tuple[list[tuple[int, int]], int]:
        """Spans of the top-level comma-separated items of the list opening at
        ``open_at``, and the offset of its closing bracket."""
        depth, begin, spans = 0, open_at + 1, []
        for m in _LIST_PUNCT.finditer(self.clean, open_at):
            c = m.group()
            if c in "([{<":
                depth += 1
            elif c == ",":
                if depth == 1:
                    spans.append((begin, m.start()))
                    begin = m.end()
            else:
                depth -= 1
                if depth == 0:
                    spans.append((begin, m.start()))
                    return [s for s in spans if self.clean[s[0] : s[1]].strip()], m.start()
        raise ValueError(f"unbalanced brackets in the list at line {self.line(open_at)}")

    def string_at(self, pos: int) -> str | None:
        """The value of the string literal starting at ``pos``, if one does."""
        while pos < len(self.text) and self.text[pos].isspace():
            pos += 1
        m = _NOISE.match(self.text, pos)
        if m is None or not m.group().startswith('"'):
            return None
        return _ESCAPE.sub(_unescape, m.group()[1:-1])


def _unescape(m: re.Match[str]) -> str:
    return chr(int(m.group(1), 16)) if m.group(1) else {"n": "\n", "t": "\t"}.get(m[2], m[2])


def _inside(starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any], size: int) -> Any:
    """A mask of the characters in the sorted, disjoint spans ``[starts, ends)``."""
    edges = np.zeros(size + 1, np.int8)
    edges[starts] = 1
    edges[ends] -= 1  # 0 where one span ends and the next starts
    return np.cumsum(edges[:size], dtype=np.int8) > 0


@functools.lru_cache(maxsize=2)  # compile checks, then reads, the same text
def lex(text: str) -> Lexed:
    return Lexed(text)


__all__ = ["Lexed", "lex"]
