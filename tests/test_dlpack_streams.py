"""DLPack's stream protocol: which stream each side names, and GPU exchanges.

On CPU plugins (no stream extension) these check the protocol's rules and
what pjrt_py asks of producers; the tests marked ``gpu`` run the exchanges
with torch and jax on a GPU and skip, saying why, where there is none.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pjrt_py
from pjrt_py.interop import dlpack
from pjrt_py.interop.foreign import capsule_device

F32_8 = np.arange(16, dtype=np.float32)[::2].copy()


class RecordingProducer:
    """A DLPack producer that remembers what each ``__dlpack__`` call asked for."""

    def __init__(self, array: np.ndarray, device: Any = (1, 0)) -> None:
        self.array = array
        self.device = device
        self.calls: list[dict[str, Any]] = []

    def __dlpack_device__(self) -> Any:
        return self.device

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.calls.append(dict(kwargs))  # a copy: the call below must not edit the record
        kwargs.pop("stream", None)
        return self.array.__dlpack__(**kwargs)


def aligned(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` at a 64-byte aligned address (what a CPU view needs)."""
    raw = np.empty(array.nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def test_a_host_producer_is_asked_for_no_stream(client: pjrt_py.Client) -> None:
    producer = RecordingProducer(aligned(F32_8))
    buf = client.from_dlpack(producer)
    np.testing.assert_array_equal(buf.to_numpy(), F32_8)
    assert producer.calls == [{"max_version": dlpack.VERSION}]


def test_a_host_producer_as_an_argument_is_asked_for_no_stream(
    client: pjrt_py.Client, add_exe: pjrt_py.Executable
) -> None:
    producer = RecordingProducer(F32_8.copy())
    out = add_exe.execute(producer, np.ones(8, np.float32))
    np.testing.assert_array_equal(out.to_numpy(), F32_8 + 1)
    # (The native fast path may ask once before the Python path does.)
    assert producer.calls and all("stream" not in call for call in producer.calls)


def test_producer_device_must_be_a_pair(client: pjrt_py.Client) -> None:
    with pytest.raises(BufferError, match="__dlpack_device__"):
        client.from_dlpack(RecordingProducer(F32_8.copy(), device="cpu"))
    with pytest.raises(BufferError, match="__dlpack_device__"):
        client.from_dlpack(RecordingProducer(F32_8.copy(), device=(1, 0, 0)))


@pytest.mark.parametrize(
    ("kind", "stream", "expected"),
    [
        (dlpack.CUDA, None, 1),  # the legacy default stream
        (dlpack.ROCM, None, 0),  # ROCm's default stream
        (dlpack.CUDA, -1, -1),  # no synchronisation
        (dlpack.CUDA, 2, 2),  # the per-thread default stream
        (dlpack.CUDA, 0x7F00DEAD, 0x7F00DEAD),  # a consumer's stream handle
        (dlpack.ROCM, 0, 0),
    ],
)
def test_consumer_stream_follows_the_array_api(kind: int, stream: Any, expected: int) -> None:
    assert dlpack.consumer_stream(kind, stream) == expected


def test_consumer_stream_zero_is_ambiguous_on_cuda() -> None:
    with pytest.raises(BufferError, match="ambiguous"):
        dlpack.consumer_stream(dlpack.CUDA, 0)
    with pytest.raises(BufferError, match="stream"):
        dlpack.consumer_stream(dlpack.CUDA, -2)


@pytest.mark.parametrize("stream", [1, 2])
def test_cudas_default_stream_numbers_are_refused_on_rocm(stream: int) -> None:
    with pytest.raises(BufferError, match="ROCm has none"):
        dlpack.consumer_stream(dlpack.ROCM, stream)
    assert dlpack.consumer_stream(dlpack.ROCM, 0) == 0
    assert dlpack.consumer_stream(dlpack.CUDA, stream) == stream


@pytest.mark.needs_host_buffers  # a device buffer's export takes a stream
def test_host_buffer_export_refuses_a_stream(client: pjrt_py.Client) -> None:
    buf = client.buffer(F32_8)
    with pytest.raises(BufferError, match="stream must be None"):
        buf.__dlpack__(stream=5)
    with pytest.raises(TypeError, match="stream"):
        buf.__dlpack__(stream=1.5)
    np.testing.assert_array_equal(np.from_dlpack(buf), F32_8)  # stream=None is fine


def test_cpu_plugins_have_no_stream_to_offer(client: pjrt_py.Client) -> None:
    # No CPU build carries the stream extension: imports and exports keep the
    # host's ordering there (block_until_ready before lending).
    device = client.addressable_devices[0]
    assert client._ready_stream(device._addr) is None
    buf = client.buffer(F32_8)
    assert buf._wait_on_stream(1) is False


def test_stream_queries_on_closed_or_deleted_objects_raise() -> None:
    c = pjrt_py.Client()
    device = c.addressable_devices[0]
    buf = c.buffer(F32_8)
    buf.delete()
    with pytest.raises(ValueError, match="deleted"):
        buf._wait_on_stream(1)
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c._ready_stream(device._addr)


def test_device_tensor_without_its_plugin_names_the_platform(client: pjrt_py.Client) -> None:
    # A tensor that says it is in CUDA memory goes to a CUDA client, not to
    # the default (CPU) one; with no CUDA plugin that is a clear error.
    if any(p.name == "cuda" for p in pjrt_py.plugins()):
        pytest.skip(
            "a CUDA plugin is installed, so this fake CUDA tensor would go to it; "
            "test_gpu_plugin_no_device.py checks that route where its GPU is missing"
        )
    producer = RecordingProducer(F32_8.copy(), device=(dlpack.CUDA, 0))
    with pytest.raises(BufferError, match="cuda PJRT plugin"):
        pjrt_py.from_dlpack(producer)
    assert producer.calls == []  # refused before the producer was asked


def test_a_raw_capsule_goes_where_its_tensor_says(client: pjrt_py.Client) -> None:
    from test_dlpack_hostile import Producer  # noqa: PLC0415

    assert capsule_device(np.ones(4, np.float32).__dlpack__()) == (dlpack.CPU, 0)
    used = np.ones(4, np.float32).__dlpack__()
    pjrt_py.from_dlpack(used)
    assert capsule_device(used) is None  # consumed: not read again
    assert capsule_device(np.ones(4)) is None
    if any(p.name == "cuda" for p in pjrt_py.plugins()):
        pytest.skip(
            "a CUDA plugin is installed, so this fake CUDA tensor would go to it; "
            "test_gpu_plugin_no_device.py checks that route where its GPU is missing"
        )
    # A capsule carries no __dlpack_device__: the device is read inside it, so
    # a CUDA tensor is sent to a CUDA client, not to the default (CPU) one.
    producer = Producer((4,), device=dlpack.CUDA)
    with pytest.raises(BufferError, match="cuda PJRT plugin"):
        pjrt_py.from_dlpack(producer.__dlpack__())


def test_device_tensor_on_a_host_client_is_refused_clearly(
    client: pjrt_py.Client, add_exe: pjrt_py.Executable
) -> None:
    class FakeCuda(RecordingProducer):
        def __dlpack__(self, **kwargs: Any) -> Any:
            self.calls.append(kwargs)
            raise BufferError("this producer's memory is not on the host")

    with pytest.raises(BufferError):
        client.from_dlpack(FakeCuda(F32_8.copy(), device=(dlpack.CUDA, 0)))


# ---- on a GPU ------------------------------------------------------------------


def _gpu() -> tuple[pjrt_py.Client, Any]:
    """A CUDA client and torch with CUDA, or a skip naming what is missing."""
    if not any(p.name == "cuda" for p in pjrt_py.plugins()):
        pytest.skip("needs a PJRT plugin with CUDA devices (none installed)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    return pjrt_py.default_client_for("cuda"), torch


@pytest.mark.gpu
def test_torch_cuda_tensor_imports_as_a_view_on_its_device() -> None:
    client, torch = _gpu()
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    buf = pjrt_py.from_dlpack(t)  # no device: follows the tensor
    assert buf.client.platform_name == "cuda"
    assert buf.device.local_hardware_id == t.device.index
    back = torch.from_dlpack(buf)
    assert back.data_ptr() == t.data_ptr()  # the same memory, both ways
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1 << 20, dtype=np.float32))


