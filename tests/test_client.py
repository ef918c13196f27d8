"""Clients and devices."""

from __future__ import annotations

import numpy as np
import pytest

import pjrt_py


def test_client_reports_platform_and_devices(client: pjrt_py.Client) -> None:
    assert isinstance(client.platform_name, str) and client.platform_name
    assert isinstance(client.platform_version, str) and client.platform_version
    assert client.process_index == 0
    assert len(client.devices) >= 1
    assert client.addressable_devices == client.devices  # one process: all addressable
    assert client.default_device is client.addressable_devices[0]


def test_devices_have_ids_kinds_and_a_readable_repr(client: pjrt_py.Client) -> None:
    ids = [d.id for d in client.devices]
    assert len(set(ids)) == len(ids)
    for d in client.devices:
        assert isinstance(d.kind, str) and d.kind
        assert d.is_addressable
        assert d.process_index == 0
        assert isinstance(d.local_hardware_id, int)
        assert isinstance(d.attributes, dict)
        assert repr(d).startswith(f"Device(id={d.id}, kind={d.kind!r}")
        assert d.platform == client.platform_name


@pytest.mark.needs_cpu_device_count  # the CPU plugin's option; a GPU plugin refuses it
def test_create_options_reach_the_plugin() -> None:
    two = pjrt_py.Client(options={"cpu_device_count": 2})
    assert len(two.devices) == 2
    three = pjrt_py.Client(options={"cpu_device_count": 3})
    assert len(three.devices) == 3
    # A numpy integer is an int (as jax takes it); a numpy bool is not.
    assert len(pjrt_py.Client(options={"cpu_device_count": np.int64(2)}).devices) == 2
    with pytest.raises(TypeError, match="takes an int"):
        pjrt_py.Client(options={"cpu_device_count": np.True_})


@pytest.mark.parametrize("options", [["cpu_device_count"], {"x": object()}, {1: 2}])
def test_bad_create_options_are_type_errors(options: object) -> None:
    with pytest.raises(TypeError):
        pjrt_py.Client(options=options)  # type: ignore[arg-type]


def test_close_is_idempotent_and_use_after_close_raises(add_text: str) -> None:
    c = pjrt_py.Client()
    buf = c.buffer([1.0, 2.0])
    exe = c.compile(add_text)
    with c:
        pass
    assert c.closed
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.compile(add_text)
    with pytest.raises(ValueError, match="closed"):
        c.buffer([1.0])
    with pytest.raises(ValueError, match="closed"):
        buf.to_numpy()
    with pytest.raises(ValueError, match="closed"):
        exe.execute_async(buf, buf)
    assert "closed" in repr(c)
    # What the buffer knows is still said (it used to be '<Buffer >').
    assert repr(buf) == "<Buffer float64[2], device unknown>"


def test_buffers_keep_the_client_alive(add_text: str) -> None:
    import gc

    import numpy as np

    c = pjrt_py.Client()
    platform = c.platform_name
    buf = c.buffer(np.arange(4, dtype=np.int32))
    exe = c.compile(add_text)
    del c
    gc.collect()
    assert buf.to_numpy().tolist() == [0, 1, 2, 3]
    assert exe.client.platform_name == platform


@pytest.fixture
def add_text() -> str:
    from conftest import ADD_F32_8

    return ADD_F32_8


def test_capability_skips_name_the_need_and_what_the_plugin_has(client: pjrt_py.Client) -> None:
    from conftest import capability_skip

    have = len(client.addressable_devices)
    reason = capability_skip(client, pytest.mark.needs_devices(have + 1).mark)
    assert reason == (
        f"needs {have + 1} addressable devices; the {client.platform_name} plugin has {have}"
    )
    assert capability_skip(client, pytest.mark.needs_devices(have).mark) is None
    reason = capability_skip(client, pytest.mark.needs_memory_kinds("hbm").mark)
    assert reason is not None and reason.startswith("needs memory kind(s) ['hbm']; the ")
