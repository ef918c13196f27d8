"""Staged host <-> device transfers: when large copies go through pjrt_py's ring.

A client may copy large numpy arrays to and from its devices through a ring of
host memory it registers with the plugin (``PJRT_Client_DmaMap``): several
threads copy one chunk of the array into the ring while the plugin's DMA moves
the chunk before it, in both directions (``native/staging_ring.c`` has the
design). ``Client.buffer`` / ``buffer_async`` and ``Buffer.to_numpy`` /
``to_numpy_async`` take that path by themselves; nothing else changes for the
caller: the data is copied at the call, results come as the same promises.

Modes:

- ``auto`` (the default): staged where it pays: a plugin that is not a CPU
  one, which accepted the ring's registration, for copies of at least
  ``min_bytes``.
- ``on``: staged for every copy of at least ``min_bytes``, registered or not
  (on a CPU plugin, which registers nothing, the plugin copies from the ring
  like from any host memory): how the tests run the pipeline on CPU.
- ``off``: never; every copy takes the plugin's own path.

Settings come from the environment when a client is made, and can be changed
on a client with ``configure`` while none of its staged copies runs:

=================================  =========================================
``PJRT_PY_STAGED_TRANSFERS``       ``auto``, ``on`` or ``off``
``PJRT_PY_STAGED_MIN_BYTES``       smallest staged copy (default 8 MiB)
``PJRT_PY_STAGING_CHUNK_BYTES``    one chunk, a multiple of 4096 (8 MiB)
``PJRT_PY_STAGING_SLOTS``          chunks in the ring, 1 to 16 (4)
``PJRT_PY_STAGING_THREADS``        threads copying a chunk, 1 to 65
                                   (one per core, at most 8); process-wide
=================================  =========================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .. import _core

MODES = ("off", "auto", "on")
MIB = 1 << 20
DEFAULT_MIN_BYTES = 8 * MIB
DEFAULT_CHUNK_BYTES = 8 * MIB
DEFAULT_SLOTS = 4
MAX_SLOTS = 16
PAGE = 4096

ENV_MODE = "PJRT_PY_STAGED_TRANSFERS"
ENV_MIN_BYTES = "PJRT_PY_STAGED_MIN_BYTES"
ENV_CHUNK_BYTES = "PJRT_PY_STAGING_CHUNK_BYTES"
ENV_SLOTS = "PJRT_PY_STAGING_SLOTS"
ENV_THREADS = "PJRT_PY_STAGING_THREADS"


def _integer(name: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected an integer from {low} to {high}") from None
    if not low <= value <= high:
        raise ValueError(f"{name}={text!r}: expected an integer from {low} to {high}")
    return value


def settings_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The staging settings the environment asks for (unset ones omitted).

    Parameters
    ----------
    environ : Mapping[str, str], optional
        Where to read the variables (default ``os.environ``).

    Returns
    -------
    dict
        Some of ``mode``, ``min_bytes``, ``chunk_bytes``, ``slots``, ``threads``.

    Raises
    ------
    ValueError
        If a variable is set to a value out of range, naming it.
    """
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    mode = env.get(ENV_MODE, "").strip().lower()
    if mode:
        if mode not in MODES:
            raise ValueError(f"{ENV_MODE}={env[ENV_MODE]!r}: expected one of {', '.join(MODES)}")
        out["mode"] = mode
    for key, name, low, high in (
        ("min_bytes", ENV_MIN_BYTES, 1, 1 << 62),
        ("chunk_bytes", ENV_CHUNK_BYTES, PAGE, 1 << 30),
        ("slots", ENV_SLOTS, 1, MAX_SLOTS),
        ("threads", ENV_THREADS, 1, 65),
    ):
        text = env.get(name, "").strip()
        if text:
            out[key] = _integer(name, text, low, high)
    if out.get("chunk_bytes", PAGE) % PAGE:
        raise ValueError(f"{ENV_CHUNK_BYTES}={env[ENV_CHUNK_BYTES]!r}: not a multiple of {PAGE}")
    return out


