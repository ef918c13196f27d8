"""numpy arguments to execute_async: small exact-match arrays are copied on
the native dispatch path, everything else takes the Python path. Both must
give the same results and the same snapshot semantics (the array is copied
during the call; changing it afterwards changes nothing)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import in_threads

import pjrt_py


def negate(client: pjrt_py.Client, dtype: Any, shape: tuple[int, ...]) -> pjrt_py.Executable:
    names = {"float32": "f32", "float16": "f16", "int32": "i32", "int8": "i8", "float64": "f64"}
    t = f"tensor<{'x'.join(map(str, shape))}{'x' if shape else ''}{names[np.dtype(dtype).name]}>"
    return client.compile(
        f"func.func @main(%x: {t}) -> {t} {{\n  %0 = stablehlo.negate %x : {t}\n"
        f"  return %0 : {t}\n}}"
    )


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        (np.float32, (8,)),
        (np.float16, (3, 4)),
        (np.int32, ()),
        (np.int8, (0,)),
        (np.float64, (2, 2)),
        (np.float32, (16384,)),  # 64 KiB: the Python path
        (np.float32, (200, 300)),
    ],
)
def test_results_match_numpy(client: pjrt_py.Client, dtype: Any, shape: tuple[int, ...]) -> None:
    exe = negate(client, dtype, shape)
    x = (np.arange(int(np.prod(shape))) - 3).reshape(shape).astype(dtype)
    np.testing.assert_array_equal(exe.execute_async(x).value().to_numpy(), -x)


def test_an_array_is_a_snapshot(client: pjrt_py.Client) -> None:
    exe = negate(client, np.float32, (8,))
    x = np.ones(8, np.float32)
    promises = []
    for i in range(5):
        x[:] = i
        promises.append(exe.execute_async(x))
    x[:] = 100
    assert [p.value().to_numpy()[0] for p in promises] == [0, -1, -2, -3, -4]


def test_other_layouts_byte_orders_and_subclasses_take_the_python_path(
    client: pjrt_py.Client,
) -> None:
    exe = negate(client, np.float32, (4,))
    base = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(exe.execute(base[::2]).to_numpy(), -base[::2])  # strided
    swapped = base[:4].astype(">f4")
    with pytest.raises(TypeError, match="compiled for"):
        exe.execute(swapped)  # a different dtype: refused, never read as little-endian
    np.testing.assert_array_equal(exe.execute(swapped.astype(np.float32)).to_numpy(), -base[:4])
    sub = base[:4].view(type("Sub", (np.ndarray,), {}))
    np.testing.assert_array_equal(exe.execute(sub).to_numpy(), -base[:4])
    with pytest.raises(TypeError, match="compiled for"):
        exe.execute(np.ones(5, np.float32))


def test_numpy_arguments_from_threads(client: pjrt_py.Client) -> None:
    exe = negate(client, np.float32, (8,))

    def worker(k: int) -> None:
        for i in range(200):
            x = np.full(8, k * 1000 + i, np.float32)
            assert exe.execute_async(x).value().to_numpy()[0] == -(k * 1000 + i)

    assert not in_threads(worker, 8)


def test_a_closed_client_or_deleted_executable_is_refused(client: pjrt_py.Client) -> None:
    other = pjrt_py.Client()
    exe = negate(other, np.float32, (8,))
    exe.delete()
    with pytest.raises(ValueError, match="deleted"):
        exe.execute_async(np.ones(8, np.float32))
    exe = negate(other, np.float32, (8,))
    other.close()
    with pytest.raises(ValueError, match="closed"):
        exe.execute_async(np.ones(8, np.float32))


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_subclasses_are_their_data_and_masked_arrays_are_refused(
    client: pjrt_py.Client, tmp_path: Any
) -> None:
    # jax.jit takes a memmap or a matrix as its data; pjrt_py.jit refused
    # every ndarray subclass. A masked array lost its mask without a word in
    # execute and client.buffer; jax refuses it, and so does pjrt_py now.
    mapped = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="w+", shape=(4,))
    mapped[:] = [1, 2, 3, 4]
    jitted = pjrt_py.jit(lambda x: -x, client=client)
    for sub in (mapped, np.matrix([[1.0, 2.0]], np.float32)):
        np.testing.assert_array_equal(jitted(sub).to_numpy(), -np.asarray(sub))
    masked = np.ma.array(np.ones(4, np.float32), mask=[0, 1, 0, 0])
    exe = negate(client, np.float32, (4,))
    for call in (
        lambda: jitted(masked),
        lambda: exe.execute(masked),
        lambda: exe.execute_async(masked),
        lambda: client.buffer(masked),
        lambda: client.buffer_async(masked),
        lambda: client.from_dlpack(masked),
    ):
        with pytest.raises(ValueError, match="masked arrays are not taken"):
            call()
    np.testing.assert_array_equal(exe.execute(masked.filled(0)).to_numpy(), [-1, 0, -1, -1])
