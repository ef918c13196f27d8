"""``pjrt-py test PATH...``: the command line of the conformance runner."""

from __future__ import annotations

import argparse
import os
import sys

from . import cases, report, runner, targets

DEFAULT_TIMEOUT = 60.0


# What --plugin takes, here and in ``pjrt-py run`` (both resolve it with
# pjrt_py.plugin.find_plugin).
PLUGIN_HELP = "a platform name (cpu, cuda), an installed plugin distribution or a plugin .so path"


# Workers per plugin build at most, whatever -j asks: each is a process
# with a plugin loaded.
MAX_JOBS = 4 * (os.cpu_count() or 1)


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"-j takes a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"-j must be at least 1, got {value}")
    return value


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timeout takes seconds, got {text!r}") from None
    if not 0 < value < float("inf"):  # nan fails this too
        raise argparse.ArgumentTypeError(
            f"--timeout must be a positive, finite number of seconds, got {text!r}"
        )
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``test`` subcommand's options."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".mlir files or directories")
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        help=PLUGIN_HELP + " (repeat; default: $PJRT_PLUGIN, else cpu)",
    )
    parser.add_argument(
        "--all-plugins", action="store_true", help="every plugin pjrt_py.plugins() finds"
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=_jobs,
        default=os.cpu_count() or 1,
        help=f"worker processes per plugin (default: the CPU count; at most one per file "
        f"and {MAX_JOBS})",
    )
    parser.add_argument(
        "--timeout",
        type=_timeout,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per case, compile included (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--json", metavar="FILE", help="write results as JSON ('-': stdout)")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML, a testsuite per plugin")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show differing elements and worker output"
    )


def run_command(args: argparse.Namespace) -> int:
    """Run the cases; 0 when nothing mismatched, errored, crashed or timed out."""
    chosen = targets.resolve(args.plugin, args.all_plugins)
    labels = [t.label for t in chosen]
    # The workers start first, so their plugins load while the files are found;
    # no more than there are files when the paths are all files, and never
    # more than MAX_JOBS (runner.run trims the pool to the files found).
    named = len(args.paths) if all(os.path.isfile(p) for p in args.paths) else args.jobs
    jobs = min(args.jobs, MAX_JOBS)
    # With the JSON on stdout, everything for people goes to stderr.
    human = sys.stderr if args.json == "-" else sys.stdout
    try:
        with runner.Pool(chosen, max(1, min(jobs, named))) as pool:
            paths = [str(p) for p in cases.discover(args.paths)]
            progress = report.Progress(len(paths) * len(chosen), human, args.verbose)
            results, versions = runner.run(paths, chosen, jobs, args.timeout, progress, pool)
            progress.finish()
    except KeyboardInterrupt:  # the pool has killed every worker on its way out
        human.write("\ninterrupted: no report written\n")
        human.flush()
        return 130
    if not paths:
        human.write(f"no .mlir cases under {', '.join(args.paths)}: nothing was run\n")
        return 1
    human.write(f"\n{len(paths)} file(s) on {len(chosen)} plugin build(s)\n")
    human.write(report.summary(results, labels, versions))
    for target in chosen:
        human.write(f"  {target.label}: {target.path}\n")
    if args.json == "-":
        sys.stdout.write(report.as_json(results, labels, versions) + "\n")
    elif args.json:
        with open(args.json, "w") as f:
            f.write(report.as_json(results, labels, versions) + "\n")
    if args.junit:
        with open(args.junit, "w") as f:
            report.write_junit(results, labels, versions, f)
    failed = any(r.status in runner.FAILING for r in results)
    return 1 if failed else 0
