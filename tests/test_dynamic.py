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


def test_a_specialization_keeps_the_parameter_names(client: pjrt_py.Client) -> None:
    # Shape refinement prints them %arg0, %arg1: errors named those instead.
    exe = client.compile(ADD_DYNAMIC)
    names = [s.name for s in exe.input_signature]
    assert [s.name for s in exe.specialize(*[np.ones(7, np.float32)] * 2).input_signature] == names
    with pytest.raises(TypeError, match=f"Argument '{names[0]}' compiled with float32"):
        exe.execute(np.ones(7, np.int32), np.ones(7, np.int32))  # the specialization's check
    with pytest.raises(TypeError, match=rf"argument 0 \({names[0]}\): the program takes float32"):
        exe.execute(np.ones(3, np.int32), np.ones(3, np.int32))  # refused before compiling


def test_a_wrong_dtype_compiles_nothing(client: pjrt_py.Client) -> None:
    # A wrong dtype was found by the specialization compiled for it: each
    # wrong call compiled a program, and kept it.
    exe = client.compile(ADD_DYNAMIC)
    for n in (3, 4, 5):
        with pytest.raises(TypeError, match="the program takes float32, got int32"):
            exe.execute(np.ones(n, np.int32), np.ones(n, np.float32))
        with pytest.raises(TypeError, match="the program takes float32, got int32"):
            exe.execute(client.buffer(np.ones(n, np.int32)), np.ones(n, np.float32))
    assert exe.specializations == {}


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
    # The text, and the serialized form jax stores (a portable artifact, whose
    # dimensions are numbers in the bytecode: it was compiled as static).
    for program in (exported.mlir_module(), exported.mlir_module_serialized):
        exe = client.compile(program)
        for n in (2, 5):
            x = np.linspace(-1, 1, n, dtype=np.float32)
            y = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
            got = exe.execute(x, y).to_numpy()
            np.testing.assert_allclose(got, np.asarray(f(x, y)), rtol=1e-6)
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


# jax's older calling convention, as in StableHLO's testdata/dynamic: the
# dimension's value is a leading scalar argument, and shapes are built from it.
# The file's own header comments stay (they are the corpus files' RUN lines).
ARGMAX_DIM_ARG = """// RUN: stablehlo-opt %s
// a test header, as the corpus files have
module @jit_fun {
  func.func public @main(%arg0: tensor<i64>, %arg1: tensor<?x4xf32> {mhlo.sharding = ""})
      -> tensor<?xi32> {
    %0 = stablehlo.convert %arg0 : (tensor<i64>) -> tensor<i32>
    %1 = stablehlo.reshape %0 : (tensor<i32>) -> tensor<1xi32>
    %2 = stablehlo.constant dense<4> : tensor<1xi32>
    %3 = stablehlo.concatenate %1, %2, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %4 = stablehlo.dynamic_iota %3, dim = 1 : (tensor<2xi32>) -> tensor<?x4xi32>
    %5 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %6 = stablehlo.constant dense<0> : tensor<i32>
    %7:2 = stablehlo.reduce(%arg1 init: %5), (%4 init: %6) across dimensions = [1]
        : (tensor<?x4xf32>, tensor<?x4xi32>, tensor<f32>, tensor<i32>)
        -> (tensor<?xf32>, tensor<?xi32>)
     reducer(%a: tensor<f32>, %b: tensor<f32>) (%i: tensor<i32>, %j: tensor<i32>) {
      %8 = stablehlo.compare GT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %9 = stablehlo.select %8, %a, %b : tensor<i1>, tensor<f32>
      %10 = stablehlo.select %8, %i, %j : tensor<i1>, tensor<i32>
      stablehlo.return %9, %10 : tensor<f32>, tensor<i32>
    }
    return %7#1 : tensor<?xi32>
  }
}
"""

# The last row: refinement alone leaves real_dynamic_slice's bounds runtime
# values (its result type is static), which no XLA plugin compiles.
LAST_ROW_DIM_ARG = """
func.func public @main(%arg0: tensor<i64>, %arg1: tensor<?x4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.constant dense<-1> : tensor<i64>
  %1 = stablehlo.add %0, %arg0 : tensor<i64>
  %2 = stablehlo.convert %1 : (tensor<i64>) -> tensor<i32>
  %3 = stablehlo.reshape %2 : (tensor<i32>) -> tensor<1xi32>
  %4 = stablehlo.constant dense<0> : tensor<1xi32>
  %5 = stablehlo.concatenate %3, %4, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
  %6 = stablehlo.convert %arg0 : (tensor<i64>) -> tensor<i32>
  %7 = stablehlo.reshape %6 : (tensor<i32>) -> tensor<1xi32>
  %8 = stablehlo.constant dense<4> : tensor<1xi32>
  %9 = stablehlo.concatenate %7, %8, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
  %10 = stablehlo.constant dense<1> : tensor<2xi32>
  %11 = stablehlo.real_dynamic_slice %arg1, %5, %9, %10
      : (tensor<?x4xf32>, tensor<2xi32>, tensor<2xi32>, tensor<2xi32>) -> tensor<1x4xf32>
  %12 = stablehlo.reshape %11 : (tensor<1x4xf32>) -> tensor<4xf32>
  return %12 : tensor<4xf32>
}
"""


def test_dimension_arguments_specialize_with_their_values(client: pjrt_py.Client) -> None:
    exe = client.compile(ARGMAX_DIM_ARG)
    rng = np.random.default_rng(0)
    for n in (3, 5, 3):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        got = exe.execute(np.int64(n), x).to_numpy()
        np.testing.assert_array_equal(got, x.argmax(axis=1))
    assert sorted(exe.specializations) == [(3, (3, 4)), (5, (5, 4))]
    x = client.buffer(np.eye(2, 4, 1, dtype=np.float32))  # a Buffer's value is read too
    np.testing.assert_array_equal(exe.execute(client.buffer(np.int64(2)), x).to_numpy(), [1, 2])


def test_a_dimension_value_the_shapes_disagree_with_is_refused(client: pjrt_py.Client) -> None:
    exe = client.compile(ARGMAX_DIM_ARG)
    with pytest.raises(ValueError, match=r"dimension values \{0: 4\}"):
        exe.execute(np.int64(4), np.ones((3, 4), np.float32))
    with pytest.raises(TypeError, match="a scalar integer"):
        exe.execute(np.float32(3), np.ones((3, 4), np.float32))


def test_ops_that_need_constant_bounds_get_the_dimension_values(client: pjrt_py.Client) -> None:
    exe = client.compile(LAST_ROW_DIM_ARG)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(exe.execute(np.int64(3), x).to_numpy(), x[-1])
    assert list(exe.specializations) == [(3, (3, 4))]


def test_specialization_keeps_parameter_attributes(client: pjrt_py.Client) -> None:
    donating = """
    func.func @main(%x: tensor<?xf32> {tf.aliasing_output = 0 : i32}) -> tensor<?xf32> {
      %0 = stablehlo.add %x, %x : tensor<?xf32>
      return %0 : tensor<?xf32>
    }"""
    exe = client.compile(donating)
    x = client.buffer(np.ones(6, np.float32))
    np.testing.assert_array_equal(exe.execute(x).to_numpy(), np.full(6, 2, np.float32))
    assert exe.specializations[((6,),)]._donated == (0,)
    assert x.is_deleted  # the program asked for its argument's memory
