"""pjrt_py.jit takes what jax.jit takes: 64-bit Buffers with x64 off, and
functions used as methods.

Before, a float64 Buffer (what ``client.buffer(np.ones(3))`` makes) failed
every call with x64 off: the program was traced for float32, as jax
narrows, but the Buffer was passed as it was, and the failing program stayed
cached. A jit function written as a method was never bound to its instance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pjrt_py

jax = pytest.importorskip("jax", reason="pjrt_py.jit traces with jax")


@pytest.fixture
def x64() -> Iterator[Callable[[bool], None]]:
    before = jax.config.jax_enable_x64
    yield lambda on: jax.config.update("jax_enable_x64", on)
    jax.config.update("jax_enable_x64", before)


@pytest.mark.parametrize(
    "data",
    [
        np.array([1.5, -2.25, 1e-3]),
        np.array([3, -4, 2**31 - 1], np.int64),
        np.array([1 + 2j, -0.5j], np.complex128),
        np.array([7, 2**32 - 1], np.uint64),
    ],
    ids=lambda a: str(a.dtype),
)
def test_a_64_bit_buffer_is_narrowed_as_jax_narrows(
    client: pjrt_py.Client, x64: Callable[[bool], None], data: np.ndarray
) -> None:
    x64(False)
    fn = pjrt_py.jit(lambda x: x * 2, client=client)
    buf = client.buffer(data)
    assert buf.dtype == data.dtype  # the Buffer itself keeps 64 bits
    expected = np.asarray(jax.jit(lambda x: x * 2)(data))
    for _ in range(2):  # the second call takes the cached program
        out = fn(buf)
        assert out.dtype == expected.dtype
        np.testing.assert_array_equal(out.to_numpy(), expected)
    assert fn.cache_size() == 1
    np.testing.assert_array_equal(buf.to_numpy(), data)  # the argument is untouched


def test_a_64_bit_buffer_promise_is_narrowed(
    client: pjrt_py.Client, x64: Callable[[bool], None]
) -> None:
    x64(False)
    fn = pjrt_py.jit(lambda x: x + 1, client=client)
    promise = client.buffer_async(np.arange(4.0))
    np.testing.assert_array_equal(fn(promise).to_numpy(), np.arange(1.0, 5.0, dtype=np.float32))


def test_with_x64_on_a_64_bit_buffer_keeps_its_type(
    client: pjrt_py.Client, x64: Callable[[bool], None]
) -> None:
    x64(True)
    fn = pjrt_py.jit(lambda x: x / 3, client=client)
    data = np.array([1.0, 2.0])
    out = fn(client.buffer(data))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out.to_numpy(), data / 3)


class _Scaled:
    def __init__(self, k: float) -> None:
        self.k = k

    def __hash__(self) -> int:
        return hash(self.k)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Scaled) and other.k == self.k

    @functools.partial(pjrt_py.jit, static_argnums=0)
    def apply(self, x: Any) -> Any:
        return x * self.k


def test_a_jit_method_is_bound_to_its_instance() -> None:
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(_Scaled(3.0).apply(x).to_numpy(), 3 * x)
    np.testing.assert_array_equal(_Scaled(5.0).apply(x).to_numpy(), 5 * x)
    # Through the class, self is passed as a plain argument, as with jax.jit.
    np.testing.assert_array_equal(_Scaled.apply(_Scaled(2.0), x).to_numpy(), 2 * x)
    assert isinstance(_Scaled.__dict__["apply"], pjrt_py.Jitted)
    assert _Scaled.apply.cache_size() == 3  # one per static instance value


def test_lower_takes_shape_dtype_structs_as_jax_does(client: pjrt_py.Client) -> None:
    def f(x: Any, params: dict[str, Any]) -> Any:
        return x @ params["w"] + params["b"]

    spec = {
        "w": jax.ShapeDtypeStruct((4, 3), np.float32),
        "b": jax.ShapeDtypeStruct((3,), np.float32),
    }
    fn = pjrt_py.jit(f, client=client)
    lowered = fn.lower(jax.ShapeDtypeStruct((2, 4), np.float32), spec)
    assert (
        lowered.as_text()
        == fn.lower(
            np.ones((2, 4), np.float32),
            {"w": np.ones((4, 3), np.float32), "b": np.ones(3, np.float32)},
        ).as_text()
    )
    compiled = lowered.compile()
    x, w, b = (np.arange(8.0).reshape(2, 4), np.ones((4, 3)), np.arange(3.0))
    x, w, b = (a.astype(np.float32) for a in (x, w, b))
    np.testing.assert_allclose(compiled.execute(x, b, w).to_numpy(), x @ w + b)
    assert fn.cache_size() == 0  # lower() neither reads nor fills the cache
    with pytest.raises(TypeError, match="describes an argument for lower"):
        fn(jax.ShapeDtypeStruct((2, 4), np.float32), spec)


def test_narrowing_a_pending_buffer_does_not_wait_for_it(
    client: pjrt_py.Client, x64: Callable[[bool], None]
) -> None:
    from conftest import slow_work

    x64(False)
    widen = client.compile(
        "func.func @main(%x: tensor<256x256xf32>) -> tensor<256x256xf64> {\n"
        "  %y = stablehlo.convert %x : (tensor<256x256xf32>) -> tensor<256x256xf64>\n"
        "  return %y : tensor<256x256xf64>\n}"
    )
    fn = pjrt_py.jit(lambda x: x[0, :4] * 2, client=client)
    fn(client.buffer(np.ones((256, 256))))  # compiled: the next call only dispatches
    work = slow_work(client, 1.0)
    for _ in range(5):  # the CPU plugin now and then runs the work inline
        pending = widen.execute_async(work())
        out = fn(pending)
        if not pending.is_ready():
            break  # the call returned while its input was still computing
    else:
        pytest.fail("each call waited for its 64-bit input to be computed")
    assert out.dtype == np.float32
    expected = np.asarray(jax.jit(lambda x: x[0, :4] * 2)(pending.to_numpy()))
    np.testing.assert_array_equal(out.to_numpy(), expected)


def test_a_64_bit_buffer_that_cannot_be_narrowed_says_which_argument(
    client: pjrt_py.Client, x64: Callable[[bool], None]
) -> None:
    x64(False)
    fn = pjrt_py.jit(lambda x: x + 1, client=client)
    other = pjrt_py.Client()
    try:
        with pytest.raises(ValueError, match="argument 0: buffer belongs to another client"):
            fn(other.buffer(np.ones(3)))
    finally:
        other.close()
    kinds = [m.kind for m in client.devices[0].memories]
    if "pinned_host" in kinds:
        pinned = client.buffer(np.ones(3)).copy_to_memory("pinned_host")
        with pytest.raises(ValueError, match="argument 0 is in 'pinned_host' memory"):
            fn(pinned)
    dead = client.buffer(np.ones(3))
    dead.delete()
    with pytest.raises(ValueError, match="argument 0: buffer has been deleted"):
        fn(dead)


@pytest.mark.needs_devices(3)  # the default device and two others
def test_a_call_runs_where_its_buffers_are(client: pjrt_py.Client) -> None:
    # jax.jit follows committed arrays; pjrt_py.jit refused a Buffer that was
    # not on the default device ("copy it with copy_to_device").
    f = pjrt_py.jit(lambda x, y: 2 * x + y, client=client)
    x = np.arange(4, dtype=np.float32)
    on = {d: client.buffer(x, client.devices[d]) for d in (0, 2)}
    assert f(on[0], on[0]).device == client.devices[0]
    for a, b in (
        (on[2], on[2]),
        (on[2], x),
        (x, on[2]),
        (on[2].copy_to_device_async(client.devices[2]), x),
    ):
        out = f(a, b)  # the first: the all-Buffer path of device 0's entry, then the full one
        assert out.device == client.devices[2]
        np.testing.assert_array_equal(out.to_numpy(), 3 * x)
    assert f(x, x).device == client.default_device
    assert f.cache_size() == 2  # one compile per device
    with pytest.raises(ValueError, match=r"Buffers on several devices \(0, 2\)"):
        f(on[0], on[2])
    assert f(on[0], on[0]).device == client.devices[0]  # the fast path still serves device 0


def test_the_all_buffer_path_never_runs_a_call_twice(client: pjrt_py.Client) -> None:
    # Its fallback on a ValueError once wrapped the out= conversion too: a
    # converter raising ValueError ran the program again on the full path.
    runs = []

    def refuse(buf: pjrt_py.Buffer) -> None:
        runs.append(buf)
        raise ValueError("out= refuses this")

    f = pjrt_py.jit(lambda x: x + 1, out=refuse, client=client)
    x = client.buffer(np.ones(3, np.float32))
    for calls in (1, 2, 3):  # the first call fills the cache the next ones use
        with pytest.raises(ValueError, match="out= refuses this"):
            f(x)
        assert len(runs) == calls


def test_equal_static_values_of_different_types_trace_apart(client: pjrt_py.Client) -> None:
    # 1, True, 1.0 and np.int32(1) are equal and hash alike: the cache keyed
    # on the value alone gave all four the first call's program. jax keys the
    # type too (checked: it returns 1, 100, 10, 1000 here).
    def f(a: Any, n: Any) -> Any:
        return a + {bool: 100, float: 10, int: 1}.get(type(n), 1000)

    g = pjrt_py.jit(f, static_argnums=1, client=client)
    a = np.zeros(1, np.float32)
    got = [float(g(a, n).to_numpy()[0]) for n in (1, True, 1.0, np.int32(1))]
    assert got == [1.0, 100.0, 10.0, 1000.0]
    assert g.cache_size() == 4
    h = pjrt_py.jit(lambda v: jnp_full(v), static_argnames="v", client=client)
    assert h(v=1).dtype == np.int32 and h(v=1.0).dtype == np.float32


def jnp_full(v: Any) -> Any:
    import jax.numpy as jnp  # noqa: PLC0415

    return jnp.full((2,), v)


def test_a_big_endian_array_is_refused_with_the_way_out(client: pjrt_py.Client) -> None:
    f = pjrt_py.jit(lambda a: a * 2, client=client)
    swapped = np.arange(4, dtype=">f4")
    with pytest.raises(TypeError, match="byte order.*newbyteorder"):
        f(swapped)
    native = swapped.astype(swapped.dtype.newbyteorder("="))
    np.testing.assert_array_equal(f(native).to_numpy(), 2 * np.arange(4, dtype=np.float32))
