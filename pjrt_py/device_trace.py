"""Device activity for ``pjrt_py.trace``: the plugins' own profilers, on the host's timeline.

While a trace block that wants device activity is open, every loaded plugin
that has PJRT's profiler extension (``pjrt_py.runtime.profiler``) records a
session, and so does a plugin first loaded inside the block. When a block
ends, the sessions stop and hand over serialized XSpace; its timed events
become Chrome trace events, one process per plane (a GPU, the plugin's host
threads) and one thread per line (a stream, an op level, a thread), and the
raw bytes go to the block's ``.xplane.pb`` files (one per plugin and recording).

Decisions:

- **One recording at a time.** XLA lets one profiler session per plugin
  record at once, so blocks share it: a block that opens while another
  records joins its recording. When a block ends, the recording stops for
  everyone, a new one starts at once for the blocks still open (device work
  between the two is not recorded: the old record is copied out, nothing
  more, before the new one starts), and each gets the events made since it
  opened.
- **One clock.** Host spans are in ``time.perf_counter_ns`` (CLOCK_MONOTONIC);
  XLA's profilers stamp events with the wall clock (``absl::GetCurrentTimeNanos``,
  CLOCK_REALTIME; CUPTI's GPU timestamps are moved onto it by XLA). When a
  recording starts, the offset between the two is read from the tightest of
  seven paired readings (a window under a microsecond here) and device events
  are moved by it. An XSpace that tsl's ProfilerSession post-processed counts
  its lines from the session's start (its ``Task Environment`` plane's
  ``profile_start_time``), which is added back first.
- **Never in the way.** A plugin that cannot record (another session of it
  is running, e.g. jax's profiler) or whose record cannot be read is named
  in the trace's metadata; the block and its host spans go on.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Protocol

from . import xspace
from .runtime import plugin as plugin_mod
from .runtime import profiler

PID_BASE = 1 << 22  # above Linux's largest pid: a plane never takes a process's id


class Target(Protocol):
    """What a trace block gives this module (``pjrt_py.tracing.Recorder``)."""

    started_ns: int

    def add_device(
        self, events: list[dict[str, Any]], records: list[bytes], notes: list[str]
    ) -> None: ...


_lock = threading.RLock()
_targets: list[Target] = []
_sessions: list[profiler.Session] = []
_notes: list[str] = []  # what the current recording could not do
_offset_ns = 0  # wall clock minus perf_counter, read when the recording started
_pids: dict[tuple[str, str], int] = {}  # (plugin, plane) -> pid, kept across recordings
_tids: dict[int, dict[tuple[int, str], int]] = {}  # pid -> (line id, name) -> tid


def clock_offset_ns() -> int:
    """``time.time_ns() - time.perf_counter_ns()``, from the tightest of seven readings."""
    best = (math.inf, 0)
    for _ in range(7):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    return best[1]


def _pid(source: str, plane: str) -> int:
    return _pids.setdefault((source, plane), PID_BASE + len(_pids))


def _tid(pid: int, line: xspace.XLine) -> int:
    lines = _tids.setdefault(pid, {})
    return lines.setdefault((line.id, line.name), len(lines) + 1)


def _start(plugin: plugin_mod.Plugin) -> None:
    if any(session.plugin is plugin for session in _sessions):
        return  # loaded while the recording started: it already records
    if not profiler.available(plugin):
        _notes.append(f"{plugin.path}: no PJRT profiler extension (host spans only)")
        return
    session = None
    try:
        session = profiler.Session(plugin)
        session.start()
    except Exception as exc:  # a device record must never break the block
        # XLA allows one recording per plugin: jax's profiler on the same
        # plugin makes this one fail (InternalError: Failed to start
        # TraceMeRecorder, measured with the CUDA plugin 0.11.2).
        _notes.append(f"{plugin.path}: the profiler did not start: {type(exc).__name__}: {exc}")
        if session is not None:
            session.close()
        return
    _sessions.append(session)


def _on_load(plugin: plugin_mod.Plugin) -> None:
    with _lock:
        if _targets:
            _start(plugin)


def _start_recording() -> None:
    global _offset_ns
    _offset_ns = clock_offset_ns()
    for plugin in plugin_mod.loaded_plugins():
        _start(plugin)


def open_block(target: Target) -> None:
    """A block that wants device activity opened: record, if nothing records yet."""
    with _lock:
        _targets.append(target)
        if len(_targets) == 1:
            plugin_mod.LOAD_LISTENERS.append(_on_load)
            _start_recording()


def close_block(target: Target) -> None:
    """A block ended: stop the recording, record again for the rest, hand the events out."""
    with _lock:
        receivers = list(_targets)
        _targets.remove(target)
        sessions, notes, offset_ns = list(_sessions), list(_notes), _offset_ns
        _sessions.clear()
        _notes.clear()
        # Each record is copied out before the next recording starts; reading
        # it (the slow part) waits until then, so the gap holds no parsing.
        finished = [(session.plugin.path, _finish(session)) for session in sessions]
        if _targets:
            _start_recording()
        else:
            plugin_mod.LOAD_LISTENERS.remove(_on_load)
        events: list[dict[str, Any]] = []
        records: list[bytes] = []
        for where, data in finished:
            got, record, said = _read(where, data, offset_ns)
            events += got
            records += [record] if record else []
            notes += said
        if not sessions and not notes:
            notes.append("no plugin was loaded: host spans only")
        for receiver in receivers:
            begin_us = receiver.started_ns / 1000
            mine = [e for e in events if e["ph"] != "X" or e["ts"] + e["dur"] >= begin_us]
            receiver.add_device(mine, records, notes)


def _finish(session: profiler.Session) -> bytes | str:
    """The session's record, or what went wrong (a record must never break the block)."""
    try:
        return session.finish()
    except Exception as exc:
        return f"no device record: {type(exc).__name__}: {exc}"


