"""Refusing MLIR text that would crash the plugin's parser, before it sees it.

``check_program`` raises a ``ValueError`` for brackets nested too deep, a
type whose size overflows int64, and a cycle of calls between functions:
each of these killed the process inside the plugin when it was measured.
"""

from __future__ import annotations

import re

import numpy as np

from .mlir_lexer import Lexed, lex
from .mlir_text import _SYMBOL, INT64_MAX

# jax programs nest brackets fewer than 50 deep (a while in a cond in a while
# is about ten). The parser recurses once per level; it overflows an 8 MiB
# stack at about 30,000 levels, and a thread with a smaller stack sooner, so
# the limit keeps a wide margin on both sides.
MAX_DEPTH = 1000


_DEFINE = re.compile(rf"func\.func\s+(?:(?:public|private|nested)\s+)*({_SYMBOL})")


_CALL = re.compile(rf"call(?:ee\s*=\s*|\s+)({_SYMBOL})")  # call @f, func.call @f, callee = @f


# A shaped type with at least 18 characters of dimensions (fewer hold at most
# 17 digits: under 10**17 elements of at most 16 bytes, far below int64),
# then its dimensions and element type.
_SHAPED = [
    re.compile(
        rf"{kind}<(?=[\d?x\[\]\s]{{18}})\s*((?:(?:\d+|\?|\[\s*\d+\s*\])\s*x\s*)+)"
        r"(complex<)?\s*([\w.!]*)"
    )
    for kind in ("tensor", "memref", "vector")
]


_BITS = re.compile(r"[a-z]+(\d+)")


def check_program(text: str) -> None:
    """Raise ``ValueError`` for text that would crash a plugin instead of failing.

    Checked: bracket nesting deeper than ``MAX_DEPTH``; a cycle of calls
    among the module's functions (``call``, ``func.call`` or ``callee =``);
    a ``tensor`` / ``memref`` / ``vector`` type whose static element count,
    or size in bytes, exceeds int64. Comments and strings are ignored. Other
    errors, a missing ``@main`` included, are left to the compiler.
    """
    lexed = lex(text)
    _check_depth(lexed)
    _check_types(lexed)
    _check_calls(lexed)


def _check_depth(lexed: Lexed) -> None:
    depth = lexed.depth
    if depth.size and int(depth.max()) > MAX_DEPTH:
        where = int(lexed.bracket_at[int(np.argmax(depth > MAX_DEPTH))])
        raise ValueError(
            f"program nests brackets more than {MAX_DEPTH} deep (line {lexed.line(where)}); "
            "the MLIR parser would overflow its stack"
        )


def _check_types(lexed: Lexed) -> None:
    for pattern in _SHAPED:
        for m in pattern.finditer(lexed.clean):
            dims = [int(d) for d in re.findall(r"\d+", m.group(1))]
            count = 1
            for d in dims:
                count *= d
            bits = _BITS.match(m.group(3))
            width = -(-int(bits.group(1)) // 8) if bits else 8  # unknown element: 8 bytes
            width *= 2 if m.group(2) else 1
            if max(dims, default=0) > INT64_MAX or count * width > INT64_MAX:
                raise ValueError(
                    f"type {lexed.text[m.start() : m.end()]}...> at line {lexed.line(m.start())} "
                    f"has {count} elements of {width} byte(s): its size overflows int64"
                )


def _check_calls(lexed: Lexed) -> None:
    events = [(m.start(), m.start(1), m.end(1), True) for m in _DEFINE.finditer(lexed.clean)]
    for m in _CALL.finditer(lexed.clean):
        start = m.start()
        if lexed.clean.startswith("func.", start - 5) and not m.group().startswith("callee"):
            start -= 5
        if lexed.starts_word(start):
            events.append((start, m.start(1), m.end(1), False))
    events.sort()
    depths = lexed.depths_at([e[0] for e in events])
    calls: dict[str, list[tuple[str, int]]] = {}  # function -> (callee, offset)
    current: tuple[str, int] | None = None  # the function being read, its depth
    for (start, begin, end, define), depth in zip(events, depths, strict=True):
        name = lexed.text[begin:end]  # quoted names (@"f") from the text
        if define:
            if lexed.starts_word(start):
                current = (name, depth)
                calls.setdefault(name, [])
        elif current is not None and depth > current[1]:
            calls[current[0]].append((name, start))
    cycle = _find_cycle(calls)
    if cycle is not None:
        path, at = cycle
        raise ValueError(
            f"program calls itself recursively: {' -> '.join(path)} (the call at line "
            f"{lexed.line(at)}); XLA cannot compile recursion"
        )


def _find_cycle(calls: dict[str, list[tuple[str, int]]]) -> tuple[list[str], int] | None:
    """A cycle as ``[@a, @b, @a]`` with the offset of its closing call, or None.

    Iterative depth-first search, ``@main`` first, so a deep call chain
    cannot exhaust Python's stack.
    """
    order = sorted(calls, key=lambda name: name != "@main")
    done: set[str] = set()
    for root in order:
        if root in done:
            continue
        path, on_path = [root], {root: 0}
        stack = [iter(calls[root])]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                finished = path.pop()
                del on_path[finished]
                done.add(finished)
                continue
            callee, at = step
            if callee in on_path:
                return [*path[on_path[callee] :], callee], at
            if callee in calls and callee not in done:
                on_path[callee] = len(path)
                path.append(callee)
                stack.append(iter(calls[callee]))
    return None


__all__ = ["MAX_DEPTH", "check_program"]
