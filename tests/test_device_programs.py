"""Copies to where a buffer already is, and the program that makes them where
the plugin will not (``pjrt_py/programs/device_programs.py``).

The CPU builds copy a buffer to its own device and memory themselves. XLA's
GPU client has refused that ("cannot accept the same source and destination
devices"); pjrt_py then copies with an identity program on the device. The
program is tested here directly on every plugin, and the copies through the
public calls on whatever plugin runs the suite (``tools/gpu_check.sh`` runs
this file on the GPU).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import queued_work, run_python

import pjrt_py
from pjrt_py.programs.device_programs import copy_on_device

VALUES = {
    "bool": np.array([[True, False, True], [False, False, True]]),
    "int4": np.array([-8, -1, 0, 7], ml_dtypes.int4),
    "uint8": np.arange(250, 256, dtype=np.uint8),
    "int64": np.array([-(2**63), 2**63 - 1], np.int64),
    "float4": np.array([0.5, -6, 1.5, 0], ml_dtypes.float4_e2m1fn),
    "float8": np.array([1.5, -0.0, np.nan], ml_dtypes.float8_e4m3fn),
    "bfloat16": np.array([[1.0, -2.5]], ml_dtypes.bfloat16),
    "float64": np.array([np.pi, -0.0, np.inf, np.nan]),
    "complex128": np.array([1 + 2j, -3.5j]),
    "scalar": np.array(3.25, np.float32),
    "empty": np.zeros((2, 0, 3), np.float32),
}


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("name", list(VALUES))
def test_the_copy_program_makes_a_new_buffer_with_the_same_bits(
    client: pjrt_py.Client, name: str
) -> None:
    x = VALUES[name]
    source = client.buffer(x)
    promise = copy_on_device(client, source)
    assert isinstance(promise, pjrt_py.BufferPromise)
    dup = promise.buffer()
    assert dup is not source and dup.device is source.device
    assert (dup.shape, dup.dtype) == (x.shape, x.dtype)
    if x.size:
        assert dup.unsafe_pointer() != source.unsafe_pointer()
    source.delete()
    assert bits(dup.to_numpy()) == bits(x)


def test_the_copy_program_does_not_wait_for_its_source(client: pjrt_py.Client) -> None:
    running, queued = queued_work(client)
    promise = copy_on_device(client, queued.buffer())
    assert not running.is_ready()  # dispatched behind the work, no wait
    np.testing.assert_array_equal(promise.value().to_numpy(), queued.value().to_numpy())


def test_the_copy_program_refuses_a_buffer_outside_the_default_memory(
    client: pjrt_py.Client,
) -> None:
    device = client.devices[0]
    others = [m for m in device.memories if m != device.default_memory]
    if not others:
        pytest.skip("the device has one memory: no buffer can be outside its default")
    source = client.buffer(np.ones(4, np.float32), memory=others[0])
    with pytest.raises(ValueError, match="memory"):
        copy_on_device(client, source)


COPIES: dict[str, Callable[[pjrt_py.Buffer], Any]] = {
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "copy_to_device": lambda b: b.copy_to_device(b.device),
    "copy_to_device_async": lambda b: b.copy_to_device_async(b.device).value(),
    "copy_to_memory": lambda b: b.copy_to_memory(b.memory),
}


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_to_where_a_buffer_is_is_a_new_buffer(client: pjrt_py.Client, how: str) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    source = client.buffer(x)
    dup = COPIES[how](source)
    assert isinstance(dup, pjrt_py.Buffer) and dup is not source
    assert dup.device is source.device and dup.memory == source.memory
    assert dup.unsafe_pointer() != source.unsafe_pointer()
    source.delete()
    np.testing.assert_array_equal(dup.to_numpy(), x)


def test_a_dlpack_copy_is_memory_no_one_else_sees(client: pjrt_py.Client) -> None:
    x = np.arange(6, dtype=np.int32)
    source = client.buffer(x)
    capsule = source.__dlpack__(copy=True, max_version=(1, 1))
    if source.__dlpack_device__()[0] == 1:  # kDLCPU: numpy can read it here
        view = np.from_dlpack(_Capsule(capsule, source.__dlpack_device__()))
        assert view.ctypes.data != source.unsafe_pointer()
        source.delete()
        np.testing.assert_array_equal(view, x)


class _Capsule:
    """A capsule given out once, as a producer object numpy can take."""

    def __init__(self, capsule: Any, device: tuple[int, int]) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **_: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def test_a_buffer_deleted_while_its_target_is_resolved_is_refused() -> None:
    # Resolving a copy's target runs Python (a memory kind is compared), which
    # may delete the buffer: the copy then read the dead buffer's client, a
    # segfault, found by a hostile review (and by two threads racing).
    result = run_python(
        """
        import numpy as np, pjrt_py
        c = pjrt_py.Client()
        b = c.buffer(np.arange(6.0).reshape(2, 3))

        class Kind(str):
            def __eq__(self, other):
                b.delete()
                return str.__eq__(self, other)

            __hash__ = str.__hash__

        try:
            b.copy_to_memory(Kind("device"))
        except ValueError as e:
            print("refused:", e)
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused:" in result.stdout and "deleted" in result.stdout, result.stdout
