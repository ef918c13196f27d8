"""A GPU plugin on a machine without its GPU, checked against the real binary.

jax's CUDA plugin (``jax-cuda13-pjrt``) loads without a GPU, and it checks
the names and types of its create options before it looks for devices. So
what pjrt_py hands a GPU plugin can be checked on a CPU machine:

- the options of the GPU memory policy (docs/gpu.md), which a wrong name or
  type would have made fail at ``Client("cuda")`` on the GPU itself;
- the stream and FFI extensions that DLPack ordering and host callbacks use;
- and a clean error from every entry point where the GPU is missing, as on
  a CI machine with jax's CUDA wheels installed.

CI's "GPU plugin, no GPU" step puts the plugin on ``PYTHONPATH`` for this
file (.ci/run). Elsewhere these skip; on a machine with the GPU they skip
too, since the GPU tier covers the same ground there.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import pjrt_py
from pjrt_py import _core
from pjrt_py.callbacks import host_callback
from pjrt_py.interop import dlpack
from pjrt_py.runtime.client_options import KNOWN
from pjrt_py.runtime.discovery import plugin_info
from pjrt_py.runtime.gpu_memory import ALLOCATORS

NO_GPU = "No visible GPU devices"


@pytest.fixture(scope="module")
def cuda() -> Iterator[Any]:
    """The installed CUDA plugin, loaded; skips if none, or if a GPU is here."""
    found = [p for p in pjrt_py.plugins() if p.name == "cuda"]
    if not found:
        if os.environ.get("PJRT_PY_EXPECT_CUDA_PLUGIN"):  # CI's step installed one
            pytest.fail("PJRT_PY_EXPECT_CUDA_PLUGIN is set, but no CUDA plugin was found")
        pytest.skip(
            "needs a CUDA PJRT plugin installed (jax-cuda13-pjrt); CI's no-GPU step has one"
        )
    plugin = pjrt_py.load_plugin(found[0].path)
    try:
        client = pjrt_py.Client(plugin)
    except pjrt_py.FailedPreconditionError as e:
        if NO_GPU not in str(e):
            raise
    else:
        client.close()
        pytest.skip("a GPU is present: the gpu-marked tests cover it")
    yield plugin


def test_the_plugin_is_found_as_cuda_and_the_cpu_stays_the_default(cuda: Any) -> None:
    assert cuda.api_version >= (0, 70)
    client = pjrt_py.Client()
    assert client.platform_name == "cpu"
    client.close()


def test_the_plugin_from_a_path_pjrt_py_did_not_find_is_still_a_gpu_plugin(
    cuda: Any, tmp_path: Any
) -> None:
    # Another name for the same file (a hard link: dlopen gives the loaded
    # library back); plugins() does not list it, so the platform comes from
    # the plugin itself, and with it the GPU memory policy and option checks.
    link = tmp_path / "renamed_plugin.so"
    try:
        os.link(cuda.path, link)
    except OSError as e:
        pytest.skip(f"needs a hard link beside the plugin's file system ({e})")
    unlisted = pjrt_py.load_plugin(str(link))
    assert plugin_info(str(link)).name == "?"
    assert unlisted.platform == "cuda" and cuda.platform == "cuda"
    with pytest.raises(ValueError, match="'memory_fraction' must be in"):  # pjrt_py's check
        pjrt_py.Client(unlisted, {"memory_fraction": 2.0})
    with pytest.raises(pjrt_py.FailedPreconditionError, match=NO_GPU):
        pjrt_py.Client(unlisted)


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_CLIENT_MEM_FRACTION": ".3"},
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"},
        {"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "64"},
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"},
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"},
    ],
    ids=lambda e: ",".join(f"{k.split('_CLIENT_')[-1]}={v}" for k, v in e.items()) or "default",
)
def test_the_memory_policys_options_pass_the_plugins_checks(
    cuda: Any, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("XLA_"):
            monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    # Past the option checks, the plugin looks for a GPU and finds none.
    with pytest.raises(pjrt_py.FailedPreconditionError, match=NO_GPU):
        pjrt_py.Client(cuda)


# A valid value of each CUDA option pjrt_py knows and checks (client_options.KNOWN).
SAMPLES = {
    "platform_name": "cuda",
    "allocator": "bfc",
    "memory_fraction": 0.5,
    "preallocate": True,
    "collective_memory_size": 1 << 20,
    "visible_devices": [0],
    "node_id": 0,
    "num_nodes": 1,
    "enable_mock_nccl": False,
    "mock_gpu_topology": "",
    "should_stage_host_to_device_transfers": True,
    "abort_collectives_on_failure": False,
    "use_tfrt_gpu_client": False,
    "partition_index": 0,
}


def test_every_allocator_pjrt_py_takes_is_one_the_plugin_takes(cuda: Any) -> None:
    # The plugin checks the allocator's name before it looks for a GPU
    # ("Allocator ... not supported": measured with a name it lacks).
    for allocator in ALLOCATORS:
        with pytest.raises(pjrt_py.FailedPreconditionError, match=NO_GPU):
            pjrt_py.Client(cuda, options={"allocator": allocator})


def test_every_cuda_option_pjrt_py_knows_is_one_the_plugin_takes(cuda: Any) -> None:
    assert set(SAMPLES) == set(KNOWN["cuda"])  # a new known option needs a sample here
    for name, value in SAMPLES.items():
        with pytest.raises(pjrt_py.FailedPreconditionError, match=NO_GPU):
            pjrt_py.Client(cuda, options={name: value})


def test_the_plugins_checks_are_real(cuda: Any) -> None:
    # An unknown name reaches the plugin (pjrt_py checks only the names it
    # knows) and is refused there, before the GPU is looked for: so the
    # tests above could fail.
    with pytest.raises(pjrt_py.InvalidArgumentError, match="Unexpected option name"):
        pjrt_py.Client(cuda, options={"preallocation": False})


def test_the_extensions_pjrt_py_relies_on_are_there_and_usable(cuda: Any) -> None:
    names = set(cuda.extensions)
    assert {"stream", "ffi"} <= names, names
    assert _core.stream_extension_usable(cuda.address)  # DLPack ordering (native/stream.c)


def test_a_callback_handler_registers_for_cuda(cuda: Any) -> None:
    # The FFI extension's registration, as host callbacks on a GPU make it:
    # the staged handler, for platform CUDA (XLA asks it for its metadata).
    slot = host_callback._SLOTS - 1
    address = host_callback._set(slot, lambda x: x, "pjrt_py_no_gpu_probe", True, "host")
    try:
        assert _core.ffi_register(cuda.address, "pjrt_py_no_gpu_probe", address, "CUDA") == 0
    finally:
        host_callback._set(slot, None, "pjrt_py_no_gpu_probe", True, "direct")


def test_entry_points_fail_cleanly_without_the_gpu(cuda: Any) -> None:
    with pytest.raises(pjrt_py.FailedPreconditionError, match=NO_GPU):
        pjrt_py.default_client_for("cuda")

    class CudaProducer:  # what torch's CUDA tensors say of themselves
        def __dlpack_device__(self) -> tuple[int, int]:
            return (dlpack.CUDA, 0)

        def __dlpack__(self, **_: object) -> object:
            raise AssertionError("asked for its tensor before a client existed")

    with pytest.raises(pjrt_py.FailedPreconditionError, match=NO_GPU):
        pjrt_py.from_dlpack(CudaProducer())


def test_the_command_line_says_what_is_missing(cuda: Any) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pjrt_py", "info", "--plugin", cuda.path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert NO_GPU in result.stdout + result.stderr


def test_the_conformance_runner_says_why_the_plugin_did_not_start(cuda: Any, tmp_path: Any) -> None:
    program = tmp_path / "add.mlir"
    program.write_text(
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %0 = stablehlo.add %x, %x : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pjrt_py", "test", "--plugin", cuda.path, str(program)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"plugin failed to start: FailedPreconditionError: {NO_GPU}" in result.stdout, (
        result.stdout + result.stderr[-2000:]
    )


def test_a_process_that_failed_to_make_a_client_exits_cleanly(cuda: Any) -> None:
    code = (
        "import pjrt_py\n"
        f"p = pjrt_py.load_plugin({cuda.path!r})\n"
        "try:\n    pjrt_py.Client(p)\n"
        "except pjrt_py.FailedPreconditionError:\n    print('refused')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused" in result.stdout


def test_a_cuda_driver_library_is_what_callbacks_need(cuda: Any) -> None:
    # Without libcuda (this machine), GPU callbacks say so instead of failing later.
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has a CUDA driver")
    with pytest.raises(pjrt_py.UnsupportedError, match="CUDA driver"):
        host_callback.load_cuda_driver()
