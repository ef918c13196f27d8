"""Raw PJRT executables: Executable.serialize(raw=True), Client.deserialize(raw=True)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import ADD_F32_8

import pjrt_py

X = np.arange(8, dtype=np.float32)


def test_raw_bytes_round_trip(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_F32_8)
    raw = exe.serialize(raw=True)
    assert not raw.startswith(b"PJRTPYEX") and raw != exe.serialize()
    again = client.deserialize(raw, raw=True)
    np.testing.assert_array_equal(again.execute(X, X).to_numpy(), X + X)


def test_each_format_is_refused_by_the_other_loader(client: pjrt_py.Client) -> None:
    exe = client.compile(ADD_F32_8)
    with pytest.raises(pjrt_py.SerializationError, match="without raw=True"):
        client.deserialize(exe.serialize(), raw=True)
    with pytest.raises(pjrt_py.SerializationError, match="no PJRTPYEX header"):
        client.deserialize(exe.serialize(raw=True))
    with pytest.raises(TypeError, match="raw must be"):
        exe.serialize(raw=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("data", [b"", b"garbage" * 10, bytes(range(256)) * 4])
def test_bytes_the_plugin_cannot_read_are_a_serialization_error(
    client: pjrt_py.Client, data: bytes
) -> None:
    with pytest.raises(pjrt_py.SerializationError):
        client.deserialize(data, raw=True)


def test_a_hostile_pickle_runs_no_code(client: pjrt_py.Client, tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> object:
            return (os.system, (f"touch {marker}",))

    with pytest.raises(pjrt_py.SerializationError):
        client.deserialize(pickle.dumps(Evil()), raw=True)
    assert not marker.exists()


def test_jax_serialized_executables_load_on_the_same_plugin() -> None:
    # jax itself on pjrt_py's plugin (a process of its own: jax's platform is
    # process-wide), then both of jax's forms loaded raw.
    pytest.importorskip("jax", reason="needs jax to make the executable")
    code = textwrap.dedent(
        """
        import numpy as np, pjrt_py, jax
        from jax._src import xla_bridge
        from jax.experimental import serialize_executable
        path = pjrt_py.runtime.discovery.find_plugin()
        xla_bridge.register_plugin("pjrt_py_test", library_path=path)
        jax.config.update("jax_platforms", "pjrt_py_test")
        compiled = jax.jit(lambda x: x * 2 + 1).lower(np.ones(8, np.float32)).compile()
        pickled, _, _ = serialize_executable.serialize(compiled)
        runtime = compiled.runtime_executable().serialize()
        client = pjrt_py.Client(path)
        for data in (pickled, runtime):
            exe = client.deserialize(data, raw=True)
            print(exe.execute(np.arange(8, dtype=np.float32)).to_numpy().tolist())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    expected = str([float(v) for v in X * 2 + 1])
    assert out.stdout.split("\n")[:2] == [expected, expected]
