"""pjrt_py.trace: spans of pjrt_py's own work, written as Chrome trace JSON."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ADD_F32_8

import pjrt_py
from pjrt_py import _core, tracing

X = np.ones(8, np.float32)
PATCHED = [
    (pjrt_py.Client, "compile"),
    (pjrt_py.Client, "buffer_async"),
    (pjrt_py.Executable, "execute_async"),
    (_core.Buffer, "to_numpy"),
    (_core.Promise, "value"),
]


def _spans(path: Path) -> list[dict[str, Any]]:
    document = json.loads(path.read_text())
    assert document["displayTimeUnit"] == "ms"
    return [e for e in document["traceEvents"] if e["ph"] == "X"]


def _inside(inner: dict[str, Any], outer: dict[str, Any]) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def test_spans_nest_and_follow_the_calls(client: pjrt_py.Client, tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    with pjrt_py.trace(path):
        exe = client.compile(ADD_F32_8, cache=False)
        x = client.buffer(X)
        out = exe.execute(x, x)
        np.testing.assert_array_equal(out.to_numpy(), X + X)
    spans = _spans(path)
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_cat.setdefault(s["cat"], []).append(s)
    assert {"compile", "transfer", "dispatch", "wait"} <= set(by_cat)
    (compile_span,) = by_cat["compile"]
    # One span per call: execute's own execute_async is part of it (it used
    # to be a second dispatch span, which double-counted synchronous calls).
    (execute,) = by_cat["dispatch"]
    assert compile_span["ts"] + compile_span["dur"] <= execute["ts"]  # compiled, then run
    assert any(_inside(w, execute) for w in by_cat["wait"])  # the wait shows inside
    assert execute["name"] == "main" and execute["args"]["arguments"] == ["float32[8]"] * 2
    to_host = [s for s in by_cat["transfer"] if s["name"] == "to host"]
    assert to_host and to_host[-1]["ts"] >= execute["ts"] + execute["dur"]


def test_nothing_is_recorded_or_changed_outside_a_block(
    client: pjrt_py.Client, add_exe: pjrt_py.Executable
) -> None:
    before = {(cls, name): cls.__dict__.get(name) for cls, name in PATCHED}
    with pjrt_py.trace() as recorder:
        assert all(cls.__dict__.get(name) is not before[cls, name] for cls, name in PATCHED)
        add_exe.execute(X, X)
    count = len(recorder.events)
    add_exe.execute(X, X)
    client.buffer(X).to_numpy()
    assert len(recorder.events) == count > 0
    assert {(cls, name): cls.__dict__.get(name) for cls, name in PATCHED} == before


def test_callbacks_are_spans_on_their_thread(client: pjrt_py.Client, tmp_path: Path) -> None:
    if not client.plugin.supports("PJRT_Client_Compile") or "ffi" not in client.plugin.extensions:
        pytest.skip("needs a plugin with the PJRT FFI extension (host callbacks)")
    pjrt_py.register_callback("pjrt_py_trace_twice", lambda a: a * 2, client=client)
    program = ADD_F32_8.replace(
        "stablehlo.add %x, %y",
        "stablehlo.custom_call @pjrt_py_trace_twice(%x) {api_version = 4 : i32} : "
        "(tensor<8xf32>) -> tensor<8xf32>\n  %1 = stablehlo.add %0, %y",
    ).replace("return %0", "return %1")
    exe = client.compile(program)
    path = tmp_path / "cb.json"
    with pjrt_py.trace(path):
        np.testing.assert_array_equal(exe.execute(X, X).to_numpy(), 3 * X)
    spans = _spans(path)
    (callback,) = [s for s in spans if s["cat"] == "callback"]
    assert callback["name"] == "pjrt_py_trace_twice"
    execute = max((s for s in spans if s["cat"] == "dispatch"), key=lambda s: s["dur"])
    assert _inside(callback, execute)
    # Outside the block the callback runs unobserved, and still right.
    np.testing.assert_array_equal(exe.execute(X, X).to_numpy(), 3 * X)


def test_blocks_nest_overlap_and_survive_exceptions(
    add_exe: pjrt_py.Executable, tmp_path: Path
) -> None:
    path = tmp_path / "failed.json"
    with pytest.raises(ZeroDivisionError), pjrt_py.trace(path) as outer:
        with pjrt_py.trace() as inner:
            add_exe.execute(X, X)
        add_exe.execute(X, X)
        1 / 0  # noqa: B018
    assert 0 < len(inner.events) < len(outer.events)
    assert len(_spans(path)) == len(outer.events)
    assert "execute_async" not in pjrt_py.Executable.__dict__


def test_every_thread_is_recorded(add_exe: pjrt_py.Executable) -> None:
    together = threading.Barrier(4)  # all alive at once: no thread id is reused

    def work() -> None:
        together.wait()
        for _ in range(20):
            add_exe.execute(X, X)
        together.wait()

    with tracing.trace() as recorder:
        threads = [threading.Thread(target=work, name=f"worker-{i}") for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    tids = {e["tid"] for e in recorder.events if e["cat"] == "dispatch"}
    assert len(tids) == 4


@pytest.mark.parametrize("path", [5, 0, b"trace.json", 1.5])
def test_a_path_that_is_not_a_path_is_refused(path: object) -> None:
    # open(5, "w") would have written to descriptor 5 and closed it.
    trace = pjrt_py.trace(path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trace path must be a str or path"), trace:
        pass


def test_threads_are_tracks_named_as_they_ran(tmp_path: Path) -> None:
    # tid was threading.get_ident(), reused by the next thread (three workers
    # run one after another shared a track) and past the 32 bits Perfetto's
    # JSON reader takes; names were looked up only when the file was written.
    out = tmp_path / "t.json"
    client = pjrt_py.Client()
    exe = client.compile(ADD_F32_8)
    x = np.ones(8, np.float32)
    with pjrt_py.trace(out, device=False):
        for i in range(3):
            worker = threading.Thread(target=lambda: exe.execute(x, x), name=f"worker{i}")
            worker.start()
            worker.join()
    events = json.loads(out.read_text())["traceEvents"]
    tracks = {e["tid"] for e in events if e.get("ph") == "X" and e.get("cat") == "dispatch"}
    assert len(tracks) == 3 and all(0 < t < 2**32 for t in tracks)
    named = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"worker0", "worker1", "worker2"} <= named


def test_a_trace_file_that_cannot_be_written_leaves_the_blocks_error(tmp_path: Path) -> None:
    nowhere = tmp_path / "no" / "such" / "dir.json"
    with (
        pytest.warns(RuntimeWarning, match="the block raised first"),
        pytest.raises(KeyError, match="the block's own"),
        pjrt_py.trace(nowhere, device=False),
    ):
        raise KeyError("the block's own")
    # with no error of its own, the block gets the OSError
    with pytest.raises(OSError), pjrt_py.trace(nowhere, device=False):
        pass
