"""Small-array latency next to jax, in one run: a round trip (host -> device,
execute an add, device -> host) and a small host-to-device copy.

The round trip is timed in two forms. "async" is the program jax runs
(``device_put`` and the call return at once, ``np.asarray`` waits once):
``buffer_async`` -> ``execute_async`` -> ``to_numpy_async().value()``. "sync"
uses the blocking forms (``buffer`` -> ``execute`` -> ``to_numpy``), which wait
three times. The async form is timed again without the CPU direct read of small
results (``DIRECT_READ_BYTES`` in pjrt_py/buffer.py) and without the wait's
spin phase (include/pjrt_py/event.c), to show what each gains.

    python -m benchmarks.small [--quick] [--json out.json]
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pjrt_py
from pjrt_py import _core

from ._common import cli, interleaved, machine, target

SIZES = (8, 4096)


def _add(n: int) -> str:
    t = f"tensor<{n}xf32>"
    return (
        f"func.func @main(%x: {t}, %y: {t}) -> {t} {{\n"
        f"  %0 = stablehlo.add %x, %y : {t}\n  return %0 : {t}\n}}"
    )


def _without(fn: Any, client: pjrt_py.Client, direct: bool, spin: bool) -> Any:
    """``fn`` run with the CPU direct read and/or the wait's spin phase off."""

    def timed(k: int) -> None:
        spin_ns, fast = _core.spin_ns(), client._cpu_fast_paths
        _core.set_spin_ns(0 if spin else spin_ns)
        client._cpu_fast_paths = fast and not direct
        try:
            fn(k)
        finally:
            _core.set_spin_ns(spin_ns)
            client._cpu_fast_paths = fast

    return timed


def round_trip(client: pjrt_py.Client, size: int, n: int, repeats: int) -> dict[str, float]:
    import jax

    a = np.arange(size, dtype=np.float32)
    b = np.ones(size, np.float32)
    exe = client.compile(_add(size))
    compiled = jax.jit(lambda x, y: x + y).lower(a, b).compile()
    put, asarray = jax.device_put, np.asarray
    buffer, buffer_async = client.buffer, client.buffer_async

    def ours_async(k: int) -> None:
        call = exe.execute_async
        for _ in range(k):
            call(buffer_async(a), buffer_async(b)).to_numpy_async().value()

    def ours_sync(k: int) -> None:
        call = exe.execute
        for _ in range(k):
            call(buffer(a), buffer(b)).to_numpy()

    def jax_round_trip(k: int) -> None:
        for _ in range(k):
            asarray(compiled(put(a), put(b)))

    return interleaved(
        {
            "pjrt_py async": ours_async,
            "pjrt_py async, plugin copy": _without(ours_async, client, direct=True, spin=False),
            "pjrt_py async, plugin copy, no spin": _without(
                ours_async, client, direct=True, spin=True
            ),
            "pjrt_py sync": ours_sync,
            "jax": jax_round_trip,
        },
        n,
        repeats,
    )


def host_to_device(client: pjrt_py.Client, n: int, repeats: int) -> dict[str, float]:
    import jax

    a = np.arange(8, dtype=np.float32)
    buffer, buffer_async, put = client.buffer, client.buffer_async, jax.device_put

    def ours(k: int) -> None:
        for _ in range(k):
            buffer(a)

    def ours_async(k: int) -> None:
        for _ in range(k):
            buffer_async(a)

    def jax_put(k: int) -> None:
        for _ in range(k):
            put(a)

    return interleaved(
        {"pjrt_py buffer": ours, "pjrt_py buffer_async": ours_async, "jax device_put": jax_put},
        n,
        repeats,
    )


def run(quick: bool = False) -> dict[str, Any]:
    n, repeats = (100, 2) if quick else (5000, 11)
    client = pjrt_py.Client()
    trips = {str(size): round_trip(client, size, n, repeats) for size in SIZES}
    h2d = host_to_device(client, n, repeats)
    targets = [
        target(f"round trip f32[{s}] / jax", r["pjrt_py async"] / r["jax"], 0.75)
        for s, r in trips.items()
    ]
    targets.append(
        target("buffer f32[8] / jax device_put", h2d["pjrt_py buffer"] / h2d["jax device_put"], 0.5)
    )
    table = [["what", "us/call", "x jax"]]
    for size, r in trips.items():
        table += [[f"rt f32[{size}] {k}", f"{v:.2f}", f"{v / r['jax']:.2f}"] for k, v in r.items()]
    table += [
        [f"h2d f32[8] {k}", f"{v:.2f}", f"{v / h2d['jax device_put']:.2f}"] for k, v in h2d.items()
    ]
    return {
        "benchmark": "small",
        "what": "round trip and small host-to-device copy, next to jax: us per call",
        "round_trip_us": trips,
        "h2d_us": h2d,
        "spin_ns": _core.spin_ns(),
        "targets": targets,
        "table": table,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
