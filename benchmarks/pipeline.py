"""Seed 001's training-loop study: does async dispatch hide host work?

Each of n steps prepares the next batch on the host (a sleep, standing for
loading or preprocessing; it leaves the cores to the device) and runs a
device step sized to take about as long: ``(w, x) -> (w', loss)``, a chain
of dense matmuls. Three patterns:

- ``sync``: ``buffer`` -> ``execute`` -> ``to_numpy`` of the loss, every step.
- ``async``: ``buffer_async`` -> ``execute_async`` chained on the state,
  blocking once at the end.
- ``async+metrics``: as ``async``, and each step reads the *previous* step's
  loss with ``to_numpy_async`` (likely ready by then), as a logging loop would.

Overlap efficiency = (sync - async) / (sync - ideal), where ideal =
n * max(prep, compute) + min(prep, compute), from the median of three runs
of each pattern (the CPU plugin now and then runs a step inline at dispatch,
blocking the host for it; see tests/test_promise.py). Host and device intervals are
recorded (device: from dispatch or the previous step's end, to the moment
PJRT reported the step ready) and drawn as a timeline by benchmarks.report.

    python -m benchmarks.pipeline [--quick] [--json out.json]
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

import pjrt_py

from ._common import cli, machine, median_seconds, target

PATTERNS = ("sync", "async", "async+metrics")


def step_program(n: int, depth: int) -> str:
    """``(w, x) -> (w + 1e-3 * h, sum(h))`` with ``h = tanh(h @ w)`` depth times."""
    t = f"tensor<{n}x{n}xf32>"
    lines = [f"func.func @main(%w: {t}, %x: {t}) -> ({t}, tensor<f32>) {{"]
    h = "%x"
    for i in range(depth):
        lines.append(
            f"  %d{i} = stablehlo.dot_general {h}, %w, contracting_dims = [1] x [0]"
            f" : ({t}, {t}) -> {t}"
        )
        lines.append(f"  %h{i} = stablehlo.tanh %d{i} : {t}")
        h = f"%h{i}"
    lines += [
        f"  %rate = stablehlo.constant dense<1.0e-3> : {t}",
        f"  %step = stablehlo.multiply {h}, %rate : {t}",
        f"  %w1 = stablehlo.add %w, %step : {t}",
        "  %zero = stablehlo.constant dense<0.0> : tensor<f32>",
        f"  %loss = stablehlo.reduce({h} init: %zero) applies stablehlo.add across dimensions"
        f" = [0, 1] : ({t}, tensor<f32>) -> tensor<f32>",
        f"  return %w1, %loss : {t}, tensor<f32>",
        "}",
    ]
    return "\n".join(lines)


class Timeline:
    """Host and device intervals of one run, in seconds from its start."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.host: list[tuple[float, float]] = []
        self.dispatched: list[float] = []
        self.ready: list[float] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def watch(self, promise: pjrt_py.BufferPromise) -> None:
        """Record when PJRT reports the step done (on PJRT's thread)."""
        self.dispatched.append(self.now())
        index = len(self.ready)
        self.ready.append(float("nan"))

        def done(_: Any) -> None:
            self.ready[index] = self.now()

        promise.add_done_callback(done)

    def device(self) -> list[tuple[float, float]]:
        # Done callbacks run on PJRT's thread just after the work completes,
        # so the last ones may still be on their way when the host is done.
        deadline = time.perf_counter() + 10
        while any(math.isnan(t) for t in self.ready) and time.perf_counter() < deadline:
            time.sleep(0.001)
        if any(math.isnan(t) for t in self.ready):
            raise RuntimeError("a step's done callback did not run within 10 s")
        spans, previous_end = [], 0.0
        for start, ready in zip(self.dispatched, self.ready, strict=True):
            begin = max(start, previous_end)
            # Each step takes the previous step's state, so it cannot end first;
            # a callback that ran sooner (a step run inline calls it at once,
            # an earlier step's may wait for a busy PJRT thread) only looks so.
            end = max(ready, begin)
            spans.append((begin, end))
            previous_end = end
        return spans


