"""DLPack both ways with numpy, jax and torch, on the real CPU plugin.

Zero-copy is proven by pointer equality; values are cross-checked against
numpy (and jit results against jax itself). Whatever could kill the process
(consumers released at exit, after fork, on other threads) runs in a
subprocess with a timeout.
"""

from __future__ import annotations

import gc
import sys
import threading

import ml_dtypes
import numpy as np
import pytest
from conftest import ADD_F32_8, matmul_chain, run_python

import pjrt_py
from pjrt_py.interop import foreign as dlpack
from pjrt_py.runtime.dtypes import PACKED

try:  # the torch extra; tests using it are marked needs_torch
    import torch
except ImportError:
    torch = None
jax = pytest.importorskip("jax", reason="jax (in the test extra) is not installed")
jnp = jax.numpy

# numpy, torch (CPU) and jax (CPU) read a buffer in place, and pjrt_py views
# their arrays in place, only where the plugin's buffers are host memory.
pytestmark = pytest.mark.needs_host_buffers

DONATE_X = """
func.func @main(%x: tensor<8xf32> {tf.aliasing_output = 0 : i32},
                %y: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


def pointer(x: object) -> int:
    """The data address of a numpy array, torch tensor or jax array."""
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data)
    if torch is not None and isinstance(x, torch.Tensor):
        return int(x.data_ptr())
    return int(x.unsafe_buffer_pointer())  # type: ignore[attr-defined]


def sample(dtype: np.dtype, n: int = 16) -> np.ndarray:
    rng = np.random.default_rng(7)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    return rng.integers(0, 100, n).astype(dtype)


def as_bits(x: object) -> np.ndarray:
    """Raw bytes of a consumer's array, for exact comparisons of any dtype."""
    if torch is not None and isinstance(x, torch.Tensor):
        return x.contiguous().view(torch.uint8).numpy().copy()
    if isinstance(x, np.ndarray):
        return x.view(np.uint8).copy()
    return np.asarray(x).view(np.uint8).copy()


# ---- export ----------------------------------------------------------------------

CONSUMERS = {
    "numpy": np.from_dlpack,
    "torch": lambda b: torch.from_dlpack(b),
    "jax": jnp.from_dlpack,
    "to_jax": pjrt_py.to_jax,
    "to_torch": pjrt_py.to_torch,
}
CONSUMER_PARAMS = [
    pytest.param(c, marks=pytest.mark.needs_torch) if "torch" in c else c for c in sorted(CONSUMERS)
]


@pytest.mark.parametrize("consumer", CONSUMER_PARAMS)
def test_consumers_share_the_buffers_memory(client: pjrt_py.Client, consumer: str) -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    buf = client.buffer(x)
    y = CONSUMERS[consumer](buf)
    assert pointer(y) == buf.unsafe_pointer()
    np.testing.assert_array_equal(np.asarray(y), x)
    assert tuple(y.shape) == (2, 3, 4)


@pytest.mark.parametrize(
    "consumer", ["to_jax", pytest.param("to_torch", marks=pytest.mark.needs_torch)]
)
def test_to_jax_and_to_torch_take_only_buffers(consumer: str) -> None:
    # They used to fail inside with AttributeError ('ndarray' has no 'client').
    for other in (np.ones(3, np.float32), [1.0, 2.0], None):
        with pytest.raises(TypeError, match=f"{consumer} takes a pjrt_py Buffer"):
            CONSUMERS[consumer](other)


def test_dlpack_device_is_the_cpu(client: pjrt_py.Client) -> None:
    for device in client.addressable_devices:
        assert client.buffer(np.ones(2), device).__dlpack_device__() == (1, 0)


def test_legacy_and_versioned_capsules(client: pjrt_py.Client) -> None:
    buf = client.buffer(np.ones(4, np.float32))
    assert "dltensor" in repr(buf.__dlpack__())
    assert "dltensor_versioned" in repr(buf.__dlpack__(max_version=(1, 0)))
    assert "dltensor_versioned" not in repr(buf.__dlpack__(max_version=(0, 8)))
    assert buf._exports == 0  # unconsumed capsules gave their references back


