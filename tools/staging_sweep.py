"""Sweep the staged-transfer settings on one plugin: the figures that choose
pjrt_py.runtime.staging's defaults (chunk size, copier threads, threshold).

For each chunk size and number of copier threads, the GB/s of
``client.buffer(x)`` and ``buffer.to_numpy()`` at a few sizes, staged; then,
at small sizes, staged against unstaged (where staging starts to pay). Each
figure is the best of a few runs. Prints one JSON object per line as it goes
(a run cut short keeps what it printed).

    PJRT_PLUGIN=cuda python tools/staging_sweep.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import pjrt_py
from pjrt_py import _core
from pjrt_py.runtime import staging

MIB = 1 << 20


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def speeds(client: pjrt_py.Client, nbytes: int, repeats: int) -> dict[str, float]:
    x = np.random.default_rng(0).random(nbytes // 8)
    buf = client.buffer(x)
    h2d = best_seconds(lambda: client.buffer(x), repeats)
    d2h = best_seconds(buf.to_numpy, repeats)
    return {"h2d_GBs": round(nbytes / h2d / 1e9, 2), "d2h_GBs": round(nbytes / d2h / 1e9, 2)}


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few small cases (a smoke test)")
    quick = parser.parse_args().quick
    client = pjrt_py.Client()
    chunks = [64 << 10] if quick else [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB]
    copiers = [1, 2] if quick else [1, 2, 4, 8, 12]
    sizes = [MIB] if quick else [64 * MIB, 256 * MIB]
    repeats = 2 if quick else 5
    staging.configure(client, mode="on", min_bytes=1)
    platform = {"plugin": client.platform_name, "version": client.platform_version}
    emit({**platform, **staging.stats(client)})
    default_copiers = _core.staging_copiers()
    for chunk in chunks:
        staging.configure(client, chunk_bytes=chunk)
        for n in copiers:
            _core.staging_copiers(n)
            for nbytes in sizes:
                case = {"chunk_MiB": chunk / MIB, "copiers": n, "MiB": nbytes / MIB}
                emit({**case, **speeds(client, nbytes, repeats)})
    _core.staging_copiers(default_copiers)
    staging.configure(client, chunk_bytes=staging.DEFAULT_CHUNK_BYTES)
    for nbytes in [64 << 10] if quick else [MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB]:
        for mode in ("off", "on"):
            staging.configure(client, mode=mode)
            emit({"crossover": mode, "MiB": nbytes / MIB, **speeds(client, nbytes, repeats)})
    emit({"done": True, **staging.stats(client)})


if __name__ == "__main__":
    main()
