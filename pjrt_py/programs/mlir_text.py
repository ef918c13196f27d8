"""MLIR program text: a small lexer, and the checks run before a plugin sees it.

The CPU plugins crash the whole process, rather than report an error, on a
few kinds of program: a recursive ``@main`` (through ``func.call``) crashes
compilation, tens of thousands of nested brackets overflow the MLIR parser's
stack, and a type whose size overflows int64 aborts. ``check_program``
turns each into a ``ValueError`` first.

The lexer is regular expressions over the whole text, not a Python loop per
character: comments and string literals are blanked out (same length, same
line breaks, so every offset and line number still holds) and everything
else is read from that clean copy, with values taken from the original at
the same offsets. Bracket depth is one numpy pass over the clean copy.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from typing import Any, NamedTuple

import numpy as np

from ..runtime.dtypes import MLIR_NAMES
from .joined import run_joined
from .mlir_bytecode import MAGIC as BYTECODE_MAGIC
from .mlir_bytecode import producer, text_is_utf8
from .mlir_lexer import Lexed, lex
from .signature import ArgSpec

INT64_MAX = 2**63 - 1

_SYMBOL = r"@[\w$.]+"
_MAIN = re.compile(r"func\.func\s+(?:(?:public|private|nested)\s+)*@main\s*\(")
_MODULE = re.compile(r"module\b(?:\s*@[\w$.]+)?\s*(?P<attrs>attributes\s*\{)?")
_PARAM_NAME = re.compile(r"\s*(%[\w.$-]+)\s*:\s*")
_AFTER_TYPE = re.compile(r"\{|\bloc\(")
_ARG_INFO = re.compile(r"jax\.arg_info\s*=")  # no \s* after: blanked strings are spaces
_LAYOUT_MODE = re.compile(r"mhlo\.layout_mode\s*=")
_MEMORY_KIND = re.compile(r"mhlo\.memory_kind\s*=")
_INT_VALUE = re.compile(r"\s*(-?\d+)\s*(?::\s*[\w.!]+)?\s*")


# -- checks --------------------------------------------------------------------


# -- reading ---------------------------------------------------------------------


_OPEN, _CLOSE = "([{<", ")]}>"


def split_top_level(text: str, start: int) -> tuple[list[str], int]:
    """Split the parenthesised list opening at text[start] on top-level commas."""
    depth, i, parts, begin = 0, start, [], start + 1
    in_string = False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "-" and text.startswith("->", i):
            i += 1  # an arrow inside a type is not a closing '>'
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                parts.append(text[begin:i])
                return [p.strip() for p in parts if p.strip()], i
        elif c == "," and depth == 1:
            parts.append(text[begin:i])
            begin = i + 1
        i += 1
    raise ValueError("unbalanced brackets in @main's signature")


def find_main(text: str) -> tuple[int, int] | None:
    """Offsets of ``func.func`` and of the ``(`` opening ``@main``'s parameters.

    Only a real definition counts (not one in a comment or string), in the
    top-level module (or a bare function list).
    """
    lexed = lex(text)
    found = [m for m in _MAIN.finditer(lexed.clean) if lexed.starts_word(m.start())]
    depths = lexed.depths_at([m.start() for m in found])
    return next(
        ((m.start(), m.end() - 1) for m, d in zip(found, depths, strict=True) if d <= 1), None
    )


def main_signature(text: str) -> list[ArgSpec] | None:
    """The parameters of ``@main``, or None if it cannot be found or read.

    Names come from ``jax.arg_info`` where present, else from ``%name``.
    """
    found = find_main(text)
    if found is None:
        return None
    lexed = lex(text)
    try:
        spans, _ = lexed.spans(found[1])
    except ValueError:
        return None
    specs = []
    for index, (begin, end) in enumerate(spans):
        head = _PARAM_NAME.match(lexed.clean, begin, end)
        if head is None:
            return None
        after = _AFTER_TYPE.search(lexed.clean, head.end(), end)  # attributes, location
        type_end = end if after is None else after.start()
        info = _ARG_INFO.search(lexed.clean, head.end(), end)
        name = (info and lexed.string_at(info.end())) or head.group(1).lstrip("%")
        shape, dtype = tensor_type(lexed.text[head.end() : type_end])
        mode = _LAYOUT_MODE.search(lexed.clean, head.end(), end)
        layout = lexed.string_at(mode.end()) if mode else None
        kind = _MEMORY_KIND.search(lexed.clean, head.end(), end)
        memory_kind = lexed.string_at(kind.end()) if kind else None
        specs.append(ArgSpec(name or f"arg{index}", shape, dtype, layout, memory_kind))
    return specs


def main_results(program: str, at: int) -> tuple[list[str], list[str]]:
    """Result declarations (with attributes) and bare types of ``@main``, whose
    parameter list closes at ``program[at - 1]``."""
    rest = program[at:].lstrip()
    if not rest.startswith("->"):
        return [], []
    start = len(program) - len(rest) + 2
    while program[start].isspace():
        start += 1
    if program[start] == "(":
        parts, _ = split_top_level(program, start)
    else:
        single = re.match(r"(.*?)\s*(?:attributes\b|\{)", program[start:], re.S)
        if single is None:
            raise ValueError("cannot read @main's result type")
        parts = [single.group(1).strip()]
    return parts, [p.split("{", 1)[0].strip() for p in parts]


class Main(NamedTuple):
    """``@main``'s declaration, as read from a program's text."""

    start: int  # offset of its ``func.func``
    paren: int  # offset of the ``(`` opening its parameters
    params: list[str]  # parameter declarations, attributes kept
    names: list[str]  # their SSA names (``%x``)
    param_types: list[str]
    results: list[str]  # result declarations, attributes kept
    result_types: list[str]


_TRAILING_LOC = re.compile(r"\s+loc\(.*\)\s*$", re.S)
_MODULE_CLOSE = re.compile(r".*?(\}\s*(?:loc\(.*\))?)\s*$")  # a module's last line


def read_main(program: str) -> Main | None:
    """``@main``'s declaration; None if there is no ``func.func @main``.

    Raises ``ValueError`` if a parameter or the result types cannot be read.
    """
    found = find_main(program)
    if found is None:
        return None
    start, paren = found
    params, close = split_top_level(program, paren)
    names, types = [], []
    for part in params:
        head = re.match(r"(%[\w.$-]+)\s*:\s*", part)
        if head is None:
            raise ValueError(f"cannot read @main parameter {part!r}")
        names.append(head.group(1))
        declared = part[head.end() :].split("{", 1)[0].strip()
        types.append(_TRAILING_LOC.sub("", declared))  # jax's exports print loc(...)
    results, result_types = main_results(program, close + 1)
    return Main(start, paren, params, names, types, results, result_types)


def main_body(program: str, main: Main) -> int:
    """The offset of the ``{`` opening ``@main``'s body.

    It is the first ``{`` after the parameters at the function's own depth
    that opens neither an ``attributes`` dictionary nor a result's
    attributes (those are inside the result list's parentheses).
    """
    lexed = lex(program)
    _, close = lexed.spans(main.paren)
    depth = lexed.depths_at([main.start])[0]
    skip_dictionary = False
    for m in re.finditer(r"\{|\battributes\b", lexed.clean[close:]):
        at = close + m.start()
        if lexed.depths_at([at])[0] != depth:
            continue
        if m.group() == "attributes":
            skip_dictionary = True
        elif skip_dictionary:
            skip_dictionary = False
        else:
            return at
    raise ValueError("cannot find @main's body")


def _aside(line: str) -> bool:
    """A line outside any operation: a location alias or a comment."""
    return line.startswith("#") or line.lstrip().startswith("//")


def wrap_main(
    program: str,
    main: Main,
    body: str,
    *,
    params: list[str],
    args: list[str],
    keep: list[int],
    extra: tuple[tuple[str, str], ...] = (),
    prologue: tuple[str, ...] = (),
) -> str:
    """``program`` with ``@main`` renamed to the private ``body`` and a new
    ``@main`` around it.

    The new ``@main`` takes ``params`` (declarations), runs the ``prologue``
    lines, calls ``body`` with ``args``, and returns the body's results at the
    indices ``keep`` followed by the ``extra`` (value, type) pairs.
    """
    renamed = program[: main.start] + f"func.func private {body}" + program[main.paren :]
    n = len(main.result_types)
    signature = f"({', '.join(main.param_types)}) -> ({', '.join(main.result_types)})"
    call = f"func.call {body}({', '.join(args)}) : {signature}"
    values = ["%pjrt_py_r"] if n == 1 else [f"%pjrt_py_r#{i}" for i in range(n)]
    if n == 1:
        call = f"%pjrt_py_r = {call}"
    elif n > 1:
        call = f"%pjrt_py_r:{n} = {call}"
    returned = [(values[i], main.result_types[i]) for i in keep] + list(extra)
    declared = [main.results[i] for i in keep] + [t for _, t in extra]
    ret = "return"
    if returned:
        ret += f" {', '.join(v for v, _ in returned)} : {', '.join(t for _, t in returned)}"
    wrapper = (
        f"  func.func public @main({', '.join(params)}) -> ({', '.join(declared)}) {{\n"
        + "".join(f"    {line}\n" for line in (*prologue, call, ret))
        + "  }\n"
    )
    # Location aliases (``#loc3 = loc(...)``, in jax's exports) and comments
    # (the ``// RUN:`` lines of StableHLO's test files) stand around the
    # module: the wrapper goes inside it, before its closing brace.
    lines = renamed.rstrip().split("\n")
    cut = len(lines)
    while cut > 0 and (_aside(lines[cut - 1]) or not lines[cut - 1].strip()):
        cut -= 1
    first = next((ln for ln in lines[:cut] if ln.strip() and not _aside(ln)), "")
    close = _MODULE_CLOSE.fullmatch(lines[cut - 1]) if cut else None
    if first.lstrip().startswith("module") and close is not None:
        head = "\n".join(lines[: cut - 1])
        head += "\n" + lines[cut - 1][: close.start(1)]  # text before the brace
        closing = lines[cut - 1][close.start(1) :]
        return head + wrapper + closing + "\n" + "\n".join(lines[cut:]) + "\n"
    return renamed + "\n" + wrapper


def tensor_type(text: str) -> tuple[tuple[int | None, ...] | None, np.dtype[Any] | None]:
    """Shape (None dims are dynamic) and dtype of ``tensor<...>``; Nones otherwise."""
    m = re.match(r"tensor<(.*)>$", text.strip(), re.S)
    if not m:
        return None, None
    body = re.sub(r",\s*#.*$", "", m.group(1), flags=re.S)  # an encoding such as bounds
    dims = re.match(r"((?:(?:\d+|\?)x)*)(.*)$", body, re.S)
    assert dims is not None  # the pattern matches any text
    shape = tuple(None if d == "?" else int(d) for d in dims.group(1).split("x") if d)
    return shape, MLIR_NAMES.get(dims.group(2).strip())


def module_attribute_int(text: str, name: str) -> int | None:
    """The integer value of attribute ``name`` of the top-level module, if it has one.

    Only the ``module ... attributes {...}`` dictionary counts: not comments,
    strings, or the attributes of functions and operations.
    """
    lexed = lex(text)
    module = next((m for m in _MODULE.finditer(lexed.clean) if _is_module(lexed, m)), None)
    if module is None or module.group("attrs") is None:
        return None
    spans, _ = lexed.spans(module.end() - 1)
    for begin, end in spans:
        equals = lexed.clean.find("=", begin, end)
        if equals < 0 or lexed.text[begin:equals].strip().strip('"') != name:
            continue
        value = _INT_VALUE.fullmatch(lexed.text, equals + 1, end)
        return int(value.group(1)) if value else None
    return None


def _is_module(lexed: Lexed, m: re.Match[str]) -> bool:
    """Whether ``module`` at ``m`` is the keyword of the top-level module."""
    start = m.start() - 8 if lexed.clean.startswith("builtin.", m.start() - 8) else m.start()
    return lexed.starts_word(start) and lexed.depths_at([start]) == [0]


def is_bytecode(code: bytes | bytearray) -> bool:
    """Whether ``code`` is MLIR bytecode (it starts with ``ML\\xefR``)."""
    return code[:4] == BYTECODE_MAGIC


@functools.cache
def can_read_bytecode() -> bool:
    """Whether jax and jaxlib, whose MLIR bindings ``bytecode_to_text`` reads
    with, are installed: found, not imported (the helper process imports
    them to read; this process need not)."""
    return all(importlib.util.find_spec(name) is not None for name in ("jax", "jaxlib"))


def bytecode_to_text(code: bytes) -> str | None:
    """The text of an MLIR bytecode module, read with jax's MLIR bindings.

    None when ``code`` is not bytecode, jax is not installed, or the module
    cannot be read; also, unread, when its text is not UTF-8, which jax's
    bindings would abort the process on (``mlir_bytecode``).
    """
    if not is_bytecode(code) or not text_is_utf8(code):
        return None
    try:
        from jax._src.interpreters import mlir  # noqa: PLC0415 - jax is optional
        from jaxlib.mlir import ir  # noqa: PLC0415
        from jaxlib.mlir.dialects import stablehlo  # noqa: PLC0415
    except ImportError:
        return None

    def read() -> str:
        with mlir.make_ir_context() as context:
            if is_portable_artifact(code):  # VHLO: read back as StableHLO, as a plugin does
                module = stablehlo.deserialize_portable_artifact(context, code)
            else:
                module = ir.Module.parse(code)
            return str(module.operation.get_asm(enable_debug_info=False))

    try:
        return run_joined(read)  # jaxlib's C++: see joined
    except Exception:  # MLIRError, or an older jax's other error: the compiler reports it
        return None


def is_portable_artifact(code: bytes) -> bool:
    """Whether ``code`` is a portable StableHLO artifact (what jax exports and
    ``serialize_portable_artifact`` writes): bytecode of VHLO ops, whose
    producer names ``StableHLO_v``. Parsed as plain bytecode its ops are
    ``vhlo.*``, with no ``func.func @main``."""
    return (producer(code) or b"").startswith(b"StableHLO_v")
