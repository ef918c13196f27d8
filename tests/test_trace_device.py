"""Device activity in pjrt_py.trace: plugins' PJRT profiler extension, merged XSpace."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ADD_F32_8, gpu_client_or_skip

import pjrt_py
from pjrt_py import device_trace, tracing, xspace
from pjrt_py.runtime import plugin as plugin_mod
from pjrt_py.runtime import profiler

X = np.ones(8, np.float32)


def _document(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _profiler_plugin() -> plugin_mod.Plugin:
    """An installed plugin with the profiler extension (a session needs no device)."""
    for info in pjrt_py.plugins():
        try:
            plugin = plugin_mod.load_plugin(info.path)
        except Exception:  # noqa: BLE001 - a build that does not load here has no say
            continue
        if profiler.available(plugin):
            return plugin
    pytest.skip(
        "needs an installed plugin with the PJRT profiler extension "
        "(none of the CPU builds has one; jax-cuda13-pjrt does, and loads without a GPU)"
    )


def test_without_the_extension_host_spans_only_and_it_says_so(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    if profiler.available(client.plugin):
        pytest.skip("the plugin under test has the PJRT profiler extension")
    path = tmp_path / "run.json"
    with pjrt_py.trace(path) as recorder:
        client.compile(ADD_F32_8, cache=False).execute(X, X).to_numpy()
    document = _document(path)
    said = document["otherData"]["pjrt_py_device"]
    assert f"{client.plugin.path}: no PJRT profiler extension (host spans only)" in said
    assert "pjrt_py_xspace" not in document["otherData"]
    assert not Path(tracing.xplane_path(path)).exists() and recorder.xspaces == []
    assert {e["pid"] for e in document["traceEvents"]} == {os.getpid()}


def test_a_jax_profile_merges_onto_our_timeline(
    client: pjrt_py.Client, add_exe: pjrt_py.Executable, tmp_path: Path
) -> None:
    jax = pytest.importorskip("jax")
    jaxlib_profiler = pytest.importorskip("jaxlib._profiler")
    double = jax.jit(lambda a: a * 2)
    double(X).block_until_ready()
    path = tmp_path / "both.json"
    with pjrt_py.trace(path) as recorder:
        add_exe.execute(X, X)
        session = jaxlib_profiler.ProfilerSession()
        double(X).block_until_ready()
        data = session.stop()
        add_exe.execute(X, X)
        recorder.add_xspace(data, source="jax")
        session = jaxlib_profiler.ProfilerSession()  # a second record: a file of its own
        double(X).block_until_ready()
        again = session.stop()
        recorder.add_xspace(again, source="jax")
    document = _document(path)
    events = document["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes[os.getpid()] == "pjrt_py (host)"
    assert "jax /host:CPU" in processes.values()
    threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    timed = [e for e in events if e["ph"] == "X"]
    assert all((e["pid"], e["tid"]) in threads for e in timed)  # every row is named
    # one span per execute (its own execute_async is part of it)
    first, second = sorted(
        (e for e in timed if e["cat"] == "dispatch" and e["name"] == "main"), key=lambda e: e["ts"]
    )
    calls = sorted(
        (e for e in timed if e["name"].startswith("PjitFunction(")), key=lambda e: e["ts"]
    )
    assert len(calls) == 4 and {c["cat"] for c in calls} == {"profiler host"}
    assert first["ts"] + first["dur"] <= calls[0]["ts"]  # in the order they ran
    assert calls[1]["ts"] + calls[1]["dur"] <= second["ts"] < calls[2]["ts"]
    written = document["otherData"]["pjrt_py_xspace"].split(", ")
    assert written == [str(tmp_path / "both.xplane.pb"), str(tmp_path / "both.2.xplane.pb")]
    assert written == [tracing.xplane_path(path, i) for i in range(2)]
    assert [Path(w).read_bytes() for w in written] == [data, again]


def test_no_recording_and_no_listener_outside_a_block(client: pjrt_py.Client) -> None:
    with pjrt_py.trace():
        assert device_trace._on_load in plugin_mod.LOAD_LISTENERS
    assert device_trace._targets == [] and device_trace._sessions == []
    assert device_trace._on_load not in plugin_mod.LOAD_LISTENERS
    with pjrt_py.trace(device=False) as recorder:
        assert device_trace._targets == []
    assert recorder.notes == ["device activity not asked for (trace(device=False))"]


def test_an_interrupted_collection_still_restores_and_writes(
    add_exe: pjrt_py.Executable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collect = device_trace.close_block

    def interrupted(target: Any) -> None:
        collect(target)
        raise KeyboardInterrupt  # Ctrl-C while the device record was read

    monkeypatch.setattr(device_trace, "close_block", interrupted)
    with pytest.raises(KeyboardInterrupt), pjrt_py.trace(tmp_path / "cut.json"):
        add_exe.execute(X, X)
    assert "execute_async" not in pjrt_py.Executable.__dict__  # the originals are back
    assert any(e.get("cat") == "dispatch" for e in _document(tmp_path / "cut.json")["traceEvents"])


def test_profile_options_refuse_levels_out_of_range() -> None:
    assert profiler.profile_options(host_tracer_level=0, device_tracer_level=0) == b"\x28\x01"
    with pytest.raises(ValueError, match="host_tracer_level"):
        profiler.profile_options(host_tracer_level=4)
    with pytest.raises(ValueError, match="device_tracer_level"):
        profiler.profile_options(device_tracer_level=-1)


def test_a_plugin_without_the_extension_refuses_a_session(client: pjrt_py.Client) -> None:
    if profiler.available(client.plugin):
        pytest.skip("the plugin under test has the PJRT profiler extension")
    with pytest.raises(ValueError, match="no usable PJRT profiler extension"):
        profiler.Session(client.plugin)


# ---- a real profiler extension (a plugin that has one; no device needed) ---


def test_a_session_runs_in_order_and_only_in_order() -> None:
    plugin = _profiler_plugin()
    session = profiler.Session(plugin)
    assert session.state == "created"
    with pytest.raises(RuntimeError, match="the session is created, not started"):
        session.finish()
    assert session.state == "closed"
    session = profiler.Session(plugin)
    session.start()
    with pytest.raises(RuntimeError, match="started, not created"):
        session.start()
    data, space = device_trace.plugin_xspace(session.finish())
    assert isinstance(space, xspace.XSpace) and session.state == "closed"
    session.close()  # idempotent
    profiler.Session(plugin).start()  # dropped while recording: stopped, destroyed


def test_info_says_traces_hold_device_activity(capsys: pytest.CaptureFixture[str]) -> None:
    plugin = _profiler_plugin()
    from pjrt_py.cli import info

    info.command(argparse.Namespace(plugin=plugin.path))
    assert "  traces: host spans and device activity (PJRT profiler extension)" in (
        capsys.readouterr().out
    )


def test_one_recording_per_plugin_and_the_trace_names_the_refusal(tmp_path: Path) -> None:
    plugin = _profiler_plugin()
    first = profiler.Session(plugin)
    first.start()
    try:
        with pjrt_py.trace(tmp_path / "t.json"):
            pass
    finally:
        first.close()
    said = _document(tmp_path / "t.json")["otherData"]["pjrt_py_device"]
    assert f"{plugin.path}: the profiler did not start: " in said
    with pjrt_py.trace(tmp_path / "u.json"):
        pass
    said = _document(tmp_path / "u.json")["otherData"]["pjrt_py_device"]
    assert f"{plugin.path}: " in said and "device trace events on" in said


def test_overlapping_blocks_share_one_recording_and_restart_it() -> None:
    plugin = _profiler_plugin()
    with pjrt_py.trace() as outer:
        (first,) = [s for s in device_trace._sessions if s.plugin is plugin]
        with pjrt_py.trace() as inner:
            assert [s for s in device_trace._sessions if s.plugin is plugin] == [first]
        # the inner block's end stopped the recording and started the next
        (second,) = [s for s in device_trace._sessions if s.plugin is plugin]
        assert second is not first and second.state == "started" and first.state == "closed"
    assert second.state == "closed"
    for recorder in (outer, inner):
        mine = [n for n in recorder.notes if n.startswith(plugin.path)]
        assert mine and all("device trace events on" in n for n in mine), recorder.notes


def test_threads_racing_on_one_session_get_errors_not_crashes() -> None:
    plugin = _profiler_plugin()
    session = profiler.Session(plugin)
    seen: set[str] = set()

    def race() -> None:
        for _ in range(200):
            for step in (session.start, session.finish, session.close):
                try:
                    step()
                except RuntimeError as e:
                    seen.add(str(e).split(":")[0])

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert session.state == "closed" and seen <= {
        "profiler start",
        "profiler stop",
        "profiler close",
    }


def test_a_forked_child_cannot_use_the_parents_session() -> None:
    plugin = _profiler_plugin()
    script = f"""
