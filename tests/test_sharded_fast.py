"""The native path of ``execute_sharded`` and what pjrt_py knows of the
buffers it makes (issue 29).

A sharded call whose arguments are all Buffers (or one-buffer promises)
already on their row's device runs from call to promises in C; every other
call goes to the Python path, with the errors it always gave. Execution
outputs and transfers know their device, memory and layout from creation:
checked here against the plugin's own answer for the same handle. The new
path is attacked where fast paths hide lifetime bugs: racing ``delete()`` of
arguments and of the executable, ``close()`` from another thread, and exits
with sharded work in flight.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from conftest import ADD_F32_8, matmul_chain, new_client, run_python
from test_robustness import FAULTS, RACE_HARNESS, check_race, run_clean

import pjrt_py

pytestmark = pytest.mark.needs_devices(4)

X = np.arange(8, dtype=np.float32)

# A program with a column-major output (on CPU the plugin honours the mode).
COLUMN_MAJOR = """
func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x8xf32> {mhlo.layout_mode = "{0,1}"}) {
  %0 = stablehlo.add %x, %x : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""


PAIR = """
func.func @main(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  return %x, %x : tensor<8xf32>, tensor<8xf32>
}
"""

DOUBLE = """
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.add %x, %x : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""


@pytest.fixture(scope="module")
def add4(client: pjrt_py.Client) -> pjrt_py.Executable:
    return client.compile(ADD_F32_8, num_replicas=4)


@pytest.fixture(scope="module")
def rows(client: pjrt_py.Client) -> list[list[pjrt_py.Buffer]]:
    devices = client.devices[:4]
    return [[client.buffer(X * (d + 1), device=dev)] * 2 for d, dev in enumerate(devices)]


def no_python_path(exe: pjrt_py.Executable) -> None:
    """Make the Python path of ``exe`` fail loudly: a call must not reach it."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the call took the Python path")

    exe._execute_sharded_async_slow = refuse  # type: ignore[method-assign]


def test_buffers_on_their_devices_run_natively_and_match_numpy(
    client: pjrt_py.Client, rows: list[list[pjrt_py.Buffer]]
) -> None:
    exe = client.compile(ADD_F32_8, num_replicas=4)
    no_python_path(exe)
    promises = exe.execute_sharded_async(rows)
    assert len(promises) == 4 and all(isinstance(p, pjrt_py.BufferPromise) for p in promises)
    # Promises of one buffer chain on the native path too, with no host wait.
    chained = exe.execute_sharded([[p, r[1]] for p, r in zip(promises, rows, strict=True)])
    for d, (row, out) in enumerate(zip(rows, chained, strict=True)):
        assert len(out) == 1 and out[0].device == row[0].device
        np.testing.assert_array_equal(out[0].to_numpy(), 3 * (d + 1) * X)
    # Tuples work as lists do; non_donatable=None is no keyword at all.
    again = exe.execute_sharded(tuple(tuple(r) for r in rows), non_donatable=None)
    np.testing.assert_array_equal(again[2][0].to_numpy(), 6 * X)


