"""Asynchronous dispatch with pjrt_py, step by step: the demo.

Its code is ``pjrt_py/demo.py``, shipped in the package so that
``pjrt-py demo`` runs it from an installed wheel too. This file runs the
same thing from a checkout: ``python examples/async_pipeline.py [--quick]``.
"""

from pjrt_py.cli.demo import main

if __name__ == "__main__":
    main()
