"""Traces a person can open: pjrt_py's own work as spans, in Chrome trace JSON.

::

    with pjrt_py.trace("run.json"):
        exe = client.compile(program)
        exe.execute(x, y)

writes ``run.json``, which Perfetto's UI (ui.perfetto.dev) and
``chrome://tracing`` open. Each span is one call, on the thread that made
it, with its arguments' shapes and the program's name:

========== ===================================================================
category   spans
========== ===================================================================
compile    ``Client.compile``
transfer   ``Client.buffer`` / ``buffer_async`` (to the device),
           ``to_numpy`` / ``to_numpy_async`` (from it)
dispatch   ``execute``, ``execute_async``, ``execute_sharded(_async)``
wait       ``value()``, ``block_until_ready()``
callback   a Python host callback running (on the plugin's thread)
========== ===================================================================

Decisions:

- **Nothing outside the block.** Entering the first trace replaces those
  methods with recording ones; leaving the last puts the originals back, so
  outside a trace block calls run exactly the code they run without this
  module (the dispatch benchmark's fast path included).
- **Process-wide.** While a block is open, every thread's calls are recorded
  (that is what a profile of a program is); blocks may nest or overlap, and
  each gets the spans made while it was open.
- **Host spans only.** Device activity comes from a plugin's PJRT profiler
  extension; none of the CPU builds carries one (``Plugin.extensions``, shown
  by ``pjrt-py info``), so a trace holds pjrt_py's host side. Spans of async
  calls end when the call returns, not when the device work does: the
  ``wait`` spans show where the host waited for it.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import _core, device_trace
from .callbacks import host_callback
from .client import Client
from .programs.executable import Executable

_lock = threading.Lock()
_active: list[Recorder] = []
_saved: list[tuple[type, str, Any]] = []  # (class, name, what its __dict__ held, or _MISSING)
_MISSING = object()


class Recorder:
    """The spans of one ``trace`` block.

    Attributes
    ----------
    events : list of dict
        Chrome trace events: pjrt_py's host spans, then (when the block has
        ended) the plugins' device events.
    xspaces : list of bytes
        What the plugins' profilers recorded, serialized XSpace, one per
        plugin and recording (none if no plugin had the extension, or with
        ``device=False``).
    notes : list of str
        What the device recording did or could not do, one line per plugin.
    started_ns : int
        ``time.perf_counter_ns()`` when the block opened.
    offset_ns : int
        ``time.time_ns() - time.perf_counter_ns()`` then (``add_xspace``).
    """

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.xspaces: list[bytes] = []
        self.notes: list[str] = []
        self.offset_ns = device_trace.clock_offset_ns()
        self.started_ns = time.perf_counter_ns()
        self._lock = threading.Lock()

    def add(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def add_xspace(self, data: bytes, *, source: str = "xspace") -> None:
        """Merge a profile recorded in this process (jax's profiler, say) into the trace.

        Parameters
        ----------
        data : bytes
            Serialized XSpace: what ``jax.profiler``'s session returned, or
            a ``*.xplane.pb`` file's bytes.
        source : str
            Names its processes in the trace (``"<source> <plane>"``).

        Raises
        ------
        ValueError
            If ``data`` is not an XSpace.
        """
        data, space = device_trace.plugin_xspace(data)
        events = device_trace.chrome_events(space, offset_ns=self.offset_ns, source=source)
        self.add_device(events, [data], [f"{source}: {len(space.planes)} planes merged"])

    def add_device(
        self, events: list[dict[str, Any]], records: list[bytes], notes: list[str]
    ) -> None:
        """Take a device recording's events, XSpace records and notes (device_trace)."""
        with self._lock:
            self.events.extend(events)
            self.xspaces.extend(records)
            self.notes.extend(n for n in notes if n not in self.notes)


def _shape_of(x: Any) -> str:
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None:
        return type(x).__name__
    return f"{dtype}[{','.join(map(str, shape))}]"


# Spans' threads: the OS thread id (small, as Perfetto's JSON reader wants, and
# not the next thread's as Python's ident often is), named when it recorded.
_thread_names: dict[int, str] = {}


def _thread_id() -> int:
    tid = threading.get_native_id()
    _thread_names[tid] = threading.current_thread().name
    return tid


def _record(category: str, name: str, start: float, args: dict[str, Any]) -> None:
    end = time.perf_counter_ns()
    event = {
        "name": name,
        "cat": category,
        "ph": "X",
        "ts": start / 1000,
        "dur": (end - start) / 1000,
        "pid": os.getpid(),
        "tid": _thread_id(),
        "args": args,
    }
    for recorder in list(_active):
        recorder.add(event)


# The span categories open on this thread: a call inside another of its
# category (execute's own execute_async, to_numpy's to_numpy_async) is part
# of the outer span, not a second one.
_open = threading.local()


def _span(category: str, label: Callable[..., tuple[str, dict[str, Any]]]) -> Callable[..., Any]:
    """A decorator making a method record a span: ``label(*args)`` names it."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def recording(*args: Any, **kwargs: Any) -> Any:
            opened: set[str] = _open.__dict__.setdefault("categories", set())
            if category in opened:
                return method(*args, **kwargs)
            opened.add(category)
            start = time.perf_counter_ns()
            try:
                return method(*args, **kwargs)
            finally:
                opened.discard(category)
                try:
                    name, detail = label(*args)
                except Exception:  # a label must never change the call's outcome
                    name, detail = method.__name__, {}
                _record(category, name, start, detail)

        return recording

    return wrap


def _program_call(self: Any, *args: Any) -> tuple[str, dict[str, Any]]:
    return f"{self.name}", {"arguments": [_shape_of(a) for a in args]}


def _sharded_call(self: Any, rows: Any, *rest: Any) -> tuple[str, dict[str, Any]]:
    return f"{self.name}", {"devices": len(rows)}


def _compile_call(self: Any, program: Any, *rest: Any) -> tuple[str, dict[str, Any]]:
    return "compile", {"bytes": len(program) if hasattr(program, "__len__") else None}


def _to_device(self: Any, value: Any, *rest: Any) -> tuple[str, dict[str, Any]]:
    return "to device", {"array": _shape_of(value)}


def _from_device(self: Any, *rest: Any) -> tuple[str, dict[str, Any]]:
    target = self.buffer() if isinstance(self, _core.BufferPromise) else self
    return "to host", {"array": _shape_of(target)}


def _wait(self: Any, *rest: Any) -> tuple[str, dict[str, Any]]:
    return f"wait ({type(self).__name__})", {}


# (class, method, category, label): what a trace records.
_POINTS: list[tuple[type, str, str, Callable[..., tuple[str, dict[str, Any]]]]] = [
    (Client, "compile", "compile", _compile_call),
    (Client, "buffer", "transfer", _to_device),
    (Client, "buffer_async", "transfer", _to_device),
    (_core.Buffer, "to_numpy", "transfer", _from_device),
    (_core.Buffer, "to_numpy_async", "transfer", _from_device),
    (_core.BufferPromise, "to_numpy", "transfer", _from_device),
    (_core.BufferPromise, "to_numpy_async", "transfer", _from_device),
    (Executable, "execute", "dispatch", _program_call),
    (Executable, "execute_async", "dispatch", _program_call),
    (Executable, "execute_sharded", "dispatch", _sharded_call),
    (Executable, "execute_sharded_async", "dispatch", _sharded_call),
    (_core.Promise, "value", "wait", _wait),
    (_core.Promise, "block_until_ready", "wait", _wait),
    (_core.Buffer, "block_until_ready", "wait", _wait),
]


def _install() -> None:
    for cls, name, category, label in _POINTS:
        _saved.append((cls, name, cls.__dict__.get(name, _MISSING)))
        setattr(cls, name, _span(category, label)(getattr(cls, name)))
    host_callback.set_call_observer(_callback_span)


def _uninstall() -> None:
    host_callback.set_call_observer(None)
    while _saved:
        cls, name, original = _saved.pop()
        if original is _MISSING:
            delattr(cls, name)  # the base class's method shows through again
        else:
            setattr(cls, name, original)


def _callback_span(name: str, start: float) -> None:
    _record("callback", name, start, {})


@contextmanager
def trace(path: str | os.PathLike[str] | None = None, *, device: bool = True) -> Iterator[Recorder]:
    """Record pjrt_py's work in the block as spans; write them to ``path``.

    Parameters
    ----------
    path : str or path, optional
        Where to write the Chrome trace JSON when the block ends (also when
        it ends with an exception). None: only the returned recorder's
        ``events`` hold them. Where a plugin's profiler recorded, its XSpace
        goes next to it, as ``xplane_path(path)``.
    device : bool
        Also record the plugins' device activity, through PJRT's profiler
        extension where a loaded plugin has it (``pjrt_py.device_trace``).

    Yields
    ------
    Recorder
        Its ``events`` (Chrome trace events) fill while the block runs.

    Raises
    ------
    TypeError
        If ``path`` is not a str or path (an int would be taken by ``open``
        as a file descriptor, written to and closed).
    OSError
        If ``path`` cannot be written (when the block ends).
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"trace path must be a str or path, got {type(path).__name__}")
    recorder = Recorder()
    with _lock:
        if not _active:
            _install()
        _active.append(recorder)
    if device:
        device_trace.open_block(recorder)
    failed = False
    try:
        yield recorder
    except BaseException:
        failed = True
        raise
    finally:
        try:
            if device:
                device_trace.close_block(recorder)
            else:
                recorder.notes.append("device activity not asked for (trace(device=False))")
        finally:  # even if collecting was interrupted (Ctrl-C): the originals go back
            with _lock:
                _active.remove(recorder)
                if not _active:
                    _uninstall()
            if path is not None:
                try:
                    write(recorder, path)
                except OSError as e:
                    if not failed:
                        raise
                    # The block's own exception is the one to see; this one says why no file.
                    warnings.warn(f"trace: {e}; the block raised first", RuntimeWarning, 3)


