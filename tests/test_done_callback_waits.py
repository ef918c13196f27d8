"""A done callback run on a PJRT thread may not wait without a bound.

``add_done_callback`` runs a callback on the plugin thread that completes the
work. Two hangs came from waiting there:

- ``effects_barrier()`` in a done callback waited for the execution whose
  ready event was running the callback, forever (and so did the program's own
  barrier after it);
- callbacks that each waited for new work hung once every plugin worker was
  inside one: none was left to run the work (8 callbacks on the CPU builds'
  thread pools, every time).

Both are now a ``RuntimeError`` that says what to do, as in host callbacks.
Reading what is ready, dispatching, and waiting with a timeout still work.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from conftest import child_code, run_python, slow_loop_child, slow_work

import pjrt_py


def test_a_done_callback_may_not_wait_for_unready_work_or_the_barrier(
    client: pjrt_py.Client,
) -> None:
    more = slow_work(client, 0.2)  # calibrated here: the callback may not wait
    short = slow_work(client, 0.02)
    seen: dict[str, Any] = {}
    finished = threading.Event()

    def on_done(p: pjrt_py.BufferPromise) -> None:
        try:
            seen["thread"] = threading.get_ident()
            seen["own"] = p.value()  # ready: allowed
            for name, wait in [
                ("wait", lambda: more().value()),
                ("barrier", pjrt_py.effects_barrier),
            ]:
                try:
                    wait()
                except RuntimeError as e:
                    seen[name] = str(e)
            seen["bounded"] = short().value(timeout=60)  # a timeout bounds the wait
            try:  # the CPU plugin waits inside this call for work not yet run
                more().buffer().unsafe_pointer()
            except RuntimeError as e:
                seen["pointer"] = str(e)
            seen["read"] = pjrt_py.to_numpy(seen["bounded"])  # ready: read in place
        finally:
            finished.set()

    for _ in range(5):  # the CPU plugin now and then runs the work inline
        seen.clear()
        finished.clear()
        slow_work(client, 0.3)().add_done_callback(on_done)
        assert finished.wait(120), "the done callback never ended"
        if seen["thread"] != threading.get_ident():
            break
    else:
        pytest.skip("the work was done before its callback was added, five times")
    assert isinstance(seen["own"], pjrt_py.Buffer)
    assert "cannot wait for a result that is not ready inside a done callback" in seen["wait"]
    assert "effects_barrier() inside a done callback" in seen["barrier"]
    assert seen["bounded"].shape == (256, 256)
    assert "inside a done callback" in seen["pointer"]
    np.testing.assert_array_equal(seen["read"], seen["bounded"].to_numpy())
    pjrt_py.effects_barrier()  # outside a callback, the barrier ends


CALLBACKS_WAITING_FOR_NEW_WORK = """
import threading
import numpy as np
add = c.compile(
    "func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> {\\n"
    "  %r = stablehlo.add %a, %a : tensor<8xf32>\\n  return %r : tensor<8xf32>\\n}")
ended, refused, lock = [0], [0], threading.Lock()

def on_done(p):
    try:
        add.execute(np.ones(8, np.float32)).to_numpy()  # waits, unless run inline
    except RuntimeError as e:
        assert "inside a done callback" in str(e), e
        with lock:
            refused[0] += 1
    with lock:
        ended[0] += 1

for _ in range(8):
    slow().add_done_callback(on_done)
pjrt_py.effects_barrier()
import time
deadline = time.time() + 60
while ended[0] < 8 and time.time() < deadline:
    time.sleep(0.01)
print("ended", ended[0], "refused", refused[0])
"""


def test_callbacks_waiting_for_new_work_end_instead_of_hanging(client: pjrt_py.Client) -> None:
    code = child_code(
        """
        import numpy as np, pjrt_py
        c = pjrt_py.Client()
        """,
        slow_loop_child(client, 0.1),
        CALLBACKS_WAITING_FOR_NEW_WORK,
    )
    result = run_python(code, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ended 8" in result.stdout, result.stdout + result.stderr[-3000:]


def test_a_callback_added_to_done_work_runs_inline_and_may_wait(
    client: pjrt_py.Client,
) -> None:
    more = slow_work(client, 0.05)
    done = client.buffer_async(np.ones(4, np.float32))
    done.value()
    got: list[Any] = []
    # On the caller's thread, as documented: a wait there is the caller's own.
    done.add_done_callback(lambda p: got.append(more().value()))
    assert got and got[0].shape == (256, 256)
