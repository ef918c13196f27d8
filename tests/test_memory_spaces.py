"""Memory spaces on the real CPU plugin builds: what each reports, placing
buffers in a memory, and copies between memories."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ADD_F32_8, installed_build, needs_memory_kinds, run_python

import pjrt_py

# What all three CPU builds report (docs/interop.md): each device has one
# memory of each kind, "device" first and the default.
CPU_KINDS = ["device", "pinned_host", "unpinned_host"]


def test_each_device_reports_its_memories(client: pjrt_py.Client) -> None:
    # What any plugin reports; the CPU builds' own list is checked below
    # (test_every_cpu_build_offers_the_same_memories).
    kinds = [m.kind for m in client.default_device.memories]
    for device in client.addressable_devices:
        memories = device.memories
        assert [m.kind for m in memories] == kinds
        assert len(set(kinds)) == len(kinds)
        assert device.default_memory in memories
        for m in memories:
            assert m.devices == [device]
            assert m.kind_id is not None
            assert m.kind in repr(m) and m.debug_string
            assert device.memory(m.kind) is m
    every = client.memories
    assert len(every) == len(kinds) * len(client.addressable_devices)
    assert len({m.id for m in every}) == len(every)
    assert {m.kind for m in every} == set(kinds)


@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("kind", CPU_KINDS)
def test_buffers_placed_in_each_memory(client: pjrt_py.Client, kind: str) -> None:
    needs_memory_kinds(client, kind)
    x = np.arange(64, dtype=np.float32)
    device = client.addressable_devices[1]
    buf = client.buffer(x, device, memory=kind)
    assert buf.memory is device.memory(kind)
    assert buf.device == device
    np.testing.assert_array_equal(buf.to_numpy(), x)
    by_object = client.buffer(x, device, memory=device.memory(kind))
    assert by_object.memory.kind == kind
    assert client.buffer(x).memory is client.default_device.default_memory


@pytest.mark.needs_devices(3)
@pytest.mark.needs_memory_kinds(*CPU_KINDS)
def test_copies_between_memories_keep_the_data(client: pjrt_py.Client) -> None:
    x = np.random.default_rng(3).standard_normal(1000)
    buf = client.buffer(x)
    for src in CPU_KINDS:
        for dst in CPU_KINDS:
            moved = client.buffer(x, memory=src).copy_to_memory(dst)
            assert moved.memory.kind == dst
            np.testing.assert_array_equal(moved.to_numpy(), x)
    promise = buf.copy_to_memory_async(client.default_device.memory("pinned_host"))
    np.testing.assert_array_equal(promise.value().to_numpy(), x)
    other_device = client.addressable_devices[2].memory("device")
    moved = buf.copy_to_memory(other_device)
    assert moved.device == client.addressable_devices[2]


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_a_copy_of_a_buffer_stays_in_its_memory(client: pjrt_py.Client, kind: str) -> None:
    # copy.copy of a pinned_host buffer was made in device memory (a
    # helper's fuzz); a jax.Array's copy keeps its memory kind.
    import copy  # noqa: PLC0415

    needs_memory_kinds(client, kind)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = client.buffer(x, memory=kind)
    for copier in (copy.copy, copy.deepcopy):
        twin = copier(buf)
        assert twin is not buf and twin.memory.kind == kind and twin.device == buf.device
        buf_was = buf.to_numpy()
        twin.delete()
        np.testing.assert_array_equal(buf_was, x)
        np.testing.assert_array_equal(buf.to_numpy(), x)


@pytest.mark.parametrize("form", ["execute", "execute_async", "execute_sharded"])
@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host"])
def test_an_argument_in_another_memory_is_refused_before_dispatch(
    client: pjrt_py.Client, kind: str, form: str
) -> None:
    # Decision (docs/devices.md): no implicit copy between memories; a GPU
    # plugin would fail the call inside it (RuntimeProgramInputMismatch).
    needs_memory_kinds(client, kind)
    exe = client.compile(ADD_F32_8)
    x = np.arange(8, dtype=np.float32)
    other = client.buffer(x, memory=kind)
    here = client.buffer(x)
    message = f"argument 1 is in '{kind}' memory; the program reads it from 'device' memory"
    for given in (other, client.buffer_async(x, memory=kind)):  # a promise of it too
        with pytest.raises(ValueError, match=f"{message} .*copy_to_memory"):
            if form == "execute_sharded":
                exe.execute_sharded([[here, given]])
            else:
                getattr(exe, form)(here, given)
    moved = other.copy_to_memory(client.default_device.default_memory)
    out = exe.execute(here, moved)
    np.testing.assert_array_equal(out.to_numpy(), 2 * x)
    assert out.memory.kind == "device"


HOST_PARAMETER = """
func.func @main(%x: tensor<8xf32> {mhlo.memory_kind = "pinned_host"}, %y: tensor<8xf32>)
    -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


