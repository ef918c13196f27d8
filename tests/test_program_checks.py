"""Program text checked before a plugin sees it, and read by a lexer, not a regex.

Recursion, very deep nesting and int64-overflowing types crash the CPU
plugins (SIGSEGV or abort) instead of failing; ``check_program`` turns each
into a ValueError. Comments and strings must fool none of the readers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_python

import pjrt_py
from pjrt_py.programs import mlir_text
from pjrt_py.programs.mlir_checks import MAX_DEPTH, check_program
from pjrt_py.programs.mlir_text import (
    bytecode_to_text,
    is_bytecode,
    is_portable_artifact,
    main_signature,
    module_attribute_int,
)

RECURSIVE = """
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = call @main(%x) : (tensor<3xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}
"""

MUTUAL = """
module @m attributes {mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = func.call @f(%x) : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
  func.func private @f(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "func.call"(%x) {callee = @main} : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"""

OVERFLOW = """
func.func @main(%x: tensor<4294967296x4294967296x2xf32>) -> tensor<4294967296x4294967296x2xf32> {
  return %x : tensor<4294967296x4294967296x2xf32>
}
"""

# Everything a regex could mistake for code, in comments and strings.
DECOYS = """
// module attributes {mhlo.num_replicas = 4 : i32} {
// func.func @main(%a: tensor<2xi8>) -> tensor<2xi8> {
module @decoy attributes {mhlo.num_partitions = 1 : i32, "mhlo.frontend" = "// ((("} {
  // %0 = call @main(%a) : (tensor<2xi8>) -> tensor<2xi8>   [[[ {{{ <<<
  func.func private @helper(%x: tensor<3xf32>) -> tensor<3xf32> attributes {mhlo.num_replicas = 8} {
    %0 = stablehlo.custom_call @main(%x) {backend_config = "call @main(\\"{[(<"}
      : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
  func.func public @main(%x: tensor<3xf32> {jax.arg_info = "x \\22y\\22"},
                         %y: tensor<3xf32>) -> tensor<3xf32> {
    %0 = func.call @helper(%x) : (tensor<3xf32>) -> tensor<3xf32>  // call @main
    %1 = stablehlo.add %0, %y : tensor<3xf32> loc("func.func @main(")
    return %1 : tensor<3xf32>
  }
}
"""


def nested_calls_and_loops(x: jax.Array, y: jax.Array) -> jax.Array:
    def body(c: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        inner = jax.lax.fori_loop(0, 3, lambda i, v: jnp.sin(v) + i, c[1])
        return c[0] + 1, jax.jit(lambda a: a * 2)(inner)

    z = jax.lax.while_loop(lambda c: c[0] < 4, body, (0, x))[1]
    return jax.jit(lambda a, b: jax.jit(jnp.cos)(a) + b)(z, y)


@pytest.fixture(scope="module")
def jax_text() -> str:
    x = jnp.ones((2, 3), jnp.float32)
    return str(jax.jit(nested_calls_and_loops).lower(x, x).as_text(debug_info=True))


def test_jax_program_with_calls_and_loops_passes(jax_text: str, client: pjrt_py.Client) -> None:
    assert "call @" in jax_text and "stablehlo.while" in jax_text
    check_program(jax_text)
    spec = main_signature(jax_text)
    assert (
        spec is not None
        and [(s.shape, s.dtype) for s in spec] == [((2, 3), np.dtype(np.float32))] * 2
    )
    exe = client.compile(jax_text)
    out = exe.execute(np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32))
    want = nested_calls_and_loops(jnp.ones((2, 3)), jnp.zeros((2, 3)))
    np.testing.assert_allclose(out.to_numpy(), np.asarray(want), rtol=1e-6)


def test_direct_recursion_is_named() -> None:
    with pytest.raises(ValueError, match=r"@main -> @main \(the call at line 3\)"):
        check_program(RECURSIVE)


def test_mutual_recursion_through_generic_call_is_named() -> None:
    with pytest.raises(ValueError, match=r"@main -> @f -> @main \(the call at line 8\)"):
        check_program(MUTUAL)


def test_recursion_among_private_functions_and_quoted_names() -> None:
    text = """
    func.func @main(%x: tensor<f32>) -> tensor<f32> { return %x : tensor<f32> }
    func.func private @"a b"(%x: tensor<f32>) -> tensor<f32> {
      %0 = call @g(%x) : (tensor<f32>) -> tensor<f32>
      return %0 : tensor<f32>
    }
    func.func private @g(%x: tensor<f32>) -> tensor<f32> {
      %0 = call @"a b"(%x) : (tensor<f32>) -> tensor<f32>
      return %0 : tensor<f32>
    }
    """
    with pytest.raises(ValueError, match=r'@"a b" -> @g -> @"a b"'):
        check_program(text)


def test_calls_without_a_cycle_pass() -> None:
    chain = "\n".join(
        f"func.func private @f{i}(%x: tensor<f32>) -> tensor<f32> {{\n"
        f"  %0 = call @f{i + 1}(%x) : (tensor<f32>) -> tensor<f32>\n"
        f"  return %0 : tensor<f32>\n}}"
        for i in range(5000)  # deeper than Python's recursion limit: the search iterates
    )
    check_program(chain + "\nfunc.func private @f5000(%x: tensor<f32>) -> tensor<f32>\n")


def test_depth_beyond_the_limit_is_refused_with_its_line() -> None:
    deep = "func.func @main() {\n" + "(" * MAX_DEPTH + "\n" + "[" * 5 + "]" * 5 + ")" * MAX_DEPTH
    with pytest.raises(ValueError, match=rf"more than {MAX_DEPTH} deep \(line 2\)"):
        check_program(deep + "\n}")
    check_program("(" * (MAX_DEPTH - 1) + ")" * (MAX_DEPTH - 1))  # the limit itself is fine


def test_arrows_and_stray_closers_do_not_change_the_depth() -> None:
    check_program("(x) -> (y)\n" * (MAX_DEPTH * 2))
    with pytest.raises(ValueError, match="deep"):
        check_program(")" * 5000 + "<" * (MAX_DEPTH + 1))


@pytest.mark.parametrize(
    ("type_text", "refused"),
    [
        ("tensor<4294967296x4294967296x2xf32>", True),
        ("tensor<4294967296x4294967296xi8>", True),  # 2**64 elements
        ("tensor<99999999999999999999xi8>", True),  # one dimension beyond int64
        ("tensor<2147483648x2147483648xi8>", False),  # 2**62 bytes
        ("tensor<2147483648x2147483648xf32>", True),  # 2**64 bytes
        ("tensor<2147483648x2147483648xi1>", False),
        ("tensor<1073741824x2147483648xcomplex<f64>>", True),  # 2**61 x 16 bytes
        ("tensor<?x4294967296x4294967296x2xf32>", True),  # the static part overflows
        ("memref<4294967296x4294967296x2xf32>", True),
        ("vector<[4294967296]x4294967296x2xf32>", True),
        ("tensor<1x2x3x4x5x6x7x8x9x10xf32>", False),
    ],
)
def test_types_whose_size_overflows_int64_are_refused(type_text: str, refused: bool) -> None:
    text = f"func.func @main(%x: {type_text}) {{\n  return\n}}"
    if refused:
        with pytest.raises(ValueError, match=r"line 1 .*overflows int64"):
            check_program(text)
    else:
        check_program(text)


def test_comments_and_strings_fool_no_reader() -> None:
    check_program(DECOYS)  # no call @main in code, no deep brackets
    spec = main_signature(DECOYS)
    assert spec is not None
    assert [(s.name, s.shape, s.dtype) for s in spec] == [
        ('x "y"', (3,), np.dtype(np.float32)),
        ("y", (3,), np.dtype(np.float32)),
    ]
    assert module_attribute_int(DECOYS, "mhlo.num_replicas") is None  # comment, function
    assert module_attribute_int(DECOYS, "mhlo.num_partitions") == 1
    assert module_attribute_int(DECOYS, "mhlo.frontend") is None  # not an integer
    assert check_program("// " + "(" * 50_000 + '\n"' + "{" * 50_000 + '"') is None


def test_module_attribute_int_reads_the_top_level_module_only() -> None:
    text = """
    #loc = loc("module attributes {mhlo.num_replicas = 9}")
    builtin.module @m attributes {mhlo.num_replicas = 4 : i32, "mhlo.num_partitions" = 2} {
      module @inner attributes {mhlo.num_replicas = 3 : i32} {}
    }
    """
    assert module_attribute_int(text, "mhlo.num_replicas") == 4
    assert module_attribute_int(text, "mhlo.num_partitions") == 2
    assert module_attribute_int("module {\n}", "mhlo.num_replicas") is None
    assert module_attribute_int(RECURSIVE, "mhlo.num_replicas") is None  # no module at all


def test_main_signature_skips_a_nested_modules_main() -> None:
    text = """
    module {
      module @inner { func.func @main(%a: tensor<2xi8>) { return } }
      func.func @main(%b: tensor<?x4xbf16> loc("b"), %t: !stablehlo.token) { return }
    }
    """
    spec = main_signature(text)
    assert spec is not None
    assert [(s.name, s.shape) for s in spec] == [("b", (None, 4)), ("t", None)]
    assert spec[0].dtype == pjrt_py.runtime.dtypes.MLIR_NAMES["bf16"]
    assert main_signature("// func.func @main(%a: tensor<2xi8>)") is None


def test_compile_reads_the_real_main_behind_a_decoy_comment(client: pjrt_py.Client) -> None:
    text = (
        "// func.func @main(%a: tensor<2xi8>) -> tensor<2xi8>\n"
        "func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {\n"
        "  return %x : tensor<3xf32>\n}\n"
    )
    exe = client.compile(text)
    spec = exe.input_signature
    assert spec is not None and [(s.name, s.shape, s.dtype) for s in spec] == [
        ("x", (3,), np.dtype(np.float32))
    ]
    with pytest.raises(TypeError, match=r"Argument 'x' compiled with float32\[3\]"):
        exe.execute(np.zeros(2, np.int8))


def test_bytecode_round_trip_keeps_module_attributes() -> None:
    from jax._src.interpreters import mlir  # noqa: PLC0415
    from jaxlib.mlir import ir  # noqa: PLC0415

    lowered = jax.jit(nested_calls_and_loops).lower(jnp.ones(3), jnp.ones(3))
    code = mlir.module_to_bytecode(lowered.compiler_ir("stablehlo"))
    assert is_bytecode(code) and not is_bytecode(code[1:])
    text = bytecode_to_text(code)
    assert text is not None and main_signature(text) is not None
    check_program(text)
    with mlir.make_ir_context():
        module = ir.Module.parse(MUTUAL.replace("num_replicas = 1", "num_replicas = 4"))
        recursive = mlir.module_to_bytecode(module)
    back = bytecode_to_text(recursive)
    assert back is not None and module_attribute_int(back, "mhlo.num_replicas") == 4
    with pytest.raises(ValueError, match="@main -> @f -> @main"):
        check_program(back)


def test_a_portable_artifact_is_read_as_stablehlo_and_runs(client: pjrt_py.Client) -> None:
    # What jax exports and serialize_portable_artifact writes is bytecode of
    # VHLO ops. Read as plain bytecode it had no func.func @main, so
    # Client.compile refused it as "the program has no func.func @main".
    from jaxlib.mlir.dialects import stablehlo  # noqa: PLC0415

    lowered = jax.jit(nested_calls_and_loops).lower(jnp.ones(3), jnp.ones(3))
    text = lowered.as_text()
    artifact = stablehlo.serialize_portable_artifact_str(text, stablehlo.get_minimum_version())
    assert is_portable_artifact(artifact) and not is_portable_artifact(text.encode())
    read = bytecode_to_text(artifact)
    assert read is not None and "vhlo." not in read
    assert main_signature(read) == main_signature(text)
    x, y = np.arange(3, dtype=np.float32), np.full(3, 0.5, np.float32)
    want = np.asarray(jax.jit(nested_calls_and_loops)(x, y))
    got = client.compile(artifact).execute(x, y).to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # The checks a plugin could crash on now see its functions too.
    recursive = stablehlo.serialize_portable_artifact_str(MUTUAL, stablehlo.get_minimum_version())
    back = bytecode_to_text(recursive)
    assert back is not None
    with pytest.raises(ValueError, match="@main -> @f -> @main"):
        check_program(back)


def test_bytecode_to_text_is_none_for_what_it_cannot_read() -> None:
    assert bytecode_to_text(b"func.func @main() { return }") is None
    assert bytecode_to_text(mlir_text.BYTECODE_MAGIC + b"\x00garbage") is None


# -- through Client.compile, in a subprocess: without the checks these crash ----


@pytest.mark.parametrize(
    "program",
    [
        pytest.param(RECURSIVE, id="recursion"),
        pytest.param(MUTUAL, id="mutual-recursion"),
        pytest.param(
            "func.func @main() attributes {a = " + "[" * 40_000 + "]" * 40_000 + "} {return}",
            id="nesting",
        ),
        pytest.param(OVERFLOW, id="overflow"),
    ],
)
def test_compile_refuses_programs_that_crash_the_plugin(program: str) -> None:
    result = run_python(
        f"""
        import pjrt_py
        try:
            pjrt_py.Client().compile({program!r})
        except ValueError as e:
            print("REFUSED", e)
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "REFUSED" in result.stdout
