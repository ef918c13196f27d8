"""Donated inputs: dead after dispatch, refusable per call, never host memory."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import doubling, lets_threads_run, queued_work, run_python

import pjrt_py

# x is donated (aliased to output 0); y is not.
DONATE_X = """
func.func @main(%x: tensor<8xf32> {tf.aliasing_output = 0 : i32},
                %y: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


@pytest.fixture(scope="module")
def donate_x(client: pjrt_py.Client) -> pjrt_py.Executable:
    return client.compile(DONATE_X)


def ones(client: pjrt_py.Client, value: float = 1.0) -> pjrt_py.Buffer:
    return client.buffer(np.full(8, value, np.float32))


def test_donated_parameters_are_read_from_the_compiled_program(
    donate_x: pjrt_py.Executable,
) -> None:
    assert donate_x._donated == (0,)


@pytest.mark.parametrize("form", ["sync", "async"])
def test_donated_input_is_dead_after_dispatch(
    client: pjrt_py.Client, donate_x: pjrt_py.Executable, form: str
) -> None:
    x, y = ones(client), ones(client, 2.0)
    address = x.unsafe_pointer()
    out = donate_x.execute(x, y) if form == "sync" else donate_x.execute_async(x, y).value()
    assert x.is_deleted and not y.is_deleted
    assert out.unsafe_pointer() == address  # the output really took x's memory
    np.testing.assert_array_equal(out.to_numpy(), np.full(8, 3, np.float32))
    for use in (x.to_numpy, x.to_numpy_async, lambda: donate_x.execute(x, y)):
        with pytest.raises(ValueError, match="donated"):
            use()
    x.delete()  # still idempotent


def test_a_donated_promise_is_dead_too(client: pjrt_py.Client, donate_x) -> None:
    first = donate_x.execute_async(ones(client), ones(client))
    second = donate_x.execute_async(first, ones(client))  # donates first's buffer
    np.testing.assert_array_equal(second.value().to_numpy(), np.full(8, 3, np.float32))
    with pytest.raises(ValueError, match="donated"):
        first.value().to_numpy()


def test_a_donated_buffer_passed_twice_is_refused_before_the_plugin(
    client: pjrt_py.Client, donate_x: pjrt_py.Executable
) -> None:
    x = ones(client)
    promise = donate_x.execute_async(ones(client), ones(client))
    for args in ((x, x), (promise, promise.value())):
        with pytest.raises(ValueError, match="argument 0 is donated, and the same buffer is also"):
            donate_x.execute(*args)
    assert not x.is_deleted  # nothing ran
    np.testing.assert_array_equal(donate_x.execute(x, x.copy_to_device(x.device)).to_numpy(), 2)
    assert x.is_deleted


@pytest.mark.needs_devices(2)
def test_a_donated_buffer_passed_twice_on_many_devices_is_refused_not_a_crash() -> None:
    # fastatomstruct-xla-cpu segfaulted on it in execute_sharded (one device:
    # the plugin's INVALID_ARGUMENT); in a child, in case it ever does again.
    result = run_python(
        f"""
        import numpy as np
        import pjrt_py
        c = pjrt_py.Client()  # $PJRT_PLUGIN's, as the session's
        assert len(c.devices) >= 2, c.devices
        exe = c.compile({DONATE_X!r}, num_replicas=2)
        rows = [[b, b] for b in (c.buffer(np.ones(8, np.float32), device=d) for d in exe.devices)]
        for call in (exe.execute_sharded, exe.execute_sharded_async):
            try:
                call(rows)
            except ValueError as e:
                print("refused:", e)
        print("alive", all(not r[0].is_deleted for r in rows))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("refused: argument 0 is donated") == 2, result.stdout
    assert "on device 0" in result.stdout and "alive True" in result.stdout


def test_non_donatable_keeps_the_input(client: pjrt_py.Client, donate_x) -> None:
    x, y = ones(client), ones(client, 2.0)
    out = donate_x.execute(x, y, non_donatable=[0])
    assert not x.is_deleted
    np.testing.assert_array_equal(x.to_numpy(), np.ones(8, np.float32))
    np.testing.assert_array_equal(out.to_numpy(), np.full(8, 3, np.float32))
    assert out.unsafe_pointer() != x.unsafe_pointer()
    with pytest.raises(ValueError, match="not a parameter index"):
        donate_x.execute(x, y, non_donatable=[2])


@pytest.mark.parametrize("bad", [0, 1, True, "0", b"\x00", 0.0])
def test_non_donatable_takes_only_a_sequence_of_indices(
    client: pjrt_py.Client, donate_x, bad: object
) -> None:
    # non_donatable=0 once read as "nothing" (0 is falsy) and donated argument 0.
    x, y = ones(client), ones(client, 2.0)
    with pytest.raises(TypeError, match="sequence of parameter indices"):
        donate_x.execute(x, y, non_donatable=bad)
    assert not x.is_deleted and not y.is_deleted
    with pytest.raises(ValueError, match="not a parameter index"):
        donate_x.execute(x, y, non_donatable=[0.0])
    assert not x.is_deleted


@pytest.mark.needs_zero_copy
def test_zero_copy_input_is_never_donated(client: pjrt_py.Client, donate_x) -> None:
    host = pjrt_py.aligned_empty((8,), np.float32)
    host[:] = 1
    x = client.buffer(host, zero_copy=True)
    assert x.unsafe_pointer() == host.ctypes.data
    out = donate_x.execute(x, ones(client, 2.0))
    # Refused, so the program never writes into the host's array, and the
    # buffer stays valid.
    assert not x.is_deleted
    assert out.unsafe_pointer() != host.ctypes.data
    np.testing.assert_array_equal(host, np.ones(8, np.float32))
    np.testing.assert_array_equal(out.to_numpy(), np.full(8, 3, np.float32))


def test_training_loop_donates_state_each_step(client: pjrt_py.Client) -> None:
    import jax
    import jax.numpy as jnp

    def step(params, x):
        grad = jax.grad(lambda p: jnp.sum((x @ p["w"] + p["b"]) ** 2))(params)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grad)

    jitted = jax.jit(step, donate_argnums=0)
    w0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    b0 = np.zeros(3, np.float32)
    xs = [np.full((2, 4), i / 10, np.float32) for i in range(5)]
    text = jitted.lower({"b": b0, "w": w0}, xs[0]).as_text()
    exe = client.compile(text)
    assert exe._donated == (0, 1)

    state = [client.buffer(b0), client.buffer(w0)]
    history = []
    for x in xs:
        out = exe.execute_async(*state, x)  # returns at once; state is consumed
        history.append(state)
        state = [out[0].buffer(), out[1].buffer()]
    assert all(b.is_deleted for old in history for b in old)

    expected = {"b": jnp.asarray(b0), "w": jnp.asarray(w0)}
    for x in xs:
        expected = jax.jit(step)(expected, x)
    np.testing.assert_allclose(state[0].to_numpy(), expected["b"], rtol=1e-6)
    np.testing.assert_allclose(state[1].to_numpy(), expected["w"], rtol=1e-6)


def test_ordered_execution_still_donates(client: pjrt_py.Client, donate_x) -> None:
    x = ones(client)
    out = donate_x.execute(x, ones(client, 2.0), ordered=True)
    assert x.is_deleted
    np.testing.assert_array_equal(out.to_numpy(), np.full(8, 3, np.float32))


def test_donating_queued_work_lets_other_threads_run(client: pjrt_py.Client) -> None:
    # XLA's CPU client of PJRT 0.81 waits in PJRT_Buffer_Destroy of a donated
    # buffer for the execution it went to to start; pjrt_py destroys it when
    # it retires the donated Buffer, which must not hold the GIL meanwhile.
    donating = doubling(client, donate=True)
    running, queued = queued_work(client, 0.5)
    buf = queued.buffer()
    out = lets_threads_run(lambda: donating.execute_async(buf), running)
    assert buf.is_deleted
    assert isinstance(out, pjrt_py.BufferPromise)
    np.testing.assert_array_equal(out.value().to_numpy(), 4 * running.value().to_numpy())
