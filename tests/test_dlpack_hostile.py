"""Malformed DLPack tensors, as a buggy producer could hand over: each gets a
clear exception before the plugin sees it, and its deleter still runs once."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import numpy as np
import pytest
from conftest import child_code, forwarding_plugin, run_python

import pjrt_py


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Managed(ctypes.Structure):  # DLManagedTensorVersioned
    _fields_ = [
        ("version", Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("tensor", Tensor),
    ]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Producer:
    """A DLPack producer whose tensor says whatever a test wants."""

    def __init__(self, shape, code=2, bits=32, lanes=1, data=True, device=1, major=1):  # type: ignore[no-untyped-def]
        self.deleted = 0
        self.memory = pjrt_py.aligned_empty(1024, np.uint8)
        self.shape = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        m = Managed()
        m.version = Version(major, 1)
        m.tensor.data = self.memory.ctypes.data if data else None
        m.tensor.device_type, m.tensor.device_id = device, 0
        m.tensor.ndim = len(shape)
        m.tensor.code, m.tensor.bits, m.tensor.lanes = code, bits, lanes
        m.tensor.shape = self.shape
        self._deleter = DELETER(self._delete)  # kept alive with the producer
        m.deleter = self._deleter
        self.managed = m

    def _delete(self, _: int) -> None:
        self.deleted += 1

    def __dlpack__(self, **_: object) -> object:
        return _new_capsule(ctypes.addressof(self.managed), b"dltensor_versioned", None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.managed.tensor.device_type, 0)


@pytest.mark.parametrize(
    ("producer", "error", "match"),
    [
        (lambda: Producer((4, -2)), BufferError, "negative dimension"),
        (lambda: Producer((1 << 40, 1 << 30)), BufferError, "too large"),
        (lambda: Producer((4,), code=2, bits=24), TypeError, "float24"),
        (lambda: Producer((4,), lanes=4), TypeError, "lanes"),
        (lambda: Producer((4,), code=17, bits=4), TypeError, "float4_e2m1fn"),
        (lambda: Producer((4,), data=False), BufferError, "NULL"),
        (lambda: Producer((4,), device=2), BufferError, "device type 2"),
    ],
)
def test_malformed_tensors_are_refused_and_released(
    client: pjrt_py.Client,
    producer,
    error,
    match,  # type: ignore[no-untyped-def]
) -> None:
    p = producer()
    with pytest.raises(error, match=match):
        client.from_dlpack(p)
    gc.collect()
    assert p.deleted == 1  # taken, then released exactly once


def test_an_unknown_major_version_is_not_taken(client: pjrt_py.Client) -> None:
    p = Producer((4,), major=2)
    with pytest.raises(BufferError, match="version 2.1"):
        client.from_dlpack(p)
    gc.collect()
    assert p.deleted == 0  # not ours: the producer's capsule keeps it


def test_rank_past_64_is_refused(client: pjrt_py.Client) -> None:
    p = Producer((1,) * 65)
    with pytest.raises(BufferError, match="rank 65"):
        client.from_dlpack(p)


def test_a_well_formed_foreign_tensor_is_viewed(client: pjrt_py.Client) -> None:
    p = Producer((16, 16))
    p.memory.view(np.float32)[:] = 2
    buf = client.from_dlpack(p)
    assert buf.unsafe_pointer() == p.memory.ctypes.data
    assert buf.to_numpy().sum() == 512
    assert p.deleted == 0
    del buf
    gc.collect()
    assert p.deleted == 1


class Legacy:
    """A producer from before DLPack 1.0: __dlpack__ takes only ``stream``."""

    def __init__(self) -> None:
        self.tensor = np.arange(16, dtype=np.float32)

    def __dlpack__(self, stream: object = None) -> object:
        return self.tensor.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def test_a_producer_older_than_dlpack_1_is_still_taken(client: pjrt_py.Client) -> None:
    buf = client.from_dlpack(Legacy())
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(16))
    add = client.compile(ADD_F32_16)
    np.testing.assert_array_equal(add.execute(Legacy(), Legacy()).to_numpy(), 2 * np.arange(16))


ADD_F32_16 = """
func.func @main(%x: tensor<16xf32>, %y: tensor<16xf32>) -> tensor<16xf32> {
  %0 = stablehlo.add %x, %y : tensor<16xf32>
  return %0 : tensor<16xf32>
}
"""


# XLA's GPU client wraps the pointer, callback included, before the steps of
# CreateViewOfDeviceBuffer that can fail (an unknown stream, an event), so a
# failed view runs on_delete_callback during the call. The CPU plugins check
# first, so this shim does it the GPU client's way: call back, then fail. The
# error is the real plugin's own, for a device id no build has (the builds
# differ on which view arguments they refuse: 0.115 takes any stream).
VIEW_FAILS_AFTER_CALLBACK = """
static PJRT_Error* (*real_lookup)(PJRT_Client_LookupDevice_Args*);

