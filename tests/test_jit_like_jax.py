"""pjrt_py.jit where an expert jax user's probe found it unlike jax.jit.

Each case runs the same function through ``jax.jit`` and ``pjrt_py.jit`` and
expects what jax does (numbers, errors, where AOT compiles).
"""

from __future__ import annotations

import enum
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pjrt_py

jax = pytest.importorskip("jax", reason="jax (in the test extra) is not installed")
jnp = jax.numpy

X = np.arange(3, dtype=np.float32)
W = np.ones(3, np.float32)


def both(fn: Any, **options: Any) -> tuple[Any, Any]:
    return jax.jit(fn, **options), pjrt_py.jit(fn, out="numpy", **options)


def test_static_argnums_and_argnames_given_together_are_taken_as_given() -> None:
    # jax infers one from the other only when one is missing: w passed by
    # position stays dynamic, n passed by keyword stays traced.
    def f(x: Any, n: Any, w: Any) -> Any:
        return x * n + w

    ours, theirs = both(f, static_argnums=1, static_argnames="w")[::-1]
    np.testing.assert_array_equal(ours(X, 2, W), theirs(X, 2, W))

    def g(x: Any, n: Any, *, w: int = 0) -> Any:
        return x * n if isinstance(n, int) else x * 0  # a tracer when n is traced

    theirs, ours = both(g, static_argnums=1, static_argnames="w")
    np.testing.assert_array_equal(ours(X, n=3), theirs(X, n=3))
    np.testing.assert_array_equal(ours(X, n=3), np.zeros(3, np.float32))
    # One given: the other is inferred, as before.
    theirs, ours = both(g, static_argnums=1)
    np.testing.assert_array_equal(ours(X, n=3), theirs(X, n=3))


def test_a_positional_only_parameter_can_be_static() -> None:
    def f(x: Any, n: int, /) -> Any:
        return x * n

    theirs, ours = both(f, static_argnums=1)
    np.testing.assert_array_equal(ours(X, 2), theirs(X, 2))


@pytest.mark.needs_devices(3)
def test_aot_compiles_for_the_device_of_its_buffers(client: pjrt_py.Client) -> None:
    f = pjrt_py.jit(lambda a: a * 2, client=client)
    b2 = client.buffer(X, client.devices[2])
    exe = f.lower(b2).compile()
    assert exe.devices == [client.devices[2]]  # as jax's AOT compiles for its arrays' device
    out = exe.execute(b2)
    assert out.device == client.devices[2]
    np.testing.assert_array_equal(out.to_numpy(), 2 * X)
    assert f.lower(X).compile().devices == [client.default_device]


def test_lower_takes_structs_of_keys_and_packed_dtypes() -> None:
    key = jax.random.key(0)
    lowered = pjrt_py.jit(lambda k: jax.random.uniform(k, (2,))).lower(
        jax.ShapeDtypeStruct(key.shape, key.dtype)
    )
    assert "tensor<2xui32>" in lowered.as_text() or "ui32" in lowered.as_text()
    for packed in (ml_dtypes.int4, ml_dtypes.uint4):
        spec = jax.ShapeDtypeStruct((3,), packed)
        text = pjrt_py.jit(lambda a: a.astype(jnp.int32)).lower(spec).as_text()
        assert "tensor<3xi4>" in text or "tensor<3xui4>" in text


@pytest.mark.parametrize(
    ("flag", "fn", "what"),
    [("jax_debug_nans", jnp.log, "nan"), ("jax_debug_infs", lambda a: 1 / (a + 1), "inf")],
)
def test_jax_debug_nans_and_infs_raise_as_in_jax(flag: str, fn: Any, what: str) -> None:
    x = np.array([-1.0, 1.0], np.float32)
    jax.config.update(flag, True)
    try:
        with pytest.raises(FloatingPointError), np.errstate(divide="ignore"):
            jax.jit(fn)(x)  # (jax reruns it op by op to say where)
        with pytest.raises(FloatingPointError, match=f"invalid value \\({what}\\)"):
            pjrt_py.jit(fn)(x)
        np.testing.assert_array_equal(
            pjrt_py.jit(fn, out="numpy")(np.ones(2, np.float32)), fn(np.ones(2, np.float32))
        )
    finally:
        jax.config.update(flag, False)
    assert np.isnan(pjrt_py.jit(jnp.log, out="numpy")(x)[0])  # off again: returned as is


def test_a_transformation_of_a_pjrt_py_jit_function_says_it_cannot_be() -> None:
    f = pjrt_py.jit(lambda a: jnp.sin(a).sum())
    for transform in (jax.grad, jax.vmap, jax.jit):
        with pytest.raises(TypeError, match="jax tracer.*cannot be transformed by jax"):
            transform(f)(X)
    inside = pjrt_py.jit(jax.grad(lambda a: jnp.sin(a).sum()), out="numpy")
    np.testing.assert_allclose(inside(X), np.cos(X), rtol=1e-6)


class Mode(enum.IntEnum):
    A = 3


class Scale(float):
    pass


@pytest.mark.parametrize("value", [Mode.A, Scale(2.5)], ids=["IntEnum", "float-subclass"])
def test_scalar_subclasses_are_their_base_types_weak_scalars(value: Any) -> None:
    theirs, ours = both(lambda n: n * 2)
    got, want = ours(value), theirs(value)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_an_int_past_its_parameter_is_an_overflow_error_cached_or_not() -> None:
    f = pjrt_py.jit(lambda n: n + 1)
    with pytest.raises(OverflowError):
        f(2**31)  # a new signature: jax's tracing refuses it
    f(1)
    with pytest.raises(OverflowError, match="does not fit the parameter's int32"):
        f(2**31)  # the cached program: pjrt_py's check, the same class
    with pytest.raises(ValueError):  # and still a ValueError, as first documented
        f(2**31)
