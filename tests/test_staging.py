"""Staged host <-> device transfers (native/staging_*.c, pjrt_py.runtime.staging).

On a GPU plugin large copies take the staged path by themselves; here it is
forced on (``mode="on"``) with small chunks, so that every mechanism runs on
the CPU builds: chunk boundaries, the ring's slots reused many times, the
copier threads, the driver, the promise of a staged copy, and every way a
transfer can be cut short. Each test checks the counters, so a test that
silently took the plain path fails.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import (
    doubling,
    gpu_client_or_skip,
    in_threads,
    matmul_chain,
    queued_work,
    run_python,
    slow_work,
)

import pjrt_py
from pjrt_py.runtime import staging
from pjrt_py.runtime.dtypes import PACKED

CHUNK = 16 << 10  # 16 KiB: a 1 MiB array is 64 chunks through 3 slots
# Packed sub-byte types are never staged (their device size is not numpy's):
# test_packed_types_take_the_plugins_copy.
ALL_DTYPES = [np.dtype(d) for d in pjrt_py.supported_dtypes if d not in PACKED]


@pytest.fixture(scope="module")
def staged(client: pjrt_py.Client) -> Iterator[pjrt_py.Client]:
    """A client of the plugin under test that stages every copy of 1 byte or more."""
    c = pjrt_py.Client(client.plugin)
    staging.configure(c, mode="on", min_bytes=1, chunk_bytes=CHUNK, slots=3)
    yield c
    c.close()


def counts(c: pjrt_py.Client) -> tuple[int, int]:
    s = staging.stats(c)
    return s["h2d"], s["d2h"]


def idle(c: pjrt_py.Client, seconds: float = 10.0) -> bool:
    """Whether every staged job of c has ended (within seconds)."""
    end = time.monotonic() + seconds
    while staging.stats(c)["active"] and time.monotonic() < end:
        time.sleep(0.002)
    return staging.stats(c)["active"] == 0


def random_array(shape: tuple[int, ...] | int, dtype: Any, seed: int = 0) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = np.random.default_rng(seed).integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw = raw & 1
    return raw.view(dtype).reshape(shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


# -- correctness -----------------------------------------------------------------


@pytest.mark.parametrize(
    "nbytes",
    [1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 5, 7 * CHUNK - 3, 1 << 20],
)
def test_round_trip_at_chunk_boundaries(staged: pjrt_py.Client, nbytes: int) -> None:
    x = random_array(nbytes, np.uint8, seed=nbytes)
    h2d, d2h = counts(staged)
    b = staged.buffer(x)
    same_bits(b.to_numpy(), x)
    assert counts(staged) == (h2d + 1, d2h + 1)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips_bit_exactly(staged: pjrt_py.Client, dtype: np.dtype) -> None:
    x = random_array((37, 129), dtype, seed=dtype.num)
    h2d, d2h = counts(staged)
    got = staged.buffer(x).to_numpy()
    same_bits(got, x)
    assert counts(staged) == (h2d + 1, d2h + 1)


@pytest.mark.parametrize("dtype", sorted(PACKED, key=str), ids=str)
def test_packed_types_take_the_plugins_copy(staged: pjrt_py.Client, dtype: np.dtype) -> None:
    x = (np.arange(37 * 129) % 4).astype(dtype).reshape(37, 129)  # valid in every packed type
    h2d, d2h = counts(staged)
    got = staged.buffer(x).to_numpy()
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.astype(np.int32), x.astype(np.int32))
    assert counts(staged) == (h2d, d2h)  # staged copies would read unpacked bytes as packed


def test_shapes_and_non_contiguous_sources(staged: pjrt_py.Client) -> None:
    base = random_array((64, 96, 3), np.float32)
    for view in (base[::2], base[:, ::3], base.transpose(2, 0, 1), base[..., 1], base[::-1]):
        same_bits(staged.buffer(view).to_numpy(), np.ascontiguousarray(view))
    fortran = np.asfortranarray(random_array((300, 41), np.int16))
    same_bits(staged.buffer(fortran).to_numpy(), np.ascontiguousarray(fortran))
    scalar = staged.buffer(np.float64(2.5))  # 8 bytes, one chunk
    assert scalar.to_numpy() == 2.5


def test_empty_arrays_take_the_plain_path(staged: pjrt_py.Client) -> None:
    h2d, d2h = counts(staged)
    for shape in ((0,), (3, 0, 2)):
        got = staged.buffer(np.zeros(shape, np.float32)).to_numpy()
        assert got.shape == shape and got.dtype == np.float32
    assert counts(staged) == (h2d, d2h)


def test_results_of_a_program_come_back_staged(staged: pjrt_py.Client) -> None:
    exe = staged.compile(matmul_chain(64, 2))
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32) / 8
    want = np.tanh(np.tanh(x @ x) @ np.tanh(x @ x))
    _, d2h = counts(staged)
    got = exe.execute(x).to_numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)
    assert counts(staged)[1] == d2h + 1


@pytest.mark.needs_memory_kinds("pinned_host")
def test_other_memories_take_the_plain_path(staged: pjrt_py.Client) -> None:
    x = random_array(5 * CHUNK + 3, np.uint8)
    h2d, d2h = counts(staged)
    pinned = staged.buffer(x, memory="pinned_host")
    same_bits(pinned.to_numpy(), x)
    assert counts(staged) == (h2d, d2h)
    same_bits(pinned.copy_to_memory("device").to_numpy(), x)  # staged from the device
    assert counts(staged) == (h2d, d2h + 1)


def test_below_min_bytes_and_off_take_the_plain_path(client: pjrt_py.Client) -> None:
    c = pjrt_py.Client(client.plugin)
    try:
        staging.configure(c, mode="on", min_bytes=1 << 20, chunk_bytes=CHUNK)
        x = random_array(1000, np.float32)
        same_bits(c.buffer(x).to_numpy(), x)
        assert counts(c) == (0, 0)
        staging.configure(c, mode="off", min_bytes=1)
        same_bits(c.buffer(x).to_numpy(), x)
        assert counts(c) == (0, 0)
    finally:
        c.close()


def test_auto_stages_nothing_on_a_plugin_that_maps_no_memory(client: pjrt_py.Client) -> None:
    """auto needs memory the plugin DMAs from: a CPU plugin maps none."""
    c = pjrt_py.Client(client.plugin)
    try:
        staging.configure(c, mode="auto", min_bytes=1, chunk_bytes=CHUNK)
        x = random_array(CHUNK * 4, np.uint8)
        same_bits(c.buffer(x).to_numpy(), x)
        s = staging.stats(c)
        if s["mode"] == "off":  # a CPU plugin: auto is off
            assert c.platform_name == "cpu" and counts(c) == (0, 0)
        elif not s["dma_mapped"]:  # tried, refused: the plain path from then on
            assert s["memory"] == "ready" and s["why_unmapped"] and counts(c) == (0, 0)
        else:
            assert counts(c) == (1, 1)
    finally:
        c.close()


@pytest.mark.gpu
def test_a_gpu_client_stages_large_copies_by_itself() -> None:
    """auto: the plugin maps the ring, and copies from min_bytes up go through it."""
    c = gpu_client_or_skip()
    try:
        settings = staging.stats(c)
        assert settings["mode"] == "auto"
        small = random_array(settings["min_bytes"] - 1, np.uint8)
        same_bits(c.buffer(small).to_numpy(), small)
        assert counts(c) == (0, 0)
        x = random_array(64 << 20, np.uint8, seed=3)
        b = c.buffer(x)
        same_bits(b.to_numpy(), x)
        same_bits(b.to_numpy_async().value(), x)
        s = staging.stats(c)
        assert s["dma_mapped"], f"the plugin did not map the ring: {s['why_unmapped']}"
        assert (s["h2d"], s["d2h"]) == (1, 2)
    finally:
        c.close()


# -- asynchronous forms ----------------------------------------------------------------


def test_to_numpy_async_returns_before_the_source_is_ready(staged: pjrt_py.Client) -> None:
    pending = slow_work(staged, 0.3)()
    promise = pending.to_numpy_async()
    assert isinstance(promise, pjrt_py.ArrayPromise)
    assert not promise.is_ready()
    assert "pending" in repr(promise)
    got = promise.value()
    assert promise.is_ready() and got.shape == (256, 256)
    np.testing.assert_array_equal(got, pending.value().to_numpy())


def test_to_numpy_async_of_queued_work_waits_for_nothing(staged: pjrt_py.Client) -> None:
    # XLA's CPU client answers IncreaseExternalReferenceCount on a queued
    # execution's output by waiting for it to start. to_numpy_async once took
    # that reference at the call, with the GIL held: the caller, and every
    # other Python thread, waited for the work upstream.
    running, queued = queued_work(staged)
    promise = queued.to_numpy_async()
    assert not running.is_ready()  # the call returned while the work ran
    np.testing.assert_array_equal(promise.value(), 2 * running.value().to_numpy())


def test_a_staged_read_keeps_its_source_from_donation(staged: pjrt_py.Client) -> None:
    running, pending = queued_work(staged)
    array = pending.to_numpy_async()
    assert not running.is_ready()
    donating = doubling(staged, donate=True)
    doubled = donating.execute_async(pending)  # asks to donate what the read will copy
    source = pending.value()
    assert not source.is_deleted  # not donated: the read still needs it
    got = array.value()
    np.testing.assert_array_equal(got, source.to_numpy())
    np.testing.assert_array_equal(doubled.value().to_numpy(), 2 * got)
    # Once the read has let the source go, donation is as asked.
    end = time.monotonic() + 10
    while source._exports and time.monotonic() < end:
        time.sleep(0.002)
    assert source._exports == 0
    donating.execute(source)
    assert source.is_deleted


def test_value_timeout_then_the_result(staged: pjrt_py.Client) -> None:
    promise = slow_work(staged, 0.3)().to_numpy_async()
    with pytest.raises(TimeoutError, match="not ready after"):
        promise.value(timeout=0.001)
    assert promise.value(timeout=60).shape == (256, 256)


def test_done_callbacks_and_await(staged: pjrt_py.Client) -> None:
    seen: list[Any] = []
    fired = threading.Event()
    promise = slow_work(staged, 0.2)().to_numpy_async()

    def done(p: Any) -> None:
        seen.append(p)
        fired.set()

    promise.add_done_callback(done)
    promise.add_done_callback(lambda p: seen.append("second"))
    assert fired.wait(60)
    assert seen[0] is promise and "second" in seen
    late: list[Any] = []
    promise.add_done_callback(late.append)  # already done: runs at once
    assert late == [promise]

    async def main() -> np.ndarray:
        return await slow_work(staged, 0.2)().to_numpy_async()

    assert asyncio.run(main()).shape == (256, 256)


def test_a_done_callback_may_wait_for_another_staged_copy(staged: pjrt_py.Client) -> None:
    """Done callbacks do not run on the thread that runs staged copies."""
    x = random_array(20 * CHUNK, np.uint8)
    other = staged.buffer(x)
    got: list[Any] = []
    finished = threading.Event()

    def read_another(_: Any) -> None:
        try:
            got.append(other.to_numpy())  # a staged copy, waited for in the callback
            got.append(other.to_numpy_async().value(timeout=30))
        except BaseException as e:  # handed to the test
            got.append(e)
        finished.set()

    slow_work(staged, 0.1)().to_numpy_async().add_done_callback(read_another)
    assert finished.wait(60), "the callback never ended"
    assert len(got) == 2 and not isinstance(got[0], BaseException), got
    same_bits(got[0], x)
    same_bits(got[1], x)


def test_buffer_async_snapshots_the_source(staged: pjrt_py.Client) -> None:
    x = random_array(40 * CHUNK, np.uint8)
    want = x.copy()
    promise = staged.buffer_async(x)
    x[:] = 0  # the call has read the array: the device keeps what it read
    same_bits(promise.value().to_numpy(), want)


def test_a_dropped_promise_still_lands_and_frees(staged: pjrt_py.Client) -> None:
    for _ in range(20):
        slow_work(staged, 0.01)().to_numpy_async()  # dropped at once
    gc.collect()
    assert idle(staged)


def test_staged_copies_from_many_threads(staged: pjrt_py.Client) -> None:
    def work(k: int) -> None:
        for i in range(5):
            x = random_array((k + 1) * 5 * CHUNK + i, np.uint8, seed=k * 10 + i)
            b = staged.buffer(x)
            same_bits(b.to_numpy_async().value(), x)

    assert in_threads(work, 6) == []
    assert idle(staged)


@pytest.mark.needs_devices(2)
def test_a_read_from_one_device_does_not_wait_for_another_devices(
    staged: pjrt_py.Client,
) -> None:
    """Each device has a driver thread of its own, and a job reading ahead
    leaves free ring slots to a job waiting for one: a small read from device
    1 ends while a large one from device 0, started first, still runs. With
    one driver for all it could only end after the large one."""
    d0, d1 = staged.devices[:2]
    large_x = random_array(32 << 20, np.uint8, seed=1)  # 2,048 chunks through 3 slots
    small_x = random_array(4 * CHUNK, np.uint8, seed=2)
    large, small = staged.buffer(large_x, device=d0), staged.buffer(small_x, device=d1)
    overtook = []
    for _ in range(3):  # the large read must still run when the small one ends
        slow = large.to_numpy_async()
        quick = small.to_numpy_async()
        same_bits(quick.value(), small_x)
        overtook.append(not slow.is_ready())
        same_bits(slow.value(), large_x)
        if overtook[-1]:
            break
    assert any(overtook), "the small read ended only after the large one, each time"
    assert idle(staged)


# -- failures and races ------------------------------------------------------------


@pytest.mark.needs_host_callbacks
def test_a_failed_source_fails_the_staged_copy(staged: pjrt_py.Client) -> None:
    def boom(x: np.ndarray) -> np.ndarray:
        raise ValueError("no data for you")

    pjrt_py.register_callback("staging_boom", boom, client=staged)
    exe = staged.compile(matmul_chain(256, 8, tail="staging_boom"))
    _, d2h = counts(staged)
    promise = exe.execute_async(np.ones((256, 256), np.float32))
    with pytest.raises(pjrt_py.PjrtError, match="no data for you"):
        promise.to_numpy_async().value()
    assert idle(staged)
    x = random_array(5 * CHUNK, np.uint8)  # the ring is fine afterwards
    same_bits(staged.buffer(x).to_numpy(), x)
    assert counts(staged)[1] >= d2h + 1


@pytest.mark.needs_host_callbacks
@pytest.mark.parametrize("watch", ["done-callback", "await"])
def test_a_failed_source_fails_a_watched_staged_copy(staged: pjrt_py.Client, watch: str) -> None:
    # A done callback (await adds one) on the staged read of pending work that
    # then failed made the promise "done, no error": value() returned the
    # never-written array.
    release = threading.Event()

    def boom(x: np.ndarray) -> np.ndarray:
        release.wait(10)
        raise ValueError("no data for you")

    pjrt_py.register_callback("staging_boom_watched", boom, client=staged)
    exe = staged.compile(matmul_chain(256, 8, tail="staging_boom_watched"))
    source = exe.execute_async(np.ones((256, 256), np.float32))
    read = source.to_numpy_async()
    seen: list[Any] = []
    called = threading.Event()
    if watch == "done-callback":
        read.add_done_callback(lambda p: (seen.append(p.exception()), called.set()))
        release.set()
        with pytest.raises(pjrt_py.PjrtError, match="no data for you"):
            read.value()
    else:

        async def main() -> None:
            release.set()
            await read

        with pytest.raises(pjrt_py.PjrtError, match="no data for you"):
            asyncio.run(main())
    assert read.exception() is not None
    # (Not asserted: the failed source Buffer's own block_until_ready(). With
    # a done callback on its staged read and value() called, it returned
    # without raising in about 1 run in 3 under load, on every CPU build:
    # found in CI, not yet traced. The read itself always fails.)
    if watch == "done-callback":
        assert called.wait(10) and len(seen) == 1 and seen[0] is not None
    assert idle(staged)


def test_ctrl_c_stops_a_staged_upload(client: pjrt_py.Client) -> None:
    """KeyboardInterrupt raises out of a long staged buffer(); the client stays good."""
    c = pjrt_py.Client(client.plugin)
    staging.configure(c, mode="on", min_bytes=1, chunk_bytes=4096, slots=1)
    big = random_array(128 << 20, np.uint8)  # 32768 chunks, one at a time
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main = threading.main_thread().ident
    timer = threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT))
    finished = []
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            c.buffer(big)
            finished.append(True)
            time.sleep(5)  # the upload beat the timer: the signal lands here instead
        assert not finished, "the upload ended before the signal: make it longer"
        assert idle(c)
        x = random_array(9 * 4096 + 3, np.uint8)
        same_bits(c.buffer(x).to_numpy(), x)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
        c.close()


def test_deleting_the_source_during_a_staged_read(staged: pjrt_py.Client) -> None:
    for _ in range(10):
        x = random_array(50 * CHUNK, np.uint8)
        b = staged.buffer(x)
        promise = b.to_numpy_async()
        b.delete()  # the job holds the handle until it is done
        same_bits(promise.value(), x)
    assert idle(staged)


def test_new_chunks_wait_for_copies_in_flight(staged: pjrt_py.Client) -> None:
    promise = slow_work(staged, 0.3)().to_numpy_async()
    if not promise.is_ready():
        with pytest.raises(RuntimeError, match="still in flight after"):
            staging.configure(staged, chunk_bytes=2 * CHUNK, timeout=0.01)
    staging.configure(staged, mode="on", min_bytes=1)  # applies at once, copies or not
    staging.configure(staged, chunk_bytes=2 * CHUNK)  # waits for the copy
    assert staging.stats(staged)["active"] == 0
    assert promise.value(timeout=10).shape == (256, 256)
    x = random_array(9 * CHUNK + 1, np.uint8)  # through the new ring
    same_bits(staged.buffer(x).to_numpy(), x)
    staging.configure(staged, chunk_bytes=CHUNK)


def test_settings_are_checked() -> None:
    read = staging.settings_from_environment
    assert read({}) == {}
    assert read({"PJRT_PY_STAGED_TRANSFERS": " ON ", "PJRT_PY_STAGING_SLOTS": "2"}) == {
        "mode": "on",
        "slots": 2,
    }
    for name, value in (
        ("PJRT_PY_STAGED_TRANSFERS", "always"),
        ("PJRT_PY_STAGED_MIN_BYTES", "0"),
        ("PJRT_PY_STAGING_CHUNK_BYTES", "5000"),
        ("PJRT_PY_STAGING_CHUNK_BYTES", "lots"),
        ("PJRT_PY_STAGING_SLOTS", "17"),
        ("PJRT_PY_STAGING_THREADS", "0"),
    ):
        with pytest.raises(ValueError, match=name):
            read({name: value})


def test_configure_checks_its_arguments(staged: pjrt_py.Client) -> None:
    with pytest.raises(ValueError, match="mode"):
        staging.configure(staged, mode="sometimes")
    with pytest.raises(ValueError, match="chunk_bytes"):
        staging.configure(staged, chunk_bytes=1000)
    with pytest.raises(ValueError, match="slots"):
        staging.configure(staged, slots=0)
    with pytest.raises(TypeError, match="min_bytes"):
        staging.configure(staged, min_bytes=1.5)  # type: ignore[arg-type]
    assert staging.stats(staged)["chunk_bytes"] == CHUNK


def test_a_bad_environment_refuses_the_client_by_name(client: pjrt_py.Client) -> None:
    result = run_python(
        f"""
        import os
        import pjrt_py
        os.environ["PJRT_PY_STAGING_SLOTS"] = "99"
        try:
            pjrt_py.Client({str(client.plugin.path)!r})
        except ValueError as e:
            print("refused:", e)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "refused: PJRT_PY_STAGING_SLOTS='99'" in result.stdout


