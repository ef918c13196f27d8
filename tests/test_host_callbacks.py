"""Python host callbacks (issue 14, part 1): ``register_callback`` and the
custom calls that run it, on the real plugin of this run (the CI matrix runs
every CPU build). Cases that could hang or kill the process run in a fresh
interpreter with a timeout."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import in_threads, matmul_chain, run_python

import pjrt_py
from pjrt_py.callbacks import host_callback

# Every test here runs Python host callbacks.
pytestmark = pytest.mark.needs_host_callbacks


def mlir(dtype: Any, shape: tuple[int, ...]) -> str:
    element = {
        "float32": "f32",
        "float64": "f64",
        "float16": "f16",
        "bfloat16": "bf16",
        "int8": "i8",
        "int32": "i32",
        "int64": "i64",
        "uint16": "ui16",
        "uint8": "ui8",
        "bool": "i1",
        "complex64": "complex<f32>",
    }[np.dtype(dtype).name]
    return f"tensor<{'x'.join(map(str, shape))}{'x' if shape else ''}{element}>"


def unary(name: str, t: str, out: str | None = None, attrs: str = "") -> str:
    out = out or t
    extra = f", backend_config = {{{attrs}}}" if attrs else ""
    return f"""
func.func @main(%x: {t}) -> {out} {{
  %0 = stablehlo.custom_call @{name}(%x) {{api_version = 4 : i32{extra}}} : ({t}) -> {out}
  return %0 : {out}
}}"""


def chain_then(name: str, n: int, steps: int, operands: str = "", effect: bool = False) -> str:
    """``matmul_chain(n, steps)`` (dense work: the plugin runs it on its own
    threads), then ``@name`` on its result, plus ``operands`` (``%i: type``
    pairs, added as parameters). With ``effect``, a token-threaded call with
    no results and the chain's result returned."""
    t = f"tensor<{n}x{n}xf32>"
    params = [p.split(":")[0].strip() for p in operands.split(",") if p.strip()]
    types = [p.split(":")[1].strip() for p in operands.split(",") if p.strip()]
    args = ", ".join([f"%x{steps}", *params])
    arg_types = ", ".join([t, *types])
    if effect:
        token = "!stablehlo.token"
        call = (
            f"%t = stablehlo.after_all : {token}\n"
            f"  %t1 = stablehlo.custom_call @{name}(%t, {args}) "
            f"{{api_version = 4 : i32, has_side_effect = true}} : ({token}, {arg_types}) -> {token}"
        )
        result = f"%x{steps}"
    else:
        call = (
            f"%y = stablehlo.custom_call @{name}({args}) {{api_version = 4 : i32}} "
            f": ({arg_types}) -> {t}"
        )
        result = "%y"
    text = matmul_chain(n, steps).replace(
        f"return %x{steps} : {t}", f"{call}\n  return {result} : {t}"
    )
    return text.replace(f"@main(%x0: {t})", f"@main(%x0: {t}{', ' if operands else ''}{operands})")


CASES = [
    (np.float32, (2, 3), np.sin),
    (np.float64, (5,), np.exp),
    (np.float16, (4,), np.negative),
    (ml_dtypes.bfloat16, (3, 2), lambda x: x * 2),
    (np.int8, (7,), lambda x: x // 3),
    (np.int32, (), lambda x: x + 5),
    (np.int64, (2, 2, 2), np.cumsum),
    (np.uint16, (6,), lambda x: x * 3),
    (np.bool_, (4,), np.logical_not),
    (np.complex64, (3,), np.conj),
    (np.float32, (0, 3), np.sin),
]


@pytest.mark.parametrize("copy", [True, False], ids=["copies", "views"])
@pytest.mark.parametrize(("dtype", "shape", "fn"), CASES, ids=lambda v: getattr(v, "__name__", v))
def test_a_numpy_function_runs_inside_the_program(
    client: pjrt_py.Client, dtype: Any, shape: tuple[int, ...], fn: Any, copy: bool
) -> None:
    name = f"np_{np.dtype(dtype).name}_{len(shape)}_{copy}"

    def callback(x: np.ndarray) -> np.ndarray:
        assert x.flags.writeable == x.flags.owndata == copy
        out = np.asarray(fn(x), dtype=dtype)
        return out.reshape(x.shape)

    pjrt_py.register_callback(name, callback, client=client, copy=copy)
    exe = client.compile(unary(name, mlir(dtype, shape)))
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    want = np.asarray(fn(x), dtype=dtype).reshape(shape)
    got = exe.execute(x).to_numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)


