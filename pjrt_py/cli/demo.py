"""Asynchronous dispatch with pjrt_py on the CPU plugin, step by step.

Run it with ``pjrt-py demo`` or ``python examples/async_pipeline.py`` (a few seconds; well under
15 s on a 2-core machine), or with ``--quick`` for a smaller version (used by
tests/test_examples.py). It prints four sections:

1. sync vs async: the same work with the blocking calls and with the
   ``*_async`` calls, and what "returns before the work is done" looks like;
2. chaining: feeding a promise straight into the next execution;
3. readiness: polling, timeouts, callbacks and ``await``;
4. a training-loop-style pipeline: overlapping host-side batch preparation
   with device compute.

Every number the device computes is checked against numpy, so a wrong result
stops the script with an AssertionError.

A word on the CPU plugin: XLA's CPU client runs *cheap* programs (a few
elementwise ops, small loops) inline, on the calling thread, while it
dispatches them. Only dense work -- here chains of large f32 matmuls -- is
handed to its worker threads, so only that shows a promise that is still
pending when ``execute_async`` returns. That is the plugin's decision, not
pjrt_py's: the binding itself never waits in ``execute_async``.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import pjrt_py
from pjrt_py.runtime.discovery import find_plugin


# -- programs ------------------------------------------------------------------
def matmul_chain(n: int, steps: int) -> str:
    """x -> tanh(x @ w), ``steps`` times: dense work the CPU plugin runs asynchronously.

    Adapted from ``matmul_chain`` in tests/conftest.py, which squares x
    (x -> tanh(x @ x)). Multiplying by a fixed, well-scaled ``w`` instead keeps
    long chains away from both zero and chaos, so the numpy check below
    compares meaningful numbers.
    """
    t = f"tensor<{n}x{n}xf32>"
    lines = [f"func.func @main(%x0: {t}, %w: {t}) -> {t} {{"]
    lines += _chain_body(t, steps)
    lines.append(f"  return %x{steps} : {t}")
    lines.append("}")
    return "\n".join(lines)


def train_step(n: int, layers: int, lr: float) -> str:
    """A stand-in for one training step: (w, batch) -> (new w, metric).

    h = the matmul chain applied to the batch; new w = w + lr * h;
    metric = sum(h * h), a scalar.
    """
    t = f"tensor<{n}x{n}xf32>"
    h = f"%x{layers}"
    lines = [f"func.func @main(%w: {t}, %x0: {t}) -> ({t}, tensor<f32>) {{"]
    lines += _chain_body(t, layers)
    lines += [
        f"  %lr = stablehlo.constant dense<{lr:e}> : {t}",
        f"  %step = stablehlo.multiply {h}, %lr : {t}",
        f"  %w1 = stablehlo.add %w, %step : {t}",
        f"  %sq = stablehlo.multiply {h}, {h} : {t}",
        "  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>",
        f"  %m = stablehlo.reduce(%sq init: %zero) applies stablehlo.add"
        f" across dimensions = [0, 1] : ({t}, tensor<f32>) -> tensor<f32>",
        f"  return %w1, %m : {t}, tensor<f32>",
        "}",
    ]
    return "\n".join(lines)


def _chain_body(t: str, steps: int) -> list[str]:
    lines = []
    for i in range(steps):
        lines.append(
            f"  %d{i} = stablehlo.dot_general %x{i}, %w, contracting_dims = [1] x [0]"
            f" : ({t}, {t}) -> {t}"
        )
        lines.append(f"  %x{i + 1} = stablehlo.tanh %d{i} : {t}")
    return lines


LR = 0.01  # the training step's update scale

# A cheap program: the CPU plugin runs it inline during dispatch.
ADD8 = """
func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


# -- numpy references ------------------------------------------------------------
def chain_ref(x: np.ndarray, w: np.ndarray, steps: int) -> np.ndarray:
    x, w = x.astype(np.float64), w.astype(np.float64)
    for _ in range(steps):
        x = np.tanh(x @ w)
    return x


