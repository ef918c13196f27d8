"""Exchanging arrays with numpy, jax and torch through DLPack, from 1 KiB to
256 MiB, next to a host copy of the same size, and a jax array round trip
through a pjrt_py execution, next to the same round trip with numpy.

- Export, a pjrt_py Buffer (made by ``client.buffer``) lent to another
  framework: ``np.from_dlpack(buf)``, ``pjrt_py.to_jax(buf)`` (and jax's own
  ``jnp.from_dlpack(buf)``, shown, not a target), ``torch.from_dlpack(buf)``.
- Import, another framework's array lent to pjrt_py:
  ``client.from_dlpack(x)`` of a numpy array from ``pjrt_py.aligned_empty``,
  of a jax array, and of a torch tensor over 64-byte aligned memory
  (``torch.from_numpy`` of an aligned array: torch aligns the tensors it
  allocates itself as well, but this does not leave the view to chance).
- The copies of the same bytes: ``np.copyto`` into a preallocated array, and
  pjrt_py's copying transfers ``client.buffer(x)`` and ``buf.to_numpy()``.

Every exported array and imported Buffer is dropped inside the timed loop, so
each call pays its release too and nothing accumulates. The exchanges take
turns with each other and the copies with each other, in separate rounds at
each size: a large copy leaves work behind it (freeing, faulting in pages)
that would fall on whichever exchange came next. At every size the
result of each exchange is checked once to share the producer's memory (its
data pointer against ``buf.unsafe_pointer()``); the report records it.
Zero-copy exchange should not grow with size: the targets compare the largest
size with the smallest.

The round trip of an f32[8] add: ``pjrt_py.to_jax(exe.execute(jx, jy))``
against pjrt_py's own buffer round trip with numpy as the host framework,
``exe.execute(nx, ny).to_numpy()``. Shown next to them: the same add on
Buffers already on the device, with torch tensors
(``pjrt_py.to_torch(exe.execute(tx, ty))``), and ``jax.jit`` of the add. The
jax round trip is also timed in pieces (jax's ``__dlpack__``, pjrt_py's
import, the execution, pjrt_py's export, jax's import); the notes say where
its time goes.

    python -m benchmarks.interop [--quick] [--json out.json]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import pjrt_py
from pjrt_py.interop import dlpack, frameworks

from ._common import ADD_F32_8, cli, interleaved, machine, median_seconds, target

KIB = 1024
MIB = 1024 * KIB
SIZES = [KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB]
QUICK_SIZES = [KIB, 64 * KIB]
FLATNESS_LIMIT = 3.0
ROUND_TRIP_LIMIT = 1.5

# Keys of the JSON and labels of the table. The copies first, then exports
# (a Buffer lent out), then imports (an array lent to pjrt_py).
COPY = "copy: np.copyto(dst, x)"
COPY_IN = "copy in: client.buffer(x)"
COPY_OUT = "copy out: buf.to_numpy()"
EXPORT = {
    "numpy": "export numpy: np.from_dlpack(buf)",
    "jax": "export jax: pjrt_py.to_jax(buf)",
    "torch": "export torch: torch.from_dlpack(buf)",
}
EXPORT_JNP = "export jax: jnp.from_dlpack(buf)"
IMPORT = {
    "numpy": "import numpy: client.from_dlpack(x)",
    "jax": "import jax: client.from_dlpack(jx)",
    "torch": "import torch: client.from_dlpack(tx)",
}
# The exchanges each flatness target is about: (direction, framework) -> key.
EXCHANGES = {
    **{("export", fw): key for fw, key in EXPORT.items()},
    **{("import", fw): key for fw, key in IMPORT.items()},
}

# The round trips of an f32[8] add; the first is the reference.
RT_NUMPY = "numpy -> execute -> to_numpy"
RT_JAX = "jax -> execute -> to_jax"
RT_BUFFERS = "Buffers -> execute (on the device)"
RT_TORCH = "torch -> execute -> to_torch"
RT_JAX_JIT = "jax.jit (jax's own)"

# The pieces they are made of (each timed alone, everything dropped per call).
P_JAX_DLPACK = "jx.__dlpack__() (jax's export)"
P_IMPORT_JAX = "client.from_dlpack(jx)"
P_EXEC_VIEWS = "execute on two held jax views"
P_EXEC_FRESH = "execute(from_dlpack(jx), from_dlpack(jy))"
P_EXEC_JAX = "execute(jx, jy)"
P_EXPORT = "out.__dlpack__() (pjrt_py's export)"
P_TO_JAX = "pjrt_py.to_jax(out)"
P_BUFFER = "client.buffer(nx)"
P_EXEC_NUMPY = "execute(nx, ny)"
P_TO_NUMPY = "out.to_numpy()"
P_TO_JAX_FRESH = "pjrt_py.to_jax(execute(bx, by))"
P_TO_NUMPY_FRESH = "execute(bx, by).to_numpy()"
P_IMPORT_NUMPY = "client.from_dlpack(aligned nx)"
P_EXEC_NUMPY_VIEWS = "execute(from_dlpack(aligned nx), ...)"


def _loop(fn: Callable[[], Any]) -> Callable[[int], None]:
    """A timer making k calls of ``fn``. Each call's result is dropped at once
    (an expression statement), so every call pays for releasing what it made."""

    def timed(k: int) -> None:
        for _ in range(k):
            fn()

    return timed


def _rounds(timers: dict[str, Callable[[int], None]], calls: int, repeats: int) -> dict[str, float]:
    """Median microseconds per call of each timer (``calls`` calls per sample),
    after a warm-up; the timers take turns within every round, so every one
    sees the same machine state."""
    for fn in timers.values():
        fn(calls)
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, fn in timers.items():
            samples[name].append(median_seconds(partial(fn, calls), 1, warmup=0) / calls)
    return {name: float(np.median(s)) * 1e6 for name, s in samples.items()}


def _repeats(nbytes: int, quick: bool) -> int:
    if quick:
        return 2
    return 15 if nbytes <= MIB else 9 if nbytes <= 16 * MIB else 7


def exchange(
    client: pjrt_py.Client, nbytes: int, quick: bool
) -> tuple[dict[str, float], dict[str, bool]]:
    """Median microseconds per call of every exchange and copy at one size,
    and whether each exchange shared the producer's memory."""
    import jax
    import jax.numpy as jnp
    import torch

    count = nbytes // 4
    x = pjrt_py.aligned_empty((count,), np.float32)
    x[...] = np.random.default_rng(0).random(count, dtype=np.float32)
    jx = jnp.array(x)  # jax's own memory (a copy)
    aligned = pjrt_py.aligned_empty((count,), np.float32)
    aligned[...] = x
    tx = torch.from_numpy(aligned)
    buf = client.buffer(x)
    dst = np.empty_like(x)
    from_dlpack, buffer, to_numpy, to_jax = (
        client.from_dlpack,
        client.buffer,
        buf.to_numpy,
        pjrt_py.to_jax,
    )
    np_from, jnp_from, torch_from = np.from_dlpack, jnp.from_dlpack, torch.from_dlpack
    copyto = np.copyto

    ptr = buf.unsafe_pointer()
    zero_copy = {
        EXPORT["numpy"]: np_from(buf).ctypes.data == ptr,
        EXPORT["jax"]: to_jax(buf).unsafe_buffer_pointer() == ptr,
        EXPORT_JNP: jnp_from(buf).unsafe_buffer_pointer() == ptr,
        EXPORT["torch"]: torch_from(buf).data_ptr() == ptr,
        IMPORT["numpy"]: from_dlpack(x).unsafe_pointer() == x.ctypes.data,
        IMPORT["jax"]: from_dlpack(jx).unsafe_pointer() == jx.unsafe_buffer_pointer(),
        IMPORT["torch"]: from_dlpack(tx).unsafe_pointer() == tx.data_ptr(),
    }
    if not np.array_equal(np_from(buf), x) or not np.array_equal(
        from_dlpack(tx).to_numpy(), np.asarray(jax.device_get(jx))
    ):
        raise RuntimeError("an exchange handed over other values than the producer holds")

    copies = {
        COPY: _loop(lambda: copyto(dst, x)),
        COPY_IN: _loop(lambda: buffer(x)),
        COPY_OUT: _loop(to_numpy),
    }
    exchanges = {
        EXPORT["numpy"]: _loop(lambda: np_from(buf)),
        EXPORT["jax"]: _loop(lambda: to_jax(buf)),
        EXPORT_JNP: _loop(lambda: jnp_from(buf)),
        EXPORT["torch"]: _loop(lambda: torch_from(buf)),
        IMPORT["numpy"]: _loop(lambda: from_dlpack(x)),
        IMPORT["jax"]: _loop(lambda: from_dlpack(jx)),
        IMPORT["torch"]: _loop(lambda: from_dlpack(tx)),
    }
    # Calls per sample: the exchanges are O(1), so a fixed count at every
    # size; the copies as many as make 256 KiB, at least one. The two groups
    # take turns within their own rounds: a large copy leaves work behind it
    # (freeing, faulting in pages) that would fall on whichever exchange came
    # next, and flatness is about the exchanges' own cost.
    us = _rounds(copies, 1 if quick else max(1, (256 * KIB) // nbytes), _repeats(nbytes, quick))
    us.update(_rounds(exchanges, 10 if quick else 100, 2 if quick else 15))
    return us, zero_copy


def round_trip(
    client: pjrt_py.Client, quick: bool
) -> tuple[dict[str, float], dict[str, float], dict[str, bool]]:
    """The f32[8] add round trips and their pieces, in us per call, and
    whether the jax and torch arguments and results were shared, not copied."""
    import jax
    import jax.numpy as jnp
    import torch

    exe = client.compile(ADD_F32_8)
    nx, ny = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
    ax, ay = pjrt_py.aligned_empty((8,), np.float32), pjrt_py.aligned_empty((8,), np.float32)
    ax[...], ay[...] = nx, ny
    jx, jy = jnp.asarray(nx), jnp.asarray(ny)
    tx, ty = torch.arange(8, dtype=torch.float32), torch.ones(8, dtype=torch.float32)
    bx, by = client.buffer(nx), client.buffer(ny)
    out = exe.execute(bx, by)
    vx, vy = client.from_dlpack(jx), client.from_dlpack(jy)
    execute, buffer, from_dlpack = exe.execute, client.buffer, client.from_dlpack
    to_jax, to_torch = pjrt_py.to_jax, pjrt_py.to_torch
    jit_add = jax.jit(lambda a, b: a + b)
    version = dlpack.VERSION  # what pjrt_py asks a producer for

    expected = nx + ny
    results = {
        RT_NUMPY: execute(nx, ny).to_numpy(),
        RT_JAX: np.asarray(to_jax(execute(jx, jy))),
        RT_BUFFERS: execute(bx, by).to_numpy(),
        RT_TORCH: to_torch(execute(tx, ty)).numpy(),
        RT_JAX_JIT: np.asarray(jit_add(jx, jy)),
    }
    for name, got in results.items():
        if not np.array_equal(got, expected):
            raise RuntimeError(f"{name} computed {got}, not {expected}")
    result = execute(jx, jy)
    shared = {
        "jax arguments viewed": from_dlpack(jx).unsafe_pointer() == jx.unsafe_buffer_pointer(),
        "jax result shared": to_jax(result).unsafe_buffer_pointer() == result.unsafe_pointer(),
        "torch arguments viewed": from_dlpack(tx).unsafe_pointer() == tx.data_ptr(),
        "torch result shared": to_torch(result).data_ptr() == result.unsafe_pointer(),
    }

    n, repeats = (20, 3) if quick else (200, 41)
    trip_timers = {
        RT_NUMPY: _loop(lambda: execute(nx, ny).to_numpy()),
        RT_JAX: _loop(lambda: to_jax(execute(jx, jy))),
        RT_BUFFERS: _loop(lambda: execute(bx, by)),
        RT_TORCH: _loop(lambda: to_torch(execute(tx, ty))),
        RT_JAX_JIT: _loop(lambda: jit_add(jx, jy).block_until_ready()),
    }
    piece_timers = {
        P_JAX_DLPACK: _loop(lambda: jx.__dlpack__(max_version=version)),
        P_IMPORT_JAX: _loop(lambda: from_dlpack(jx)),
        P_EXEC_VIEWS: _loop(lambda: execute(vx, vy)),
        P_EXEC_FRESH: _loop(lambda: execute(from_dlpack(jx), from_dlpack(jy))),
        P_EXEC_JAX: _loop(lambda: execute(jx, jy)),
        P_EXPORT: _loop(out.__dlpack__),
        P_TO_JAX: _loop(lambda: to_jax(out)),
        P_BUFFER: _loop(lambda: buffer(nx)),
        P_EXEC_NUMPY: _loop(lambda: execute(nx, ny)),
        P_TO_NUMPY: _loop(out.to_numpy),
        P_TO_JAX_FRESH: _loop(lambda: to_jax(execute(bx, by))),
        P_TO_NUMPY_FRESH: _loop(lambda: execute(bx, by).to_numpy()),
        P_IMPORT_NUMPY: _loop(lambda: from_dlpack(ax)),
        P_EXEC_NUMPY_VIEWS: _loop(lambda: execute(from_dlpack(ax), from_dlpack(ay))),
    }
    # One interleaved run of all of them, so the pieces add up against the
    # round trips they were measured beside.
    us = interleaved({**trip_timers, **piece_timers}, n, repeats)
    trips = {name: us[name] for name in trip_timers}
    pieces = {name: us[name] for name in piece_timers}
    return trips, pieces, shared


def breakdown(trips: dict[str, float], pieces: dict[str, float]) -> dict[str, dict[str, float]]:
    """The jax and the numpy round trip split into parts that add up to it, in
    us: each part a timed piece or the difference of two (on a busy machine
    a difference of medians can come out a little negative)."""
    p = pieces
    to_jax_fresh = p[P_TO_JAX_FRESH] - trips[RT_BUFFERS]  # to_jax of a new result
    to_numpy_fresh = p[P_TO_NUMPY_FRESH] - trips[RT_BUFFERS]
    return {
        "jax": {
            "jax's __dlpack__, 2 arguments": 2 * p[P_JAX_DLPACK],
            "pjrt_py's import (views made, and released after the execution), 2 arguments": (
                p[P_EXEC_JAX] - 2 * p[P_JAX_DLPACK] - p[P_EXEC_VIEWS]
            ),
            "execute on the views": p[P_EXEC_VIEWS],
            "pjrt_py's export (out.__dlpack__)": p[P_EXPORT],
            "jax's import (to_jax of a held result, beyond __dlpack__)": p[P_TO_JAX] - p[P_EXPORT],
            "to_jax of a new result, beyond a held one": to_jax_fresh - p[P_TO_JAX],
            "to_jax after execute on jax arguments, beyond after Buffers": (
                trips[RT_JAX] - p[P_EXEC_JAX] - to_jax_fresh
            ),
        },
        "numpy": {
            "client.buffer, 2 arguments": 2 * p[P_BUFFER],
            "execute on the Buffers": trips[RT_BUFFERS],
            "execute's argument path, beyond calling client.buffer": (
                p[P_EXEC_NUMPY] - 2 * p[P_BUFFER] - trips[RT_BUFFERS]
            ),
            "to_numpy of a held result": p[P_TO_NUMPY],
            "to_numpy of a new result, beyond a held one": to_numpy_fresh - p[P_TO_NUMPY],
            "to_numpy after execute on numpy arguments, beyond after Buffers": (
                trips[RT_NUMPY] - p[P_EXEC_NUMPY] - to_numpy_fresh
            ),
        },
    }


def notes(
    trips: dict[str, float],
    pieces: dict[str, float],
    parts: dict[str, dict[str, float]],
    met: bool,
) -> list[str]:
    """What the round-trip target measured, and where the jax round trip's time goes."""
    p = pieces
    ratio = trips[RT_JAX] / trips[RT_NUMPY]

    def split(framework: str) -> str:
        return "; ".join(f"{part} {us:.1f}" for part, us in parts[framework].items())

    return [
        f"Round trip f32[8]: jax {trips[RT_JAX]:.1f} us, numpy {trips[RT_NUMPY]:.1f} us: "
        f"{ratio:.2f}x, the {ROUND_TRIP_LIMIT:g}x target {'met' if met else 'missed'}. The add "
        f"on Buffers already on the device: {trips[RT_BUFFERS]:.1f} us; jax.jit of it: "
        f"{trips[RT_JAX_JIT]:.1f} us.",
        f"Where the jax round trip goes (us): {split('jax')}. "
        f"Together: {sum(parts['jax'].values()):.1f}.",
        f"The numpy round trip (us): {split('numpy')}. "
        f"Together: {sum(parts['numpy'].values()):.1f}.",
        f"Explicit views: {P_IMPORT_JAX} {p[P_IMPORT_JAX]:.1f} us (made and released unused; "
        f"{P_IMPORT_NUMPY} {p[P_IMPORT_NUMPY]:.1f} us); {P_EXEC_FRESH} {p[P_EXEC_FRESH]:.1f} us, "
        f"{p[P_EXEC_FRESH] - 2 * p[P_IMPORT_JAX] - p[P_EXEC_VIEWS]:.1f} us more than two such "
        f"views and execute on held ones (numpy: {P_EXEC_NUMPY_VIEWS} "
        f"{p[P_EXEC_NUMPY_VIEWS]:.1f} us, "
        f"{p[P_EXEC_NUMPY_VIEWS] - 2 * p[P_IMPORT_NUMPY] - p[P_EXEC_VIEWS]:.1f} us more).",
    ]


def run(quick: bool = False) -> dict[str, Any]:
    client = pjrt_py.Client()
    sizes = QUICK_SIZES if quick else SIZES
    rows, shared = [], []
    for nbytes in sizes:
        us, zero_copy = exchange(client, nbytes, quick)
        rows.append({"bytes": nbytes, **us})
        shared.append({"bytes": nbytes, **zero_copy})
    trips, pieces, rt_shared = round_trip(client, quick)
    parts = breakdown(trips, pieces)

    small, big = rows[0], rows[-1]
    span = f"{_size(big['bytes'])} / {_size(small['bytes'])}"
    flatness = {key: big[key] / small[key] for key in [*EXCHANGES.values(), EXPORT_JNP]}
    targets = [
        target(f"{direction} {fw} time, {span}", flatness[key], FLATNESS_LIMIT)
        for (direction, fw), key in EXCHANGES.items()
    ]
    rt_ratio = {name: v / trips[RT_NUMPY] for name, v in trips.items()}
    rt_target = target("round trip f32[8]: jax / numpy", rt_ratio[RT_JAX], ROUND_TRIP_LIMIT)
    targets.append(rt_target)

    table = [["what", "size", "us/call", "x ref", "zero-copy"]]
    for row, zc in zip(rows, shared, strict=True):
        ref = row[COPY]
        for key in (k for k in row if k != "bytes"):
            seen = ("yes" if zc[key] else "**no**") if key in zc else "copy"
            table.append(
                [key, _size(row["bytes"]), f"{row[key]:.2f}", f"{row[key] / ref:.2f}", seen]
            )
    rt_seen = {
        RT_NUMPY: "copy",
        RT_JAX: _yes(rt_shared["jax arguments viewed"] and rt_shared["jax result shared"]),
        RT_BUFFERS: "-",
        RT_TORCH: _yes(rt_shared["torch arguments viewed"] and rt_shared["torch result shared"]),
        RT_JAX_JIT: "-",
    }
    for name, v in trips.items():
        table.append(
            [f"round trip: {name}", "f32[8]", f"{v:.2f}", f"{rt_ratio[name]:.2f}", rt_seen[name]]
        )
    for name, v in pieces.items():
        table.append([f"piece: {name}", "f32[8]", f"{v:.2f}", f"{v / trips[RT_NUMPY]:.2f}", ""])
    return {
        "benchmark": "interop",
        "what": (
            "DLPack exchange with numpy, jax and torch against a host copy (x ref: np.copyto of "
            "the same size), and an f32[8] round trip (x ref: the numpy round trip): us per call"
        ),
        "sizes": sizes,
        "us_per_call": rows,
        "zero_copy": shared,
        "flatness": flatness,
        "round_trip_us": trips,
        "round_trip_ratio": rt_ratio,
        "round_trip_zero_copy": rt_shared,
        "pieces_us": pieces,
        "breakdown_us": parts,
        "to_jax_fast_path": frameworks._jax_import() is not None,
        "notes": notes(trips, pieces, parts, rt_target["met"]),
        "targets": targets,
        "table": table,
        "machine": machine(),
    }


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
