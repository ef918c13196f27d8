"""Sub-byte types: int4, uint4, int2, uint2 and float4_e2m1fn (ml_dtypes), as
jax has them.

numpy stores one element per byte; the plugins pack them on the device and
take and give them unpacked on the host. pjrt_py's own direct copies apply
only where the device's size is numpy's, so these always go through the
plugin (pjrt_py.runtime.dtypes). Before this, every path refused them with
"dtype int4 is not supported", and a jax int4 array as an argument failed
inside jax's DLPack export. These run on each build of the plugin matrix.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pjrt_py
from pjrt_py.programs.plugin_guards import PACKED_LAYOUTS_FROM, check_for_plugin
from pjrt_py.runtime.dtypes import PACKED

# (dtype, MLIR element type, lowest, highest + 1)
KINDS = [
    (ml_dtypes.int4, "i4", -8, 8),
    (ml_dtypes.uint4, "ui4", 0, 16),
]
if hasattr(ml_dtypes, "int2"):
    KINDS += [(ml_dtypes.int2, "i2", -2, 2), (ml_dtypes.uint2, "ui2", 0, 4)]
IDS = [np.dtype(k[0]).name for k in KINDS]


def values(kind: tuple[Any, str, int, int], n: int) -> np.ndarray[Any, Any]:
    dtype, _, lo, hi = kind
    return (np.arange(n) % (hi - lo) + lo).astype(dtype)


def as_int(a: Any) -> np.ndarray[Any, Any]:
    return np.asarray(a).astype(np.int32)


def test_the_packed_types_are_known() -> None:
    floats = {np.dtype(ml_dtypes.float4_e2m1fn)} if hasattr(ml_dtypes, "float4_e2m1fn") else set()
    assert {np.dtype(k[0]) for k in KINDS} | floats == PACKED


@pytest.mark.parametrize("n", [1, 7, 8, 33, 4097])
@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_round_trips_through_every_transfer(
    client: pjrt_py.Client, kind: tuple[Any, str, int, int], n: int
) -> None:
    a = values(kind, n)
    buf = client.buffer(a)
    assert buf.dtype == a.dtype and buf.shape == (n,)
    for back in (buf.to_numpy(), buf.to_numpy_async().value(), np.asarray(buf)):
        assert back.dtype == a.dtype
        np.testing.assert_array_equal(as_int(back), as_int(a))
    np.testing.assert_array_equal(as_int(client.buffer_async(a).to_numpy()), as_int(a))
    odd = a.reshape(1, n)[:, ::-1]  # not C-contiguous
    np.testing.assert_array_equal(as_int(client.buffer(odd).to_numpy()), as_int(odd))


@pytest.mark.parametrize("kind", KINDS[:1], ids=IDS[:1])
def test_a_large_array_takes_the_plugins_copy(
    client: pjrt_py.Client, kind: tuple[Any, str, int, int]
) -> None:
    a = values(kind, 40 << 20)  # past the size pjrt_py copies into memory the plugin aliases
    np.testing.assert_array_equal(client.buffer(a).to_numpy().view(np.uint8), a.view(np.uint8))


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_programs_compute_on_them_as_numpy_does(
    client: pjrt_py.Client, kind: tuple[Any, str, int, int]
) -> None:
    dtype, element, lo, hi = kind
    t = f"tensor<16x{element}>"
    add = client.compile(
        f"func.func @main(%a: {t}, %b: {t}) -> {t} {{\n"
        f"  %r = stablehlo.add %a, %b : {t}\n  return %r : {t}\n}}"
    )
    a, b = values(kind, 16), values(kind, 16)[::-1].copy()
    wrapped = (as_int(a) + as_int(b) - lo) % (hi - lo) + lo  # two's-complement wrap
    np.testing.assert_array_equal(as_int(add.execute(a, b).to_numpy()), wrapped)
    widen = client.compile(
        f"func.func @main(%a: {t}) -> tensor<16xi32> {{\n"
        f"  %r = stablehlo.convert %a : ({t}) -> tensor<16xi32>\n  return %r : tensor<16xi32>\n}}"
    )
    np.testing.assert_array_equal(widen.execute(a).to_numpy(), as_int(a))
    spec = add.input_signature[0]
    assert spec.shape == (16,) and spec.dtype == np.dtype(dtype)
    with pytest.raises(TypeError, match="compiled with"):
        add.execute(as_int(a).astype(np.int8), b)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_jax_arrays_and_jit_give_jaxs_numbers(
    client: pjrt_py.Client, kind: tuple[Any, str, int, int]
) -> None:
    jax = pytest.importorskip("jax", reason="compared with jax")
    a = values(kind, 16)
    j = jax.numpy.asarray(a)  # jax cannot export these through DLPack: taken via numpy

    def fn(x: Any) -> Any:
        return (x * 3, x.astype(jax.numpy.int32))

    ours = pjrt_py.jit(fn)(j)
    theirs = jax.jit(fn)(j)
    for o, t in zip(ours, theirs, strict=True):
        assert o.dtype == t.dtype
        np.testing.assert_array_equal(as_int(o.to_numpy()), as_int(t))
    np.testing.assert_array_equal(as_int(pjrt_py.jit(fn)(a)[0].to_numpy()), as_int(theirs[0]))
    identity = client.compile(
        f"func.func @main(%a: tensor<16x{kind[1]}>) -> tensor<16x{kind[1]}> {{\n"
        f"  return %a : tensor<16x{kind[1]}>\n}}"
    )
    np.testing.assert_array_equal(as_int(identity.execute(j).to_numpy()), as_int(a))
    back = pjrt_py.to_jax(client.buffer(a))  # a copy: DLPack has no code for them
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(as_int(back), as_int(a))


def test_what_cannot_hold_them_says_so(client: pjrt_py.Client) -> None:
    a = values(KINDS[0], 128)
    buf = client.buffer(a)
    with pytest.raises(TypeError, match="no DLPack type code"):
        buf.__dlpack__()
    with pytest.raises(ValueError, match="without a copy"):
        np.asarray(buf, copy=False)
    aligned = pjrt_py.aligned_empty(a.shape, a.dtype)
    aligned[:] = a
    if client.platform_name == "cpu":
        with pytest.raises(ValueError, match="packs int4"):
            client.buffer(aligned, zero_copy=True)


@pytest.mark.needs_host_callbacks
def test_a_host_callback_refuses_them_and_the_execution_fails(client: pjrt_py.Client) -> None:
    # XLA's FFI hands the packed bytes: read as one per byte they would be
    # wrong, and twice as many as there are.
    pjrt_py.register_callback("subbyte_identity", lambda x: x, client=client)
    t = "tensor<8xi4>"
    exe = client.compile(
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %0 = stablehlo.custom_call @subbyte_identity(%x) {{api_version = 4 : i32}}"
        f" : ({t}) -> {t}\n  return %0 : {t}\n}}"
    )
    with pytest.raises(pjrt_py.PjrtError, match="element type 21, which has no numpy dtype"):
        exe.execute(values(KINDS[0], 8)).to_numpy()


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_the_device_size_is_packed_and_nbytes_is_numpys(
    client: pjrt_py.Client, kind: tuple[Any, str, int, int]
) -> None:
    a = values(kind, 64)
    buf = client.buffer(a)
    assert buf.nbytes == a.nbytes == 64  # one byte per element, as numpy and jax count
    bits = 4 if np.dtype(kind[0]).name.endswith("int4") else 2
    if client.platform_name == "cpu":  # every CPU build packs them
        assert buf.on_device_size_in_bytes() == 64 * bits // 8
    assert buf.on_device_size_in_bytes() <= buf.nbytes


def test_on_device_size_of_an_ordinary_and_a_deleted_buffer(client: pjrt_py.Client) -> None:
    buf = client.buffer(np.ones((3, 5), np.float64))
    assert buf.on_device_size_in_bytes() == buf.nbytes == 120
    buf.delete()
    with pytest.raises(ValueError, match="deleted"):
        buf.on_device_size_in_bytes()


def test_memory_watch_counts_packed_bytes(client: pjrt_py.Client) -> None:
    device = client.devices[0]
    a = values(KINDS[0], 1 << 16)
    with pjrt_py.memory_watch(device, source="pjrt_py") as watch:
        buf = client.buffer(a, device)
        device_bytes = buf.on_device_size_in_bytes()
    if client.platform_name == "cpu":  # every CPU build packs them
        assert device_bytes == a.nbytes // 2
    assert watch[device].peak_increase == device_bytes  # the plugin's count, asked


# float4_e2m1fn: every value it holds (sign, 2 exponent bits, 1 mantissa bit).
needs_float4 = pytest.mark.skipif(
    not hasattr(ml_dtypes, "float4_e2m1fn"), reason="this ml_dtypes has no float4_e2m1fn"
)
FLOAT4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def float4(n: int) -> np.ndarray[Any, Any]:
    return np.resize(np.array(FLOAT4_VALUES, np.float32), n).astype(ml_dtypes.float4_e2m1fn)


@needs_float4
@pytest.mark.parametrize("n", [1, 15, 33, 4097])
def test_float4_round_trips_and_computes(client: pjrt_py.Client, n: int) -> None:
    a = float4(n)
    buf = client.buffer(a)
    assert buf.dtype == a.dtype and buf.nbytes == n
    for back in (buf.to_numpy(), buf.to_numpy_async().value(), np.asarray(buf)):
        assert back.dtype == a.dtype
        np.testing.assert_array_equal(back.astype(np.float32), a.astype(np.float32))
    if client.platform_name == "cpu":  # every CPU build packs them
        assert buf.on_device_size_in_bytes() == (n + 1) // 2
    t, f = f"tensor<{n}xf4E2M1FN>", f"tensor<{n}xf32>"
    twice = client.compile(
        f"func.func @main(%a: {t}) -> ({f}, {t}) {{\n"
        f"  %w = stablehlo.convert %a : ({t}) -> {f}\n"
        f"  %d = stablehlo.add %w, %w : {f}\n"
        f"  %n = stablehlo.convert %d : ({f}) -> {t}\n"
        f"  return %d, %n : {f}, {t}\n}}"
    )
    wide, narrow = twice.execute(a)
    np.testing.assert_array_equal(wide.to_numpy(), 2 * a.astype(np.float32))
    # Back to float4: 2 * 4 and 2 * 6 saturate to 6 as ml_dtypes rounds them.
    np.testing.assert_array_equal(narrow.to_numpy(), (2 * a.astype(np.float32)).astype(a.dtype))
    assert twice.output_dtypes == [np.dtype(np.float32), a.dtype]


@needs_float4
def test_float4_through_jit_gives_jaxs_numbers(client: pjrt_py.Client) -> None:
    jax = pytest.importorskip("jax", reason="compared with jax")
    a = float4(16)

    def fn(x: Any) -> Any:
        return x.astype(jax.numpy.float32) * 3, (x.astype(jax.numpy.float32) / 2).astype(x.dtype)

    theirs = jax.jit(fn)(a)
    for arg in (a, jax.numpy.asarray(a)):  # a jax float4 array is copied through numpy
        ours = pjrt_py.jit(fn, client=client)(arg)
        for o, t in zip(ours, theirs, strict=True):
            assert o.dtype == t.dtype
            np.testing.assert_array_equal(o.to_numpy(), np.asarray(t))
    back = pjrt_py.to_jax(client.buffer(a))  # a copy: no DLPack code
    np.testing.assert_array_equal(np.asarray(back), a)
    # jax exports float4 packed (DLPack code 17), which pjrt_py does not view:
    # a jax array is copied through numpy (copy=None), its raw capsule refused.
    np.testing.assert_array_equal(client.from_dlpack(jax.numpy.asarray(a)).to_numpy(), a)
    with pytest.raises(TypeError, match="it is packed"):
        client.from_dlpack(jax.numpy.asarray(a).__dlpack__())
    with pytest.raises(TypeError, match="no DLPack type code"):
        client.buffer(a).__dlpack__()


ALL_PACKED = [(k[0], k[1], 1) for k in KINDS] + (
    [(ml_dtypes.float4_e2m1fn, "f4E2M1FN", 1.5)] if hasattr(ml_dtypes, "float4_e2m1fn") else []
)
ALL_IDS = [np.dtype(k[0]).name for k in ALL_PACKED]


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)], ids=["scalar", "one", "one-by-one"])
@pytest.mark.parametrize("kind", ALL_PACKED, ids=ALL_IDS)
def test_a_one_element_result_reads_as_numpy_has_it(
    client: pjrt_py.Client, kind: tuple[Any, str, float], shape: tuple[int, ...]
) -> None:
    # One packed element is one byte on the device and one in numpy, so the
    # direct host read once took the device's byte as it lay: its other half
    # is the program's, and float4 1.5 + 1.5 came back as -3.0.
    dtype, element, value = kind
    t = "tensor<" + "".join(f"{d}x" for d in shape) + element + ">"
    twice = client.compile(
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %y = stablehlo.add %x, %x : {t}\n  return %y : {t}\n}}"
    )
    x = np.full(shape, value, dtype)
    want = (x.astype(np.float32) * 2).astype(dtype)
    out = twice.execute(x)
    for back in (out.to_numpy(), twice.execute_async(x).to_numpy_async().value(), np.asarray(out)):
        assert back.tobytes() == want.tobytes(), (back.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("kind", ALL_PACKED, ids=ALL_IDS)
def test_a_column_major_result_reads_in_order(
    client: pjrt_py.Client, kind: tuple[Any, str, float]
) -> None:
    # numpy's strides over the device's bytes once read a packed column-major
    # result: 6 bytes of a 3-byte buffer, different garbage each run.
    dtype, element = kind[:2]
    t = f"tensor<2x3x{element}>"
    program = (
        f'func.func @main(%x: {t}) -> ({t} {{mhlo.layout_mode = "{{0,1}}"}}) {{\n'
        f"  return %x : {t}\n}}"
    )
    if tuple(client.plugin.api_version) < PACKED_LAYOUTS_FROM:  # the build aborts on it
        with pytest.raises(ValueError, match="abort the process"):
            client.compile(program)
        return
    x = np.resize(np.array([0, 1, -1, 1, 0, 1], np.float32), (2, 3)).astype(dtype)
    out = client.compile(program).execute(x)
    for _ in range(3):
        assert out.to_numpy().tobytes() == x.tobytes()


def test_the_guard_refuses_packed_layouts_only_on_builds_that_abort() -> None:
    t = "tensor<2x3xi4>"
    moved = f'func.func @main(%x: {t} {{mhlo.layout_mode = "{{0,1}}"}}) -> {t} {{\n'
    moved += f"  return %x : {t}\n}}"
    in_order = moved.replace("{0,1}", "{1,0}")
    wide = moved.replace("i4", "i8")
    auto = moved.replace("{0,1}", "auto")
    with pytest.raises(ValueError, match=r"parameter 'x' is int4\[2,3\] in layout \{0,1\}"):
        check_for_plugin(moved, (0, 81))
    tiled = moved.replace("{0,1}", "{0,1:T(2,2)}")  # a suffix once hid the order
    with pytest.raises(ValueError, match=r"in layout \{0,1:T\(2,2\)\}"):
        check_for_plugin(tiled, (0, 81))
    for text in (in_order, wide, auto, in_order.replace("{1,0}", "{1,0:E(4)}")):
        check_for_plugin(text, (0, 81))
    check_for_plugin(moved, PACKED_LAYOUTS_FROM)


@pytest.mark.parametrize("kind", ALL_PACKED, ids=ALL_IDS)
def test_from_dlpack_copies_an_aligned_packed_array(
    client: pjrt_py.Client, kind: tuple[Any, str, float]
) -> None:
    # An aligned array once took the in-place path, which refuses packed
    # types: whether from_dlpack worked depended on where numpy put the data.
    x = pjrt_py.aligned_empty((6,), kind[0])
    x[...] = np.array([0, 1, 1, 0, 1, 0], np.float32).astype(kind[0])
    got = client.from_dlpack(x)
    assert got.to_numpy().tobytes() == x.tobytes()
    x[...] = x[0]  # a copy: the buffer keeps what it had
    assert got.to_numpy().tobytes() != x.tobytes()
    with pytest.raises(BufferError, match="the device packs"):
        client.from_dlpack(x, copy=False)


@pytest.mark.parametrize("kind", ALL_PACKED, ids=ALL_IDS)
def test_from_dlpack_of_a_jax_array_copies_it_through_numpy(
    client: pjrt_py.Client, kind: tuple[Any, str, float]
) -> None:
    # jax has no DLPack export for them: its JaxRuntimeError came through.
    jnp = pytest.importorskip("jax.numpy", reason="jax arrays")
    x = np.array([0, 1, 1, 0], np.float32).astype(kind[0])
    got = client.from_dlpack(jnp.asarray(x))
    assert got.to_numpy().tobytes() == x.tobytes()
    with pytest.raises(BufferError, match="copied through numpy"):
        client.from_dlpack(jnp.asarray(x), copy=False)
