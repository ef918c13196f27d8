"""Buffers: dtypes, shapes, layouts, copy and zero-copy semantics."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import lets_threads_run, queued_work
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pjrt_py
from pjrt_py.runtime import process as _runtime

ALL_DTYPES = [np.dtype(d) for d in pjrt_py.supported_dtypes]


def sample(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    n = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True).reshape(shape)
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype).reshape(shape)
    # floats, bfloat16 and the float8 family: small values every format can hold
    return (rng.integers(-4, 5, n) / 4).astype(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_supported_dtype_round_trips(client: pjrt_py.Client, dtype: np.dtype) -> None:
    x = sample(dtype, (3, 5))
    buf = client.buffer(x)
    assert buf.dtype == dtype
    assert buf.shape == (3, 5)
    out = buf.to_numpy()
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.view(np.uint8), x.view(np.uint8))


def test_bfloat16_and_float8_types_are_supported() -> None:
    names = {str(d) for d in pjrt_py.supported_dtypes}
    assert {"bfloat16", "float8_e4m3fn", "float8_e5m2"} <= names
    assert np.dtype(ml_dtypes.bfloat16) in pjrt_py.supported_dtypes


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1,), (1, 1, 1, 1)])
def test_zero_d_and_zero_size_shapes(client: pjrt_py.Client, shape: tuple[int, ...]) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    buf = client.buffer(x)
    assert buf.shape == shape
    out = buf.to_numpy()
    assert out.shape == shape
    np.testing.assert_array_equal(out, x)


def test_python_and_numpy_scalars(client: pjrt_py.Client) -> None:
    assert client.buffer(np.float32(2.5)).to_numpy() == np.float32(2.5)
    b = client.buffer(3)
    assert b.shape == () and b.dtype == np.int64 and int(b.to_numpy()) == 3
    assert client.buffer(True).dtype == np.bool_


def test_non_contiguous_arrays(client: pjrt_py.Client) -> None:
    base = np.arange(60, dtype=np.int32).reshape(6, 10)
    for view in (base.T, base[::2, 1::3], base[:, ::-1], np.asfortranarray(base)):
        np.testing.assert_array_equal(client.buffer(view).to_numpy(), view)


@pytest.mark.parametrize("value", [np.array(["a"]), np.array([object()]), "text", [1, "a"]])
def test_unsupported_dtypes_list_what_is_supported(client: pjrt_py.Client, value: object) -> None:
    with pytest.raises(TypeError, match="supported dtypes: bool, int8"):
        client.buffer(value)


def test_mutating_the_source_after_buffer_async_does_not_change_the_buffer(
    client: pjrt_py.Client,
) -> None:
    for n in (8, 1 << 20):  # small, and large enough for a plugin to copy lazily
        x = np.ones(n, np.float32)
        promise = client.buffer_async(x)
        x[:] = -7.0
        del x
        np.testing.assert_array_equal(promise.value().to_numpy(), np.ones(n, np.float32))


@pytest.mark.needs_zero_copy
def test_zero_copy_aliases_the_array_and_keeps_it_alive(client: pjrt_py.Client) -> None:
    import gc
    import weakref

    x = pjrt_py.aligned_empty((256,), np.float32)
    x[:] = np.arange(256)
    buf = client.buffer(x, zero_copy=True)
    assert buf.unsafe_pointer() == x.ctypes.data  # truly aliased, not copied
    base = weakref.ref(x.base if x.base is not None else x)
    del x
    gc.collect()
    assert base() is not None  # kept alive for the buffer
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(256, dtype=np.float32))
    buf.delete()
    gc.collect()
    _runtime.pending_holds()  # releases holds whose events fired
    assert base() is None


@pytest.mark.needs_host_buffers  # staged in host memory the buffer then is
def test_large_copies_are_staged_privately_and_freed_with_the_buffer(
    client: pjrt_py.Client,
) -> None:
    from pjrt_py.runtime.buffer import STAGED_COPY_BYTES, ZERO_COPY_ALIGNMENT

    x = np.arange(STAGED_COPY_BYTES // 4, dtype=np.float32)[::-1]  # not contiguous
    holds = _runtime.pending_holds()
    buf = client.buffer(x)
    assert buf.unsafe_pointer() % ZERO_COPY_ALIGNMENT == 0
    assert buf.unsafe_pointer() != x.ctypes.data
    expected = x.copy()
    x[:] = -1  # copy semantics: the source is free again at once
    np.testing.assert_array_equal(buf.to_numpy(), expected)
    assert _runtime.pending_holds() == holds + 1  # the staged memory, for the buffer
    buf.delete()
    assert _runtime.pending_holds() == holds  # released by PJRT's callback, no sweep


@pytest.mark.needs_host_buffers  # read in place, with no PJRT copy
def test_small_ready_results_are_read_at_once(client: pjrt_py.Client, add_exe) -> None:  # type: ignore[no-untyped-def]
    x = np.arange(8, dtype=np.float32)
    out = add_exe.execute(x, x)
    promise = out.to_numpy_async()
    assert promise.is_ready()  # copied in the call: no PJRT event to wait for
    assert promise._event_count == 0
    np.testing.assert_array_equal(promise.value(), 2 * x)


def test_direct_reads_and_deletes_from_other_threads_do_not_race(
    client: pjrt_py.Client,
) -> None:
    import threading

    x = np.arange(4096, dtype=np.float32)
    errors: list[BaseException] = []

    def reader(buf: pjrt_py.Buffer) -> None:
        try:
            while True:
                np.testing.assert_array_equal(buf.to_numpy(), x)
        except ValueError as exc:  # the buffer was deleted: the only way out
            assert "deleted" in str(exc)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    for _ in range(20):
        buf = client.buffer(x)
        thread = threading.Thread(target=reader, args=(buf,))
        thread.start()
        buf.delete()
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert not errors, errors


@pytest.mark.needs_zero_copy  # elsewhere zero_copy is refused whatever the array
def test_zero_copy_refuses_what_it_cannot_alias(client: pjrt_py.Client) -> None:
    x = pjrt_py.aligned_empty((65,), np.uint8)
    with pytest.raises(ValueError, match="aligned"):
        client.buffer(x[1:], zero_copy=True)
    with pytest.raises(ValueError, match="C-contiguous"):
        client.buffer(np.ones((4, 4), np.float32).T, zero_copy=True)


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3,), (2, 3)])
@pytest.mark.parametrize("alignment", [16, 64, 4096])
def test_aligned_empty_is_aligned_even_when_empty(shape: tuple[int, ...], alignment: int) -> None:
    # numpy moves the data pointer of a zero-byte view: empty arrays were not.
    x = pjrt_py.aligned_empty(shape, np.float64, alignment)
    assert x.shape == shape and x.dtype == np.float64 and x.flags.c_contiguous
    assert x.ctypes.data % alignment == 0


@pytest.mark.needs_zero_copy
def test_an_empty_aligned_array_is_taken_by_zero_copy(client: pjrt_py.Client) -> None:
    buf = client.buffer(pjrt_py.aligned_empty((0, 4), np.float32), zero_copy=True)
    assert buf.shape == (0, 4) and buf.to_numpy().shape == (0, 4)


def test_copy_semantics_do_not_alias(client: pjrt_py.Client) -> None:
    x = pjrt_py.aligned_empty((256,), np.float32)
    x[:] = 1
    buf = client.buffer(x)
    assert buf.unsafe_pointer() != x.ctypes.data


def test_to_numpy_async_and_array_protocol(client: pjrt_py.Client) -> None:
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    buf = client.buffer(x)
    promise = buf.to_numpy_async()
    assert isinstance(promise, pjrt_py.ArrayPromise)
    np.testing.assert_array_equal(promise.value(), x)
    np.testing.assert_array_equal(np.asarray(buf), x)
    assert np.asarray(buf, dtype=np.float32).dtype == np.float32
    out = buf.to_numpy()
    assert out.flags.c_contiguous and out.flags.writeable


def test_buffer_metadata_and_device(client: pjrt_py.Client) -> None:
    dev = client.devices[-1]
    buf = client.buffer(np.zeros((2, 3), np.int16), device=dev)
    assert (buf.shape, buf.dtype, buf.ndim, buf.size, buf.nbytes) == ((2, 3), np.int16, 2, 6, 12)
    assert buf.device is dev
    assert buf.is_ready()
    assert buf.block_until_ready() is buf
    assert "int16[2, 3]" in repr(buf)


def test_delete_is_idempotent_and_use_after_delete_raises(client: pjrt_py.Client) -> None:
    buf = client.buffer(np.ones(3, np.float32))
    buf.delete()
    buf.delete()
    assert buf.is_deleted
    assert repr(buf) == "<Buffer deleted>"
    assert buf.shape == (3,)  # metadata stays readable, as in jax
    for use in (buf.to_numpy, buf.to_numpy_async, buf.block_until_ready, buf.unsafe_pointer):
        with pytest.raises(ValueError, match="deleted"):
            use()


def test_device_of_another_client_is_refused(client: pjrt_py.Client) -> None:
    other = pjrt_py.Client()
    with pytest.raises(ValueError, match="another client"):
        client.buffer(np.ones(2), device=other.default_device)
    with pytest.raises(TypeError):
        client.buffer(np.ones(2), device="cpu:0")  # type: ignore[arg-type]


def test_buffers_cannot_be_made_directly() -> None:
    with pytest.raises(TypeError):
        pjrt_py.Buffer()


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(
            [
                np.bool_,
                np.int8,
                np.uint16,
                np.int32,
                np.int64,
                np.float16,
                np.float32,
                np.float64,
                np.complex64,
                np.complex128,
            ]
        ),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_round_trip_property(array: np.ndarray) -> None:
    client = pjrt_py.default_client()
    out = client.buffer(array).to_numpy()
    assert out.shape == array.shape and out.dtype == array.dtype
    assert out.tobytes() == np.ascontiguousarray(array).tobytes()  # bit-exact, NaNs too


def test_unsafe_pointer_of_queued_work_lets_other_threads_run(client: pjrt_py.Client) -> None:
    # XLA's CPU client answers UnsafePointer for a result whose execution has
    # not started by waiting for it: that wait must not hold the GIL.
    running, queued = queued_work(client, 0.5)
    buf = queued.buffer()
    assert lets_threads_run(buf.unsafe_pointer, running) != 0