def test_several_operands_and_results(client: pjrt_py.Client) -> None:
    pjrt_py.register_callback("sum_and_product", lambda a, b: (a + b, a * b), client=client)
    exe = client.compile("""
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %0:2 = stablehlo.custom_call @sum_and_product(%a, %b) {api_version = 4 : i32}
    : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  return %0#0, %0#1 : tensor<4xf32>, tensor<4xf32>
}""")
    a, b = np.arange(4, dtype=np.float32), np.full(4, 3, np.float32)
    s, p = exe.execute(a, b)
    np.testing.assert_array_equal(s.to_numpy(), a + b)
    np.testing.assert_array_equal(p.to_numpy(), a * b)


def test_attributes_arrive_as_keyword_arguments(client: pjrt_py.Client) -> None:
    seen: list[dict[str, Any]] = []

    def scale(x: np.ndarray, **attrs: Any) -> np.ndarray:
        seen.append(attrs)
        return (x * attrs["alpha"] + attrs["shift"][0]).astype(x.dtype)

    pjrt_py.register_callback("scale_by_attrs", scale, client=client)
    attrs = (
        'alpha = 2.5 : f32, shift = array<i32: 1, 2>, label = "hi", n = 3 : i64, '
        "flag = true, small = 7 : ui8, nested = {k = 2 : i32}, d = 0.25 : f64"
    )
    exe = client.compile(unary("scale_by_attrs", "tensor<3xf32>", attrs=attrs))
    out = exe.execute(np.ones(3, np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.full(3, 3.5, np.float32))
    got = seen[-1]
    assert got["alpha"] == 2.5 and got["d"] == 0.25 and got["n"] == 3 and got["small"] == 7
    assert got["label"] == "hi" and got["flag"] is True and got["nested"] == {"k": 2}
    assert got["shift"].dtype == np.int32 and got["shift"].tolist() == [1, 2]
    assert type(got["n"]) is int and type(got["alpha"]) is float


def test_an_exception_fails_the_execution_with_its_traceback(client: pjrt_py.Client) -> None:
    def broken(x: np.ndarray) -> np.ndarray:
        raise ValueError("the callback says no")

    pjrt_py.register_callback("broken_cb", broken, client=client)
    exe = client.compile(unary("broken_cb", "tensor<2xf32>"))
    promise = exe.execute_async(np.ones(2, np.float32))  # dispatch itself does not raise
    with pytest.raises(pjrt_py.PjrtError) as info:
        promise.value().to_numpy()
    message = str(info.value)
    assert "host callback 'broken_cb' raised ValueError: the callback says no" in message
    assert "in broken" in message and "test_host_callbacks.py" in message
    # The client stays usable, and the callback can be fixed by registering again.
    pjrt_py.register_callback("broken_cb", lambda x: x + 1, client=client)
    np.testing.assert_array_equal(exe.execute(np.ones(2, np.float32)).to_numpy(), [2, 2])


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        (
            lambda x: x.astype(np.float64),
            r"returned float64 \(2,\) for result 0; the program declares float32 \(2,\)",
        ),
        (lambda x: np.ones(3, np.float32), r"returned float32 \(3,\) for result 0"),
        (lambda x: None, "returned None; the program declares 1 result"),
        (lambda x: (x, x), "returned a tuple of 2 values, read as one array"),
        (lambda x: [x, x, x], "returned a list of 3 values, read as one array"),
        (lambda x: 1.0, r"returned float64 \(\)"),
    ],
    ids=["dtype", "shape", "none", "two-for-one", "three-in-a-list", "python-float"],
)
def test_results_must_match_the_declared_types(
    client: pjrt_py.Client, returned: Any, match: str
) -> None:
    pjrt_py.register_callback("typed_result", returned, client=client)
    exe = client.compile(unary("typed_result", "tensor<2xf32>"))
    with pytest.raises(pjrt_py.InvalidArgumentError, match="host callback 'typed_result'") as e:
        exe.execute(np.ones(2, np.float32)).to_numpy()
    assert e.match(match)


