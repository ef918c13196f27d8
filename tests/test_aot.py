"""Compiled programs: what they report, how calls are checked, serialization."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import (
    ADD_F32_8,
    NEEDS_NEWER_PLUGIN,
    needs_build,
    newer_plugin,
    other_build,
    run_python,
)

import pjrt_py

MIXED = """
func.func @main(%scale: tensor<f32>, %v: tensor<2x3xf32>, %n: tensor<3xi32>)
    -> (tensor<2x3xf32>, tensor<3xi32>) {
  %b = stablehlo.broadcast_in_dim %scale, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
  %0 = stablehlo.multiply %v, %b : tensor<2x3xf32>
  %1 = stablehlo.add %n, %n : tensor<3xi32>
  return %0, %1 : tensor<2x3xf32>, tensor<3xi32>
}
"""

# jax-style names for the parameters.
NAMED = """
func.func public @main(%arg0: tensor<i32> {jax.arg_info = "x"}, %arg1: tensor<4xf32> {jax.arg_info = "params['w']"}) -> tensor<4xf32> {
  %0 = stablehlo.convert %arg0 : (tensor<i32>) -> tensor<f32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %2 = stablehlo.add %1, %arg1 : tensor<4xf32>
  return %2 : tensor<4xf32>
}
"""  # noqa: E501


# -- inspection ---------------------------------------------------------------
def test_executable_reports_its_compiled_form(client: pjrt_py.Client) -> None:
    exe = client.compile(MIXED, cache=False)
    assert exe.num_outputs == 2
    assert exe.num_replicas == 1 and exe.num_partitions == 1
    assert exe.devices == [client.default_device]
    assert exe.output_shapes == [(2, 3), (3,)]
    assert exe.output_dtypes == [np.float32, np.int32]
    assert [(s.name, s.shape, s.dtype) for s in exe.input_signature] == [
        ("scale", (), np.float32),
        ("v", (2, 3), np.float32),
        ("n", (3,), np.int32),
    ]
    assert str(exe.input_signature[1]) == "float32[2,3]"


def test_fingerprint_identifies_the_program(client: pjrt_py.Client) -> None:
    a = client.compile(ADD_F32_8, cache=False).fingerprint
    b = client.compile(ADD_F32_8, cache=False).fingerprint
    c = client.compile(MIXED, cache=False).fingerprint
    assert a and a == b != c


def test_as_text_is_the_optimized_hlo(client: pjrt_py.Client) -> None:
    exe = client.compile(MIXED, cache=False)
    fmt, data = exe.optimized_program()
    assert fmt in ("hlo", "hlo_with_config") and len(data) > 100
    text = exe.as_text()
    assert text.startswith("HloModule")
    assert "ENTRY" in text and "multiply" in text
    assert "f32[2,3]" in text and "s32[3]" in text


@needs_build("xla-cpu-pjrt")
def test_cost_and_memory_analysis() -> None:
    # The 0.81 build answers cost analysis; the newer ones say UNIMPLEMENTED.
    client = pjrt_py.Client("xla-cpu-pjrt")
    exe = client.compile(ADD_F32_8, cache=False)
    cost = exe.cost_analysis()
    assert cost is not None and cost["flops"] == 8.0  # eight adds
    memory = exe.memory_analysis()
    assert memory is not None
    assert memory.argument_size_in_bytes == 2 * 8 * 4
    assert memory.output_size_in_bytes == 8 * 4


@NEEDS_NEWER_PLUGIN
def test_a_plugin_without_cost_analysis_answers_none() -> None:
    # The 0.115 plugin implements every slot, but its GetCostAnalysis says
    # UNIMPLEMENTED: the answer is None, not an exception or a crash.
    result = run_python(
        f"""
        import pjrt_py
        c = pjrt_py.Client({newer_plugin()!r})
        exe = c.compile({ADD_F32_8!r})
        assert exe.cost_analysis() is None
        assert exe.memory_analysis().argument_size_in_bytes == 64
        assert exe.fingerprint
        print("OK")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_queries_on_a_deleted_executable_raise(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_F32_8, cache=False)
    exe.delete()
    for query in (exe.as_text, exe.cost_analysis, exe.memory_analysis, exe.serialize):
        with pytest.raises(ValueError, match="deleted"):
            query()


