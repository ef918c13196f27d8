"""A forked child's new instance of a plugin the parent had loaded.

The child loads the plugin again from a copy of the file that all such
children share (``pjrt_py.runtime.library``). These tests pin what that must
not break: Python's own per-thread state, how many copies are written and
where, and the fallbacks. Each runs in a fresh interpreter, since a broken
child can abort.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import ADD_F32_8, run_python

import pjrt_py
from pjrt_py.runtime import library

# The children make a client, move data and compile, then check that the main
# thread's GIL-state record is still its thread state (what PyGILState_Check
# tests; nanobind in jaxlib aborts when it is not). With a second C library
# in the process (glibc's dlmopen) the 0.115 build cleared it in about one
# child in eight, so several are forked. With `depth` 2 each child forks a
# grandchild that does the same.
FORKS = """
import ctypes, os, sys, tempfile
import numpy as np, pjrt_py
tempfile.tempdir = {tmp!r}
api = ctypes.pythonapi
api.PyGILState_GetThisThreadState.restype = ctypes.c_void_p
api.PyThreadState_Get.restype = ctypes.c_void_p
x = np.arange(8, dtype=np.float32)

def use(label):
    c = pjrt_py.Client({plugin!r})
    total = c.compile({add!r}).execute(x, c.buffer(x)).to_numpy().sum()
    same = api.PyGILState_GetThisThreadState() == api.PyThreadState_Get()
    print(label, total, same, c.plugin.instance, flush=True)
    return same

def fork(label, depth):
    pid = os.fork()
    if pid == 0:
        ok = use(label)
        if depth > 1:
            ok = fork(label + ".1", depth - 1) and ok
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    return status == 0

use("parent")
sys.stdout.flush()
results = [fork(f"child{{g}}", {depth}) for g in range({children})]
print("all children ok", all(results), flush=True)
"""


def run_forks(
    client: pjrt_py.Client, tmp: Path, copies: Path, children: int, depth: int = 1, plugin: str = ""
) -> list[str]:
    code = f"import os\nos.environ[{library.ENV_DIR!r}] = {str(copies)!r}\n" + FORKS.format(
        tmp=str(tmp),
        plugin=plugin or str(client.plugin.path),
        add=ADD_F32_8,
        children=children,
        depth=depth,
    )
    result = run_python(code, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all children ok True" in result.stdout, result.stdout + result.stderr[-2000:]
    return result.stdout.splitlines()


@pytest.mark.needs_fork_children
def test_children_keep_pythons_thread_state_and_share_one_copy(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    copies = tmp_path / "copies"
    lines = run_forks(client, tmp_path, copies, children=12)
    assert [line for line in lines if line.startswith("child")] == [
        f"child{g} 56.0 True 1" for g in range(12)
    ]
    # Twelve children, one copy between them, and nothing half-written.
    name = library.copy_name(str(client.plugin.path), 1)
    assert sorted(p.name for p in copies.iterdir()) == [name]
    # A later run loads the same copy: nothing is written again.
    before = (copies / name).stat().st_mtime_ns
    run_forks(client, tmp_path, copies, children=1)
    assert sorted(p.name for p in copies.iterdir()) == [name]
    assert (copies / name).stat().st_mtime_ns == before


@pytest.mark.needs_fork_children
def test_a_grandchild_loads_a_third_instance(client: pjrt_py.Client, tmp_path: Path) -> None:
    copies = tmp_path / "copies"
    lines = run_forks(client, tmp_path, copies, children=2, depth=2)
    assert [line for line in lines if line.startswith("child")] == [
        "child0 56.0 True 1",
        "child0.1 56.0 True 2",
        "child1 56.0 True 1",
        "child1.1 56.0 True 2",
    ]
    path = str(client.plugin.path)
    assert sorted(p.name for p in copies.iterdir()) == sorted(
        [library.copy_name(path, 1), library.copy_name(path, 2)]
    )


@pytest.mark.needs_fork_children
def test_an_unusable_copy_directory_falls_back_to_the_temporary_one(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"  # not a directory: nothing can be written under it
    blocked.write_text("")
    run_forks(client, tmp_path, blocked / "copies", children=1)
    kept = tmp_path / "pjrt_py_plugins"
    assert sorted(p.name for p in kept.iterdir()) == [library.copy_name(str(client.plugin.path), 1)]


@pytest.mark.needs_fork_children
def test_with_no_usable_directory_a_copy_beside_the_plugin_is_loaded_and_removed(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    # The plugin is loaded from a directory of the test's own, so the copy
    # beside it can be watched; neither copy directory can be made.
    beside = tmp_path / "plugin"
    beside.mkdir()
    own = beside / Path(client.plugin.path).name
    own.write_bytes(Path(client.plugin.path).read_bytes())
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    run_forks(client, blocked, blocked / "copies", children=1, plugin=str(own))
    assert sorted(p.name for p in beside.iterdir()) == [own.name]


@pytest.mark.needs_fork_children
def test_writing_a_copy_removes_older_versions_and_dead_writers_leftovers(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    copies = tmp_path / "copies"
    copies.mkdir()
    path = str(client.plugin.path)
    name = library.copy_name(path, 1)
    place = name.rsplit("-", 2)[0]  # the same original file, another version
    older = copies / f"{place}-000000000000-1.so"
    older.write_bytes(b"an older build")
    other = copies / "another-plugin.pjrt_py-000000000000-000000000000-1.so"
    other.write_bytes(b"another file's copy")
    dead = copies / f"{library._PREFIX}{_dead_pid()}_abc"
    dead.write_bytes(b"half written")
    live = copies / f"{library._PREFIX}{os.getpid()}_abc"
    live.write_bytes(b"being written")
    run_forks(client, tmp_path, copies, children=1)
    assert sorted(p.name for p in copies.iterdir()) == sorted([name, other.name, live.name])


def _dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


RACE = """
import os, sys
import numpy as np, pjrt_py
os.environ[{env!r}] = {copies!r}
x = np.arange(8, dtype=np.float32)
parent = pjrt_py.Client({plugin!r})
parent.buffer(x).to_numpy()
sys.stdout.flush()
pids = []
for k in range({children}):  # all at once: none finds a copy, all write one
    pid = os.fork()
    if pid == 0:
        c = pjrt_py.Client({plugin!r})
        ok = c.compile({add!r}).execute(x, x).to_numpy().sum() == 56.0
        os._exit(0 if ok else 3)
    pids.append(pid)
