"""Rewriting StableHLO check calls into extra results of ``@main``.

A check-style test (the StableHLO ``testdata`` convention) computes values in
an argument-less ``@main`` and checks them with side-effecting custom calls::

    stablehlo.custom_call @check.expect_eq(%got, %want) : (tensor<4xf32>, tensor<4xf32>) -> ()
    stablehlo.custom_call @check.expect_eq_const(%got) {value = dense<[1, 2]> : tensor<2xi32>}
        : (tensor<2xi32>) -> ()
    %ok = stablehlo.custom_call @check.eq(%got, %want) : (...) -> tensor<i1>

Plugins do not implement these targets, so ``rewrite`` turns every check
into results of ``@main`` instead: the checked value and the expected value
(for a ``_const`` check, its ``value`` attribute becomes a
``stablehlo.constant`` in the program, so the plugin materialises it and no
dense literal is parsed in Python). A check whose result is used (the older
``check.eq`` returning ``tensor<i1>``) is replaced by a true constant. The
host then compares the pairs (``pjrt_py.conformance.compare``).

The rewrite is textual and works on pretty-printed ``func.func @main`` with
pretty or generic (``"stablehlo.custom_call"(...) {call_target_name = ...}``)
custom calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

CHECK_KINDS = (
    "expect_eq",
    "expect_almost_eq",
    "expect_close",
    "expect_eq_const",
    "expect_almost_eq_const",
    "expect_close_const",
    "eq",
    "almost_eq",
    "close",
)


class RewriteError(ValueError):
    """A program the check rewriter cannot handle (not a harness failure)."""


@dataclass(frozen=True)
class Check:
    """One check: results ``index`` (got) and ``index + 1`` (expected) of the
    rewritten ``@main``, compared with ``kind``'s rule."""

    kind: str  # normalised: "eq", "almost_eq" or "close"
    target: str  # the call target as written, e.g. "check.expect_eq_const"
    index: int
    line: int  # 1-based line of the check in the original file
    attrs: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Rewritten:
    """The rewritten program and what its extra results mean."""

    text: str
    checks: list[Check]
    num_original_results: int


_MAIN = re.compile(r"func\.func\s+(?:public\s+|private\s+)?@main\s*\(")
_PRETTY = re.compile(r"stablehlo\.custom_call\s+@\"?(check\.[\w.]+)\"?\s*\(")
_GENERIC = re.compile(r"\"stablehlo\.custom_call\"\s*\(")
_TARGET = re.compile(r"call_target_name\s*=\s*\"(check\.[\w.]+)\"")
_RETURN = re.compile(r"^(\s*)(?:func\.)?return\b(.*)$")
_GENERIC_RETURN = re.compile(r"^(\s*)\"func\.return\"\s*\((.*?)\)\s*:\s*\((.*?)\)\s*->\s*\(\)\s*$")
_RESULT_NAME = re.compile(r"^\s*(%[\w.$-]+(?::\d+)?)\s*=\s*")
_INT_ATTR = re.compile(r"\b(max_ulp_difference|min_ulp_difference)\s*=\s*(\d+)")


def _match_close(text: str, start: int, open_: str = "(", close: str = ")") -> int:
    """Index just past the bracket closing the one at ``text[start]``.

    Brackets inside string literals are skipped; ``<``/``>`` pairs are counted
    only when asked for (``->`` is not a closer)."""
    depth = 0
    i = start
    in_string = False
    while i < len(text):
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == open_:
            depth += 1
        elif ch == close and not (close == ">" and text[i - 1] == "-"):
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise RewriteError(f"unbalanced {open_}{close} at offset {start}")