def test_result_count_is_checked(client: pjrt_py.Client) -> None:
    pjrt_py.register_callback("two_results", lambda a: (a,), client=client)
    exe = client.compile("""
func.func @main(%a: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %0:2 = stablehlo.custom_call @two_results(%a) {api_version = 4 : i32}
    : (tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
  return %0#0, %0#1 : tensor<2xf32>, tensor<2xf32>
}""")
    with pytest.raises(
        pjrt_py.InvalidArgumentError, match="returned 1 results; the program expects 2"
    ):
        exe.execute(np.ones(2, np.float32))[0].to_numpy()


def test_strided_results_are_copied_in_order(client: pjrt_py.Client) -> None:
    pjrt_py.register_callback("reversed_view", lambda x: x[::-1], client=client)
    pjrt_py.register_callback("fortran_order", np.asfortranarray, client=client)
    x = np.arange(5, dtype=np.float32)
    exe = client.compile(unary("reversed_view", "tensor<5xf32>"))
    np.testing.assert_array_equal(exe.execute(x).to_numpy(), x[::-1])
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    exe = client.compile(unary("fortran_order", "tensor<2x3xf32>"))
    np.testing.assert_array_equal(exe.execute(m).to_numpy(), m)


def test_operands_are_copies_the_callback_may_write_and_keep(client: pjrt_py.Client) -> None:
    kept: list[np.ndarray] = []

    def writes_and_keeps(x: np.ndarray) -> np.ndarray:
        y = x + 1  # computed before the write below
        x[0] = 100  # its own copy: the program's memory is untouched
        kept.append(x[1:])
        return y

    pjrt_py.register_callback("writes_and_keeps", writes_and_keeps, client=client)
    exe = client.compile(
        "func.func @main(%x: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>) {\n"
        "  %y = stablehlo.custom_call @writes_and_keeps(%x) {api_version = 4 : i32}"
        " : (tensor<3xf32>) -> tensor<3xf32>\n"
        "  %z = stablehlo.add %x, %x : tensor<3xf32>\n"
        "  return %y, %z : tensor<3xf32>, tensor<3xf32>\n}"
    )
    for i in range(3):
        y, z = exe.execute(np.full(3, i, np.float32))
        np.testing.assert_array_equal(y.to_numpy(), np.full(3, i + 1, np.float32))
        np.testing.assert_array_equal(z.to_numpy(), np.full(3, 2 * i, np.float32))
    del exe
    gc.collect()
    assert [k.tolist() for k in kept] == [[0, 0], [1, 1], [2, 2]]


def test_views_are_read_only(client: pjrt_py.Client) -> None:
    def writes(x: np.ndarray) -> np.ndarray:
        x[0] = 1  # the program's memory: refused by numpy
        return x

    pjrt_py.register_callback("writes_operand", writes, client=client, copy=False)
    exe = client.compile(unary("writes_operand", "tensor<2xf32>"))
    with pytest.raises(pjrt_py.PjrtError, match="read-only"):
        exe.execute(np.zeros(2, np.float32)).to_numpy()


def test_keeping_a_view_fails_the_execution(client: pjrt_py.Client) -> None:
    kept: list[np.ndarray] = []

    def keep(x: np.ndarray) -> np.ndarray:
        kept.append(x[1:])  # a view derived from the operand
        return x

    pjrt_py.register_callback("keeps_view", keep, client=client, copy=False)
    exe = client.compile(unary("keeps_view", "tensor<3xf32>"))
    with pytest.raises(
        pjrt_py.FailedPreconditionError, match="kept a reference to one of its operands"
    ):
        exe.execute(np.zeros(3, np.float32)).to_numpy()
    kept.clear()  # never read: it points at memory XLA has freed


KEEPS_A_LARGE_OPERAND = """
import gc
import numpy as np
import pjrt_py
c = pjrt_py.Client()
kept = []
pjrt_py.register_callback("keep_large", lambda x: kept.append(x) or np.array(x), client=c)
n = 1 << 24
exe = c.compile(
    f"func.func @main(%x: tensor<{n}xf32>) -> tensor<{n}xf32> {{\\n"
    f"  %a = stablehlo.add %x, %x : tensor<{n}xf32>\\n"
    f"  %y = stablehlo.custom_call @keep_large(%a) {{api_version = 4 : i32}}"
    f" : (tensor<{n}xf32>) -> tensor<{n}xf32>\\n"
    f"  return %y : tensor<{n}xf32>\\n}}"
)
y = exe.execute(np.ones(n, np.float32)).to_numpy()
del exe
gc.collect()
assert float(kept[0].sum()) == float(y.sum()) == 2.0 * n, (kept[0][:4], y[:4])
print("ok")
"""


