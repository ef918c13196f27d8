"""Dispatch cost: ``execute_async`` per call on an f32[8] add, next to a raw
C loop of ``PJRT_LoadedExecutable_Execute`` + output destroy on the same
plugin, client, executable and arguments (the floor), the same C loop also
asking for the completion event pjrt_py asks for on every execution (and
destroying it), jax's AOT-compiled call on the same computation, and pypjrt's
call when that package happens to be installed. All figures come from one
process run; the ratios are what count.

    python -m benchmarks.dispatch [--quick] [--json out.json]
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pjrt_py

from ._common import ADD_F32_8, cli, interleaved, load_c, machine, target

OURS = "pjrt_py.execute_async"
C_LOOP = "c_loop"
C_LOOP_EVENT = "c_loop + completion event"


def c_loop_timers(
    client: pjrt_py.Client, exe: pjrt_py.Executable, args: list[Any]
) -> dict[str, Any]:
    """Timers over benchmarks/c_dispatch.c, built now against the same header:
    the floor (C_LOOP) and the floor plus a completion event (C_LOOP_EVENT)."""
    signature = "(void* api, void* exe, void** args, size_t num_args, size_t num_outputs, long n);"
    ffi, c, addr = load_c(
        "c_dispatch.c",
        f"double c_dispatch_loop{signature} double c_dispatch_loop_event{signature}",
    )
    arg_array = ffi.new("void*[]", [addr(b._handle) for b in args])
    api, exe_ptr = addr(client.plugin.address), addr(exe._loaded.address)

    def timer(name: str) -> Any:
        def c_loop(k: int) -> None:
            # Looked up on the library each time: a function pointer alone
            # does not keep the library loaded.
            if getattr(c, name)(api, exe_ptr, arg_array, len(args), 1, k) < 0:
                raise RuntimeError("the C loop got a PJRT error")

        return c_loop

    return {C_LOOP: timer("c_dispatch_loop"), C_LOOP_EVENT: timer("c_dispatch_loop_event")}


def jax_timer() -> Any:
    """jax's AOT-compiled call of the same add (None without jax)."""
    try:
        import jax
    except ImportError:
        return None
    jx = jax.device_put(np.arange(8, dtype=np.float32))
    jy = jax.device_put(np.ones(8, np.float32))
    compiled = jax.jit(lambda a, b: a + b).lower(jx, jy).compile()

    def jax_call(k: int) -> None:
        for _ in range(k):
            compiled(jx, jy)

    return jax_call


def pypjrt_timer(plugin_path: str) -> tuple[Any, str | None]:
    """pypjrt's call of the same add on the same plugin file, if installed.

    Returns (timer or None, why not). pypjrt is never a dependency.
    """
    try:
        import pypjrt  # type: ignore[import-not-found]
    except ImportError:
        return None, "not installed"
    try:
        client = pypjrt.Client.create(plugin_path)
        devices = client.devices().__enter__()
        exe = client.compile(ADD_F32_8)
        f32 = 11  # PJRT_Buffer_Type_F32
        x = client.buffer_from_host(np.arange(8, dtype=np.float32), f32, [8], devices[0])
        y = client.buffer_from_host(np.ones(8, dtype=np.float32), f32, [8], devices[0])
        exe(x, y)
    except Exception as exc:  # a peer's failure is reported, not fatal
        return None, f"failed: {type(exc).__name__}: {exc}"

    def pypjrt_call(k: int) -> None:
        for _ in range(k):
            exe(x, y)

    pypjrt_call.keep = (client, devices, exe, x, y)  # type: ignore[attr-defined]
    return pypjrt_call, None


def run(quick: bool = False, n: int | None = None, repeats: int | None = None) -> dict[str, Any]:
    n = n or (200 if quick else 20000)
    repeats = repeats or (2 if quick else 15)
    client = pjrt_py.Client()
    exe = client.compile(ADD_F32_8)
    x = client.buffer(np.arange(8, dtype=np.float32))
    y = client.buffer(np.ones(8, dtype=np.float32))

    def ours(k: int) -> None:
        call = exe.execute_async
        for _ in range(k):
            call(x, y)

    timers = {**c_loop_timers(client, exe, [x, y]), OURS: ours}
    jax_call = jax_timer()
    if jax_call is not None:
        timers["jax.compiled"] = jax_call
    peer, peer_missing = pypjrt_timer(client.plugin.path)
    if peer is not None:
        timers["pypjrt"] = peer

    results = interleaved(timers, n, repeats)
    base = results[C_LOOP]
    report: dict[str, Any] = {
        "benchmark": "dispatch",
        "what": "f32[8] add, 2 buffer args, 1 output: us per call",
        "plugin": client.plugin.path,
        "pjrt_api": client.plugin.version_text,
        "n_per_round": n,
        "rounds": repeats,
        "us_per_call": results,
        "ratio_to_c_loop": {k: v / base for k, v in results.items()},
        "machine": machine(),
    }
    if peer_missing:
        report["pypjrt"] = peer_missing
    targets = [target("dispatch / C loop", results[OURS] / base, 1.3)]
    if "jax.compiled" in results:
        jx = results["jax.compiled"]
        report["ratio_to_jax"] = {k: v / jx for k, v in results.items()}
        targets.append(target("dispatch / jax", results[OURS] / jx, 0.4))
    report["targets"] = targets
    report["table"] = [["what", "us/call", "x C loop"]] + [
        [name, f"{us:.2f}", f"{us / base:.2f}"] for name, us in results.items()
    ]
    return report


if __name__ == "__main__":
    cli(__doc__.splitlines()[0], run)
