"""Loading a plugin's shared library: once per process, and again as a new
instance in a child of ``os.fork()``.

The native core ``dlopen``s the file (``native/errors.c``). In a forked child
the inherited instance is unusable (its worker threads are gone, its locks
may be held for ever), and ``dlopen`` of the same file returns it again: the
loader tells objects apart by inode. So a new instance is loaded from a copy
of the file.

Copies are kept and shared. One copy per version of the plugin file and per
fork depth (a grandchild has the original and its parent's copy mapped, so
it needs a third inode) lives in ``$PJRT_PY_PLUGIN_COPIES``, else
``$XDG_CACHE_HOME/pjrt_py/plugins`` (``~/.cache/pjrt_py/plugins``), else the
temporary directory's ``pjrt_py_plugins``. It is written once, under a
temporary name and then renamed into place, so a pool of forked workers
pays for one copy between them, and they share its pages. Where none of
those directories works, a copy beside the original is loaded and removed
at once. A copy of an older version of the same file is removed when a new
one is written.

Not glibc's ``dlmopen``, which needs no copy: its new link-map namespace
brings a second C library whose pthread key table starts empty while every
thread's key slots are shared. The plugin's first key took slot 0, Python's
GIL-state key, and cleared it on the main thread (measured on the 0.115 CPU
build; jaxlib's import then aborted in about one forked child in eight).
A copy per child, removed after loading, was tried next: it wrote the whole
plugin for every fork (200-270 MB, 0.2-1.2 s here), so a pool of forked
workers paid it per worker, and the exit tests, which fork hundreds of
children, wrote tens of gigabytes per suite run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile

from .. import _core
from .errors import PluginLoadError

ENV_DIR = "PJRT_PY_PLUGIN_COPIES"

# A copy being written: the prefix, the writer's pid, "_", a random part.
_PREFIX = ".pjrt_py_plugin_"


def load_library(path: str, *, instance: int = 0) -> int:
    """Load the plugin library at ``path``; return its ``PJRT_Api`` address.

    ``instance``: 0 for the file itself; n > 0 for the n-th new instance of
    it in a line of forked processes (a copy, see the module's text).
    """
    if instance == 0:
        return int(_core.load_plugin(path))
    name = copy_name(path, instance)
    failures = []
    for directory in copy_directories():
        try:
            return int(_core.load_plugin(_shared_copy(path, directory, name)))
        except (OSError, PluginLoadError) as e:
            failures.append(f"in {directory}: {e}")
    try:
        return _load_beside(path)
    except (OSError, PluginLoadError) as e:
        failures.append(f"beside it: {e}")
    raise PluginLoadError(
        f"cannot load a new instance of {path} in this forked process; a copy of it "
        f"could not be made or loaded ({'; '.join(failures)}). Set {ENV_DIR} to a "
        "writable directory on a file system that allows executables"
    )


def copy_directories() -> list[str]:
    """Where copies are kept, in the order they are tried."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    first = os.environ.get(ENV_DIR) or os.path.join(cache, "pjrt_py", "plugins")
    return [first, os.path.join(tempfile.gettempdir(), "pjrt_py_plugins")]


def copy_name(path: str, instance: int) -> str:
    """The file name of ``path``'s copy for ``instance``: the original's name,
    a digest of where it is, and one of its version (inode, size, time)."""
    where = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:12]
    st = os.stat(path)
    version = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    digest = hashlib.sha256(version.encode()).hexdigest()[:12]
    stem, ext = os.path.splitext(os.path.basename(path))
    return f"{stem}.pjrt_py-{where}-{digest}-{instance}{ext}"


def _shared_copy(path: str, directory: str, name: str) -> str:
    """The kept copy of ``path`` in ``directory`` under ``name`` (its
    ``copy_name``), written now if it is not there."""
    copy = os.path.join(directory, name)
    if os.path.isfile(copy) and os.path.getsize(copy) == os.path.getsize(path):
        return copy
    os.makedirs(directory, exist_ok=True)
    _sweep(directory, name)
    temp = _write_copy(path, directory)
    os.replace(temp, copy)  # whole or absent: a racing writer's copy is as good
    return copy


def _load_beside(path: str) -> int:
    """Load a copy written beside ``path``, and remove it once mapped."""
    temp = _write_copy(path, os.path.dirname(path))
    try:
        return int(_core.load_plugin(temp))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _write_copy(path: str, directory: str) -> str:
    fd, temp = tempfile.mkstemp(prefix=f"{_PREFIX}{os.getpid()}_", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as source:
            shutil.copyfileobj(source, out, 1 << 20)
        os.chmod(temp, 0o755)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return temp


def _sweep(directory: str, name: str) -> None:
    """Remove from ``directory`` what is no longer wanted: copies of other
    versions of the same file (a process still running one keeps its pages),
    and half-written copies of writers that have died."""
    stem = name.rsplit("-", 2)[0] + "-"  # the original's name and place
    version = name.rsplit("-", 1)[0]
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if entry.name.startswith(stem) and not entry.name.startswith(version):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            elif entry.name.startswith(_PREFIX):
                pid = entry.name[len(_PREFIX) :].split("_", 1)[0]
                if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True