def _read(
    where: str, data: bytes | str, offset_ns: int
) -> tuple[list[dict[str, Any]], bytes, list[str]]:
    if isinstance(data, str):
        return [], b"", [f"{where}: {data}"]
    try:
        record, space = plugin_xspace(data)
    except ValueError as exc:
        return [], b"", [f"{where}: an unreadable device record: {exc}"]
    events = chrome_events(space, offset_ns=offset_ns, source=where)
    timed = sum(1 for e in events if e["ph"] == "X")
    planes = sum(1 for e in events if e["name"] == "process_name")
    notes = [f"{where}: {timed} device trace events on {planes} planes"]
    notes += [f"{where}: the profiler reported: {text}" for text in space.errors + space.warnings]
    return events, record, notes


def plugin_xspace(data: bytes) -> tuple[bytes, xspace.XSpace]:
    """The XSpace a plugin meant, and its bytes.

    XLA's plugin profiler (measured in the CUDA plugin 0.11.2) reports one
    byte more than the message: a zero it appends. A message cannot end in
    a lone field-number-0 byte, so where the bytes as given do not parse and
    dropping a final zero makes them parse, that is what was meant.

    Raises
    ------
    ValueError
        If the bytes are not an XSpace, with or without that byte.
    """
    try:
        return data, xspace.parse(data)
    except ValueError:
        if not data.endswith(b"\0"):
            raise
        return data[:-1], xspace.parse(data[:-1])


def _session_start(space: xspace.XSpace) -> int:
    for plane in space.planes:
        if plane.name == "Task Environment":
            value = plane.stats_dict(plane.stats).get("profile_start_time", 0)
            return value if isinstance(value, int) else 0
    return 0


def _json_value(value: xspace.StatValue) -> Any:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def chrome_events(space: xspace.XSpace, *, offset_ns: int, source: str) -> list[dict[str, Any]]:
    """An XSpace's timed events as Chrome trace events on the host's clock.

    Parameters
    ----------
    space : XSpace
        A decoded profile.
    offset_ns : int
        ``time.time_ns() - time.perf_counter_ns()`` (``clock_offset_ns()``):
        an event at wall time ``w`` goes to ``(w - offset_ns) / 1000`` us.
    source : str
        Names the processes (``"<source> <plane>"``) and keys their ids, so a
        plane keeps its process id across recordings.

    Returns
    -------
    list of dict
        ``process_name`` / ``thread_name`` metadata and one complete (``X``)
        event per timed event, sorted by start within each line (longest
        first at a tie, so parents come before their children). Counted
        events (``num_occurrences``) have no time and are left out.
    """
    with _lock:  # process and thread ids are handed out once, from any thread
        return _chrome_events(space, offset_ns, source)


def _chrome_events(space: xspace.XSpace, offset_ns: int, source: str) -> list[dict[str, Any]]:
    start_ns = _session_start(space)
    out: list[dict[str, Any]] = []
    for plane in space.planes:
        lines = [ln for ln in plane.lines if any(e.num_occurrences is None for e in ln.events)]
        if not lines:
            continue
        pid = _pid(source, plane.name)
        category = "device" if plane.name.startswith("/device:") else "profiler host"
        out.append(_meta("process_name", pid, 0, f"{source.rsplit('/', 1)[-1]} {plane.name}"))
        out.append(_meta("process_sort_index", pid, 0, pid, key="sort_index"))
        for line in lines:
            tid = _tid(pid, line)
            out.append(_meta("thread_name", pid, tid, line.display_name or line.name))
            # The line's start on our clock, in ns (exact integers until here).
            base = line.timestamp_ns - offset_ns
            if start_ns and line.timestamp_ns < start_ns // 2:
                base += start_ns  # counted from the session's start
            timed = [e for e in line.events if e.num_occurrences is None]
            timed.sort(key=lambda e: (e.offset_ps, -e.duration_ps))
            for event in timed:
                args = {k: _json_value(v) for k, v in plane.stats_dict(event.stats).items()}
                out.append(
                    {
                        "name": plane.event_name(event),
                        "cat": category,
                        "ph": "X",
                        "ts": (base * 1000 + event.offset_ps) / 1e6,
                        "dur": max(event.duration_ps, 0) / 1e6,
                        "pid": pid,
                        "tid": tid,
                        "args": args,
                    }
                )
    return out


def _meta(name: str, pid: int, tid: int, value: Any, key: str = "name") -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


__all__ = ["PID_BASE", "chrome_events", "clock_offset_ns", "close_block", "open_block"]
