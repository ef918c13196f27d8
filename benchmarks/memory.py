"""Memory: RSS growth over many iterations of the full async data path,
``buffer_async`` -> ``execute_async`` -> ``to_numpy_async`` -> ``value()``.
Growth is measured after a warm-up, so one-time allocations (code paths,
caches, the allocator's pools) are not counted; a leak of even a few bytes
per iteration shows over 100k iterations. tests/test_memory.py runs the same
loop with a smaller count and a bound.

    python -m benchmarks.memory [--quick] [--json out.json]
"""

from __future__ import annotations

import gc
import os
from typing import Any

import numpy as np

import pjrt_py

from ._common import ADD_F32_8, cli, machine, target

MIB = 1 << 20


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def iterate(client: pjrt_py.Client, exe: pjrt_py.Executable, count: int) -> None:
    x = np.arange(8, dtype=np.float32)
    y = np.ones(8, np.float32)
    for _ in range(count):
        a = client.buffer_async(x)
        out = exe.execute_async(a, client.buffer_async(y))
        out.to_numpy_async().value()


def growth(iterations: int, warmup: int, samples: int = 10) -> dict[str, Any]:
    """RSS after warm-up, then every iterations/samples iterations."""
    client = pjrt_py.Client()
    exe = client.compile(ADD_F32_8)
    iterate(client, exe, warmup)
    gc.collect()
    start = rss_bytes()
    trace = [(0, 0)]
    step = max(1, iterations // samples)
    done = 0
    while done < iterations:
        iterate(client, exe, step)
        done += step
        trace.append((done, rss_bytes() - start))
    gc.collect()
    return {
        "iterations": done,
        "warmup": warmup,
        "growth_bytes": rss_bytes() - start,
        "trace": trace,
    }


def run(quick: bool = False) -> dict[str, Any]:
    result = growth(2000 if quick else 100_000, 500 if quick else 10_000)
    grown = result["growth_bytes"] / MIB
    return {
        "benchmark": "memory",
        "what": "RSS growth of the async data path, after warm-up",
        **result,
        "targets": [
            target(f"RSS growth over {result['iterations']:,} iterations, MiB", grown, 1.0)
        ],
        "table": [["iterations", "RSS growth MiB"]]
        + [[f"{i:,}", f"{b / MIB:.3f}"] for i, b in result["trace"]],
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
