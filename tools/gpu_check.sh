#!/usr/bin/env bash
# The GPU check of pjrt_py, in one go, on a lent GPU machine (no network, no
# installs: see ../shared/gpu/README.md). Two halves:
#
#   bash tools/gpu_check.sh prepare     # here, with network, in the dev venv
#                                       # (pip install -e ".[test]"): builds .gpu/
#                                       # (the wheel, cffi + pycparser for cp312,
#                                       # the benchmarks' C loops)
#   bash tools/gpu_check.sh run [STEP]  # there, from the repo root, with .gpu/
#                                       # (the device tool: carry [".gpu"],
#                                       # timeout_s 600)
#
# `run` installs the wheel into $SITE (/tmp/site) and runs each step with a limit,
# writing STEP.txt (and the benchmarks' JSON) under $OUT (./gpu_out if unset),
# and one line per step to summary.txt. The steps, most wanted first:
#   device     nvidia-smi, versions, the staging settings a client gets
#   smoke      a staged 256 MiB round trip, checked, with the ring's counters
#   pytest     tests/test_staging.py, every gpu-marked test, the
#              capability-gated buffer and memory tests, and no call waiting
#              with the GIL (test_gil_waits.py), on $PJRT_PLUGIN (cuda)
#   figures    benchmarks/gpu_figures.py: issue 24's bf16 matmul rate next to
#              jax's, ten dtypes round-tripped, a default client beside torch
#   bandwidth  benchmarks/bandwidth.py: pjrt_py (unstaged, staged), jax, torch
#   callbacks  benchmarks/callbacks.py: a host callback's round trip on the
#              GPU next to jax.jit + pure_callback
#   dispatch   benchmarks/dispatch.py
#   sweep      tools/staging_sweep.py: chunk size x copier threads, threshold
#   suite      the whole suite, PJRT_PLUGIN=cuda pytest, in what time is left
# Name steps to run only those (a rerun after one failed or ran out of time).
# A session has 15 minutes of device time, a machine's start included, so the
# whole check is one call: the steps share a budget, GPU_CHECK_BUDGET_S (540 s,
# under the tool's 600 s limit per call); each step's limit is cut to what is
# left of it, and a step with under 30 s left is skipped and said to be. The
# tool brings back at most 8 files, so the outputs are packed at the end into
# gpu_out.tar.gz beside summary.txt (a call killed before that still brings
# back 8 of them). Then, here, on what the tool brought back:
#   python -m benchmarks.cuda_table <its files_at>/gpu_out
# unpacks it and writes the CUDA section of docs/performance.md.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

