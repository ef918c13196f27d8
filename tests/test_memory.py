"""The async data path does not leak: the memory benchmark's loop, smaller,
with a bound. Also checks that the measurement would see a leak."""

from __future__ import annotations

import gc

import numpy as np

import pjrt_py
from benchmarks._common import ADD_F32_8
from benchmarks.memory import MIB, growth, rss_bytes

BOUND = 1 * MIB


def test_async_data_path_does_not_grow_rss() -> None:
    result = growth(iterations=20_000, warmup=2_000)
    assert result["growth_bytes"] <= BOUND, result["trace"]


def test_the_measurement_sees_a_leak() -> None:
    # The same loop, keeping every result alive: 20k small promises and
    # arrays are well above the bound, so a real leak of that size would fail.
    client = pjrt_py.Client()
    exe = client.compile(ADD_F32_8)
    x = np.arange(8, dtype=np.float32)
    kept = []
    gc.collect()
    start = rss_bytes()
    for _ in range(20_000):
        kept.append(exe.execute_async(client.buffer_async(x), x).to_numpy_async())
    assert rss_bytes() - start > BOUND
    assert all(p.value()[0] == 0 for p in kept[:10])
