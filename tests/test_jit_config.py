"""pjrt_py.jit follows jax.jit across configuration changes and weak types.

A differential test: each case runs the same function through ``jax.jit``
and ``pjrt_py.jit`` under the same jax configuration, changing it between
calls, and compares dtypes and values (or that both raise).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pjrt_py

jax = pytest.importorskip("jax", reason="pjrt_py.jit traces with jax")
jnp = jax.numpy


@pytest.fixture
def x64() -> Iterator[Callable[[bool], None]]:
    before = jax.config.jax_enable_x64
    yield lambda on: jax.config.update("jax_enable_x64", on)
    jax.config.update("jax_enable_x64", before)


def same(ours: Any, theirs: Any) -> None:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


def test_turning_x64_on_retraces(x64: Callable[[bool], None]) -> None:
    fn = lambda x: x * 3e299  # noqa: E731
    ours, theirs = pjrt_py.jit(fn), jax.jit(fn)
    x = np.array([1.1e-299, 1.0])
    x64(False)
    with np.errstate(over="ignore"):
        same(ours(x), theirs(x))  # float32: inf
    x64(True)
    same(ours(x), theirs(x))  # float64: 3e299, not a cached float32 inf
    x64(False)
    with np.errstate(over="ignore"):
        same(ours(x), theirs(x))


def test_a_function_first_traced_under_x64_keeps_64_bits(x64: Callable[[bool], None]) -> None:
    x64(False)
    pjrt_py.jit(lambda x: x)(np.ones(2))  # a 32-bit trace first, of another function
    x64(True)
    fn = lambda x: x + 1  # noqa: E731
    same(pjrt_py.jit(fn)(np.ones(2)), jax.jit(fn)(np.ones(2)))


def test_strict_promotion_raises_as_in_jax() -> None:
    fn = lambda a, b: a + b  # noqa: E731
    ours = pjrt_py.jit(fn)
    a, b = np.ones(2, np.float32), np.ones(2, np.int32)
    same(ours(a, b), jax.jit(fn)(a, b))
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(Exception) as theirs:
            jax.jit(fn)(a, b)
        with pytest.raises(type(theirs.value)):
            ours(a, b)
    same(ours(a, b), jax.jit(fn)(a, b))  # back to standard: the first program again


def test_buffer_calls_follow_the_configuration_too(x64: Callable[[bool], None]) -> None:
    # The all-Buffer fast path is keyed by the configuration as well.
    fn = lambda a, b: a + b  # noqa: E731
    ours = pjrt_py.jit(fn)
    a = pjrt_py.buffer(np.ones(2, np.float32))
    b = pjrt_py.buffer(np.ones(2, np.int32))
    ours(a, b)
    with jax.numpy_dtype_promotion("strict"), pytest.raises(Exception, match="romot"):
        ours(a, b)


@pytest.mark.parametrize(
    ("weak", "other"),
    [
        (lambda: jnp.asarray(2.0), np.ones(3, np.float16)),  # weak f32 * f16 -> f16
        (lambda: jnp.asarray(300), np.ones(3, np.int8)),  # weak i32 + i8 -> i8, wrapping
        (lambda: jnp.asarray(2.0), np.ones(3, np.int32)),  # weak f32 + i32 -> f32
    ],
)
def test_weak_jax_arguments_promote_as_in_jax(weak: Callable[[], Any], other: Any) -> None:
    fn = lambda a, b: a * b + a  # noqa: E731
    w = weak()
    assert w.weak_type
    same(pjrt_py.jit(fn)(w, other), jax.jit(fn)(w, other))


def test_weak_outputs_stay_weak_with_out_jax() -> None:
    fn = lambda a, b: a * b  # noqa: E731
    w = jnp.asarray(2.0)
    ours = pjrt_py.jit(fn, out="jax")(w, 3.0)
    theirs = jax.jit(fn)(w, 3.0)
    assert ours.weak_type == theirs.weak_type is True
    same(ours, theirs)
    strong = pjrt_py.jit(fn, out="jax")(np.float32(2.0), 3.0)
    assert strong.weak_type == jax.jit(fn)(np.float32(2.0), 3.0).weak_type is False
    # And the weak output promotes as jax's does in later jax code.
    assert (ours * jnp.ones(2, jnp.float16)).dtype == (theirs * jnp.ones(2, jnp.float16)).dtype
