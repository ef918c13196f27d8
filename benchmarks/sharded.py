"""Many devices, chains and threads (issue 29), in one process run:

- ``execute_sharded_async`` of an f32[8] add replicated over 1, 2, 4 and 8
  CPU devices (Buffers already on their devices, promises dropped) next to a
  raw C loop of the same multi-device ``PJRT_LoadedExecutable_Execute`` with
  completion events, outputs destroyed (benchmarks/c_dispatch.c), on the same
  client, executable and buffers; at 8 devices also next to ``jax.jit`` of
  the same add on inputs sharded over 8 CPU devices (a dispatch, not waited
  for, as ours);
- a 3-stage chain ``execute_async(execute_async(execute_async(x, y), y), y)``
  next to the C chain (each stage's output the next one's argument, each
  with its completion event);
- calls per second of ``execute_async`` on one executable from 1, 2 and 4
  threads, next to the C loop run from as many threads (each C call releases
  the GIL), which shows what the plugin and the machine allow, and next to
  jax.jit's compiled add called from as many threads (jax, too, releases the
  GIL around each execution).

    python -m benchmarks.sharded [--quick] [--json out.json]
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

# jax makes its CPU devices when it starts: 8 of them, asked for before any
# import of jax (pjrt_py's plugins take their device count as an option).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import numpy as np  # noqa: E402

import pjrt_py  # noqa: E402

from ._common import ADD_F32_8, cli, interleaved, load_c, machine, target  # noqa: E402

DEVICES = (1, 2, 4, 8)
OURS = "pjrt_py execute_sharded_async"
C_LOOP = "C: Execute over every device + events"
JAX = "jax.jit, inputs sharded over 8 devices"
CHAIN = "pjrt_py 3-stage execute_async chain"
C_CHAIN = "C: 3 chained Executes + events"
THREADS = (1, 2, 4)

_CDEF = (
    "double c_dispatch_loop_event(void*, void*, void**, size_t, size_t, long);"
    "double c_chain_loop_event(void*, void*, void*, void*, long, long);"
    "double c_sharded_loop_event(void*, void*, void**, size_t, size_t, size_t, long);"
)


def _c_library() -> tuple[Any, Any, Any]:
    return load_c("c_dispatch.c", _CDEF)


def sharded_timers(client: pjrt_py.Client, devices: int, c: tuple[Any, Any, Any]) -> dict[str, Any]:
    """Ours and the C loop, over ``devices`` devices of ``client``."""
    ffi, lib, addr = c
    exe = client.compile(ADD_F32_8, num_replicas=devices)
    x, y = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
    rows = [[client.buffer(x, device=d), client.buffer(y, device=d)] for d in exe.devices]
    for promise in exe.execute_sharded_async(rows):
        np.testing.assert_array_equal(promise.to_numpy(), x + y)  # the right numbers
    handles = ffi.new("void*[]", [addr(b._handle) for row in rows for b in row])
    api, exe_ptr = addr(client.plugin.address), addr(exe._loaded.address)

    def ours(k: int) -> None:
        call = exe.execute_sharded_async
        for _ in range(k - 1):
            call(rows)
        for last in call(rows):  # as the C loop: no work spills into the next timer
            last.block_until_ready()

    def c_loop(k: int) -> None:
        if lib.c_sharded_loop_event(api, exe_ptr, handles, devices, 2, 1, k) < 0:
            raise RuntimeError("the C loop got a PJRT error")

    c_loop.keep = (exe, rows, handles)  # type: ignore[attr-defined]
    return {C_LOOP: c_loop, OURS: ours}


def jax_sharded_timer(devices: int) -> Any:
    """jax.jit of the add on inputs sharded over ``devices`` CPU devices (None
    without jax, or with fewer devices)."""
    try:
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
    except ImportError:
        return None
    if len(jax.devices("cpu")) < devices:
        return None
    mesh = jax.make_mesh((devices,), ("x",), devices=jax.devices("cpu")[:devices])
    sharding = NamedSharding(mesh, P("x"))
    jx = jax.device_put(np.arange(8 * devices, dtype=np.float32), sharding)
    jy = jax.device_put(np.ones(8 * devices, np.float32), sharding)
    compiled = jax.jit(lambda a, b: a + b).lower(jx, jy).compile()
    np.testing.assert_array_equal(np.asarray(compiled(jx, jy)), np.asarray(jx) + 1)

    def jax_call(k: int) -> None:
        for _ in range(k - 1):
            compiled(jx, jy)
        compiled(jx, jy).block_until_ready()

    return jax_call


def chain_timers(client: pjrt_py.Client, c: tuple[Any, Any, Any]) -> dict[str, Any]:
    ffi, lib, addr = c
    exe = client.compile(ADD_F32_8)
    x = client.buffer(np.arange(8, dtype=np.float32))
    y = client.buffer(np.ones(8, np.float32))
    got = exe.execute_async(exe.execute_async(exe.execute_async(x, y), y), y).to_numpy()
    np.testing.assert_array_equal(got, np.arange(8, dtype=np.float32) + 3)
    api, exe_ptr = addr(client.plugin.address), addr(exe._loaded.address)
    xh, yh = addr(x._handle), addr(y._handle)

    def ours(k: int) -> None:
        call = exe.execute_async
        for _ in range(k - 1):
            call(call(call(x, y), y), y)
        call(call(call(x, y), y), y).block_until_ready()  # as the C chain's last

    def c_chain(k: int) -> None:
        if lib.c_chain_loop_event(api, exe_ptr, xh, yh, 3, k) < 0:
            raise RuntimeError("the C chain got a PJRT error")

    c_chain.keep = (exe, x, y)  # type: ignore[attr-defined]
    return {C_CHAIN: c_chain, CHAIN: ours}


def context_switches() -> int:
    """Voluntary context switches of the calling thread so far (0 where /proc
    cannot say): a thread that blocks, on the GIL or on a lock, switches once
    each time it does."""
    try:
        text = Path("/proc/thread-self/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def calls_per_second(work: Any, threads: int, seconds: float) -> tuple[float, float]:
    """Calls per second of ``work(k)`` (k calls) run by ``threads`` threads at
    once for about ``seconds``, and voluntary context switches per call."""
    counts, switches = [0] * threads, [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def run(i: int) -> None:
        start.wait()
        switched = context_switches()
        while not stop.is_set():
            work(64)
            counts[i] += 64
        switches[i] = context_switches() - switched

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    calls = max(sum(counts), 1)
    return calls / (time.perf_counter() - began), sum(switches) / calls


def thread_scaling(client: pjrt_py.Client, c: tuple[Any, Any, Any], quick: bool) -> Any:
    """(calls/s per thread count for ours and for the C loop)."""
    ffi, lib, addr = c
    exe = client.compile(ADD_F32_8)
    x = client.buffer(np.arange(8, dtype=np.float32))
    y = client.buffer(np.ones(8, np.float32))
    handles = ffi.new("void*[]", [addr(x._handle), addr(y._handle)])
    api, exe_ptr = addr(client.plugin.address), addr(exe._loaded.address)

    def ours(k: int) -> None:
        call = exe.execute_async
        for _ in range(k):
            call(x, y)

    def c_loop(k: int) -> None:  # cffi releases the GIL around the call
        if lib.c_dispatch_loop_event(api, exe_ptr, handles, 2, 1, k) < 0:
            raise RuntimeError("the C loop got a PJRT error")

    seconds = 0.05 if quick else 0.6
    rounds = 1 if quick else 3
    workers = [("pjrt_py", ours), ("C", c_loop)]
    jax_call = jax_one_device_loop()
    if jax_call is not None:
        workers.append(("jax", jax_call))
    rates: dict[str, dict[int, float]] = {who: {} for who, _ in workers}
    switches: dict[str, dict[int, float]] = {who: {} for who, _ in workers}
    for who, work in workers:
        for n in THREADS:  # the best of a few rounds: the machine is shared
            best = max(calls_per_second(work, n, seconds) for _ in range(rounds))
            rates[who][n], switches[who][n] = best
        pjrt_py.effects_barrier()
    return rates, switches


def jax_one_device_loop() -> Any:
    """``work(k)``: k calls of jax.jit's compiled add on one CPU device (None
    without jax), the same dispatch as ours, for the thread comparison."""
    try:
        import jax
    except ImportError:
        return None
    jx = jax.device_put(np.arange(8, dtype=np.float32), jax.devices("cpu")[0])
    jy = jax.device_put(np.ones(8, np.float32), jax.devices("cpu")[0])
    compiled = jax.jit(lambda a, b: a + b).lower(jx, jy).compile()

    def jax_loop(k: int) -> None:
        for _ in range(k):
            compiled(jx, jy)

    return jax_loop


def run(quick: bool = False) -> dict[str, Any]:
    n, repeats = (50, 2) if quick else (400, 15)
    c = _c_library()
    us: dict[str, dict[str, float]] = {}
    clients = []
    for devices in DEVICES:
        client = pjrt_py.Client(options={"cpu_device_count": devices})
        clients.append(client)
        timers = sharded_timers(client, devices, c)
        if devices == 8:
            jax_call = jax_sharded_timer(8)
            if jax_call is not None:
                timers[JAX] = jax_call
        us[str(devices)] = interleaved(timers, max(10, n // devices), repeats)
        pjrt_py.effects_barrier()
    main = pjrt_py.Client()
    chain = interleaved(chain_timers(main, c), n, repeats)
    threads, switches = thread_scaling(main, c, quick)
    for client in clients:
        client.close()

    targets = [
        target(f"execute_sharded_async / C loop, {d} device(s)", r[OURS] / r[C_LOOP], 1.3)
        for d, r in us.items()
    ]
    if JAX in us["8"]:
        targets.append(
            target("execute_sharded_async / jax.jit, 8 devices", us["8"][OURS] / us["8"][JAX], 0.6)
        )
    targets.append(target("3-stage chain / C chain", chain[CHAIN] / chain[C_CHAIN], 1.05))

    table = [["what", "us/call", "x C"]]
    for d, r in us.items():
        for name, value in r.items():
            table.append([f"{d} device(s): {name}", f"{value:.2f}", f"{value / r[C_LOOP]:.2f}"])
    for name, value in chain.items():
        table.append([name, f"{value:.2f}", f"{value / chain[C_CHAIN]:.2f}"])
    notes = []
    for who, rates in threads.items():
        base = rates[1]
        scaled = ", ".join(
            f"{t} threads {r / base:.2f}x ({switches[who][t]:.3f} switches/call)"
            for t, r in rates.items()
        )
        notes.append(f"{who} calls/s from threads on one executable: {base:,.0f} with 1; {scaled}")
    return {
        "benchmark": "sharded",
        "what": "execute_sharded_async over 1-8 CPU devices, a 3-stage chain, threads: us per call",
        "plugin": clients[0].plugin.path if clients else "",
        "us_per_call": us,
        "chain_us": chain,
        "threads_calls_per_s": {
            who: {str(k): v for k, v in r.items()} for who, r in threads.items()
        },
        "threads_switches_per_call": {
            who: {str(k): v for k, v in r.items()} for who, r in switches.items()
        },
        "targets": targets,
        "table": table,
        "notes": notes,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