# Processes: close() racing, exit with copies in flight, fork.
RACE = """
import os, threading, time
import numpy as np
import pjrt_py
from pjrt_py.runtime import staging

for rep in range(8):
    c = pjrt_py.Client({plugin!r})
    staging.configure(c, mode="on", min_bytes=1, chunk_bytes=8192, slots=2)
    x = np.arange(1 << 19, dtype=np.float32)
    b = c.buffer(x)
    outcomes = []

    def upload():
        try:
            for _ in range(20):
                got = c.buffer(x).to_numpy()
                assert (got == x).all()
        except ValueError as e:
            outcomes.append(str(e))

    def download():
        try:
            for _ in range(20):
                assert (b.to_numpy_async().value() == x).all()
        except ValueError as e:
            outcomes.append(str(e))

    threads = [threading.Thread(target=f) for f in (upload, download, upload)]
    for t in threads:
        t.start()
    time.sleep(0.002 * rep)
    c.close()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert all("closed" in o for o in outcomes), outcomes
print("ok")
"""


def test_close_racing_staged_copies_ends_cleanly(client: pjrt_py.Client) -> None:
    result = run_python(RACE.format(plugin=str(client.plugin.path)), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


EXIT = """
import os, sys, threading
import numpy as np
import pjrt_py
from pjrt_py.runtime import staging
sys.path.insert(0, {tests!r})
from conftest import matmul_chain

rep = int(sys.argv[1])
c = pjrt_py.Client({plugin!r})
staging.configure(c, mode="on", min_bytes=1, chunk_bytes=4096, slots=2)
big = np.ones(1 << 22, np.float32)  # 16 MiB: 4096 chunks
threading.Thread(target=lambda: c.buffer(big), daemon=True).start()
exe = c.compile(matmul_chain(512, 8))  # some 0.5 s on a core: surely running at exit
pending = exe.execute_async(np.eye(512, dtype=np.float32)).to_numpy_async()
ready = c.buffer(np.ones(1 << 18, np.float32)).to_numpy_async()
if rep % 2:
    pending.add_done_callback(lambda p: None)
if rep % 3 == 0:
    del pending, ready
sys.exit(3)
"""


@pytest.mark.parametrize("wait", ["0", "0.05", "2"])
def test_exit_with_staged_copies_in_flight(client: pjrt_py.Client, wait: str, tmp_path) -> None:
    script = tmp_path / "exit_staged.py"
    tests = os.path.dirname(__file__)
    script.write_text(EXIT.format(plugin=str(client.plugin.path), tests=tests))
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    env = {**os.environ, "PJRT_PY_EXIT_TIMEOUT": wait, "PYTHONFAULTHANDLER": "1"}
    left_running = 0
    for rep in range(4):
        result = subprocess.run(
            [sys.executable, str(script), str(rep)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert result.returncode == 3, (rep, result.returncode, result.stderr[-3000:])
        left_running += "left to the process exit" in result.stderr
    if wait == "0":  # the copies really were in flight at exit
        assert left_running == 4


FORK = """
import os
import numpy as np
import pjrt_py
from pjrt_py.runtime import staging

c = pjrt_py.Client({plugin!r})
staging.configure(c, mode="on", min_bytes=1, chunk_bytes=8192, slots=2)
x = np.arange(1 << 16, dtype=np.float64)
b = c.buffer(x)
pending = b.to_numpy_async()
pid = os.fork()
if pid == 0:
    try:
        c.buffer(x)
        os._exit(10)
    except ValueError as e:
        assert "os.fork()" in str(e), e
    try:
        fresh = pjrt_py.Client({plugin!r})
    except Exception as e:  # CUDA cannot start again in a child of a process using it
        print("no client in the child:", e)
        os._exit(20)
    staging.configure(fresh, mode="on", min_bytes=1, chunk_bytes=8192, slots=2)
    assert (fresh.buffer(x).to_numpy() == x).all()
    assert staging.stats(fresh)["h2d"] == 1 and staging.stats(fresh)["d2h"] == 1
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
assert (pending.value() == x).all() and (c.buffer(x).to_numpy() == x).all()
print("ok")
"""


def test_fork_with_staged_copies(client: pjrt_py.Client) -> None:
    result = run_python(FORK.format(plugin=str(client.plugin.path)), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split()
    assert lines[-1] == "ok"
    # The CPU plugins make a new client in the child, and it stages; a GPU
    # plugin may not start at all in a child of a process that used it.
    allowed = {"0"} if client.platform_name == "cpu" else {"0", "20"}
    assert lines[lines.index("child") + 1] in allowed, result.stdout
