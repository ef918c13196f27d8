"""Lifetimes: leaks, threads, and exiting with work in flight."""

from __future__ import annotations

import gc
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    ADD_F32_8,
    build_so,
    child_code,
    forwarding_plugin,
    matmul_chain,
    run_python,
    slow_loop_child,
)

import pjrt_py
from pjrt_py import _core


def live_children(client: pjrt_py.Client) -> int:
    """Buffers, executables and promises alive in C (the client's own reference excluded)."""
    return client._refs() - 1


def test_dropped_buffers_and_promises_release_their_handles() -> None:
    client = pjrt_py.Client()
    exe = client.compile(ADD_F32_8)
    x = client.buffer(np.ones(8, np.float32))
    baseline = live_children(client)
    for _ in range(200):
        p = exe.execute_async(x, x)
        exe.execute_async(p, np.ones(8, np.float32)).to_numpy_async().value()
        p.is_ready()
    del p
    gc.collect()
    assert live_children(client) == baseline


def test_closing_a_client_frees_it_after_its_last_child() -> None:
    gc.collect()
    before = _core.live_clients()
    client = pjrt_py.Client()
    buf = client.buffer(np.ones(3))
    client.close()
    assert _core.live_clients() == before + 1  # the buffer still holds it
    with pytest.raises(ValueError, match="closed"):
        buf.to_numpy()
    del buf
    gc.collect()
    assert _core.live_clients() == before  # the PJRT client is destroyed


def test_finalizers_in_a_garbage_cycle_are_safe() -> None:
    # Python may finalize a cycle's members in any order; the C refcount
    # keeps the PJRT client alive until its last buffer is gone.
    for _ in range(20):
        client = pjrt_py.Client()
        holder: dict[str, object] = {"client": client, "buf": client.buffer(np.ones(4))}
        holder["self"] = holder
        holder["exe"] = client.compile(ADD_F32_8)
        del client, holder
        gc.collect()


def test_many_threads_dispatch_at_once(client: pjrt_py.Client, add_exe) -> None:  # type: ignore[no-untyped-def]
    x = client.buffer(np.arange(8, dtype=np.float32))
    errors: list[BaseException] = []
    results: list[np.ndarray] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        try:
            y = client.buffer_async(np.full(8, k, np.float32))
            p = add_exe.execute_async(x, y)
            for _ in range(300):
                p = add_exe.execute_async(p, y)
            out = p.to_numpy()
            with lock:
                results.append(out - k * 301)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 8
    for r in results:
        np.testing.assert_array_equal(r, np.arange(8, dtype=np.float32))