def test_a_versioned_view_is_read_only(client: pjrt_py.Client) -> None:
    buf = client.buffer(np.ones(4, np.float32))
    view = np.from_dlpack(buf)  # numpy asks for a versioned tensor
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 5
    np.testing.assert_array_equal(buf.to_numpy(), 1)


@pytest.mark.needs_torch
def test_torch_ignores_the_read_only_flag(client: pjrt_py.Client) -> None:
    # The documented hazard (docs/interop.md): a consumer can write into a buffer.
    buf = client.buffer(np.zeros(4, np.float32))
    view = torch.from_dlpack(buf)
    view[0] = 5
    assert buf.to_numpy()[0] == 5
    private = torch.from_dlpack(buf.__dlpack__(copy=True))  # the way out (docs/interop.md)
    private[1] = 7
    assert buf.to_numpy()[1] == 0


def test_copy_true_lends_fresh_memory(client: pjrt_py.Client) -> None:
    buf = client.buffer(np.arange(8, dtype=np.int32))
    y = np.from_dlpack(buf, copy=True)
    assert pointer(y) != buf.unsafe_pointer()
    np.testing.assert_array_equal(y, np.arange(8))
    z = np.from_dlpack(buf, copy=False)
    assert pointer(z) == buf.unsafe_pointer()


def test_protocol_arguments_are_checked(client: pjrt_py.Client) -> None:
    buf = client.buffer(np.ones(2, np.float32))
    with pytest.raises(BufferError, match="stream must be None"):
        buf.__dlpack__(stream=1)
    assert "dltensor" in repr(buf.__dlpack__(stream=-1))
    with pytest.raises(TypeError, match="max_version"):
        buf.__dlpack__(max_version="1.0")
    with pytest.raises(TypeError, match="copy must be"):
        buf.__dlpack__(copy="yes")
    with pytest.raises(BufferError, match="cannot export"):
        buf.__dlpack__(dl_device=(2, 0))
    assert "dltensor" in repr(buf.__dlpack__(dl_device=(1, 0)))
    with pytest.raises(TypeError):
        buf.__dlpack__(1)  # keyword-only, as the array API says
    assert buf._exports == 0


