"""The byte format of ``Executable.serialize()`` and of disk cache entries.

PJRT's own serialization (``PJRT_Executable_Serialize``) is an opaque,
platform-specific blob that, per the header, must only be loaded by "the same
platform and library version". Handing a plugin anything else is not safe, so
pjrt_py wraps the blob in an envelope it can check in Python first::

    b"PJRTPYEX"  u32 format  u32 header size  header (JSON)  payload

The header records which plugin build made the payload (``plugin_identity``),
the payload's size and SHA-256, and the parameter signature, which PJRT does
not keep (names and shapes used for argument checks). ``unpack`` raises
``SerializationError`` for anything that is not a whole,
undamaged envelope; the caller compares identities before loading.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..runtime.dtypes import SUPPORTED
from ..runtime.errors import SerializationError
from . import proto as _hlo_proto
from .signature import ArgSpec

if TYPE_CHECKING:
    from ..runtime.device import Device
    from ..runtime.plugin import Plugin


class Identified(Protocol):
    """What identifies a client's plugin build and devices (a Client has it)."""

    @property
    def plugin(self) -> Plugin: ...
    @property
    def platform_name(self) -> str: ...
    @property
    def platform_version(self) -> str: ...
    @property
    def addressable_devices(self) -> Sequence[Device]: ...


MAGIC = b"PJRTPYEX"
FORMAT = 1
_PREFIX = struct.Struct("<8sII")
_DTYPES = {str(d): d for d in SUPPORTED}


def plugin_identity(client: Identified) -> dict[str, Any]:
    """What must match for a serialized executable to load into ``client``.

    The PJRT API version, platform name and version, the plugin's attributes
    (StableHLO versions) and the size of its shared library: two builds of XLA
    that agree on all of these are, in practice, the same build. The
    addressable devices are included because an executable is compiled for a
    device assignment.
    """
    plugin = client.plugin
    return {
        "pjrt_api": plugin.version_text,
        "platform": client.platform_name,
        "platform_version": client.platform_version,
        "attributes": {k: v for k, v in sorted(plugin.attributes.items())},
        "library_bytes": os.path.getsize(plugin.path),
        "devices": [[d.id, d.kind] for d in client.addressable_devices],
    }


def _spec_json(spec: ArgSpec) -> list[Any]:
    shape = None if spec.shape is None else list(spec.shape)
    item = [spec.name, shape, None if spec.dtype is None else str(spec.dtype)]
    if spec.memory_kind is not None:  # the layout mode, then the memory kind
        return [*item, spec.layout, spec.memory_kind]
    return item if spec.layout is None else [*item, spec.layout]


def _spec_from_json(item: Any) -> ArgSpec:
    # The layout mode and memory kind, where the program asks for them.
    name, shape, dtype, *extra = item
    layout, memory_kind = (*extra, None, None)[:2]
    return ArgSpec(
        str(name),
        None if shape is None else tuple(None if d is None else int(d) for d in shape),
        None if dtype is None else _DTYPES[dtype],
        None if layout is None else str(layout),
        None if memory_kind is None else str(memory_kind),
    )


def pack(
    identity: dict[str, Any],
    signature: list[ArgSpec] | None,
    payload: bytes,
    cache_key: str | None = None,
) -> bytes:
    """Wrap a PJRT-serialized executable in a checked envelope.

    ``cache_key``: the disk cache key the envelope is written under, recorded
    so that a read can tell an entry filed under another key (``cache_key_of``).
    """
    header = {
        "identity": identity,
        "payload_size": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "signature": None if signature is None else [_spec_json(s) for s in signature],
    }
    if cache_key is not None:
        header["cache_key"] = cache_key
    text = json.dumps(header, sort_keys=True).encode()
    return _PREFIX.pack(MAGIC, FORMAT, len(text)) + text + payload


