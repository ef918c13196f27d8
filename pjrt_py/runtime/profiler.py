"""A plugin's own profiler, through PJRT's profiler extension.

XLA's GPU and TPU plugins carry ``PJRT_Extension_Type_Profiler``: a session
that records what the plugin and its devices did (kernels, copies, the
plugin's own host work) and hands it over as serialized XSpace, the format of
jax's ``*.xplane.pb`` files (``pjrt_py.xspace`` reads it). A session needs no
client: it records whatever the plugin does between ``start`` and ``stop``,
for every client of the plugin in this process.

``pjrt_py.trace`` runs one session per loaded plugin that has the extension;
this module is the layer below it.
"""

from __future__ import annotations

from .. import _core
from .plugin import Plugin


def available(plugin: Plugin) -> bool:
    """Whether ``plugin`` carries a PJRT profiler extension pjrt_py can use.

    Parameters
    ----------
    plugin : Plugin
        A loaded plugin.

    Returns
    -------
    bool
        True if its extension chain has the profiler extension and its
        function table reaches every function a session calls.
    """
    return _core.profiler_available(plugin.address)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def profile_options(*, host_tracer_level: int = 2, device_tracer_level: int = 1) -> bytes:
    """A serialized ``tensorflow.ProfileOptions`` for a plugin session.

    XLA's plugins build their tracers from these options: the device tracer
    (CUPTI on CUDA) runs for ``device_type`` UNSPECIFIED (what this leaves)
    unless ``device_tracer_level`` is 0, and the plugin's host tracer (its own
    ``TraceMe`` spans: executions, thunks, transfers) records at
    ``host_tracer_level`` (0: off). The defaults are jax's own (a profile
    jax writes holds ``host_tracer_level`` 2, ``device_tracer_level`` 1),
    without its Python tracer, which a plugin does not have. A plugin ignores
    options it cannot parse (measured: the CUDA plugin 0.11.2 creates a session
    from empty or malformed options alike).

    Parameters
    ----------
    host_tracer_level : int
        0 to 3.
    device_tracer_level : int
        0 to 3.

    Returns
    -------
    bytes
        The message: version 1 and the two levels (field numbers of tsl's
        ``profiler_options.proto``: 2, 3 and 5).

    Raises
    ------
    ValueError
        If a level is outside 0..3.
    """
    for name, level in (("host", host_tracer_level), ("device", device_tracer_level)):
        if not isinstance(level, int) or not 0 <= level <= 3:
            raise ValueError(f"{name}_tracer_level must be an int from 0 to 3, got {level!r}")
    fields = ((2, host_tracer_level), (3, device_tracer_level), (5, 1))
    return b"".join(bytes([number << 3]) + _varint(v) for number, v in fields if v)


class Session:
    """One recording of a plugin's profiler: ``start()``, then ``finish()``.

    Parameters
    ----------
    plugin : Plugin
        A loaded plugin with the profiler extension (see ``available``).
    options : bytes, optional
        A serialized ProfileOptions; ``profile_options()`` if not given.

    Raises
    ------
    ValueError
        If the plugin has no usable profiler extension.
    PjrtError
        If the plugin refuses to create the session.
    """

    def __init__(self, plugin: Plugin, options: bytes | None = None) -> None:
        self.plugin = plugin
        self._core = _core.PluginProfiler(
            plugin.address, profile_options() if options is None else options
        )

    @property
    def state(self) -> str:
        """``created``, ``started``, ``stopped``, ``collected`` or ``closed``."""
        return self._core.state

    def start(self) -> None:
        """Start recording.

        Raises
        ------
        PjrtError
            If the plugin cannot start (another session of the same plugin is
            recording: XLA allows one per process).
        RuntimeError
            If the session was started before, or is closed.
        """
        self._core.start()

    def finish(self) -> bytes:
        """Stop recording and return what was recorded, then close the session.

        Returns
        -------
        bytes
            The serialized XSpace, as the plugin gave it.

        Raises
        ------
        PjrtError
            If the plugin fails to stop or to hand the record over (the
            session is closed all the same).
        RuntimeError
            If the session is not recording.
        """
        try:
            self._core.stop()
            return self._core.collect()
        finally:
            self._core.close()

    def close(self) -> None:
        """Stop (if recording) and destroy the session. Idempotent."""
        self._core.close()

    def __repr__(self) -> str:
        return f"<profiler Session {self.state} of {self.plugin.path}>"


__all__ = ["Session", "available", "profile_options"]
