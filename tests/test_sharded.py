"""Replicated and partitioned execution over the CPU plugin's devices."""

from __future__ import annotations

import json
import textwrap
import time

import numpy as np
import pytest
from conftest import run_python

import pjrt_py

ALL_REDUCE_4 = """
module @psum attributes {mhlo.num_replicas = 4 : i32, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "stablehlo.all_reduce"(%x) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"""

GATHER_AND_SHIFT = """
func.func public @main(%x: tensor<2xi32>) -> (tensor<8xi32>, tensor<2xi32>) {
  %g = "stablehlo.all_gather"(%x) {all_gather_dim = 0 : i64,
      replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<2xi32>) -> tensor<8xi32>
  %p = "stablehlo.collective_permute"(%x) {
      source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}
      : (tensor<2xi32>) -> tensor<2xi32>
  return %g, %p : tensor<8xi32>, tensor<2xi32>
}
"""


# Programs over four replicas or partitions: every test here needs four devices.
pytestmark = pytest.mark.needs_devices(4)


@pytest.fixture(scope="module")
def four(client: pjrt_py.Client) -> pjrt_py.Client:
    return client


def test_all_reduce_sums_over_four_replicas(four: pjrt_py.Client) -> None:
    exe = four.compile(ALL_REDUCE_4)  # replica count read from the module
    assert (exe.num_replicas, len(exe.devices)) == (4, 4)
    assert [d.id for d in exe.devices] == [0, 1, 2, 3]
    xs = [np.arange(3, dtype=np.float32) * (r + 1) for r in range(4)]
    args = [[four.buffer(x, device=d)] for x, d in zip(xs, exe.devices, strict=True)]
    outs = exe.execute_sharded(args)
    assert len(outs) == 4 and all(len(row) == 1 for row in outs)
    for row, device in zip(outs, exe.devices, strict=True):
        assert row[0].device == device  # each replica's output stays on its device
        np.testing.assert_array_equal(row[0].to_numpy(), sum(xs))


def test_sharded_async_returns_promises_that_chain(four: pjrt_py.Client) -> None:
    exe = four.compile(ALL_REDUCE_4)
    ones = [[np.ones(3, np.float32)] for _ in range(4)]  # numpy goes to each device
    first = exe.execute_sharded_async(ones)
    assert len(first) == 4 and all(isinstance(p, pjrt_py.BufferPromise) for p in first)
    second = exe.execute_sharded_async([[p] for p in first])  # no host wait between
    for p in second:
        np.testing.assert_array_equal(p.value().to_numpy(), np.full(3, 16, np.float32))


def test_all_gather_and_collective_permute(four: pjrt_py.Client) -> None:
    exe = four.compile(GATHER_AND_SHIFT, num_replicas=4)
    xs = [np.array([10 * r, 10 * r + 1], np.int32) for r in range(4)]
    outs = exe.execute_sharded([[x] for x in xs])
    for r, (gathered, shifted) in enumerate(outs):
        np.testing.assert_array_equal(gathered.to_numpy(), np.concatenate(xs))
        np.testing.assert_array_equal(shifted.to_numpy(), xs[(r - 1) % 4])


def test_explicit_device_assignment_orders_the_devices(four: pjrt_py.Client) -> None:
    devices = four.devices
    order = [devices[3], devices[1], devices[0], devices[2]]
    exe = four.compile(ALL_REDUCE_4, device_assignment=[[d] for d in order])
    assert exe.devices == order
    outs = exe.execute_sharded([[four.buffer(np.ones(3, np.float32), device=d)] for d in order])
    assert [row[0].device for row in outs] == order


def test_wrong_per_device_arguments_raise_clear_errors(four: pjrt_py.Client) -> None:
    # The session's client may still be finishing an earlier test's work
    # (seen once under load): the count below is of this test's calls only.
    deadline = time.monotonic() + 60
    while pjrt_py.programs.effects.running(four) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pjrt_py.programs.effects.running(four) == 0
    exe = four.compile(ALL_REDUCE_4)
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="4 device.*one argument list per device; got 3"):
        exe.execute_sharded([[x]] * 3)
    with pytest.raises(TypeError, match=r"takes 1 argument\(s\) on device 2, 2 given"):
        exe.execute_sharded([[x], [x], [x, x], [x]])
    with pytest.raises(TypeError, match="entry 1 must be a list"):
        exe.execute_sharded([[x], x, [x], [x]])
    with pytest.raises(
        TypeError, match=r"(?s)on device 3.*float32\[3\] and called with int32\[3\]"
    ):
        exe.execute_sharded([[x], [x], [x], [x.astype(np.int32)]])
    with pytest.raises(ValueError, match="execute_sharded"):
        exe.execute(x)  # a 4-device program is not run on one device by accident
    # An argument on the wrong device is refused before the plugin sees it:
    # the plugin would launch device 0 first, which then waits forever in
    # the all-reduce for replicas that never start.
    on0 = four.buffer(x, device=four.devices[0])
    with pytest.raises(ValueError, match="argument 0 on device 1 is on .*copy_to_device"):
        exe.execute_sharded([[on0]] * 4)
    assert pjrt_py.programs.effects.running(four) == 0


def test_bad_replica_requests_never_reach_the_plugin(four: pjrt_py.Client) -> None:
    with pytest.raises(ValueError, match="need 8 devices"):
        four.compile(ALL_REDUCE_4, num_replicas=8)
    with pytest.raises(ValueError, match="unknown device id"):
        four.compile(ALL_REDUCE_4, device_assignment=[[0], [1], [2], [9]])
    with pytest.raises(ValueError, match="uses a device twice"):
        four.compile(ALL_REDUCE_4, device_assignment=[[0], [1], [2], [2]])


@pytest.mark.needs_cpu_device_count  # jax's CPU mesh of four, compiled for four CPU devices
def test_jax_named_sharding_program_matches_jax() -> None:
    # jax needs 4 host devices, set before it starts: a subprocess.
    code = textwrap.dedent(
        """
        import json, os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        import pjrt_py

        mesh = jax.make_mesh((4,), ("x",))
        rows, rep = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())

        def f(a, w):
            return jnp.tanh(a @ w).sum(axis=0), a * 2.0

        a = np.arange(24, dtype=np.float32).reshape(8, 3) / 24
        w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
        jitted = jax.jit(f, in_shardings=(rows, rep), out_shardings=(rep, rows))
        text = jitted.lower(a, w).as_text()
        want_sum, want_twice = jitted(a, w)

        client = pjrt_py.Client(options={"cpu_device_count": 4})
        exe = client.compile(text)  # partitions read from the module
        shards = np.split(a, 4)
        outs = exe.execute_sharded([[s, w] for s in shards])
        got_sum = [row[0].to_numpy() for row in outs]
        got_twice = np.concatenate([row[1].to_numpy() for row in outs])
        print(json.dumps({
            "partitions": exe.num_partitions,
            "shard_shape": list(exe.input_signature[0].shape),
            "sum_ok": all(np.allclose(g, want_sum, rtol=1e-6) for g in got_sum),
            "twice_ok": bool(np.allclose(got_twice, want_twice)),
            "shardy": "sdy." in text,
        }))
        """
    )
    result = run_python(code, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {
        "partitions": 4,
        "shard_shape": [2, 3],  # one device's share, from the compiled module
        "sum_ok": True,
        "twice_ok": True,
        "shardy": True,
    }
