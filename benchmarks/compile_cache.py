"""Compile caches and ``pjrt_py.jit``: what a cold compile costs, what the
in-memory and disk caches save, and ``pjrt_py.jit``'s call next to
``jax.jit``'s, all in one run.

The program is a realistic one: a 4-layer MLP forward pass (gelu, then a
log-softmax) lowered to StableHLO by jax. "cold" is ``client.compile(text,
cache=False)`` in this process. "memory hit" is ``client.compile(text)`` again
on the same client. The disk cache is timed where it matters, in a fresh
process: each sample is a new Python that makes ``Client(cache_dir=d)`` and
times its first ``client.compile(text)`` (a disk hit, asserted), next to a new
Python that does the same with ``cache_dir=False`` (a cold compile), so both
sides pay the same first-compile-in-a-process costs. The jit rows time
``f(x, y) = x * y + 1.0`` on f32[8], pjrt_py's inputs being Buffers a previous
``pjrt_py.jit`` call returned and jax's being jax arrays; calls are async on
both sides, each batch waits for its last output.

    python -m benchmarks.compile_cache [--quick] [--json out.json]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import pjrt_py

from ._common import cli, interleaved, machine, median_seconds, per_call, target

OURS_JIT = "pjrt_py.jit"
JAX_JIT = "jax.jit"

# Run by a fresh ``python -c``: argv is (program file, cache dir or "-" for
# none); prints {"seconds": ...} for the process's first compile.
CHILD = """
import json, sys, time
import pjrt_py
text = open(sys.argv[1]).read()
cache_dir = sys.argv[2] if sys.argv[2] != "-" else False
client = pjrt_py.Client(cache_dir=cache_dir)
t0 = time.perf_counter()
client.compile(text)
seconds = time.perf_counter() - t0
assert client.compile_cache.misses == 1, "expected the process's first compile"
disk = client.disk_cache
if cache_dir:
    assert disk.hits == 1 and disk.misses == 0 and disk.writes == 0, vars(disk)
else:
    assert disk is None
print(json.dumps({"seconds": seconds}))
"""


def mlp_text(width: int, depth: int, batch: int) -> str:
    """StableHLO of a ``depth``-layer MLP forward pass, lowered by jax."""
    import jax
    import jax.numpy as jnp

    def mlp(params: list[tuple[Any, Any]], x: Any) -> Any:
        for w, b in params[:-1]:
            x = jax.nn.gelu(x @ w + b)
        w, b = params[-1]
        return jax.nn.log_softmax(x @ w + b)

    f32 = jnp.float32
    spec = jax.ShapeDtypeStruct
    params = [(spec((width, width), f32), spec((width,), f32)) for _ in range(depth)]
    text: str = jax.jit(mlp).lower(params, spec((batch, width), f32)).as_text()
    return text


def fresh_process_seconds(program: Path, cache_dir: str | None) -> float:
    """Seconds of the first ``client.compile`` in a new Python process."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(program), cache_dir or "-"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"compile child failed:\n{result.stderr}")
    seconds: float = json.loads(result.stdout.strip().splitlines()[-1])["seconds"]
    return seconds


def fresh_processes(text: str, children: int) -> tuple[dict[str, float], int]:
    """Median first-compile seconds in fresh processes: disk hit and cold.

    Returns ({"disk_hit": s, "cold": s}, bytes of the cache entry).
    """
    with tempfile.TemporaryDirectory(prefix="pjrt_py_bench_cache_") as tmp:
        program = Path(tmp) / "program.mlir"
        program.write_text(text)
        cache_dir = str(Path(tmp) / "cache")
        populate = pjrt_py.Client(cache_dir=cache_dir)
        populate.compile(text)
        disk = populate.disk_cache
        assert disk is not None and disk.writes == 1, "the cache entry was not written"
        entry_bytes = sum(size for _, size, _ in disk.entries())
        populate.close()
        samples: dict[str, list[float]] = {"disk_hit": [], "cold": []}
        for _ in range(children):  # take turns, so drift falls on both alike
            samples["cold"].append(fresh_process_seconds(program, None))
            samples["disk_hit"].append(fresh_process_seconds(program, cache_dir))
    return {k: statistics.median(v) for k, v in samples.items()}, entry_bytes


