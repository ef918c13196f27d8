"""The async data path does not leak: the memory benchmark's loop, smaller,
with a bound. Also checks that the measurement would see a leak, and that
dropped objects (in reference cycles too) give back their hold on the client
(``client._refs()``) and dropped clients their PJRT client
(``_core.live_clients()``)."""

from __future__ import annotations

import copy
import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from conftest import matmul_chain

import pjrt_py
from benchmarks._common import ADD_F32_8
from benchmarks.memory import MIB, growth, rss_bytes
from pjrt_py import _core

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


def wait_until(condition: Any, seconds: float = 5.0) -> bool:
    """Poll ``condition()`` (the reaper destroys clients on its own thread)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def referring_to(*objects: Any) -> Callable[[Any], object]:
    """A done callback that keeps ``objects`` (its own promise: a cycle while pending)."""

    def callback(promise: Any) -> object:
        return promise, objects

    return callback


def test_dropped_children_and_cycles_give_back_their_client_references() -> None:
    client = pjrt_py.Client()
    add = client.compile(ADD_F32_8)
    heavy = client.compile(matmul_chain(128, 4))
    x = np.arange(8, dtype=np.float32)
    eye = np.eye(128, dtype=np.float32)
    gc.collect()
    baseline = client._refs()
    refs: list[weakref.ref[Any]] = []
    for k in range(100):
        b = client.buffer(x)
        assert client._refs() > baseline  # the buffer holds the client
        p = add.execute_async(b, b)
        a = p.to_numpy_async()
        dup = copy.copy(b)
        exe = copy.copy(add)
        slow = heavy.execute_async(eye)
        # Done callbacks that refer to their own promise (a cycle while pending).
        slow.add_done_callback(referring_to(slow))
        p.add_done_callback(referring_to(p))
        # A reference cycle through a container.
        node: dict[str, Any] = {"b": b, "p": p, "a": a, "exe": exe, "slow": slow, "dup": dup}
        node["self"] = node
        refs += [weakref.ref(o) for o in (b, p, a, dup, exe, slow)]
        if k % 3 == 0:
            b.delete()
        if k % 5 == 0:
            exe.delete()
        del b, p, a, dup, exe, slow, node
    np.testing.assert_array_equal(add.execute(x, x).to_numpy(), 2 * x)
    pjrt_py.effects_barrier()  # the dropped executions are done
    gc.collect()
    assert wait_until(lambda: client._refs() == baseline), (client._refs(), baseline)
    assert all(r() is None for r in refs)
    client.close()


def test_dropped_and_closed_clients_are_destroyed() -> None:
    gc.collect()
    before = _core.live_clients()
    clients: list[weakref.ref[Any]] = []
    for k in range(12):
        c = pjrt_py.Client()
        exe = c.compile(ADD_F32_8)
        b = c.buffer(np.ones(8, np.float32))
        p = exe.execute_async(b, b)
        a = p.to_numpy_async()
        a.add_done_callback(referring_to(a, c))
        holder: dict[str, Any] = {"c": c, "exe": exe, "b": b, "p": p, "a": a}
        holder["self"] = holder
        clients.append(weakref.ref(c))
        if k % 2:
            c.close()  # closed with children alive: freed after the last
        del c, exe, b, p, a, holder
    assert _core.live_clients() > before  # the cycles still hold them
    gc.collect()
    assert wait_until(lambda: _core.live_clients() == before), (_core.live_clients(), before)
    assert all(r() is None for r in clients)