print("statuses", sorted(os.waitpid(p, 0)[1] for p in pids), flush=True)
"""


@pytest.mark.needs_fork_children
def test_children_racing_to_write_the_first_copy_all_load_one(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    children = 6
    for round_ in range(3):
        copies = tmp_path / f"copies{round_}"
        code = RACE.format(
            env=library.ENV_DIR,
            copies=str(copies),
            plugin=str(client.plugin.path),
            add=ADD_F32_8,
            children=children,
        )
        result = run_python(code, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"statuses {[0] * children}" in result.stdout, result.stdout + result.stderr[-2000:]
        # Each racer renamed a whole copy into place; one name is left, and
        # no half-written file.
        assert sorted(p.name for p in copies.iterdir()) == [
            library.copy_name(str(client.plugin.path), 1)
        ]


# A stand-in for a plugin like the CUDA one: it finds a library it loads when
# asked (not when loaded) through a run path relative to itself, and a data
# file beside that library's directory, relative to its own file.
ORIGIN_PLUGIN = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int probe(void) {
  void* h = dlopen("libstanddep.so", RTLD_NOW);
  if (h == NULL) return -1;
  int (*value)(void) = (int (*)(void))dlsym(h, "dep_value");
  return value != NULL ? value() : -2;
}
int data_found(void) {
  Dl_info info;
  if (!dladdr((void*)data_found, &info)) return 0;
  char own[PATH_MAX], data[PATH_MAX];
  snprintf(own, sizeof own, "%s", info.dli_fname);
  snprintf(data, sizeof data, "%s/../../deps/share/marker", dirname(own));
  return access(data, R_OK) == 0;
}
"""
ORIGIN_DEP = "int dep_value(void) { return 42; }\n"


def _compile(source: str, out: Path, *flags: str) -> None:
    c_file = out.with_suffix(".c")
    c_file.write_text(source)
    cc = os.environ.get("CC", "cc")
    try:
        subprocess.run(
            [cc, "-shared", "-fPIC", "-o", str(out), str(c_file), *flags],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"needs a C compiler to build a stand-in plugin ({e})")


