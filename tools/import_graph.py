"""pjrt_py's import graph, read from the source: layers, circles, sizes, and a picture.

    python tools/import_graph.py            # a summary; exit 1 on any violation
    python tools/import_graph.py --svg docs/architecture.svg

Every ``import`` and ``from ... import`` statement counts, wherever it is:
at module level, inside a function, or under ``if TYPE_CHECKING:``. An
import of ``a.b.c`` also counts as an import of each package on the way
(``a.b``) whose ``__init__`` imports something, because Python runs those
first. The native modules (``_core``, ``_pjrt_cffi``) are leaves.

The rules it checks (``tests/test_architecture.py`` runs them):

* no circle of imports;
* each module imports only from its own layer or the layers below it
  (``LAYERS``, lowest first);
* no module over ``MAX_MODULE_LINES`` lines, and no class with more than
  ``MAX_CLASS_LINES`` lines of code (docstrings not counted).
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "pjrt_py"
NATIVE = {"pjrt_py._core", "pjrt_py._pjrt_cffi"}
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300

# Lowest first. A module belongs to the first layer with a matching prefix;
# ``pjrt_py.jit`` matches the module of that name only, not ``pjrt_py.jitted``.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("native", ("pjrt_py._core", "pjrt_py._pjrt_cffi")),
    ("runtime", ("pjrt_py.runtime",)),
    ("interop", ("pjrt_py.interop",)),
    ("programs", ("pjrt_py.programs",)),
    ("client", ("pjrt_py.client", "pjrt_py.defaults")),
    ("callbacks", ("pjrt_py.callbacks",)),
    ("distributed", ("pjrt_py.distributed",)),
    (
        "front ends",
        (
            "pjrt_py.jit",
            "pjrt_py.jitted",
            "pjrt_py.jit_args",
            "pjrt_py.lowered",
            "pjrt_py.tracing",
            "pjrt_py.device_trace",
            "pjrt_py.xspace",
            "pjrt_py.memory_watch",
            "pjrt_py.toplevel",
        ),
    ),
    ("package", ("pjrt_py", "pjrt_py._moved")),
    ("tools", ("pjrt_py.cli", "pjrt_py.conformance", "pjrt_py.__main__")),
]


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    imports: set[str] = field(default_factory=set)
    classes: dict[str, int] = field(default_factory=dict)  # class -> lines of code


def layer_of(name: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or (name.startswith(prefix + ".") and prefix != PACKAGE):
                return i
    raise KeyError(f"{name} is in no layer: add it to LAYERS in tools/import_graph.py")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _code_lines(node: ast.ClassDef) -> int:
    """A class's lines, less its docstrings (its own and its functions')."""
    total = (node.end_lineno or node.lineno) - node.lineno + 1
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (
            isinstance(inner, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            doc = body[0]
            total -= (doc.end_lineno or doc.lineno) - doc.lineno + 1
    return total


def read(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the package, with what it imports."""
    modules: dict[str, Module] = {}
    trees: dict[str, tuple[ast.Module, bool]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        name = _module_name(path, root)
        text = path.read_text()
        tree = ast.parse(text, str(path))
        modules[name] = Module(name, path, len(text.splitlines()))
        trees[name] = (tree, path.name == "__init__.py")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                modules[name].classes[node.name] = _code_lines(node)
    known = set(modules) | NATIVE
    for name, (tree, is_package) in trees.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # ``from p import m`` imports module p.m where there is one,
                # else the name m out of p (so p itself).
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
                ]
            for target in targets:
                if not (target == PACKAGE or target.startswith(PACKAGE + ".")):
                    continue
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                modules[name].imports.add(target)
    # Importing a.b.c runs a.b's __init__ first: an edge where that __init__ does something.
    for module in modules.values():
        for target in list(module.imports):
            parent = target.rpartition(".")[0]
            while parent and parent != PACKAGE:
                mine = module.name == parent or module.name.startswith(parent + ".")
                if not mine and modules.get(parent) and modules[parent].imports:
                    module.imports.add(parent)  # not already running, as its own are
                parent = parent.rpartition(".")[0]
        module.imports.discard(module.name)
    return modules