@pytest.mark.needs_torch
def test_export_waits_for_pending_work(client: pjrt_py.Client) -> None:
    exe = client.compile(matmul_chain(600, 6))
    x = np.random.default_rng(0).standard_normal((600, 600)).astype(np.float32) / 30
    expected = x
    for _ in range(6):
        expected = np.tanh(expected @ expected)
    out = exe.execute_async(x).buffer()
    view = torch.from_dlpack(out)  # at once: the work may still be running
    np.testing.assert_allclose(view.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_float8_needs_dlpack_1_1(client: pjrt_py.Client) -> None:
    buf = client.buffer(np.ones(4, ml_dtypes.float8_e4m3fn))
    with pytest.raises(TypeError, match="float8_e4m3fn.*DLPack 1.0"):
        buf.__dlpack__(max_version=(1, 0))
    assert "versioned" in repr(buf.__dlpack__(max_version=(1, 1)))


# What each consumer takes: every dtype both sides support round-trips
# bit-exactly; numpy has no DLPack codes for ml_dtypes' types, and torch 2.13
# lacks float8_e4m3b11fnuz, float8_e4m3 and float8_e3m4.
NUMPY_LACKS = {"bfloat16"} | {str(d) for d in pjrt_py.supported_dtypes if "float8" in str(d)}
TORCH_LACKS = {"float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4"}


@pytest.mark.needs_torch
@pytest.mark.parametrize(  # packed sub-byte types have no DLPack codes (tests/test_subbyte.py)
    "dtype", [d for d in pjrt_py.supported_dtypes if d not in PACKED], ids=str
)
def test_every_dtype_round_trips_where_the_consumer_has_it(
    client: pjrt_py.Client, dtype: np.dtype
) -> None:
    x = sample(dtype)
    buf = client.buffer(x)
    name = str(dtype)
    consumers = [("numpy", NUMPY_LACKS), ("to_torch", TORCH_LACKS), ("to_jax", set())]
    for consumer, lacks in [c for c in consumers if torch is not None or c[0] != "to_torch"]:
        if name in lacks:
            error = RuntimeError if consumer == "numpy" else TypeError
            with pytest.raises(error):
                CONSUMERS[consumer](buf)
            if consumer == "to_torch":
                with pytest.raises(TypeError, match=f"torch cannot take a {name} buffer"):
                    pjrt_py.to_torch(buf)
            continue
        y = CONSUMERS[consumer](buf)
        if consumer == "to_jax" and dtype.itemsize == 8 * (2 if dtype.kind == "c" else 1):
            # jax with x64 off narrows 64-bit types, as jax.numpy.from_dlpack does: a copy
            narrow = jax.dtypes.canonicalize_dtype(dtype)
            assert y.dtype == narrow != dtype
            np.testing.assert_array_equal(np.asarray(y), x.astype(narrow))
            continue
        assert pointer(y) == buf.unsafe_pointer(), consumer
        assert as_bits(y).tobytes() == x.tobytes(), consumer
        # ... and back: the consumer's array into pjrt_py
        if consumer != "numpy" or name not in NUMPY_LACKS:
            back = client.from_dlpack(y)
            assert back.dtype == dtype
            assert back.to_numpy().tobytes() == x.tobytes()
    # numpy arrays of ml_dtypes' types come in without numpy's DLPack export
    aligned = pjrt_py.aligned_empty(x.shape, dtype)
    aligned[...] = x
    back = client.from_dlpack(aligned)
    assert back.unsafe_pointer() == aligned.ctypes.data
    assert back.to_numpy().tobytes() == x.tobytes()


# ---- lifetimes of exports --------------------------------------------------------


@pytest.mark.needs_torch
def test_delete_keeps_memory_a_consumer_still_views(client: pjrt_py.Client) -> None:
    x = np.arange(1 << 16, dtype=np.float32)
    buf = client.buffer(x)
    view = torch.from_dlpack(buf)
    assert buf._exports == 1
    buf.delete()
    assert buf.is_deleted
    with pytest.raises(ValueError, match="deleted"):
        buf.to_numpy()
    assert buf._handle != 0  # the PJRT buffer waits for the consumer
    churn = [client.buffer(np.full(1 << 16, -1, np.float32)) for _ in range(20)]
    np.testing.assert_array_equal(view.numpy(), x)
    del view, churn
    gc.collect()
    assert buf._exports == 0 and buf._handle == 0  # freed with the last view
    buf.delete()  # still idempotent


def test_a_viewed_buffer_is_not_donated(client: pjrt_py.Client) -> None:
    exe = client.compile(DONATE_X)
    x = client.buffer(np.ones(8, np.float32))
    view = np.from_dlpack(x)
    out = exe.execute(x, np.full(8, 2, np.float32))
    np.testing.assert_array_equal(out.to_numpy(), 3)
    assert not x.is_deleted  # not donated: the program copied
    np.testing.assert_array_equal(view, 1)
    del view
    exe.execute(x, np.full(8, 2, np.float32))
    assert x.is_deleted  # nobody views it any more: donated as asked


@pytest.mark.needs_torch
def test_consumers_released_on_other_threads(client: pjrt_py.Client) -> None:
    bufs = [client.buffer(np.full(256, i, np.float32)) for i in range(16)]
    views = [torch.from_dlpack(b) for b in bufs]
    for b in bufs[::2]:
        b.delete()

    def drop(items: list[object]) -> None:
        items.clear()
        gc.collect()

    threads = [threading.Thread(target=drop, args=(views[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    del views
    gc.collect()
    assert all(b._exports == 0 for b in bufs)
    assert all(b._handle == 0 for b in bufs[::2])
    np.testing.assert_array_equal(bufs[1].to_numpy(), 1)


@pytest.mark.needs_torch
def test_views_outlive_a_closed_client_and_exit_cleanly() -> None:
    result = run_python(
        """
        import gc, threading, numpy as np, torch, pjrt_py
        c = pjrt_py.Client()
        b = c.buffer(np.arange(1000, dtype=np.float32))
        t = torch.from_dlpack(b)
        n = np.from_dlpack(c.buffer(np.ones(3)))
        held_at_exit = torch.from_dlpack(c.buffer(np.full(5, 9.0)))
        c.close()
        b.delete()
        assert float(t.sum()) == 499500.0
        threading.Thread(target=lambda: t.__dict__).start()
        del t
        gc.collect()
        print("ok", float(n.sum()))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "ok 3.0" in result.stdout


@pytest.mark.needs_torch
def test_a_forked_child_can_drop_views() -> None:
    result = run_python(
        """
        import os, gc, numpy as np, torch, pjrt_py
        c = pjrt_py.Client()
        t = torch.from_dlpack(c.buffer(np.arange(10, dtype=np.float32)))
        pid = os.fork()
        if pid == 0:
            s = float(t.sum())
            del t
            gc.collect()
            os._exit(0 if s == 45.0 else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), float(t.sum()))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "child 0 45.0" in result.stdout


# ---- import ----------------------------------------------------------------------


def test_aligned_numpy_is_viewed_in_place(client: pjrt_py.Client) -> None:
    x = pjrt_py.aligned_empty((64, 64), np.float32)
    x[...] = 3
    buf = client.from_dlpack(x)
    assert buf.unsafe_pointer() == x.ctypes.data
    assert buf._host_aliased
    np.testing.assert_array_equal(buf.to_numpy(), 3)


@pytest.mark.needs_torch
def test_unaligned_or_strided_input_is_copied_or_refused(client: pjrt_py.Client) -> None:
    base = pjrt_py.aligned_empty(1025, np.float32)
    base[...] = np.arange(1025)
    unaligned = base[1:]
    buf = client.from_dlpack(unaligned)
    assert buf.unsafe_pointer() != unaligned.ctypes.data
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1, 1025))
    with pytest.raises(BufferError, match="64-byte aligned"):
        client.from_dlpack(unaligned, copy=False)
    t = torch.arange(12.0).reshape(3, 4).T  # column-major strides
    buf = client.from_dlpack(t)
    np.testing.assert_array_equal(buf.to_numpy(), t.numpy())
    with pytest.raises(BufferError, match="strides"):
        client.from_dlpack(t, copy=False)
    empty = client.from_dlpack(torch.zeros(0, 3))
    assert empty.shape == (0, 3)


@pytest.mark.needs_torch
def test_copy_true_copies(client: pjrt_py.Client) -> None:
    t = torch.arange(4096, dtype=torch.float32)
    assert client.from_dlpack(t).unsafe_pointer() == t.data_ptr()
    copied = client.from_dlpack(t, copy=True)
    assert copied.unsafe_pointer() != t.data_ptr()
    t[0] = 100
    assert copied.to_numpy()[0] == 0


@pytest.mark.parametrize(
    "producer",
    [
        pytest.param("torch", marks=pytest.mark.needs_torch),
        "jax",
        pytest.param("capsule", marks=pytest.mark.needs_torch),  # a torch tensor's capsule
        "buffer",
    ],
)
def test_producers_are_viewed_without_copies(client: pjrt_py.Client, producer: str) -> None:
    values = np.arange(4096, dtype=np.float32)
    other = pjrt_py.Client()  # a Buffer of another client comes through DLPack too
    x = {
        "torch": lambda: torch.from_numpy(values).clone(),  # torch's memory: 64-byte aligned
        "jax": lambda: jnp.asarray(values),
        "capsule": lambda: torch.from_numpy(values).clone(),
        "buffer": lambda: other.buffer(values),
    }[producer]()
    address = x.unsafe_pointer() if producer == "buffer" else pointer(x)
    buf = client.from_dlpack(x.__dlpack__() if producer == "capsule" else x)
    assert buf.unsafe_pointer() == address
    np.testing.assert_array_equal(buf.to_numpy(), values)
    assert pjrt_py.from_dlpack(x if producer != "capsule" else x).to_numpy()[5] == 5


def test_the_producer_stays_alive_until_pjrt_is_done(client: pjrt_py.Client) -> None:
    x = pjrt_py.aligned_empty(4096, np.float32)
    x[...] = 1
    before = sys.getrefcount(x)
    buf = client.from_dlpack(x)
    assert sys.getrefcount(x) > before  # numpy's capsule holds the array
    del buf
    gc.collect()
    assert sys.getrefcount(x) == before


@pytest.mark.needs_torch
def test_a_view_read_by_running_work_survives_its_deletion(client: pjrt_py.Client) -> None:
    exe = client.compile(matmul_chain(600, 6))
    values = np.random.default_rng(1).standard_normal((600, 600)).astype(np.float32) / 30
    t = torch.from_numpy(values).clone()
    view = client.from_dlpack(t)
    promise = exe.execute_async(view)
    view.delete()
    del t, view
    gc.collect()
    expected = values
    for _ in range(6):
        expected = np.tanh(expected @ expected)
    np.testing.assert_allclose(promise.value().to_numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.needs_torch
def test_producer_mutation_shows_through_a_view(client: pjrt_py.Client) -> None:
    # The documented hazard (docs/interop.md): the producer still owns the memory.
    t = torch.zeros(4096)
    buf = client.from_dlpack(t)
    t[7] = 5
    assert buf.to_numpy()[7] == 5


@pytest.mark.needs_torch
def test_bad_producers_get_clear_errors(client: pjrt_py.Client) -> None:
    with pytest.raises(TypeError, match="not a DLPack producer"):
        client.from_dlpack([1, 2, 3])
    capsule = torch.ones(3).__dlpack__()
    client.from_dlpack(capsule)
    with pytest.raises(TypeError, match="unconsumed DLPack capsule"):
        client.from_dlpack(capsule)
    with pytest.warns(UserWarning, match="ComplexHalf"):
        chalf = torch.ones(4, dtype=torch.complex32)
    with pytest.raises(TypeError, match="complex32"):
        client.from_dlpack(chalf)
    with pytest.raises(BufferError, match="require gradient"):
        client.from_dlpack(torch.ones(4, requires_grad=True))
    with pytest.raises(TypeError, match="copy must be"):
        client.from_dlpack(torch.ones(4), copy=1)
    closed = pjrt_py.Client()
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        closed.from_dlpack(torch.ones(4))


# ---- foreign arrays as arguments ---------------------------------------------------


@pytest.mark.needs_torch
def test_execute_takes_jax_and_torch_arrays(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_F32_8)
    x, t = jnp.arange(8, dtype=jnp.float32), torch.full((8,), 2.0)
    out = exe.execute(x, t)
    np.testing.assert_array_equal(out.to_numpy(), np.arange(8) + 2)
    promise = exe.execute_async(t, np.ones(8, np.float32))
    np.testing.assert_array_equal(promise.value().to_numpy(), 3)
    with pytest.raises(TypeError, match="float64"):
        exe.execute(torch.ones(8, dtype=torch.float64), t)
    with pytest.raises(TypeError, match=r"float32\[9\]"):
        exe.execute(x, torch.ones(9))
    with pytest.raises(TypeError, match="argument 1"):
        exe.execute(x, torch.ones(8, dtype=torch.complex32))


@pytest.mark.needs_torch
@pytest.mark.needs_devices(2)
def test_execute_sharded_takes_foreign_arrays(client: pjrt_py.Client) -> None:
    devices = client.addressable_devices[:2]
    exe = client.compile(ADD_F32_8, num_replicas=2, device_assignment=[[d] for d in devices])
    rows = [[torch.full((8,), float(i)), jnp.ones(8, jnp.float32)] for i in range(2)]
    outs = exe.execute_sharded(rows)
    for i, row in enumerate(outs):
        np.testing.assert_array_equal(row[0].to_numpy(), i + 1)


@pytest.mark.needs_torch
def test_jit_takes_and_returns_other_frameworks_arrays(client: pjrt_py.Client) -> None:
    def f(x, y):  # type: ignore[no-untyped-def]
        return jnp.sin(x) * y + 1

    x = jnp.linspace(0, 1, 32, dtype=jnp.float32)
    y = torch.linspace(1, 2, 32)
    expected = np.asarray(jax.jit(f)(x, jnp.asarray(y.numpy())))
    for out, kind in (("jax", jax.Array), ("torch", torch.Tensor), ("numpy", np.ndarray)):
        result = pjrt_py.jit(f, client=client, out=out)(x, y)
        assert isinstance(result, kind)
        np.testing.assert_allclose(np.asarray(result), expected, rtol=1e-6)
    assert isinstance(pjrt_py.jit(f, client=client)(x, y), pjrt_py.Buffer)
    as_list = pjrt_py.jit(lambda a: (a, a + 1), client=client, out=lambda b: b.to_numpy().tolist())
    assert as_list(np.zeros(2, np.float32)) == ([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="out must be"):
        pjrt_py.jit(f, out="tensorflow")


@pytest.mark.needs_torch
def test_jit_narrows_64_bit_foreign_arrays_like_jax(client: pjrt_py.Client) -> None:
    f = pjrt_py.jit(lambda x: x * 2, client=client, out="torch")
    result = f(torch.arange(4, dtype=torch.float64))
    assert result.dtype == torch.float32  # jax with x64 off: float32, as jax.jit gives
    assert jax.jit(lambda x: x * 2)(np.arange(4.0)).dtype == np.float32
    np.testing.assert_array_equal(result.numpy(), [0, 2, 4, 6])


@pytest.mark.needs_torch
def test_is_foreign_leaves_numpy_and_buffers_alone(client: pjrt_py.Client) -> None:
    assert dlpack.is_foreign(torch.ones(1)) and dlpack.is_foreign(jnp.ones(1))
    assert not dlpack.is_foreign(np.ones(1)) and not dlpack.is_foreign(client.buffer(1.0))


def test_a_pending_jax_result_is_read_when_ready(client: pjrt_py.Client) -> None:
    @jax.jit
    def chain(x):  # type: ignore[no-untyped-def]
        for _ in range(6):
            x = jnp.tanh(x @ x)
        return x

    x = jnp.asarray(np.random.default_rng(2).standard_normal((600, 600)).astype(np.float32) / 30)
    expected = np.asarray(chain(x))
    pending = chain(x)  # jax dispatches asynchronously
    exe = client.compile(ADD_F32_8.replace("8xf32", "600x600xf32"))
    out = exe.execute(pending, pending)  # jax's __dlpack__ waits for its result
    np.testing.assert_array_equal(out.to_numpy(), expected * 2)


# ---- foreign arguments on the native dispatch path -----------------------------------


@pytest.mark.needs_torch
@pytest.mark.needs_devices(3)
def test_aligned_foreign_arguments_take_the_native_path(
    client: pjrt_py.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = client.addressable_devices[2]
    exe = client.compile(ADD_F32_8, device=device)
    x, t = jnp.arange(8, dtype=jnp.float32), torch.full((8,), 2.0)
    b = client.buffer(np.ones(8, np.float32), device)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("took the Python path")

    monkeypatch.setattr(pjrt_py.Executable, "_execute_async_slow", refuse)
    out = exe.execute_async(x, t).value()
    np.testing.assert_array_equal(out.to_numpy(), np.arange(8) + 2)
    assert out.device == device
    np.testing.assert_array_equal(exe.execute_async(b, t).value().to_numpy(), 3)
    with pytest.raises(AssertionError, match="Python path"):
        exe.execute_async(t, torch.ones(9))  # a wrong shape goes to Python, which explains


class Saboteur:
    """A DLPack producer whose __dlpack__ runs arbitrary code first."""

    def __init__(self, action) -> None:  # type: ignore[no-untyped-def]
        self.action = action
        self.tensor = torch.ones(8)

    def __dlpack__(self, **kwargs: object) -> object:
        self.action()
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


@pytest.mark.needs_torch
def test_a_producer_that_deletes_or_closes_mid_call_gets_errors_not_crashes() -> None:
    client = pjrt_py.Client()
    exe = client.compile(ADD_F32_8)
    victim = client.buffer(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="deleted"):
        exe.execute_async(victim, Saboteur(victim.delete))
    with pytest.raises(ValueError, match="deleted"):
        exe.execute_async(torch.ones(8), Saboteur(exe.delete))
    other = client.compile(ADD_F32_8)
    with pytest.raises(ValueError, match="closed"):
        other.execute_async(torch.ones(8), Saboteur(client.close))


# ---- layouts other than row-major ------------------------------------------------------

COLUMN_MAJOR_OUT = """
func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x8xf32> {mhlo.layout_mode = "{0,1}"}) {
  %0 = stablehlo.add %x, %x : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""


@pytest.mark.needs_torch
def test_a_column_major_buffer_is_lent_with_its_strides(client: pjrt_py.Client) -> None:
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = client.compile(COLUMN_MAJOR_OUT).execute(x)
    assert out._dlpack_layout_ok()  # dense, in another order: lendable with strides
    for consumer in (np.from_dlpack, torch.from_dlpack, pjrt_py.to_jax):
        view = consumer(out)
        assert pointer(view) == out.unsafe_pointer(), consumer
        np.testing.assert_array_equal(np.asarray(view), 2 * x)
    assert np.from_dlpack(out).strides == (4, 16)  # column-major, in bytes
    # to_numpy reads it right on every build (xla-cpu-pjrt 0.81's own copy
    # returns the column-major bytes as they lie; pjrt_py copies through strides)
    np.testing.assert_array_equal(out.to_numpy(), 2 * x)
    np.testing.assert_array_equal(out.to_numpy_async().value(), 2 * x)


class Lender:
    """A DLPack producer lending an aligned numpy array (viewed through
    CreateViewOfDeviceBuffer, unlike a numpy array passed as itself)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: object) -> object:
        return self.array.__dlpack__(**kwargs)


def test_a_view_released_on_a_plugin_thread_frees_the_producer(client: pjrt_py.Client) -> None:
    import time

    exe = client.compile(matmul_chain(600, 6))
    values = pjrt_py.aligned_empty((600, 600), np.float32)
    values[...] = np.random.default_rng(4).standard_normal((600, 600)) / 30
    before = sys.getrefcount(values)
    promise = exe.execute_async(Lender(values))  # the view goes at once; PJRT still reads it
    assert sys.getrefcount(values) > before
    expected = values
    for _ in range(6):
        expected = np.tanh(expected @ expected)
    np.testing.assert_allclose(promise.value().to_numpy(), expected, rtol=1e-4, atol=1e-5)
    # PJRT lets go when the work ends, on its own thread; the interpreter
    # drops the producer's tensor at its next chance
    deadline = time.monotonic() + 10
    while sys.getrefcount(values) != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sys.getrefcount(values) == before


def test_export_after_close_raises(client: pjrt_py.Client) -> None:
    other = pjrt_py.Client()
    buf = other.buffer(np.ones(4, np.float32))
    other.close()
    with pytest.raises(ValueError, match="closed"):
        np.from_dlpack(buf)
    with pytest.raises(ValueError, match="closed"):
        client.from_dlpack(buf)


@pytest.mark.needs_torch
def test_threads_racing_exports_imports_and_deletes_do_not_crash() -> None:
    result = run_python(
        """
        import threading, numpy as np, torch, pjrt_py
        c = pjrt_py.Client()
        exe = c.compile('''func.func @main(%x: tensor<1024xf32>) -> tensor<1024xf32> {
          %0 = stablehlo.add %x, %x : tensor<1024xf32>
          return %0 : tensor<1024xf32>
        }''')
        bufs = [c.buffer(np.full(1024, i, np.float32)) for i in range(64)]
        errors = []
        def worker(seed):
            rng = np.random.default_rng(seed)
            for _ in range(400):
                b = bufs[rng.integers(64)]
                try:
                    kind = rng.integers(4)
                    if kind == 0:
                        t = torch.from_dlpack(b); float(t.sum())
                    elif kind == 1:
                        exe.execute(torch.from_dlpack(b))
                    elif kind == 2:
                        c.from_dlpack(np.from_dlpack(b)).to_numpy()
                    else:
                        b.delete()
                except (ValueError, BufferError) as e:
                    if "deleted" not in str(e):
                        errors.append(repr(e))
        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("errors", errors[:3], len(errors))
        """,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "errors [] 0" in result.stdout, result.stdout