import os, pjrt_py
from pjrt_py.runtime import plugin as p, profiler
session = profiler.Session(p.load_plugin({plugin.path!r}))
session.start()
pid = os.fork()
if pid == 0:
    try:
        session.finish()
    except RuntimeError as e:
        os._exit(0 if "before os.fork()" in str(e) else 1)
    os._exit(2)
_, status = os.waitpid(pid, 0)
session.close()
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_exiting_with_a_recording_session_is_clean() -> None:
    plugin = _profiler_plugin()
    script = f"""
import threading, pjrt_py
from pjrt_py.runtime import plugin as p, profiler
kept = profiler.Session(p.load_plugin({plugin.path!r}))
kept.start()  # still recording at exit
opened = threading.Event()
def block():
    with pjrt_py.trace():
        opened.set()
        threading.Event().wait()  # a daemon thread's block never ends
threading.Thread(target=block, daemon=True).start()
opened.wait()
print("exiting")
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True)
    assert done.returncode == 0 and done.stdout == b"exiting\n", done.stderr.decode()[-2000:]


# ---- on a GPU (runs where a CUDA plugin and a device are there) ------------

MATMUL = """
func.func @main(%a: tensor<512x512xf32>, %b: tensor<512x512xf32>) -> tensor<512x512xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]
       : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
  %1 = stablehlo.tanh %0 : tensor<512x512xf32>
  return %1 : tensor<512x512xf32>
}
"""


@pytest.mark.gpu
def test_device_events_of_a_gpu_program_are_in_the_trace(tmp_path: Path) -> None:
    client = gpu_client_or_skip()
    if not profiler.available(client.plugin):
        pytest.skip("needs a GPU plugin with the PJRT profiler extension")
    exe = client.compile(MATMUL)
    a = client.buffer(np.full((512, 512), 0.01, np.float32))
    exe.execute(a, a).to_numpy()  # warm: the trace holds the steady state
    path = tmp_path / "gpu.json"
    begin = time.perf_counter_ns() / 1000
    with pjrt_py.trace(path):
        for _ in range(5):
            out = exe.execute(a, a)
        out.to_numpy()
    end = time.perf_counter_ns() / 1000
    document = _document(path)
    events = document["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    gpu = {pid for pid, name in processes.items() if "/device:GPU:" in name}
    device = [e for e in events if e["ph"] == "X" and e["pid"] in gpu]
    assert gpu and len(device) >= 5, document["otherData"]
    assert all(e["dur"] >= 0 for e in device)
    slack = 1000  # us: the clock pairing, and CUPTI's own move onto the wall clock
    assert all(begin - slack <= e["ts"] and e["ts"] + e["dur"] <= end + slack for e in device)
    first_dispatch = min(e["ts"] for e in events if e.get("cat") == "dispatch")
    assert min(e["ts"] for e in device) >= first_dispatch - slack  # launched, then ran
    space = xspace.parse(Path(tracing.xplane_path(path)).read_bytes())
    assert any(p.name.startswith("/device:GPU:") for p in space.planes)
