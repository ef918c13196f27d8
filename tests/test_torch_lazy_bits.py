"""torch's lazy negation and conjugation bits: never read as plain memory.

``c.conj().imag`` is a tensor whose memory holds the imaginary parts and whose
negation bit says to negate them; ``c.conj()`` sets the conjugation bit. DLPack
cannot carry either, and torch exports the memory as it is, so pjrt_py
resolves them into a copy (or refuses with ``copy=False``) on every path:
``from_dlpack``, ``execute`` (the native fast path and the Python path),
``execute_async`` and ``pjrt_py.jit``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pjrt_py
from pjrt_py.runtime.buffer import aligned_empty

pytestmark = pytest.mark.needs_torch  # selected by .ci/run's torch step (-m needs_torch)
torch = pytest.importorskip("torch", reason="needs torch, which is not installed (the torch extra)")

IDENTITY = """
func.func @main(%x: tensor<{n}x{t}>) -> tensor<{n}x{t}> {{
  return %x : tensor<{n}x{t}>
}}
"""


def _aligned(values: list[Any], dtype: Any) -> Any:
    """A torch tensor over 64-byte aligned memory: what the native fast path views."""
    a = aligned_empty((len(values),), dtype)
    a[:] = values
    return torch.from_numpy(a)


def _cases() -> list[tuple[str, Any, np.ndarray]]:
    c = _aligned([1 + 2j, 3 - 4j, 5 + 6j, 7 - 8j], np.complex64)
    f = _aligned([1.0, -2.0, 3.0, -4.0], np.float32)
    return [
        ("conj().imag (negation)", c.conj().imag, np.array([-2, 4, -6, 8], np.float32)),
        ("negative view, aligned", torch._neg_view(f), np.array([-1, 2, -3, 4], np.float32)),
        ("conj() (conjugation)", c.conj(), np.conj(c.numpy())),
        (
            "negated conjugate (both bits)",
            torch._neg_view(c.conj()),
            -np.conj(c.numpy()),
        ),
    ]


CASES = _cases()
IDS = [name for name, _, _ in CASES]


def _program(client: pjrt_py.Client, expected: np.ndarray) -> pjrt_py.Executable:
    t = {np.dtype(np.float32): "f32", np.dtype(np.complex64): "complex<f32>"}[expected.dtype]
    return client.compile(IDENTITY.format(n=expected.size, t=t))


@pytest.mark.parametrize(("name", "tensor", "expected"), CASES, ids=IDS)
def test_from_dlpack_reads_the_values_not_the_memory(
    client: pjrt_py.Client, name: str, tensor: Any, expected: np.ndarray
) -> None:
    assert tensor.is_neg() or tensor.is_conj(), name
    np.testing.assert_array_equal(client.from_dlpack(tensor).to_numpy(), expected)
    np.testing.assert_array_equal(pjrt_py.from_dlpack(tensor).to_numpy(), expected)


@pytest.mark.parametrize(("name", "tensor", "expected"), CASES, ids=IDS)
def test_execute_arguments_read_the_values(
    client: pjrt_py.Client, name: str, tensor: Any, expected: np.ndarray
) -> None:
    exe = _program(client, expected)
    for _ in range(3):  # the native path caches what it learnt of the type
        np.testing.assert_array_equal(exe.execute(tensor).to_numpy(), expected)
        np.testing.assert_array_equal(
            pjrt_py.value(exe.execute_async(tensor).to_numpy_async()), expected
        )


@pytest.mark.parametrize(("name", "tensor", "expected"), CASES, ids=IDS)
def test_jit_arguments_read_the_values(name: str, tensor: Any, expected: np.ndarray) -> None:
    pytest.importorskip("jax", reason="pjrt_py.jit traces with jax")
    f = pjrt_py.jit(lambda a: a + 0)
    np.testing.assert_array_equal(np.asarray(f(tensor)), expected)


def test_copy_false_refuses_a_lazy_tensor_by_name(client: pjrt_py.Client) -> None:
    name, tensor, _ = CASES[0]
    with pytest.raises(BufferError, match="negation bit"):
        client.from_dlpack(tensor, copy=False)
    _, both, _ = CASES[3]
    with pytest.raises(BufferError, match="conjugation and negation"):
        client.from_dlpack(both, copy=False)


def test_plain_tensors_are_still_viewed_without_a_copy(client: pjrt_py.Client) -> None:
    t = _aligned([1.0, 2.0, 3.0, 4.0], np.float32)
    buf = client.from_dlpack(t, copy=False)
    assert buf.unsafe_pointer() == t.data_ptr()