def circles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(modules[v].imports if v in modules else ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


def problems(modules: dict[str, Module]) -> list[str]:
    """Every rule broken, one line each."""
    out = [f"import circle: {' -> '.join(c)}" for c in circles(modules)]
    for module in modules.values():
        try:
            mine = layer_of(module.name)
        except KeyError as e:
            out.append(str(e))
            continue
        for target in sorted(module.imports):
            try:
                theirs = layer_of(target)
            except KeyError:
                continue  # reported for the target itself
            if theirs > mine:
                out.append(
                    f"{module.name} ({LAYERS[mine][0]}) imports {target} "
                    f"({LAYERS[theirs][0]}), a layer above it"
                )
        if module.lines > MAX_MODULE_LINES:
            out.append(f"{module.name}: {module.lines} lines (at most {MAX_MODULE_LINES})")
        for cls, size in module.classes.items():
            if size > MAX_CLASS_LINES:
                out.append(f"{module.name}.{cls}: {size} lines of code (at most {MAX_CLASS_LINES})")
    return out


def layer_edges(modules: dict[str, Module]) -> dict[tuple[int, int], int]:
    """How many module imports go from each layer to each other one."""
    edges: dict[tuple[int, int], int] = {}
    for module in modules.values():
        for target in module.imports:
            a, b = layer_of(module.name), layer_of(target)
            if a != b:
                edges[a, b] = edges.get((a, b), 0) + 1
    return edges


def svg(modules: dict[str, Module]) -> str:
    """The layers as bands, lowest at the bottom, each listing its modules,
    with the number of imports from each layer to each one below it."""
    width, pad, line = 980, 14, 17
    members: dict[int, list[str]] = {}
    for name in sorted(modules):
        members.setdefault(layer_of(name), []).append(name)
    for native in sorted(NATIVE):
        members.setdefault(layer_of(native), []).append(native)
    edges = layer_edges(modules)
    bands = []
    y = pad
    for i in reversed(range(len(LAYERS))):
        names = [n.removeprefix(PACKAGE + ".") for n in members.get(i, [])]
        per_row = 6
        rows = [names[k : k + per_row] for k in range(0, len(names), per_row)] or [[]]
        height = 24 + line * len(rows) + 8
        downward = sorted((b, n) for (a, b), n in edges.items() if a == i)
        bands.append((i, y, height, rows, downward))
        y += height + pad
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" '
        'font-family="monospace" font-size="12">',
        f'<rect width="{width}" height="{y}" fill="white"/>',
    ]
    for i, top, height, rows, downward in bands:
        out.append(
            f'<rect x="{pad}" y="{top}" width="{width - 2 * pad}" height="{height}" '
            'rx="6" fill="#eef1fb" stroke="#3f51b5"/>'
        )
        title = LAYERS[i][0]
        if downward:
            title += "   imports: " + ", ".join(f"{LAYERS[b][0]} ({n})" for b, n in downward)
        out.append(
            f'<text x="{pad + 10}" y="{top + 17}" font-weight="bold" fill="#1a237e">{title}</text>'
        )
        for r, row in enumerate(rows):
            out.append(
                f'<text x="{pad + 24}" y="{top + 24 + line * (r + 1)}">{"   ".join(row)}</text>'
            )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--svg", help="write the layer picture to this file")
    args = parser.parse_args(argv)
    modules = read()
    if args.svg:
        Path(args.svg).write_text(svg(modules))
    edges = sum(len(m.imports) for m in modules.values())
    print(f"{len(modules)} modules, {edges} imports, {len(LAYERS)} layers")
    found = problems(modules)
    for p in found:
        print("  " + p)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
