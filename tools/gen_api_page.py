"""Write docs/api.md: the API reference, one mkdocstrings entry per name in
``pjrt_py.__all__``, grouped. mkdocs renders each from its docstring.

    python tools/gen_api_page.py        # tests/test_docs_site.py checks it is current
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pjrt_py

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"

HEAD = """# API reference

Every public name of `pjrt_py` (its `__all__`), generated from the
docstrings (`tools/gen_api_page.py` writes this page; mkdocstrings renders
it). The guides say how the pieces fit: start with [async.md](async.md).
"""

GROUPS = [
    ("Clients, devices and memories", ["Client", "Device", "Memory", "default_client"]),
    (
        "Buffers and transfers",
        ["Buffer", "buffer", "buffer_async", "to_numpy", "to_numpy_async", "aligned_empty"],
    ),
    ("Promises", ["Promise", "BufferPromise", "ArrayPromise", "value", "is_ready"]),
]


def sections() -> list[tuple[str, list[str]]]:
    """The page's sections: the fixed groups, then the rest by kind."""
    names = list(pjrt_py.__all__)
    placed = {n for _, group in GROUPS for n in group}
    rest = [n for n in names if n not in placed]
    errors = sorted(n for n in rest if _is_error(n))
    classes = sorted(n for n in rest if inspect.isclass(getattr(pjrt_py, n)) and n not in errors)
    functions = sorted(
        n for n in rest if callable(getattr(pjrt_py, n)) and n not in errors and n not in classes
    )
    constants = sorted(
        n for n in rest if n not in errors and n not in classes and n not in functions
    )
    return [
        *GROUPS,
        ("Compiling and running", classes),
        ("Functions", functions),
        ("Constants", constants),
        ("Errors", ["PjrtError", *[e for e in errors if e != "PjrtError"]]),
    ]


def _is_error(name: str) -> bool:
    obj = getattr(pjrt_py, name)
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def entry(name: str) -> str:
    """The mkdocstrings entry for ``pjrt_py.<name>``.

    A function sharing its name with a submodule (``buffer``, ``jit``) is
    named by its defining module, which the doc tool would otherwise render
    instead.
    """
    obj = getattr(pjrt_py, name)
    path = f"pjrt_py.{name}"
    if importlib.util.find_spec(path) is not None:
        path = f"{obj.__module__}.{name}"
    return f"::: {path}\n"


# Submodules users import by name (``from pjrt_py import kv``), documented whole.
MODULES = ["pjrt_py.distributed.stores", "pjrt_py.distributed", "pjrt_py.tracing", "pjrt_py.xspace"]


def render() -> str:
    parts = [HEAD]
    for title, names in sections():
        parts.append(f"## {title}\n")
        parts += [entry(name) for name in names]
    parts.append("## Modules\n")
    # (A Protocol's __init__ is typing's own, which the doc tool cannot resolve.)
    # Each lists what its __all__ names (run-time inspection sees its imports too).
    for module in MODULES:
        members = ", ".join(sorted(importlib.import_module(module).__all__))
        parts.append(
            f"::: {module}\n    options:\n      merge_init_into_class: false\n"
            f"      members: [{members}]\n"
        )
    return "\n".join(parts)


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
