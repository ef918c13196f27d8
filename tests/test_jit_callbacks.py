"""jax's host callbacks in ``pjrt_py.jit`` (issue 14, part 3): results and
side effects checked against ``jax.jit`` itself, on the real plugin."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
from conftest import in_threads

import pjrt_py
from pjrt_py.callbacks import host_callback

jax = pytest.importorskip("jax", reason="pjrt_py.jit traces with jax (in the test extra)")
jnp = jax.numpy
io_callback = jax.experimental.io_callback

# Every test here runs Python host callbacks.
pytestmark = pytest.mark.needs_host_callbacks


@pytest.fixture(autouse=True)
def _quiet_jax() -> None:
    jax.config.update("jax_platforms", "cpu")


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [(np.float32, (3,)), (np.float32, (2, 4)), (np.int32, (5,)), (np.float16, ())],
)
def test_pure_callback_matches_jax(client: pjrt_py.Client, dtype: Any, shape: Any) -> None:
    def f(x: Any) -> Any:
        spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
        y = jax.pure_callback(lambda a: (np.asarray(a) * 3 + 1).astype(a.dtype), spec, x)
        return y * 2 - x

    x = (np.arange(int(np.prod(shape))) - 2).reshape(shape).astype(dtype)
    got = pjrt_py.jit(f, client=client)(x).to_numpy()
    want = np.asarray(jax.jit(f)(x))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_several_callbacks_and_results(client: pjrt_py.Client) -> None:
    def f(x: Any, y: Any) -> Any:
        specs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((), x.dtype))
        s, m = jax.pure_callback(lambda a, b: (a + b, np.max(a * b)), specs, x, y)
        t = jax.pure_callback(np.cos, jax.ShapeDtypeStruct(x.shape, x.dtype), s)
        return t, m

    x, y = np.linspace(0, 1, 6, dtype=np.float32), np.full(6, 0.5, np.float32)
    got = pjrt_py.jit(f, client=client)(x, y)
    want = jax.jit(f)(x, y)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.to_numpy(), np.asarray(w), rtol=1e-6)


def test_ordered_io_callback_log_matches_jax(client: pjrt_py.Client) -> None:
    log: list[tuple[str, float]] = []

    def f(x: Any) -> Any:
        io_callback(lambda a: log.append(("first", float(a))), None, x.sum(), ordered=True)
        y = x * 2
        io_callback(lambda a: log.append(("second", float(a))), None, y.sum(), ordered=True)
        return y

    inputs = [np.full(4, i, np.float32) for i in range(6)]
    jitted = jax.jit(f)
    for x in inputs:
        jitted(x)
    jax.effects_barrier()
    expected = list(log)
    log.clear()
    ours = pjrt_py.jit(f, client=client)
    outs = [ours(x) for x in inputs]
    pjrt_py.effects_barrier()
    assert log == expected
    assert len(expected) == 12
    np.testing.assert_array_equal(outs[-1].to_numpy(), inputs[-1] * 2)


def test_ordered_io_callback_with_a_result_and_heavy_work(client: pjrt_py.Client) -> None:
    # Dense work first makes executions asynchronous: the log still follows
    # the calls, as jax's does.
    log: list[int] = []

    def f(x: Any, i: Any) -> Any:
        y = jnp.tanh(x @ x) @ x
        spec = jax.ShapeDtypeStruct((), jnp.int32)
        j = io_callback(lambda k: (log.append(int(k)), np.int32(k + 100))[1], spec, i, ordered=True)
        return y, j

    ours = pjrt_py.jit(f, client=client)
    x = np.full((256, 256), 1 / 256, np.float32)
    results = [ours(x, np.int32(i)) for i in range(8)]
    assert [int(r[1].to_numpy()) for r in results] == [100 + i for i in range(8)]
    assert log == list(range(8))


def test_unordered_io_callback_runs_once_per_call(client: pjrt_py.Client) -> None:
    seen: list[float] = []

    def f(x: Any) -> Any:
        io_callback(lambda a: seen.append(float(a)), None, x[0])
        return x + 1

    ours = pjrt_py.jit(f, client=client)
    for i in range(5):
        ours(np.full(2, i, np.float32)).to_numpy()
    pjrt_py.effects_barrier()
    assert sorted(seen) == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_debug_print_and_debug_callback(
    client: pjrt_py.Client, capfd: pytest.CaptureFixture[str]
) -> None:
    values: list[Any] = []

    def f(x: Any) -> Any:
        jax.debug.print("x={x} sum={s}", x=x, s=x.sum())
        jax.debug.callback(lambda a: values.append(np.asarray(a).tolist()), x * 10)
        return x

    x = np.array([1.0, 2.0], np.float32)
    jax.jit(f)(x)
    jax.effects_barrier()
    theirs = capfd.readouterr().out
    pjrt_py.jit(f, client=client)(x).to_numpy()
    pjrt_py.effects_barrier()
    ours = capfd.readouterr().out
    assert ours == theirs == "x=[1. 2.] sum=3.0\n"
    assert values == [[10.0, 20.0], [10.0, 20.0]]


def test_a_raising_callback_fails_the_call(client: pjrt_py.Client) -> None:
    def boom(a: Any) -> Any:
        raise ZeroDivisionError("callback went wrong")

    def f(x: Any) -> Any:
        return jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises(pjrt_py.PjrtError, match="ZeroDivisionError: callback went wrong"):
        pjrt_py.jit(f, client=client)(np.ones(2, np.float32)).to_numpy()


def test_a_wrong_result_shape_is_reported(client: pjrt_py.Client) -> None:
    def f(x: Any) -> Any:
        return jax.pure_callback(
            lambda a: np.ones(7, a.dtype), jax.ShapeDtypeStruct((2,), x.dtype), x
        )

    with pytest.raises(pjrt_py.PjrtError, match="Incorrect output shape|returned"):
        pjrt_py.jit(f, client=client)(np.ones(2, np.float32)).to_numpy()


def test_the_lowering_is_rewritten_to_pjrt_pys_router(client: pjrt_py.Client) -> None:
    def f(x: Any) -> Any:
        io_callback(lambda a: None, None, x, ordered=True)
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    text = pjrt_py.jit(f, client=client).lower(np.ones(3, np.float32)).as_text()
    assert "xla_ffi_python_cpu_callback" not in text
    assert text.count(f"@{host_callback.ROUTER_TARGET}(") == 2
    assert "!stablehlo.token" not in text.split("func.func public @main", 1)[1].split("{", 1)[0]


def test_callables_are_dropped_with_their_executables(client: pjrt_py.Client) -> None:
    def f(x: Any) -> Any:
        return jax.pure_callback(np.negative, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    before = len(host_callback._routes)
    fresh = pjrt_py.Client()
    ours = pjrt_py.jit(f, client=fresh)
    np.testing.assert_array_equal(ours(np.ones(2, np.float32)).to_numpy(), [-1, -1])
    assert len(host_callback._routes) == before + 1
    del ours
    fresh.compile_cache.clear()
    fresh.close()
    gc.collect()
    assert len(host_callback._routes) == before


def test_callbacks_from_threads(client: pjrt_py.Client) -> None:
    def f(x: Any) -> Any:
        return jax.pure_callback(lambda a: a + 1, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    ours = pjrt_py.jit(f, client=client)

    def worker(k: int) -> None:
        for i in range(10):
            x = client.buffer(np.full(3, k * 100 + i, np.float32))
            np.testing.assert_array_equal(ours(x).to_numpy(), np.full(3, k * 100 + i + 1))

    assert not in_threads(worker, 6)
