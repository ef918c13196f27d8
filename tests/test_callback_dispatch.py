"""A host callback that dispatches work (native/admission.c): the plugin's
limit of executions in flight, measured on the build of this run, and the
refusal that keeps a callback's dispatch from waiting for a slot only the
callbacks can free. Each case runs in a fresh interpreter with a timeout:
the failure this guards against is a frozen process."""

from __future__ import annotations

import pytest
from conftest import matmul_chain, run_python

pytestmark = pytest.mark.needs_host_callbacks

# XLA's CPU client (every CPU build: PJRT 0.81, 0.106, 0.115) admits this many
# executions in flight per device; admission.c's PJRT_PY_INFLIGHT_LIMIT.
LIMIT = 32

SETUP = f"""
import threading, time, numpy as np, pjrt_py
c = pjrt_py.Client()
x = c.buffer(np.ones((64, 64), np.float32))
chain = {matmul_chain(64, 1)!r}
t = "tensor<64x64xf32>"
def with_callback(name):
    call = (f"%y = stablehlo.custom_call @{{name}}(%x1) {{{{api_version = 4 : i32}}}}"
            f" : ({{t}}) -> {{t}}\\n  return %y : {{t}}")
    return chain.replace(f"return %x1 : {{t}}", call)
"""

# What a dispatching callback runs: a small program on its own buffer.
DISPATCHING = (
    SETUP
    + """
v = "tensor<4xf32>"
double = c.compile(f"func.func @main(%a: {v}) -> {v} {{ %0 = stablehlo.add %a, %a : {v}\\n"
                   f" return %0 : {v} }}")
small = c.buffer(np.ones(4, np.float32))
"""
)


def test_the_plugin_admits_32_executions_in_flight_per_device() -> None:
    result = run_python(
        SETUP
        + """
gate = threading.Event()
def hold(x):
    gate.wait()
    return x
pjrt_py.register_callback("hold", hold, client=c)
exe = c.compile(with_callback("hold"))
count = [0]
def dispatch():
    for _ in range(40):
        exe.execute_async(x)
        count[0] += 1
thread = threading.Thread(target=dispatch, daemon=True)
thread.start()
seen = -1
while count[0] != seen:  # until the dispatching thread stays blocked for 0.5 s
    seen = count[0]
    time.sleep(0.5)
print("returned", count[0], flush=True)
gate.set()
thread.join(30)
print("after", count[0], flush=True)
""",
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    if "returned 40\n" in result.stdout:  # measured: no dispatch waited
        pytest.skip(
            "needs a plugin that bounds executions in flight per device; this one let all 40 "
            "dispatches of a blocked program through (admission.c's limit then refuses early, "
            "never late)"
        )
    assert f"returned {LIMIT}\n" in result.stdout  # the next one waited for a slot
    assert "after 40" in result.stdout


def test_a_callback_dispatching_past_the_limit_is_refused_not_frozen() -> None:
    result = run_python(
        DISPATCHING
        + """
gate = threading.Event()
nested, refused = [], []
def dispatching(y):
    gate.wait(0.5)  # let the queue fill behind this execution
    try:
        nested.append(double.execute_async(small))
    except RuntimeError as e:
        refused.append(str(e))
    return y
pjrt_py.register_callback("dispatching", dispatching, client=c)
exe = c.compile(with_callback("dispatching"))
outs = [exe.execute_async(x) for _ in range(48)]
gate.set()
for o in outs:
    o.block_until_ready()
for p in nested:
    np.testing.assert_array_equal(p.to_numpy(), [2, 2, 2, 2])
print("nested", len(nested), "refused", len(refused), flush=True)
print(refused[0] if refused else "", flush=True)
""",
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    counts = result.stdout.split("\n")[0].split()
    nested, refused = int(counts[1]), int(counts[3])
    assert nested + refused == 48
    assert refused >= 1
    assert "cannot dispatch from inside a host callback" in result.stdout


def test_a_callback_dispatching_below_the_limit_runs_its_work() -> None:
    result = run_python(
        DISPATCHING
        + """
nested = []
def dispatching(y):
    nested.append(double.execute_async(small))
    return y
pjrt_py.register_callback("dispatching", dispatching, client=c)
exe = c.compile(with_callback("dispatching"))
outs = [exe.execute_async(x) for _ in range(16)]
for o in outs:
    o.block_until_ready()
print("nested", sum(p.to_numpy()[0] == 2 for p in nested), flush=True)
""",
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "nested 16" in result.stdout