@pytest.mark.needs_memory_kinds("pinned_host")
def test_a_parameter_with_a_memory_kind_is_read_from_that_memory(client: pjrt_py.Client) -> None:
    # jax's host offloading marks a parameter {mhlo.memory_kind = "pinned_host"}.
    exe = client.compile(HOST_PARAMETER)
    assert [s.memory_kind for s in exe.input_signature] == ["pinned_host", None]
    x = np.arange(8, dtype=np.float32)
    pinned, here = client.buffer(x, memory="pinned_host"), client.buffer(x)
    np.testing.assert_array_equal(exe.execute(pinned, here).to_numpy(), 2 * x)
    np.testing.assert_array_equal(exe.execute(x, x).to_numpy(), 2 * x)  # numpy goes there
    with pytest.raises(ValueError, match="argument 0 is in 'device' memory; .* 'pinned_host'"):
        exe.execute_async(here, here)
    with pytest.raises(ValueError, match="argument 1 is in 'pinned_host' memory; .* 'device'"):
        exe.execute(pinned, pinned)
    again = client.deserialize(exe.serialize())
    assert [s.memory_kind for s in again.input_signature] == ["pinned_host", None]


@pytest.mark.needs_host_buffers(memory="pinned_host")
def test_host_memory_buffers_are_dlpack_sources(client: pjrt_py.Client) -> None:
    pinned = client.buffer(np.arange(8, dtype=np.float32), memory="pinned_host")
    view = np.from_dlpack(pinned)
    assert view.ctypes.data == pinned.unsafe_pointer()


@pytest.mark.needs_devices(2)
@pytest.mark.needs_memory_kinds("pinned_host")
def test_bad_memories_are_refused(client: pjrt_py.Client) -> None:
    device0, device1 = client.addressable_devices[:2]
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="no memory of kind 'hbm'"):
        client.buffer(x, memory="hbm")
    with pytest.raises(ValueError, match="not addressable by"):
        client.buffer(x, device0, memory=device1.memory("device"))
    with pytest.raises(TypeError, match="memory must be"):
        client.buffer(x, memory=3)
    other = pjrt_py.Client()
    with pytest.raises(ValueError, match="another client"):
        client.buffer(x, memory=other.default_device.memory("device"))
    buf = client.buffer(x)
    with pytest.raises(ValueError, match="another client"):
        buf.copy_to_memory(other.default_device.memory("device"))
    with pytest.raises(TypeError, match="memory must be"):
        buf.copy_to_memory(None)
    with pytest.raises(ValueError, match="no memory of kind"):
        buf.copy_to_memory("hbm")
    buf.delete()
    with pytest.raises(ValueError, match="deleted"):
        buf.copy_to_memory("pinned_host")
    with pytest.raises(ValueError, match="deleted"):
        _ = buf.memory


@pytest.mark.parametrize("build", ["fastatomstruct-xla-cpu", "xla-cpu-pjrt", "lammps-jax-pjrt-cpu"])
def test_every_cpu_build_offers_the_same_memories(build: str) -> None:
    if installed_build(build) is None:
        pytest.skip(f"the {build} plugin (in the test extra) is not installed")
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        c = pjrt_py.Client({build!r})
        d = c.addressable_devices[0]
        print([m.kind for m in d.memories], d.default_memory.kind, len(c.memories))
        b = c.buffer(np.ones(3), memory="unpinned_host").copy_to_memory("pinned_host")
        print(b.memory.kind, b.to_numpy().sum())
        """
    )
    assert result.returncode == 0, result.stderr
    assert f"{CPU_KINDS} device {3 * 4}" in result.stdout
    assert "pinned_host 3.0" in result.stdout
