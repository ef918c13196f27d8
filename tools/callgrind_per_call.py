"""Main-thread instructions per call of a pjrt_py hot path, counted by callgrind.

Instruction counts are repeatable where wall time on a shared machine is not
(docs/performance.md): the same binary, inputs and environment give the same
count whatever else the machine does. The count per call is the difference
between a run of ``N + K`` calls and one of ``K`` calls, over ``N``, so
start-up, compile and the first calls cancel out.

    python tools/callgrind_per_call.py dispatch        # execute_async on an f32[8] add
    python tools/callgrind_per_call.py chain           # a 3-stage execute_async chain
    python tools/callgrind_per_call.py to_numpy        # a small to_numpy
    python tools/callgrind_per_call.py buffer_async    # a small buffer_async, dropped
    python tools/callgrind_per_call.py sharded --devices 8        # execute_sharded (waits)
    python tools/callgrind_per_call.py sharded_async --devices 8  # execute_sharded_async
    python tools/callgrind_per_call.py c_sharded --devices 8      # its C floor
    python tools/callgrind_per_call.py jax_sharded --devices 8    # jax.jit, sharded inputs

The ``c_*`` cases count the C baselines of the benchmarks (benchmarks/c_*.c,
built now, called once with ``N`` iterations), so that pjrt_py's count and its
floor's sit side by side: ``c_dispatch`` (Execute with a completion event),
``c_chain`` (three of them, chained), ``c_sharded`` (one Execute over every
device, with completion events), ``c_to_numpy`` (reference, pointer, memcpy).

Needs valgrind. Only the main thread is counted (``--separate-threads=yes``):
the plugin's worker threads run the program, which is the plugin's cost.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

PROGRAM = """
func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""

# Each case: set-up, then the statement timed `N` times (a C case's statement
# runs its loop of N itself). `--devices`: the CPU plugin's device count.
_C_SETUP = (
    "from benchmarks._common import load_c\n"
    "ffi, lib, addr = load_c('{source}', {cdef!r})\n"
    "api = addr(c.plugin.address)\n"
)
_C_DISPATCH = (
    "double c_dispatch_loop_event(void*, void*, void**, size_t, size_t, long);"
    "double c_chain_loop_event(void*, void*, void*, void*, long, long);"
    "double c_sharded_loop_event(void*, void*, void**, size_t, size_t, size_t, long);"
)
_BUFFERS = (
    "exe = c.compile(PROGRAM)\n"
    "x = c.buffer(np.ones(8, np.float32)); y = c.buffer(np.ones(8, np.float32))\n"
)
_SHARDED = (
    "exe = c.compile(PROGRAM, num_replicas=len(c.devices))\n"
    "xs = [c.buffer(np.ones(8, np.float32), device=d) for d in c.devices]\n"
    "args = [[x, x] for x in xs]\n"
)
_JAX_ONE = (
    "import jax\n"
    "jx = jax.device_put(np.ones(8, np.float32)); jy = jax.device_put(np.ones(8, np.float32))\n"
    "compiled = jax.jit(lambda a, b: a + b).lower(jx, jy).compile(); compiled(jx, jy)\n"
)
_JAX_SHARDED = (
    "import jax\n"
    "from jax.sharding import NamedSharding, PartitionSpec\n"
    "d = len(jax.devices('cpu'))\n"
    "sharding = NamedSharding(jax.make_mesh((d,), ('x',)), PartitionSpec('x'))\n"
    "jx = jax.device_put(np.ones(8 * d, np.float32), sharding)\n"
    "jy = jax.device_put(np.ones(8 * d, np.float32), sharding)\n"
    "compiled = jax.jit(lambda a, b: a + b).lower(jx, jy).compile(); compiled(jx, jy)\n"
)
CASES = {
    "dispatch": (_BUFFERS, "exe.execute_async(x, y)"),
    "chain": (_BUFFERS, "exe.execute_async(exe.execute_async(exe.execute_async(x, y), y), y)"),
    "to_numpy": (
        "x = c.buffer(np.ones(8, np.float32)); x.to_numpy()\n",
        "x.to_numpy()",
    ),
    "buffer_async": (
        "x = np.ones(8, np.float32); c.buffer_async(x).value()\n",
        "c.buffer_async(x)",
    ),
    "sharded": (_SHARDED, "exe.execute_sharded(args)"),
    "sharded_async": (_SHARDED, "exe.execute_sharded_async(args)"),
    "c_dispatch": (
        _BUFFERS
        + _C_SETUP.format(source="c_dispatch.c", cdef=_C_DISPATCH)
        + "ptrs = ffi.new('void*[]', [addr(x._handle), addr(y._handle)])\n"
        + "e = addr(exe._loaded.address)\n",
        "lib.c_dispatch_loop_event(api, e, ptrs, 2, 1, N)",
    ),
    "c_chain": (
        _BUFFERS
        + _C_SETUP.format(source="c_dispatch.c", cdef=_C_DISPATCH)
        + "e = addr(exe._loaded.address)\n",
        "lib.c_chain_loop_event(api, e, addr(x._handle), addr(y._handle), 3, N)",
    ),
    "c_sharded": (
        _SHARDED
        + _C_SETUP.format(source="c_dispatch.c", cdef=_C_DISPATCH)
        + "ptrs = ffi.new('void*[]', [addr(b._handle) for row in args for b in row])\n"
        + "e = addr(exe._loaded.address)\n",
        "lib.c_sharded_loop_event(api, e, ptrs, len(args), 2, 1, N)",
    ),
    # jax's own dispatch of the same add, for the comparison issue 29 asks
    # for: jax.jit on inputs sharded over every device, and one device's chain.
    "jax_sharded": (_JAX_SHARDED, "compiled(jx, jy)"),
    "jax_dispatch": (_JAX_ONE, "compiled(jx, jy)"),
    "jax_chain": (_JAX_ONE, "compiled(compiled(compiled(jx, jy), jy), jy)"),
    "c_to_numpy": (
        "x = c.buffer(np.ones(8, np.float32)); dst = np.empty(8, np.float32)\n"
        + _C_SETUP.format(
            source="c_transfer.c", cdef="double c_read_direct(void*, void*, void*, size_t, long);"
        )
        + "out = ffi.from_buffer(dst)\n",
        "lib.c_read_direct(api, addr(x._handle), out, 32, N)",
    ),
}

