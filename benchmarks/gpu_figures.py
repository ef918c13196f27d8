"""The figures issue 24 measured on its GPU, measured again on a lent one:
a bf16 matmul's rate next to jax's, a bit-exact round trip of ten dtypes,
and how much memory a default client leaves to torch.

    python -m benchmarks.gpu_figures [--quick] [--json out.json]

Runs on the plugin under test (``$PJRT_PLUGIN``; ``tools/gpu_check.sh`` sets
``cuda``); on a CPU plugin it measures the same, small, and says the memory
part needs a GPU. Not part of ``python -m benchmarks`` (the CPU page).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import ml_dtypes
import numpy as np

import pjrt_py

from ._common import cli, machine, target

ROUND_TRIP = (
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
    np.int8,
    np.uint32,
    np.int64,
    np.bool_,
    np.complex64,
    np.complex128,
    ml_dtypes.float8_e4m3fn,
)


def matmul_program(n: int) -> str:
    t = f"tensor<{n}x{n}xbf16>"
    return f"""
func.func @main(%a: {t}, %b: {t}) -> {t} {{
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}
  return %0 : {t}
}}"""


def _rate(seconds: float, n: int, steps: int) -> float:
    return 2 * n**3 * steps / seconds / 1e12


def matmul(client: pjrt_py.Client, n: int, steps: int) -> dict[str, Any]:
    """TFLOP/s of ``steps`` chained bf16 n x n products, pjrt_py's and jax's."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), np.float32).astype(ml_dtypes.bfloat16)
    exe = client.compile(matmul_program(n))
    x, y = client.buffer(a), client.buffer(a)
    exe.execute(x, y).block_until_ready()  # warm
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        outs = [exe.execute_async(x, y) for _ in range(steps)]
        outs[-1].block_until_ready()
        best = min(best, time.perf_counter() - start)
    found: dict[str, Any] = {"n": n, "steps": steps, "pjrt_py_tflops": _rate(best, n, steps)}
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        found["jax_skipped"] = f"jax is not installed ({e})"
        return found
    platform = "gpu" if client.platform_name in ("cuda", "rocm") else client.platform_name
    if jax.devices()[0].platform != platform:
        found["jax_skipped"] = f"jax's default backend is {jax.devices()[0].platform}"
        return found
    ja = jax.device_put(a)
    dot = jax.jit(jnp.dot)
    dot(ja, ja).block_until_ready()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        outs = [dot(ja, ja) for _ in range(steps)]
        outs[-1].block_until_ready()
        best = min(best, time.perf_counter() - start)
    found["jax_tflops"] = _rate(best, n, steps)
    return found


def round_trips(client: pjrt_py.Client, size: int) -> dict[str, str]:
    """Per dtype: "exact", or what went wrong, for numpy -> device -> numpy."""
    rng = np.random.default_rng(1)
    out = {}
    for kind in ROUND_TRIP:
        dtype = np.dtype(kind)
        raw = rng.integers(0, 256, size * dtype.itemsize, dtype=np.uint8)
        x = raw.view(dtype) if dtype != np.bool_ else raw.astype(bool)
        try:
            back = client.buffer(x).to_numpy()
            exact = back.dtype == dtype and back.tobytes() == x.tobytes()
            out[dtype.name] = "exact" if exact else "DIFFERENT"
        except Exception as e:  # noqa: BLE001  (reported, not raised)
            out[dtype.name] = f"{type(e).__name__}: {e}"[:120]
    return out


# In a child without jax's memory variables: a default client, then torch.
BESIDE_TORCH = """
import json
import numpy as np
import pjrt_py
client = pjrt_py.Client()
report = {"stats": client.addressable_devices[0].memory_stats()}
import torch
free, total = torch.cuda.mem_get_info()
report.update(free_after_client=free, total=total)
block = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # issue 24: OOM here
block.fill_(1)
torch.cuda.synchronize()
report["torch_1gib"] = "allocated"
x = np.arange(1 << 20, dtype=np.float32)
report["pjrt_py_after"] = bool((client.buffer(x).to_numpy() == x).all())
print(json.dumps(report))
"""


def beside_torch(client: pjrt_py.Client) -> dict[str, Any]:
    if client.platform_name not in ("cuda", "rocm"):
        return {"skipped": f"needs a GPU plugin; this one is {client.platform_name}"}
    try:
        import torch
    except ImportError as e:
        return {"skipped": f"needs torch ({e})"}
    if not torch.cuda.is_available():
        return {"skipped": "needs torch with CUDA"}
    drop = {
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_ALLOCATOR",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop}
    child = subprocess.run(
        [sys.executable, "-c", BESIDE_TORCH], env=env, capture_output=True, text=True, timeout=120
    )
    if child.returncode != 0:
        return {"failed": child.stderr[-1500:]}
    report: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return report


def run(quick: bool = False) -> dict[str, Any]:
    client = pjrt_py.Client()
    gpu = client.platform_name in ("cuda", "rocm")
    n, steps = (256, 2) if quick else ((8192, 10) if gpu else (1024, 2))
    mm = matmul(client, n, steps)
    exact = round_trips(client, 1 << 10 if quick else 1 << 20)
    memory = beside_torch(client)
    wrong = sum(v != "exact" for v in exact.values())
    gib = 1 << 30
    table = [
        ["what", "pjrt_py", "jax"],
        [
            f"bf16 {n}x{n} matmul, TFLOP/s ({steps} chained)",
            f"{mm['pjrt_py_tflops']:.1f}",
            f"{mm['jax_tflops']:.1f}" if "jax_tflops" in mm else "-",
        ],
        ["dtypes round-tripped bit-exactly", f"{len(exact) - wrong} of {len(exact)}", ""],
    ]
    notes = [f"jax: {mm['jax_skipped']}"] if "jax_skipped" in mm else []
    notes += [f"{name}: {v}" for name, v in exact.items() if v != "exact"]
    if "free_after_client" in memory:
        table.append(
            [
                "free device memory after a default Client(), GiB",
                f"{memory['free_after_client'] / gib:.1f} of {memory['total'] / gib:.1f}",
                "",
            ]
        )
        table.append(["torch allocates 1 GiB beside it", memory.get("torch_1gib", "no"), ""])
    else:
        notes.append(f"memory beside torch: {memory.get('skipped') or memory.get('failed')}")
    targets = [target("dtypes not round-tripped bit-exactly", wrong, 0)]
    if "jax_tflops" in mm:
        ratio = mm["pjrt_py_tflops"] / mm["jax_tflops"]
        targets.append(target("bf16 matmul rate / jax's", ratio, 0.9, kind="min"))
    return {
        "benchmark": "gpu_figures",
        "what": "matmul rate, dtype round trips, memory beside torch",
        "platform": client.platform_name,
        "matmul": mm,
        "round_trip": exact,
        "beside_torch": memory,
        "targets": targets,
        "table": table,
        "notes": notes,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
