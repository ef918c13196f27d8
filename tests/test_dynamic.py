"""Programs with dynamic dimensions, specialized per call (pjrt_py.programs.dynamic)."""

from __future__ import annotations

import numpy as np
import pytest

import pjrt_py

pytest.importorskip("jaxlib", reason="shape refinement is jaxlib's")

ADD_DYNAMIC = """
func.func @main(%x: tensor<?xf32>, %y: tensor<?xf32>) -> tensor<?xf32> {
  %0 = stablehlo.add %x, %y : tensor<?xf32>
  return %0 : tensor<?xf32>
}
"""

T = "tensor<?x3xf32, #stablehlo.bounds<4, ?>>"
BOUNDED = f"""
func.func @main(%x: {T}) -> {T} {{
  %0 = stablehlo.multiply %x, %x : {T}
  return %0 : {T}
}}
"""


def test_dynamic_program_runs_for_each_shape(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_DYNAMIC)
    assert isinstance(exe, pjrt_py.DynamicExecutable)
    assert [s.shape for s in exe.input_signature] == [(None,), (None,)]
    for n in (1, 3, 17, 3):
        x, y = np.arange(n, dtype=np.float32), np.full(n, 2, np.float32)
        np.testing.assert_array_equal(exe.execute(x, y).to_numpy(), x + y)
        np.testing.assert_array_equal(pjrt_py.value(exe.execute_async(x, y)).to_numpy(), x + y)
    assert sorted(exe.specializations) == [((1,), (1,)), ((3,), (3,)), ((17,), (17,))]
    static = exe.specializations[((3,), (3,))]
    assert [s.shape for s in static.input_signature] == [(3,), (3,)]


def test_buffers_and_chained_promises_are_arguments(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_DYNAMIC)
    x = client.buffer(np.ones(5, np.float32))
    p = exe.execute_async(x, x)
    np.testing.assert_array_equal(exe.execute(p, p).to_numpy(), np.full(5, 4, np.float32))


def test_bounds_are_honoured(client: pjrt_py.Client) -> None:
    exe = client.compile(BOUNDED)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(exe.execute(x).to_numpy(), x * x)
    np.testing.assert_array_equal(exe.execute(x[:2]).to_numpy(), x[:2] * x[:2])
    with pytest.raises(ValueError, match="over its bound 4"):
        exe.execute(np.ones((5, 3), np.float32))


def test_shapes_the_program_cannot_take_are_refused(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_DYNAMIC)
    with pytest.raises(TypeError, match=r"shape \[\?\], got \[2, 2\]"):
        exe.execute(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="takes 2 argument"):
        exe.execute(np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"argument shapes \[\(3,\), \(4,\)\]"):
        exe.execute(np.ones(3, np.float32), np.ones(4, np.float32))
    static_dim = client.compile(BOUNDED)
    with pytest.raises(TypeError, match=r"shape \[\?x3\]"):
        static_dim.execute(np.ones((2, 4), np.float32))


def test_jax_shape_polymorphic_exports_run_and_match_jax(client: pjrt_py.Client) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from jax import export

    (b,) = export.symbolic_shape("b")

    def f(x: object, y: object) -> object:
        return jnp.sin(x) + y.reshape(-1)[: x.shape[0]] * 2  # type: ignore[attr-defined]

    exported = export.export(jax.jit(f), platforms=["cpu"])(
        jax.ShapeDtypeStruct((b,), jnp.float32), jax.ShapeDtypeStruct((b, 2), jnp.float32)
    )
    exe = client.compile(exported.mlir_module())
    for n in (2, 5):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        y = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
        np.testing.assert_allclose(exe.execute(x, y).to_numpy(), np.asarray(f(x, y)), rtol=1e-6)
    with pytest.raises(ValueError, match="cannot run with argument shapes"):
        exe.execute(np.ones(3, np.float32), np.ones((4, 2), np.float32))


def test_a_failed_shape_constraint_is_a_value_error(client: pjrt_py.Client) -> None:
    jax = pytest.importorskip("jax")
    from jax import export

    (b,) = export.symbolic_shape("b")
    exported = export.export(jax.jit(lambda y: y.reshape(2, -1).sum(0)), platforms=["cpu"])(
        jax.ShapeDtypeStruct((2 * b,), jax.numpy.float32)
    )
    exe = client.compile(exported.mlir_module())
    np.testing.assert_array_equal(
        exe.execute(np.arange(6, dtype=np.float32)).to_numpy(), np.array([3, 5, 7], np.float32)
    )
    with pytest.raises(ValueError, match=r"argument shapes \[\(5,\)\]"):
        exe.execute(np.arange(5, dtype=np.float32))
