"""Scoped memory reports: the most memory in use on each device during a block.

::

    with pjrt_py.memory_watch() as w:
        out = exe.execute(x, y)
    w.peak_bytes        # {Device: bytes}, the most in use at once in the block
    w.start_bytes       # {Device: bytes} in use when the block began
    w.end_bytes         # {Device: bytes} in use when it ended
    w.source            # {Device: "plugin" or "pjrt_py"}: where each figure came from

What jax issue 8096 asks for: initial, final and peak bytes in use, per
device, for a block of code. Each device's three figures come from one of
two sources, named in ``w.source``:

``"plugin"``
    The plugin's allocator statistics (``Device.memory_stats()``; XLA's
    GPU client keeps them, no CPU build does). PJRT has no call that resets
    a peak, so the plugin's ``peak_bytes_in_use`` gives the block's peak
    only when it rose during the block: then the peak was reached inside it. These figures include
    everything the plugin allocated on the device: programs' temporaries,
    padding, buffers of other pjrt_py objects and of other code sharing the
    client.
``"pjrt_py"``
    pjrt_py's own count (``native/accounting.c``), used where the plugin keeps
    no statistics (every CPU build) or where its peak did not rise during the
    block (the block's peak was below an earlier one, which is all the
    plugin can say). It is the bytes of the device buffers pjrt_py holds:
    from the moment a Buffer (or an execution's output) exists until it is
    freed, shape x item size each. Memory a program uses inside an
    execution is not in it (``Executable.memory_analysis()`` has a program's
    temporary bytes).

Decisions, for the ``"pjrt_py"`` count:

- **Buffers made before the block** count in ``start_bytes`` and, while they
  live, in the peak: the peak is what was in use, as ``peak_bytes_in_use``
  is. ``peak_increase`` is what the block added on top.
- **Freed inside the block:** a buffer stops counting when pjrt_py lets go of
  its memory: ``delete()``, its last reference dropped, or donation to an
  execution (before that execution's outputs count). A buffer still in use
  when deleted (a running call, a DLPack consumer) counts until that ends.
- **Not counted:** memory pjrt_py did not allocate. A DLPack import viewing
  another framework's memory and ``Client.buffer(x, zero_copy=True)`` alias
  memory their owner counts; a Buffer exported to another framework stays
  counted while pjrt_py's buffer holds it.
- **Nested and concurrent watches** each get their own figures. A watch sees
  every thread's work while it is open, as a device's memory does.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import _core
from .device import Device

SOURCE_PLUGIN = "plugin"
SOURCE_PJRT_PY = "pjrt_py"

_clients: weakref.WeakSet[Any] = weakref.WeakSet()  # the live Clients (track)
_lock = threading.Lock()
_open: list[MemoryWatch] = []  # watches between __enter__ and __exit__


def track(client: Any) -> None:
    """Remember a new client, whose devices a watch with no ``devices`` reports."""
    _clients.add(client)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's figures for a ``memory_watch`` block, in bytes.

    Made by ``MemoryWatch``; its fields are these parameters.

    Parameters
    ----------
    device : Device
        The device.
    start_bytes : int
        In use when the block began.
    peak_bytes : int
        The most in use at once during the block (at least ``start_bytes``
        and ``end_bytes``).
    end_bytes : int
        In use when the block ended (while it is open: now).
    source : str
        ``"plugin"`` (the plugin's statistics) or ``"pjrt_py"`` (pjrt_py's
        count of its own buffers); see ``pjrt_py.runtime.memory_watch``.
    stats_start, stats_end : dict or None
        ``Device.memory_stats()`` at either end; None where the plugin keeps
        no statistics.
    """

    device: Device
    start_bytes: int
    peak_bytes: int
    end_bytes: int
    source: str
    stats_start: Mapping[str, int] | None = None
    stats_end: Mapping[str, int] | None = None

    @property
    def peak_increase(self) -> int:
        """How far above its starting use the block took the device."""
        return self.peak_bytes - self.start_bytes


# A device, its statistics at the start and end, and pjrt_py's (start, peak, end).
_Reading = tuple[Device, Mapping[str, int] | None, Mapping[str, int] | None, tuple[int, int, int]]


