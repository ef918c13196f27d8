"""Executing programs: results, arguments, chaining and argument validation."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ADD_F32_8, COUNT_LOOP, run_python

import pjrt_py

TWO_OUTPUTS = """
func.func @main(%x: tensor<2x3xi32>) -> (tensor<2x3xi32>, tensor<3x2xi32>) {
  %0 = stablehlo.multiply %x, %x : tensor<2x3xi32>
  %1 = stablehlo.transpose %x, dims = [1, 0] : (tensor<2x3xi32>) -> tensor<3x2xi32>
  return %0, %1 : tensor<2x3xi32>, tensor<3x2xi32>
}
"""

NO_OUTPUTS = """
func.func @main(%x: tensor<4xf32>) -> () {
  return
}
"""

DONATING = """
func.func @main(%x: tensor<8xf32> {tf.aliasing_output = 0 : i32}) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %x : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


def test_add_matches_numpy(client: pjrt_py.Client, add_exe: pjrt_py.Executable) -> None:
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    y = np.arange(8, dtype=np.float32)
    out = add_exe.execute(client.buffer(x), client.buffer(y))
    assert isinstance(out, pjrt_py.Buffer)
    assert out.is_ready()
    np.testing.assert_array_equal(out.to_numpy(), x + y)


def test_several_outputs_give_a_tuple(client: pjrt_py.Client) -> None:
    exe = client.compile(TWO_OUTPUTS)
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    sq, tr = exe.execute(x)
    np.testing.assert_array_equal(sq.to_numpy(), x * x)
    np.testing.assert_array_equal(tr.to_numpy(), x.T)
    promise = exe.execute_async(x)
    assert len(promise) == 2
    np.testing.assert_array_equal(promise[1].to_numpy(), x.T)
    assert isinstance(promise.value(), tuple)


def test_zero_outputs_resolve_to_none_on_completion(client: pjrt_py.Client) -> None:
    exe = client.compile(NO_OUTPUTS)
    assert exe.num_outputs == 0
    promise = exe.execute_async(np.ones(4, np.float32))
    assert promise.value() is None
    assert promise.is_ready()
    assert exe.execute(np.ones(4, np.float32)) is None


def test_numpy_and_scalar_arguments_are_transferred(client: pjrt_py.Client) -> None:
    exe = client.compile(COUNT_LOOP)
    assert int(exe.execute(np.int64(100)).to_numpy()) == sum(range(100))
    assert int(exe.execute(np.array(10)).to_numpy()) == 45


def test_promises_chain_without_host_waits(
    client: pjrt_py.Client, add_exe: pjrt_py.Executable
) -> None:
    x = client.buffer_async(np.ones(8, np.float32))
    y = client.buffer_async(np.full(8, 2, np.float32))
    p = add_exe.execute_async(x, y)
    for _ in range(5):
        p = add_exe.execute_async(p, x)  # a promise is a valid argument
    np.testing.assert_array_equal(pjrt_py.to_numpy_async(p).value(), np.full(8, 8, np.float32))


def test_wrong_argument_count_is_a_type_error(add_exe: pjrt_py.Executable) -> None:
    x = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="takes 2 argument"):
        add_exe.execute_async(x)
    with pytest.raises(TypeError, match="3 given"):
        add_exe.execute(x, x, x)


def test_wrong_argument_count_never_reaches_the_plugin() -> None:
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        exe = pjrt_py.Client().compile({ADD_F32_8!r})
        for args in [(), (np.ones(8, np.float32),)]:
            try:
                exe.execute_async(*args)
            except TypeError as e:
                print("REFUSED", e)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("REFUSED") == 2


def test_deleted_argument_is_refused(client: pjrt_py.Client, add_exe: pjrt_py.Executable) -> None:
    a = client.buffer(np.ones(8, np.float32))
    b = client.buffer(np.ones(8, np.float32))
    b.delete()
    with pytest.raises(ValueError, match="argument 1: buffer has been deleted"):
        add_exe.execute_async(a, b)


def test_buffer_of_another_client_is_refused(add_exe: pjrt_py.Executable) -> None:
    other = pjrt_py.Client()
    a = add_exe.client.buffer(np.ones(8, np.float32))
    foreign = other.buffer(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="argument 0: buffer belongs to another client"):
        add_exe.execute_async(foreign, a)


def test_unsupported_argument_types(add_exe: pjrt_py.Executable) -> None:
    a = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="argument 1: expected a Buffer"):
        add_exe.execute(a, "text")
    with pytest.raises(TypeError, match="argument 0"):
        add_exe.execute([1.0] * 8, a)


def test_multi_output_promise_must_be_indexed(client: pjrt_py.Client) -> None:
    two = client.compile(TWO_OUTPUTS).execute_async(np.zeros((2, 3), np.int32))
    exe = client.compile(TWO_OUTPUTS)
    with pytest.raises(ValueError, match=r"pick one with promise\[i\]"):
        exe.execute_async(two)
    np.testing.assert_array_equal(exe.execute(two[0])[0].to_numpy(), np.zeros((2, 3)))


def test_mismatched_shape_raises_before_the_plugin(add_exe: pjrt_py.Executable) -> None:
    # Checked in Python against the compiled signature (the plugin would say
    # InvalidArgumentError; for a same-sized dtype it would say nothing).
    with pytest.raises(TypeError, match=r"Argument 'x' compiled with float32\[8\] and called"):
        add_exe.execute(np.ones(3, np.float32), np.ones(8, np.float32))


def test_donated_input_is_dead_and_reports_errors(client: pjrt_py.Client) -> None:
    exe = client.compile(DONATING)
    a = client.buffer(np.ones(8, np.float32))
    out = exe.execute(a)
    np.testing.assert_array_equal(out.to_numpy(), np.full(8, 2, np.float32))
    # PJRT consumed the donated buffer, and pjrt_py retired it at dispatch:
    # every use is a clear ValueError before any C call, never a crash.
    assert a.is_deleted
    for use in (a.block_until_ready, a.to_numpy, lambda: exe.execute(a)):
        with pytest.raises(ValueError, match="donated"):
            use()


def test_executable_delete_is_idempotent(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_F32_8)
    with exe:
        pass
    exe.delete()
    assert exe.is_deleted
    with pytest.raises(ValueError, match="deleted"):
        exe.execute_async(np.ones(8, np.float32), np.ones(8, np.float32))
    assert "deleted" in repr(exe)


def test_jax_lowered_mlp_matches_jax() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def mlp(x, w1, b1, w2):  # type: ignore[no-untyped-def]
        return jnp.maximum(x @ w1 + b1, 0.0) @ w2

    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(4, 16), (16, 32), (32,), (32, 2)]]
    exe = pjrt_py.Client().compile(jax.jit(mlp).lower(*args).as_text())
    np.testing.assert_allclose(
        exe.execute(*args).to_numpy(), np.asarray(jax.jit(mlp)(*args)), rtol=1e-5, atol=1e-5
    )