@pytest.mark.gpu
def test_import_is_ordered_after_the_producers_pending_work() -> None:
    client, torch = _gpu()
    for _ in range(5):
        a = torch.randn(4096, 4096, device="cuda")
        b = a @ a  # queued on torch's stream, likely still running
        buf = pjrt_py.from_dlpack(b, copy=False)
        got = buf.to_numpy()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(got, b.cpu().numpy())


@pytest.mark.gpu
def test_import_from_another_gpu_than_the_current_waits_for_its_work() -> None:
    # torch orders the consumer's stream after its current device's stream:
    # pjrt_py makes the tensor's device current for __dlpack__ (foreign.py).
    client, torch = _gpu()
    if torch.cuda.device_count() < 2 or len(client.devices) < 2:
        pytest.skip("needs two CUDA devices (the tensor's and another current one)")
    with torch.cuda.device(0):
        for _ in range(5):
            a = torch.randn(4096, 4096, device="cuda:1")
            b = a @ a  # queued on cuda:1's stream, likely still running
            buf = pjrt_py.from_dlpack(b, copy=False)
            got = buf.to_numpy()
            torch.cuda.synchronize(1)
            np.testing.assert_array_equal(got, b.cpu().numpy())


@pytest.mark.gpu
def test_export_orders_the_consumers_stream_not_the_host() -> None:
    client, torch = _gpu()
    n = 4096
    exe = client.compile(
        f"""
        func.func @main(%x: tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32> {{
          %0 = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0],
            precision = [HIGHEST, HIGHEST]
            : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
          return %0 : tensor<{n}x{n}xf32>
        }}"""
    )
    x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    out = exe.execute_async(client.buffer(x)).buffer()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.from_dlpack(out)  # torch passes s: s waits on the device
        total = t.sum()
    s.synchronize()
    # Full float32 (HIGHEST, not the GPU's TF32 default) against float64: a
    # read before the product was written would be far off.
    expected = x.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(t.cpu().numpy(), expected, rtol=1e-4, atol=1e-3)
    assert abs(float(total) - expected.sum()) <= 1e-4 * np.abs(expected).sum()  # torch's sum


