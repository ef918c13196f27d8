"""pjrt_py.jit: jax traces, pjrt_py compiles and runs; results match jax.jit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pjrt_py

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax

RNG = np.random.default_rng(0)


def same_as_jax(fn, *args, rtol: float = 1e-6, **kwargs):  # type: ignore[no-untyped-def]
    """Run fn through pjrt_py.jit and jax.jit; compare every output leaf."""
    ours = pjrt_py.jit(fn)(*args, **kwargs)
    theirs = jax.jit(fn)(*args, **kwargs)
    ours_leaves, ours_tree = jax.tree_util.tree_flatten(ours)
    theirs_leaves, theirs_tree = jax.tree_util.tree_flatten(theirs)
    assert ours_tree == theirs_tree
    for a, b in zip(ours_leaves, theirs_leaves, strict=True):
        assert isinstance(a, pjrt_py.Buffer)
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        if np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(
                a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=rtol
            )
    return ours


def test_mlp_forward_pass() -> None:
    def mlp(params, x):  # type: ignore[no-untyped-def]
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        return x @ w + b

    sizes = [16, 32, 32, 4]
    params = [
        (RNG.standard_normal((m, n), np.float32) / np.sqrt(m), RNG.standard_normal(n, np.float32))
        for m, n in zip(sizes[:-1], sizes[1:], strict=True)
    ]
    same_as_jax(mlp, params, RNG.standard_normal((8, 16), np.float32), rtol=1e-5)


def test_softmax() -> None:
    same_as_jax(jax.nn.softmax, RNG.standard_normal((4, 10), np.float32) * 5)


def test_scan_and_while_loops() -> None:
    def cumulative(xs):  # type: ignore[no-untyped-def]
        def step(carry, x):  # type: ignore[no-untyped-def]
            carry = carry * 0.5 + x
            return carry, carry

        return lax.scan(step, jnp.zeros_like(xs[0]), xs)

    same_as_jax(cumulative, RNG.standard_normal((12, 3), np.float32))

    def collatz_steps(n):  # type: ignore[no-untyped-def]
        def body(state):  # type: ignore[no-untyped-def]
            n, k = state
            return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), k + 1

        return lax.while_loop(lambda s: s[0] != 1, body, (n, 0))[1]

    out = same_as_jax(collatz_steps, np.int32(27))
    assert int(np.asarray(out)) == 111


def test_integer_math() -> None:
    def ints(a, b):  # type: ignore[no-untyped-def]
        return a // b, a % b, (a * b) >> 2, a & b, jnp.maximum(a, b)

    a = RNG.integers(-1000, 1000, 32).astype(np.int32)
    b = RNG.integers(1, 50, 32).astype(np.int32)
    same_as_jax(ints, a, b)


def test_bfloat16_math() -> None:
    def bf(x, y):  # type: ignore[no-untyped-def]
        return jnp.tanh(x * y + 1), (x @ y.T).astype(jnp.float32)

    x = RNG.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    y = RNG.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    out = same_as_jax(bf, x, y, rtol=1e-2)
    assert out[0].dtype == ml_dtypes.bfloat16


def test_pytree_outputs_and_keyword_arguments() -> None:
    def f(x, *, scale):  # type: ignore[no-untyped-def]
        return {"y": x * scale, "stats": (x.sum(), x.max())}

    same_as_jax(f, np.arange(6, dtype=np.float32), scale=np.float32(2))


def test_the_cache_holds_one_entry_per_signature() -> None:
    f = pjrt_py.jit(lambda x, y: x * y + 1)
    x = np.ones(8, np.float32)
    for k in range(20):
        f(x, float(k))  # Python scalars are weakly typed: one entry for all values
    assert f.cache_size() == 1
    out = f(x, 2.0)
    for _ in range(20):
        out = f(out, 2.0)  # Buffers of the same shape: still the same entry
    assert f.cache_size() == 1
    g = pjrt_py.jit(lambda x, y: x * y)
    for _ in range(20):
        out = g(out, out)  # all-Buffer calls take the short path: it does not grow either
    assert g.cache_size() == 1 and len(g._flat) == 1
    f(np.ones(4, np.float32), 1.0)  # a new shape
    f(np.ones(8, np.int32), 1)  # a new dtype (and scalar type)
    assert f.cache_size() == 3


def test_static_arguments_are_part_of_the_key() -> None:
    def power(x, n):  # type: ignore[no-untyped-def]
        for _ in range(n - 1):
            x = x * x
        return x

    f = pjrt_py.jit(power, static_argnums=1)
    x = np.full(3, 2, np.float32)
    assert np.asarray(f(x, 2)).tolist() == [4, 4, 4]
    assert np.asarray(f(x, 3)).tolist() == [16, 16, 16]
    assert np.asarray(f(x, 3)).tolist() == [16, 16, 16]
    assert f.cache_size() == 2
    g = pjrt_py.jit(power, static_argnames="n")
    assert np.asarray(g(x, n=3)).tolist() == [16, 16, 16]
    with pytest.raises(TypeError, match="hashable"):
        pjrt_py.jit(lambda x, s: x, static_argnums=1)(x, [1, 2])


def test_64_bit_inputs_narrow_like_jax() -> None:
    f = pjrt_py.jit(lambda x: x + 1)
    out = f(np.arange(3, dtype=np.float64))
    assert out.dtype == jax.jit(lambda x: x + 1)(np.arange(3, dtype=np.float64)).dtype


def test_outputs_chain_and_errors_name_the_argument() -> None:
    step = pjrt_py.jit(lambda w, g: w - 0.1 * g)
    w = np.ones(5, np.float32)
    for _ in range(10):
        w = step(w, np.ones(5, np.float32))
    np.testing.assert_allclose(np.asarray(w), np.zeros(5), atol=1e-6)

    lowered = pjrt_py.jit(lambda params, x: params["w"] @ x).lower(
        {"w": np.ones((2, 3), np.float32)}, np.ones(3, np.float32)
    )
    assert "stablehlo.dot_general" in lowered.as_text()
    exe = lowered.compile()
    assert isinstance(exe, pjrt_py.Executable)
    assert [s.name for s in exe.input_signature] == ["params['w']", "x"]
    np.testing.assert_array_equal(
        exe.execute(np.ones((2, 3), np.float32), np.ones(3, np.float32)).to_numpy(), [3, 3]
    )
    with pytest.raises(TypeError, match=r"Argument 'x' compiled with float32\[3\]"):
        exe.execute(np.ones((2, 3), np.float32), np.ones(4, np.float32))


def test_calls_return_before_the_work_is_done() -> None:
    def chain(x):  # type: ignore[no-untyped-def]
        for _ in range(8):
            x = jnp.tanh(x @ x)
        return x

    f = pjrt_py.jit(chain)
    x = np.full((600, 600), 0.001, np.float32)
    f(x).block_until_ready()  # compiled and warm
    # The CPU plugin sometimes runs work inline; a binding that waited would
    # fail every attempt.
    pending = False
    for _ in range(5):
        out = f(x)
        if not out.is_ready():
            pending = True
            break
    out.block_until_ready()
    assert pending


@pytest.mark.needs_host_callbacks
def test_functions_with_host_callbacks_run(capfd: pytest.CaptureFixture[str]) -> None:
    # Callbacks in depth: tests/test_host_callbacks.py.
    def noisy(x):  # type: ignore[no-untyped-def]
        jax.debug.print("x = {}", x)
        return x

    out = pjrt_py.jit(noisy)(np.ones(2, np.float32))
    assert np.array_equal(out.to_numpy(), np.ones(2, np.float32))
    pjrt_py.effects_barrier()
    assert "x = [1. 1.]" in capfd.readouterr().out


def test_bad_arguments_are_type_errors() -> None:
    with pytest.raises(TypeError, match="callable"):
        pjrt_py.jit(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str"):
        pjrt_py.jit(lambda x: x)("not an array")


def test_negative_static_argnums_count_from_the_end_as_in_jax() -> None:
    import jax

    f = pjrt_py.jit(lambda a, n: a * n, static_argnums=-1)
    assert f.static_argnums == (1,) and f.static_argnames == ("n",)
    x = np.arange(3, dtype=np.float32)
    expected = np.asarray(jax.jit(lambda a, n: a * n, static_argnums=-1)(x, 3))
    np.testing.assert_array_equal(np.asarray(f(x, 3)), expected)
    with pytest.raises(ValueError, match="takes 2 positional"):
        pjrt_py.jit(lambda a, n: a * n, static_argnums=-3)
    with pytest.raises(ValueError, match="no \\*args"):
        pjrt_py.jit(lambda *a: a[0], static_argnums=-1)
    with pytest.raises(TypeError, match="must be ints"):
        pjrt_py.jit(lambda a: a, static_argnums=[1.0])
