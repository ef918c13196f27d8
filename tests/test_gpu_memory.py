"""GPU memory policy (pjrt_py.runtime.gpu_memory) and Device.memory_stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import pjrt_py
from pjrt_py.runtime.gpu_memory import DEFAULTS, from_environment, with_memory_policy


def test_default_gpu_client_does_not_preallocate() -> None:
    assert with_memory_policy("cuda", {}, environ={}) == {"preallocate": False}
    assert with_memory_policy("rocm", {}, environ={}) == DEFAULTS


def test_jax_variables_are_read_with_jax_meanings() -> None:
    env = {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": ".5",
        "XLA_PYTHON_CLIENT_ALLOCATOR": "Platform",
        "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "3",
    }
    assert with_memory_policy("cuda", {}, environ=env) == {
        "preallocate": True,
        "memory_fraction": 0.5,
        "allocator": "platform",
        "collective_memory_size": 3 << 20,
    }
    for off in ("false", "False", "0"):
        assert from_environment({"XLA_PYTHON_CLIENT_PREALLOCATE": off}) == {"preallocate": False}
    assert from_environment({"XLA_CLIENT_MEM_FRACTION": "0.25"}) == {"memory_fraction": 0.25}
    flags = {
        "XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE": "1",
        "XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT": "0",
        "XLA_PYTHON_CLIENT_ALLOCATOR": "address",
    }
    assert from_environment(flags) == {
        "abort_collectives_on_failure": True,
        "use_tfrt_gpu_client": False,
        "allocator": "address",
    }


def test_caller_options_win_over_the_environment() -> None:
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}
    got = with_memory_policy("cuda", {"memory_fraction": 0.2}, environ=env)
    assert got == {"preallocate": True, "memory_fraction": 0.2}
    assert with_memory_policy("cuda", {"preallocate": True}, environ={}) == {"preallocate": True}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "malloc"}, "XLA_PYTHON_CLIENT_ALLOCATOR"),
        ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "half"}, "XLA_PYTHON_CLIENT_MEM_FRACTION"),
        ({"XLA_CLIENT_MEM_FRACTION": ".1", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".2"}, "both set"),
        ({"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "1.5"}, "COLLECTIVE_MEM_SIZE_MB"),
        ({"XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT": "yes"}, "USE_TFRT_GPU_CLIENT must be 0 or 1"),
    ],
)
def test_bad_environment_values_are_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        with_memory_policy("cuda", {}, environ=env)


def test_env_fraction_out_of_range_is_refused_by_the_option_check() -> None:
    from pjrt_py.runtime.client_options import checked_options

    options = with_memory_policy("cuda", {}, environ={"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"})
    with pytest.raises(ValueError, match="memory_fraction"):
        checked_options("cuda", options)
    with pytest.raises(ValueError, match="allocator"):
        checked_options("cuda", {"allocator": "malloc"})


def test_cpu_platforms_ignore_the_gpu_variables() -> None:
    env = {"XLA_PYTHON_CLIENT_ALLOCATOR": "malloc", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    assert with_memory_policy("cpu", {"cpu_device_count": 2}, environ=env) == {
        "cpu_device_count": 2
    }


def test_a_cpu_client_is_made_whatever_the_gpu_variables_say() -> None:
    # A real client in a fresh process: jax's variables set to values a GPU
    # client would refuse change nothing on a CPU plugin.
    code = textwrap.dedent(
        """
        import pjrt_py
        c = pjrt_py.Client("cpu")
        assert "preallocate" not in c.options and "allocator" not in c.options, c.options
        print("ok")
        """
    )
    env = dict(os.environ, XLA_PYTHON_CLIENT_ALLOCATOR="malloc", XLA_PYTHON_CLIENT_PREALLOCATE="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_memory_stats_is_none_or_the_plugins_figures(client: pjrt_py.Client) -> None:
    device = client.addressable_devices[0]
    stats = device.memory_stats()
    if stats is None:  # every CPU build answers UNIMPLEMENTED
        pytest.skip("needs a plugin that keeps memory statistics (PJRT_Device_MemoryStats)")
    assert isinstance(stats["bytes_in_use"], int) and stats["bytes_in_use"] >= 0
    before = stats["bytes_in_use"]
    import numpy as np

    buf = client.buffer(np.ones(1 << 20, np.float32), device)
    buf.block_until_ready()
    after = device.memory_stats()
    assert after is not None and after["bytes_in_use"] >= before + (4 << 20)
    if "bytes_limit" in after:
        assert after["bytes_limit"] >= after["bytes_in_use"]


def test_memory_stats_after_close_is_a_clear_error() -> None:
    c = pjrt_py.Client()
    device = c.addressable_devices[0]
    c.close()
    if not c.plugin.supports("PJRT_Device_MemoryStats"):
        pytest.skip("the plugin has no PJRT_Device_MemoryStats")
    with pytest.raises(ValueError, match="closed"):
        device.memory_stats()


# Run with no jax memory variable set (tools/gpu_check.sh sets
# XLA_PYTHON_CLIENT_PREALLOCATE=false for jax's sake, which would hide
# pjrt_py's own default): a client, then torch takes half of what is free.
SHARE_ONE_GPU = """
import json, sys
import numpy as np
import pjrt_py
gpus = [p for p in pjrt_py.plugins() if p.name in ("cuda", "rocm")]
try:
    client = pjrt_py.Client(gpus[0].path)
except pjrt_py.PjrtError as e:
    print(json.dumps({"skip": f"the {gpus[0].name} plugin found no GPU ({e})"}))
    sys.exit(0)
stats = client.addressable_devices[0].memory_stats()
report = {"stats": stats}
try:
    import torch
except ImportError:
    torch = None
if torch is not None and torch.cuda.is_available():
    free, total = torch.cuda.mem_get_info()
    report["free_after_client"], report["total"] = free, total
    block = torch.empty(free // 2, dtype=torch.uint8, device="cuda")  # was: OOM at 1 GiB
    block.fill_(1)
    torch.cuda.synchronize()
    report["torch_took"] = block.numel()
# pjrt_py still allocates and computes beside torch's block.
x = np.arange(1 << 20, dtype=np.float32)
report["round_trip"] = bool((client.buffer(x).to_numpy() == x).all())
print(json.dumps(report))
"""


@pytest.mark.gpu
def test_default_gpu_client_leaves_memory_for_other_frameworks() -> None:
    if not any(p.name in ("cuda", "rocm") for p in pjrt_py.plugins()):
        pytest.skip("needs a PJRT plugin with GPU devices (none installed)")
    names = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")
    names += ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR")
    env = {k: v for k, v in os.environ.items() if k not in names}
    out = subprocess.run(
        [sys.executable, "-c", SHARE_ONE_GPU], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(f"needs a GPU device: {report['skip']}")
    assert report["round_trip"]
    stats = report["stats"]
    assert stats is not None, "a GPU plugin keeps allocator statistics"
    held = max(stats.get("bytes_reserved", 0), stats.get("pool_bytes", 0), stats["bytes_in_use"])
    limit = stats.get("bytes_limit")
    # Without preallocation the allocator holds next to nothing at creation.
    assert limit is None or held < limit // 10, stats
    if "total" in report:  # torch with CUDA: most of the device was still free
        assert report["free_after_client"] > report["total"] // 2, report
        assert report["torch_took"] > 0