prepare() {
  set -e  # .gpu/ and gpu_out/ are in .gitignore: the run tool carries .gpu when asked
  bash tools/build_dist.sh
  rm -rf .gpu && mkdir -p .gpu/whl && cp dist/*.whl .gpu/whl/
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d .gpu/whl cffi pycparser
  # The benchmarks' C loops, built here: the GPU machine has no pjrt_c_api.h
  # (no CPU plugin wheel), and perhaps no compiler. They need only libc.
  mkdir -p .gpu/lib
  for source in c_dispatch.c c_transfer.c; do
    python3 -c "import sys; from benchmarks._common import build_c; build_c(sys.argv[1], '.gpu/lib')" \
      "$source"
  done
  ls -l .gpu/whl .gpu/lib
}

device_step() {
  nvidia-smi
  $PY - <<'PYTHON'
import json
import os
import subprocess
import sys

import numpy

import pjrt_py
from pjrt_py.runtime import staging

c = pjrt_py.Client()
print(sys.version.split()[0], "numpy", numpy.__version__)
print(c, c.plugin.path, c.plugin.version_text, "pjrt_py from", pjrt_py.__file__)
print("staging", staging.stats(c))
# device.json: what benchmarks/cuda_table.py names the run by
info = {"pjrt": c.plugin.version_text, "plugin": os.path.basename(c.plugin.path)}
for p in pjrt_py.plugins():
    if os.path.realpath(p.path) == os.path.realpath(c.plugin.path):
        info["plugin"] = f"{p.distribution} {p.version}"
smi = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
try:
    info["gpu"] = subprocess.run(smi, capture_output=True, text=True).stdout.strip() or str(c.devices[0])
except OSError:
    info["gpu"] = str(c.devices[0])
for name in ("jax", "torch"):
    try:
        info[name] = __import__(name).__version__
    except Exception as e:  # noqa: BLE001
        print(name, "absent:", e)
print(info)
with open(os.path.join(os.environ["OUT"], "device.json"), "w") as f:
    json.dump(info, f, indent=2)
PYTHON
}

smoke_step() {
  $PY - <<'PYTHON'
import time

import numpy as np

import pjrt_py
from pjrt_py.runtime import staging

c = pjrt_py.Client()
x = np.random.default_rng(0).random(32 << 20)  # 256 MiB
for label in ("first", "again"):
    t = time.perf_counter()
    b = c.buffer(x)
    up = time.perf_counter() - t
    t = time.perf_counter()
    y = b.to_numpy()
    down = time.perf_counter() - t
    assert y.tobytes() == x.tobytes(), "WRONG DATA"
    print(label, "h2d %.1f GB/s, d2h %.1f GB/s" % (x.nbytes / up / 1e9, x.nbytes / down / 1e9))
s = staging.stats(c)
print("staging", s)
assert s["h2d"] >= 2 and s["d2h"] >= 2, "NOT STAGED"
print("smoke ok")
PYTHON
}

pytest_step() {
  local rc=0
  $PY -m pytest $PYTEST_OPTS tests/test_staging.py || rc=1
  # only the files with gpu-marked tests: collecting the rest needs what a GPU
  # machine may lack (pjrt_c_api.h for test_build, the CPU plugins)
  $PY -m pytest $PYTEST_OPTS -m gpu $(grep -l "mark.gpu" tests/test_*.py) || rc=1
  $PY -m pytest $PYTEST_OPTS tests/test_buffer.py tests/test_memory_spaces.py tests/test_device_programs.py \
    tests/test_gil_waits.py || rc=1
  return $rc
}

# step NAME LIMIT_S COMMAND...: runs it with a time limit, cut to what is left
# of the budget, output in $OUT/NAME.txt.
step() {
  local name=$1 limit=$2 start rc left
  shift 2
  left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 30 ]; then
    echo "$name: skipped, ${left} s left of the ${BUDGET} s budget" | tee -a "$OUT/summary.txt"
    return
  fi
  [ "$limit" = rest ] || [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (up to ${limit} s)"
  start=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - start )) s$([ $rc = 124 ] && echo ', timed out')" \
    | tee -a "$OUT/summary.txt"
  tail -n 4 "$OUT/$name.txt"
}

# pack: every output but summary.txt into gpu_out.tar.gz (the tool's 8 files)
pack() {
  local files
  files=$(cd "$OUT" && ls -A | grep -v -x -e summary.txt -e gpu_out.tar.gz)
  [ -n "$files" ] || return 0
  # shellcheck disable=SC2086  # plain file names, written by the steps above
  (cd "$OUT" && tar -czf gpu_out.tar.gz $files && rm -rf $files)
  echo "packed: $(echo $files)" >> "$OUT/summary.txt"
}

wanted() { [ ${#STEPS[@]} = 0 ] || [[ " ${STEPS[*]} " == *" $1 "* ]]; }

run() {
  export OUT=${OUT:-$ROOT/gpu_out}
  BUDGET=${GPU_CHECK_BUDGET_S:-540}
  DEADLINE=$(( $(date +%s) + BUDGET - 10 ))  # 10 s to pack
  local site=${SITE:-/tmp/site}
  mkdir -p "$OUT"
  if ! python3 -m pip install -q --no-index --no-deps --target "$site" .gpu/whl/*.whl \
      > "$OUT/install.txt" 2>&1; then
    cat "$OUT/install.txt"
    echo "install: failed (run 'bash tools/gpu_check.sh prepare' here; carry .gpu)" \
      | tee -a "$OUT/summary.txt"
    return 1
  fi
  # The wheel's pjrt_py, not the checkout's (which has no compiled core): the
  # wheel's directory comes first on PYTHONPATH, PYTHONSAFEPATH (python -P,
  # inherited by the tests' child interpreters, which `python -c` would
  # otherwise start with the checkout first on sys.path) keeps the working
  # directory off sys.path, and pytest adds only tests/ (the checkout is on
  # PYTHONPATH after the wheel, for benchmarks/).
  export PYTHONPATH=$site:$ROOT PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
  export XLA_PYTHON_CLIENT_PREALLOCATE=false PJRT_PLUGIN=${PJRT_PLUGIN:-cuda}
  export PJRT_PY_BENCH_LIBS=$ROOT/.gpu/lib  # the C loops, built by prepare
  export PY="python3 -P"
  PYTEST_OPTS="-o pythonpath=tests -p no:cacheprovider -q -rs --continue-on-collection-errors"
  if $PY -c "import pytest_timeout" 2>/dev/null; then PYTEST_OPTS+=" --timeout=120"; fi
  export PYTEST_OPTS
  export -f device_step smoke_step pytest_step

  if wanted device; then step device 60 bash -c device_step; fi
  if wanted smoke; then step smoke 90 bash -c smoke_step; fi
  if wanted pytest; then step pytest 200 bash -c pytest_step; fi
  if wanted figures; then
    step figures 90 $PY -m benchmarks.gpu_figures --json "$OUT/gpu_figures.json"
  fi
  if wanted bandwidth; then
    step bandwidth 120 $PY -m benchmarks.bandwidth --json "$OUT/bandwidth.json"
  fi
  if wanted callbacks; then
    step callbacks 120 $PY -m benchmarks.callbacks --json "$OUT/callbacks.json"
  fi
  if wanted dispatch; then
    step dispatch 90 $PY -m benchmarks.dispatch --json "$OUT/dispatch.json"
  fi
  if wanted sweep; then step sweep 100 $PY tools/staging_sweep.py; fi
  if wanted suite; then  # -x off: every failure is worth seeing; each test has its limit
    step suite rest $PY -m pytest $PYTEST_OPTS -p no:randomly --durations=15 tests
  fi
  pack
  echo "== done: $OUT"
  cat "$OUT/summary.txt"
}

case "${1:-run}" in
  prepare) prepare ;;
  run) shift $(( $# > 0 ? 1 : 0 )); STEPS=("$@"); run ;;
  *) echo "usage: bash tools/gpu_check.sh prepare | run [STEP ...]" >&2; exit 2 ;;
esac
