"""``Client.compile(exported)``: jax.export's ``Exported`` objects, run as jax runs them.

Before this, an ``Exported`` was refused ("program must be str or bytes"),
and its ``mlir_module_serialized`` compiled but ran wrong or not at all:
an export for several platforms takes the platform's index as a hidden
first argument, and an export for another platform compiled silently.
Each case is compared with jax's own ``Exported.call``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pjrt_py
from pjrt_py.programs.exported import bind_platform_index

jax = pytest.importorskip("jax", reason="the programs are exported by jax")
jnp = jax.numpy
export = jax.export

F32_4 = jax.ShapeDtypeStruct((4,), jnp.float32)
X = np.arange(4, dtype=np.float32)


def per_platform(x: Any) -> Any:
    """A different result on each platform, so the wrong branch shows."""
    return jax.lax.platform_dependent(
        x,
        cpu=lambda v: v + 1.0,
        cuda=lambda v: v + 2.0,
        rocm=lambda v: v + 3.0,
        default=lambda v: v + 4.0,
    )


def test_an_export_compiles_and_gives_jaxs_numbers(client: pjrt_py.Client) -> None:
    fn = jax.jit(lambda x, y: jnp.sin(x) * y + jnp.cumsum(y))
    exported = export.export(fn, platforms=[client.platform_name])(F32_4, F32_4)
    exe = client.compile(exported)
    np.testing.assert_allclose(
        exe.execute(X, X + 1).to_numpy(), np.asarray(exported.call(X, X + 1)), rtol=1e-6
    )
    assert [(s.shape, s.dtype) for s in exe.input_signature] == [((4,), np.float32)] * 2


@pytest.mark.parametrize(
    "others", [("cuda",), ("rocm", "cuda"), ("tpu",)], ids=["cuda", "rocm-cuda", "tpu"]
)
@pytest.mark.parametrize("first", [True, False], ids=["first", "last"])
def test_an_export_for_several_platforms_runs_this_platforms_code(
    client: pjrt_py.Client, others: tuple[str, ...], first: bool
) -> None:
    own = client.platform_name
    others = tuple(p for p in others if p != own) or ("tpu",)
    platforms = (own, *others) if first else (*others, own)
    exported = export.export(jax.jit(per_platform), platforms=platforms)(F32_4)
    exe = client.compile(exported)
    assert len(exe.input_signature) == 1  # the platform index is bound, not an argument
    expected = {"cpu": 1.0, "cuda": 2.0, "rocm": 3.0}.get(own, 4.0)
    np.testing.assert_array_equal(exe.execute(X).to_numpy(), X + expected)
    if own == "cpu":  # jax's CPU backend is here: the same numbers from jax
        np.testing.assert_array_equal(exe.execute(X).to_numpy(), np.asarray(exported.call(X)))


def test_a_shape_polymorphic_export_for_several_platforms(client: pjrt_py.Client) -> None:
    (n,) = export.symbolic_shape("n")
    exported = export.export(
        jax.jit(lambda x: jnp.tanh(x) * 2), platforms=(client.platform_name, "tpu")
    )(jax.ShapeDtypeStruct((n,), jnp.float32))
    exe = client.compile(exported)
    for size in (3, 7):
        v = np.linspace(-2, 2, size, dtype=np.float32)
        np.testing.assert_allclose(exe.execute(v).to_numpy(), np.tanh(v) * 2, rtol=1e-6)


def test_an_export_for_another_platform_is_refused(client: pjrt_py.Client) -> None:
    other = "tpu" if client.platform_name != "tpu" else "cpu"
    exported = export.export(jax.jit(lambda x: x * 2), platforms=[other])(F32_4)
    with pytest.raises(ValueError, match=rf"lowered for \('{other}',\), not for this client"):
        client.compile(exported)


def test_the_platform_index_parameter_must_be_there() -> None:
    plain = "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return %x : tensor<4xf32>\n}"
    with pytest.raises(ValueError, match="platform index"):
        bind_platform_index(plain, 0)
    marked = plain.replace(
        "%x: tensor<4xf32>)",
        '%i: tensor<i32> {jax.global_constant = "_platform_index"}, %x: tensor<4xf32>)',
    )
    bound = bind_platform_index(marked, 2)
    assert "stablehlo.constant dense<2> : tensor<i32>" in bound
    assert "func.func public @main(%x: tensor<4xf32>)" in bound


def test_other_objects_are_still_a_type_error(client: pjrt_py.Client) -> None:
    with pytest.raises(TypeError, match="jax.export.Exported"):
        client.compile(42)  # type: ignore[arg-type]


def test_a_typed_key_is_taken_as_its_data(client: pjrt_py.Client) -> None:
    # exported.call takes jax.random.key(0); execute refused it (TypeError)
    # and took only jax.random.key_data(k).
    jax = pytest.importorskip("jax", reason="jax.export")
    from jax import export  # noqa: PLC0415

    k = jax.random.key(0)
    exported = export.export(jax.jit(lambda k: jax.random.normal(k, (3,))))(k)
    exe = client.compile(exported)
    want = np.asarray(exported.call(k))
    np.testing.assert_array_equal(exe.execute(k).to_numpy(), want)
    np.testing.assert_array_equal(exe.execute(jax.random.key_data(k)).to_numpy(), want)
