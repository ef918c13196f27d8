"""Every public name documents itself (issue 17): the API reference
(``mkdocs build --strict``, docs/api.md) is generated from these docstrings,
NumPy style.

The rules, for every name in ``pjrt_py.__all__`` and every public method or
property of a public class:

* a docstring, whose first line is a summary;
* Python-defined functions and methods: a ``Parameters`` section when they
  take parameters, a ``Returns`` (or ``Yields``) section when they return
  something, and a ``Raises`` section when their own body raises;
* classes: a ``Parameters`` section when they define ``__init__`` with
  parameters. Exception classes take the base class's (``PjrtError``).

Types implemented in C (``Buffer``, the promises) have the same sections,
written in their method tables with a text signature; a method with
parameters must document them, and every C property has a summary.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

import pjrt_py


def public_members() -> Iterator[tuple[str, Any, bool]]:
    """(qualified name, object, whether Python defines it) for every public name."""
    for name in pjrt_py.__all__:
        obj = getattr(pjrt_py, name)
        python = _is_python(obj)
        yield name, obj, python
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, property):
                yield f"{name}.{attr}", value.fget, True
            elif isinstance(value, (staticmethod, classmethod)):
                yield f"{name}.{attr}", value.__func__, True
            elif inspect.isfunction(value):
                yield f"{name}.{attr}", value, True
            elif callable(value) or inspect.isgetsetdescriptor(value):  # C methods, properties
                yield f"{name}.{attr}", value, False


def _is_python(obj: Any) -> bool:
    return inspect.isfunction(obj) or (
        inspect.isclass(obj)
        and not obj.__module__.endswith("_core")
        and obj.__module__ != "builtins"
        and _defined_in_python(obj)
    )


def _defined_in_python(cls: type) -> bool:
    try:
        inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return True


MEMBERS = sorted(public_members(), key=lambda m: m[0])


@pytest.mark.parametrize(("name", "obj", "python"), MEMBERS, ids=[m[0] for m in MEMBERS])
def test_every_public_name_has_a_summary(name: str, obj: Any, python: bool) -> None:
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    assert doc.splitlines()[0].strip(), f"{name}: the docstring's first line is the summary"


def _own_raises(fn: Any) -> bool:
    """Whether the function's own body (not nested functions) has a raise."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    top = tree.body[0]
    stack = list(ast.iter_child_nodes(top))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _parameters(fn: Any) -> list[str]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in signature.parameters if p not in ("self", "cls")]


def _returns_something(fn: Any) -> bool:
    annotation = inspect.signature(fn).return_annotation
    return annotation not in (None, "None", inspect.Signature.empty)


PYTHON_FUNCTIONS = [m for m in MEMBERS if m[2] and not inspect.isclass(m[1])]
C_METHODS = [m for m in MEMBERS if not m[2] and getattr(m[1], "__text_signature__", None)]


@pytest.mark.parametrize(
    ("name", "fn"), [(n, f) for n, f, _ in C_METHODS], ids=[m[0] for m in C_METHODS]
)
def test_c_methods_document_their_parameters(name: str, fn: Any) -> None:
    doc = inspect.getdoc(fn) or ""
    if _parameters(fn):
        assert "Parameters\n----------" in doc, f"{name}: no Parameters section"
    assert "Returns\n-------" in doc or name.endswith((".delete", "__", "add_done_callback")), name


PYTHON_CLASSES = [
    m for m in MEMBERS if m[2] and inspect.isclass(m[1]) and not issubclass(m[1], BaseException)
]


@pytest.mark.parametrize(
    ("name", "fn"), [(n, f) for n, f, _ in PYTHON_FUNCTIONS], ids=[m[0] for m in PYTHON_FUNCTIONS]
)
def test_functions_document_parameters_returns_and_raises(name: str, fn: Any) -> None:
    doc = inspect.getdoc(fn) or ""
    is_property = "." in name and isinstance(
        inspect.getattr_static(getattr(pjrt_py, name.split(".")[0]), name.split(".")[1]), property
    )
    if _parameters(fn) and not is_property:
        assert "Parameters\n----------" in doc, f"{name}: no Parameters section"
    if _returns_something(fn) and not is_property:
        assert "Returns\n-------" in doc or "Yields\n------" in doc, f"{name}: no Returns section"
    if _own_raises(fn):
        assert "Raises\n------" in doc, f"{name}: raises, but has no Raises section"


@pytest.mark.parametrize(
    ("name", "cls"), [(n, c) for n, c, _ in PYTHON_CLASSES], ids=[m[0] for m in PYTHON_CLASSES]
)
def test_classes_document_their_constructor(name: str, cls: type) -> None:
    init = vars(cls).get("__init__")
    if init is None or not _parameters(init):
        return
    doc = inspect.getdoc(cls) or ""
    assert "Parameters\n----------" in doc, (
        f"{name}: __init__ takes parameters; no Parameters section"
    )
