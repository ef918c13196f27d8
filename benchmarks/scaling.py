"""Execute time against problem size, next to jax: where does the binding's
overhead stop mattering? A square f32 matmul (64 -> 2048) and an elementwise
add (1 K -> 64 M elements), inputs already on the device, each call waiting
for its result (pjrt_py ``execute`` + ready; jax ``compiled(...)
.block_until_ready()``). Both run the same XLA CPU compiler, so at large
sizes the ratio should approach 1.

    python -m benchmarks.scaling [--quick] [--json out.json]
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pjrt_py

from ._common import cli, machine, median_seconds

MATMUL = [64, 128, 256, 512, 1024, 2048]
ELEMENTWISE = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 26]
QUICK_MATMUL = [16, 32]
QUICK_ELEMENTWISE = [1 << 8, 1 << 10]


def _matmul(n: int) -> str:
    t = f"tensor<{n}x{n}xf32>"
    return (
        f"func.func @main(%a: {t}, %b: {t}) -> {t} {{\n"
        f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}\n"
        f"  return %0 : {t}\n}}"
    )


def _add(n: int) -> str:
    t = f"tensor<{n}xf32>"
    return (
        f"func.func @main(%a: {t}, %b: {t}) -> {t} {{\n"
        f"  %0 = stablehlo.add %a, %b : {t}\n  return %0 : {t}\n}}"
    )


def _repeats(seconds: float, quick: bool) -> tuple[int, int]:
    """(samples, calls per sample) for a call that takes about ``seconds``."""
    if quick:
        return 2, 1
    calls = max(1, int(2e-3 / max(seconds, 1e-7)))
    return (5 if seconds > 0.05 else 9), calls


def compare(
    client: pjrt_py.Client, program: str, fn: Any, a: np.ndarray[Any, Any], quick: bool
) -> dict[str, float]:
    import jax

    exe = client.compile(program)
    x, y = client.buffer(a), client.buffer(a)
    jx, jy = jax.device_put(a), jax.device_put(a)
    compiled = jax.jit(fn).lower(jx, jy).compile()
    ours = lambda: exe.execute(x, y)  # noqa: E731 - waits for the result
    theirs = lambda: compiled(jx, jy).block_until_ready()  # noqa: E731
    np.testing.assert_allclose(ours().to_numpy(), np.asarray(theirs()), rtol=1e-4, atol=1e-3)
    samples, calls = _repeats(median_seconds(ours, 1), quick)

    def per_call(call: Any) -> float:
        def batch() -> None:
            for _ in range(calls):
                call()

        return median_seconds(batch, samples) / calls

    # Alternate the two, twice, so drift affects both alike.
    first = [per_call(ours), per_call(theirs)]
    second = [per_call(theirs), per_call(ours)]
    return {"pjrt_py": min(first[0], second[1]), "jax": min(first[1], second[0])}


def run(quick: bool = False) -> dict[str, Any]:
    client = pjrt_py.Client()
    rng = np.random.default_rng(0)
    results: dict[str, list[dict[str, float]]] = {"matmul": [], "elementwise": []}
    for n in QUICK_MATMUL if quick else MATMUL:
        a = rng.standard_normal((n, n)).astype(np.float32)
        row = compare(client, _matmul(n), lambda p, q: p @ q, a, quick)
        results["matmul"].append({"size": n, **row})
    for n in QUICK_ELEMENTWISE if quick else ELEMENTWISE:
        a = rng.standard_normal(n).astype(np.float32)
        row = compare(client, _add(n), lambda p, q: p + q, a, quick)
        results["elementwise"].append({"size": n, **row})

    table = [["problem", "pjrt_py ms", "jax ms", "ratio"]]
    for kind, rows in results.items():
        for r in rows:
            label = f"matmul {r['size']}^2" if kind == "matmul" else f"add {r['size']:,}"
            table.append(
                [
                    label,
                    f"{r['pjrt_py'] * 1e3:.3f}",
                    f"{r['jax'] * 1e3:.3f}",
                    f"{r['pjrt_py'] / r['jax']:.2f}",
                ]
            )
    return {
        "benchmark": "scaling",
        "what": "execute + wait, inputs on device: ms per call",
        "seconds": results,
        "targets": [],
        "table": table,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
