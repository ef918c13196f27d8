"""pjrt_py.xspace against real XSpace bytes (jax's profiler on the CPU) and hostile ones."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pjrt_py import device_trace, xspace

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
_profiler = pytest.importorskip("jaxlib._profiler")  # its session returns XSpace bytes


@jax.jit
def scaled_sine(x: Any) -> Any:
    return jnp.sin(x) @ x.T


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    """One jax profiler session around one call, timed on our clock too."""
    x = jnp.ones((64, 64), jnp.float32)
    scaled_sine(x).block_until_ready()  # compiled outside the session
    offset = device_trace.clock_offset_ns()
    session = _profiler.ProfilerSession()
    before = time.perf_counter_ns()
    scaled_sine(x).block_until_ready()
    after = time.perf_counter_ns()
    data = session.stop()
    return {"data": data, "offset": offset, "before": before, "after": after}


def test_it_reads_what_jaxs_own_reader_reads(recorded: dict[str, Any]) -> None:
    space = xspace.parse(recorded["data"])
    theirs = jax.profiler.ProfileData.from_serialized_xspace(recorded["data"])
    assert [p.name for p in space.planes] == [p.name for p in theirs.planes]
    for mine, plane in zip(space.planes, theirs.planes, strict=True):
        assert [ln.name for ln in mine.lines] == [ln.name for ln in plane.lines]
        for line, their_line in zip(mine.lines, plane.lines, strict=True):
            got = [
                (mine.event_name(e), line.timestamp_ns + e.offset_ps / 1000, e.duration_ps / 1000)
                for e in line.events
            ]
            want = [(e.name, e.start_ns, e.duration_ns) for e in their_line.events]
            assert got == want
    assert sum(len(line.events) for p in space.planes for line in p.lines) > 5


def test_the_jitted_function_and_its_ops_are_there(recorded: dict[str, Any]) -> None:
    space = xspace.parse(recorded["data"])
    (host,) = [p for p in space.planes if p.name == "/host:CPU"]
    named = {host.event_name(e): (line, e) for line in host.lines for e in line.events}
    assert "PjitFunction(scaled_sine)" in named
    modules = {
        host.stats_dict(e.stats).get("hlo_module") for line in host.lines for e in line.events
    }
    assert "jit_scaled_sine" in modules  # the XLA ops the CPU client ran for it
    for line in host.lines:
        spans = [e for e in line.events if e.duration_ps > 0]
        assert all(e.duration_ps > 0 and e.offset_ps >= 0 for e in spans)


def test_children_sit_inside_their_parents(recorded: dict[str, Any]) -> None:
    space = xspace.parse(recorded["data"])
    events = device_trace.chrome_events(space, offset_ns=recorded["offset"], source="jax")
    timed = [e for e in events if e["ph"] == "X"]
    calls = [e for e in timed if e["name"] == "PjitFunction(scaled_sine)"]
    assert calls
    outer = max(calls, key=lambda e: e["dur"])
    inside = [
        e
        for e in timed
        if e is not outer and (e["pid"], e["tid"]) == (outer["pid"], outer["tid"])
        if outer["ts"] <= e["ts"] < outer["ts"] + outer["dur"]
    ]
    assert inside  # the call's own steps, on its thread
    assert all(e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + 1e-3 for e in inside)
    for key in {(e["pid"], e["tid"]) for e in timed}:
        line = [(e["ts"], -e["dur"]) for e in timed if (e["pid"], e["tid"]) == key]
        assert line == sorted(line)  # by start, parents first


def test_events_land_on_our_clock(recorded: dict[str, Any]) -> None:
    # jax's session counts from its start (the Task Environment plane); the
    # events go back onto the wall clock, then onto perf_counter.
    space = xspace.parse(recorded["data"])
    events = device_trace.chrome_events(space, offset_ns=recorded["offset"], source="jax")
    call = max(
        (e for e in events if e["name"] == "PjitFunction(scaled_sine)"), key=lambda e: e["dur"]
    )
    slack_us = 50  # the clock pairing's window, and the call's way in and out of jax
    assert recorded["before"] / 1000 - slack_us <= call["ts"]
    assert call["ts"] + call["dur"] <= recorded["after"] / 1000 + slack_us


def test_jaxs_profile_options_use_the_field_numbers_we_send(recorded: dict[str, Any]) -> None:
    space = xspace.parse(recorded["data"])
    (env,) = [p for p in space.planes if p.name == "Task Environment"]
    stored = env.stats_dict(env.stats)["profile_options"]
    assert isinstance(stored, bytes)
    theirs = {n: v for n, _, v, _ in xspace._fields(stored, 0, len(stored), "ProfileOptions")}
    from pjrt_py.runtime.profiler import profile_options

    ours = profile_options()
    mine = {n: v for n, _, v, _ in xspace._fields(ours, 0, len(ours), "ProfileOptions")}
    # host_tracer_level 2, device_tracer_level 1, version 1: jax's defaults
    assert mine == {n: theirs[n] for n in (2, 3, 5)} == {2: 2, 3: 1, 5: 1}


def test_a_jax_profile_file_reads(tmp_path: Path) -> None:
    x = jnp.ones((8, 8), jnp.float32)
    scaled_sine(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        scaled_sine(x).block_until_ready()
    (path,) = tmp_path.rglob("*.xplane.pb")
    space = xspace.parse(path.read_bytes())
    assert space.hostnames and "/host:CPU" in [p.name for p in space.planes]


# ---- hostile bytes ---------------------------------------------------------


def _parses_or_refuses(data: bytes) -> None:
    try:
        xspace.parse(data)
    except ValueError as e:
        assert str(e).startswith("XSpace: ")


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=1 << 20))
def test_any_truncation_parses_or_raises_value_error(recorded: dict[str, Any], cut: int) -> None:
    data = recorded["data"]
    _parses_or_refuses(data[: cut % (len(data) + 1)])


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_corrupted_bytes_parse_or_raise_value_error(recorded: dict[str, Any], data: Any) -> None:
    raw = bytearray(recorded["data"])
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    _parses_or_refuses(bytes(raw))


@settings(max_examples=500)
@given(st.binary(max_size=512))
def test_random_bytes_parse_or_raise_value_error(data: bytes) -> None:
    _parses_or_refuses(data)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\x0a\xff\xff\xff\xff\x0f", "bytes long"),  # a plane of 4 GiB in 6 bytes
        (b"\x0a" + b"\xff" * 11, "longer than 10 bytes"),
        (b"\x0a\x80", "cut short"),
        (b"\x0b", "a group"),  # field 1, wire type 3
        (b"\x0f", "invalid"),  # wire type 7
        (b"\x08\x01", "wire type 0, the schema says 2"),  # planes as a varint
        (b"\x0a\x02\x12\x05", "bytes long"),  # a plane whose name runs past the plane
        (b"\x00", "field number 0"),
    ],
)
def test_malformed_messages_say_what_is_wrong(data: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        xspace.parse(data)


def test_deep_nesting_is_not_recursed_into() -> None:
    # 5,000 messages each holding the next as an unknown field of a plane:
    # skipped as bytes, never descended into.
    inner = b""
    for _ in range(5000):
        inner = b"\x7a" + _varint(len(inner)) + inner  # field 15, length-delimited
    plane = xspace.parse(b"\x0a" + _varint(len(inner)) + inner).planes[0]
    assert plane.lines == [] and plane.name == ""


def test_a_trailing_zero_from_the_plugin_is_dropped(recorded: dict[str, Any]) -> None:
    # XLA's plugin profiler hands over one zero byte past the message.
    data, space = device_trace.plugin_xspace(recorded["data"] + b"\0")
    assert data == recorded["data"] and space.planes
    with pytest.raises(ValueError):
        device_trace.plugin_xspace(recorded["data"] + b"\0\0")
    with pytest.raises(TypeError):
        xspace.parse("text")  # type: ignore[arg-type]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])
