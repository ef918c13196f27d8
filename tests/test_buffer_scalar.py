"""A Buffer converts to a Python scalar as numpy's and jax's arrays do.

Before, ``bool(buf)`` was always True (the object default), so ``if buf:``
with a buffer holding False took the wrong branch, while ``int()`` and
``float()`` raised. numpy decides each conversion of the buffer's value.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pjrt_py

CONVERSIONS: list[Callable[[Any], Any]] = [bool, int, float, complex, operator.index]
VALUES = [
    np.array(False),
    np.array(True),
    np.array(0.0, np.float32),
    np.array(-3.75),
    np.array(7, np.int32),
    np.array(2**40, np.int64),
    np.array(1 - 2j, np.complex64),
    np.array([0.0]),
    np.array([[5]], np.uint8),
    np.ones(3),
    np.zeros((0,), np.float32),
]


def outcome(convert: Callable[[Any], Any], value: Any) -> tuple[str, Any]:
    try:
        return "value", convert(value)
    except (TypeError, ValueError) as e:
        return type(e).__name__, None


@pytest.mark.parametrize("convert", CONVERSIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("value", VALUES, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_a_buffer_converts_as_numpy_does(
    client: pjrt_py.Client, convert: Callable[[Any], Any], value: np.ndarray
) -> None:
    ours, theirs = outcome(convert, client.buffer(value)), outcome(convert, value)
    assert ours == theirs
    assert type(ours[1]) is type(theirs[1])


def test_truth_of_a_computed_result_waits_for_it(client: pjrt_py.Client) -> None:
    t = "tensor<f32>"
    less = client.compile(
        f"func.func @main(%a: {t}, %b: {t}) -> tensor<i1> {{\n"
        f"  %r = stablehlo.compare LT, %a, %b : ({t}, {t}) -> tensor<i1>\n"
        "  return %r : tensor<i1>\n}"
    )
    a, b = np.float32(1), np.float32(2)
    assert less.execute_async(a, b).buffer()
    assert not less.execute_async(b, a).buffer()


def test_a_dead_buffer_refuses(client: pjrt_py.Client) -> None:
    buf = client.buffer(np.array(True))
    buf.delete()
    for convert in CONVERSIONS:
        with pytest.raises(ValueError, match="deleted"):
            convert(buf)


def test_format_and_itemsize_are_numpys(client: pjrt_py.Client) -> None:
    x = np.float32(1.23456)
    b = client.buffer(x)
    assert f"{b:.2f}" == f"{np.asarray(x):.2f}" == "1.23"
    assert format(b) == str(b)
    with pytest.raises(TypeError, match="unsupported format string"):
        format(client.buffer(np.arange(3.0)), ".2f")  # as numpy's n-d arrays
    for dtype in (np.bool_, np.int8, np.float32, np.complex128):
        assert client.buffer(np.zeros(3, dtype)).itemsize == np.dtype(dtype).itemsize


def test_a_large_buffer_is_refused_as_a_scalar_without_reading_it(
    client: pjrt_py.Client,
) -> None:
    # numpy decides from an uninitialised array of its shape: the buffer's
    # value is read only where it has one element (it was copied first).
    big = client.buffer(np.zeros(1 << 22, np.float32))
    for convert, error in ((bool, ValueError), (float, TypeError), (int, TypeError)):
        with pytest.raises(error) as ours:
            convert(big)
        with pytest.raises(error) as theirs:
            convert(np.zeros(1 << 22, np.float32))
        assert str(ours.value) == str(theirs.value)
    big.delete()
    with pytest.raises(ValueError, match="deleted"):
        bool(big)


def test_a_python_int_past_64_bits_says_so(client: pjrt_py.Client) -> None:
    # numpy turns it into an object array, which read "dtype object is not supported"
    with pytest.raises(OverflowError, match="does not fit int64 or uint64"):
        client.buffer(2**64)
    assert client.buffer(2**63).dtype == np.uint64  # numpy's choice, kept
