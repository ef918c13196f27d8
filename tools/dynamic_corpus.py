"""Run StableHLO's dynamic-shape test programs through pjrt_py, against static versions.

StableHLO's ``stablehlo/testdata/dynamic/`` holds jax-exported programs whose
``@main`` has ``?`` dimensions and takes each dimension's value as a leading
scalar integer argument (jax's older calling convention). They come without
inputs or expected values. For each file this:

1. picks the dimension values (3, then 4, 5 for a second and third) and a
   shape for each argument, every ``?`` taking a dimension's value (the
   first assignment the program's refinement accepts);
2. makes seeded random inputs of those shapes;
3. runs the program as it is, ``client.compile(text)``: the dynamic route
   (``pjrt_py.DynamicExecutable``, specialized from the shapes and the
   dimension values);
4. runs the same program with static shapes, made here without pjrt_py's
   specialization: ``@main``'s parameter types written out, the dimension
   arguments replaced by constants in its body, refined by jaxlib, and
   compiled as an ordinary static program;
5. compares the outputs: equal (bit for bit, NaNs equal), close, or not.

    python tools/dynamic_corpus.py /work/corpus/stablehlo/testdata/dynamic [--json out.json]

Needs jaxlib (for the refinement) and the corpus (not in this repository:
``git archive`` of openxla/stablehlo's ``stablehlo/testdata/dynamic``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import pjrt_py
from pjrt_py.programs.dynamic import DynamicExecutable
from pjrt_py.programs.mlir_text import main_signature, read_main, split_top_level

DIMENSION_VALUES = (3, 4, 5)
MAX_ASSIGNMENTS = 64


def dimension_args(signature: list[Any]) -> list[int]:
    """The leading scalar integer parameters before the first dynamic one."""
    out = []
    for i, spec in enumerate(signature):
        if None in (spec.shape or ()):
            break
        if spec.shape == () and spec.dtype is not None and spec.dtype.kind in "iu":
            out.append(i)
        else:
            break
    return out


def assignments(signature: list[Any], dims: list[int]) -> Any:
    """Candidate argument shapes: each ``?`` one of the dimension values."""
    values = [DIMENSION_VALUES[k] for k in range(len(dims))] or [DIMENSION_VALUES[0]]
    holes = sum((spec.shape or ()).count(None) for spec in signature)
    for n, choice in enumerate(itertools.product(values, repeat=holes)):
        if n >= MAX_ASSIGNMENTS:
            return
        picks = iter(choice)
        yield [
            tuple(next(picks) if d is None else d for d in (spec.shape or ())) for spec in signature
        ]


def inputs(
    signature: list[Any], shapes: list[tuple[int, ...]], dims: list[int], seed: int
) -> list[Any]:
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for i, (spec, shape) in enumerate(zip(signature, shapes, strict=True)):
        dtype = spec.dtype
        if i in dims:
            out.append(np.asarray(DIMENSION_VALUES[dims.index(i)], dtype))
        elif dtype.kind == "b":
            out.append(rng.integers(0, 2, shape).astype(dtype))
        elif dtype.kind in "iu":
            low = 0 if dtype.kind == "u" else -3
            out.append(rng.integers(low, 4, shape).astype(dtype))
        elif dtype.kind == "c":
            out.append((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _static_type(declared: str, shape: tuple[int, ...]) -> str:
    body = re.match(r"\s*tensor<(.*)>\s*$", declared, re.S)
    assert body is not None
    element = re.sub(r"^(?:(?:\d+|\?)x)*", "", re.sub(r",\s*#.*$", "", body.group(1), flags=re.S))
    return "tensor<" + "".join(f"{d}x" for d in shape) + element + ">"


def _body_span(text: str, after: int) -> tuple[int, int]:
    """The offsets of the ``{`` and ``}`` of the function body whose signature
    ends after ``after``: its brace is the first one that ends a line (an
    attribute dictionary never does in these files)."""
    opening = re.compile(r"\{[ \t]*\n").search(text, after)
    if opening is None:
        raise ValueError("no function body")
    depth = 0
    for j in range(opening.start(), len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return opening.start(), j
    raise ValueError("unbalanced body")


def static_program(text: str, shapes: list[tuple[int, ...]], dims: list[int]) -> bytes:
    """The program with static parameter types and its dimension arguments as
    constants, refined by jaxlib: made without pjrt_py's specialization.

    Each parameter is renamed and retyped; the body begins by defining the
    old name: a constant for a dimension argument, else a convert from the
    static type to the declared one (refinement then carries the static type
    through).
    """
    from jaxlib import _jax

    main = read_main(text)
    assert main is not None
    params, close = split_top_level(text, main.paren)
    new, prologue = [], []
    for i, (decl, declared, shape) in enumerate(zip(params, main.param_types, shapes, strict=True)):
        static = _static_type(declared, shape)
        name = main.names[i]
        new.append(f"%pjrt_p{i}: " + decl[len(name) :].lstrip(" :").replace(declared, static, 1))
        if i in dims:
            value = DIMENSION_VALUES[dims.index(i)]
            prologue.append(f"{name} = stablehlo.constant dense<{value}> : {declared}")
        else:
            prologue.append(f"{name} = stablehlo.convert %pjrt_p{i} : ({static}) -> {declared}")
    signature = ", ".join(new)
    text = text[: main.paren + 1] + signature + text[close:]
    start, _ = _body_span(text, main.paren + 1 + len(signature))
    text = text[: start + 1] + "".join(f"\n    {line}" for line in prologue) + text[start + 1 :]
    refined = _jax.mlir.refine_polymorphic_shapes(
        text.encode(), enable_shape_assertions=True, validate_static_shapes=True
    )
    return bytes(refined)  # portable bytecode, which Client.compile takes


def outputs(result: Any) -> list[np.ndarray[Any, Any]]:
    if result is None:
        return []
    items = result if isinstance(result, tuple) else (result,)
    return [b.to_numpy() for b in items]


def compare(a: list[np.ndarray[Any, Any]], b: list[np.ndarray[Any, Any]]) -> str:
    if len(a) != len(b):
        return f"mismatch: {len(a)} outputs against {len(b)}"
    verdict = "equal"
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"mismatch: {x.dtype}{list(x.shape)} against {y.dtype}{list(y.shape)}"
        if x.dtype.kind == "V":  # ml_dtypes' floats (bfloat16, float8): compared as float32
            x, y = x.astype(np.float32), y.astype(np.float32)
        if np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            continue
        if x.dtype.kind in "fc" and np.allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True):
            verdict = "close"
            continue
        return "mismatch: values differ"
    return verdict


def cause(e: BaseException) -> str:
    """The first line of an error, with numbers and locations taken out (to group by)."""
    line = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    line = re.sub(r"loc\([^)]*\)|-:\d+:\d+:", "", line)
    line = re.sub(r"\[[^\]]*\]|\{[^}]*\}|\d+", "N", line)
    return f"{type(e).__name__}: {line.strip()[:160]}"


def run_one(client: pjrt_py.Client, path: Path) -> dict[str, Any]:
    text = path.read_text()
    signature = main_signature(text)
    if signature is None or not any(None in (s.shape or ()) for s in signature):
        return {"file": path.name, "result": "skipped", "why": "no dynamic @main"}
    dims = dimension_args(signature)
    static, shapes, last = None, None, None
    for candidate in assignments(signature, dims):
        try:
            static = static_program(text, candidate, dims)
            shapes = candidate
            break
        except Exception as e:  # refinement refuses this assignment: try the next
            last = e
    if static is None or shapes is None:
        return {"file": path.name, "result": "error", "route": "static", "cause": cause(last)}
    args = inputs(signature, shapes, dims, zlib.crc32(path.name.encode()))
    record: dict[str, Any] = {"file": path.name, "shapes": [list(s) for s in shapes]}
    try:
        expected = outputs(client.compile(static, cache=False).execute(*args))
    except Exception as e:
        return {**record, "result": "error", "route": "static", "cause": cause(e)}
    try:
        exe = client.compile(text, cache=False)
        assert isinstance(exe, DynamicExecutable), type(exe)
        got = outputs(exe.execute(*args))
    except Exception as e:
        return {**record, "result": "error", "route": "dynamic", "cause": cause(e)}
    verdict = compare(got, expected)
    result = "pass" if verdict in ("equal", "close") else "mismatch"
    return {**record, "result": result, "verdict": verdict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--plugin", default=None, help="a plugin name or path (default: cpu)")
    parser.add_argument("--json", type=Path, help="write every file's record here")
    opts = parser.parse_args()
    client = pjrt_py.Client(opts.plugin)
    files = sorted(opts.folder.glob("*.mlir"))
    started = time.perf_counter()
    records = []
    for n, path in enumerate(files, 1):
        records.append(run_one(client, path))
        if n % 50 == 0:
            print(f"  {n}/{len(files)}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    counts = Counter(r["result"] for r in records)
    verdicts = Counter(r.get("verdict") for r in records if r["result"] == "pass")
    plugin = client.plugin
    print(f"{len(files)} files in {elapsed:.0f} s on {plugin.path} (PJRT {plugin.version_text})")
    print("results: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print("passes: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))
    causes = Counter(
        (r.get("route", ""), r.get("cause") or r.get("verdict"))
        for r in records
        if r["result"] in ("error", "mismatch")
    )
    for (route, why), count in causes.most_common():
        print(f"  {count:4d}  {route or 'compare'}: {why}")
    if opts.json:
        opts.json.write_text(
            json.dumps({"files": len(files), "seconds": elapsed, "records": records}, indent=1)
        )


if __name__ == "__main__":
    main()