@pytest.mark.gpu
def test_either_side_may_be_deleted_first() -> None:
    client, torch = _gpu()
    t = torch.ones(1 << 16, device="cuda")
    buf = pjrt_py.from_dlpack(t)
    del t  # the view keeps torch's memory
    torch.cuda.empty_cache()
    assert float(buf.to_numpy().sum()) == 1 << 16
    src = client.buffer(np.full(1 << 16, 2, np.float32), client.addressable_devices[0])
    view = torch.from_dlpack(src)
    src.delete()  # the export keeps the memory
    assert float(view.sum()) == 2 * (1 << 16)


@pytest.mark.gpu
def test_jax_gpu_arrays_cross_both_ways() -> None:
    _gpu()
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("needs jax with a CUDA backend")
    x = jax.device_put(np.arange(1024, dtype=np.float32), gpu)
    buf = pjrt_py.from_dlpack(x)
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1024, dtype=np.float32))
    y = jax.numpy.from_dlpack(buf)
    np.testing.assert_array_equal(np.asarray(y), np.arange(1024, dtype=np.float32))


@pytest.mark.gpu
def test_jax_gpu_arrays_are_viewed_in_place_and_after_their_computation() -> None:
    client, torch = _gpu()
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("needs jax with a CUDA backend")
    x = jax.device_put(np.arange(1 << 16, dtype=np.float32), gpu)
    buf = pjrt_py.from_dlpack(x, copy=False)
    assert torch.from_dlpack(buf).data_ptr() == x.unsafe_buffer_pointer()  # the same memory
    a = jax.device_put(np.random.default_rng(1).standard_normal((4096, 4096), np.float32), gpu)
    for _ in range(3):
        y = jax.numpy.dot(a, a, precision="highest")  # dispatched, likely still running
        got = pjrt_py.from_dlpack(y, copy=False).to_numpy()
        np.testing.assert_array_equal(got, np.asarray(y))
    del x  # pjrt_py's view keeps jax's memory
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1 << 16, dtype=np.float32))