CONSTANT = """
func.func @main() -> tensor<2xf32> {
  %0 = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""

TWICE_AND_SAME = """
func.func @main(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %0 = stablehlo.add %x, %x : tensor<8xf32>
  return %0, %x : tensor<8xf32>, tensor<8xf32>
}
"""


def test_no_arguments_and_several_outputs_run_natively_too(client: pjrt_py.Client) -> None:
    constant = client.compile(CONSTANT, num_replicas=4)
    pair = client.compile(TWICE_AND_SAME, num_replicas=4)
    no_python_path(constant)
    no_python_path(pair)
    xs = [[client.buffer(X, device=d)] for d in pair.devices]
    for _ in range(3):  # the first call's outputs are asked about, later ones told
        for row in constant.execute_sharded([[]] * 4):
            np.testing.assert_array_equal(row[0].to_numpy(), [1, 2])
            assert row[0]._origin == row[0]._plugin_origin()
        for row in pair.execute_sharded(xs):
            np.testing.assert_array_equal(row[0].to_numpy(), 2 * X)
            np.testing.assert_array_equal(row[1].to_numpy(), X)
            assert all(b._origin == b._plugin_origin() for b in row)


def test_everything_unusual_takes_the_python_path_with_its_errors(
    client: pjrt_py.Client, add4: pjrt_py.Executable, rows: list[list[pjrt_py.Buffer]]
) -> None:
    on0 = rows[0][0]
    wrong_device = [r[:] for r in rows]
    wrong_device[2] = [on0, on0]
    with pytest.raises(ValueError, match="argument 0 on device 2 is on .*copy_to_device"):
        add4.execute_sharded(wrong_device)
    with pytest.raises(ValueError, match="4 device.*one argument list per device; got 3"):
        add4.execute_sharded(rows[:3])
    with pytest.raises(TypeError, match=r"takes 2 argument\(s\) on device 1, 1 given"):
        add4.execute_sharded([rows[0], rows[1][:1], rows[2], rows[3]])
    with pytest.raises(TypeError, match="one argument list per device"):
        add4.execute_sharded(on0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="entry 1 must be a list"):
        add4.execute_sharded([rows[0], on0, rows[2], rows[3]])  # type: ignore[list-item]
    ints = [[client.buffer(X.astype(np.int32), device=r[0].device)] * 2 for r in rows]
    with pytest.raises(TypeError, match=r"(?s)on device 0.*float32\[8\] and called with int32"):
        add4.execute_sharded(ints)
    dead = client.buffer(X, device=rows[3][0].device)
    dead.delete()
    with pytest.raises(ValueError, match="argument 1: buffer has been deleted"):
        add4.execute_sharded([*rows[:3], [rows[3][0], dead]])
    # A promise of two buffers is no argument (the Python path says so).
    pair = client.compile(PAIR).execute_async(rows[0][0])
    with pytest.raises(ValueError, match="holds 2 buffers"):
        add4.execute_sharded([[pair, rows[0][0]], *rows[1:]])
    with pytest.raises(ValueError, match="non_donatable: 5 is not a parameter index"):
        add4.execute_sharded(rows, non_donatable=[5])
    # Host values are transferred by the Python path; keywords are honoured.
    out = add4.execute_sharded(per_device_args=[[X, X]] * 4)
    np.testing.assert_array_equal(out[1][0].to_numpy(), 2 * X)
    other = new_client()  # another client of the plugin under test, as many devices
    if len(other.devices) >= 4:
        foreign = [[other.buffer(X, device=d)] * 2 for d in other.devices[:4]]
        with pytest.raises(ValueError, match="argument 0: buffer belongs to another client"):
            add4.execute_sharded(foreign)
    other.close()


def test_deleted_executable_and_closed_client_raise_as_before(
    rows: list[list[pjrt_py.Buffer]],
) -> None:
    c = new_client()
    exe = c.compile(ADD_F32_8, num_replicas=4)
    mine = [[c.buffer(X, device=d)] * 2 for d in c.devices[:4]]
    exe.execute_sharded(mine)
    copy = exe.__copy__()
    exe.delete()
    with pytest.raises(ValueError, match="executable has been deleted"):
        exe.execute_sharded_async(mine)
    np.testing.assert_array_equal(copy.execute_sharded(mine)[3][0].to_numpy(), 2 * X)
    c.close()
    with pytest.raises(ValueError, match="closed"):
        copy.execute_sharded(mine)


def plugin_says(client: pjrt_py.Client, buf: pjrt_py.Buffer) -> tuple[Any, ...]:
    """(device, memory, row_major) of ``buf``'s handle, asked of the plugin now."""
    return buf._plugin_origin()


