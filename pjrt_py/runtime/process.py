"""Process-wide behaviour: how waits spin, fork, and interpreter exit.

The state itself lives in the native core (``native/state.c``); this module
configures it from the environment and hooks it into Python's process
events.

Fork. In a child made by ``os.fork()`` (``multiprocessing``'s "fork" start
method included), clients made before the fork, and everything made from
them, raise ``ValueError`` when used: the plugin's threads did not survive the
fork. They are freed without calling the plugin, and exiting is clean. A new
``Client()`` in the child works. pjrt_py's own locks are made anew in the
child, so none held by another thread at fork time can block it.

Exit. At interpreter exit pjrt_py stops PJRT threads from calling into
Python, then waits up to ``$PJRT_PY_EXIT_TIMEOUT`` seconds (default
``EXIT_TIMEOUT``) for running executions and calls in flight. Every
client that is then idle is destroyed, which joins the plugin's threads while
the memory they may touch is still alive. A client whose work is still
running (a program that never ends) is not destroyed: it is left to the
process exit, with a line on stderr; its pending results are never read.
From then on no PJRT call is made.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable

from .. import _core

# Seconds the exit sequence waits for running work before leaving it.
EXIT_TIMEOUT = 5.0


def _env_number(
    name: str, default: float, scale: float, unit: str, most: float = float("inf")
) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of {unit}, not {text!r}") from None
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, not {text!r}")
    if value > most:
        raise ValueError(f"{name} must be at most {most:g} {unit}, not {text!r}")
    return value * scale


# $PJRT_PY_SPIN_US: how long a wait polls before it blocks (see events.c).
# A spin longer than a second is no spin: refused, as is anything but a number.
_spin = _env_number("PJRT_PY_SPIN_US", -1, 1000, "microseconds", most=1e6)
if _spin >= 0:
    _core.set_spin_ns(int(_spin))


def exit_timeout() -> float:
    """Seconds the exit sequence waits: ``$PJRT_PY_EXIT_TIMEOUT``, else the default."""
    return _env_number("PJRT_PY_EXIT_TIMEOUT", EXIT_TIMEOUT, 1.0, "seconds")


def pending_holds() -> int:
    """How many host-memory holds are still waiting for PJRT (for tests)."""
    return int(_core.pending_holds())


_fork_resets: list[Callable[[], None]] = []


def reset_in_child(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a child after ``os.fork()`` (to make a module's locks anew)."""
    _fork_resets.append(fn)


def _after_fork_in_child() -> None:
    _core.after_fork_in_child()
    for fn in _fork_resets:
        fn()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _at_exit() -> None:
    try:
        timeout = exit_timeout()
    except ValueError as e:
        print(f"pjrt_py: {e}; waiting {EXIT_TIMEOUT} s", file=sys.stderr)
        timeout = EXIT_TIMEOUT
    _core.exit_sequence(timeout)