@pytest.mark.gpu
def test_copy_true_of_a_cuda_tensor_is_a_device_copy_of_its_own() -> None:
    client, torch = _gpu()
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    buf = pjrt_py.from_dlpack(t, copy=True)
    assert buf.client.platform_name == "cuda"
    assert torch.from_dlpack(buf).data_ptr() != t.data_ptr()
    t.add_(1)  # the copy does not see later writes
    del t
    torch.cuda.empty_cache()
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1 << 20, dtype=np.float32))
    for _ in range(20):  # the view is dropped as each copy ends, the producer's first
        u = torch.full((1 << 16,), 3.0, device="cuda")
        copy = client.from_dlpack(u, copy=True)
        del u
        assert float(copy.to_numpy().sum()) == 3.0 * (1 << 16)


@pytest.mark.gpu
def test_a_cuda_tensor_for_another_gpu_is_copied_there_or_refused() -> None:
    client, torch = _gpu()
    if torch.cuda.device_count() < 2 or len(client.devices) < 2:
        pytest.skip("needs two CUDA devices")
    t = torch.arange(1024, dtype=torch.float32, device="cuda:1")
    target = next(d for d in client.devices if d.local_hardware_id == 0)
    with pytest.raises(BufferError, match="copy=False"):
        client.from_dlpack(t, target, copy=False)
    moved = client.from_dlpack(t, target)
    assert moved.device == target
    np.testing.assert_array_equal(moved.to_numpy(), np.arange(1024, dtype=np.float32))


@pytest.mark.gpu
def test_a_view_that_failed_leaves_the_producers_tensor_whole() -> None:
    # XLA's GPU client runs a failed view's on_delete_callback during the call;
    # the tensor's reference was once dropped there and again on the error path.
    client, torch = _gpu()
    t = torch.arange(64, dtype=torch.float32, device="cuda")
    for _ in range(50):
        with pytest.raises(BufferError, match="16-byte aligned"):
            client.from_dlpack(t[1:])  # 4 bytes past an aligned start
    assert float(t.sum().item()) == float(sum(range(64)))


@pytest.mark.gpu
def test_a_misaligned_or_empty_cuda_tensor_is_refused_or_made_before_execution() -> None:
    client, torch = _gpu()
    t = torch.arange(65, dtype=torch.float32, device="cuda")
    with pytest.raises(BufferError, match=r"16-byte aligned.*contiguous\(\).clone\(\)"):
        pjrt_py.from_dlpack(t[1:])
    np.testing.assert_array_equal(
        pjrt_py.from_dlpack(t[1:].clone()).to_numpy(), np.arange(1, 65, dtype=np.float32)
    )
    empty = pjrt_py.from_dlpack(torch.empty((0, 3), device="cuda"))
    assert empty.shape == (0, 3) and empty.client.platform_name == "cuda"


@pytest.mark.gpu
def test_jit_narrows_a_cuda_int64_tensor_on_the_device() -> None:
    # jax narrows int64 to int32 with x64 off; the narrowing once read the
    # tensor's device memory from the host through numpy.
    client, torch = _gpu()
    jax = pytest.importorskip("jax")
    if jax.config.jax_enable_x64:
        pytest.skip("needs jax_enable_x64 off, so that int64 narrows")
    t = torch.arange(1000, dtype=torch.int64, device="cuda")
    out = pjrt_py.jit(lambda x: x * 3, client=client)(t)
    assert out.dtype == np.int32 and out.client is client
    np.testing.assert_array_equal(out.to_numpy(), np.arange(1000, dtype=np.int32) * 3)
