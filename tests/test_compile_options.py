"""Our hand-written CompileOptionsProto encoding, checked by jaxlib's parser."""

from __future__ import annotations

import pytest

from pjrt_py import encode_compile_options

xc = pytest.importorskip("jax._src.lib", reason="jaxlib parses the bytes we encode").xla_client


def test_defaults_are_the_minimal_safe_options() -> None:
    assert encode_compile_options() == bytes.fromhex("1a0420012801")


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
