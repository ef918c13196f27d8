"""Host <-> device bandwidth from 1 KiB to 256 MiB, next to ``np.copy`` of the
same array (allocate and copy) in the same run.

- H2D, copy semantics: ``client.buffer(x)`` (returns when the data is there).
  From 32 MiB pjrt_py stages the copy through numpy (see buffer.py); the
  plugin's own copy is timed too, through the same call with staging off,
  and in plain C (benchmarks/c_transfer.c).
- H2D, zero-copy: ``client.buffer(x, zero_copy=True)``: should not grow with size.
- D2H: ``buffer.to_numpy()`` into a new array (on CPU pjrt_py reads a ready
  buffer itself), and the plugin's copy in C into a new array.

    python -m benchmarks.bandwidth [--quick] [--json out.json]
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pjrt_py
from pjrt_py.runtime.capi import lib

from ._common import cli, load_c, machine, median_seconds, target

KIB = 1024
MIB = 1024 * KIB
SIZES = [KIB * 4**i for i in range(10)]  # 1 KiB, 4 KiB, ..., 256 MiB
QUICK_SIZES = [KIB, 64 * KIB, MIB]
FOR_TARGET = 16 * MIB


def _c_baseline(client: pjrt_py.Client) -> Any:
    ffi, c, addr = load_c(
        "c_transfer.c",
        "double c_h2d(void*, void*, void*, void*, int, int64_t*, size_t, int, long);"
        "double c_d2h(void*, void*, void*, size_t, long);",
    )
    api, cl, dev = addr(client.plugin.address), addr(client._handle), addr(client.devices[0]._addr)
    copy = lib.PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
    f64 = lib.PJRT_Buffer_Type_F64

    def h2d(x: np.ndarray[Any, Any]) -> None:
        dims = ffi.new("int64_t[]", [x.size])
        if c.c_h2d(api, cl, dev, ffi.from_buffer(x), f64, dims, 1, copy, 1) < 0:
            raise RuntimeError("PJRT error in the C baseline")

    def d2h(buf: pjrt_py.Buffer, nbytes: int) -> None:
        dst = np.empty(nbytes, np.uint8)  # a new array each time, as to_numpy makes
        if c.c_d2h(api, addr(buf._handle), ffi.from_buffer(dst), nbytes, 1) < 0:
            raise RuntimeError("PJRT error in the C baseline")

    return h2d, d2h


def _repeats(nbytes: int, quick: bool) -> int:
    if quick:
        return 2
    return 25 if nbytes <= MIB else 9 if nbytes <= 16 * MIB else 5


def measure(
    client: pjrt_py.Client, c_h2d: Any, c_d2h: Any, nbytes: int, quick: bool
) -> dict[str, Any]:
    """Median seconds per transfer of every method at one size."""
    x = np.random.default_rng(0).random(nbytes // 8)
    aligned = pjrt_py.aligned_empty(x.shape, x.dtype)
    aligned[...] = x
    buf = client.buffer(x)
    # Several calls per sample for small sizes, so the timer's own cost fades.
    inner = 1 if quick else max(1, (256 * KIB) // nbytes)

    def many(fn: Any, k: int = inner) -> tuple[Any, int]:
        def timed() -> None:
            for _ in range(k):
                fn()

        return timed, k

    def plugin_copy() -> None:
        client._cpu_fast_paths = False
        try:
            client.buffer(x)
        finally:
            client._cpu_fast_paths = True

    timings = {
        "np.copy": many(lambda: np.copy(x)),
        "h2d copy": many(lambda: client.buffer(x)),
        "h2d copy, plugin": many(plugin_copy),
        "h2d copy, C": many(lambda: c_h2d(x)),
        # O(1) per call: timed over 20 calls per sample at every size.
        "h2d zero-copy": many(lambda: client.buffer(aligned, zero_copy=True), 20),
        "d2h": many(lambda: buf.to_numpy()),
        "d2h, C": many(lambda: c_d2h(buf, nbytes)),
    }
    for fn, _ in timings.values():
        fn()
    # Interleave per round: every method sees the same machine state.
    samples: dict[str, list[float]] = {name: [] for name in timings}
    for _ in range(_repeats(nbytes, quick)):
        for name, (fn, k) in timings.items():
            samples[name].append(median_seconds(fn, 1, warmup=0) / k)
    return {"bytes": nbytes, **{name: float(np.median(s)) for name, s in samples.items()}}


def run(quick: bool = False) -> dict[str, Any]:
    client = pjrt_py.Client()
    c_h2d, c_d2h = _c_baseline(client)
    sizes = QUICK_SIZES if quick else SIZES
    rows = [measure(client, c_h2d, c_d2h, nbytes, quick) for nbytes in sizes]

    big = [r for r in rows if r["bytes"] >= FOR_TARGET]
    targets = []
    if big:
        targets = [
            target(
                "h2d copy speed / np.copy (worst, >= 16 MiB)",
                min(r["np.copy"] / r["h2d copy"] for r in big),
                0.8,
                "min",
            ),
            target(
                "d2h speed / np.copy (worst, >= 16 MiB)",
                min(r["np.copy"] / r["d2h"] for r in big),
                0.8,
                "min",
            ),
            target(
                "h2d zero-copy time, 256 MiB / 1 KiB",
                rows[-1]["h2d zero-copy"] / rows[0]["h2d zero-copy"],
                3.0,
            ),
        ]
    names = [k for k in rows[0] if k != "bytes"]
    table = [["size"] + names]
    for r in rows:
        table.append([_size(r["bytes"])] + [_speed(r["bytes"], r[k]) for k in names])
    return {
        "benchmark": "bandwidth",
        "what": "host <-> device copies, GB/s (bytes / median time)",
        "seconds": rows,
        "targets": targets,
        "table": table,
        "machine": machine(),
    }


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def _speed(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f}"


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