static PJRT_Error* view_fails(PJRT_Client_CreateViewOfDeviceBuffer_Args* args) {
  args->on_delete_callback(args->device_buffer_ptr, args->on_delete_callback_arg);
  PJRT_Client_LookupDevice_Args lookup = {0};
  lookup.struct_size = PJRT_Client_LookupDevice_Args_STRUCT_SIZE;
  lookup.client = args->client;
  lookup.id = 1 << 30;
  return real_lookup(&lookup);
}
"""


def test_a_view_whose_callback_runs_as_it_fails_is_released_once(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    edit = (
        "real_lookup = real->PJRT_Client_LookupDevice;"
        " api.PJRT_Client_CreateViewOfDeviceBuffer = view_fails;"
    )
    shim = forwarding_plugin(
        tmp_path, "view_fails", client.plugin.path, edit, VIEW_FAILS_AFTER_CALLBACK
    )
    # Before, the reference was dropped by the callback and again by the error
    # path: the producer's tensor was freed while pjrt_py still held it.
    result = run_python(
        child_code(
            f"""
            import gc, sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            import pjrt_py
            from test_dlpack_hostile import Producer
            shim = pjrt_py.Client(pjrt_py.load_plugin({str(shim)!r}))
            producers = [Producer((16,)) for _ in range(200)]
            refused = 0
            for p in producers:
                try:
                    shim.from_dlpack(p)
                except pjrt_py.PjrtError:
                    refused += 1
            gc.collect()
            print("refused", refused, "deleted", sorted({{p.deleted for p in producers}}))
            """
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused 200 deleted [1]" in result.stdout, result.stdout + result.stderr[-2000:]


def test_device_memory_is_never_read_as_a_numpy_array() -> None:
    # pjrt_py.jit once read a CUDA tensor's memory through numpy to narrow it;
    # the reader itself refuses memory that is not the host's.
    p = Producer((4,), device=2)  # kDLCUDA
    tensor = pjrt_py._core.dlpack_unpack(p.__dlpack__())
    with pytest.raises(BufferError, match="device type 2 is not in host memory"):
        tensor.as_array(np.float32)
    del tensor
    gc.collect()
    assert p.deleted == 1


def test_a_producer_that_cannot_say_its_device_is_named_with_its_reason(
    client: pjrt_py.Client,
) -> None:
    jnp = pytest.importorskip("jax.numpy", reason="a deleted jax array")
    gone = jnp.ones(4, jnp.float32)
    gone.delete()
    with pytest.raises(BufferError, match="has been deleted"):
        client.from_dlpack(gone)
    gone_int4 = jnp.ones(4, jnp.int4)  # taken through numpy, not DLPack
    gone_int4.delete()
    with pytest.raises(BufferError, match="has been deleted"):
        client.from_dlpack(gone_int4)

    class Refuses:
        def __dlpack__(self, **_: object) -> object:
            raise AssertionError("not reached")

        def __dlpack_device__(self) -> tuple[int, int]:
            raise ValueError("Unknown device type meta for Dlpack")

    with pytest.raises(BufferError, match=r"raised ValueError: Unknown device type meta"):
        client.from_dlpack(Refuses())
