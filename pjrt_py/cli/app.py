"""The ``pjrt-py`` command (also ``python -m pjrt_py``).

pjrt-py info                 plugins, API versions, devices
pjrt-py smoke                compile and run a built-in program on every plugin
pjrt-py run FILE.mlir [-i x.npy ...] [-o out.npy ...] [--plugin P]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

SMOKE_PROGRAM = """
func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.multiply %x, %y : tensor<4xf32>
  %1 = stablehlo.add %0, %x : tensor<4xf32>
  return %1 : tensor<4xf32>
}
"""


def _chosen(found: list[Any], name: str | None) -> list[Any]:
    """The plugins a --plugin NAME picks among ``found`` (all of them without one)."""
    if name is None:
        return found
    from ..runtime.discovery import PluginInfo, find_plugin

    path = find_plugin(name, origin="--plugin")
    return [i for i in found if i.path == path] or [PluginInfo("?", path)]


def _info(args: argparse.Namespace) -> int:
    from .. import Client, load_plugin, plugins
    from ..programs import form as program_form

    found = _chosen(plugins(), args.plugin)
    if not found:
        print("no PJRT plugins found")
        return 1
    for info in found:
        label = info.distribution or "?"
        print(f"{info.name}: {label} {info.version or ''} {info.path}")
        if info.default:
            if info.defects:
                why = "every installed build has a known wrong result; first by the rule"
            else:
                why = "no known wrong result (those come first, then the newest PJRT API)"
            print(f"  default for {info.name!r}: {why}")
        for defect in info.defects:
            print(f"  known wrong result: {defect}")
        for edge in info.edge_cases:
            print(f"  differs from jax.jit (edge inputs, ulps): {edge}")
        try:
            plugin = load_plugin(info.path)
            print(f"  PJRT API {plugin.version_text}")
            for key, value in sorted(plugin.attributes.items()):
                print(f"  {key} = {value}")
            print(f"  programs reach it as {program_form.describe(plugin)}")
            extensions = plugin.extensions
            print(f"  extensions: {', '.join(extensions) or 'none'}")
            if "profiler" not in extensions:
                print("  traces: host spans only (no PJRT profiler extension for device activity)")
            client = Client(plugin)
            print(f"  platform {client.platform_name} ({client.platform_version})")
            for device in client.devices:
                print(f"  {device!r}")
            print(f"  {_memory_line(client)}")
        except Exception as exc:  # report and go on to the next plugin
            print(f"  unavailable: {type(exc).__name__}: {exc}")
    return 0


def _memory_line(client: Any) -> str:
    """What a build offers for memory spaces and DLPack views (docs/interop.md)."""
    try:
        device = client.addressable_devices[0]
        default = device.default_memory
        kinds = ", ".join(m.kind + (" (default)" if m is default else "") for m in device.memories)
    except Exception as exc:  # UnsupportedError from an older plugin, and the like
        kinds = f"not reported ({exc})"
    views = client.plugin.supports("PJRT_Client_CreateViewOfDeviceBuffer")
    copies = client.plugin.supports("PJRT_Buffer_CopyToMemory")
    return (
        f"memories per device: {kinds}; copy_to_memory: {'yes' if copies else 'no'}; "
        f"DLPack import without copies: {'yes' if views else 'no'}"
    )


def _smoke_one(path: str) -> None:
    from .. import Client

    client = Client(path)
    exe = client.compile(SMOKE_PROGRAM)
    x = np.array([1, 2, 3, 4], np.float32)
    y = np.array([0.5, -1, 2, 0], np.float32)
    out = exe.execute_async(x, y).to_numpy_async().value()
    np.testing.assert_allclose(out, x * y + x)


def _smoke(args: argparse.Namespace) -> int:
    from .. import plugins

    if args.only:  # the child process for one plugin
        _smoke_one(args.only)
        return 0
    found = _chosen(plugins(), args.plugin)
    if not found:
        print("FAIL: no PJRT plugins found")
        return 1
    failures = 0
    for info in found:
        # One process per plugin: a plugin that aborts cannot take the rest down.
        proc = subprocess.run(
            [sys.executable, "-m", "pjrt_py", "smoke", "--only", info.path],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0:
            print(f"ok    {info.name}: {info.path}")
        else:
            failures += 1
            reason = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            print(f"FAIL  {info.name}: {info.path}: {reason}")
    return 1 if failures else 0


def _run(args: argparse.Namespace) -> int:
    from .. import Client
    from ..programs.diagnostics import rename
    from ..runtime.discovery import find_plugin
    from ..runtime.dtypes import as_dtype_of
    from ..runtime.errors import ProgramError
    from ..tracing import trace

    if args.program == "-":
        program = sys.stdin.read()
    else:
        with open(args.program) as f:
            program = f.read()
    inputs = [_load_input(path) for path in args.input]  # before any compile
    # The resolver `pjrt-py test --plugin` uses too, so the two take the same names.
    client = Client(None if args.plugin is None else find_plugin(args.plugin, origin="--plugin"))
    with trace(args.trace) if args.trace else contextlib.nullcontext():
        try:  # a compiler crash is an error, not a death
            exe = client.compile(program, isolate=True)
        except ProgramError as e:  # its diagnostics, named after the file
            raise rename(e, "<stdin>" if args.program == "-" else args.program) from None
        # bf16 / float8 .npy files hold raw bytes: the program says what they are.
        specs = exe.input_signature or []
        inputs = [
            as_dtype_of(a, specs[i].dtype if i < len(specs) else None) for i, a in enumerate(inputs)
        ]
        result = exe.execute(*inputs)
        outputs = [] if result is None else list(result) if isinstance(result, tuple) else [result]
        arrays = [b.to_numpy() for b in outputs]
    if args.output and len(args.output) != len(arrays):
        print(f"error: {len(arrays)} output(s) but {len(args.output)} -o path(s)", file=sys.stderr)
        return 2
    for i, array in enumerate(arrays):
        if args.output:
            with open(args.output[i], "wb") as f:  # np.save(name) would add ".npy"
                np.save(f, array)
            print(f"output {i}: {array.dtype}{list(array.shape)} -> {args.output[i]}")
        else:
            print(f"output {i}: {array.dtype}{list(array.shape)}")
            print(np.array2string(array, threshold=64))
    return 0


def _load_input(path: str) -> Any:
    """An -i file's array; errors name the file."""
    try:
        with open(path, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise ValueError(f"input {path!r} is not a .npy file (no numpy header)")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"input {path!r} does not exist") from None
    except (ValueError, OSError) as e:
        if str(e).startswith(f"input {path!r}"):
            raise
        raise ValueError(f"input {path!r} cannot be read as a .npy array: {e}") from None


