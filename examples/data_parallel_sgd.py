"""Data-parallel SGD over 4 CPU devices, with an all-reduce of gradients.

Run it with ``python examples/data_parallel_sgd.py`` (about a second).

A linear model ``y ~ X @ w + b`` is trained by gradient descent on a
squared loss. The batch is split into 4 shards, one per device. Each step
is one replicated program: every replica computes the gradient of its
shard, ``stablehlo.all_reduce`` sums the gradients over the 4 replicas, and
every replica applies the same update, so the parameters stay identical on
all devices. The parameters are donated (``tf.aliasing_output``): each step
reuses the previous step's memory.

The whole loop is asynchronous: each step takes the previous step's
promises as arguments, and the host waits once, at the end. The result is
checked against the same program run on one device with the whole batch,
and against numpy.
"""

from __future__ import annotations

import time

import numpy as np

import pjrt_py

DEVICES, FEATURES, ROWS_PER_DEVICE, STEPS, LEARNING_RATE = 4, 16, 256, 50, 0.1


def sgd_step(rows: int, replicas: int) -> str:
    """One SGD step on ``rows`` rows per replica, gradients summed over ``replicas``."""
    n = rows * replicas  # the whole batch: the mean is over all of it
    x, v, s = f"tensor<{rows}x{FEATURES}xf32>", f"tensor<{FEATURES}xf32>", "tensor<f32>"
    r = f"tensor<{rows}xf32>"
    groups = f"dense<[[{', '.join(str(i) for i in range(replicas))}]]> : tensor<1x{replicas}xi64>"

    def all_reduce(value: str, kind: str) -> str:
        return (
            f'"stablehlo.all_reduce"({value}) ({{\n'
            f"    ^bb0(%lhs: {s}, %rhs: {s}):\n"
            f"      %t = stablehlo.add %lhs, %rhs : {s}\n"
            f"      stablehlo.return %t : {s}\n"
            f"    }}) {{replica_groups = {groups}}} : ({kind}) -> {kind}"
        )

    return f"""
module @sgd_step attributes {{mhlo.num_replicas = {replicas} : i32}} {{
  func.func public @main(%w: {v} {{tf.aliasing_output = 0 : i32}},
                         %b: {s} {{tf.aliasing_output = 1 : i32}},
                         %x: {x}, %y: {r}) -> ({v}, {s}, {s}) {{
    %xw = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : ({x}, {v}) -> {r}
    %bb = stablehlo.broadcast_in_dim %b, dims = [] : ({s}) -> {r}
    %p = stablehlo.add %xw, %bb : {r}
    %e = stablehlo.subtract %p, %y : {r}
    %gw_local = stablehlo.dot_general %x, %e, contracting_dims = [0] x [0] : ({x}, {r}) -> {v}
    %zero = stablehlo.constant dense<0.0> : {s}
    %gb_local = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [0]
      : ({r}, {s}) -> {s}
    %ee = stablehlo.multiply %e, %e : {r}
    %l_local = stablehlo.reduce(%ee init: %zero) applies stablehlo.add across dimensions = [0]
      : ({r}, {s}) -> {s}
    %gw = {all_reduce("%gw_local", v)}
    %gb = {all_reduce("%gb_local", s)}
    %l = {all_reduce("%l_local", s)}
    %scale = stablehlo.constant dense<{2.0 * LEARNING_RATE / n}> : {s}
    %sw = stablehlo.broadcast_in_dim %scale, dims = [] : ({s}) -> {v}
    %dw = stablehlo.multiply %gw, %sw : {v}
    %w_new = stablehlo.subtract %w, %dw : {v}
    %db = stablehlo.multiply %gb, %scale : {s}
    %b_new = stablehlo.subtract %b, %db : {s}
    %inv_n = stablehlo.constant dense<{1.0 / n}> : {s}
    %loss = stablehlo.multiply %l, %inv_n : {s}
    return %w_new, %b_new, %loss : {v}, {s}, {s}
  }}
}}
"""


def numpy_sgd(x: np.ndarray, y: np.ndarray, w: np.ndarray, b: float) -> tuple[np.ndarray, float]:
    for _ in range(STEPS):
        e = x @ w + b - y
        w = w - LEARNING_RATE * 2 * (x.T @ e) / len(y)
        b = b - LEARNING_RATE * 2 * e.sum() / len(y)
    return w, b


def main() -> None:
    client = pjrt_py.Client(options={"cpu_device_count": DEVICES})
    devices = client.devices[:DEVICES]
    rng = np.random.default_rng(0)
    rows = DEVICES * ROWS_PER_DEVICE
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    true_w = rng.standard_normal(FEATURES).astype(np.float32)
    y = (x @ true_w + 0.5 + 0.01 * rng.standard_normal(rows)).astype(np.float32)
    w0, b0 = np.zeros(FEATURES, np.float32), np.float32(0.0)

    # Data parallel: one shard of the batch per device, parameters replicated.
    parallel = client.compile(sgd_step(ROWS_PER_DEVICE, DEVICES))
    assert parallel.devices == devices and parallel.num_replicas == DEVICES
    xs, ys = np.split(x, DEVICES), np.split(y, DEVICES)
    data = [
        (client.buffer_async(xs[i], devices[i]), client.buffer_async(ys[i], devices[i]))
        for i in range(DEVICES)
    ]
    state: list[list[object]] = [[w0, b0] for _ in devices]
    start = time.perf_counter()
    for _ in range(STEPS):
        # Promises in, promises out: no host wait between steps. The
        # parameters of the last step are donated to this one.
        outs = parallel.execute_sharded_async([[*state[i], *data[i]] for i in range(DEVICES)])
        state = [[p[0], p[1]] for p in outs]
        losses = [p[2] for p in outs]
    dispatched = time.perf_counter() - start
    w_par = [pjrt_py.to_numpy(s[0]) for s in state]
    b_par = [pjrt_py.to_numpy(s[1]) for s in state]
    loss = float(pjrt_py.to_numpy(losses[0]))
    total = time.perf_counter() - start
    for i in range(1, DEVICES):  # every replica applied the same update
        np.testing.assert_array_equal(w_par[i], w_par[0])
        np.testing.assert_array_equal(b_par[i], b_par[0])

    # The same steps on one device with the whole batch.
    single = client.compile(sgd_step(rows, 1), device=devices[0])
    w, b = client.buffer(w0), client.buffer(b0)
    xb, yb = client.buffer(x), client.buffer(y)
    for _ in range(STEPS):
        w, b, _loss = single.execute_async(w, b, xb, yb)
    w_one, b_one = pjrt_py.to_numpy(w), pjrt_py.to_numpy(b)
    np.testing.assert_allclose(w_par[0], w_one, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b_par[0], b_one, rtol=1e-4, atol=1e-5)

    w_np, b_np = numpy_sgd(x.astype(np.float64), y.astype(np.float64), w0, float(b0))
    np.testing.assert_allclose(w_par[0], w_np, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(b_par[0], b_np, rtol=1e-3, atol=1e-4)

    print(f"{STEPS} steps of data-parallel SGD on {DEVICES} devices")
    print(f"  all steps dispatched in {dispatched * 1e3:.1f} ms; done after {total * 1e3:.1f} ms")
    print(f"  final loss {loss:.5f}; |w - true w| = {np.abs(w_par[0] - true_w).max():.4f}")
    print("  4 replicas agree exactly; matches a 1-device run and numpy")


if __name__ == "__main__":
    main()
