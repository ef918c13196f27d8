"""The ``pjrt-py`` command (also ``python -m pjrt_py``).

pjrt-py info                 plugins, API versions, devices
pjrt-py smoke                compile and run a built-in program on every plugin
pjrt-py run FILE.mlir [-i x.npy ...] [-o out.npy ...] [--plugin P]
pjrt-py test PATH...         conformance test files (pjrt_py.conformance)
pjrt-py demo [--quick] [--plugin P]  the asynchronous-dispatch demo

One module per command (info, smoke, run, demo; test is the conformance
runner's); this one parses the arguments and dispatches. Each command imports
the package only when it runs, so ``--help`` and ``--version`` stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import info, run, smoke


def _demo(args: argparse.Namespace) -> int:
    from .demo import main as demo

    demo(
        (["--quick"] if args.quick else [])
        + ([] if args.plugin is None else ["--plugin", args.plugin])
    )
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
    info_cmd = sub.add_parser("info", help="list plugins, API versions and devices")
    info_cmd.add_argument("--plugin", help=PLUGIN_HELP + " (default: every plugin found)")
    info_cmd.set_defaults(fn=info.command)
    smoke_cmd = sub.add_parser("smoke", help="compile and run a program on every plugin found")
    smoke_cmd.add_argument("--plugin", help=PLUGIN_HELP + " (default: every plugin found)")
    smoke_cmd.add_argument("--only", help=argparse.SUPPRESS)
    smoke_cmd.set_defaults(fn=smoke.command)
    demo = sub.add_parser("demo", help="the asynchronous-dispatch demo, checked against numpy")
    demo.add_argument("--quick", action="store_true", help="a smaller version (a second or two)")
    demo.add_argument("--plugin", help=PLUGIN_HELP + " (default: $PJRT_PLUGIN, else cpu)")
    demo.set_defaults(fn=_demo)
    run_cmd = sub.add_parser("run", help="run a StableHLO/MLIR program")
    run_cmd.add_argument(
        "program", help="a .mlir text or bytecode file with a @main function ('-': stdin)"
    )
    run_cmd.add_argument("-i", "--input", action="append", default=[], help=".npy input (repeat)")
    run_cmd.add_argument("-o", "--output", action="append", default=[], help=".npy output (repeat)")
    run_cmd.add_argument(
        "--trace", metavar="FILE", help="write a Chrome trace (Perfetto) of the run's spans"
    )
    run_cmd.add_argument("--plugin", help=PLUGIN_HELP + " (default: $PJRT_PLUGIN, else cpu)")
    run_cmd.set_defaults(fn=run.command)

    test = sub.add_parser("test", help="run conformance test files on one or more plugins")
    add_arguments(test)
    test.set_defaults(fn=_test)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = _parser()  # imports the commands' modules: Ctrl-C may come here too
        args = parser.parse_args(argv)
        if args.command is None:  # `pjrt-py` alone: what it can do
            parser.print_help()
            return 0
        code: int = args.fn(args)
    except KeyboardInterrupt:  # Ctrl-C: the documented 130, not a traceback
        print("interrupted", file=sys.stderr)
        return 130
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