def _demo(args: argparse.Namespace) -> int:
    from .demo import main as demo

    demo(["--quick"] if args.quick else [])
    return 0


def _test(args: argparse.Namespace) -> int:
    from ..conformance.command import run_command

    return run_command(args)


EXIT_CODES = """exit status:
  0  success (test: every case passed, or was unsupported)
  1  a failure: a case mismatched, errored, crashed or timed out; no case
     found; a plugin or program could not be used
  2  bad command-line arguments
  130  interrupted (Ctrl-C)"""


def _parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..conformance.command import PLUGIN_HELP, add_arguments

    parser = argparse.ArgumentParser(
        prog="pjrt-py",
        description="PJRT plugins from Python",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pjrt-py {__version__}")
    sub = parser.add_subparsers(dest="command")
    info = sub.add_parser("info", help="list plugins, API versions and devices")
    info.add_argument("--plugin", help=PLUGIN_HELP + " (default: every plugin found)")
    info.set_defaults(fn=_info)
    smoke = sub.add_parser("smoke", help="compile and run a program on every plugin found")
    smoke.add_argument("--plugin", help=PLUGIN_HELP + " (default: every plugin found)")
    smoke.add_argument("--only", help=argparse.SUPPRESS)
    smoke.set_defaults(fn=_smoke)
    demo = sub.add_parser("demo", help="the asynchronous-dispatch demo, checked against numpy")
    demo.add_argument("--quick", action="store_true", help="a smaller version (a second or two)")
    demo.set_defaults(fn=_demo)
    run = sub.add_parser("run", help="run a StableHLO/MLIR text program")
    run.add_argument("program", help="a .mlir text file with a @main function ('-': stdin)")
    run.add_argument("-i", "--input", action="append", default=[], help=".npy input (repeat)")
    run.add_argument("-o", "--output", action="append", default=[], help=".npy output (repeat)")
    run.add_argument(
        "--trace", metavar="FILE", help="write a Chrome trace (Perfetto) of the run's spans"
    )
    run.add_argument("--plugin", help=PLUGIN_HELP + " (default: $PJRT_PLUGIN, else cpu)")
    run.set_defaults(fn=_run)

    test = sub.add_parser("test", help="run conformance test files on one or more plugins")
    add_arguments(test)
    test.set_defaults(fn=_test)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `pjrt-py` alone: what it can do
        parser.print_help()
        return 0
    try:
        code: int = args.fn(args)
    except BrokenPipeError:  # `pjrt-py info | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes
        return 0
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