def run_pattern(
    pattern: str,
    client: pjrt_py.Client,
    exe: pjrt_py.Executable,
    w0: np.ndarray[Any, Any],
    batches: list[np.ndarray[Any, Any]],
    prep: float,
) -> tuple[float, Timeline, list[float]]:
    """Run one pattern; returns (total seconds, timeline, losses)."""
    tl = Timeline()
    losses: list[float] = []

    def prepare(i: int) -> np.ndarray[Any, Any]:
        start = tl.now()
        time.sleep(prep)
        tl.host.append((start, tl.now()))
        return batches[i]

    if pattern == "sync":
        w = client.buffer(w0)
        for i in range(len(batches)):
            x = client.buffer(prepare(i))
            tl.dispatched.append(tl.now())
            w, loss = exe.execute(w, x)
            losses.append(float(loss.to_numpy()))
            tl.ready.append(tl.now())
    else:
        state: Any = client.buffer_async(w0)
        pending: list[pjrt_py.ArrayPromise] = []
        for i in range(len(batches)):
            out = exe.execute_async(state, client.buffer_async(prepare(i)))
            tl.watch(out)
            state = out[0]
            pending.append(out[1].to_numpy_async())
            if pattern == "async+metrics" and i > 0:
                losses.append(float(pending[i - 1].value()))  # the previous step's
        state.value()
        if pattern == "async+metrics":
            losses.append(float(pending[-1].value()))
        else:
            losses = [float(p.value()) for p in pending]
    return tl.now(), tl, losses


def run(quick: bool = False) -> dict[str, Any]:
    n_steps = 4 if quick else 16
    size, depth = (128, 2) if quick else (512, 32)
    client = pjrt_py.Client()
    exe = client.compile(step_program(size, depth))
    rng = np.random.default_rng(0)
    w0 = (rng.standard_normal((size, size)) / size).astype(np.float32)
    batches = [rng.standard_normal((size, size)).astype(np.float32) for _ in range(n_steps)]

    wb, xb = client.buffer(w0), client.buffer(batches[0])
    compute = median_seconds(lambda: exe.execute(wb, xb)[1].to_numpy(), 5 if quick else 9)
    prep = compute  # "a device computation sized to take about as long"
    ideal = n_steps * max(prep, compute) + min(prep, compute)

    totals: dict[str, float] = {}
    timelines: dict[str, Any] = {}
    losses: dict[str, list[float]] = {}
    runs: dict[str, list[tuple[float, Timeline, list[float]]]] = {p: [] for p in PATTERNS}
    for pattern in PATTERNS:
        run_pattern(pattern, client, exe, w0, batches[:2], prep)  # warm-up
    # Rounds over the patterns; the median run of each is reported and drawn.
    for _ in range(1 if quick else 3):
        for pattern in PATTERNS:
            runs[pattern].append(run_pattern(pattern, client, exe, w0, batches, prep))
    for pattern, done in runs.items():
        total, tl, got = sorted(done, key=lambda r: r[0])[len(done) // 2]
        totals[pattern] = total
        timelines[pattern] = {"host": tl.host, "device": tl.device()}
        losses[pattern] = got
    for pattern in PATTERNS[1:]:  # all patterns compute the same thing
        np.testing.assert_allclose(losses[pattern], losses["sync"], rtol=1e-4)

    sync = totals["sync"]
    efficiency = {p: (sync - totals[p]) / (sync - ideal) for p in PATTERNS[1:]}
    table = [["pattern", "total ms", "efficiency"]]
    table += [
        [p, f"{t * 1e3:.1f}", f"{efficiency[p]:.0%}" if p in efficiency else "-"]
        for p, t in totals.items()
    ]
    table.append(["ideal", f"{ideal * 1e3:.1f}", "100%"])
    return {
        "benchmark": "pipeline",
        "what": f"{n_steps} steps, prep = compute = {compute * 1e3:.1f} ms",
        "steps": n_steps,
        "prep_s": prep,
        "compute_s": compute,
        "ideal_s": ideal,
        "total_s": totals,
        "overlap_efficiency": efficiency,
        "timelines": timelines,
        "targets": [
            target(f"overlap efficiency, {p}", e, 0.9, "min") for p, e in efficiency.items()
        ],
        "table": table,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
