"""``pjrt-py test``: a conformance runner for StableHLO check-style tests.

Runs ``.mlir`` test files (StableHLO ``testdata``-style ``check.*`` calls, or
sibling ``.npy`` inputs and expected outputs) on one or more PJRT plugin
builds, each program in a persistent worker process, and reports pass /
mismatch / error / crash / timeout / unsupported per build. See
``docs/conformance.md``.

Modules: ``.checks`` (rewriting check calls into results), ``.compare``
(host comparison rules), ``.cases`` (finding and loading files),
``.targets`` (choosing plugin builds), ``.worker`` (the worker
process), ``.runner`` (the pool), ``.report`` (table, JSON, JUnit) and
``.command`` (the command line).
"""

from __future__ import annotations

from .checks import Check, RewriteError, Rewritten, rewrite
from .compare import Mismatch, compare, ulp_distance
from .runner import Result, run

__all__ = [
    "Check",
    "Mismatch",
    "Result",
    "RewriteError",
    "Rewritten",
    "compare",
    "rewrite",
    "run",
    "ulp_distance",
]
