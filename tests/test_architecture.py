"""The layout holds: imports flow one way, with no circle and no oversized module.

The import graph is read from the source by ``tools/import_graph.py``
(docs/architecture.md), so a circle or an import that climbs a layer fails
here instead of coming back silently.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import import_graph  # noqa: E402

import pjrt_py  # noqa: E402
from pjrt_py import _moved  # noqa: E402


def test_the_layout_breaks_no_rule() -> None:
    modules = import_graph.read()
    assert len(modules) > 50  # the whole package was read
    assert import_graph.problems(modules) == []


def test_the_checker_sees_a_circle_and_a_climb(tmp_path: Path) -> None:
    # The same reader over a small package that breaks both rules, imports
    # inside functions and under TYPE_CHECKING included.
    package = tmp_path / "pjrt_py"
    (package / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "runtime" / "__init__.py").write_text("")
    (package / "runtime" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (package / "runtime" / "b.py").write_text("def f():\n    from . import a\n")
    (package / "client.py").write_text("")
    (package / "runtime" / "c.py").write_text("def g():\n    from ..client import X\n")
    found = import_graph.problems(import_graph.read(tmp_path))
    assert "import circle: pjrt_py.runtime.a -> pjrt_py.runtime.b" in found
    assert any("pjrt_py.runtime.c (runtime) imports pjrt_py.client (client)" in p for p in found)


def test_the_picture_is_current() -> None:
    """docs/architecture.svg is what the script draws from today's source."""
    drawn = import_graph.svg(import_graph.read())
    assert (ROOT / "docs" / "architecture.svg").read_text() == drawn, (
        "regenerate it: python tools/import_graph.py --svg docs/architecture.svg"
    )


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_module_path_still_imports_with_a_warning(old: str) -> None:
    code = (
        "import warnings, importlib\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import pjrt_py\n"
        "try:\n"
        f"    importlib.import_module('pjrt_py.{old}')\n"
        "except DeprecationWarning as w:\n"
        "    print('warned:', w)\n"
        "else:\n"
        "    print('silent')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.startswith(f"warned: pjrt_py.{old} moved to pjrt_py."), out


def test_old_paths_give_the_same_objects() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        executable = importlib.import_module("pjrt_py.executable")
        kv = importlib.import_module("pjrt_py.kv")
        dlpack = importlib.import_module("pjrt_py.dlpack")
    assert executable.Executable is pjrt_py.Executable
    # a split module: each name from its new home
    assert kv.check_store is importlib.import_module("pjrt_py.runtime.kv_store").check_store
    assert kv.InMemoryStore is importlib.import_module("pjrt_py.distributed.stores").InMemoryStore
    assert dlpack.to_torch is pjrt_py.to_torch
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = kv.nothing


def test_importing_an_old_path_leaves_the_public_function_of_that_name() -> None:
    # pjrt_py.buffer is a function; pjrt_py.buffer was also a module.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        importlib.import_module("pjrt_py.buffer")
    assert isinstance(pjrt_py.buffer, types.FunctionType)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert pjrt_py.cache is importlib.import_module("pjrt_py.programs.cache")
        discovery = importlib.import_module("pjrt_py.runtime.discovery")
        assert pjrt_py.plugin.find_plugin is discovery.find_plugin  # a split one


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        _ = pjrt_py.no_such_thing  # type: ignore[attr-defined]


def test_the_public_names_are_the_ones_before_the_move() -> None:
    # 0.1's pjrt_py.__all__, as it was before the layers got folders.
    before = subprocess.run(
        ["git", "show", "566aeda:pjrt_py/__init__.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if before.returncode != 0:
        pytest.skip("needs the git history (a checkout, not an sdist)")
    namespace: dict[str, object] = {}
    start = before.stdout.index("__all__ = [")
    exec(before.stdout[start : before.stdout.index("]", start) + 1], namespace)
    old = set(namespace["__all__"])  # type: ignore[arg-type]
    assert old <= set(pjrt_py.__all__)
    for name in old:
        assert getattr(pjrt_py, name) is not None


NATIVE = ROOT / "native"


def test_native_files_stay_small_and_say_what_they_need() -> None:
    """native/: a file per type or mechanism, each naming its header (issue 26)."""
    core = (NATIVE / "core.c").read_text()
    for path in sorted(NATIVE.glob("*.c")):
        text = path.read_text()
        lines = text.count("\n")
        assert lines <= 425, f"native/{path.name} has {lines} lines: split it by concept"
        if path.name == "core.c":
            continue
        assert f'#include "{path.name}"' in core, f"core.c does not build native/{path.name}"
        assert '#include "' in text.split("*/", 1)[-1][:400], (
            f"native/{path.name} does not include the header of what it uses"
        )
    for path in sorted(NATIVE.glob("*.h")):
        assert path.read_text().count("\n") <= 200, f"native/{path.name} is over 200 lines"


# A call into PJRT, direct or through one of the core's wrappers
# (event_destroy, client_destroy_pjrt, ...), which may wait for a PJRT thread.
PJRT_CALL = re.compile(r"->PJRT_\w+\(|\b\w+_(destroy|destroy_pjrt|await|on_ready|release)\(")
LOCK = re.compile(r"pthread_mutex_lock\(&?([^)]*)\)")
UNLOCK = re.compile(r"pthread_mutex_unlock\(&?([^)]*)\)")


def pjrt_calls_under_a_lock(name: str, text: str) -> list[str]:
    """Lines that call PJRT while the function holds one of its mutexes
    (read line by line: a lock is held from its lock() to its unlock())."""
    found, held = [], []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("//")[0]
        if code.lstrip().startswith(("/*", "*")):
            continue
        held += LOCK.findall(code)
        if held and PJRT_CALL.search(code) and "pthread_" not in code:
            found.append(f"native/{name}:{number}: under {', '.join(held)}: {code.strip()}")
        for mutex in UNLOCK.findall(code):
            if mutex in held:
                held.remove(mutex)
        if line.startswith("}"):
            held = []
    return found


def test_no_pjrt_call_is_made_while_a_lock_of_ours_is_held() -> None:
    # PJRT threads take these locks in callbacks (a finished copy wakes the
    # reaper under the registry's), and a PJRT call may wait for those very
    # threads: the exit once destroyed a client under the registry's lock,
    # and the plugin's destructor joined the thread waiting for it (a hang;
    # docs/lifetimes.md, "Two exit hangs").
    found = []
    for path in sorted(NATIVE.glob("*.c")):
        found += pjrt_calls_under_a_lock(path.name, path.read_text())
    assert not found, "\n".join(found)


def test_the_lock_check_sees_a_destroy_under_a_lock() -> None:
    old_exit = (
        "static void step3(void) {\n"
        "  pthread_mutex_lock(&g_registry_mu);\n"
        "  for (c = g_clients; c != NULL; c = c->next) client_destroy_pjrt(c);\n"
        "  pthread_mutex_unlock(&g_registry_mu);\n"
        "  event_destroy(api, event);\n"
        "}\n"
    )
    assert pjrt_calls_under_a_lock("state.c", old_exit) == [
        "native/state.c:3: under g_registry_mu: "
        "for (c = g_clients; c != NULL; c = c->next) client_destroy_pjrt(c);"
    ]


# The conversions PyErr_Format and PyUnicode_FromFormat know. There is no
# float: Python 3.12 raises SystemError for "%g" where 3.11 printed it as is,
# so a wrong one passes the suite on one Python and breaks the message on the
# next (a staging timeout did, first seen on Python 3.12).
PY_FORMAT_CALL = re.compile(r"\b(PyErr_Format|PyUnicode_FromFormat|PyErr_WarnFormat)\s*\(")
PY_CONVERSION = re.compile(r"%(?:%|-?\d*(?:\.\d+)?(?:l{0,2}[diux]|z[diux]|[cspAUVSR]))")


def unknown_format_conversions(name: str, text: str) -> list[str]:
    """Conversions in the literal format strings of the calls above that
    Python's formatter does not know."""
    found = []
    for call in PY_FORMAT_CALL.finditer(text):
        depth, end = 0, call.end() - 1
        while end < len(text):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
            end += 1
        literal = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', text[call.start() : end]))
        for conversion in re.finditer(r"%[-\d.]*[a-zA-Z%]+", literal):
            if not PY_CONVERSION.match(conversion.group(0)):
                line = text.count("\n", 0, call.start()) + 1
                found.append(f"native/{name}:{line}: {conversion.group(0)!r}")
    return found


def test_error_messages_use_only_conversions_python_formats() -> None:
    found = []
    for path in sorted(NATIVE.glob("*.[ch]")):
        found += unknown_format_conversions(path.name, path.read_text())
    assert not found, "\n".join(found)


def test_the_format_check_sees_a_float_conversion() -> None:
    sample = 'x;\n  PyErr_Format(PyExc_RuntimeError,\n "after %.3g s (%zd of %ld) %s %R",\n t);\n'
    assert unknown_format_conversions("ring.c", sample) == ["native/ring.c:2: '%.3g'"]


def test_the_package_stays_a_plain_module_until_an_old_path_is_imported() -> None:
    # A package of another class hides its classes from griffe, which builds
    # the API reference by inspection ("pjrt_py.Client could not be found").
    code = (
        "import types, warnings, pjrt_py\n"
        "print(type(pjrt_py) is types.ModuleType)\n"
        "warnings.simplefilter('ignore')\n"
        "import pjrt_py.buffer\n"
        "print(type(pjrt_py) is types.ModuleType, isinstance(pjrt_py.buffer, types.FunctionType))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert out == ["True", "False", "True"]
