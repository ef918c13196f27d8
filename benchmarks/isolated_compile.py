"""Crash-isolated compile (``client.compile(..., isolate=True)``) next to an
in-process compile of the same program.

The program is ``benchmarks.compile_cache``'s 4-layer MLP forward pass
(256 wide, batch 64, f32), lowered to StableHLO by jax. "in-process" is
``client.compile(text, cache=False)``. "isolated, warm" is the same on a
client whose helper process is already running: the program and options go
down a pipe, the helper compiles and serializes, the executable comes back
up the pipe and is loaded here. "isolated, cold" is the first isolated
compile of a new client: the helper's start (a Python, ``import pjrt_py``,
the plugin's load and client creation) is in it. Warm and in-process samples
take turns, so drift falls on both alike. "load here" is what the parent
adds to a warm compile by itself: ``client.deserialize`` of the executable's
bytes.

    python -m benchmarks.isolated_compile [--quick] [--json out.json]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import pjrt_py

from ._common import cli, machine, median_seconds, target
from .compile_cache import mlp_text


def seconds(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cold_isolated(text: str) -> float:
    """Seconds of a new client's first isolated compile (the helper starts in it)."""
    client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
    try:
        assert client.compile_helper.pid is None
        return seconds(lambda: client.compile(text, cache=False))
    finally:
        client.close()


def run(quick: bool = False) -> dict[str, Any]:
    width, depth, batch = (16, 2, 4) if quick else (256, 4, 64)
    repeats, colds = (2, 1) if quick else (11, 5)
    text = mlp_text(width, depth, batch)
    local = pjrt_py.Client(cache_dir=False)
    iso = pjrt_py.Client(cache_dir=False, isolate_compile=True)
    iso.compile(text, cache=False)  # starts the helper; warms both sides' first-compile costs
    local.compile(text, cache=False)
    helper = iso.compile_helper.pid

    samples: dict[str, list[float]] = {"in_process": [], "isolated_warm": []}
    for _ in range(repeats):
        samples["in_process"].append(seconds(lambda: local.compile(text, cache=False)))
        samples["isolated_warm"].append(seconds(lambda: iso.compile(text, cache=False)))
    assert iso.compile_helper.pid == helper, "the helper was not reused"
    cold = [cold_isolated(text) for _ in range(colds)]
    data = local.compile(text, cache=False).serialize()
    load = median_seconds(lambda: local.deserialize(data), repeats)
    iso.close()
    local.close()

    in_process = statistics.median(samples["in_process"])
    warm = statistics.median(samples["isolated_warm"])
    cold_s = statistics.median(cold)
    result = {
        "in_process": in_process,
        "isolated_warm": warm,
        "isolated_cold": cold_s,
        "load_here": load,
    }
    warm_ratio, cold_ratio = warm / in_process, cold_s / in_process
    table = [
        ["what", "time", "ratio", "relative to"],
        ["in-process compile (cache=False)", f"{in_process * 1e3:.1f} ms", "1", ""],
        [
            "isolated, warm (helper running)",
            f"{warm * 1e3:.1f} ms",
            f"{warm_ratio:.2f}",
            "in-process",
        ],
        [
            "  of which: extra over in-process",
            f"{(warm - in_process) * 1e3:.1f} ms",
            "",
            "",
        ],
        ["  load here (deserialize)", f"{load * 1e3:.1f} ms", "", ""],
        [
            "isolated, cold (helper starts)",
            f"{cold_s * 1e3:.1f} ms",
            f"{cold_ratio:.2f}",
            "in-process",
        ],
        ["  of which: helper start", f"{(cold_s - warm) * 1e3:.1f} ms", "", ""],
    ]
    return {
        "benchmark": "isolated_compile",
        "what": f"compile of a {depth}-layer MLP ({width} wide, batch {batch}) in a "
        "helper process, warm and cold, next to in-process",
        "program": {"width": width, "depth": depth, "batch": batch, "chars": len(text)},
        "executable_bytes": len(data),
        "repeats": repeats,
        "cold_samples": colds,
        "seconds": result,
        "ratio_to_in_process": {"isolated_warm": warm_ratio, "isolated_cold": cold_ratio},
        "targets": [target("isolated warm compile / in-process compile", warm_ratio, 1.5)],
        "table": table,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