def _stats(device: Device) -> dict[str, int] | None:
    try:
        return device.memory_stats()
    except Exception:  # a closed client: no statistics to read
        return None


def _devices_of(target: Any) -> list[Device]:
    if isinstance(target, Device):
        return [target]
    devices = getattr(target, "addressable_devices", None)
    if devices is not None:  # a Client
        return list(devices)
    raise TypeError(f"memory_watch takes Devices or Clients, got {target!r}")


def _all_devices() -> list[Device]:
    return [d for client in list(_clients) for d in client.addressable_devices]


class MemoryWatch:
    """The figures of one ``memory_watch`` block (see ``memory_watch``).

    Parameters
    ----------
    devices : Device, Client, or iterable of them, optional
        The devices to report. None: every addressable device of every
        pjrt_py Client alive when the block begins or ends.
    source : {None, "pjrt_py"}, optional
        None: the plugin's statistics where they give the block's peak,
        else pjrt_py's count. ``"pjrt_py"``: pjrt_py's count everywhere.
    """

    def __init__(self, devices: Any = None, source: str | None = None) -> None:
        if source not in (None, SOURCE_PJRT_PY):
            raise ValueError(f"source is None or {SOURCE_PJRT_PY!r}, not {source!r}")
        self._counted_only = source == SOURCE_PJRT_PY
        if devices is None:
            self._chosen: list[Device] | None = None
        elif isinstance(devices, Iterable) and not hasattr(devices, "addressable_devices"):
            self._chosen = [d for target in devices for d in _devices_of(target)]
        else:
            self._chosen = _devices_of(devices)
        self._state = "new"
        self._start: dict[int, int] = {}  # device address -> live bytes at the start
        self._folded: dict[int, int] = {}  # device address -> peak before the last mark
        self._stats_start: dict[Device, dict[str, int] | None] = {}
        self._end: list[_Reading] | None = None  # read as the block ended
        self._final: dict[Device, DeviceMemory] | None = None  # made from it when asked

    # -- the block ---------------------------------------------------------
    def __enter__(self) -> MemoryWatch:
        if self._state != "new":
            raise RuntimeError("a memory_watch can be entered once; make a new one")
        devices = self._chosen if self._chosen is not None else _all_devices()
        self._stats_start = {d: None if self._counted_only else _stats(d) for d in devices}
        with _lock:
            # A mark: every peak starts again from what is live. The watches
            # already open keep what their peaks were up to now.
            snapshot = _core.accounting(True)
            for other in _open:
                other._fold(snapshot)
            self._start = {address: live for address, live, _ in snapshot}
            self._folded = dict(self._start)
            _open.append(self)
        self._state = "open"
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._state != "open":
            return
        with _lock:
            snapshot = _core.accounting(False)
            _open.remove(self)
        self._end = self._readings(snapshot, self._folded)
        self._state = "closed"

    def _fold(self, snapshot: list[tuple[int, int, int]]) -> None:
        for address, _, peak in snapshot:
            if peak > self._folded.get(address, 0):
                self._folded[address] = peak

    # -- figures -----------------------------------------------------------
    def _readings(
        self, snapshot: list[tuple[int, int, int]], folded: dict[int, int]
    ) -> list[_Reading]:
        """What each device's figures are made from, read now (the plugin's
        statistics too); the figures themselves are made when asked for."""
        now = {address: (live, peak) for address, live, peak in snapshot}
        devices = list(self._stats_start)
        if self._chosen is None:
            devices += [d for d in _all_devices() if d not in self._stats_start]
        readings: list[_Reading] = []
        for device in devices:
            live, peak = now.get(device._addr, (0, 0))
            counted = (
                self._start.get(device._addr, 0),
                max(folded.get(device._addr, 0), peak),
                live,
            )
            after = None if self._counted_only else _stats(device)
            readings.append((device, self._stats_start.get(device), after, counted))
        return readings

    @property
    def report(self) -> dict[Device, DeviceMemory]:
        """Each device's figures; while the block is open, its figures so far.

        Raises
        ------
        RuntimeError
            If the watch was never entered.
        """
        if self._end is not None:
            if self._final is None:
                self._final = {r[0]: _choose(*r) for r in self._end}
            return dict(self._final)
        if self._state != "open":
            raise RuntimeError("this memory_watch has not been entered (use it in a with block)")
        with _lock:
            snapshot = _core.accounting(False)
            folded = dict(self._folded)
        return {r[0]: _choose(*r) for r in self._readings(snapshot, folded)}

    @property
    def peak_bytes(self) -> dict[Device, int]:
        """The most bytes in use at once on each device during the block."""
        return {d: m.peak_bytes for d, m in self.report.items()}

    @property
    def start_bytes(self) -> dict[Device, int]:
        """Bytes in use on each device when the block began."""
        return {d: m.start_bytes for d, m in self.report.items()}

    @property
    def end_bytes(self) -> dict[Device, int]:
        """Bytes in use on each device when the block ended (while open: now)."""
        return {d: m.end_bytes for d, m in self.report.items()}

    @property
    def source(self) -> dict[Device, str]:
        """Where each device's figures came from: ``"plugin"`` or ``"pjrt_py"``."""
        return {d: m.source for d, m in self.report.items()}

    def __getitem__(self, device: Device) -> DeviceMemory:
        return self.report[device]

    def __repr__(self) -> str:
        if self._state == "new":
            return "<MemoryWatch (not entered)>"
        rows = [
            f"{d}: peak {m.peak_bytes} B (start {m.start_bytes}, end {m.end_bytes}; {m.source})"
            for d, m in self.report.items()
        ]
        return (
            "<MemoryWatch "
            + ("open" if self._state == "open" else "closed")
            + ("\n  " + "\n  ".join(rows) + ">" if rows else " no devices>")
        )


