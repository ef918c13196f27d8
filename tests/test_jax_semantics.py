"""Default compile options give jax's semantics on every installed CPU build.

The plugins' own default (``xla_cpu_enable_fast_min_max = true``) makes
``max(1, NaN)`` return 1; jax, and the StableHLO spec, say NaN. pjrt_py sends
jax's DebugOptions, which turn it off (``tests/test_compile_options.py``
checks the bytes; this checks what the plugins compute).
"""

from __future__ import annotations

import numpy as np
import pytest

import pjrt_py

CPU_BUILDS = [p for p in pjrt_py.plugins() if p.name == "cpu"]

MIN_MAX = """
func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>)
    -> (tensor<4xf32>, tensor<4xf32>, tensor<f32>) {
  %0 = stablehlo.maximum %x, %y : tensor<4xf32>
  %1 = stablehlo.minimum %x, %y : tensor<4xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %2 = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [0]
       : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
  return %0, %1, %2 : tensor<4xf32>, tensor<4xf32>, tensor<f32>
}
"""
X = np.array([1.0, np.nan, -2.0, np.nan], np.float32)
Y = np.array([np.nan, 1.0, 3.0, np.nan], np.float32)


@pytest.mark.parametrize("build", CPU_BUILDS, ids=lambda b: b.distribution or b.path)
def test_nan_propagates_through_max_and_min_as_in_jax(build: pjrt_py.PluginInfo) -> None:
    client = pjrt_py.Client(build.path)
    hi, lo, top = (b.to_numpy() for b in client.compile(MIN_MAX).execute(X, Y))
    expected = np.array([np.nan, np.nan, 3.0, np.nan], np.float32)
    np.testing.assert_array_equal(hi, expected)
    np.testing.assert_array_equal(lo, np.array([np.nan, np.nan, -2.0, np.nan], np.float32))
    assert np.isnan(top)


@pytest.mark.parametrize("build", CPU_BUILDS, ids=lambda b: b.distribution or b.path)
def test_debug_options_reach_the_plugin_and_key_the_cache(build: pjrt_py.PluginInfo) -> None:
    client = pjrt_py.Client(build.path)
    default = client.compile(MIN_MAX)
    fast = client.compile(MIN_MAX, debug_options={"xla_cpu_enable_fast_min_max": True})
    assert fast is not default and fast._program is not default._program  # another key
    hi = fast.execute(X, Y)[0].to_numpy()
    # The plugin's fast min/max (x86 maxps order) gives max(1, NaN) = 1 where the
    # default gives NaN: the option got there.
    assert hi[0] == 1.0
    again = client.compile(MIN_MAX, debug_options={"xla_cpu_enable_fast_min_max": True})
    assert again._program is fast._program  # a hit, with the same options


def test_jax_agrees(client: pjrt_py.Client) -> None:
    jax = pytest.importorskip("jax", reason="the reference semantics are jax's")
    import jax.numpy as jnp

    with jax.default_device(jax.devices("cpu")[0]):
        expected = np.asarray(jnp.maximum(X, Y))
    np.testing.assert_array_equal(client.compile(MIN_MAX).execute(X, Y)[0].to_numpy(), expected)
