"""Programs reach the plugin as jaxlib's client sends them: portable bytecode.

The two cases below were measured differences between pjrt_py (text to the
plugin) and jaxlib's client (portable bytecode, CHLO expanded by jaxlib).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import needs_build

import pjrt_py
from pjrt_py.programs import form as program_form

pytest.importorskip("jaxlib", reason="portable bytecode is written by jaxlib")

I1_HEX_CONSTANT = """
func.func @main() -> tensor<4xi8> {
  %c = stablehlo.constant dense<"0x01000101"> : tensor<4xi1>
  %0 = stablehlo.convert %c : (tensor<4xi1>) -> tensor<4xi8>
  return %0 : tensor<4xi8>
}
"""


def _client(distribution: str) -> pjrt_py.Client:
    return pjrt_py.Client(distribution)


@pytest.mark.parametrize("build", ["fastatomstruct-xla-cpu", "xla-cpu-pjrt", "lammps-jax-pjrt-cpu"])
def test_every_cpu_build_gets_portable_bytecode(build: str) -> None:
    if not any(p.distribution == build for p in pjrt_py.plugins()):
        pytest.skip(f"{build} (in the test extra) is not installed")
    plugin = _client(build).plugin
    version = program_form.target_version(plugin)
    assert version is not None
    reported = tuple(plugin.attributes["stablehlo_current_version"])
    assert tuple(map(int, version.split("."))) <= reported  # never newer than the plugin reads
    assert program_form.describe(plugin).startswith("portable bytecode, StableHLO " + version)


@needs_build("xla-cpu-pjrt")
def test_an_i1_hex_constant_compiles_on_the_081_build() -> None:
    # Its parser cannot read the constant in text; jaxlib's can, and sends bytecode.
    exe = _client("xla-cpu-pjrt").compile(I1_HEX_CONSTANT, cache=False)
    np.testing.assert_array_equal(exe.execute().to_numpy(), np.array([1, 0, 1, 1], np.int8))


@needs_build("lammps-jax-pjrt-cpu")
def test_chlo_is_expanded_as_jax_expands_it() -> None:
    jax = pytest.importorskip("jax")
    x = np.array([0.0, -0.0, -1e-30, -1e-6, 2.5], np.float32)
    text = jax.jit(jax.scipy.special.digamma).lower(x).as_text()
    assert "chlo.digamma" in text
    got = _client("lammps-jax-pjrt-cpu").compile(text, cache=False).execute(x).to_numpy()
    np.testing.assert_array_equal(got, np.asarray(jax.jit(jax.scipy.special.digamma)(x)))


def test_text_jaxlib_cannot_read_goes_as_text_for_the_plugins_error(
    client: pjrt_py.Client,
) -> None:
    assert program_form.for_plugin(client.plugin, "func.func @main( {") is None
    with pytest.raises(pjrt_py.PjrtError):
        client.compile("func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> { return %y }")


def test_the_environment_can_force_text() -> None:
    code = textwrap.dedent(
        """
        import pjrt_py
        from pjrt_py.programs import form as program_form
        c = pjrt_py.Client()
        assert program_form.target_version(c.plugin) is None
        print(program_form.describe(c.plugin))
        """
    )
    env = dict(os.environ, PJRT_PY_PROGRAM_FORM="text")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "text ($PJRT_PY_PROGRAM_FORM=text)"
