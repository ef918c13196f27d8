"""Interpreter exits with work in flight, many times over: the driver that
tests/test_exit_stress.py runs in two processes at once.

``python tests/exit_cases.py SHIM REPS TIMEOUT`` loads pjrt_py once, then
for each case forks REPS children one after another. Each child makes its
own Client (the parent's is closed before forking), sets work going, and
leaves through the ordinary interpreter exit: ``sys.exit`` with a status of
its own, atexit handlers, finalization and the C library's ``exit()``. The
driver waits for each child up to TIMEOUT seconds (then kills it) and prints
one JSON line per case: how each exit ended and how long it took from the
child's last Python statement to its reaping.

Forking saves the 1-2 s an import of pjrt_py and a plugin load cost; what
runs after the fork is the exit path every program takes.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from conftest import matmul_chain  # this script's directory is on sys.path

import pjrt_py
from pjrt_py import _core
from pjrt_py.distributed import stores

# What a case leaves alive to the end: collected only when Python finalizes,
# after the exit sequence (the path a module-level result takes).
KEEP: list[Any] = []

N = 768  # matmul size: some 10 ms per step on one core


def wait_for(flag: list[Any], seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not flag and time.monotonic() < end:
        time.sleep(0.001)


def executions(rep: int, chain: bytes, shim: str) -> None:
    """Four matmul chains dispatched and dropped, the last chained on a
    still-running result (used as its handle, native/dispatch.c)."""
    c = pjrt_py.Client()
    exe = c.deserialize(chain)
    x = c.buffer(np.eye(N, dtype=np.float32))
    pending = [exe.execute_async(x) for _ in range(3)]
    pending.append(exe.execute_async(pending[-1]))
    if rep % 3 == 0:
        pending[-1].add_done_callback(lambda p: None)
    if rep % 2:
        KEEP.extend(pending)


def callback(rep: int, chain: bytes, shim: str) -> None:
    """A host callback still running Python (or asleep in C) at exit."""
    c = pjrt_py.Client()
    entered: list[int] = []

    def spin(x: Any) -> Any:
        entered.append(1)
        if rep % 2:
            time.sleep(60)
        while True:
            pass

    pjrt_py.register_callback("exit_spin", spin, client=c)
    exe = c.compile(matmul_chain(128, 1, tail="exit_spin"))
    exe.execute_async(c.buffer(np.ones((128, 128), np.float32)))
    wait_for(entered)


def transfer(rep: int, chain: bytes, shim: str) -> None:
    """A large host-to-device copy and device-to-host copies in flight."""
    c = pjrt_py.Client()
    exe = c.deserialize(chain)
    big = np.ones(1 << 24, np.float32)  # 64 MiB
    staged = c.buffer_async(big)
    del big
    out = exe.execute_async(c.buffer(np.eye(N, dtype=np.float32)))
    arrays = [out.to_numpy_async(), staged.to_numpy_async()]
    if rep % 2:
        arrays[0].add_done_callback(lambda p: None)
    if rep % 4 < 2:
        KEEP.extend(arrays)  # else dropped now, their copies still running


def staged(rep: int, chain: bytes, shim: str) -> None:
    """Staged copies (pjrt_py.runtime.staging, forced on) in flight both ways:
    an upload from a thread, and downloads of a running result and a ready one."""
    import threading  # noqa: PLC0415

    from pjrt_py.runtime import staging  # noqa: PLC0415

    c = pjrt_py.Client()
    staging.configure(c, mode="on", min_bytes=1, chunk_bytes=1 << 16, slots=2)
    exe = c.deserialize(chain)
    big = np.ones(1 << 22, np.float32)  # 16 MiB: 256 chunks
    threading.Thread(target=c.buffer, args=(big,), daemon=True).start()
    # A ready source: uploaded (sharing the ring's two slots with the thread's
    # upload) before the work starts, so the wait for slots is not in it.
    ready = c.buffer(big[: 1 << 20])
    out = c.buffer(np.eye(N, dtype=np.float32))
    # Chained on unmade outputs: some 90 ms of work on one core, work that ends
    # where the exit waits for it; where it waits for nothing, some 0.3 s.
    # (CI failed three times on "nothing was in flight": to_numpy_async below
    # waited, with the GIL, for the work it reads to start, so most of it was
    # done by the exit. It no longer waits; test_staging and test_gil_waits
    # check that.)
    stages = 10 if float(os.environ["PJRT_PY_EXIT_TIMEOUT"]) == 0 else 3
    for _ in range(stages):
        out = exe.execute_async(out)
    arrays = [out.to_numpy_async(), ready.to_numpy_async()]
    if rep % 2:
        arrays[0].add_done_callback(lambda p: None)
    if rep % 4 < 2:
        KEEP.extend(arrays)  # else dropped now, their copies still running


class SlowStore(stores.InMemoryStore):
    """Answers only after a while of Python work."""

    def __init__(self, entered: list[int]) -> None:
        super().__init__()
        self.entered = entered

    def put(self, key: bytes, value: bytes) -> None:
        self.entered.append(1)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            pass
        super().put(key, value)


def kv_call(rep: int, chain: bytes, shim: str) -> None:
    """A key-value callback inside the store, on a native thread, at exit."""
    entered: list[int] = []
    store = SlowStore(entered)
    c = pjrt_py.Client(kv_store=store)
    exe = c.deserialize(chain)
    exe.execute_async(c.buffer(np.eye(N, dtype=np.float32)))
    lib = ctypes.CDLL(shim)
    lib.start_putting.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    holder = _core.kv_holder_new(store)  # kept: the thread uses it until the process ends
    assert lib.start_putting(_core.kv_callbacks()[2], holder) == 0
    wait_for(entered)


CASES: dict[str, Callable[[int, bytes, str], None]] = {
    "executions": executions,
    "callback": callback,
    "transfer": transfer,
    "staged": staged,
    "kv": kv_call,
}


def exit_wait(case: str, rep: int) -> str:
    """$PJRT_PY_EXIT_TIMEOUT for one exit: the work is left running at once,
    after a short wait, or (work that ends) waited for and destroyed."""
    waits = ("0", "0.05") if case in ("callback", "kv") else ("0", "0.05", "0.3")
    return waits[rep % len(waits)]


def child(case: str, rep: int, chain: bytes, shim: str, report: int) -> None:
    """Runs in the forked child; never returns (exits through SystemExit)."""
    wait = exit_wait(case, rep)
    os.environ["PJRT_PY_EXIT_TIMEOUT"] = wait
    CASES[case](rep, chain, shim)
    if rep % 5 < 2 and wait != "0":
        # The client and its objects form cycles, so they usually live until
        # the exit sequence. Collected now, a client whose work still runs
        # goes to the reaper's thread, which destroys it when the work ends,
        # maybe in the middle of the exit's wait (one of the two faults that
        # fit a hang in some 450 exits; docs/lifetimes.md). Not where the
        # exit waits for nothing: a full collection takes long enough for the
        # work to end, and those exits are to leave it running.
        gc.collect()
    os.write(report, str(time.monotonic()).encode())
    os.close(report)
    sys.exit(rep % 4)  # the status must come through whatever path the exit takes


def run_one(case: str, rep: int, chain: bytes, shim: str, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryFile() as log:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.dup2(log.fileno(), 2)
            try:
                child(case, rep, chain, shim, write)
            except SystemExit:
                raise
            except BaseException:
                import traceback  # noqa: PLC0415

                traceback.print_exc()
                os._exit(99)
        os.close(write)
        deadline = time.monotonic() + timeout
        status: int | str | None = None
        while status is None:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(wait_status)
            elif time.monotonic() > deadline:
                # SIGABRT first, as run_python does: faulthandler (on in the
                # driver, so in the forked child) writes where every thread
                # waits into the log, which the result's stderr carries.
                os.kill(pid, signal.SIGABRT)
                time.sleep(1.0)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = "timeout"
            else:
                time.sleep(0.005)
        reaped = time.monotonic()
        ended = os.read(read, 64)
        os.close(read)
        log.seek(0)
        stderr = log.read().decode(errors="replace")
    return {
        "status": status,
        "expected": rep % 4,
        "wait": float(exit_wait(case, rep)),
        "exit_s": reaped - float(ended) if ended else None,
        # The exit sequence did not wait for the work: a client left running,
        # or one the reaper's thread was still destroying.
        "left_running": "left to the process exit" in stderr or "still being destroyed" in stderr,
        "stderr": stderr[-1500:],
    }


def main() -> None:
    shim, reps, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    cases = sys.argv[4].split(",") if len(sys.argv) > 4 else list(CASES)
    with pjrt_py.Client() as c:
        chain = c.compile(matmul_chain(N, 3)).serialize()
    for case in cases:
        results = [run_one(case, rep, chain, shim, timeout) for rep in range(reps)]
        print(json.dumps({"case": case, "results": results}), flush=True)


if __name__ == "__main__":
    main()