@pytest.mark.parametrize("program", ["row-major", "column-major"])
def test_outputs_and_transfers_know_what_the_plugin_would_say(
    client: pjrt_py.Client, program: str
) -> None:
    text = ADD_F32_8 if program == "row-major" else COLUMN_MAJOR
    one, four = client.compile(text), client.compile(text, num_replicas=4)
    shape = one.input_signature[0].shape
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    n = len(one.input_signature)
    outputs, transfers = [], []
    for _ in range(3):  # the first call's outputs are asked; later ones are told
        outputs.append(one.execute(*[x] * n))
        rows = [[client.buffer(x, device=d)] * n for d in four.devices]
        outputs.extend(row[0] for row in four.execute_sharded(rows))
        transfers.extend(row[0] for row in rows)
    transfers.append(client.buffer(x))  # buffer_async's native path
    for buf in outputs + transfers:
        device, memory, row_major = buf._origin
        assert (device, memory, row_major) == plugin_says(client, buf), buf._origin
        np.testing.assert_array_equal(buf.to_numpy(), 2 * x if buf in outputs else x)
    layouts = {buf._origin[2] for buf in outputs}
    assert layouts == ({1} if program == "row-major" else {2})
    # A copy knows where it went (its layout is the plugin's choice).
    copied = transfers[-1].copy_to_device(client.devices[1])
    assert copied._origin[0] == plugin_says(client, copied)[0]
    np.testing.assert_array_equal(copied.to_numpy(), x)


def test_a_told_column_major_output_is_still_relaid_for_a_row_major_program(
    client: pjrt_py.Client,
) -> None:
    column, double = client.compile(COLUMN_MAJOR), client.compile(DOUBLE)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    for _ in range(4):  # past the first call, whose outputs are asked about
        chained = double.execute_async(column.execute_async(x))
        np.testing.assert_array_equal(chained.to_numpy(), 4 * x)


# ---------------------------------------------------------------------------
# Races and exits on the native path (subprocesses)
# ---------------------------------------------------------------------------


SHARDED_PRELUDE = """
c = pjrt_py.Client(options={"cpu_device_count": 4})
devs = c.devices[:4]
exe = c.compile(ADD, num_replicas=4)
x = np.arange(8, dtype=np.float32)
"""


@pytest.mark.needs_cpu_device_count  # its child asks the plugin for 4 CPU devices
def test_delete_of_arguments_racing_sharded_calls_only_raises_value_error() -> None:
    result, wall = run_clean(
        f"ADD = {ADD_F32_8!r}\n"
        + RACE_HARNESS
        + SHARDED_PRELUDE
        + """
def make():
    return [c.buffer(x, device=d) for d in devs]

def rows_of(bufs):
    return [[b, b] for b in bufs]

def sharded_async(bufs):
    for p in exe.execute_sharded_async(rows_of(bufs)):
        same(p.to_numpy(), 2 * x)

def chained(bufs):
    first = exe.execute_sharded_async(rows_of(bufs))
    for p in exe.execute_sharded_async([[p, b] for p, b in zip(first, bufs)]):
        same(p.to_numpy(), 3 * x)

def sharded(bufs):
    for row in exe.execute_sharded(rows_of(bufs)):
        same(row[0].to_numpy(), 2 * x)

ops = {"sharded_async": sharded_async, "sharded": sharded, "chained": chained}

def expected(e):
    return isinstance(e, ValueError) and "buffer has been deleted" in str(e)

def destroy(bufs):
    for b in random.sample(bufs, random.randint(1, len(bufs))):
        b.delete()

race(1500, make, destroy)
"""
    )
    check_race(result, {"sharded_async", "sharded", "chained"})
    assert wall < 60


@pytest.mark.needs_cpu_device_count  # its child asks the plugin for 4 CPU devices
def test_delete_of_the_executable_racing_sharded_calls_only_raises_value_error() -> None:
    result, wall = run_clean(
        f"ADD = {ADD_F32_8!r}\n"
        + RACE_HARNESS
        + SHARDED_PRELUDE
        + """
rows = [[c.buffer(x, device=d)] * 2 for d in devs]

def run(e):
    for p in e.execute_sharded_async(rows):
        same(p.to_numpy(), 2 * x)

ops = {
    "sharded_async": run,
    "sharded": lambda e: e.execute_sharded(rows),
    "copy-then-run": lambda e: run(e.__copy__()),
}

def expected(e):
    return isinstance(e, ValueError) and "executable has been deleted" in str(e)

make = lambda: c.compile(ADD, num_replicas=4) if random.random() < 0.5 else exe.__copy__()
race(1500, make, lambda e: e.delete())
works = all(np.array_equal(r[0].to_numpy(), 2 * x) for r in exe.execute_sharded(rows))
print("base-still-works", works, flush=True)
"""
    )
    check_race(result, {"sharded_async", "sharded", "copy-then-run"})
    assert "base-still-works True" in result.stdout
    assert wall < 60


