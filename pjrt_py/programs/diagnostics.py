"""Compile errors a person can act on: the plugin's MLIR diagnostics, with the source.

A plugin reports a program that does not parse or verify as MLIR
diagnostics on the text it was given, named ``-``::

    -:2:43: error: expected '>' in tensor type
    <unknown>:0: error: Failed to parse using StableHLO v1.16.1, this could
    indicate forward incompatibility, >12w old unsupported plugin, ...

pjrt_py turns that into a ``ProgramError`` (a ``PjrtError`` with the
plugin's code) written the way compilers write theirs (``mlir-opt``,
``rustc``): the source's name, line and column, the line itself, and a caret
under the column, for each error and note::

    <string>:2:43: error: expected '>' in tensor type
        %0 = stablehlo.add %x, %y : tensor<8xf32
                                              ^

Decisions:

- **The boilerplate is dropped where the cause is known.** The plugin's
  "Failed to parse using StableHLO vX ... forward incompatibility" line
  follows every parse error of text; when a diagnostic in the text itself
  explains the failure, that line is left out (it points at versions, which
  are not the cause). It stays when nothing else explains the failure.
- **A program without ``@main``** is refused before the plugin sees it, in
  one line naming the functions it has (the plugin printed the whole module
  in generic form).
- **The name** is ``<string>`` for text given to ``compile``; ``pjrt-py run``
  names the file (``ProgramError.rename``).
- A note at the same place as the diagnostic before it (the verifier's
  "see current operation") does not repeat the source line, as mlir-opt.
- Messages the plugin words otherwise pass through unchanged.
- ``docs/aot.md`` compares the result with mlir-opt, iree-compile and rustc.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..runtime.errors import PjrtError, ProgramError, UnsupportedError

if TYPE_CHECKING:
    from ..runtime.client import RuntimeClient

_DIAGNOSTIC = re.compile(
    r"^-:(?P<line>\d+):(?P<column>\d+): (?P<severity>error|warning|note|remark): (?P<message>.*)$"
)
_BOILERPLATE = re.compile(r"^<unknown>:0: error: Failed to parse using StableHLO")
_FUNCTIONS = re.compile(r"func\.func\s+(?:public\s+|private\s+)?@([\w$.-]+)")


def render(source: str, diagnostics: list[tuple[int, int, str, str]], name: str) -> str:
    """The diagnostics as ``name:line:col: severity: message`` with source lines and carets."""
    lines = source.splitlines()
    out = []
    shown = None  # the location whose source line was shown last
    for line, column, severity, message in diagnostics:
        out.append(f"{name}:{line}:{column}: {severity}: {message}")
        # A note at the place just shown does not show it again (as mlir-opt).
        if severity == "note" and shown == (line, column):
            continue
        shown = (line, column)
        if 0 < line <= len(lines):
            text = lines[line - 1].expandtabs(4)
            out.append(f"    {text}")
            if column > 0:
                out.append("    " + " " * (column - 1) + "^")
    return "\n".join(out)


def from_plugin(source: str, error: PjrtError, name: str = "<string>") -> PjrtError:
    """``error`` as a ``ProgramError`` when it is diagnostics on ``source``; else itself."""
    diagnostics: list[tuple[int, int, str, str]] = []
    notes: list[str] = []
    for raw in error.message.splitlines():
        m = _DIAGNOSTIC.match(raw)
        if m:
            diagnostics.append((int(m["line"]), int(m["column"]), m["severity"], m["message"]))
        elif raw.strip() and not _BOILERPLATE.match(raw):
            notes.append(raw)
    if not any(line > 0 for line, _, _, _ in diagnostics):
        return error  # not diagnostics on the text: the plugin's own wording
    return _error(source, diagnostics, notes, name, error.code)


def _error(
    source: str,
    diagnostics: list[tuple[int, int, str, str]],
    notes: list[str],
    name: str,
    code: int,
) -> ProgramError:
    message = "\n".join([render(source, diagnostics, name), *notes])
    return ProgramError(message, code, diagnostics=diagnostics, source=source, notes=notes)


def missing_main(source: str, name: str = "<string>") -> ProgramError:
    """The error for a program with no ``func.func @main``."""
    found = _FUNCTIONS.findall(source)
    has = f"it has {', '.join('@' + f for f in found)}" if found else "it has no function"
    return ProgramError(
        f"{name}: the program has no func.func @main, which PJRT runs ({has})", 3, source=source
    )


def rename(error: ProgramError, name: str) -> ProgramError:
    """``error`` with its source called ``name`` (``pjrt-py run`` gives the file's)."""
    if not error.diagnostics:
        # From a helper process (isolated compile) only the message came back.
        message = re.sub(r"^<string>(?=:)", lambda _: name, str(error), flags=re.M)
        return ProgramError(message, error.code, source=error.source)
    return _error(error.source, error.diagnostics, error.notes, name, error.code)


# XLA's FFI lookup (NotFound), and older GPU emitters' own words (Unimplemented).
_NOT_FOUND = re.compile(
    r"No FFI handler registered for (\S+) on a platform"
    r"|No registered implementation for custom call to (\S+) for platform"
)


def missing_handler(error: PjrtError) -> bool:
    """Whether ``error`` is the plugin's word for a custom call with no
    handler registered (a host callback not registered in this process)."""
    return _NOT_FOUND.search(str(error)) is not None


def explain_compile_error(client: RuntimeClient, error: PjrtError) -> Exception:
    """The error to raise for a compile's ``NotFound``: an UnsupportedError
    when the target was registered through pjrt_py (the plugin refused the
    handler), else ``error`` itself."""
    m = _NOT_FOUND.search(str(error))
    if m is None:
        return error
    target = m.group(1) or m.group(2)
    plugin = client.plugin
    if not any(name == target for _, name in list(plugin.ffi_targets)):
        return error
    return UnsupportedError(
        f"custom-call target {target!r} is registered, but {plugin.path} (PJRT "
        f"{plugin.version_text}) will not run its handler: this plugin refuses a handler "
        "built for a newer XLA FFI API than its own (on xla-cpu-pjrt 0.81, a handler built "
        f"with jaxlib 0.10.2's headers reports API 0.3; 0.1 runs). Plugin: {error}"
    )


__all__ = [
    "explain_compile_error",
    "from_plugin",
    "missing_handler",
    "missing_main",
    "rename",
    "render",
]
