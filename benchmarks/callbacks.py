"""One host callback round trip: an f32[8] program whose custom call runs an
identity Python function, next to the same program without it, and next to
``jax.jit`` of the same function with ``jax.pure_callback``, in one run.

Every call dispatches and waits for its result (so the callback has run):

- ``register_callback``: ``exe.execute_async(buf).block_until_ready()`` of
  ``y = identity(x); return y + y``, the identity registered with
  ``pjrt_py.register_callback``;
- the program without the custom call, ``return x + x``, the same way;
- ``pjrt_py.jit`` of ``pure_callback(identity, x) * 2``: jax's callback,
  routed by pjrt_py (jax's own callable runs, ``device_put`` included);
- ``jax.jit`` of that function, and of ``x + x`` alone.

Target: pjrt_py's round trip with a Python callback costs at most 0.75x
``jax.jit`` with ``pure_callback``.

    python -m benchmarks.callbacks [--quick] [--json out.json]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import pjrt_py

from ._common import cli, interleaved, machine, target

LIMIT = 0.75
OURS = "pjrt_py: register_callback"
OURS_PLAIN = "pjrt_py: same program, no callback"
OURS_JIT = "pjrt_py.jit: jax.pure_callback"
JAX = "jax.jit: jax.pure_callback"
JAX_PLAIN = "jax.jit: x + x, no callback"

WITH_CALLBACK = """
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %y = stablehlo.custom_call @bench_identity(%x) {api_version = 4 : i32}
    : (tensor<8xf32>) -> tensor<8xf32>
  %z = stablehlo.add %y, %y : tensor<8xf32>
  return %z : tensor<8xf32>
}"""
WITHOUT = """
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %z = stablehlo.add %x, %x : tensor<8xf32>
  return %z : tensor<8xf32>
}"""


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _loop(call: Callable[[], Any]) -> Callable[[int], None]:
    def timed(k: int) -> None:
        for _ in range(k):
            call().block_until_ready()

    return timed


def run(quick: bool = False) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    client = pjrt_py.default_client()
    pjrt_py.register_callback("bench_identity", _identity, client=client)
    with_cb = client.compile(WITH_CALLBACK)
    without = client.compile(WITHOUT)
    x = np.arange(8, dtype=np.float32)
    buf = client.buffer(x)

    def f(a: Any) -> Any:
        y = jax.pure_callback(_identity, jax.ShapeDtypeStruct(a.shape, a.dtype), a)
        return y + y

    ours_jit = pjrt_py.jit(f, client=client)
    jax_jit, jax_plain = jax.jit(f), jax.jit(lambda a: a + a)
    jx = jnp.asarray(x)
    want = 2 * x
    for out in (with_cb.execute(buf), ours_jit(buf)):
        np.testing.assert_array_equal(out.to_numpy(), want)
    np.testing.assert_array_equal(np.asarray(jax_jit(jx)), want)

    timers = {
        OURS: _loop(lambda: with_cb.execute_async(buf)),
        OURS_PLAIN: _loop(lambda: without.execute_async(buf)),
        OURS_JIT: _loop(lambda: ours_jit(buf)),
        JAX: _loop(lambda: jax_jit(jx)),
        JAX_PLAIN: _loop(lambda: jax_plain(jx)),
    }
    n, repeats = (50, 3) if quick else (2000, 15)
    us = interleaved(timers, n, repeats)
    ratio = {name: v / us[JAX] for name, v in us.items()}
    targets = [target("register_callback round trip / jax.jit pure_callback", ratio[OURS], LIMIT)]
    table = [["call (f32[8], waited for)", "us per call", "x jax.jit pure_callback"]]
    table += [[name, f"{v:.2f}", f"{ratio[name]:.2f}"] for name, v in us.items()]
    cost_ours = us[OURS] - us[OURS_PLAIN]
    cost_jax = us[JAX] - us[JAX_PLAIN]
    notes = [
        f"The callback itself (with minus without) costs {cost_ours:.1f} us in pjrt_py's handler "
        f"and {cost_jax:.1f} us in jax's.",
        "pjrt_py.jit runs jax's own callable (which moves the operands into jax arrays with "
        "device_put); register_callback hands the function numpy views.",
    ]
    return {
        "benchmark": "callbacks",
        "what": "one host callback round trip, f32[8] identity (x ref: jax.jit pure_callback)",
        "us_per_call": us,
        "ratio": ratio,
        "callback_cost_us": {"pjrt_py": cost_ours, "jax": cost_jax},
        "notes": notes,
        "targets": targets,
        "table": table,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
