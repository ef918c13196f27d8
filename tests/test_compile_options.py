"""Our hand-written CompileOptionsProto encoding, checked by jaxlib's parser."""

from __future__ import annotations

import pytest

from pjrt_py import encode_compile_options
from pjrt_py.programs import jax_options as _jax_options
from pjrt_py.programs.placement import check_compile_options, decode_compile_options
from pjrt_py.programs.proto import fields

xc = pytest.importorskip("jax._src.lib", reason="jaxlib parses the bytes we encode").xla_client
jaxlib = pytest.importorskip("jaxlib", reason="jaxlib parses the bytes we encode")


def test_without_jax_defaults_the_options_are_the_minimal_safe_ones() -> None:
    assert encode_compile_options(like_jax=False) == bytes.fromhex("1a0420012801")


def _split(data: bytes) -> tuple[list[tuple[int, object]], dict[int, object], dict[int, object]]:
    """(debug option fields, other build fields, top-level fields) of encoded options."""
    debug: list[tuple[int, object]] = []
    build: dict[int, object] = {}
    top: dict[int, object] = {}
    for number, value in fields(data):
        if number != 3:
            top[number] = value
            continue
        assert isinstance(value, bytes)
        for inner, item in fields(value):
            if inner == 3:
                assert isinstance(item, bytes)
                debug = sorted(fields(item), key=lambda f: (f[0], repr(f[1])))
            else:
                build[inner] = item
    return debug, build, top


@pytest.mark.parametrize("replicas, partitions", [(1, 1), (2, 1), (1, 2)])
def test_default_options_are_what_jax_sends(replicas: int, partitions: int) -> None:
    """Every DebugOptions field and every build field jax sets, for the installed jaxlib."""
    from jax._src import compiler

    jax_bytes = compiler.get_compile_options(
        num_replicas=replicas, num_partitions=partitions
    ).SerializeAsString()
    ours = encode_compile_options(num_replicas=replicas, num_partitions=partitions)
    jax_debug, jax_build, jax_top = _split(jax_bytes)
    our_debug, our_build, our_top = _split(ours)
    assert our_top == jax_top
    assert our_build == jax_build
    fast_min_max = (140, 0)  # the field whose plugin default changes NaN semantics
    assert fast_min_max in jax_debug and fast_min_max in our_debug
    if jaxlib.__version__ == _jax_options.JAXLIB_VERSION:
        assert our_debug == jax_debug
    else:  # another jaxlib: its flag defaults may have moved; the semantic ones must not
        semantic = {99, 120, 121, 126, 129, 140}
        assert [f for f in our_debug if f[0] in semantic] == [
            f for f in jax_debug if f[0] in semantic
        ]


def test_debug_options_override_by_name_and_number() -> None:
    data = encode_compile_options(
        debug_options={"xla_cpu_enable_fast_math": True, 31: 1, "xla_dump_to": "/tmp/x"}
    )
    # Each object is kept: jaxlib's sub-objects point into their parent's memory.
    parsed = xc.CompileOptions.ParseFromString(data)
    build = parsed.executable_build_options
    debug = build.debug_options
    assert debug.xla_cpu_enable_fast_math is True
    assert debug.xla_backend_optimization_level == 1
    assert debug.xla_dump_to == "/tmp/x"
    assert debug.xla_cpu_fast_math_honor_nans is True  # the rest stays jax's
    assert encode_compile_options(debug_options={31: 1}) != encode_compile_options()


@pytest.mark.parametrize(
    "options, error",
    [
        ({"xla_no_such_option": True}, ValueError),
        ({"xla_cpu_enable_fast_math": 1}, TypeError),
        ({"xla_backend_optimization_level": True}, TypeError),
        ({"xla_dump_to": 3}, TypeError),
        ({0: True}, TypeError),
        ({140: [1]}, TypeError),
        ({31: 1 << 70}, ValueError),
        ([("xla_dump_to", "x")], TypeError),
    ],
)
def test_bad_debug_options_raise(options: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_compile_options(debug_options=options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x1a\x00", "num_replicas = 0"),
        (b"", "num_replicas = 0"),
        (b"\x1a\x02\x20\x01", "num_partitions = 0"),
        (b"\x1a\x04\x20\x00\x28\x01", "num_replicas = 0"),
        (b"\x1a\x0b\x20\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "num_replicas = -1"),
        (b"\x1a\x05\x20", "not a serialized"),
        (b"\xff\xff", "not a serialized"),
        (b"\x1a\x04\x20\x01\x28\x01\x1a\x00", None),  # a later message resets nothing
    ],
)
def test_option_bytes_are_decoded_and_checked(data: bytes, match: str | None) -> None:
    if match is None:
        decode_compile_options(data)
        return
    with pytest.raises(ValueError, match=match):
        decode_compile_options(data)


def test_option_bytes_get_the_keyword_paths_placement_checks() -> None:
    devices = [0, 1, 2, 3]
    for kwargs in (
        {"num_replicas": 8},
        {"num_replicas": 2, "num_partitions": 3},
    ):
        with pytest.raises(ValueError, match="devices; this client has 4"):
            check_compile_options(encode_compile_options(**kwargs), devices)  # type: ignore[arg-type]
    unknown = encode_compile_options(device_assignment=[[7]])
    with pytest.raises(ValueError, match="unknown device id"):
        check_compile_options(unknown, devices)
    ok = encode_compile_options(num_replicas=2, device_assignment=[[3], [1]])
    check_compile_options(ok, devices)
    assert decode_compile_options(ok).device_assignment == [[3], [1]]


def test_jaxlib_reads_replicas_and_partitions() -> None:
    data = encode_compile_options(num_replicas=2, num_partitions=3)
    parsed = xc.CompileOptions.ParseFromString(data)
    assert parsed.num_replicas == 2
    assert parsed.num_partitions == 3
    assert parsed.executable_build_options.num_replicas == 2
    assert parsed.executable_build_options.num_partitions == 3


def test_jaxlib_reads_the_device_assignment() -> None:
    data = encode_compile_options(
        num_replicas=2, num_partitions=2, device_assignment=[[0, 1], [2, 3]]
    )
    parsed = xc.CompileOptions.ParseFromString(data)
    da = parsed.device_assignment
    assert da.replica_count() == 2 and da.computation_count() == 2
    # jaxlib prints each computation (partition) with its device per replica.
    assert "Computation0{0 2} Computation1{1 3}" in str(da)


def test_spmd_and_portable_flags_round_trip() -> None:
    data = encode_compile_options(
        num_partitions=4, use_spmd_partitioning=True, compile_portable_executable=True
    )
    parsed = xc.CompileOptions.ParseFromString(data)
    assert parsed.executable_build_options.use_spmd_partitioning
    assert parsed.compile_portable_executable
    assert parsed.num_partitions == 4


def test_large_values_use_multi_byte_varints() -> None:
    parsed = xc.CompileOptions.ParseFromString(encode_compile_options(num_replicas=300))
    assert parsed.num_replicas == 300


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_replicas": 0},
        {"num_partitions": -1},
        {"num_replicas": True},
        {"num_replicas": 1.5},
        {"num_replicas": 2, "device_assignment": [[0]]},
        {"device_assignment": [[-1]]},
        {"num_replicas": 2, "device_assignment": [[0], [0]]},
        {"device_assignment": []},
    ],
)
def test_invalid_options_raise_before_any_plugin_sees_them(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        encode_compile_options(**kwargs)  # type: ignore[arg-type]
