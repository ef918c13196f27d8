"""Loading a plugin's shared library: once per process, and again as a new
instance in a child of ``os.fork()``.

The native core ``dlopen``s the file (``native/errors.c``). In a forked child
the inherited instance is unusable (its worker threads are gone, its locks
may be held for ever), and ``dlopen`` of the same file returns it again: the
loader tells objects apart by inode. So a new instance is loaded from a
private copy of the file, unlinked as soon as it is mapped. It shares the
process's C library. glibc's ``dlmopen`` would have avoided the copy, but its
new link-map namespace brings a second C library whose pthread key table
starts empty while every thread's key slots are shared: the plugin's first
key took slot 0, Python's GIL-state key, and cleared it on the main thread
(measured on the 0.115 CPU build; jaxlib's import then aborted in about one
forked child in eight).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from .. import _core
from .errors import PluginLoadError

# A copy's directory: the prefix, the pid of the process that made it, "_".
_PREFIX = ".pjrt_py_plugin_"


def load_library(path: str, *, fresh: bool = False) -> int:
    """Load the plugin library at ``path``; return its ``PJRT_Api`` address.

    ``fresh``: load a new instance of a library this process already has.
    """
    if not fresh:
        return int(_core.load_plugin(path))
    return _load_new_instance(path)


def _load_new_instance(path: str) -> int:
    """Load ``path`` again as a separate instance, from a private copy.

    The copy goes to the temporary directory, else (it may be full, or
    mounted ``noexec``) beside the original.
    """
    failures = []
    for where in (None, os.path.dirname(path)):
        try:
            return _load_copy(path, where)
        except (OSError, PluginLoadError) as e:
            failures.append(str(e))
    raise PluginLoadError(
        f"cannot load a new instance of {path} in this forked process: " + "; ".join(failures)
    )


def _load_copy(path: str, where: str | None) -> int:
    _sweep(where if where is not None else tempfile.gettempdir())
    directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}_", dir=where)
    copy = os.path.join(directory, os.path.basename(path))
    try:
        shutil.copyfile(path, copy)
        return int(_core.load_plugin(copy))
    except OSError as e:
        raise OSError(f"copying it to {directory} failed: {e}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(copy)
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _sweep(where: str) -> None:
    """Remove the copies that processes killed between copying and unlinking
    left in ``where``: directories named for a pid no process has now."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(where):
            if not entry.name.startswith(_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(_PREFIX) :].split("_", 1)[0]
            if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True
