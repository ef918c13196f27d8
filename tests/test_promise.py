"""Promises: asynchrony, readiness, timeouts, errors, callbacks and asyncio."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import matmul_chain, slow_work

import pjrt_py

# Dense work the CPU plugin runs off the calling thread (tens of ms here).
HEAVY = matmul_chain(1000, 8)


@pytest.fixture(scope="module")
def heavy(client: pjrt_py.Client) -> tuple[pjrt_py.Executable, pjrt_py.Buffer]:
    exe = client.compile(HEAVY)
    x = client.buffer((np.eye(1000) * 0.5).astype(np.float32))
    exe.execute(x)  # warm-up
    return exe, x


def expected_heavy() -> np.ndarray:
    x = (np.eye(1000) * 0.5).astype(np.float64)
    for _ in range(8):
        x = np.tanh(x @ x)
    return x.astype(np.float32)


# The CPU plugin decides per dispatch whether to run inline; in about one
# full test run in five it ran one of these 40 ms chains inline once. So the
# tests below need the work to be pending after at least one of a few
# dispatches: a binding that waited in dispatch would fail every attempt.
ATTEMPTS = 5


def test_execute_async_returns_before_completion(heavy) -> None:  # type: ignore[no-untyped-def]
    exe, x = heavy
    for _ in range(ATTEMPTS):
        promise = exe.execute_async(x)
        pending = not promise.is_ready()  # dispatch returned while the work runs
        if pending:
            assert not pjrt_py.is_ready(promise)
        out = pjrt_py.value(pjrt_py.to_numpy_async(promise))
        assert promise.is_ready()
        np.testing.assert_allclose(out, expected_heavy(), rtol=1e-4, atol=1e-6)
        if pending:
            return
    raise AssertionError(f"all {ATTEMPTS} dispatches were complete when they returned")


def test_to_numpy_async_chains_after_pending_work(heavy) -> None:  # type: ignore[no-untyped-def]
    exe, x = heavy
    for _ in range(ATTEMPTS):
        array_promise = exe.execute_async(x).to_numpy_async()
        pending = not array_promise.is_ready()
        np.testing.assert_allclose(array_promise.value(), expected_heavy(), rtol=1e-4, atol=1e-6)
        if pending:
            return
    raise AssertionError(f"all {ATTEMPTS} copies were complete when dispatch returned")


def test_value_timeout_raises_and_the_work_goes_on(client: pjrt_py.Client) -> None:
    dispatch = slow_work(client, 0.1)  # 100 ms of work on this plugin, measured
    for _ in range(ATTEMPTS):  # the CPU plugin now and then runs work inline
        promise = dispatch()
        if promise.is_ready():
            continue
        with pytest.raises(TimeoutError):
            promise.value(timeout=0.0005)
        assert isinstance(promise.value(timeout=60), pjrt_py.Buffer)
        return
    raise AssertionError(f"all {ATTEMPTS} dispatches were complete when they returned")


def test_value_releases_the_gil(heavy) -> None:  # type: ignore[no-untyped-def]
    exe, x = heavy
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.0005)

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.01)
        before = ticks
        exe.execute_async(x).value()  # tens of ms of waiting
        during = ticks - before
    finally:
        stop.set()
        t.join()
    assert during > 3  # the other thread ran while we waited


def test_is_ready_never_blocks(heavy) -> None:  # type: ignore[no-untyped-def]
    exe, x = heavy
    promise = exe.execute_async(x)
    answers = [promise.is_ready() for _ in range(100)]
    # Had any call waited for the work, the later ones would say True.
    assert answers[-1] is False
    promise.value()
    assert promise.is_ready()


def test_await_in_asyncio(heavy) -> None:  # type: ignore[no-untyped-def]
    exe, x = heavy

    async def main() -> tuple[np.ndarray, int]:
        promise = exe.execute_async(x)
        loop_ticks = 0

        async def ticker() -> None:
            nonlocal loop_ticks
            while True:
                loop_ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        buf = await promise  # the loop keeps running while we wait
        array = await buf.to_numpy_async()
        task.cancel()
        return array, loop_ticks

    array, ticks = asyncio.run(main())
    np.testing.assert_allclose(array, expected_heavy(), rtol=1e-4, atol=1e-6)
    assert ticks > 1


def test_await_a_ready_promise(client: pjrt_py.Client) -> None:
    async def main() -> np.ndarray:
        return await client.buffer(np.arange(3)).to_numpy_async()

    np.testing.assert_array_equal(asyncio.run(main()), np.arange(3))


def test_add_done_callback_fires_once_from_on_ready(heavy) -> None:  # type: ignore[no-untyped-def]
    exe, x = heavy
    promise = exe.execute_async(x)
    fired = threading.Event()
    seen: list[object] = []

    def callback(p: pjrt_py.Promise) -> None:  # type: ignore[type-arg]
        seen.append(p)
        fired.set()

    promise.add_done_callback(callback)
    assert fired.wait(60)
    assert seen == [promise] and promise.is_ready()
    late: list[object] = []
    promise.add_done_callback(late.append)  # ready: runs at once
    assert late == [promise]


def test_a_failing_callback_does_not_break_others(heavy, caplog) -> None:  # type: ignore[no-untyped-def]
    exe, x = heavy
    promise = exe.execute_async(x)
    done = threading.Event()

    def bad(_: object) -> None:
        raise RuntimeError("boom")

    promise.add_done_callback(bad)
    promise.add_done_callback(lambda _: done.set())
    assert done.wait(60)


def test_error_of_async_work_raises_at_value(client: pjrt_py.Client) -> None:
    from test_execute import DONATING

    exe = client.compile(DONATING)
    a = client.buffer(np.ones(8, np.float32))
    # Run through the native primitive alone, so pjrt_py does not retire the
    # donated argument: `a` then holds a handle PJRT has invalidated, and the
    # error comes from PJRT's own readiness event, as an error of async work does.
    (out,) = exe._run([[a]], [])
    out.value().delete()
    promise = pjrt_py.BufferPromise((a,))
    assert promise.is_ready()  # readiness includes failure
    with pytest.raises(pjrt_py.InvalidArgumentError) as info:
        promise.value()
    assert info.value.code == 3
    assert isinstance(promise.exception(), pjrt_py.InvalidArgumentError)
    with pytest.raises(pjrt_py.InvalidArgumentError):
        promise.value()  # every time


def test_module_level_api_mirrors_the_r_package() -> None:
    x = pjrt_py.buffer_async(np.arange(4, dtype=np.float32))
    exe = pjrt_py.compile(
        "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %0 = stablehlo.multiply %x, %x : tensor<4xf32>\n"
        "  return %0 : tensor<4xf32>\n}"
    )
    out = pjrt_py.execute_async(exe, x)
    array = pjrt_py.to_numpy_async(out)
    np.testing.assert_array_equal(pjrt_py.value(array), np.arange(4, dtype=np.float32) ** 2)
    assert pjrt_py.is_ready(array)
    assert pjrt_py.value(5) == 5 and pjrt_py.is_ready(5)
    np.testing.assert_array_equal(pjrt_py.to_numpy(pjrt_py.execute(exe, x)), [0, 1, 4, 9])
    with pytest.raises(TypeError):
        pjrt_py.to_numpy_async(np.ones(3))  # type: ignore[arg-type]


def test_spin_before_blocking_is_configurable_and_validated() -> None:
    code = "import pjrt_py; from pjrt_py import _core; print(_core.spin_ns())"
    run = [sys.executable, "-c", code]
    default = subprocess.run(run, capture_output=True, text=True, env=_env(None))
    assert default.returncode == 0, default.stderr
    assert int(default.stdout) > 0  # spins by default
    off = subprocess.run(run, capture_output=True, text=True, env=_env("0"))
    assert int(off.stdout) == 0
    custom = subprocess.run(run, capture_output=True, text=True, env=_env("12.5"))
    assert int(custom.stdout) == 12500
    bad = subprocess.run(run, capture_output=True, text=True, env=_env("soon"))
    assert bad.returncode != 0
    assert "PJRT_PY_SPIN_US must be a number of microseconds" in bad.stderr
    for huge in ("1e30", "inf"):  # an OverflowError from C, before
        over = subprocess.run(run, capture_output=True, text=True, env=_env(huge))
        assert over.returncode != 0
        assert "ValueError: PJRT_PY_SPIN_US must be at most 1e+06 microseconds" in over.stderr


def _env(spin: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PJRT_PY_SPIN_US"}
    if spin is not None:
        env["PJRT_PY_SPIN_US"] = spin
    return env


def test_waits_without_spinning_still_complete(heavy) -> None:  # type: ignore[no-untyped-def]
    from pjrt_py import _core

    exe, x = heavy
    before = _core.spin_ns()
    _core.set_spin_ns(0)
    try:
        out = exe.execute_async(x).to_numpy_async()
        np.testing.assert_allclose(out.value(), expected_heavy(), rtol=1e-4, atol=1e-6)
        again = exe.execute_async(x).to_numpy_async()
        np.testing.assert_allclose(again.value(timeout=60), expected_heavy(), rtol=1e-4, atol=1e-6)
    finally:
        _core.set_spin_ns(before)


@pytest.mark.needs_host_callbacks
def test_a_failed_promise_raises_the_same_error_without_growing_it(
    client: pjrt_py.Client,
) -> None:
    # Every value() raised the one stored exception object, whose traceback
    # gained an entry per raise (a million polls: a million frames, 61 MB).
    def fail(x: np.ndarray) -> np.ndarray:
        raise ValueError("failed on purpose")

    pjrt_py.register_callback("promise_fails", fail, client=client)
    exe = client.compile(
        "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %y = stablehlo.custom_call @promise_fails(%x) {api_version = 4 : i32}"
        " : (tensor<4xf32>) -> tensor<4xf32>\n  return %y : tensor<4xf32>\n}"
    )
    promise = exe.execute_async(np.ones(4, np.float32))
    depths = []
    for _ in range(200):
        try:
            promise.value()
        except pjrt_py.PjrtError as e:
            tb, depth = e.__traceback__, 0
            while tb is not None:
                tb, depth = tb.tb_next, depth + 1
            depths.append(depth)
    assert len(depths) == 200 and max(depths) == depths[0] <= 3, depths[-5:]


@pytest.mark.needs_host_callbacks
def test_polling_with_a_zero_timeout_holds_nothing_per_poll(client: pjrt_py.Client) -> None:
    # Each value(timeout=0) of pending work registered a wake-up with the
    # plugin, kept until the work ended: about 170 bytes per poll.
    release = threading.Event()

    def hold(x: np.ndarray) -> np.ndarray:
        release.wait(30)
        return x

    pjrt_py.register_callback("promise_holds", hold, client=client)
    exe = client.compile(matmul_chain(128, 2, tail="promise_holds"))  # not run inline
    x = np.full((128, 128), 0.01, np.float32)
    pending = exe.execute_async(x)

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def poll(n: int) -> None:
        for _ in range(n):
            with pytest.raises(TimeoutError):
                pending.value(timeout=0)

    poll(20_000)  # warm
    before = rss()
    poll(200_000)  # was about 34 MB
    grown = rss() - before
    release.set()
    assert pending.value(timeout=60).shape == (128, 128)
    assert grown < 8 << 20, f"{grown / 2**20:.1f} MiB for 200,000 polls"
