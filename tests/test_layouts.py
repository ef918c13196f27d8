"""Buffers in layouts other than row-major: a program's column-major output
(``mhlo.layout_mode``) is read, lent and passed on with its real layout.

PJRT runs a program on the bytes it is given: before pjrt_py checked layouts,
a column-major buffer passed to a program compiled for the default layout was
read as row-major on every CPU build, and xla-cpu-pjrt 0.81's own device-to-host
copy returned the column-major bytes as they lie. These run on each build in
the plugin matrix (.ci/run).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import run_python

import pjrt_py

COLUMN_MAJOR_OUT = """
func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x8xf32> {mhlo.layout_mode = "{0,1}"}) {
  return %x : tensor<4x8xf32>
}
"""
DOUBLE = """
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.add %x, %x : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""
DOUBLE_COLUMN_MAJOR_IN = """
func.func @main(%x: tensor<4x8xf32> {mhlo.layout_mode = "{0,1}"}) -> tensor<4x8xf32> {
  %0 = stablehlo.add %x, %x : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""
X = np.arange(32, dtype=np.float32).reshape(4, 8)


@pytest.fixture(scope="module")
def column_major(client: pjrt_py.Client) -> pjrt_py.Executable:
    return client.compile(COLUMN_MAJOR_OUT)


@pytest.mark.needs_host_buffers  # numpy reads the column-major output in place
def test_a_column_major_output_reads_right(
    client: pjrt_py.Client, column_major: pjrt_py.Executable
) -> None:
    out = column_major.execute(X)
    assert out._layout() == (0, 1)
    np.testing.assert_array_equal(out.to_numpy(), X)
    np.testing.assert_array_equal(out.to_numpy_async().value(), X)
    np.testing.assert_array_equal(np.from_dlpack(out), X)
    assert client.buffer(X)._layout() == (1, 0)


def test_a_column_major_buffer_is_relaid_for_a_row_major_program(
    client: pjrt_py.Client, column_major: pjrt_py.Executable
) -> None:
    double = client.compile(DOUBLE)
    out = column_major.execute(X)
    np.testing.assert_array_equal(double.execute(out).to_numpy(), 2 * X)
    np.testing.assert_array_equal(double.execute_async(out).value().to_numpy(), 2 * X)
    chained = double.execute_async(column_major.execute_async(X))  # a promise, native path
    np.testing.assert_array_equal(chained.value().to_numpy(), 2 * X)
    np.testing.assert_array_equal(out.to_numpy(), X)  # the argument itself is untouched


def test_a_program_asking_for_a_layout_gets_only_that_layout(
    client: pjrt_py.Client, column_major: pjrt_py.Executable
) -> None:
    exe = client.compile(DOUBLE_COLUMN_MAJOR_IN)
    assert exe.input_signature is not None
    assert exe.input_signature[0].layout == "{0,1}"
    np.testing.assert_array_equal(exe.execute(column_major.execute(X)).to_numpy(), 2 * X)
    with pytest.raises(ValueError, match=r"layout \{0,1\}.*buffer is in \{1,0\}"):
        exe.execute(X)
    with pytest.raises(ValueError, match="layout"):
        exe.execute(client.buffer(X))


def test_the_layout_survives_serialization(client: pjrt_py.Client) -> None:
    exe = client.compile(DOUBLE_COLUMN_MAJOR_IN)
    again = client.deserialize(exe.serialize())
    assert again.input_signature is not None
    assert again.input_signature[0].layout == "{0,1}"
    with pytest.raises(ValueError, match="layout"):
        again.execute(X)


def test_layout_modes_are_read_from_the_text() -> None:
    from pjrt_py.programs.mlir_text import main_signature

    spec = main_signature(DOUBLE_COLUMN_MAJOR_IN)[0]  # type: ignore[index]
    assert spec.minor_to_major() == (0, 1)
    plain = main_signature(DOUBLE)[0]  # type: ignore[index]
    assert plain.layout is None and plain.minor_to_major() == (1, 0)
    auto = main_signature(
        DOUBLE.replace("%x: tensor<4x8xf32>)", '%x: tensor<4x8xf32> {mhlo.layout_mode = "auto"})')
    )[0]  # type: ignore[index]
    assert auto.layout == "auto" and auto.minor_to_major() is None


def test_copies_of_a_column_major_buffer_keep_its_values(
    client: pjrt_py.Client, column_major: pjrt_py.Executable
) -> None:
    # xla-cpu-pjrt 0.81 copies it without its order (the copy says row-major
    # and holds the column-major bytes: X.T's order); pjrt_py copies such a
    # buffer through the host on builds before 0.106 (native/memory.c).
    out = column_major.execute(X)
    device = out.device
    copies = {
        "copy.copy": copy.copy(out),
        "copy_to_device": out.copy_to_device(client.devices[-1]),
        "copy_to_device_async": out.copy_to_device_async(device).value(),
    }
    for memory in device.memories:
        copies[f"copy_to_memory({memory.kind})"] = out.copy_to_memory(memory)
    double = client.compile(DOUBLE)
    for how, dup in copies.items():
        np.testing.assert_array_equal(dup.to_numpy(), X, err_msg=how)
        if dup.device is device and dup.memory == device.default_memory:  # an argument
            np.testing.assert_array_equal(double.execute(dup).to_numpy(), 2 * X, err_msg=how)


EMPTY_TWO_ORDERS = """
func.func @main(%x: tensor<0x3xf32>, %y: tensor<0x3xf32>)
    -> (tensor<0x3xf32> {mhlo.layout_mode = "{0,1}"}, tensor<0x3xf32>) {
  return %x, %y : tensor<0x3xf32>, tensor<0x3xf32>
}
"""


def test_empty_results_in_two_orders_are_refused_where_the_compiler_dies() -> None:
    from pjrt_py.programs.plugin_guards import EMPTY_RESULTS_FROM, check_for_plugin  # noqa: PLC0415

    with pytest.raises(ValueError, match=r"two empty results of shape \[0, 3\]"):
        check_for_plugin(EMPTY_TWO_ORDERS, EMPTY_RESULTS_FROM, "cpu")
    check_for_plugin(EMPTY_TWO_ORDERS, (0, 81), "cpu")  # 0.81 compiles it
    check_for_plugin(EMPTY_TWO_ORDERS, EMPTY_RESULTS_FROM, "cuda")  # not measured there
    second = 'tensor<0x3xf32> {mhlo.layout_mode = "{0,1}"}) {'
    one_order = EMPTY_TWO_ORDERS.replace("tensor<0x3xf32>) {", second)
    check_for_plugin(one_order, EMPTY_RESULTS_FROM, "cpu")
    filled = EMPTY_TWO_ORDERS.replace("0x3", "2x3")
    check_for_plugin(filled, EMPTY_RESULTS_FROM, "cpu")
    # Measured to compile on 0.106 and 0.115: two dtypes, and "auto" beside "{0,1}".
    two_dtypes = EMPTY_TWO_ORDERS.replace("%y: tensor<0x3xf32>", "%y: tensor<0x3xi32>")
    two_dtypes = two_dtypes.replace(", tensor<0x3xf32>) {", ", tensor<0x3xi32>) {")
    two_dtypes = two_dtypes.replace(
        ": tensor<0x3xf32>, tensor<0x3xf32>", ": tensor<0x3xf32>, tensor<0x3xi32>"
    )
    check_for_plugin(two_dtypes, EMPTY_RESULTS_FROM, "cpu")
    auto = 'tensor<0x3xf32> {mhlo.layout_mode = "auto"}) {'
    check_for_plugin(
        EMPTY_TWO_ORDERS.replace("tensor<0x3xf32>) {", auto), EMPTY_RESULTS_FROM, "cpu"
    )
    # On the plugin under test: refused, or compiled, or (isolated) a crash
    # reported; never the process killed (SIGFPE on 0.106 and 0.115).
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        c = pjrt_py.Client()
        for isolate in (False, True):
            try:
                c.compile({EMPTY_TWO_ORDERS!r}, isolate=isolate, cache=False)
                print("compiled")
            except (ValueError, pjrt_py.CompilerCrashError) as e:
                print(type(e).__name__)
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[0] in ("ValueError", "compiled"), result.stdout
