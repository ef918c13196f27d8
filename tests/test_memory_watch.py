"""memory_watch: per-device start, peak and end bytes of a block, with their source.

The byte figures are exact: pjrt_py's count is shape x item size of the
buffers it holds (``native/accounting.c``). Buffers other tests left alive
are in every figure, so each test compares with the block's own start; the
garbage collector is held off inside blocks, so nothing is freed behind a
test's back. ``source="pjrt_py"`` keeps the figures exact on plugins that
keep device statistics too.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import in_threads

import pjrt_py
from pjrt_py.runtime.capi import ffi
from pjrt_py.runtime.memory_watch import SOURCE_PJRT_PY, SOURCE_PLUGIN, _choose

DOUBLE = """
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.add %x, %x : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""  # 128 bytes in, 128 out

TWO_OUT = """
func.func @main(%x: tensor<16xf32>) -> (tensor<16xf32>, tensor<3x5xi32>) {
  %0 = stablehlo.add %x, %x : tensor<16xf32>
  %1 = stablehlo.constant dense<7> : tensor<3x5xi32>
  return %0, %1 : tensor<16xf32>, tensor<3x5xi32>
}
"""  # 64 + 60 bytes out

DONATE = """
func.func @main(%x: tensor<1024xf32> {tf.aliasing_output = 0 : i32}) -> tensor<1024xf32> {
  %0 = stablehlo.add %x, %x : tensor<1024xf32>
  return %0 : tensor<1024xf32>
}
"""  # 4096 bytes, reused by the output


@pytest.fixture(autouse=True)
def no_collection() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture(scope="module")
def double(client: pjrt_py.Client) -> pjrt_py.Executable:
    return client.compile(DOUBLE)


def f32(
    client: pjrt_py.Client, *shape: int, device: pjrt_py.Device | None = None
) -> pjrt_py.Buffer:
    return client.buffer(np.ones(shape, np.float32), device=device)


def added(w: pjrt_py.MemoryWatch, device: pjrt_py.Device) -> tuple[int, int]:
    """(peak, end) above the block's start on `device`."""
    m = w[device]
    return m.peak_bytes - m.start_bytes, m.end_bytes - m.start_bytes


# -- figures ----------------------------------------------------------------------


def test_a_chain_of_executions_peaks_at_the_buffers_alive_at_once(
    client: pjrt_py.Client, double: pjrt_py.Executable
) -> None:
    dev = client.devices[0]
    x = f32(client, 4, 8)  # made before the block: in its start
    with pjrt_py.memory_watch(client, source="pjrt_py") as w:
        y = double.execute(x)
        z = double.execute(y)  # x, y, z alive: 384 bytes
        del y
    assert w[dev].start_bytes >= 128
    assert added(w, dev) == (256, 128)
    assert w[dev].peak_increase == 256
    assert w.source[dev] == SOURCE_PJRT_PY
    assert w.peak_bytes[dev] == w[dev].peak_bytes and w.end_bytes[dev] == w[dev].end_bytes
    del z
    with pjrt_py.memory_watch(client, source="pjrt_py") as after:
        pass
    assert after[dev].start_bytes == w[dev].end_bytes - 128  # z went


def test_without_device_statistics_the_figures_are_pjrt_pys(
    client: pjrt_py.Client, double: pjrt_py.Executable
) -> None:
    dev = client.devices[0]
    if dev.memory_stats() is not None:
        pytest.skip("the plugin keeps device statistics: its figures are the plugin's")
    with pjrt_py.memory_watch() as w:  # every client's devices, the default source
        out = double.execute(f32(client, 4, 8))
    assert w.source[dev] == SOURCE_PJRT_PY
    assert added(w, dev) == (256, 128)  # the argument, freed at the end, and the output
    assert set(client.addressable_devices) <= set(w.report)
    del out


def test_several_outputs_count_each(client: pjrt_py.Client) -> None:
    exe = client.compile(TWO_OUT)
    dev = client.devices[0]
    x = f32(client, 16)
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        a, b = exe.execute(x)
        del a
    assert added(w, dev) == (124, 60)
    assert list(w.report) == [dev]
    del b


def test_an_output_never_made_into_a_buffer_counts_while_its_promise_lives(
    client: pjrt_py.Client, double: pjrt_py.Executable
) -> None:
    dev = client.devices[0]
    x = f32(client, 4, 8)
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        promise = double.execute_async(x)
        promise.block_until_ready()
        middle = w[dev].end_bytes - w[dev].start_bytes
        chained = double.execute_async(promise)  # makes the promise's Buffer: no double count
        chained.block_until_ready()
        del promise
    assert middle == 128
    assert added(w, dev) == (256, 128)  # the first output went with its promise
    del chained