def _choose(
    device: Device,
    before: Mapping[str, int] | None,
    after: Mapping[str, int] | None,
    counted: tuple[int, int, int],
) -> DeviceMemory:
    """The plugin's figures where they give this block's peak, else pjrt_py's count.

    The plugin's ``peak_bytes_in_use`` covers the client's whole life. It is
    this block's peak when it rose during the block (or the device's client
    began inside the block, so its whole life is in the block).
    """
    if after is not None and "peak_bytes_in_use" in after:
        old_peak = -1 if before is None else before.get("peak_bytes_in_use", -1)
        if after["peak_bytes_in_use"] > old_peak:
            start = 0 if before is None else before["bytes_in_use"]
            return DeviceMemory(
                device, start, after["peak_bytes_in_use"], after["bytes_in_use"],
                SOURCE_PLUGIN, before, after,
            )  # fmt: skip
    start, peak, end = counted
    return DeviceMemory(device, start, peak, end, SOURCE_PJRT_PY, before, after)


def memory_watch(devices: Any = None, *, source: str | None = None) -> MemoryWatch:
    """Report the bytes in use on each device during a ``with`` block.

    Parameters
    ----------
    devices : Device, Client, or iterable of them, optional
        The devices to report. None: every addressable device of every
        pjrt_py Client alive when the block begins or ends.
    source : {None, "pjrt_py"}, optional
        None: each device's figures from the plugin's statistics where they
        give the block's peak, else from pjrt_py's count of its own buffers.
        ``"pjrt_py"``: pjrt_py's count on every device (the bytes of your
        buffers alone, on a GPU too).

    Returns
    -------
    MemoryWatch
        Enter it with ``with``; afterwards its ``peak_bytes``,
        ``start_bytes``, ``end_bytes`` and ``source`` map each Device to a
        figure, and ``report`` to a ``DeviceMemory`` with all of them.

    Raises
    ------
    TypeError
        If ``devices`` holds something that is neither a Device nor a Client.
    ValueError
        For another ``source``.

    Examples
    --------
    >>> with pjrt_py.memory_watch() as w:                       # doctest: +SKIP
    ...     out = exe.execute(x, y)
    >>> w.peak_bytes[client.devices[0]], w.source[client.devices[0]]  # doctest: +SKIP
    (96, 'pjrt_py')
    """
    return MemoryWatch(devices, source)


__all__ = ["DeviceMemory", "MemoryWatch", "memory_watch"]
