"""``np.asarray`` of Buffers and promises: numpy's conversion protocol.

``np.asarray(buffer)`` copies; ``copy=False`` (numpy 2) is a view or a
``ValueError``, never a silent copy; a promise waits for its work and then
converts as its value does (docs/interop.md). Before this, ``copy=False``
returned a private copy, so writes and pointer checks silently missed the
buffer, and ``np.asarray(promise)`` read a promise as a sequence of
promises nested without end (numpy: "would exceed the maximum number of
dimension of 64").
"""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest
from conftest import slow_work

import pjrt_py

X = np.arange(12, dtype=np.float32).reshape(3, 4)
TWO_OUTPUTS = """
func.func @main(%a: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %d = stablehlo.add %a, %a : tensor<4xf32>
  return %a, %d : tensor<4xf32>, tensor<4xf32>
}
"""
NO_OUTPUTS = "func.func @main(%a: tensor<4xf32>) -> () { return }"
COLUMN_MAJOR_OUT = """
func.func @main(%x: tensor<3x4xf32>) -> (tensor<3x4xf32> {mhlo.layout_mode = "{0,1}"}) {
  return %x : tensor<3x4xf32>
}
"""

needs_numpy_2 = pytest.mark.skipif(
    np.lib.NumpyVersion(np.__version__) < "2.0.0",
    reason="needs numpy 2, which passes copy= to __array__",
)


def test_asarray_copies_into_an_array_the_caller_owns(client: pjrt_py.Client) -> None:
    buf = client.buffer(X)
    out = np.asarray(buf)
    np.testing.assert_array_equal(out, X)
    assert out.flags.writeable and out.flags.owndata
    out[0, 0] = 100
    np.testing.assert_array_equal(buf.to_numpy(), X)  # the buffer is untouched
    np.testing.assert_array_equal(np.asarray(buf, dtype=np.float64), X.astype(np.float64))
    assert np.asarray(buf, dtype=np.float64).dtype == np.float64


@needs_numpy_2
@pytest.mark.needs_host_buffers
def test_copy_false_is_a_read_only_view_of_the_buffer(client: pjrt_py.Client) -> None:
    buf = client.buffer(X)
    view = np.asarray(buf, copy=False)
    np.testing.assert_array_equal(view, X)
    assert view.ctypes.data == buf.unsafe_pointer()
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0] = 1
    same = np.asarray(buf, dtype=np.float32, copy=False)  # the buffer's own dtype
    assert same.ctypes.data == buf.unsafe_pointer()


@needs_numpy_2
@pytest.mark.needs_host_buffers
def test_copy_false_views_dtypes_numpys_dlpack_cannot_read(client: pjrt_py.Client) -> None:
    # numpy's own from_dlpack refuses bfloat16; the view does not go through it.
    values = np.arange(8, dtype=ml_dtypes.bfloat16)
    buf = client.buffer(values)
    view = np.asarray(buf, copy=False)
    assert view.dtype == ml_dtypes.bfloat16 and view.ctypes.data == buf.unsafe_pointer()
    np.testing.assert_array_equal(view.astype(np.float32), values.astype(np.float32))


@needs_numpy_2
@pytest.mark.needs_host_buffers
def test_copy_false_keeps_the_memory_past_delete(client: pjrt_py.Client) -> None:
    buf = client.buffer(X)
    view = np.asarray(buf, copy=False)
    buf.delete()
    with pytest.raises(ValueError):
        buf.to_numpy()
    for _ in range(3):  # other work that might reuse freed memory
        client.buffer(np.full((3, 4), -1, np.float32)).block_until_ready()
    np.testing.assert_array_equal(view, X)
    del view
    gc.collect()


@needs_numpy_2
@pytest.mark.needs_host_buffers
def test_copy_false_waits_for_a_result_still_computing(client: pjrt_py.Client) -> None:
    running = slow_work(client, 0.2)()
    expected = running.to_numpy()
    again = slow_work(client, 0.2)()
    assert not again.is_ready()
    view = np.asarray(again.buffer(), copy=False)
    np.testing.assert_array_equal(view, expected)


@needs_numpy_2
@pytest.mark.needs_host_buffers
def test_copy_false_views_a_column_major_output_with_its_strides(
    client: pjrt_py.Client,
) -> None:
    out = client.compile(COLUMN_MAJOR_OUT).execute(X)
    view = np.asarray(out, copy=False)
    np.testing.assert_array_equal(view, X)
    assert view.flags.f_contiguous and not view.flags.c_contiguous


@needs_numpy_2
def test_copy_false_with_another_dtype_needs_a_copy_and_says_so(
    client: pjrt_py.Client,
) -> None:
    buf = client.buffer(X)
    with pytest.raises(ValueError, match="float32 buffer cannot be viewed as int32"):
        np.asarray(buf, dtype=np.int32, copy=False)
    with pytest.raises(TypeError):
        np.asarray(buf, dtype="not a dtype", copy=False)


