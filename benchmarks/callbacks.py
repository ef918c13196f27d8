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

On a machine with a CUDA plugin and a GPU, the same round trip is measured
on it too (report key ``"gpu"``): ``register_callback`` on a CUDA client (the
staged handler: the operand copied to host memory on the call's stream, the
result copied back), the program without the callback, ``pjrt_py.jit``, and
``jax.jit`` with ``pure_callback`` on jax's GPU when jax has one. Without a
GPU the key says why it was skipped. No target: it is measured, not judged.
The jax side of the CPU part runs on jax's CPU device either way.

    python -m benchmarks.callbacks [--quick] [--json out.json]
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

import pjrt_py

from ._common import cli, interleaved, machine, target

LIMIT = 0.75
OURS = "pjrt_py: register_callback"
OURS_VIEWS = "pjrt_py: register_callback, copy=False"
OURS_PLAIN = "pjrt_py: same program, no callback"
OURS_JIT = "pjrt_py.jit: jax.pure_callback"
JAX = "jax.jit: jax.pure_callback"
JAX_PLAIN = "jax.jit: x + x, no callback"
GPU = "gpu: "  # the GPU part's names: GPU + one of the above

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


def _f(a: Any) -> Any:
    import jax

    y = jax.pure_callback(_identity, jax.ShapeDtypeStruct(a.shape, a.dtype), a)
    return y + y


def _timers(client: pjrt_py.Client, target: str, jax_device: Any) -> dict[str, Any]:
    """The round trips on ``client`` (the callback registered as ``target``)
    and, if ``jax_device`` is not None, jax's on that device; each checked once."""
    import jax

    pjrt_py.register_callback(target, _identity, client=client)
    pjrt_py.register_callback(f"{target}_views", _identity, client=client, copy=False)
    with_cb = client.compile(WITH_CALLBACK.replace("@bench_identity(", f"@{target}("))
    with_views = client.compile(WITH_CALLBACK.replace("@bench_identity(", f"@{target}_views("))
    without = client.compile(WITHOUT)
    x = np.arange(8, dtype=np.float32)
    buf = client.buffer(x)
    ours_jit = pjrt_py.jit(_f, client=client)
    for out in (with_cb.execute(buf), with_views.execute(buf), ours_jit(buf)):
        np.testing.assert_array_equal(out.to_numpy(), 2 * x)
    timers = {
        OURS: _loop(lambda: with_cb.execute_async(buf)),
        OURS_VIEWS: _loop(lambda: with_views.execute_async(buf)),
        OURS_PLAIN: _loop(lambda: without.execute_async(buf)),
        OURS_JIT: _loop(lambda: ours_jit(buf)),
    }
    if jax_device is not None:
        jax_jit, jax_plain = jax.jit(_f), jax.jit(lambda a: a + a)
        jx = jax.device_put(x, jax_device)  # committed: jit runs where it lives
        np.testing.assert_array_equal(np.asarray(jax_jit(jx)), 2 * x)
        timers[JAX] = _loop(lambda: jax_jit(jx))
        timers[JAX_PLAIN] = _loop(lambda: jax_plain(jx))
    return timers


def _gpu(n: int, repeats: int) -> dict[str, Any]:
    """The round trip on a CUDA client, or why it was skipped."""
    import jax

    if not any(info.name == "cuda" for info in pjrt_py.plugins()):
        return {"skipped": "needs a plugin whose devices are GPUs: no CUDA plugin is installed"}
    try:  # no preallocation: jax's GPU client shares the device
        client = pjrt_py.Client("cuda", {"preallocate": False})
    except (pjrt_py.PjrtError, OSError) as e:
        return {"skipped": f"needs a plugin whose devices are GPUs: {e}"}
    try:
        jax_device = jax.devices("gpu")[0]
    except RuntimeError:
        jax_device = None
    timers = _timers(client, "bench_identity_gpu", jax_device)
    us = interleaved(timers, n, repeats)
    report: dict[str, Any] = {"device": str(client.devices[0]), "us_per_call": us}
    if jax_device is None:
        report["notes"] = ["jax has no GPU backend here: only pjrt_py's side was measured."]
    else:
        report["ratio"] = {name: v / us[JAX] for name, v in us.items()}
    return report


def run(quick: bool = False) -> dict[str, Any]:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax's GPU client
    import jax

    client = pjrt_py.default_client()
    timers = _timers(client, "bench_identity", jax.devices("cpu")[0])
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
        "device_put); register_callback hands the function numpy copies (copy=True, "
        "the default), or read-only views of the program's memory with copy=False.",
    ]
    gpu = _gpu(n, repeats)
    if "skipped" in gpu:
        notes.append(f"GPU round trip skipped: {gpu['skipped']}.")
    else:
        ratio_gpu = gpu.get("ratio", {})
        table += [
            [GPU + name, f"{v:.2f}", f"{ratio_gpu[name]:.2f}" if name in ratio_gpu else "-"]
            for name, v in gpu["us_per_call"].items()
        ]
        notes.append(
            f"GPU rows: {gpu['device']}, x jax.jit pure_callback on the GPU; the operand "
            "and result are staged through host memory on the call's stream."
        )
        notes += gpu.get("notes", [])
    return {
        "benchmark": "callbacks",
        "what": "one host callback round trip, f32[8] identity (x ref: jax.jit pure_callback)",
        "us_per_call": us,
        "ratio": ratio,
        "callback_cost_us": {"pjrt_py": cost_ours, "jax": cost_jax},
        "gpu": gpu,
        "notes": notes,
        "targets": targets,
        "table": table,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
