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

A plugin that finds the libraries it loads through run paths relative to
its own directory (``$ORIGIN``, read by ``elf``) gets its copy in a
directory of its own, ``<copy name>.d``, laid out as the original's last
directories are, with links to what each such run path reaches from the
original. The CUDA plugin needs this: it loads the CUDA libraries from
``$ORIGIN/../../nvidia/...`` when a client is made, long after the copy was
loaded, so a copy without them loads but cannot reach them then. The
link goes to the first directory past the climb (``nvidia``), not to the
named one (``nvidia/cu13/lib``), so that the plugin's other lookups
relative to itself (CUDA's ``libdevice`` under ``nvidia/cuda_nvcc``) find
what they would beside the original.

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
import posixpath
import shutil
import tempfile

from .. import _core
from .elf import origin_relative
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
    name, relative = copy_name(path, instance), origin_paths(path)
    failures = []
    for directory in copy_directories():
        try:
            return int(_core.load_plugin(_shared_copy(path, directory, name, relative)))
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


def origin_paths(path: str) -> list[str]:
    """The library's run paths relative to its own directory, normalized, each
    once (``["../../nvidia/cu13/lib", ...]``; ``"."`` for ``$ORIGIN`` itself)."""
    return list(dict.fromkeys(posixpath.normpath(rel or ".") for rel in origin_relative(path)))


def _shared_copy(path: str, directory: str, name: str, relative: list[str]) -> str:
    """The kept copy of ``path`` in ``directory`` under ``name`` (its
    ``copy_name``), written now if it is not there; for a plugin with run
    paths relative to itself (``relative``, its ``origin_paths``), inside its
    own tree (see the module's text)."""
    home = os.path.join(directory, name + ".d")
    parts = _origin_parts(path, relative)
    base = os.path.basename(path)
    copy = os.path.join(home, *parts, base) if relative else os.path.join(directory, name)
    if os.path.isfile(copy) and os.path.getsize(copy) == os.path.getsize(path):
        return copy
    os.makedirs(directory, exist_ok=True)
    _sweep(directory, name)
    if relative:  # before the copy: whoever sees it sees the links
        _mirror_origin(path, home, parts, relative, copy)
    temp = _write_copy(path, directory)
    os.replace(temp, copy)  # whole or absent: a racing writer's copy is as good
    return copy


def _climbs(rel: str) -> int:
    """How many directories up a normalized relative path starts by going."""
    parts = rel.split("/")
    return next((i for i, part in enumerate(parts) if part != ".."), len(parts))


def _origin_parts(path: str, relative: list[str]) -> list[str]:
    """The original's last directories that the copy's tree repeats: as many
    as its run paths (``origin_paths``) climb above it."""
    climb = max((_climbs(rel) for rel in relative), default=0)
    origin = os.path.dirname(os.path.abspath(path))
    return [part for part in origin.split(os.sep) if part][-climb:] if climb else []


def _mirror_origin(path: str, home: str, parts: list[str], relative: list[str], copy: str) -> None:
    """Lay out ``home`` so that each of the copy's ``$ORIGIN``-relative run
    paths reaches what the original's reaches: the copy's own directories
    (``parts``, and those above them up to ``home``) are real, everything
    else is a link into the original's surroundings."""
    origin = os.path.dirname(os.path.abspath(path))
    own = {os.path.join(home, *parts[:i]) for i in range(len(parts) + 1)}
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    for rel in relative:
        up = _climbs(rel)
        if up > len(parts):
            continue  # above the file system's root
        rest = [part for part in rel.split("/")[up:] if part != "."]
        mirror = os.path.join(home, *parts[: len(parts) - up], *rest[:1])
        target = os.path.join(origin, *[".."] * up, *rest[:1])
        _link(mirror, os.path.realpath(target), own, copy)


def _link(mirror: str, target: str, own: set[str], copy: str) -> None:
    """Make ``mirror`` reach ``target``: a link, or, where ``mirror`` is one
    of the copy's own directories, links to what ``target`` holds."""
    if not os.path.exists(target) or mirror == copy:
        return
    if mirror in own:
        if os.path.isdir(target):
            for entry in os.scandir(target):
                _link(os.path.join(mirror, entry.name), entry.path, own, copy)
        return
    with contextlib.suppress(FileExistsError):
        os.symlink(target, mirror)


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
                if entry.is_dir(follow_symlinks=False):  # a tree (links are removed, not followed)
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
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
