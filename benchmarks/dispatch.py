"""Dispatch cost: ``execute_async`` per call on an f32[8] add, next to a raw
C loop of ``PJRT_LoadedExecutable_Execute`` + output destroy on the same
plugin, client, executable and arguments (and jax's compiled call, when jax is
installed). All figures come from one process run; the ratios are what count.

    python -m benchmarks.dispatch [--n 20000] [--repeats 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

import pjrt_py

from ._common import ADD_F32_8, build_c, machine, per_call


def run(n: int = 20000, repeats: int = 15) -> dict[str, Any]:
    from cffi import FFI

    client = pjrt_py.Client()
    exe = client.compile(ADD_F32_8)
    x = client.buffer(np.arange(8, dtype=np.float32))
    y = client.buffer(np.ones(8, dtype=np.float32))

    ffi = FFI()
    ffi.cdef(
        "double c_dispatch_loop(void* api, void* exe, void** args, size_t num_args,"
        " size_t num_outputs, long iterations);"
    )
    c = ffi.dlopen(str(build_c("c_dispatch.c")))
    from pjrt_py._ffi import ffi as our_ffi

    def addr(p: Any) -> Any:
        return ffi.cast("void*", int(our_ffi.cast("uintptr_t", p)))

    args = ffi.new("void*[]", [addr(x._ptr), addr(y._ptr)])
    api, exe_ptr = addr(client._api), addr(exe._ptr)

    def c_loop(k: int) -> None:
        if c.c_dispatch_loop(api, exe_ptr, args, 2, 1, k) < 0:
            raise RuntimeError("the C loop got a PJRT error")

    def ours(k: int) -> None:
        call = exe.execute_async
        for _ in range(k):
            call(x, y)

    timers = {"c_loop": c_loop, "pjrt_py.execute_async": ours}
    try:
        import jax

        jx = jax.device_put(np.arange(8, dtype=np.float32))
        jy = jax.device_put(np.ones(8, np.float32))
        compiled = jax.jit(lambda a, b: a + b).lower(jx, jy).compile()

        def jax_call(k: int) -> None:
            for _ in range(k):
                compiled(jx, jy)

        timers["jax.compiled"] = jax_call
    except ImportError:
        pass

    for fn in timers.values():  # warm-up
        fn(n // 10)
    # Interleave the timers per round so machine noise hits all alike.
    samples: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(repeats):
        for name, fn in timers.items():
            samples[name].append(per_call(fn, n, 1))
    results = {name: float(np.median(s)) * 1e6 for name, s in samples.items()}
    base = results["c_loop"]
    report: dict[str, Any] = {
        "benchmark": "dispatch",
        "program": "f32[8] add, 2 buffer args, 1 output",
        "plugin": client.plugin.path,
        "pjrt_api": client.plugin.version_text,
        "n_per_round": n,
        "rounds": repeats,
        "us_per_call": results,
        "ratio_to_c_loop": {k: v / base for k, v in results.items()},
        "machine": machine(),
    }
    if "jax.compiled" in results:
        report["ratio_to_jax"] = {k: v / results["jax.compiled"] for k, v in results.items()}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", help="write the report here")
    opts = parser.parse_args()
    report = run(opts.n, opts.repeats)
    print(f"{'what':28s} {'us/call':>9s} {'x C loop':>9s}")
    for name, us in report["us_per_call"].items():
        print(f"{name:28s} {us:9.2f} {report['ratio_to_c_loop'][name]:9.2f}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
