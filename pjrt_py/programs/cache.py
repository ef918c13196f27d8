"""Compile caches: one in memory per client, and an optional one on disk.

In memory, ``Client.compile`` keeps its executables in a small LRU keyed by the
program and the serialized compile options (the client fixes the plugin), so
compiling the same program again is a dictionary lookup.

On disk (``Client(cache_dir=...)`` or ``$PJRT_PY_CACHE_DIR``), each entry is a
file named by the SHA-256 of the plugin's identity, the program bytes and the
options bytes, holding the envelope of ``Executable.serialize()``:

- **Never across builds.** The key covers the plugin's identity (API version,
  platform version, attributes, library size, and where the library is and
  when it was written), and loading re-checks the identity in the envelope.
- **Atomic.** An entry is written to a temporary file in the same directory
  and renamed into place, so a reader sees a whole entry or none, and
  processes sharing a directory are safe. The last writer of a key wins;
  every writer's entry is correct.
- **Damage is a miss.** A truncated or corrupt entry fails the envelope's
  checks; it is removed and the program is compiled and written again.
- **An entry answers only for its own key.** The envelope records the key
  it was written under (``serialization.pack``), and the client checks it on
  a read: a file copied or renamed under another key is a miss (and is
  removed), never another program.
- **Bounded.** After each write the directory is trimmed to ``max_bytes`` by
  removing the least recently used entries (a hit refreshes the entry's
  modification time), and temporary files a writer left behind (a process
  killed mid-write) once they are older than ``STALE_TMP_SECONDS``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

ENV_DIR = "PJRT_PY_CACHE_DIR"
ENV_MAX_BYTES = "PJRT_PY_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB
# The largest entry read or written where max_bytes is smaller (4 GiB).
ENTRY_LIMIT = 1 << 32
MEMORY_ENTRIES = 256  # executables kept per client
_SUFFIX = ".pjrtpy"
_TMP = ".tmp-"
STALE_TMP_SECONDS = 600.0  # a writer takes milliseconds; one this old died


class MemoryCache:
    """An LRU of executables per ``(program, options)``; counts hits and misses.

    The cached executables are never handed out themselves: the client gives
    each caller a new one that shares the compiled program.
    """

    def __init__(self, capacity: int = MEMORY_ENTRIES) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Any) -> Any:
        with self._lock:
            exe = self._entries.get(key)
            if exe is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return exe

    def put(self, key: Any, exe: Any) -> None:
        with self._lock:
            self._entries[key] = exe
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)  # dropped, not deleted: callers may hold it

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def disk_key(identity: bytes, program: bytes, options: bytes) -> str:
    """The entry name: SHA-256 over length-prefixed identity, program, options."""
    h = hashlib.sha256()
    for part in (identity, program, options):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


class _Oversized(OSError):
    """An entry larger than any entry this cache keeps."""


def _read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit``
    bytes, else OSError. An entry replaced by a FIFO blocked the compile
    that read it for good, and one linked to /dev/zero read until memory ran
    out (an attack run): so the open never blocks, and only a regular file's
    own size is read, if that is a size an entry can have."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise _Oversized(f"{path} holds {st.st_size} bytes, over {limit}")
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break  # truncated meanwhile: the checksum rejects it
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class DiskCache:
    """Serialized executables in one directory, bounded by ``max_bytes``."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        if max_bytes is None:
            env = os.environ.get(ENV_MAX_BYTES)
            try:
                max_bytes = int(env) if env else DEFAULT_MAX_BYTES
            except ValueError:
                raise ValueError(f"${ENV_MAX_BYTES}={env!r} is not an integer") from None
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"cache max_bytes must be a non-negative int, got {max_bytes!r}")
        if not os.fspath(directory):
            raise ValueError("cache_dir must name a directory, got '' (use False for no cache)")
        self.directory = Path(directory).expanduser()
        if self.directory.exists() and not self.directory.is_dir():  # mkdir: FileExistsError
            raise NotADirectoryError(f"cache_dir {str(self.directory)!r} is not a directory")
        if self.directory.is_symlink() and not self.directory.exists():  # mkdir: EEXIST
            raise NotADirectoryError(
                f"cache_dir {str(self.directory)!r} is a symbolic link to nothing "
                f"(dangling, or a loop: {os.readlink(self.directory)!r})"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.rejected = 0  # damaged entries found, removed and rewritten

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{_SUFFIX}"

    def get(self, key: str) -> bytes | None:
        path = self.path(key)
        try:
            # An entry can outgrow max_bytes (the one just written is kept),
            # but not both it and ENTRY_LIMIT: a sparse 64 GiB file was read
            # whole on every compile of its program.
            data = _read_regular_file(path, max(self.max_bytes, ENTRY_LIMIT))
        except _Oversized:
            self.misses += 1
            self.reject(key)
            return None
        except (OSError, MemoryError):  # MemoryError: not now, maybe later
            self.misses += 1
            return None
        with contextlib.suppress(OSError):  # removed meanwhile: still a hit
            os.utime(path)  # most recently used
        return data

    def reject(self, key: str) -> None:
        """Remove a damaged entry (the caller found it unusable)."""
        self.rejected += 1
        with contextlib.suppress(OSError):
            self.path(key).unlink()

    def put(self, key: str, data: bytes) -> None:
        """Write an entry atomically, then trim the directory to ``max_bytes``.
        An entry ``get`` would not read is not written."""
        if len(data) > max(self.max_bytes, ENTRY_LIMIT):
            return
        fd, tmp = tempfile.mkstemp(prefix=_TMP, suffix=_SUFFIX, dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path(key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.writes += 1
        self.trim(keep=key)

    def entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of each entry, least recently used first."""
        found = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            if path.name.startswith(_TMP):
                continue
            try:
                st = path.stat()
            except OSError:  # removed by another process meanwhile
                continue
            found.append((st.st_mtime, st.st_size, path))
        found.sort()
        return found

    def trim(self, keep: str | None = None) -> None:
        self._remove_stale_temporaries()
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            if keep is not None and path.name == f"{keep}{_SUFFIX}":
                continue
            try:
                path.unlink()
                total -= size
            except OSError:
                pass

    def _remove_stale_temporaries(self) -> None:
        """Remove what writers that died mid-write left (see ``STALE_TMP_SECONDS``)."""
        now = time.time()
        for path in self.directory.glob(f"{_TMP}*{_SUFFIX}"):
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
                if now - path.stat().st_mtime > STALE_TMP_SECONDS:
                    path.unlink()

    def __repr__(self) -> str:
        return f"<DiskCache {self.directory} max_bytes={self.max_bytes}>"