@needs_numpy_2
def test_copy_false_of_memory_the_host_cannot_read_is_a_value_error(
    client: pjrt_py.Client,
) -> None:
    from pjrt_py.interop import dlpack  # noqa: PLC0415

    buf = client.buffer(X)
    if dlpack.dlpack_device(buf)[0] in dlpack.HOST_DEVICES:
        pytest.skip("needs a device whose memory the host cannot read in place")
    with pytest.raises(ValueError, match="cannot be viewed without a copy"):
        np.asarray(buf, copy=False)
    np.testing.assert_array_equal(np.asarray(buf), X)  # the copy is still there


def test_copy_false_of_a_deleted_buffer_is_a_value_error(client: pjrt_py.Client) -> None:
    buf = client.buffer(X)
    buf.delete()
    with pytest.raises(ValueError):
        buf.__array__(copy=False)
    with pytest.raises(ValueError):
        np.asarray(buf)


def test_a_promise_converts_after_its_work(client: pjrt_py.Client) -> None:
    promise = slow_work(client, 0.2)()
    expected = promise.to_numpy()
    again = slow_work(client, 0.2)()
    assert not again.is_ready()
    out = np.asarray(again)
    np.testing.assert_array_equal(out, expected)
    assert out.flags.writeable  # a copy, as for a Buffer
    np.testing.assert_array_equal(np.asarray(client.buffer_async(X)), X)
    np.testing.assert_array_equal(
        np.asarray(client.buffer_async(X), dtype=np.int64), X.astype(np.int64)
    )


def test_a_promise_of_several_outputs_is_not_one_array(client: pjrt_py.Client) -> None:
    promise = client.compile(TWO_OUTPUTS).execute_async(np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"holds 2 buffers.*np.asarray\(promise\[i\]\)"):
        np.asarray(promise)
    np.testing.assert_array_equal(np.asarray(promise[1]), np.full(4, 2, np.float32))
    np.testing.assert_array_equal(np.asarray(promise[0]), np.ones(4, np.float32))


def test_a_promise_of_no_outputs_is_not_an_array(client: pjrt_py.Client) -> None:
    promise = client.compile(NO_OUTPUTS).execute_async(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="no outputs"):
        np.asarray(promise)


def test_a_failed_promise_raises_its_error(client: pjrt_py.Client) -> None:
    from test_execute import DONATING  # noqa: PLC0415

    exe = client.compile(DONATING)
    a = client.buffer(np.ones(8, np.float32))
    # As in test_promise: the native primitive alone leaves `a` holding a handle
    # PJRT invalidated, so its readiness event carries PJRT's error.
    (out,) = exe._run([[a]], [])
    out.value().delete()
    with pytest.raises(pjrt_py.InvalidArgumentError):
        np.asarray(pjrt_py.BufferPromise((a,)))


@needs_numpy_2
def test_an_array_promise_gives_its_own_array(client: pjrt_py.Client) -> None:
    promise = client.buffer(X).to_numpy_async()
    value = promise.value()
    assert np.asarray(promise) is value
    assert np.asarray(promise, copy=False) is value
    fresh = np.asarray(promise, copy=True)
    assert fresh is not value and not np.shares_memory(fresh, value)
    np.testing.assert_array_equal(fresh, X)
    with pytest.raises(ValueError):
        np.asarray(promise, dtype=np.int32, copy=False)


def test_jax_converts_a_promise(client: pjrt_py.Client) -> None:
    jnp = pytest.importorskip("jax.numpy")
    promise = client.buffer_async(X)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(promise)), X)


@pytest.mark.needs_torch
def test_a_promise_is_a_dlpack_producer_without_a_host_wait(client: pjrt_py.Client) -> None:
    import torch  # noqa: PLC0415

    promise = slow_work(client, 0.2)()
    expected = slow_work(client, 0.2)().to_numpy()
    assert promise.__dlpack_device__() == promise.buffer().__dlpack_device__()
    tensor = torch.from_dlpack(promise)  # ordered after the work, as for a Buffer
    np.testing.assert_array_equal(tensor.numpy(), expected)
    several = client.compile(TWO_OUTPUTS).execute_async(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="holds 2 buffers"):
        several.__dlpack__()


def test_a_dtype_with_metadata_is_not_every_later_buffers(client: pjrt_py.Client) -> None:
    # Buffers share interned (shape, dtype) metadata, and numpy's dtype
    # equality ignores metadata: the first such dtype became every later
    # float32[7] buffer's, results and to_numpy() copies included.
    tagged = np.dtype(np.float32, metadata={"unit": "m"})
    client.buffer(np.zeros(7, tagged))
    plain = client.buffer(np.zeros(7, np.float32))
    assert plain.dtype.metadata is None
    assert plain.to_numpy().dtype.metadata is None
    assert client.buffer(np.zeros(2, np.uint64)).to_numpy().dtype.char == np.dtype(np.uint64).char