SCRIPT = """
import sys, numpy as np, pjrt_py
sys.path.insert(0, {root!r})
PROGRAM = {program!r}
opts = {{"cpu_device_count": {devices}}} if {devices} else None
c = pjrt_py.Client(options=opts)
{setup}
N = {n}
{body}
pjrt_py.effects_barrier()
"""
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main_thread_total(out_dir: str) -> int:
    """Instructions of the main thread (callgrind's thread 1 file)."""
    files = sorted(glob.glob(os.path.join(out_dir, "callgrind.out.*-01")))
    if not files:
        raise RuntimeError(f"callgrind wrote no per-thread file in {out_dir}")
    with open(files[0]) as f:
        for line in f:
            m = re.match(r"(?:summary|totals):\s+(\d+)", line)
            if m:
                return int(m.group(1))
    raise RuntimeError(f"no totals in {files[0]}")


def count(case: str, n: int, devices: int) -> int:
    setup, stmt = CASES[case]
    # In a function: a loop at module level would store and look up names
    # in the globals dict every call, which is the harness's cost, not the call's.
    body = (
        stmt
        if case.startswith("c_")
        else f"def loop():\n    for _ in range(N):\n        {stmt}\nloop()"
    )
    script = SCRIPT.format(root=ROOT, program=PROGRAM, devices=devices, setup=setup, n=n, body=body)
    with tempfile.TemporaryDirectory() as out_dir:
        path = os.path.join(out_dir, "case.py")
        with open(path, "w") as f:
            f.write(script)
        # A fixed hash seed: dict and set layouts (and so their instruction counts)
        # otherwise change from run to run.
        env = dict(
            os.environ, PJRT_PY_PLUGIN_LOG="raw", TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="0"
        )
        if devices and case.startswith("jax_"):  # jax makes its CPU devices at start
            flag = f"--xla_force_host_platform_device_count={devices}"
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={out_dir}/callgrind.out.%p",
                sys.executable,
                path,
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        return main_thread_total(out_dir)


def per_call(case: str, n: int = 5000, base: int = 1000, devices: int = 0) -> float:
    """Main-thread instructions per call: (count(base + n) - count(base)) / n."""
    return (count(case, base + n, devices) - count(case, base, devices)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("-n", type=int, default=5000, help="calls counted (default 5000)")
    parser.add_argument("--base", type=int, default=1000, help="calls cancelled out")
    parser.add_argument("--devices", type=int, default=0, help="CPU devices (cpu_device_count)")
    args = parser.parse_args()
    value = per_call(args.case, args.n, args.base, args.devices)
    print(f"{args.case}: {value:,.0f} main-thread instructions per call")


if __name__ == "__main__":
    main()
