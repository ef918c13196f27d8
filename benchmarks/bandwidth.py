"""Host <-> device bandwidth from 1 KiB to 256 MiB (1 GiB off CPU), pjrt_py's
paths next to jax's and torch's, all in one run.

- ``np.copy``: allocate and copy the same array (the host's own speed).
- H2D from a plain numpy array: ``client.buffer(x)`` (returns when the data is
  there) as configured (``h2d copy``), with staging off (``h2d unstaged``:
  the plugin's own copy) and forced on (``h2d staged``: pjrt_py's ring, see
  pjrt_py.runtime.staging); the plugin's copy in plain C
  (benchmarks/c_transfer.c). On CPU also ``client.buffer(x, zero_copy=True)``
  (should not grow with size) and the plugin's copy with pjrt_py's CPU
  staging off (``h2d copy, plugin``).
- D2H into a new numpy array: ``buffer.to_numpy()`` as configured, unstaged and
  staged, and the plugin's copy in C.
- jax: ``jax.device_put(x, device)`` and ``np.asarray(array)`` on a device of
  the same platform. torch (GPU only): ``.to(device)`` from pageable and from
  pinned memory, ``.cpu()`` into pageable memory and ``copy_`` into pinned.
  What is absent is skipped, with a note saying so.

On a CPU plugin the figures only say how each path copies host memory; the
target they are for, at least 40 GB/s both ways from plain numpy at 64 MiB
and more, is a GPU's (an H100 over PCIe 5).

    python -m benchmarks.bandwidth [--quick] [--json out.json]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import pjrt_py
from pjrt_py.runtime import staging
from pjrt_py.runtime.capi import lib

from ._common import cli, load_c, machine, median_seconds, target

KIB = 1024
MIB = 1024 * KIB
SIZES = [KIB * 4**i for i in range(10)]  # 1 KiB, 4 KiB, ..., 256 MiB
QUICK_SIZES = [KIB, 64 * KIB, MIB]
FOR_TARGET = 16 * MIB
GPU_TARGET_BYTES = 64 * MIB
GPU_TARGET_GBS = 40.0

Timer = Callable[[], None]


def _c_baseline(client: pjrt_py.Client) -> tuple[Callable[..., None], Callable[..., None]]:
    ffi, c, addr = load_c(
        "c_transfer.c",
        "double c_h2d(void*, void*, void*, void*, int, int64_t*, size_t, int, long);"
        "double c_d2h(void*, void*, void*, size_t, long);",
    )
    api = addr(client.plugin.address)
    cl, dev = addr(client._handle), addr(client.devices[0]._addr)
    copy = lib.PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
    f64 = lib.PJRT_Buffer_Type_F64

    def h2d(x: np.ndarray[Any, Any]) -> None:
        dims = ffi.new("int64_t[]", [x.size])
        if c.c_h2d(api, cl, dev, ffi.from_buffer(x), f64, dims, 1, copy, 1) < 0:
            raise RuntimeError("PJRT error in the C baseline")

    def d2h(buf: pjrt_py.Buffer, nbytes: int) -> None:
        dst = np.empty(nbytes, np.uint8)  # a new array each time, as to_numpy makes
        if c.c_d2h(api, addr(buf._handle), ffi.from_buffer(dst), nbytes, 1) < 0:
            raise RuntimeError("PJRT error in the C baseline")

    return h2d, d2h


@dataclass
class Case:
    """One transfer to time: ``fn`` per call, after an untimed ``setup(k)`` for
    the k calls of a sample, with the client's staging in ``mode`` (None: as
    configured) while the sample runs."""

    fn: Timer
    setup: Callable[[int], None] | None = None
    mode: str | None = None


def _jax(platform: str, notes: list[str]) -> Any:
    try:
        import jax  # noqa: PLC0415

        return jax.devices("gpu" if platform in ("cuda", "rocm") else platform)[0]
    except Exception as e:  # noqa: BLE001 (absent, or no device of that platform)
        notes.append(f"jax skipped: {type(e).__name__}: {str(e)[:120]}")
        return None


def _torch(platform: str, notes: list[str]) -> Any:
    if platform == "cpu":
        notes.append("torch skipped: a CPU plugin has no device for torch to copy to")
        return None
    try:
        import torch  # noqa: PLC0415

        if not torch.cuda.is_available():
            notes.append("torch skipped: torch sees no CUDA device")
            return None
        return torch
    except Exception as e:  # noqa: BLE001
        notes.append(f"torch skipped: {type(e).__name__}: {str(e)[:120]}")
        return None


def _repeats(nbytes: int, quick: bool) -> int:
    if quick:
        return 2
    return 25 if nbytes <= MIB else 9 if nbytes <= 16 * MIB else 5


def cases(
    client: pjrt_py.Client, c: tuple[Any, Any], jdev: Any, torch: Any, nbytes: int
) -> dict[str, Case]:
    """The transfers to time at one size."""
    c_h2d, c_d2h = c
    x = np.random.default_rng(0).random(nbytes // 8)
    buf = client.buffer(x)
    out: dict[str, Case] = {
        "np.copy": Case(lambda: np.copy(x)),
        "h2d copy": Case(lambda: client.buffer(x)),
        "h2d unstaged": Case(lambda: client.buffer(x), mode="off"),
        "h2d staged": Case(lambda: client.buffer(x), mode="on"),
    }
    if client.platform_name == "cpu":

        def plugin_copy() -> None:
            client._cpu_fast_paths = False
            try:
                client.buffer(x)
            finally:
                client._cpu_fast_paths = True

        aligned = pjrt_py.aligned_empty(x.shape, x.dtype)
        aligned[...] = x
        out["h2d copy, plugin"] = Case(plugin_copy)
        out["h2d zero-copy"] = Case(lambda: client.buffer(aligned, zero_copy=True))
    out["h2d copy, C"] = Case(lambda: c_h2d(x))
    out["d2h"] = Case(lambda: buf.to_numpy())
    out["d2h unstaged"] = Case(lambda: buf.to_numpy(), mode="off")
    out["d2h staged"] = Case(lambda: buf.to_numpy(), mode="on")
    out["d2h, C"] = Case(lambda: c_d2h(buf, nbytes))
    if jdev is not None:
        out.update(_jax_cases(jdev, x))
    if torch is not None:
        out.update(_torch_cases(torch, x))
    return out


def _jax_cases(jdev: Any, x: np.ndarray[Any, Any]) -> dict[str, Case]:
    import jax  # noqa: PLC0415

    on_device = jax.device_put(x, jdev).block_until_ready()
    fresh: list[Any] = []  # a jax.Array keeps its host copy: each read needs a new one

    def make(k: int) -> None:
        fresh[:] = [on_device.copy().block_until_ready() for _ in range(k)]

    return {
        "jax device_put": Case(lambda: jax.device_put(x, jdev).block_until_ready()),
        "jax np.asarray": Case(lambda: np.asarray(fresh.pop()), setup=make),
    }


def _torch_cases(torch: Any, x: np.ndarray[Any, Any]) -> dict[str, Case]:
    host = torch.from_numpy(x)
    pinned = host.pin_memory()
    on_gpu = host.to("cuda")
    pinned_out = torch.empty_like(pinned).pin_memory()

    def synced(fn: Callable[[], Any]) -> Case:
        return Case(lambda: (fn(), torch.cuda.synchronize())[1])

    return {
        "torch h2d pageable": synced(lambda: host.to("cuda")),
        "torch h2d pinned": synced(lambda: pinned.to("cuda", non_blocking=True)),
        "torch d2h pageable": synced(lambda: on_gpu.cpu()),
        "torch d2h pinned": synced(lambda: pinned_out.copy_(on_gpu, non_blocking=True)),
    }


def measure(
    client: pjrt_py.Client, c: tuple[Any, Any], jdev: Any, torch: Any, nbytes: int, quick: bool
) -> dict[str, Any]:
    """Median seconds per transfer of every method at one size."""
    todo = cases(client, c, jdev, torch, nbytes)
    configured = staging.stats(client)
    # Several calls per sample for small sizes, so the timer's own cost fades;
    # zero-copy is O(1) per call: timed over 20 calls per sample at every size.
    inner = 1 if quick else max(1, (256 * KIB) // nbytes)

    def sample(name: str, case: Case) -> float:
        k = 20 if name == "h2d zero-copy" else inner
        if case.setup is not None:
            case.setup(k)
        if case.mode is not None:
            staging.configure(client, mode=case.mode, min_bytes=1)
        try:

            def timed() -> None:
                for _ in range(k):
                    case.fn()

            return median_seconds(timed, 1, warmup=0) / k
        finally:
            if case.mode is not None:
                mode, least = configured["requested"], configured["min_bytes"]
                staging.configure(client, mode=mode, min_bytes=least)

    for name, case in todo.items():
        sample(name, case)  # warm-up
    # Interleave per round: every method sees the same machine state.
    samples: dict[str, list[float]] = {name: [] for name in todo}
    for _ in range(_repeats(nbytes, quick)):
        for name, case in todo.items():
            samples[name].append(sample(name, case))
    return {"bytes": nbytes, **{name: float(np.median(s)) for name, s in samples.items()}}


def _targets(rows: list[dict[str, Any]], cpu: bool) -> list[dict[str, Any]]:
    if cpu:
        big = [r for r in rows if r["bytes"] >= FOR_TARGET]
        if not big:
            return []
        return [
            target(
                "h2d copy speed / np.copy (worst, >= 16 MiB)",
                min(r["np.copy"] / r["h2d copy"] for r in big),
                0.8,
                "min",
            ),
            target(
                "d2h speed / np.copy (worst, >= 16 MiB)",
                min(r["np.copy"] / r["d2h"] for r in big),
                0.8,
                "min",
            ),
            target(
                "h2d zero-copy time, 256 MiB / 1 KiB",
                rows[-1]["h2d zero-copy"] / rows[0]["h2d zero-copy"],
                3.0,
            ),
        ]
    big = [r for r in rows if r["bytes"] >= GPU_TARGET_BYTES]
    if not big:
        return []
    return [
        target(
            f"{way} GB/s from plain numpy (worst, >= 64 MiB)",
            min(r["bytes"] / r[way] / 1e9 for r in big),
            GPU_TARGET_GBS,
            "min",
        )
        for way in ("h2d copy", "d2h")
    ]


def run(quick: bool = False) -> dict[str, Any]:
    client = pjrt_py.Client()
    cpu = client.platform_name == "cpu"
    notes: list[str] = []
    jdev = _jax(client.platform_name, notes)
    torch = _torch(client.platform_name, notes)
    c = _c_baseline(client)
    sizes = QUICK_SIZES if quick else SIZES if cpu else [*SIZES, 1024 * MIB]
    rows = []
    for nbytes in sizes:  # each size's GB/s on stderr as it is measured: a run cut short says
        rows.append(measure(client, c, jdev, torch, nbytes, quick))
        speeds = {k: _speed(nbytes, v) for k, v in rows[-1].items() if k != "bytes"}
        print(f"bandwidth {_size(nbytes)}: {speeds}", file=sys.stderr, flush=True)
    s = staging.stats(client)
    notes.append(
        f"{client.platform_name} ({client.platform_version}); staging as configured: "
        f"mode {s['mode']} from {s['min_bytes']} bytes, {s['slots']} x {s['chunk_bytes']} "
        f"bytes, {s['threads']} copier threads, ring DMA-mapped: {s['dma_mapped']}"
        + (f" ({s['why_unmapped']})" if s["why_unmapped"] else "")
    )
    if cpu:
        notes.append(
            "a CPU plugin: these figures say nothing of the GPU target "
            f"(>= {GPU_TARGET_GBS:g} GB/s both ways from plain numpy at >= 64 MiB)"
        )
    names = [k for k in rows[0] if k != "bytes"]
    table = [["size"] + names]
    for r in rows:
        table.append([_size(r["bytes"])] + [_speed(r["bytes"], r[k]) for k in names])
    return {
        "benchmark": "bandwidth",
        "what": "host <-> device copies, GB/s (bytes / median time)",
        "seconds": rows,
        "targets": _targets(rows, cpu),
        "table": table,
        "notes": notes,
        "machine": machine(),
    }


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def _speed(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f}"


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