def test_a_default_callback_may_keep_a_large_operand() -> None:
    # The attack that made copying the default: with views, reading the kept
    # 64 MiB operand after the execution crashed the interpreter 10 runs of 10.
    done = run_python(KEEPS_A_LARGE_OPERAND)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_callbacks_without_results_and_with_tokens_run_in_program_order(
    client: pjrt_py.Client,
) -> None:
    log: list[tuple[str, float]] = []
    pjrt_py.register_callback(
        "log_first", lambda x: log.append(("first", float(x[0]))), client=client
    )
    pjrt_py.register_callback(
        "log_second", lambda x: log.append(("second", float(x[0]))), client=client
    )
    call = "{api_version = 4 : i32, has_side_effect = true}"
    sig = ": (!stablehlo.token, tensor<1xf32>) -> !stablehlo.token"
    exe = client.compile(f"""
func.func @main(%x: tensor<1xf32>) -> tensor<1xf32> {{
  %t0 = stablehlo.after_all : !stablehlo.token
  %t1 = stablehlo.custom_call @log_second(%t0, %x) {call} {sig}
  %t2 = stablehlo.custom_call @log_first(%t1, %x) {call} {sig}
  %t3 = stablehlo.custom_call @log_second(%t2, %x) {call} {sig}
  return %x : tensor<1xf32>
}}""")
    for i in range(4):
        exe.execute_async(np.array([i], np.float32), ordered=True)
    pjrt_py.effects_barrier()
    want = [(w, float(i)) for i in range(4) for w in ("second", "first", "second")]
    assert log == want


def test_ordered_executions_call_back_in_dispatch_order(client: pjrt_py.Client) -> None:
    # Heavy work before the callback makes each execution asynchronous; ordered
    # executions still call back in the order they were dispatched.
    n = 256
    log: list[int] = []
    pjrt_py.register_callback("log_order", lambda x, i: log.append(int(i[0])), client=client)
    body = chain_then("log_order", n, 3, "%i: tensor<1xi32>", effect=True)
    exes = [client.compile(body, device=d) for d in client.devices]
    x = np.full((n, n), 1 / n, np.float32)
    for i in range(12):
        exes[i % len(exes)].execute_async(x, np.array([i], np.int32), ordered=True)
    pjrt_py.effects_barrier()
    assert log == list(range(12))


def test_callbacks_from_every_device_and_from_threads(client: pjrt_py.Client) -> None:
    n = 128
    threads_seen: set[int] = set()

    def plus_one(x: np.ndarray) -> np.ndarray:
        threads_seen.add(threading.get_ident())
        return x + 1

    pjrt_py.register_callback("plus_one_many", plus_one, client=client)
    body = chain_then("plus_one_many", n, 2)
    exes = {d: client.compile(body, device=d) for d in client.devices}
    x = np.full((n, n), 1 / n, np.float32)
    want = np.tanh(np.tanh(x @ x) @ np.tanh(x @ x)) + 1
    before = host_callback.calls()

    def worker(k: int) -> None:
        device = client.devices[k % len(client.devices)]
        arg = client.buffer(x, device=device)
        outs = [exes[device].execute_async(arg) for _ in range(5)]
        for out in outs:
            np.testing.assert_allclose(out.value().to_numpy(), want, rtol=1e-5)

    assert not in_threads(worker, 8)
    assert host_callback.calls() - before == 40
    assert threading.get_ident() not in threads_seen or len(threads_seen) > 1