def check(
    name: str, got: np.ndarray, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    diff = np.abs(np.asarray(got, np.float64) - want)
    err = float(np.max(diff) / max(float(np.max(np.abs(want))), 1e-30))
    print(f"   check {name}: matches numpy (max error {err:.1e} of the largest value)")


def header(title: str) -> None:
    print(f"\n== {title} ==")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


@dataclass
class Config:
    n: int  # matrices are n x n f32
    layers: int  # matmul + tanh pairs per execution
    steps: int  # training-loop steps


# -- 1. sync vs async ------------------------------------------------------------
def sync_vs_async(
    client: pjrt_py.Client, cfg: Config, x0: np.ndarray, w: np.ndarray
) -> tuple[pjrt_py.Executable, np.ndarray]:
    """Returns the executable and the numpy result of one execution."""
    header("1. sync vs async")
    exe = client.compile(matmul_chain(cfg.n, cfg.layers))
    want = chain_ref(x0, w, cfg.layers)
    exe.execute(client.buffer(x0), client.buffer(w))  # warm-up (first run is slower)

    # Blocking: each call returns once its work is complete.
    t0 = time.perf_counter()
    xb = client.buffer(x0)  # host -> device, waits
    wb = client.buffer(w)
    out = exe.execute(xb, wb)  # runs the program, waits
    got = out.to_numpy()  # device -> host, waits
    t_sync = time.perf_counter() - t0
    print(f"   sync : buffer + execute + to_numpy took {ms(t_sync)}")
    check("sync result", got, want)

    # Asynchronous: each call starts the work and returns a promise at once.
    t0 = time.perf_counter()
    xp = client.buffer_async(x0)  # BufferPromise
    wp = client.buffer_async(w)
    promise = exe.execute_async(xp, wp)  # promises are valid arguments
    t_dispatch = time.perf_counter() - t0
    pending = not promise.is_ready()  # is_ready() never blocks
    array_promise = pjrt_py.to_numpy_async(promise)  # queued behind the execution
    got = pjrt_py.value(array_promise)  # the only wait
    t_total = time.perf_counter() - t0
    print(
        f"   async: 2 x buffer_async + execute_async returned after {ms(t_dispatch)}, "
        f"is_ready() right after = {not pending}, value() done at {ms(t_total)}"
    )
    check("async result", got, want)

    # A cheap program shows the CPU plugin's inline execution.
    tiny = client.compile(ADD8)
    a = client.buffer(np.arange(8, dtype=np.float32))
    tiny_promise = tiny.execute_async(a, a)
    print(
        f"   a tiny add: is_ready() right after execute_async = {tiny_promise.is_ready()} "
        "(the CPU plugin ran it inline during dispatch)"
    )
    check("tiny add", pjrt_py.value(tiny_promise).to_numpy(), 2 * np.arange(8.0))
    return exe, want


# -- 2. chaining -------------------------------------------------------------------
def chaining(
    client: pjrt_py.Client,
    cfg: Config,
    exe: pjrt_py.Executable,
    x0: np.ndarray,
    w: np.ndarray,
    want1: np.ndarray,
) -> None:
    """``want1``: the numpy result of one execution (section 1's)."""
    header("2. chaining: promises into executions, one wait at the end")
    wp = client.buffer_async(w)
    t0 = time.perf_counter()
    p1 = exe.execute_async(client.buffer_async(x0), wp)
    p2 = exe.execute_async(p1, wp)  # no host wait: PJRT orders p2 after p1
    p3 = exe.execute_async(p2, wp)
    result = p3.to_numpy_async()
    t_dispatch = time.perf_counter() - t0
    print(
        f"   dispatched 3 executions + a copy in {ms(t_dispatch)}; "
        f"ready: {[p.is_ready() for p in (p1, p2, p3)]}"
    )
    got = result.value()
    print(f"   value() returned after {ms(time.perf_counter() - t0)}")
    check("3 chained executions", got, chain_ref(want1, w, 2 * cfg.layers))


# -- 3. readiness ----------------------------------------------------------------
def readiness(
    client: pjrt_py.Client, exe: pjrt_py.Executable, x0: np.ndarray, w: np.ndarray, want: np.ndarray
) -> None:
    header("3. readiness: polling, timeouts, callbacks, await")
    xb, wb = client.buffer(x0), client.buffer(w)

    # Polling: is_ready() answers at once, so the host can do other things.
    promise = exe.execute_async(xb, wb)
    polls, host_work = 0, 0.0
    while not pjrt_py.is_ready(promise):
        polls += 1
        host_work += float(np.sin(np.arange(1000.0)).sum())  # something useful
    print(
        f"   polling: {polls} is_ready() calls (with host work between them) before it turned True"
    )
    check("polled result", promise.to_numpy(), want)

    # A timeout: value(timeout=...) raises TimeoutError; the work goes on.
    promise = exe.execute_async(xb, wb)
    try:
        promise.value(timeout=1e-4)
        print("   timeout: the work was already done, so no TimeoutError this time")
    except TimeoutError as exc:
        print(f"   timeout: value(timeout=1e-4) raised TimeoutError({exc})")
    check("result after the timeout", promise.to_numpy(), want)

    # A callback: runs on a PJRT thread when the work completes.
    promise = exe.execute_async(xb, wb)
    fired = threading.Event()
    seen: dict[str, object] = {}

    def on_done(p: pjrt_py.Promise[Any]) -> None:
        # Keep callbacks short and thread-safe: record, signal, return.
        seen["thread"] = threading.current_thread().name
        seen["main"] = threading.current_thread() is threading.main_thread()
        seen["ready"] = p.is_ready()
        fired.set()

    promise.add_done_callback(on_done)
    assert fired.wait(60), "the callback never ran"
    print(
        f"   callback: ran on thread {seen['thread']!r} (main thread: {seen['main']}), "
        f"promise ready: {seen['ready']}"
    )
    check("callback's result", promise.to_numpy(), want)

    # await: the event loop keeps running while the device works.
    async def compute() -> tuple[np.ndarray, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        buf = await exe.execute_async(xb, wb)  # a Buffer, once computed
        array = await buf.to_numpy_async()  # a numpy array, once copied
        task.cancel()
        return array, ticks

    array, ticks = asyncio.run(compute())
    print(f"   await: the event loop ran {ticks} other steps while awaiting")
    check("awaited result", array, want)


# -- 4. training-loop-style pipeline -------------------------------------------
def prepare_batch(step: int, n: int, prep: float) -> np.ndarray:
    """Host-side batch preparation that takes ``prep`` seconds."""
    deadline = time.perf_counter() + prep
    batch = np.random.default_rng(1000 + step).standard_normal((n, n)).astype(np.float32)
    time.sleep(max(0.0, deadline - time.perf_counter()))  # stands in for real work
    return batch


def training_loop(client: pjrt_py.Client, cfg: Config, w0: np.ndarray) -> None:
    header(f"4. training-loop pipeline ({cfg.steps} steps)")
    exe = client.compile(train_step(cfg.n, cfg.layers, LR))

    # Measure one step's device time, to size the host work to match it.
    batch = prepare_batch(0, cfg.n, 0.0)
    wb = client.buffer(w0)
    exe.execute(wb, client.buffer(batch))  # warm-up
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        exe.execute(wb, client.buffer(batch))
        times.append(time.perf_counter() - t0)
    compute = float(np.median(times))
    prep = min(max(compute, 0.005), 0.5)
    print(f"   one step on the device: {ms(compute)}; host prep per batch: {ms(prep)}")

    # numpy reference: the same steps in float64.
    w_ref, metrics_ref = w0.astype(np.float64), []
    for i in range(cfg.steps):
        h = chain_ref(prepare_batch(i, cfg.n, 0.0), w_ref, cfg.layers)
        w_ref = w_ref + LR * h
        metrics_ref.append(float((h * h).sum()))

    # Sync: prepare, run, wait, read the metric; the device idles during prep
    # and the host idles during compute.
    t0 = time.perf_counter()
    w = client.buffer(w0)
    metrics_sync = []
    for i in range(cfg.steps):
        batch = prepare_batch(i, cfg.n, prep)
        w, metric = exe.execute(w, client.buffer(batch))
        metrics_sync.append(float(metric.to_numpy()))
    w_sync = w.to_numpy()
    t_sync = time.perf_counter() - t0

    # Async: dispatch step i, prepare batch i+1 while the device computes,
    # then read step i-1's metric (long done, so that wait is free). The only
    # real wait is at the end.
    t0 = time.perf_counter()
    w_promise = client.buffer_async(w0)
    metrics_async: list[float] = []
    previous: pjrt_py.ArrayPromise | None = None
    batch = prepare_batch(0, cfg.n, prep)
    for i in range(cfg.steps):
        out = exe.execute_async(w_promise, client.buffer_async(batch))
        w_promise = out[0]  # the new weights feed the next step directly
        metric = out[1].to_numpy_async()  # copied back once the step is done
        if i + 1 < cfg.steps:
            batch = prepare_batch(i + 1, cfg.n, prep)  # overlaps the device work
        if previous is not None:
            metrics_async.append(float(previous.value()))
        previous = metric
    assert previous is not None
    metrics_async.append(float(previous.value()))
    w_async = pjrt_py.value(w_promise.to_numpy_async())
    t_async = time.perf_counter() - t0

    print(
        f"   sync  total: {ms(t_sync)}  (about steps x (prep + compute) = "
        f"{ms(cfg.steps * (prep + compute))})"
    )
    print(
        f"   async total: {ms(t_async)}  (about prep + steps x max(prep, compute) = "
        f"{ms(prep + cfg.steps * max(prep, compute))})"
    )
    print(f"   speed-up: {t_sync / t_async:.2f}x")
    check("sync metrics", np.array(metrics_sync), np.array(metrics_ref))
    check("async metrics", np.array(metrics_async), np.array(metrics_ref))
    check("sync final weights", w_sync, w_ref)
    check("async final weights", w_async, w_ref)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller matrices and fewer steps (a few seconds)"
    )
    parser.add_argument(
        "--plugin",
        help="the plugin to run on, as pjrt-py run takes it (default: $PJRT_PLUGIN, else cpu)",
    )
    args = parser.parse_args(argv)
    cfg = Config(n=768, layers=4, steps=3) if args.quick else Config(n=1000, layers=8, steps=6)

    start = time.perf_counter()
    # The resolver every --plugin goes through (pjrt_py.runtime.discovery.find_plugin).
    plugin = None if args.plugin is None else find_plugin(args.plugin, origin="--plugin")
    client = pjrt_py.Client(plugin)
    print(
        f"client: {client!r}; matrices {cfg.n}x{cfg.n} f32, {cfg.layers} matmul+tanh per execution"
    )
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((cfg.n, cfg.n)).astype(np.float32)
    w = (rng.standard_normal((cfg.n, cfg.n)) / np.sqrt(cfg.n)).astype(np.float32)

    exe, want = sync_vs_async(client, cfg, x0, w)
    chaining(client, cfg, exe, x0, w, want)
    readiness(client, exe, x0, w, want)
    training_loop(client, cfg, w)
    print(f"\nall checks passed in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
