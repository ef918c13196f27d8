"""Placement on any addressable device, copies between devices, device targets."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ADD_F32_8, matmul_chain

import pjrt_py

# Placement across devices: every test here needs four of them.
pytestmark = pytest.mark.needs_devices(4)


@pytest.fixture(scope="module")
def devices(client: pjrt_py.Client) -> list[pjrt_py.Device]:
    return client.addressable_devices


def test_buffers_go_where_they_are_asked(client: pjrt_py.Client, devices) -> None:  # type: ignore[no-untyped-def]
    for d in devices:
        assert client.buffer(np.ones(3, np.float32), d).device == d
        assert client.buffer_async(np.ones(3, np.float32), device=d).value().device == d


def test_copy_to_device_sync_and_async(client: pjrt_py.Client, devices) -> None:  # type: ignore[no-untyped-def]
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = client.buffer(data, devices[1])
    y = x.copy_to_device(devices[3])
    assert y.device == devices[3] and x.device == devices[1]
    np.testing.assert_array_equal(y.to_numpy(), data)
    promise = x.copy_to_device_async(devices[2])
    assert isinstance(promise, pjrt_py.BufferPromise)
    np.testing.assert_array_equal(promise.to_numpy(), data)
    assert promise.value().device == devices[2]
    assert (y.shape, y.dtype) == ((3, 4), np.int32)


def test_a_copy_of_pending_work_waits_on_the_device(client: pjrt_py.Client, devices) -> None:  # type: ignore[no-untyped-def]
    exe = client.compile(matmul_chain(256, 4), device=devices[0])
    x = np.full((256, 256), 0.01, np.float32)
    out = exe.execute_async(x)
    moved = out.buffer().copy_to_device_async(devices[1])  # no host wait in between
    expected = exe.execute(x).to_numpy()
    out.buffer().delete()  # the source may go while the copy is pending
    np.testing.assert_array_equal(moved.to_numpy(), expected)


def test_compile_targets_a_device(client: pjrt_py.Client, devices) -> None:  # type: ignore[no-untyped-def]
    exe = client.compile(ADD_F32_8, device=devices[2])
    assert exe.devices == [devices[2]]
    x = client.buffer(np.ones(8, np.float32), devices[2])
    out = exe.execute(x, np.full(8, 2, np.float32))  # numpy goes to the target device
    assert out.device == devices[2]
    np.testing.assert_array_equal(out.to_numpy(), np.full(8, 3, np.float32))
    assert client.compile(ADD_F32_8).devices == [devices[0]]  # the default


def test_an_argument_on_another_device_is_a_clear_error(client: pjrt_py.Client, devices) -> None:  # type: ignore[no-untyped-def]
    # Decision: no implicit copy (it would hide a transfer on the hot path).
    # pjrt_py refuses the call before dispatch (the plugin would too, but a
    # program that fails as it runs reports it through its promise);
    # copy_to_device moves the buffer.
    exe = client.compile(ADD_F32_8, device=devices[0])
    x = client.buffer(np.ones(8, np.float32), devices[1])
    with pytest.raises(ValueError, match="argument 0 is on .* copy_to_device"):
        exe.execute_async(x, x)
    # A promise of it too: the native path once viewed a promise through
    # DLPack wherever its buffer was, and ran.
    promised = client.buffer_async(np.ones(8, np.float32), devices[1])
    for call in (exe.execute, exe.execute_async):
        with pytest.raises(ValueError, match="argument 0 is on .* copy_to_device"):
            call(promised, promised)
    other = pjrt_py.Client().buffer_async(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="argument 0: buffer belongs to another client"):
        exe.execute(other, other)
    here = x.copy_to_device(devices[0])
    np.testing.assert_array_equal(exe.execute(here, here).to_numpy(), np.full(8, 2, np.float32))


def test_bad_placements_raise(client: pjrt_py.Client, devices) -> None:  # type: ignore[no-untyped-def]
    other = pjrt_py.Client()
    x = client.buffer(np.ones(2, np.float32))
    with pytest.raises(ValueError, match="another client"):
        x.copy_to_device(other.default_device)
    with pytest.raises(TypeError, match="pjrt_py.Device"):
        x.copy_to_device(1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="another client"):
        client.compile(ADD_F32_8, device=other.default_device)
    with pytest.raises(ValueError, match="single-device"):
        client.compile(ADD_F32_8, device=devices[1], num_replicas=2)
    x.delete()
    with pytest.raises(ValueError, match="deleted"):
        x.copy_to_device(devices[1])


@pytest.mark.needs_devices(2)  # a buffer off the default device
def test_copy_to_device_refuses_none(client: pjrt_py.Client) -> None:
    # None moved the buffer to the client's default device without a word;
    # jax.device_put(x, None) leaves x where it is.
    b = client.buffer(np.ones(2, np.float32), client.devices[1])
    for copy in (b.copy_to_device, b.copy_to_device_async):
        with pytest.raises(TypeError, match="not None"):
            copy(None)  # type: ignore[arg-type]