def test_a_callback_may_dispatch_and_read_ready_results(client: pjrt_py.Client) -> None:
    add = client.compile("""
func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %x, %x : tensor<2xf32>
  return %0 : tensor<2xf32>
}""")

    def doubles_through_pjrt(x: np.ndarray) -> np.ndarray:
        assert pjrt_py.in_host_callback()
        out = add.execute_async(np.array(x))
        deadline = time.monotonic() + 10
        while not out.is_ready() and time.monotonic() < deadline:
            time.sleep(0.001)
        return out.value().to_numpy()

    pjrt_py.register_callback("reenters", doubles_through_pjrt, client=client)
    exe = client.compile(unary("reenters", "tensor<2xf32>"))
    np.testing.assert_array_equal(exe.execute(np.array([1, 2], np.float32)).to_numpy(), [2, 4])
    assert not pjrt_py.in_host_callback()


def test_waiting_inside_a_callback_raises_instead_of_deadlocking() -> None:
    # Measured before the guard: four devices whose callbacks each waited for
    # other work hung the process.
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        client = pjrt_py.Client()
        heavy = client.compile({matmul_chain(256, 4)!r})
        x = client.buffer(np.ones((256, 256), np.float32) / 256)
        def waits(y):
            heavy.execute_async(x).value()
            return y
        pjrt_py.register_callback("waits", waits, client=client)
        body = {chain_then("waits", 256, 1)!r}
        outs = []
        for d in client.devices:
            exe = client.compile(body, device=d)
            outs.append(exe.execute_async(client.buffer(np.ones((256, 256), np.float32), device=d)))
        for out in outs:
            try:
                out.value().to_numpy()
                print("ran")
            except pjrt_py.PjrtError as e:
                print("refused" if "cannot wait for a result" in str(e) else "other: " + str(e))
        try:
            pjrt_py.effects_barrier()
        except Exception as e:
            print("barrier", e)
        print("done")
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[-1] == "done"
    assert set(lines[:-1]) <= {"ran", "refused"} and "refused" in lines


