"""Compiling StableHLO text and bytecode."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ADD_F32_8, run_python

import pjrt_py


def test_text_program_compiles_with_metadata(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_F32_8)
    assert exe.name == "main"
    assert exe.num_outputs == 1
    assert exe.num_args == 2
    assert exe.devices == [client.default_device]
    assert exe.output_shapes == [(8,)]
    assert exe.output_dtypes == [np.dtype(np.float32)]


def test_bytecode_program_compiles() -> None:
    jax = pytest.importorskip("jax")
    from jax._src.interpreters import mlir

    client = pjrt_py.Client()
    lowered = jax.jit(lambda x: x * 2 + 1).lower(np.zeros(3, np.float32))
    bytecode = mlir.module_to_bytecode(lowered.compiler_ir("stablehlo"))
    assert isinstance(bytecode, bytes)
    exe = client.compile(bytecode)
    # Bytecode has no readable text: the signature comes from the compiled
    # module, with parameters named by position.
    assert exe.num_args == 1
    (spec,) = exe.input_signature
    assert (spec.name, spec.shape, spec.dtype) == ("", (3,), np.float32)
    out = exe.execute(np.arange(3, dtype=np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.arange(3, dtype=np.float32) * 2 + 1)
    with pytest.raises(
        TypeError, match=r"Argument 0 compiled with float32\[3\] and called with float32\[4\]"
    ):
        exe.execute(np.zeros(4, np.float32))


def test_invalid_program_raises_with_the_compiler_message(client: pjrt_py.Client) -> None:
    bad = ADD_F32_8.replace("stablehlo.add", "stablehlo.not_an_op")
    with pytest.raises(pjrt_py.PjrtError) as info:
        client.compile(bad)
    err = info.value
    assert "not_an_op" in str(err) and "not_an_op" in err.message
    # The code travels as data, and the class matches it (this plugin says UNKNOWN).
    assert type(err).code == err.code != 0
    assert isinstance(err, RuntimeError)


@pytest.mark.parametrize(
    ("program", "exc"), [("", ValueError), (b"", ValueError), (42, TypeError), (None, TypeError)]
)
def test_bad_program_arguments(client: pjrt_py.Client, program: object, exc: type) -> None:
    with pytest.raises(exc):
        client.compile(program)  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [b"", "", 1])
def test_empty_or_bad_compile_options_are_refused_in_python(
    client: pjrt_py.Client, options: object
) -> None:
    # Empty options abort the CPU plugin (CHECK failure): never sent.
    with pytest.raises(ValueError, match="compile_options"):
        client.compile(ADD_F32_8, compile_options=options)  # type: ignore[arg-type]


def test_explicit_compile_options_bytes_are_used(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_F32_8, compile_options=pjrt_py.encode_compile_options())
    assert exe.num_outputs == 1


def test_zero_replicas_never_reach_the_plugin() -> None:
    # In a subprocess: if the check were missing the plugin would abort.
    result = run_python(
        f"""
        import pjrt_py
        c = pjrt_py.Client()
        try:
            c.compile({ADD_F32_8!r}, num_replicas=0)
        except ValueError as e:
            print("REFUSED", e)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "REFUSED" in result.stdout


def test_jax_lowered_program_matches_jax() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def f(x, w):  # type: ignore[no-untyped-def]
        return jax.nn.softmax(jnp.tanh(x @ w), axis=-1).sum(axis=0)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    w = rng.standard_normal((7, 3)).astype(np.float32)
    text = jax.jit(f).lower(x, w).as_text()
    exe = pjrt_py.Client().compile(text)
    assert exe.num_args == 2
    ours = exe.execute(x, w).to_numpy()
    np.testing.assert_allclose(ours, np.asarray(jax.jit(f)(x, w)), rtol=1e-5, atol=1e-6)
