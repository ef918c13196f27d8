"""Damaged MLIR bytecode reaches no reader that can take the process down.

pjrt_py reads bytecode programs with jaxlib's MLIR bindings (checks,
signature, replica counts, dynamic dimensions). Found by flipping bytes of
portable artifacts and jax's bytecode (5,000 cases): a parse failure whose
diagnostic is not UTF-8 aborted the process inside those bindings, and
some damage makes MLIR's reader loop forever or segfault, jaxlib's and the
plugins' alike. The first is refused before reading
(``mlir_bytecode.text_is_utf8``); for the others, bytecode is now read in
the compile helper process, and the text it gives is what is compiled.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ADD_F32_8, run_python
from hypothesis import given, settings
from hypothesis import strategies as st

import pjrt_py
from pjrt_py.programs import compile_process, isolate
from pjrt_py.programs.mlir_bytecode import text_is_utf8
from pjrt_py.programs.mlir_text import bytecode_to_text

stablehlo = pytest.importorskip("jaxlib.mlir.dialects.stablehlo")
ARTIFACT_VERSION = "1.16.1"  # the version the damaged bytes below were found with


def artifact(text: str = ADD_F32_8) -> bytes:
    return bytes(stablehlo.serialize_portable_artifact_str(text, ARTIFACT_VERSION))


def damaged(*flips: tuple[int, int]) -> bytes:
    code = bytearray(artifact())
    for offset, value in flips:
        code[offset] = value
    return bytes(code)


# Found by the fuzzing: the producer made "Stab\xd5eHLO_v1.16.1", and an
# attribute's offset past its section, so the parse fails and the failure's
# note quotes the producer. jaxlib aborted the process on it.
BAD_PRODUCER = ((9, 0xD5), (51, 0x97), (218, 0x33))


def jax_bytecode(module: str | None = None) -> bytes:
    from jax._src.interpreters import mlir  # noqa: PLC0415
    from jaxlib.mlir import ir  # noqa: PLC0415

    if module is None:
        lowered = jax.jit(lambda x, y: jnp.sin(x) @ y).lower(jnp.ones((2, 3)), jnp.ones((3, 3)))
        return bytes(mlir.module_to_bytecode(lowered.compiler_ir("stablehlo")))
    with mlir.make_ir_context() as context:
        context.allow_unregistered_dialects = True
        return bytes(mlir.module_to_bytecode(ir.Module.parse(module)))


# A constant kept as a resource blob (an aligned section), and attributes
# and types of an unknown dialect, which bytecode keeps as assembly text.
RESOURCE = """
module {
  func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
    %c = stablehlo.constant dense_resource<blob1> : tensor<2xf32>
    %0 = stablehlo.add %x, %c : tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
{-#
  dialect_resources: { builtin: { blob1: "0x040000000000803F00000040" } }
#-}
"""
ASSEMBLY = (
    'module attributes {x.y = #foo.bar<"h\u00e9">} { "foo.op"() {a = !foo.ty<3>} : () -> () }'
)


@pytest.mark.parametrize("kind", ["artifact", "jax", "resource", "assembly"])
def test_well_formed_bytecode_is_read(kind: str) -> None:
    code = {
        "artifact": artifact,
        "jax": jax_bytecode,
        "resource": lambda: jax_bytecode(RESOURCE),
        "assembly": lambda: jax_bytecode(ASSEMBLY),
    }[kind]()
    assert text_is_utf8(code)
    assert kind == "assembly" or "@main(" in (bytecode_to_text(code) or "")


def test_text_that_is_not_utf8_is_refused_before_reading() -> None:
    code = artifact()
    strings = code.index(b"main\0")
    cases = {
        "producer": damaged(*BAD_PRODUCER),
        "string section": damaged((strings + 1, 0xFF)),
        "assembly entry": jax_bytecode(ASSEMBLY).replace("\u00e9".encode(), b"\xe9\xff"),
    }
    for name, bad in cases.items():
        assert not text_is_utf8(bad), name
        assert bytecode_to_text(bad) is None, name
    for cut in (5, 20, len(code) // 2, len(code) - 1):  # truncated: sections run past the end
        assert not text_is_utf8(code[:cut]), cut
    assert not text_is_utf8(ADD_F32_8.encode()) and not text_is_utf8(b"")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_the_walk_never_raises(flips: list[tuple[int, int]]) -> None:
    code = bytearray(artifact())
    for offset, value in flips:
        code[offset % len(code)] = value
    assert text_is_utf8(bytes(code)) in (True, False)


def test_compiling_bytecode_with_a_damaged_producer_is_an_error_not_an_abort() -> None:
    # Before: jaxlib's reader aborted the process ("conversion error!").
    result = run_python(
        f"""
        import pjrt_py
        from pjrt_py.runtime.errors import PjrtError
        try:
            pjrt_py.Client().compile({damaged(*BAD_PRODUCER)!r})
        except PjrtError as e:
            print("refused:", type(e).__name__)
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout


def test_an_isolated_compile_reads_bytecode_in_the_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The test hook kills the helper when a request holds the marker: here a
    # string of a bytecode program, so the read itself is what dies.
    marker = compile_process.TEST_CRASH_MARKER.decode()
    code = artifact(f'module attributes {{test.m = "{marker}"}} {{\n{ADD_F32_8}\n}}')
    assert marker.encode() in code
    monkeypatch.setenv(compile_process.ENV_TEST_CRASH, "segv")
    client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
    try:
        with pytest.raises(pjrt_py.CompilerCrashError, match="while reading a bytecode program"):
            client.compile(code)
        monkeypatch.delenv(compile_process.ENV_TEST_CRASH)
        x = np.arange(8, dtype=np.float32)
        exe = client.compile(artifact())  # a new helper reads and compiles it
        np.testing.assert_array_equal(exe.execute(x, x).to_numpy(), x + x)
    finally:
        client.close()


def in_process_read_dies(flips: tuple[tuple[int, int], ...]) -> str | None:
    """How jaxlib's reader, run here on the damaged artifact, fails: "hangs",
    "crashes", or None where this jaxlib reads or refuses it cleanly."""
    probe = f"""
        from pjrt_py.programs.mlir_text import bytecode_to_text
        print("read:", bytecode_to_text({damaged(*flips)!r}) is not None)
        """
    try:
        read = run_python(probe, timeout=10)
    except AssertionError:  # it ran past its time
        return "hangs"
    return "crashes" if read.returncode < 0 else None


SEGV = ((110, 95),)  # one flipped byte: jaxlib 0.10's reader and all three plugins segfault


def test_bytecode_that_crashes_mlirs_reader_is_an_error_in_a_default_compile() -> None:
    if in_process_read_dies(SEGV) != "crashes":
        pytest.skip("this jaxlib reads the damaged artifact without crashing")
    result = run_python(
        f"""
        import numpy as np
        import pjrt_py
        client = pjrt_py.Client()  # no isolate: the compile default
        try:
            client.compile({damaged(*SEGV)!r})
        except pjrt_py.CompilerCrashError as e:
            print("refused:", str(e)[:160])
        x = np.arange(8, dtype=np.float32)
        print(client.compile({artifact()!r}).execute(x, x).to_numpy().tolist())
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "while reading a bytecode program" in result.stdout, result.stdout
    assert str([2.0 * i for i in range(8)]) in result.stdout


def test_bytecode_jax_will_not_read_is_compiled_out_of_process() -> None:
    # A string that is not UTF-8 keeps it from jax's reader; the plugin takes
    # it, in the helper, and the result runs here.
    code = jax_bytecode(f'module attributes {{test.s = "h\u00e9"}} {{\n{ADD_F32_8}\n}}')
    code = code.replace("h\u00e9".encode(), b"h\xe9\xff")
    assert not text_is_utf8(code)
    fresh = pjrt_py.Client(cache_dir=False)
    try:
        assert fresh.compile_helper.pid is None
        x = np.arange(8, dtype=np.float32)
        np.testing.assert_array_equal(fresh.compile(code).execute(x, x).to_numpy(), x + x)
        assert fresh.compile_helper.pid is not None
    finally:
        fresh.close()


HANGS = ((102, 26),)  # one flipped byte sends jaxlib 0.10's reader into a loop


def test_bytecode_that_hangs_the_reader_is_bounded_by_the_compile_timeout() -> None:
    if in_process_read_dies(HANGS) != "hangs":
        pytest.skip("this jaxlib reads the damaged artifact without hanging")
    result = run_python(
        f"""
        import os, time
        os.environ[{isolate.ENV_TIMEOUT!r}] = "5"
        import pjrt_py
        started = time.monotonic()
        try:
            pjrt_py.Client().compile({damaged(*HANGS)!r})
        except pjrt_py.DeadlineExceededError as e:
            print("bounded after %.0f s:" % (time.monotonic() - started), str(e)[:120])
        """,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert "while reading a bytecode program" in result.stdout, result.stdout
