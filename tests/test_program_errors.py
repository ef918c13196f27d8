"""Compile errors a person can act on (pjrt_py.programs.diagnostics)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import pjrt_py

MISSING_BRACKET = """func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32
  return %0 : tensor<8xf32>
}"""

TYPE_CLASH = """func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %x : tensor<4xf32>
  return %0 : tensor<8xf32>
}"""


def _caret_column(message: str, line_index: int) -> int:
    """The 1-based column the caret under the line at ``line_index`` points at."""
    lines = message.splitlines()
    source, caret = lines[line_index + 1], lines[line_index + 2]
    assert source.startswith("    ") and caret.strip() == "^"
    return len(caret) - 4


def test_a_parse_error_names_the_place_and_shows_it(client: pjrt_py.Client) -> None:
    with pytest.raises(pjrt_py.ProgramError) as caught:
        client.compile(MISSING_BRACKET, cache=False)
    error = caught.value
    assert isinstance(error, pjrt_py.PjrtError)
    first = str(error).splitlines()[0]
    m = re.match(r"<string>:2:(\d+): error: ", first)
    assert m, first
    assert error.diagnostics[0][:2] == (2, int(m.group(1)))
    assert _caret_column(str(error), 0) == int(m.group(1))
    assert "stablehlo.add %x, %y : tensor<8xf32" in str(error).splitlines()[1]
    # The plugin's version boilerplate is not the cause here: left out.
    assert "forward incompatibility" not in str(error)


def test_notes_point_at_their_own_lines(client: pjrt_py.Client) -> None:
    with pytest.raises(pjrt_py.ProgramError) as caught:
        client.compile(TYPE_CLASH, cache=False)
    severities = [(line, severity) for line, _, severity, _ in caught.value.diagnostics]
    assert (2, "error") in severities and (1, "note") in severities
    assert re.search(r"^<string>:1:\d+: note: ", str(caught.value), re.M)


def test_a_program_without_main_says_so_in_one_line(client: pjrt_py.Client) -> None:
    with pytest.raises(pjrt_py.ProgramError) as caught:
        client.compile(
            "func.func @notmain(%x: tensor<f32>) -> tensor<f32> {\n  return %x : tensor<f32>\n}",
            cache=False,
        )
    message = str(caught.value)
    assert message == (
        "<string>: the program has no func.func @main, which PJRT runs (it has @notmain)"
    )


def test_pjrt_py_run_names_the_file(tmp_path: Path) -> None:
    program = tmp_path / "bad.mlir"
    program.write_text(TYPE_CLASH)
    result = subprocess.run(
        [sys.executable, "-m", "pjrt_py", "run", str(program)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert f"{program}:2:" in result.stderr and f"{program}:1:" in result.stderr
    assert "<string>" not in result.stderr


AOT_DOC = Path(__file__).resolve().parents[1] / "docs" / "aot.md"


def _documented_errors() -> list[tuple[str, str]]:
    """docs/aot.md's broken programs (mlir blocks), each with the text block after it."""
    text = AOT_DOC.read_text()
    section = text[text.index("## Compile errors") : text.index("### Compared with")]
    blocks = re.findall(r"^```(mlir|text)\n(.*?)^```$", section, re.M | re.S)
    pairs = [(p, out) for (kp, p), (ko, out) in zip(blocks[::2], blocks[1::2], strict=True)
             if (kp, ko) == ("mlir", "text")]  # fmt: skip
    assert len(pairs) == len(blocks) // 2 >= 5, blocks
    return pairs


@pytest.mark.parametrize("index", range(len(_documented_errors())))
def test_the_documented_messages_are_what_compile_raises(
    client: pjrt_py.Client, index: int
) -> None:
    program, shown = _documented_errors()[index]
    with pytest.raises(pjrt_py.ProgramError) as caught:
        client.compile(program, cache=False)
    assert str(caught.value) == shown.rstrip("\n")


def test_a_note_where_the_error_was_does_not_repeat_the_line() -> None:
    from pjrt_py.programs.diagnostics import render  # noqa: PLC0415

    source = "a\nbb\n"
    shown = render(source, [(2, 1, "error", "e"), (2, 1, "note", "here"), (1, 1, "note", "n")], "f")
    assert shown.splitlines() == [
        "f:2:1: error: e", "    bb", "    ^", "f:2:1: note: here", "f:1:1: note: n", "    a",
        "    ^",
    ]  # fmt: skip
