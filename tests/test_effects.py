"""Ordered executions (runtime tokens) and effects_barrier()."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import ADD_F32_8, matmul_chain

import pjrt_py
from pjrt_py.programs import effects

SLOW = matmul_chain(600, 6)  # tens of ms of dense work: runs asynchronously
ATTEMPTS = 5  # the CPU plugin now and then runs dense work inline at dispatch


@pytest.fixture(scope="module")
def progs(client: pjrt_py.Client) -> dict[str, pjrt_py.Executable]:
    d0, d1 = client.devices[:2]
    return {
        "slow0": client.compile(SLOW, device=d0),
        "fast1": client.compile(ADD_F32_8, device=d1),
    }


def slow_input(client: pjrt_py.Client) -> pjrt_py.Buffer:
    return client.buffer(np.eye(600, dtype=np.float32) * 0.5, device=client.devices[0])


def small(client: pjrt_py.Client) -> pjrt_py.Buffer:
    return client.buffer(np.ones(8, np.float32), device=client.devices[1])


def test_runtime_token_form_of_a_program() -> None:
    text = pjrt_py.with_runtime_token(ADD_F32_8)
    assert "func.func private @pjrt_py_body(" in text
    assert "%pjrt_py_token: tensor<0xi1>" in text
    client = pjrt_py.Client()
    exe = client.compile(text)
    assert [s.shape for s in exe.input_signature] == [(8,), (8,), (0,)]
    assert exe.output_shapes == [(8,), (0,)]
    x = np.arange(8, dtype=np.float32)
    out, token = exe.execute(x, x, np.zeros(0, np.bool_))
    np.testing.assert_array_equal(out.to_numpy(), 2 * x)
    assert token.dtype == np.bool_
    with pytest.raises(ValueError, match="already has a runtime token"):
        pjrt_py.with_runtime_token(text)


def test_the_new_main_goes_inside_a_module_under_comment_lines(client: pjrt_py.Client) -> None:
    # StableHLO's test files begin with "// RUN:" lines; the wrapper must
    # still go inside the module, where the body it calls is.
    program = "// RUN: stablehlo-opt %s\nmodule @m {\n" + ADD_F32_8 + "}\n"
    text = pjrt_py.with_runtime_token(program)
    assert text.rstrip().endswith("}") and text.index("@main(") < text.rindex("}")
    x = np.arange(8, dtype=np.float32)
    out, _ = client.compile(text).execute(x, x, np.zeros(0, np.bool_))
    np.testing.assert_array_equal(out.to_numpy(), 2 * x)


@pytest.mark.needs_devices(2)  # slow work on one device, fast on another
def test_ordered_executions_finish_in_program_order_across_devices(
    client: pjrt_py.Client, progs
) -> None:
    # Slow on device 0, then fast on device 1, both ordered: once the fast
    # one is ready the slow one must be, though nothing links their data.
    for _ in range(ATTEMPTS):
        x, y = slow_input(client), small(client)
        start = time.perf_counter()
        slow = progs["slow0"].execute_async(x, ordered=True)
        fast = progs["fast1"].execute_async(y, y, ordered=True)
        dispatched = time.perf_counter() - start
        pending = not slow.is_ready()
        fast.value()
        assert slow.is_ready()  # the order held
        np.testing.assert_array_equal(fast.value().to_numpy(), np.full(8, 2, np.float32))
        if pending:
            break
    # Dispatch did not wait for the slow execution (on one attempt at least).
    assert pending, "the slow execution always ran inline; asynchrony not shown"
    assert dispatched < 0.5


@pytest.mark.needs_devices(2)  # slow work on one device, fast on another
def test_unordered_fast_execution_can_finish_first(client: pjrt_py.Client, progs) -> None:
    for _ in range(ATTEMPTS):
        x, y = slow_input(client), small(client)
        slow = progs["slow0"].execute_async(x)
        fast = progs["fast1"].execute_async(y, y)
        fast.value()
        if not slow.is_ready():
            break  # the fast one finished while the slow one still ran
    else:
        pytest.fail("the unordered pair never finished fast-first")
    slow.value()


@pytest.mark.needs_devices(2)  # slow work on one device, fast on another
def test_effects_barrier_waits_for_every_earlier_execution(client: pjrt_py.Client, progs) -> None:
    no_outputs = client.compile(
        "func.func @main(%x: tensor<600x600xf32>) -> () {\n  return\n}", device=client.devices[0]
    )
    promises = []
    for ordered in (True, False, True):
        promises.append(progs["slow0"].execute_async(slow_input(client), ordered=ordered))
        promises.append(progs["fast1"].execute_async(small(client), small(client)))
    promises.append(no_outputs.execute_async(slow_input(client)))
    pjrt_py.effects_barrier()
    assert all(p.is_ready() for p in promises)
    assert effects.running(client) == 0
    assert promises[-1].value() is None


@pytest.mark.needs_devices(2)  # slow work on one device, fast on another
def test_barrier_covers_executions_whose_outputs_were_dropped(
    client: pjrt_py.Client, progs
) -> None:
    for _ in range(ATTEMPTS):
        progs["slow0"].execute_async(slow_input(client))  # result dropped at once
        if effects.running(client) > 0:
            break
    else:
        pytest.fail("the slow execution always ran inline")
    pjrt_py.effects_barrier()
    assert effects.running(client) == 0


def test_ordered_execution_without_outputs(client: pjrt_py.Client) -> None:
    exe = client.compile("func.func @main(%x: tensor<8xf32>) -> () {\n  return\n}")
    promise = exe.execute_async(np.ones(8, np.float32), ordered=True)
    assert promise.value() is None and promise.is_ready()


@pytest.mark.needs_devices(2)  # slow work on one device, fast on another
def test_tokens_are_per_thread(client: pjrt_py.Client, progs) -> None:
    # Another thread's slow ordered execution does not hold back this one's.
    for _ in range(ATTEMPTS):
        x, y = slow_input(client), small(client)
        started = threading.Event()
        box: list[pjrt_py.BufferPromise] = []

        def other(
            x: pjrt_py.Buffer, box: list[pjrt_py.BufferPromise], started: threading.Event
        ) -> None:
            box.append(progs["slow0"].execute_async(x, ordered=True))
            started.set()

        thread = threading.Thread(target=other, args=(x, box, started))
        thread.start()
        assert started.wait(30)
        fast = progs["fast1"].execute_async(y, y, ordered=True)
        fast.value()
        thread.join()
        if not box[0].is_ready():
            break
    else:
        pytest.fail("a thread's ordered execution always waited for another thread's")
    box[0].value()


@pytest.mark.needs_devices(2)  # slow work on one device, fast on another
def test_compile_ordered_makes_every_execution_ordered(client: pjrt_py.Client) -> None:
    d0, d1 = client.devices[:2]
    slow = client.compile(SLOW, device=d0, ordered=True)
    fast = client.compile(ADD_F32_8, device=d1, ordered=True)
    assert slow._token_form is not None  # compiled with the program, not at dispatch
    for _ in range(ATTEMPTS):
        s = slow.execute_async(slow_input(client))
        f = fast.execute_async(small(client), small(client))
        pending = not s.is_ready()
        f.value()
        assert s.is_ready()
        if pending:
            break


def test_ordered_needs_program_text(client: pjrt_py.Client) -> None:
    exe = client.deserialize(client.compile(ADD_F32_8).serialize())
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="needs the StableHLO text"):
        exe.execute_async(x, x, ordered=True)
    np.testing.assert_array_equal(exe.execute(x, x).to_numpy(), 2 * x)  # unordered works


def test_ordered_execution_without_outputs_shows_no_token(client: pjrt_py.Client) -> None:
    # The runtime token is pjrt_py's: a program with no outputs gives a
    # promise of nothing, as an unordered run does.
    exe = client.compile("func.func @main(%x: tensor<8xf32>) { return }")
    x = np.ones(8, np.float32)
    for promise in (exe.execute_async(x, ordered=True), exe.execute_async(x)):
        assert promise.value() is None
        assert len(promise) == 0 and promise._buffers == ()
        with pytest.raises(ValueError, match="0 buffers"):
            promise.buffer()
        with pytest.raises(IndexError):
            promise[0]
    assert exe.execute(x, ordered=True) is None
    pjrt_py.effects_barrier()


@pytest.mark.parametrize("flag", ["yes", 1, None, np.bool_(True)])
def test_ordered_takes_only_a_bool(client: pjrt_py.Client, flag: object) -> None:
    exe = client.compile("func.func @main(%x: tensor<8xf32>) { return }")
    x = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="ordered must be True or False"):
        exe.execute_async(x, ordered=flag)
    with pytest.raises(TypeError, match="ordered must be True or False"):
        exe.execute(x, ordered=flag)
    with pytest.raises(TypeError, match="ordered must be True or False"):
        client.compile("func.func @main(%x: tensor<8xf32>) { return }", ordered=flag, cache=False)


def _effect_program(client: pjrt_py.Client, name: str, n: int) -> pjrt_py.Executable:
    """x -> x, with an effect that calls host callback ``name`` on x."""
    t = f"tensor<{n}x{n}xf32>"
    return client.compile(
        f"func.func @main(%v: {t}) -> {t} {{\n"
        f"  %d = stablehlo.dot_general %v, %v, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}\n"
        f"  %t0 = stablehlo.after_all : !stablehlo.token\n"
        f"  %t1 = stablehlo.custom_call @{name}(%t0, %d) "
        f"{{api_version = 4 : i32, has_side_effect = true}} : (!stablehlo.token, {t}) -> "
        f"!stablehlo.token\n  return %d : {t}\n}}"
    )


@pytest.mark.needs_host_callbacks
@pytest.mark.parametrize("n", [1, 600], ids=["cheap", "dense"])
def test_a_failed_ordered_call_keeps_its_error_and_later_calls_run(
    client: pjrt_py.Client, n: int
) -> None:
    # A cheap program the CPU plugin runs inline failed inside execute_async,
    # which raised (unordered calls keep the error in the promise). A dense one
    # failing in the background left an errored token, and every later
    # ordered call of the thread failed with it, for good.
    failing, seen = {"now": False}, []

    def effect(v: np.ndarray) -> None:
        if failing["now"]:
            raise RuntimeError("the effect failed")
        seen.append(float(v[0, 0]))

    name = f"pjrt_py_test_effect_{n}"
    pjrt_py.register_callback(name, effect, client=client)
    exe = _effect_program(client, name, n)
    x = np.eye(n, dtype=np.float32)
    for attempt in range(3):
        failing["now"] = attempt == 1
        promise = exe.execute_async(x * (attempt + 1), ordered=True)  # never raises
        error = promise.exception()
        if attempt == 1:
            assert isinstance(error, pjrt_py.PjrtError) and "the effect failed" in str(error)
        else:
            assert error is None, error
    assert seen == [1.0, 9.0]  # the third call ran its effect after the failure
    pjrt_py.effects_barrier()