def test_bytes_are_the_plugins_on_device_size_for_every_dtype(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    for dtype in pjrt_py.supported_dtypes:
        with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
            b = client.buffer(np.zeros((3, 5), dtype))
        size = client.plugin.invoke(
            "PJRT_Buffer_OnDeviceSizeInBytes", buffer=ffi.cast("PJRT_Buffer*", b._handle)
        ).on_device_size_in_bytes
        assert added(w, dev) == (size, size), dtype
        assert b.on_device_size_in_bytes() == size
        # nbytes is numpy's count, one byte per element even where the device packs
        packed = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2, "float4_e2m1fn": 4}
        bits = packed.get(dtype.name, 8 * dtype.itemsize)
        if client.platform_name == "cpu" or bits % 8 == 0:  # every CPU build packs sub-bytes
            assert size == (b.size * bits + 7) // 8, dtype
        assert b.nbytes == b.size * dtype.itemsize
        del b


# -- lifetimes ---------------------------------------------------------------------


def test_delete_stops_the_count_at_once(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        b = f32(client, 1000)
        b.delete()
        b.delete()  # idempotent: nothing more
        c = f32(client, 10)
    assert added(w, dev) == (4000, 40)
    del b, c


@pytest.mark.needs_host_buffers
def test_a_buffer_lent_by_dlpack_counts_until_the_consumer_lets_go(
    client: pjrt_py.Client,
) -> None:
    dev = client.devices[0]
    b = f32(client, 256)
    b.block_until_ready()
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        view = np.from_dlpack(b)
        b.delete()  # dead to Python; the memory is numpy's to read still
        lent = w[dev].end_bytes - w[dev].start_bytes
        del view
    assert lent == 0  # nothing freed yet
    assert added(w, dev) == (0, -1024)


@pytest.mark.needs_zero_copy
def test_memory_pjrt_py_did_not_allocate_is_not_counted(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    host = pjrt_py.aligned_empty((512,), np.float32)
    host[:] = 1
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        alias = client.buffer(host, zero_copy=True)
        view = pjrt_py.from_dlpack(host, device=dev, copy=False)
        copied = client.buffer(host)
    assert alias._host_aliased and view._host_aliased
    assert added(w, dev) == (2048, 2048)  # the copy only
    del alias, view, copied


def test_a_staged_large_copy_is_pjrt_pys_memory(client: pjrt_py.Client) -> None:
    from pjrt_py.runtime.buffer import STAGED_COPY_BYTES

    dev = client.devices[0]
    n = STAGED_COPY_BYTES // 4
    big = np.ones(n, np.float32)
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        b = client.buffer(big)
        del b
    assert added(w, dev) == (4 * n, 0)


def test_a_donated_argument_stops_counting_before_the_output_counts(
    client: pjrt_py.Client,
) -> None:
    exe = client.compile(DONATE)
    dev = client.devices[0]
    x = f32(client, 1024)
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        out = exe.execute(x)
    assert x.is_deleted  # the plugin took it
    assert added(w, dev) == (0, 0)  # its 4096 bytes became the output's
    kept = f32(client, 1024)
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w2:
        out2 = exe.execute(kept, non_donatable=[0])
    assert not kept.is_deleted
    assert added(w2, dev) == (4096, 4096)
    del out, out2


def test_a_numpy_argument_is_a_temporary_buffer(
    client: pjrt_py.Client, double: pjrt_py.Executable
) -> None:
    dev = client.devices[0]
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        out = double.execute(np.ones((4, 8), np.float32))
    assert added(w, dev) == (256, 128)
    del out


@pytest.mark.needs_devices(2)
def test_copies_and_sharded_outputs_count_on_their_own_device(client: pjrt_py.Client) -> None:
    d0, d1 = client.devices[:2]
    exe = client.compile(DOUBLE, num_replicas=2, device_assignment=[[d0], [d1]])
    x0, x1 = f32(client, 4, 8, device=d0), f32(client, 4, 8, device=d1)
    with pjrt_py.memory_watch([d0, d1], source="pjrt_py") as w:
        copy = x0.copy_to_device(d1)
        outs = exe.execute_sharded([[x0], [x1]])
    assert added(w, d0) == (128, 128)
    assert added(w, d1) == (256, 256)
    del copy, outs


@pytest.mark.needs_memory_kinds("pinned_host")
def test_a_copy_to_another_memory_counts_on_the_device(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    x = f32(client, 64)
    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        pinned = x.copy_to_memory("pinned_host")
    assert added(w, dev) == (256, 256)
    del pinned


# -- watches -----------------------------------------------------------------------


def test_nested_watches_each_see_their_own_peak(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    with pjrt_py.memory_watch(dev, source="pjrt_py") as outer:
        big = f32(client, 1000)  # 4000
        del big
        with pjrt_py.memory_watch(dev, source="pjrt_py") as inner:
            small = f32(client, 100)  # 400
            so_far = outer.peak_bytes[dev] - outer.start_bytes[dev]
        kept = f32(client, 10)  # 40
        with pjrt_py.memory_watch(dev, source="pjrt_py") as last:
            pass
    assert so_far == 4000  # read inside: the figures so far
    assert added(inner, dev) == (400, 400)
    assert added(outer, dev) == (4000, 440)
    assert added(last, dev) == (0, 0)
    del small, kept


def test_other_threads_work_counts_while_a_watch_is_open(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    made = threading.Event()
    release = threading.Event()

    def worker() -> None:
        b = f32(client, 500)
        made.set()
        release.wait(10)
        del b

    with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
        t = threading.Thread(target=worker)
        t.start()
        assert made.wait(10)
        release.set()
        t.join(10)
    assert added(w, dev) == (2000, 0)


def test_watches_and_buffers_from_many_threads_balance(
    client: pjrt_py.Client, double: pjrt_py.Executable
) -> None:
    dev = client.devices[0]

    def churn(k: int) -> None:
        for i in range(40):
            with pjrt_py.memory_watch(dev, source="pjrt_py") as w:
                x = f32(client, 4, 8)
                y = double.execute_async(x)
                if i % 2:
                    y.value().delete()
                del x, y
            assert w[dev].peak_bytes >= w[dev].start_bytes

    for _ in range(5):
        with pjrt_py.memory_watch(dev, source="pjrt_py") as total:
            assert not in_threads(churn, 8)
        assert total[dev].end_bytes == total[dev].start_bytes
        assert total[dev].peak_bytes >= total[dev].start_bytes + 256


def test_a_block_that_raises_still_has_its_figures(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    watch = pjrt_py.memory_watch(dev, source="pjrt_py")
    with pytest.raises(KeyError), watch:
        b = f32(client, 8)
        raise KeyError("boom")
    assert added(watch, dev) == (32, 32)
    del b


def test_a_client_made_inside_the_block_is_reported(client: pjrt_py.Client) -> None:
    with pjrt_py.memory_watch(source="pjrt_py") as w:
        other = pjrt_py.Client(client.plugin)
        b = other.buffer(np.ones(16, np.float32))
    dev = other.devices[0]
    assert w[dev].start_bytes == 0 and w[dev].peak_bytes == w[dev].end_bytes == 64
    del b
    other.close()


def test_misuse_is_a_clear_error(client: pjrt_py.Client) -> None:
    watch = pjrt_py.memory_watch(client)
    with pytest.raises(RuntimeError, match="not been entered"):
        _ = watch.peak_bytes
    with watch:
        pass
    with pytest.raises(RuntimeError, match="entered once"), watch:
        pass
    with pytest.raises(TypeError, match="Devices or Clients"):
        pjrt_py.memory_watch("cpu")
    with pytest.raises(ValueError, match="source"):
        pjrt_py.memory_watch(source="plugin")


# -- the plugin's statistics ---------------------------------------------------------


def test_the_plugins_peak_is_used_only_when_it_rose_in_the_block(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    counted = (100, 300, 200)
    rose = _choose(
        dev,
        {"bytes_in_use": 1000, "peak_bytes_in_use": 5000},
        {"bytes_in_use": 1200, "peak_bytes_in_use": 6000},
        counted,
    )
    assert (rose.start_bytes, rose.peak_bytes, rose.end_bytes, rose.source) == (
        1000,
        6000,
        1200,
        SOURCE_PLUGIN,
    )
    # The block stayed under an earlier peak: the plugin cannot say its peak.
    under = _choose(
        dev,
        {"bytes_in_use": 1000, "peak_bytes_in_use": 5000},
        {"bytes_in_use": 1200, "peak_bytes_in_use": 5000},
        counted,
    )
    assert (under.peak_bytes, under.source) == (300, SOURCE_PJRT_PY)
    assert under.stats_end == {"bytes_in_use": 1200, "peak_bytes_in_use": 5000}
    # No peak statistic, or no statistics at all: pjrt_py's count.
    assert _choose(dev, {"bytes_in_use": 1}, {"bytes_in_use": 2}, counted).source == SOURCE_PJRT_PY
    assert _choose(dev, None, None, counted).source == SOURCE_PJRT_PY


@pytest.mark.gpu
def test_on_a_plugin_with_statistics_a_new_peak_is_the_plugins(client: pjrt_py.Client) -> None:
    dev = client.devices[0]
    if dev.memory_stats() is None or "peak_bytes_in_use" not in (dev.memory_stats() or {}):
        pytest.skip("the plugin keeps no peak statistic (Device.memory_stats())")
    before = (dev.memory_stats() or {})["peak_bytes_in_use"]
    n = max(before, 1 << 20) // 4 + (1 << 20)  # more than was ever in use at once
    with pjrt_py.memory_watch(dev) as w:
        b = client.buffer(np.ones(n, np.float32))
        b.block_until_ready()
    assert w.source[dev] == SOURCE_PLUGIN
    assert w[dev].peak_bytes >= w[dev].start_bytes + 4 * n
    del b