# -- argument checks ------------------------------------------------------------
def test_wrong_shape_names_the_argument_and_both_types(client: pjrt_py.Client) -> None:
    exe = client.compile(NAMED)
    with pytest.raises(TypeError) as info:
        exe.execute(np.zeros(3, np.int32), np.zeros(4, np.float32))
    assert "Argument 'x' compiled with int32[] and called with int32[3]" in str(info.value)


def test_every_mismatch_is_listed(client: pjrt_py.Client) -> None:
    exe = client.compile(NAMED)
    with pytest.raises(TypeError) as info:
        exe.execute(np.zeros(3, np.int32), np.zeros(4, np.float64))
    text = str(info.value)
    assert "Argument 'x' compiled with int32[] and called with int32[3]" in text
    assert "Argument \"params['w']\" compiled with float32[4] and called with float64[4]" in text


def test_same_sized_dtype_is_caught_before_the_plugin(client: pjrt_py.Client) -> None:
    # int32 and float32 have the same size: the plugin would reinterpret the
    # bits and return garbage without an error. The check stops it.
    exe = client.compile(ADD_F32_8)
    ints = client.buffer(np.arange(8, dtype=np.int32))
    floats = client.buffer(np.ones(8, np.float32))
    with pytest.raises(
        TypeError, match=r"Argument 'x' compiled with float32\[8\] and called with int32\[8\]"
    ):  # noqa: E501
        exe.execute(ints, floats)
    with pytest.raises(TypeError, match="Argument 'y'"):
        exe.execute_async(floats, ints)
    with pytest.raises(TypeError, match="Argument 'y'"):  # through a promise, too
        exe.execute_async(floats, client.buffer_async(np.zeros(8, ml_dtypes.bfloat16)[:8]))


def test_wrong_count_names_both_counts(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_F32_8)
    x = client.buffer(np.ones(8, np.float32))
    with pytest.raises(TypeError, match=r"takes 2 argument\(s\), 1 given"):
        exe.execute_async(x)
    with pytest.raises(TypeError, match=r"takes 2 argument\(s\), 3 given"):
        exe.execute_async(x, x, x)


