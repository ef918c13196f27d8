"""What traces, memory reports, dynamic shapes and raw executables cost.

Dispatch of an f32[8] add on two Buffers (``execute_async``), timed in turns
within one process: as it is; with a ``memory_watch`` block open; with a
``trace`` block open (every call records a span); after a trace block
closed; and the same add written with ``?`` dimensions
(``DynamicExecutable``, shapes seen before), also in jax's dimension-argument
form (its value, a numpy scalar, read each call). Then the cost of a ``memory_watch`` block
itself, and loading an executable from raw plugin bytes against compiling
it.

    python -m benchmarks.observability [--quick] [--json out.json]
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pjrt_py

from ._common import ADD_F32_8, cli, interleaved, machine, median_seconds, target

ADD_DYNAMIC = """
func.func @main(%x: tensor<?xf32>, %y: tensor<?xf32>) -> tensor<?xf32> {
  %0 = stablehlo.add %x, %y : tensor<?xf32>
  return %0 : tensor<?xf32>
}
"""

# jax's older convention: the dimension's value comes first, and a shape is built from it.
ADD_IOTA_DIM_ARG = """
func.func @main(%n: tensor<i64>, %x: tensor<?xf32>) -> tensor<?xf32> {
  %0 = stablehlo.convert %n : (tensor<i64>) -> tensor<i32>
  %1 = stablehlo.reshape %0 : (tensor<i32>) -> tensor<1xi32>
  %2 = stablehlo.dynamic_iota %1, dim = 0 : (tensor<1xi32>) -> tensor<?xf32>
  %3 = stablehlo.add %x, %2 : tensor<?xf32>
  return %3 : tensor<?xf32>
}
"""

STATIC = "execute_async"
WATCHED = "execute_async, memory_watch open"
TRACED = "execute_async, trace open"
AFTER_TRACE = "execute_async, after a trace block"
DYNAMIC = "DynamicExecutable, seen shapes"
DIM_ARG = "DynamicExecutable, dimension argument"


def run(quick: bool = False, n: int | None = None, repeats: int | None = None) -> dict[str, Any]:
    n = n or (200 if quick else 5000)
    repeats = repeats or (2 if quick else 9)
    client = pjrt_py.Client()
    exe = client.compile(ADD_F32_8)
    dynamic = client.compile(ADD_DYNAMIC)
    dim_arg = client.compile(ADD_IOTA_DIM_ARG)
    x = client.buffer(np.arange(8, dtype=np.float32))
    y = client.buffer(np.ones(8, dtype=np.float32))
    eight = np.int64(8)  # the dimension's value, as jax's callers pass it
    with pjrt_py.trace():  # installs and removes the recording methods once
        exe.execute_async(x, y)

    def loop(call: Any, *args: Any) -> Any:
        def timer(k: int) -> None:
            for _ in range(k):
                call(*args)

        return timer

    def watched(k: int) -> None:
        with pjrt_py.memory_watch(client):
            loop(exe.execute_async, x, y)(k)

    def traced(k: int) -> None:
        with pjrt_py.trace():
            loop(exe.execute_async, x, y)(k)

    timers = {
        STATIC: loop(exe.execute_async, x, y),
        WATCHED: watched,
        TRACED: traced,
        AFTER_TRACE: loop(exe.execute_async, x, y),
        DYNAMIC: loop(dynamic.execute_async, x, y),
        DIM_ARG: loop(dim_arg.execute_async, eight, x),
    }
    us = interleaved(timers, n, repeats)
    base = us[STATIC]

    def block() -> None:
        with pjrt_py.memory_watch(client):
            pass

    watch_us = median_seconds(lambda: [block() for _ in range(100)], repeats) / 100 * 1e6
    compile_ms = median_seconds(lambda: client.compile(ADD_F32_8, cache=False), repeats) * 1e3
    raw = exe.serialize(raw=True)
    load_ms = median_seconds(lambda: client.deserialize(raw, raw=True), repeats) * 1e3
    rows = [["what", "us", "x execute_async"]]
    rows += [[name, f"{v:.2f}", f"{v / base:.2f}"] for name, v in us.items()]
    rows += [
        [f"memory_watch block, {len(client.devices)} devices", f"{watch_us:.1f}", ""],
        ["compile, f32[8] add, no cache", f"{compile_ms * 1e3:.0f}", ""],
        ["deserialize(raw=True), the same", f"{load_ms * 1e3:.0f}", ""],
    ]
    return {
        "benchmark": "observability",
        "what": "dispatch with traces, memory reports and dynamic shapes; raw executables: us",
        "plugin": client.plugin.path,
        "pjrt_api": client.plugin.version_text,
        "n_per_round": n,
        "rounds": repeats,
        "us_per_call": us,
        "ratio_to_execute_async": {k: v / base for k, v in us.items()},
        "memory_watch_block_us": watch_us,
        "compile_ms": compile_ms,
        "deserialize_raw_ms": load_ms,
        "targets": [
            target("memory_watch open / dispatch", us[WATCHED] / base, 1.1),
            target("after a trace / dispatch", us[AFTER_TRACE] / base, 1.1),
            target("dynamic, seen shapes / dispatch", us[DYNAMIC] / base, 1.5),
        ],
        "table": rows,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