@pytest.mark.parametrize("tag", ["--enable-new-dtags", "--disable-new-dtags"])  # RUNPATH, RPATH
def test_a_copy_keeps_the_run_paths_relative_to_the_plugin(tmp_path: Path, tag: str) -> None:
    site = tmp_path / "site"
    (site / "deps" / "lib").mkdir(parents=True)
    (site / "deps" / "share").mkdir()
    (site / "deps" / "share" / "marker").write_text("libdevice, say")
    (site / "pkg" / "plugins").mkdir(parents=True)
    _compile(ORIGIN_DEP, site / "deps" / "lib" / "libstanddep.so")
    plugin = site / "pkg" / "plugins" / "libstandin.so"
    _compile(ORIGIN_PLUGIN, plugin, f"-Wl,{tag}", "-Wl,-rpath,$ORIGIN/../../deps/lib", "-ldl")
    assert library.origin_relative(str(plugin)) == ["../../deps/lib"]
    copies = tmp_path / "copies"
    # In a fresh interpreter, which has never loaded the dependency: a plain
    # copy first (its run path leads nowhere), then the kept copy.
    code = f"""
import ctypes, shutil
from pjrt_py.runtime import library
plain = shutil.copy({str(plugin)!r}, {str(tmp_path / "plain.so")!r})
lib = ctypes.CDLL(plain)
print("plain", lib.probe(), lib.data_found())
p = {str(plugin)!r}
kept = library._shared_copy(p, {str(copies)!r}, library.copy_name(p, 1), library.origin_paths(p))
lib = ctypes.CDLL(kept)
print("kept", lib.probe(), lib.data_found(), kept)
"""
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plain -1 0" in result.stdout, result.stdout  # what a copy alone gets
    assert "kept 42 1" in result.stdout, result.stdout
    kept = Path(result.stdout.split()[-1])
    name = library.copy_name(str(plugin), 1)
    assert kept == copies / f"{name}.d" / "pkg" / "plugins" / "libstandin.so"
    assert sorted(p.name for p in copies.iterdir()) == [f"{name}.d"]  # no temporary left
    assert (copies / f"{name}.d" / "deps").resolve() == (site / "deps").resolve()


def test_an_older_versions_tree_is_removed_without_following_its_links(tmp_path: Path) -> None:
    plugin = tmp_path / "pkg" / "libstandin.so"
    plugin.parent.mkdir()
    _compile(ORIGIN_DEP, plugin, "-Wl,-rpath,$ORIGIN/../deps")
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / "keep-me").write_text("")
    copies = tmp_path / "copies"
    name = library.copy_name(str(plugin), 1)
    older = copies / f"{name.rsplit('-', 2)[0]}-000000000000-1.so.d"
    (older / "pkg").mkdir(parents=True)
    (older / "deps").symlink_to(tmp_path / "deps")
    kept = library._shared_copy(str(plugin), str(copies), name, library.origin_paths(str(plugin)))
    assert Path(kept).is_file()
    assert sorted(p.name for p in copies.iterdir()) == [f"{name}.d"]
    assert (tmp_path / "deps" / "keep-me").exists()


GPU_CHILD = """
import os
import numpy as np, pjrt_py
from pjrt_py.runtime.plugin import load_plugin
os.environ[{env!r}] = {copies!r}
load_plugin({plugin!r})  # loaded and initialised; no client, so CUDA is not started
pid = os.fork()
if pid == 0:
    c = pjrt_py.Client({plugin!r})
    x = np.arange(8, dtype=np.float32)
    total = c.compile({add!r}).execute(x, x).to_numpy().sum()
    print("child", total, c.plugin.instance, flush=True)
    os._exit(0)
print("status", os.waitpid(pid, 0)[1], flush=True)
"""


@pytest.mark.gpu
def test_a_child_of_a_parent_that_only_loaded_the_gpu_plugin_makes_a_client(
    tmp_path: Path,
) -> None:
    gpus = [p for p in pjrt_py.plugins() if p.name in ("cuda", "rocm")]
    if not gpus:
        pytest.skip("needs a PJRT plugin with GPU devices (none installed)")
    plugin = gpus[0].path
    code = GPU_CHILD.format(
        env=library.ENV_DIR, copies=str(tmp_path / "copies"), plugin=str(plugin), add=ADD_F32_8
    )
    result = run_python(code, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "child 56.0 1" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "status 0" in result.stdout, result.stdout