def interrupted_in_a_callback(queued: bool) -> list[str]:
    """Run a program whose callback raises KeyboardInterrupt on its first
    call (``queued``: behind dense work); the child's output lines, checked
    for what must hold either way."""
    queue = (
        f"busy = client.compile({matmul_chain(256, 40)!r})"
        ".execute_async(np.eye(256, dtype=np.float32))"
        if queued
        else ""
    )
    result = run_python(
        f"""
        import threading
        import numpy as np, pjrt_py
        client = pjrt_py.Client()
        on_main = []
        def interrupted(x):
            on_main.append(threading.current_thread() is threading.main_thread())
            if len(on_main) == 1:
                raise KeyboardInterrupt
            return x
        pjrt_py.register_callback("interrupted", interrupted, client=client)
        exe = client.compile({unary("interrupted", "tensor<2xf32>")!r})
        {queue}
        try:
            try:
                print("value", exe.execute(np.ones(2, np.float32)).to_numpy().tolist())
            except pjrt_py.CancelledError as e:
                print("cancelled:", "KeyboardInterrupt" in str(e))
            for _ in range(1000):  # the interrupt is delivered at the next check
                sum(range(100))
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        print("alive", exe.execute(np.ones(2, np.float32)).to_numpy().tolist())
        print("first call on the main thread:", on_main[0])
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.split("\n")
    # Inline at dispatch, the interrupt reaches the main thread at once; run
    # on a plugin thread, the promise first raises CancelledError. Never a
    # value, never a lost interrupt.
    assert lines[:2] == ["interrupted", "alive [1.0, 1.0]"] or lines[:3] == [
        "cancelled: True",
        "interrupted",
        "alive [1.0, 1.0]",
    ], result.stdout
    return lines


def test_keyboard_interrupt_in_a_callback_cancels_and_reaches_the_main_thread() -> None:
    interrupted_in_a_callback(queued=False)


def test_keyboard_interrupt_in_a_callback_on_a_plugin_thread_fails_the_call() -> None:
    # Queued behind dense work, the call runs on a plugin thread (XLA's CPU
    # client runs a cheap program inline only when nothing is queued). The
    # interrupt the callback passes on is due at the main thread's next check,
    # which used to fall inside the Python constructor of the promise's
    # CancelledError: the error was lost and the promise gave the unwritten
    # output ("value [0.0, 0.0]"), with no interrupt.
    lines = interrupted_in_a_callback(queued=True)
    assert "first call on the main thread: False" in lines, lines


def test_exit_and_close_with_callbacks_in_flight_are_clean() -> None:
    result = run_python(
        f"""
        import time, numpy as np, pjrt_py
        client = pjrt_py.Client()
        def slow(x):
            time.sleep(0.3)
            return x
        pjrt_py.register_callback("slow_cb", slow, client=client)
        body = {chain_then("slow_cb", 128, 2)!r}
        exe = client.compile(body)
        other = pjrt_py.Client()
        pjrt_py.register_callback("slow_cb", slow, client=other)
        exe2 = other.compile(body)
        for _ in range(3):
            exe.execute_async(np.ones((128, 128), np.float32))
            exe2.execute_async(np.ones((128, 128), np.float32))
        other.close()   # waits for its work, callbacks included, without the GIL
        print("closed")
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "closed"


def test_bad_registrations(client: pjrt_py.Client) -> None:
    with pytest.raises(TypeError, match="callable"):
        pjrt_py.register_callback("not_callable", 3, client=client)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a custom-call target name"):
        pjrt_py.register_callback("1bad name", lambda x: x, client=client)
    with pytest.raises(ValueError, match="not a custom-call target name"):
        pjrt_py.register_callback(host_callback.ROUTER_TARGET, lambda x: x, client=client)
    with pytest.raises(pjrt_py.UnsupportedError, match="need a client of that platform"):
        pjrt_py.register_callback("on_gpu", lambda x: x, platform="cuda", client=client)
    closed = pjrt_py.Client()
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        pjrt_py.register_callback("on_closed", lambda x: x, client=closed)


def test_a_callback_whose_route_is_gone_fails_clearly(client: pjrt_py.Client) -> None:
    # What a jax-lowered program finds if its callables were dropped (or it was
    # serialized in another process): an error, never another function.
    host_callback.install_router(client)
    exe = client.compile(
        unary(host_callback.ROUTER_TARGET, "tensor<2xf32>", attrs="index = 12345 : ui64")
    )
    with pytest.raises(pjrt_py.NotFoundError, match="no longer exists"):
        exe.execute(np.ones(2, np.float32)).to_numpy()


@pytest.mark.parametrize("hostile", ["client.close()", "x.delete()", "exe.delete()"])
def test_a_callback_that_pulls_the_rug_gets_errors_not_crashes(hostile: str) -> None:
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        client = pjrt_py.Client()
        x = client.buffer(np.full((128, 128), 1 / 128, np.float32))
        def rug(v):
            {hostile}
            return v
        pjrt_py.register_callback("rug", rug, client=client)
        exe = client.compile({chain_then("rug", 128, 2)!r})
        try:
            out = exe.execute_async(x).value().to_numpy()
            print("ran", out.shape)
        except (ValueError, pjrt_py.PjrtError) as e:
            print("error", type(e).__name__)
        print("end")
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[1] == "end"
    # Deleting an input or the executable mid-call is deferred until the call
    # ends; closing the client makes its outputs unusable at once.
    want = "error ValueError" if "close" in hostile else "ran (128, 128)"
    assert lines[0] == want


def test_loading_a_program_whose_callback_is_not_registered_here_says_so(
    client: pjrt_py.Client, tmp_path: Path
) -> None:
    # Serialized in one process, loaded in a fresh one before its callback is
    # registered: the plugin's NotFoundError, raw bytes included (those said
    # the bytes came from another plugin build).
    program = unary("made_elsewhere", "tensor<3xf32>")
    writer = f"""
        import pjrt_py
        pjrt_py.register_callback("made_elsewhere", lambda x: x)
        exe = pjrt_py.default_client().compile({program!r})
        open({str(tmp_path / "env.bin")!r}, "wb").write(exe.serialize())
        open({str(tmp_path / "raw.bin")!r}, "wb").write(exe.serialize(raw=True))
        """
    assert run_python(writer).returncode == 0
    reader = f"""
        import pjrt_py
        c = pjrt_py.default_client()
        for name, raw in (("env.bin", False), ("raw.bin", True)):
            try:
                c.deserialize(open({str(tmp_path)!r} + "/" + name, "rb").read(), raw=raw)
            except pjrt_py.NotFoundError as e:
                print(name, "made_elsewhere" in str(e))
        """
    result = run_python(reader)
    assert result.stdout.split() == ["env.bin", "True", "raw.bin", "True"], result.stderr[-2000:]