def _split_top(text: str) -> list[str]:
    """Split on commas outside (), <>, [], {} and strings."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    in_string = False
    prev = ""
    for ch in text:
        if in_string:
            in_string = ch != '"' or prev == "\\"
        elif ch == '"':
            in_string = True
        elif ch in "(<[{":
            depth += 1
        elif ch in ")]}" or (ch == ">" and prev != "-"):
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            prev = ch
            continue
        current.append(ch)
        prev = ch
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _strip_result_attrs(result: str) -> str:
    """``tensor<i1> {jax.result_info = ""}`` -> ``tensor<i1>``."""
    brace = result.find("{")
    return result[:brace].strip() if brace >= 0 else result.strip()


@dataclass
class _Main:
    results_start: int  # span of the result list text in the file (may be empty)
    results_end: int
    results: list[str]  # result entries, with their attributes
    body_start: int  # just past the body's "{"
    body_end: int  # at the body's closing "}"


def _find_main(text: str) -> _Main:
    match = _MAIN.search(text)
    if match is None:
        raise RewriteError("no func.func @main found")
    i = _match_close(text, match.end() - 1)
    while text[i].isspace():
        i += 1
    results: list[str] = []
    results_start = results_end = i
    if text.startswith("->", i):
        i += 2
        while text[i].isspace():
            i += 1
        results_start = i
        if text[i] == "(":
            results_end = _match_close(text, i)
            results = _split_top(text[i + 1 : results_end - 1])
        else:
            results_end = _match_close(text, text.index("<", i), "<", ">")
            results = [text[i:results_end]]
        i = results_end
    body_start = text.index("{", i)
    if text[i:body_start].strip().startswith("attributes"):
        body_start = text.index("{", _match_close(text, body_start, "{", "}"))
    body_end = _match_close(text, body_start, "{", "}") - 1
    return _Main(results_start, results_end, results, body_start + 1, body_end)


def _statement_end(body: str, start: int) -> int:
    """End (exclusive, at the newline) of the statement starting at ``start``."""
    depth = 0
    i = start
    in_string = False
    while i < len(body):
        ch = body[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "\n" and depth <= 0:
            return i
        i += 1
    return i


def _normalise(target: str) -> str:
    name = target.removeprefix("check.").removeprefix("expect_").removesuffix("_const")
    if name not in ("eq", "almost_eq", "close"):
        raise RewriteError(f"unknown check {target!r}")
    return name


def _dense_attr(statement: str) -> tuple[str, str | None]:
    """The ``value = dense<...> [: type]`` attribute of a _const check."""
    match = re.search(r"\bvalue\s*=\s*dense\s*<", statement)
    if match is None:
        raise RewriteError("a _const check needs a value = dense<...> attribute")
    end = _match_close(statement, match.end() - 1, "<", ">")
    literal = statement[match.start() + statement[match.start() :].index("dense") : end]
    rest = statement[end:]
    type_match = re.match(r"\s*:\s*(tensor\s*<)", rest)
    if type_match is None:
        return literal, None
    type_start = end + type_match.start(1)
    type_end = _match_close(statement, end + type_match.end(1) - 1, "<", ">")
    return literal, statement[type_start:type_end]


def _operands_and_types(statement: str, open_paren: int) -> tuple[list[str], list[str], bool]:
    """Operands of the call at ``open_paren``, their types, and whether the
    call has results (a non-``()`` result type)."""
    close = _match_close(statement, open_paren)
    operands = _split_top(statement[open_paren + 1 : close - 1])
    sig = re.search(r":\s*\(", statement[close:])
    if sig is None:
        raise RewriteError("a check call needs a functional type : (...) -> ...")
    types_open = close + sig.end() - 1
    types_close = _match_close(statement, types_open)
    types = _split_top(statement[types_open + 1 : types_close - 1])
    arrow = statement[types_close:].strip()
    has_results = not re.match(r"->\s*\(\s*\)", arrow)
    return operands, types, has_results


def rewrite(text: str) -> Rewritten:
    """Turn the check calls of ``@main`` into extra results.

    Raises
    ------
    RewriteError
        When ``@main`` is missing or a check cannot be read.
    """
    main = _find_main(text)
    body = text[main.body_start : main.body_end]
    line_base = text.count("\n", 0, main.body_start) + 1
    out_values: list[str] = []
    out_types: list[str] = []
    checks: list[Check] = []
    new_lines: list[str] = []
    original = [_strip_result_attrs(r) for r in main.results]
    n_results = len(original)
    pos = 0
    counter = 0
    return_seen = False
    while pos < len(body):
        end = _statement_end(body, pos)
        statement = body[pos:end]
        line = line_base + body.count("\n", 0, pos)
        pretty = _PRETTY.search(statement)
        generic = _GENERIC.search(statement)
        target_match = _TARGET.search(statement) if generic else None
        ret = _RETURN.match(statement) or _GENERIC_RETURN.match(statement)
        if pretty or target_match:
            if pretty:
                target, open_paren = pretty.group(1), pretty.end() - 1
            else:
                assert generic is not None and target_match is not None
                target, open_paren = target_match.group(1), generic.end() - 1
            call = pretty or generic
            assert call is not None
            if statement.count("{", 0, call.start()) > statement.count("}", 0, call.start()):
                raise RewriteError(
                    f"line {line}: {target} is inside a region (a while, if, case or reduce "
                    "body), whose values cannot become results of @main; check the region's "
                    "result after it instead"
                )
            kind = _normalise(target)
            operands, types, has_results = _operands_and_types(statement, open_paren)
            indent = statement[: len(statement) - len(statement.lstrip())]
            attrs = {k: int(v) for k, v in _INT_ATTR.findall(statement)}
            if target.endswith("_const"):
                literal, literal_type = _dense_attr(statement)
                const = f"%__check_const{counter}"
                counter += 1
                new_lines.append(
                    f"{indent}{const} = stablehlo.constant {literal} : {literal_type or types[0]}"
                )
                operands, types = [operands[0], const], [types[0], literal_type or types[0]]
            if len(operands) != 2:
                raise RewriteError(f"line {line}: {target} takes 2 values, got {len(operands)}")
            index = n_results + len(out_values)
            checks.append(Check(kind, target, index, line, attrs))
            out_values += operands
            out_types += types
            if has_results:
                name = _RESULT_NAME.match(statement)
                if name is None:
                    raise RewriteError(f"line {line}: unnamed result of {target}")
                true = f"{name.group(1)} = stablehlo.constant dense<true> : tensor<i1>"
                new_lines.append(indent + true)
        elif ret:
            return_seen = True
            new_lines.append(_rewrite_return(statement, out_values, out_types))
        else:
            new_lines.append(statement)
        pos = end + 1
    outside = text[: main.body_start] + text[main.body_end :]
    stray = _PRETTY.search(outside) or _TARGET.search(outside)
    if stray is not None:  # it would never run: the file would pass unchecked
        raise RewriteError(
            f"{stray.group(1)} outside @main (in another function) is not run as a check; "
            "only @main's checks become results: move it into @main"
        )
    if checks and not return_seen:
        raise RewriteError("no return in @main")
    if not checks:
        return Rewritten(text, [], n_results)
    results = ", ".join(main.results + out_types)
    signature = f"-> ({results})"
    prefix = text[: main.results_start]
    if main.results_start == main.results_end:  # no "->" at all
        signature = " " + signature + " "
    elif prefix.rstrip().endswith("->"):
        prefix = prefix.rstrip()[:-2].rstrip() + " "
    new_text = (
        prefix
        + signature
        + text[main.results_end : main.body_start]
        + "\n".join(new_lines)
        + text[main.body_end :]
    )
    return Rewritten(new_text, checks, n_results)


def _rewrite_return(statement: str, values: list[str], types: list[str]) -> str:
    generic = _GENERIC_RETURN.match(statement)
    if generic:
        indent, old_values, old_types = generic.groups()
        all_values = _split_top(old_values) + values
        all_types = _split_top(old_types) + types
        return f'{indent}"func.return"({", ".join(all_values)}) : ({", ".join(all_types)}) -> ()'
    match = _RETURN.match(statement)
    assert match is not None
    indent, rest = match.groups()
    old_values, old_types = [], []
    if rest.strip():
        head, _, tail = rest.partition(":")
        old_values, old_types = _split_top(head), _split_top(tail)
    all_values = old_values + values
    if not all_values:
        return statement
    return f"{indent}return {', '.join(all_values)} : {', '.join(old_types + types)}"