def xplane_path(path: str | os.PathLike[str], index: int = 0) -> str:
    """Where ``trace(path)`` writes XSpace record ``index``: ``run.xplane.pb``, ``run.2.xplane.pb``.

    One file per record, not the records concatenated (which protobuf would
    read as one message): XProf reads only the first of several planes with
    the same name (measured with xprof 2.24.2: "Found multiple
    tensorflow.profiler.XPlane when only one was expected"), while separate
    files in one run folder are separate hosts to it.
    """
    text = os.fspath(path)
    base = text[:-5] if text.endswith(".json") else text
    return f"{base}.xplane.pb" if index == 0 else f"{base}.{index + 1}.xplane.pb"


def write(recorder: Recorder, path: str | os.PathLike[str]) -> None:
    """Write a recorder's spans as Chrome trace JSON (``{"traceEvents": [...]}``).

    The JSON's ``otherData`` says what the device recording did
    (``pjrt_py_device``), how timestamps are counted (``pjrt_py_clock``) and
    where the XSpace went (``pjrt_py_xspace``): next to ``path``, as
    ``xplane_path(path, i)`` for each record a plugin's profiler made.

    Parameters
    ----------
    recorder : Recorder
        What ``trace`` yielded.
    path : str or path
        The file to write.

    Raises
    ------
    OSError
        If the file cannot be written.
    """
    host = os.getpid()
    threads = {e["tid"] for e in recorder.events if e["pid"] == host}
    names = _thread_names
    meta = [
        {
            "name": "thread_name",
            "ph": "M",
            "pid": host,
            "tid": tid,
            "args": {"name": names.get(tid, f"thread {tid}")},
        }
        for tid in sorted(threads)
    ]
    meta.append(_process_name(host, "pjrt_py (host)"))
    other = {
        "pjrt_py_device": "; ".join(recorder.notes) or "host spans only",
        "pjrt_py_clock": _CLOCK,
    }
    written = []
    for index, record in enumerate(recorder.xspaces):
        written.append(xplane_path(path, index))
        with open(written[-1], "wb") as f:
            f.write(record)
    if written:
        other["pjrt_py_xspace"] = ", ".join(written)
    document = {"traceEvents": meta + recorder.events, "displayTimeUnit": "ms", "otherData": other}
    with open(path, "w") as f:
        json.dump(document, f)


_CLOCK = (
    "ts in microseconds of time.perf_counter_ns (CLOCK_MONOTONIC); device events moved "
    "there from the profilers' wall clock by an offset read when their recording started"
)


def _process_name(pid: int, name: str) -> dict[str, Any]:
    return {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}


__all__ = ["Recorder", "trace", "write", "xplane_path"]