def configure(
    client: Any,
    *,
    mode: str | None = None,
    min_bytes: int | None = None,
    chunk_bytes: int | None = None,
    slots: int | None = None,
    timeout: float = 30.0,
) -> None:
    """Change a client's staged-transfer settings; those not given stay.

    ``mode`` and ``min_bytes`` apply at once: a copy decides when it starts.
    A new ``chunk_bytes`` or ``slots`` remakes the client's ring, which waits
    until no staged copy of the client is in flight.

    Parameters
    ----------
    client : Client
        An open client.
    mode : {"auto", "on", "off"}, optional
        When copies are staged (see the module's docstring). ``auto`` on a
        CPU plugin is ``off``.
    min_bytes : int, optional
        Copies smaller than this are never staged (at least 1).
    chunk_bytes : int, optional
        Bytes per chunk, a positive multiple of 4096.
    slots : int, optional
        Chunks in the ring, 1 to 16: how many can be in flight at once.
    timeout : float
        How long to wait for staged copies in flight before a new
        ``chunk_bytes`` or ``slots`` is refused (seconds, default 30).

    Raises
    ------
    ValueError
        For a setting out of range, or a closed client.
    RuntimeError
        If staged copies of this client were still in flight after
        ``timeout`` when the ring had to be remade.
    """
    now = stats(client)
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    chosen = mode or now.get("requested", "auto")
    effective = "off" if chosen == "auto" and client.platform_name == "cpu" else chosen
    if min_bytes is None:
        min_bytes = now.get("min_bytes", DEFAULT_MIN_BYTES)
    if chunk_bytes is None:
        chunk_bytes = now.get("chunk_bytes", DEFAULT_CHUNK_BYTES)
    if slots is None:
        slots = now.get("slots", DEFAULT_SLOTS)
    for name, value in (("min_bytes", min_bytes), ("chunk_bytes", chunk_bytes), ("slots", slots)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if min_bytes < 1:
        raise ValueError(f"min_bytes must be at least 1, not {min_bytes}")
    if chunk_bytes < PAGE or chunk_bytes % PAGE or chunk_bytes > 1 << 30:
        raise ValueError(f"chunk_bytes must be a multiple of {PAGE} up to 1 GiB, not {chunk_bytes}")
    if not 1 <= slots <= MAX_SLOTS:
        raise ValueError(f"slots must be 1 to {MAX_SLOTS}, not {slots}")
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout!r}")
    _core.staging_configure(
        client, MODES.index(effective), min_bytes, chunk_bytes, slots, float(timeout)
    )
    client._staging_requested = chosen


def configure_from_environment(client: Any, settings: Mapping[str, Any] | None = None) -> None:
    """Give a new client the settings of the environment (defaults elsewhere).

    Parameters
    ----------
    client : Client
        A client just made.
    settings : Mapping[str, Any], optional
        What ``settings_from_environment`` read (read now if None).

    Raises
    ------
    ValueError
        If a variable is set to a value out of range, naming it.
    """
    settings = dict(settings_from_environment() if settings is None else settings)
    threads = settings.pop("threads", None)
    if threads is not None:
        _core.staging_copiers(threads)
    configure(client, **settings)


def stats(client: Any) -> dict[str, Any]:
    """A client's staging settings, the ring's state, and what it has staged.

    Parameters
    ----------
    client : Client
        An open client.

    Returns
    -------
    dict
        ``mode`` (in effect), ``requested``, ``min_bytes``, ``chunk_bytes``,
        ``slots``; ``memory`` (``untried``, ``ready`` or ``failed``),
        ``dma_mapped`` and ``why_unmapped`` (the plugin's answer), ``bytes``;
        ``h2d`` and ``d2h`` (staged copies so far), ``chunks``, ``active``;
        ``threads``. Empty keys are missing before the first ``configure``.

    Raises
    ------
    ValueError
        If the client is closed.
    """
    out: dict[str, Any] = dict(_core.staging_stats(client))
    if out:
        out["requested"] = getattr(client, "_staging_requested", out["mode"])
        out["threads"] = _core.staging_copiers()
    return out


__all__ = ["configure", "configure_from_environment", "settings_from_environment", "stats"]
