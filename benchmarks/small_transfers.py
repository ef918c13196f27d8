"""Small transfers next to their C floor, in one run: ``buffer_async`` of an
f32[8] array and ``to_numpy()`` of a ready f32[8] buffer, each against a C
loop (benchmarks/c_transfer.c) of the PJRT calls it cannot do without, on the
same plugin, client, default device and buffer.

- H2D: ``client.buffer_async(x)`` with the promise dropped at once (so its
  Buffer is destroyed every iteration too), against
  ``PJRT_Client_BufferFromHostBuffer`` (kImmutableOnlyDuringCall) + destroying
  its ``done_with_host_buffer`` event + ``PJRT_Buffer_Destroy``.
- D2H: ``buffer.to_numpy()`` of the same ready buffer every time (on CPU
  pjrt_py reads it directly), against
  ``PJRT_Buffer_IncreaseExternalReferenceCount`` + ``PJRT_Buffer_UnsafePointer``
  + a 32-byte ``memcpy`` + ``PJRT_Buffer_DecreaseExternalReferenceCount``.
  The C loop copies into one destination allocated up front; ``to_numpy``
  allocates a new array each call, and that allocation is part of its time.

    python -m benchmarks.small_transfers [--quick] [--json out.json]
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pjrt_py
from pjrt_py.runtime.capi import lib

from ._common import cli, interleaved, load_c, machine, target

# Keys of the JSON and labels of the table; each C floor comes first.
H2D_C = "h2d, C: BufferFromHostBuffer + 2 destroys"
H2D_OURS = "h2d, pjrt_py buffer_async, dropped"
D2H_C = "d2h, C: ref + ptr + memcpy, no alloc"
D2H_OURS = "d2h, pjrt_py to_numpy (allocates)"


def c_timers(client: pjrt_py.Client, x: np.ndarray[Any, Any], buf: pjrt_py.Buffer) -> Any:
    """The two C floors, built now against the same header: (h2d, d2h) timers."""
    ffi, c, addr = load_c(
        "c_transfer.c",
        "double c_h2d_async(void*, void*, void*, void*, int, int64_t*, size_t, long);"
        "double c_read_direct(void*, void*, void*, size_t, long);",
    )
    api, cl = addr(client.plugin.address), addr(client._handle)
    dev = addr(client.default_device._addr)  # where buffer_async puts x
    data, dims = ffi.from_buffer(x), ffi.new("int64_t[]", list(x.shape))
    f32 = lib.PJRT_Buffer_Type_F32
    dst = np.empty_like(x)  # the one destination of every C read
    src, dst_ptr = addr(buf._handle), ffi.from_buffer(dst)

    # The closures use `c` itself (not its functions), which keeps the library loaded.
    def h2d(k: int) -> None:
        if c.c_h2d_async(api, cl, dev, data, f32, dims, x.ndim, k) < 0:
            raise RuntimeError("PJRT error in the C floor")

    def d2h(k: int) -> None:
        if c.c_read_direct(api, src, dst_ptr, x.nbytes, k) < 0:
            raise RuntimeError("PJRT error in the C floor")

    h2d(1)
    d2h(1)
    if not np.array_equal(dst, x):
        raise RuntimeError("the C floor read something else than the buffer holds")
    return h2d, d2h


def run(quick: bool = False) -> dict[str, Any]:
    # Many short samples (under a millisecond each, shorter than a scheduler
    # time slice): on a shared machine most of them then run undisturbed, and
    # the median ratio holds still from run to run. Both calls finish their
    # work before returning, so nothing spills from one sample into the next.
    n, repeats = (100, 4) if quick else (500, 600)
    client = pjrt_py.Client()
    x = np.arange(8, dtype=np.float32)
    buf = client.buffer(x)  # ready when buffer() returns
    c_h2d, c_d2h = c_timers(client, x, buf)
    buffer_async, to_numpy = client.buffer_async, buf.to_numpy

    def ours_h2d(k: int) -> None:
        for _ in range(k):
            buffer_async(x)

    def ours_d2h(k: int) -> None:
        for _ in range(k):
            to_numpy()

    h2d = interleaved({H2D_C: c_h2d, H2D_OURS: ours_h2d}, n, repeats)
    d2h = interleaved({D2H_C: c_d2h, D2H_OURS: ours_d2h}, n, repeats)
    h2d_ratio, d2h_ratio = h2d[H2D_OURS] / h2d[H2D_C], d2h[D2H_OURS] / d2h[D2H_C]
    table = [["what", "us/call", "x C floor"]]
    for results, floor in ((h2d, h2d[H2D_C]), (d2h, d2h[D2H_C])):
        table += [[k, f"{v:.3f}", f"{v / floor:.2f}"] for k, v in results.items()]
    return {
        "benchmark": "small_transfers",
        "what": "f32[8] host-to-device and device-to-host, next to their C floor: us per call",
        "plugin": client.plugin.path,
        "n_per_round": n,
        "rounds": repeats,
        "h2d_us": h2d,
        "d2h_us": d2h,
        "ratio_to_c": {"buffer_async": h2d_ratio, "to_numpy": d2h_ratio},
        "targets": [
            target("buffer_async f32[8] / C floor", h2d_ratio, 1.5),
            target("to_numpy f32[8] / C floor", d2h_ratio, 1.5),
        ],
        "table": table,
        "machine": machine(),
    }


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