def test_python_scalars_take_the_parameter_dtype(client: pjrt_py.Client) -> None:
    exe = client.compile(NAMED)
    out = exe.execute(3, np.ones(4, np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.full(4, 4, np.float32))
    with pytest.raises(TypeError, match="Argument 'x' compiled with int32"):
        exe.execute(np.int64(3), np.ones(4, np.float32))  # numpy scalars are exact


SCALARS = """
func.func @main(%i: tensor<i32>, %u: tensor<ui8>, %b: tensor<i1>, %f: tensor<bf16>,
                %c: tensor<complex<f32>>) -> (tensor<i32>, tensor<ui8>, tensor<i1>, tensor<bf16>,
                                              tensor<complex<f32>>) {
  return %i, %u, %b, %f, %c : tensor<i32>, tensor<ui8>, tensor<i1>, tensor<bf16>,
                              tensor<complex<f32>>
}
"""


def test_python_scalars_follow_jaxs_weak_type_rules(client: pjrt_py.Client) -> None:
    exe = client.compile(SCALARS)
    out = [b.to_numpy() for b in exe.execute(-7, 255, True, 2, 3)]
    assert [o.item() for o in out] == [-7, 255, True, 2.0, 3 + 0j]
    out = [b.to_numpy() for b in exe.execute(1, 2, False, 0.5, 1.5)]
    assert out[3].item() == 0.5 and out[4].item() == 1.5 + 0j
    # A float never becomes an int or a bool, a complex never a float, a bool
    # never a number, and an int never wraps: each is refused, not converted.
    good = [1, 2, True, 0.5, 1j]
    for index, bad, error in [
        (0, 2.5, TypeError),
        (2, 0.5, TypeError),
        (2, 1, TypeError),
        (0, True, TypeError),
        (3, 1j, TypeError),
        (1, 300, ValueError),
        (1, -1, ValueError),
        (0, 1 << 31, ValueError),
        # an int that would be inf: in bf16, in complex64, past float64 itself
        (3, 1 << 200, ValueError),
        (4, 1 << 200, ValueError),
        (4, 1 << 2000, ValueError),
    ]:
        args = list(good)
        args[index] = bad
        with pytest.raises(error, match=f"argument {index}"):
            exe.execute(*args)


def test_numpy_scalars_must_match_exactly_though_some_subclass_pythons(
    client: pjrt_py.Client,
) -> None:
    # np.float64 and np.complex128 are Python floats and complexes too; they
    # used to take the weak path and were narrowed (70000.0 into f16 was inf).
    exe = client.compile(SCALARS)
    good: list[object] = [np.int32(1), np.uint8(2), np.bool_(True), 0.5, np.complex64(1j)]
    assert exe.execute(*good)[4].to_numpy().item() == 1j
    for index, bad in [
        (3, np.float64(70000.0)),
        (4, np.complex128(1e-50 + 1j)),
        (0, np.int64(5)),
        (0, np.float64(2.0)),
    ]:
        args = list(good)
        args[index] = bad
        with pytest.raises(TypeError, match=f"called with {np.dtype(type(bad)).name}"):
            exe.execute(*args)


def test_outputs_chain_into_a_checked_call_without_asking_the_plugin(
    client: pjrt_py.Client,
) -> None:
    exe = client.compile(ADD_F32_8)
    x = client.buffer(np.ones(8, np.float32))
    out = exe.execute_async(x, x).buffer()
    # The output's metadata came from the compiled signature, so the next
    # call's check is one comparison.
    assert out._meta == ((8,), np.float32)
    np.testing.assert_array_equal(exe.execute(out, out).to_numpy(), np.full(8, 4, np.float32))


# -- serialization --------------------------------------------------------------
def test_serialize_round_trip_runs_and_keeps_the_signature(client: pjrt_py.Client) -> None:
    exe = client.compile(NAMED, cache=False)
    data = exe.serialize()
    assert isinstance(data, bytes) and data.startswith(b"PJRTPYEX")
    loaded = client.deserialize(data)
    assert loaded.fingerprint == exe.fingerprint
    assert [s.name for s in loaded.input_signature] == ["x", "params['w']"]
    out = loaded.execute(np.int32(2), np.arange(4, dtype=np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) + 2)
    with pytest.raises(TypeError, match="Argument 'x'"):
        loaded.execute(np.zeros(2, np.int32), np.zeros(4, np.float32))


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "flipped", "header", "empty"],
)
def test_wrong_bytes_raise_a_clear_error(client: pjrt_py.Client, damage: str) -> None:
    data = bytearray(client.compile(ADD_F32_8).serialize())
    if damage == "garbage":
        data = bytearray(b"\x0a\x05hello" * 100)
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[-10] ^= 0xFF
    elif damage == "header":
        data[20] = ord("}")
    else:
        data = bytearray()
    with pytest.raises(pjrt_py.SerializationError):
        client.deserialize(bytes(data))


def test_deserialize_rejects_non_bytes(client: pjrt_py.Client) -> None:
    with pytest.raises(TypeError):
        client.deserialize("not bytes")  # type: ignore[arg-type]


@pytest.mark.needs_cpu_device_count  # a second client with another device count
def test_an_executable_from_another_device_set_is_refused(client: pjrt_py.Client) -> None:
    data = client.compile(ADD_F32_8).serialize()
    two = pjrt_py.Client(options={"cpu_device_count": 2})
    with pytest.raises(pjrt_py.SerializationError, match="devices"):
        two.deserialize(data)


@NEEDS_NEWER_PLUGIN
def test_an_executable_from_another_xla_is_refused_before_the_plugin(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Made by one plugin build, offered to another: the envelope says who
    # made it, and pjrt_py refuses without handing the bytes over.
    path = tmp_path / "add.bin"
    path.write_bytes(pjrt_py.Client().compile(ADD_F32_8).serialize())
    result = run_python(
        f"""
        import pjrt_py
        c = pjrt_py.Client({other_build()!r})
        try:
            c.deserialize(open({str(path)!r}, "rb").read())
        except pjrt_py.SerializationError as e:
            assert "pjrt_api" in str(e), e
            print("REFUSED")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "REFUSED" in result.stdout