def test_interpreter_exit_with_work_in_flight_does_not_crash(client: pjrt_py.Client) -> None:
    # Work calibrated to run about 0.3 s each on the plugin under test: it is
    # still in flight at exit whatever the device's speed.
    result = run_python(
        child_code(
            """
        import numpy as np, pjrt_py
        c = pjrt_py.Client()
        """,
            slow_loop_child(client, 0.3),
            """
        pending = [slow() for _ in range(3)]
        arrays = [p.to_numpy_async() for p in pending]
        pending[-1].add_done_callback(lambda p: print("callback"))
        big = np.ones(1 << 22, np.float32)
        staged = c.buffer_async(big)
        del big
        print("exiting", any(not a.is_ready() for a in arrays), flush=True)
        """,
        )
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "exiting True" in result.stdout  # work really was in flight
    assert "Fatal" not in result.stderr and "Segmentation" not in result.stderr


# What makes a forwarding plugin's PJRT_Client_Destroy slow: a destroy first
# sleeps (SLOW_DESTROY_US), with `slow_destroy_running` set. Its static
# destructor, which exit() runs with the plugin's own, ends the process with
# status 70 if a destroy is running then: the hazard the exit sequence keeps
# PJRT out of.
SLOW_DESTROY = """
volatile int slow_destroy_running = 0;
static PJRT_Error* (*real_destroy)(PJRT_Client_Destroy_Args*);

static PJRT_Error* slow_destroy(PJRT_Client_Destroy_Args* args) {
  slow_destroy_running = 1;
  const char* delay = getenv("SLOW_DESTROY_US");
  usleep(delay ? (useconds_t)atoi(delay) : 0);
  PJRT_Error* error = real_destroy(args);
  slow_destroy_running = 0;
  return error;
}

__attribute__((destructor)) static void unloading(void) {
  if (slow_destroy_running) _exit(70);
}
"""


def test_exit_while_a_dropped_client_is_destroyed_ends_without_the_plugins_destructors(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    # A client dropped with work running goes to the reaper's thread, which
    # destroys it once the work ends. An exit during that destroy used to run
    # exit()'s static destructors under it (the client was off the registry,
    # so the exit sequence saw nothing running), one of the two faults that
    # fit the exit-stress test's one hang in some 450 exits (docs/lifetimes.md).
    # Now the process ends as for a client left running.
    edit = "real_destroy = real->PJRT_Client_Destroy; api.PJRT_Client_Destroy = slow_destroy;"
    shim = forwarding_plugin(tmp_path, "slow_destroy", client.plugin.path, edit, SLOW_DESTROY)
    started = time.monotonic()
    result = run_python(
        child_code(
            f"""
        import ctypes, gc, os, sys, time
        import numpy as np, pjrt_py
        os.environ["PJRT_PY_EXIT_TIMEOUT"] = "0.2"
        os.environ["SLOW_DESTROY_US"] = "60000000"
        c = pjrt_py.Client(pjrt_py.load_plugin({str(shim)!r}))
        """,
            slow_loop_child(client, 0.3),
            f"""
        pending = slow()
        del pending, c, _slow_exe, _slow_x
        gc.collect()  # the client's last reference: its work still runs
        flag = ctypes.c_int.in_dll(ctypes.CDLL({str(shim)!r}), "slow_destroy_running")
        end = time.monotonic() + 30
        while not flag.value and time.monotonic() < end:
            time.sleep(0.005)
        print("destroying", flag.value, flush=True)
        sys.exit(3)
        """,
        )
    )
    assert "destroying 1" in result.stdout, result.stderr[-2000:]
    assert result.returncode == 3, result.stderr[-2000:]
    assert "still being destroyed" in result.stderr
    assert time.monotonic() - started < 45  # it did not wait out the 60 s destroy


# pthread_mutex_lock, interposed (LD_PRELOAD): once armed, a thread other
# than the one that armed it waits 0.5 s before it locks `armed_mutex`.
SLOW_LOCK = """
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

static uintptr_t armed_mutex;
static pthread_t armed_by;
static int (*real_lock)(pthread_mutex_t*);

void slow_lock_arm(uintptr_t mutex) {
  armed_by = pthread_self();
  __atomic_store_n(&armed_mutex, mutex, __ATOMIC_RELEASE);
}

int pthread_mutex_lock(pthread_mutex_t* m) {
  if (real_lock == NULL)
    real_lock = (int (*)(pthread_mutex_t*))dlsym(RTLD_NEXT, "pthread_mutex_lock");
  uintptr_t armed = __atomic_load_n(&armed_mutex, __ATOMIC_ACQUIRE);
  if (armed != 0 && (uintptr_t)m == armed && !pthread_equal(pthread_self(), armed_by)) {
    static const char note[] = "slow_lock: a thread waits before the lock\\n";
    ssize_t written = write(2, note, sizeof(note) - 1);
    (void)written;
    usleep(500000);
  }
  return real_lock(m);
}
"""


def core_symbol_offset(name: str) -> int:
    """Where `name` lies in the native core, from its symbol table (nm)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm (binutils) to find a lock inside the native core")
    listing = subprocess.run([nm, _core.__file__], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[2] == name:
            return int(fields[0], 16)
    if "PyInit__core" not in listing:
        pytest.skip("the native core's symbol table is stripped")
    raise AssertionError(f"{name} is not in the native core any more: update this test")


def test_exit_destroys_clients_without_the_lock_a_finished_copy_takes(
    client: pjrt_py.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PJRT thread that finishes a copy lowers the client's count, then
    # takes the registry's lock to wake the reaper. The exit sequence used to
    # destroy an idle client holding that lock, and the CPU plugin's
    # destructor joins the very thread waiting for it: a hang with nothing on
    # stderr. The interposed lock holds such a thread between the two steps.
    slow_lock = build_so(tmp_path, "slow_lock", SLOW_LOCK)
    offsets = {name: core_symbol_offset(name) for name in ("PyInit__core", "g_registry_mu")}
    monkeypatch.setenv("LD_PRELOAD", str(slow_lock))
    result = run_python(
        child_code(
            f"""
        import ctypes, os, sys
        import numpy as np, pjrt_py
        from pjrt_py import _core
        os.environ["PJRT_PY_EXIT_TIMEOUT"] = "10"
        core = ctypes.CDLL(_core.__file__)
        base = ctypes.cast(core.PyInit__core, ctypes.c_void_p).value - {offsets["PyInit__core"]}
        c = pjrt_py.Client()
        """,
            slow_loop_child(client, 0.3),
            f"""
        pending = slow().to_numpy_async()  # a copy that ends after the work
        ctypes.CDLL({str(slow_lock)!r}).slow_lock_arm(
            ctypes.c_size_t(base + {offsets["g_registry_mu"]}))
        print("exiting", pending.is_ready(), flush=True)
        sys.exit(3)
        """,
        ),
        timeout=60,
    )
    assert "exiting False" in result.stdout, result.stderr[-2000:]  # the copy was in flight
    assert "slow_lock: a thread waits" in result.stderr  # and held between the two steps
    assert result.returncode == 3, result.stderr[-2000:]


def test_exit_with_dropped_pending_copies_does_not_crash() -> None:
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        c = pjrt_py.Client()
        exe = c.compile({matmul_chain(800, 12)!r})
        x = c.buffer(np.eye(800, dtype=np.float32))
        for _ in range(3):
            exe.execute_async(x).to_numpy_async()   # promise dropped at once
        print("done", flush=True)
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "done" in result.stdout


@pytest.mark.needs_zero_copy
def test_exit_with_a_live_zero_copy_buffer_does_not_hang() -> None:
    result = run_python(
        """
        import numpy as np, pjrt_py
        c = pjrt_py.Client()
        x = pjrt_py.aligned_empty((1024,), np.float32)
        x[:] = 1
        zb = c.buffer(x, zero_copy=True)
        pending = zb.to_numpy_async()
        print("done", flush=True)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "done" in result.stdout


@pytest.mark.parametrize("method", ["to_numpy", "execute"])
def test_closed_client_children_raise_not_crash(method: str) -> None:
    client = pjrt_py.Client()
    buf = client.buffer(np.ones(8, np.float32))
    exe = client.compile(ADD_F32_8)
    client.close()
    with pytest.raises(ValueError, match="closed"):
        buf.to_numpy() if method == "to_numpy" else exe.execute(buf, buf)