def jit_timers(client: pjrt_py.Client) -> dict[str, Any]:
    """``pjrt_py.jit`` and ``jax.jit`` calls of the same small function."""
    import jax

    def fn(x: Any, y: Any) -> Any:
        return x * y + 1.0

    a = np.arange(8, dtype=np.float32)
    b = np.full(8, 0.5, np.float32)
    ours = pjrt_py.jit(fn, client=client)
    x, y = ours(a, b), ours(b, a)  # Buffers, as a previous step would hand over
    theirs = jax.jit(fn)
    jx, jy = theirs(a, b), theirs(b, a)
    np.testing.assert_allclose(ours(x, y).to_numpy(), np.asarray(theirs(jx, jy)), rtol=1e-6)

    def ours_call(k: int) -> None:
        out = None
        for _ in range(k):
            out = ours(x, y)
        if out is not None:
            out.block_until_ready()

    def jax_call(k: int) -> None:
        out = None
        for _ in range(k):
            out = theirs(jx, jy)
        if out is not None:
            out.block_until_ready()

    return {OURS_JIT: ours_call, JAX_JIT: jax_call}


def run(quick: bool = False) -> dict[str, Any]:
    width, depth, batch = (16, 2, 4) if quick else (512, 4, 64)
    cold_repeats, hits, children = (2, 20, 1) if quick else (7, 2000, 5)
    n, rounds = (100, 2) if quick else (20000, 11)
    text = mlp_text(width, depth, batch)
    client = pjrt_py.Client(cache_dir=False)

    cold = median_seconds(lambda: client.compile(text, cache=False), cold_repeats)
    client.compile(text)  # the miss that fills the in-memory cache

    def memory_hits(k: int) -> None:
        compile_ = client.compile
        for _ in range(k):
            compile_(text)

    memory_hit = per_call(memory_hits, hits, 5 if quick else 11)
    assert client.compile_cache.misses == 1, "the in-memory cache missed after its fill"
    fresh, entry_bytes = fresh_processes(text, children)
    jit_us = interleaved(jit_timers(client), n, rounds)

    seconds = {
        "cold": cold,
        "memory_hit": memory_hit,
        "fresh_process_cold": fresh["cold"],
        "fresh_process_disk_hit": fresh["disk_hit"],
    }
    memory_ratio = memory_hit / cold
    disk_ratio = fresh["disk_hit"] / fresh["cold"]
    jit_ratio = jit_us[OURS_JIT] / jit_us[JAX_JIT]
    table = [
        ["what", "time", "ratio", "relative to"],
        ["cold compile (cache=False)", f"{cold * 1e3:.1f} ms", "1", ""],
        ["memory-cache hit", f"{memory_hit * 1e6:.1f} us", f"{memory_ratio:.2g}", "cold compile"],
        ["cold compile, fresh process", f"{fresh['cold'] * 1e3:.1f} ms", "1", ""],
        [
            "disk-cache hit, fresh process",
            f"{fresh['disk_hit'] * 1e3:.1f} ms",
            f"{disk_ratio:.2g}",
            "cold compile, fresh process",
        ],
        [f"{JAX_JIT} call, f32[8]", f"{jit_us[JAX_JIT]:.2f} us", "1", ""],
        [f"{OURS_JIT} call, f32[8]", f"{jit_us[OURS_JIT]:.2f} us", f"{jit_ratio:.2f}", JAX_JIT],
    ]
    return {
        "benchmark": "compile_cache",
        "what": f"compile of a {depth}-layer MLP ({width} wide, batch {batch}), "
        "cold and from the caches; jit call next to jax.jit",
        "program": {"width": width, "depth": depth, "batch": batch, "chars": len(text)},
        "disk_entry_bytes": entry_bytes,
        "cold_repeats": cold_repeats,
        "fresh_processes": children,
        "seconds": seconds,
        "ratio_to_cold": {
            "memory_hit": memory_ratio,
            "fresh_process_disk_hit": disk_ratio,
        },
        "jit_us_per_call": jit_us,
        "jit_ratio_to_jax": {k: v / jit_us[JAX_JIT] for k, v in jit_us.items()},
        "n_per_round": n,
        "rounds": rounds,
        "targets": [
            target("memory-cache hit / cold compile", memory_ratio, 0.01),
            target("disk-cache hit / cold compile, fresh process", disk_ratio, 0.10),
        ],
        "table": table,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
