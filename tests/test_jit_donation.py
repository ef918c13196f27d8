"""pjrt_py.jit's donate_argnums / donate_argnames, as in jax.jit.

jax marks a donated parameter in the program (``tf.aliasing_output``), and
pjrt_py's executables already honour that mark: a donated Buffer is dead
after the call. Before this, ``pjrt_py.jit`` took no donation arguments.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pjrt_py

jax = pytest.importorskip("jax", reason="pjrt_py.jit traces with jax")

ONES = np.ones(4, np.float32)


def test_a_donated_buffer_is_dead_after_the_call(client: pjrt_py.Client) -> None:
    fn = pjrt_py.jit(lambda x, y: (x + y, y * 2), donate_argnums=0, client=client)
    a, b = client.buffer(ONES), client.buffer(ONES)
    total, doubled = fn(a, b)
    np.testing.assert_array_equal(total.to_numpy(), 2 * ONES)
    np.testing.assert_array_equal(doubled.to_numpy(), 2 * ONES)
    with pytest.raises(ValueError, match="donated"):
        a.to_numpy()
    np.testing.assert_array_equal(b.to_numpy(), ONES)  # not donated
    assert "tf.aliasing_output" in fn.lower(ONES, ONES).as_text()


def test_donation_by_name_with_a_static_argument(client: pjrt_py.Client) -> None:
    fn = pjrt_py.jit(lambda x, n: x * n, static_argnums=1, donate_argnames="x", client=client)
    x = client.buffer(ONES)
    np.testing.assert_array_equal(fn(x, 3).to_numpy(), 3 * ONES)
    with pytest.raises(ValueError, match="donated"):
        x.to_numpy()
    y = client.buffer(ONES)
    np.testing.assert_array_equal(fn(x=y, n=2).to_numpy(), 2 * ONES)  # by keyword too
    with pytest.raises(ValueError, match="donated"):
        y.to_numpy()


def test_what_pjrt_py_only_views_is_not_donated(client: pjrt_py.Client) -> None:
    fn = pjrt_py.jit(lambda x: x + 1, donate_argnums=0, client=client)
    host = ONES.copy()
    np.testing.assert_array_equal(fn(host).to_numpy(), ONES + 1)
    np.testing.assert_array_equal(host, ONES)  # the caller's numpy array is untouched
    j = jax.numpy.ones(4, np.float32)
    np.testing.assert_array_equal(fn(j).to_numpy(), ONES + 1)
    np.testing.assert_array_equal(np.asarray(j), ONES)  # jax's array is still whole


def test_a_donation_no_output_can_use_leaves_the_buffer_alive(client: pjrt_py.Client) -> None:
    fn = pjrt_py.jit(lambda x: x.sum(), donate_argnums=0, client=client)
    x = client.buffer(ONES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jax's "Some donated buffers were not usable"
        assert fn(x).to_numpy() == 4
    np.testing.assert_array_equal(x.to_numpy(), ONES)


def test_without_donation_nothing_is_donated(client: pjrt_py.Client) -> None:
    fn = pjrt_py.jit(lambda x: x + 1, client=client)
    x = client.buffer(ONES)
    fn(x).block_until_ready()
    np.testing.assert_array_equal(x.to_numpy(), ONES)
    assert "tf.aliasing_output" not in fn.lower(ONES).as_text()
