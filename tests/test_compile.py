"""Compiling StableHLO text and bytecode."""

from __future__ import annotations

from pathlib import Path

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
    # With jax installed the bytecode is read through its MLIR bindings:
    # the signature has the text's names (jax's %arg0 here).
    assert exe.num_args == 1
    (spec,) = exe.input_signature
    assert (spec.name, spec.shape, spec.dtype) == ("arg0", (3,), np.float32)
    out = exe.execute(np.arange(3, dtype=np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.arange(3, dtype=np.float32) * 2 + 1)
    with pytest.raises(
        TypeError, match=r"Argument 'arg0' compiled with float32\[3\] and called with float32\[4\]"
    ):
        exe.execute(np.zeros(4, np.float32))


def _bytecode(text: str) -> bytes:
    from jax._src.interpreters import mlir
    from jaxlib.mlir import ir

    with mlir.make_ir_context():
        return bytes(mlir.module_to_bytecode(ir.Module.parse(text)))


@pytest.mark.needs_devices(4)
def test_bytecode_program_honours_its_replica_count(client: pjrt_py.Client) -> None:
    pytest.importorskip("jax", reason="jax's MLIR bindings write the bytecode")
    from test_sharded import ALL_REDUCE_4

    exe = client.compile(_bytecode(ALL_REDUCE_4))
    assert exe.num_replicas == 4  # mhlo.num_replicas = 4, read from the bytecode
    shards = [[np.full(3, i, np.float32)] for i in range(4)]
    out = [row[0].to_numpy() for row in exe.execute_sharded(shards)]
    np.testing.assert_array_equal(out, np.full((4, 3), 6, np.float32))


@pytest.mark.needs_devices(4)  # then compiled for its four replicas
def test_bytecode_with_module_counts_is_refused_without_mlir_bindings(tmp_path: Path) -> None:
    pytest.importorskip("jax", reason="jax's MLIR bindings write the bytecode")
    from test_sharded import ALL_REDUCE_4

    data = tmp_path / "psum.mlirbc"
    data.write_bytes(_bytecode(ALL_REDUCE_4))
    result = run_python(
        f"""
        import sys
        sys.modules["jax"] = sys.modules["jaxlib"] = None  # as if jax were not installed
        import pjrt_py
        client = pjrt_py.Client()
        code = open({str(data)!r}, "rb").read()
        try:
            client.compile(code)
        except ValueError as e:
            assert "mhlo.num_replicas" in str(e) and "num_replicas=" in str(e), e
            print("REFUSED")
        exe = client.compile(code, num_replicas=4, num_partitions=1)
        assert exe.num_replicas == 4
        print("OK")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "REFUSED" in result.stdout and "OK" in result.stdout


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


@pytest.mark.parametrize("flag", ["false", "true", 0, 1])
def test_isolate_takes_only_a_bool_or_none(client: pjrt_py.Client, flag: object) -> None:
    # "false" is truthy: taken as it was, it compiled in a helper process.
    with pytest.raises(TypeError, match="isolate must be True, False or None"):
        client.compile(ADD_F32_8, isolate=flag, cache=False)