@pytest.mark.needs_cpu_device_count  # its child asks the plugin for 4 CPU devices
def test_client_close_racing_sharded_calls_only_raises_value_error() -> None:
    result, wall = run_clean(
        f"ADD = {ADD_F32_8!r}\n"
        + RACE_HARNESS
        + """
from pjrt_py import _core
x = np.arange(8, dtype=np.float32)
before = _core.live_clients()

class Held:
    def __init__(self):
        self.c = pjrt_py.Client(options={"cpu_device_count": 4})
        self.exe = self.c.compile(ADD, num_replicas=4)
        self.rows = [[self.c.buffer(x, device=d)] * 2 for d in self.c.devices[:4]]

def sharded_async(h):
    for p in h.exe.execute_sharded_async(h.rows):
        same(p.to_numpy(), 2 * x)

ops = {
    "sharded_async": sharded_async,
    "sharded": lambda h: h.exe.execute_sharded(h.rows),
}

def expected(e):
    return isinstance(e, ValueError) and "closed" in str(e)

race(40, Held, lambda h: h.c.close())
slot[0] = None
import gc; gc.collect(); time.sleep(0.5)
print("live-after", _core.live_clients() - before, flush=True)
"""
    )
    check_race(result, {"sharded_async", "sharded"})
    assert "live-after 0" in result.stdout
    assert wall < 60


def test_a_collector_that_empties_the_rows_mid_call_is_harmless(
    client: pjrt_py.Client, add4: pjrt_py.Executable
) -> None:
    """Making a Buffer of a promise may run the garbage collector, and with it
    Python that mutates the very lists being read: the call holds what it took."""
    import gc  # noqa: PLC0415

    for _ in range(50):
        first = add4.execute_sharded_async([[client.buffer(X, device=d)] * 2 for d in add4.devices])
        rows: list[list[Any]] = [[p, p] for p in first]

        class Saboteur:
            def __init__(self, rows: list[list[Any]]) -> None:
                self.rows = rows

            def __del__(self) -> None:
                for row in self.rows:
                    row.clear()

        cycle: list[Any] = [Saboteur(rows)]
        cycle.append(cycle)
        del cycle
        gc.set_threshold(1)
        try:
            out = add4.execute_sharded(rows)
        except TypeError:  # emptied before it was read: the Python path says so
            continue
        finally:
            gc.set_threshold(700)
        for row in out:
            np.testing.assert_array_equal(row[0].to_numpy(), 4 * X)


@pytest.mark.needs_cpu_device_count  # its child asks the plugin for 4 CPU devices
def test_exit_with_sharded_work_in_flight_is_clean_every_time() -> None:
    heavy = matmul_chain(256, 6)
    for rep in range(8):
        wait = ["0", "0.05", "0.3"][rep % 3]
        code = f"""
import os, sys
os.environ["PJRT_PY_EXIT_TIMEOUT"] = {wait!r}
import numpy as np, pjrt_py
c = pjrt_py.Client(options={{"cpu_device_count": 4}})
exe = c.compile({heavy!r}, num_replicas=4)
rows = [[c.buffer(np.eye(256, dtype=np.float32), device=d)] for d in exe.devices]
kept = [exe.execute_sharded_async(rows) for _ in range(4)]
chained = exe.execute_sharded_async([[p] for p in kept[-1]])
if {rep % 2}:
    del kept, chained  # dropped: the work goes on
print("dispatched", flush=True)
sys.exit({rep % 4})
"""
        start = time.monotonic()
        result = run_python(code, timeout=60)
        wall = time.monotonic() - start
        detail = f"rep {rep}: rc={result.returncode}\n{result.stderr[-3000:]}"
        assert result.returncode == rep % 4, detail
        assert not any(fault in result.stderr for fault in FAULTS), detail
        assert "dispatched" in result.stdout, detail
        assert wall < 30, detail
