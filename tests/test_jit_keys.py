"""pjrt_py.jit takes and returns jax's typed PRNG keys (``jax.random.key``).

jax recommends typed keys over raw uint32 ones. pjrt_py.jit once refused them
as arguments ("argument of type PRNGKeyArray") and could not return them. A
program takes a key's data (``jax.random.key_data``); a key output comes back
as jax's key array of the same dtype, over the output buffer, whatever
``out=`` asks for, since no other array type holds a key. Each case is
compared with ``jax.jit``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pjrt_py

jax = pytest.importorskip("jax", reason="pjrt_py.jit traces with jax")


def normal_plus(key: Any, x: Any) -> Any:
    return jax.random.normal(key, x.shape, x.dtype) + x


def split(key: Any) -> Any:
    return jax.random.split(key, 3)


def step(state: dict[str, Any]) -> dict[str, Any]:
    key, sub = jax.random.split(state["key"])
    return {"key": key, "x": state["x"] + jax.random.uniform(sub, state["x"].shape)}


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_a_typed_key_argument_gives_jaxs_numbers(impl: str) -> None:
    key = jax.random.key(7, impl=impl)
    x = np.arange(6, dtype=np.float32)
    ours = pjrt_py.jit(normal_plus)(key, x)
    assert isinstance(ours, pjrt_py.Buffer)
    np.testing.assert_array_equal(ours.to_numpy(), np.asarray(jax.jit(normal_plus)(key, x)))


@pytest.mark.parametrize("out", ["buffer", "numpy", "jax"])
def test_key_outputs_come_back_as_jax_keys_of_their_dtype(out: str) -> None:
    key = jax.random.key(3, impl="rbg")
    ours = pjrt_py.jit(split, out=out)(key)
    theirs = jax.jit(split)(key)
    assert ours.dtype == theirs.dtype and ours.shape == (3,)
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(ours)), np.asarray(jax.random.key_data(theirs))
    )


def test_keys_in_a_pytree_round_trip_through_calls() -> None:
    state = {"key": jax.random.key(0), "x": np.zeros(4, np.float32)}
    ours, theirs = dict(state), dict(state)
    stepped = pjrt_py.jit(step)
    for _ in range(3):  # each output key is the next call's argument
        ours, theirs = stepped(ours), jax.jit(step)(theirs)
    assert isinstance(ours["x"], pjrt_py.Buffer)
    np.testing.assert_array_equal(ours["x"].to_numpy(), np.asarray(theirs["x"]))
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(ours["key"])), np.asarray(jax.random.key_data(theirs["key"]))
    )
    assert stepped.cache_size() == 1


def test_a_typed_key_and_its_raw_data_are_different_signatures() -> None:
    key = jax.random.key(5)
    fn = pjrt_py.jit(lambda k: jax.random.uniform(k, (2,)))
    typed = fn(key).to_numpy()
    raw = fn(jax.random.key_data(key)).to_numpy()  # a legacy uint32 key
    assert fn.cache_size() == 2
    np.testing.assert_array_equal(typed, raw)  # the same bits, as in jax
    np.testing.assert_array_equal(typed, np.asarray(jax.random.uniform(key, (2,))))


def test_the_lowered_program_takes_the_keys_data() -> None:
    key = jax.random.key(11)
    lowered = pjrt_py.jit(split).lower(key)
    assert "tensor<2xui32>" in lowered.as_text()
    out = lowered.compile().execute(np.asarray(jax.random.key_data(key)))
    expected = jax.random.key_data(jax.jit(split)(key))
    np.testing.assert_array_equal(out.to_numpy(), np.asarray(expected))


@pytest.mark.parametrize(
    ("shape", "given", "wanted"),
    [((), np.int64, np.int32), ((3, 4), np.float64, np.float32), ((5,), np.uint64, np.uint32)],
)
def test_a_conversion_on_the_device_is_numpys(
    client: pjrt_py.Client, shape: tuple[int, ...], given: Any, wanted: Any
) -> None:
    # What pjrt_py.jit runs to narrow a foreign array that lies in device
    # memory (jax's rule with x64 off), tried here on buffers of this client.
    from pjrt_py.programs.device_programs import convert_on_device  # noqa: PLC0415

    values = np.arange(int(np.prod(shape)), dtype=given).reshape(shape)
    device = client.devices[-1]
    out = convert_on_device(client, client.buffer(values, device), np.dtype(wanted))
    assert out.dtype == wanted and out.shape == shape and out.device == device
    np.testing.assert_array_equal(out.to_numpy(), values.astype(wanted))
