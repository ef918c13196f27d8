"""A forked child's new instance of a plugin the parent had loaded.

The child loads the plugin again from a private copy of the file
(``pjrt_py.runtime.library``). These tests pin what that must not break:
Python's own per-thread state, the files it leaves, and where it falls back
to. Each runs in a fresh interpreter, since a broken child can abort.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import ADD_F32_8, run_python

import pjrt_py
from pjrt_py.runtime import library

# The child makes a client, moves data and compiles, then checks that the
# main thread's GIL-state record is still its thread state (what
# PyGILState_Check tests; nanobind in jaxlib aborts when it is not). With a
# second C library in the process (glibc's dlmopen) the 0.115 build cleared
# it in about one child in eight, so several generations are forked.
GIL_STATE = """
import ctypes, os, sys, tempfile
import numpy as np, pjrt_py
tempfile.tempdir = {tmp!r}
api = ctypes.pythonapi
api.PyGILState_GetThisThreadState.restype = ctypes.c_void_p
api.PyThreadState_Get.restype = ctypes.c_void_p
x = np.arange(8, dtype=np.float32)
parent = pjrt_py.Client({plugin!r})
parent.buffer(x).to_numpy()
sys.stdout.flush()
for generation in range({children}):
    pid = os.fork()
    if pid == 0:
        c = pjrt_py.Client({plugin!r})
        total = c.compile({add!r}).execute(x, c.buffer(x)).to_numpy().sum()
        same = api.PyGILState_GetThisThreadState() == api.PyThreadState_Get()
        print("child", generation, total, same, flush=True)
        os._exit(0 if same else 3)
    _, status = os.waitpid(pid, 0)
    print("status", generation, status, flush=True)
"""


@pytest.mark.needs_fork_children
def test_a_new_instance_keeps_pythons_thread_state(client: pjrt_py.Client, tmp_path: Path) -> None:
    children = 12
    code = GIL_STATE.format(
        tmp=str(tmp_path), plugin=str(client.plugin.path), add=ADD_F32_8, children=children
    )
    result = run_python(code, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert [f"child {g} 56.0 True" for g in range(children)] == [
        line for line in lines if line.startswith("child")
    ], result.stdout + result.stderr[-2000:]
    assert [f"status {g} 0" for g in range(children)] == [
        line for line in lines if line.startswith("status")
    ]
    # The copies were unlinked once mapped: nothing is left behind.
    assert list(tmp_path.iterdir()) == []


@pytest.mark.needs_fork_children
def test_without_a_usable_temporary_directory_the_copy_goes_beside_the_plugin(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    # The plugin is loaded from a directory of the test's own, so the copy
    # beside it can be watched; the temporary directory does not exist.
    beside = tmp_path / "plugin"
    beside.mkdir()
    own = beside / Path(client.plugin.path).name
    own.write_bytes(Path(client.plugin.path).read_bytes())
    code = GIL_STATE.format(
        tmp=str(tmp_path / "missing"), plugin=str(own), add=ADD_F32_8, children=1
    )
    result = run_python(code, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "child 0 56.0 True" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "status 0 0" in result.stdout
    assert sorted(p.name for p in beside.iterdir()) == [own.name]


@pytest.mark.needs_fork_children
def test_a_copy_left_by_a_killed_process_is_removed_by_the_next_load(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    # A process killed between copying and unlinking leaves its directory; a
    # live process's directory (this one's pid) is left alone.
    stale = tmp_path / f"{library._PREFIX}{_dead_pid()}_abc"
    stale.mkdir()
    (stale / "plugin.so").write_bytes(b"left behind")
    live = tmp_path / f"{library._PREFIX}{os.getpid()}_abc"
    live.mkdir()
    code = GIL_STATE.format(
        tmp=str(tmp_path), plugin=str(client.plugin.path), add=ADD_F32_8, children=1
    )
    result = run_python(code, timeout=300)
    assert "child 0 56.0 True" in result.stdout, result.stdout + result.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]


def _dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