def unpack(data: bytes) -> tuple[dict[str, Any], list[ArgSpec] | None, memoryview]:
    """(identity, signature, payload) of an envelope; SerializationError if damaged."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size or bytes(view[:8]) != MAGIC:
        raise SerializationError(
            "not a serialized pjrt_py executable (no PJRTPYEX header); only bytes "
            "from Executable.serialize() can be loaded"
        )
    _, fmt, size = _PREFIX.unpack_from(view)
    if fmt != FORMAT:
        raise SerializationError(f"serialized executable format {fmt}; this pjrt_py reads {FORMAT}")
    start = _PREFIX.size
    if start + size > len(view):
        raise SerializationError("serialized executable is truncated (header)")
    try:
        header = json.loads(bytes(view[start : start + size]))
        identity = header["identity"]
        want_size, want_hash = int(header["payload_size"]), str(header["payload_sha256"])
        specs = header["signature"]
        signature = None if specs is None else [_spec_from_json(s) for s in specs]
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # nested deeper than json reads
        raise SerializationError(f"serialized executable has a damaged header: {e}") from None
    payload = view[start + size :]
    if len(payload) != want_size:
        raise SerializationError(
            f"serialized executable is truncated or padded: payload of {len(payload)} "
            f"bytes, header says {want_size}"
        )
    if hashlib.sha256(payload).hexdigest() != want_hash:
        raise SerializationError("serialized executable is damaged (checksum mismatch)")
    if not isinstance(identity, dict):
        raise SerializationError("serialized executable has a damaged header: identity")
    return identity, signature, payload


def raw_payload(data: bytes) -> bytes:
    """The plugin's bytes in ``data`` for ``Client.deserialize(data, raw=True)``.

    Raw PJRT bytes are returned as they are. A pickle (what
    ``jax.experimental.serialize_executable.serialize`` writes) is read with
    an unpickler that makes no object and runs no code: jax stores the
    executable as a persistent id ``("exec", bytes)``, which is all that is
    taken from it. pjrt_py's own envelope is refused: it loads without ``raw``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise SerializationError("no bytes to load")
    if data.startswith(MAGIC):
        raise SerializationError(
            "these are pjrt_py's own serialized bytes (Executable.serialize()): load them "
            "with deserialize(data), without raw=True"
        )
    if data[:1] == b"\x80":  # a pickle protocol 2+ header
        found = _jax_pickled_executable(data)
        if found is not None:
            data = found
    return _without_ifrt_header(data)


def _without_ifrt_header(data: bytes) -> bytes:
    """The PJRT bytes inside jax's wrapper, or ``data`` if it has none.

    jaxlib's runtime serializes a loaded executable as a length-prefixed
    IFRT header (a message whose field 2 names the format, ``"pjrt_ifrt"``;
    then devices, layouts, the name) followed by the plugin's own bytes.
    """
    try:
        size, start = _hlo_proto.read_varint(data, 0)
        header = data[start : start + size]
        kind = dict(_hlo_proto.fields(header)).get(2) if start + size < len(data) else None
    except _hlo_proto.ProtoError:
        return data
    return data[start + size :] if kind == b"pjrt_ifrt" else data


class _Inert:
    """What the unpickler makes of every class and call: nothing that runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()


def _jax_pickled_executable(data: bytes) -> bytes | None:
    """The ``("exec", bytes)`` persistent id of a jax executable pickle, or None."""
    import io
    import pickle

    found: list[bytes] = []

    class Reader(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            return _Inert

        def persistent_load(self, pid: Any) -> Any:
            exec_bytes = isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "exec"
            if exec_bytes and isinstance(pid[1], (bytes, bytearray)):
                found.append(bytes(pid[1]))
            return _Inert()

    try:
        Reader(io.BytesIO(data)).load()
    except Exception:
        return None
    return found[0] if len(found) == 1 else None


def cache_key_of(data: bytes) -> str | None:
    """The disk cache key an envelope was written under; None if it records none
    or is not an envelope (``unpack`` says what is wrong with it)."""
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size or bytes(view[:8]) != MAGIC:
        return None
    _, _, size = _PREFIX.unpack_from(view)
    try:
        key = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + size])).get("cache_key")
    except (ValueError, AttributeError, RecursionError):
        return None
    return key if isinstance(key, str) else None


def identity_mismatch(made_by: dict[str, Any], here: dict[str, Any]) -> str | None:
    """A sentence saying how two plugin identities differ, or None if they match."""
    diffs = [
        f"{key}: {made_by.get(key)!r} vs {here.get(key)!r}"
        for key in sorted(set(made_by) | set(here))
        if made_by.get(key) != here.get(key)
    ]
    if not diffs:
        return None
    return (
        "the executable was serialized by a different PJRT plugin build or device set "
        "than this client's, and PJRT only loads executables of the same build ("
        + "; ".join(diffs)
        + ")"
    )


def disk_identity(client: Identified) -> bytes:
    """``plugin_identity`` plus where the library is and when it was
    written, so reinstalling a plugin also starts a fresh disk cache."""
    st = os.stat(client.plugin.path)
    local = {
        "identity": plugin_identity(client),
        "path": client.plugin.path,
        "mtime_ns": st.st_mtime_ns,
    }
    return json.dumps(local, sort_keys=True).encode()
