"""Client create options: checked against their known types before the plugin sees them.

A CPU plugin reads an option with the type it expects and aborts the
process when the value has another (measured: ``{"cpu_device_count": "4"}``,
``1.5``, ``True`` or ``[]`` abort the PJRT 0.81 and 0.106 builds; a negative
count aborts 0.106 and 0.115). So every option pjrt_py knows for a platform is
checked here, with a ``TypeError`` or ``ValueError`` that names it. Options
it does not know go through untouched: the 0.81 and 0.106 builds ignore
unknown names, and 0.115 answers an ``InvalidArgumentError``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .errors import UnsupportedError
from .gpu_memory import ALLOCATORS

Check = Callable[[str, Any], Any]  # returns the value to send (or raises)


def _integer(value: Any) -> int | None:
    """An int, or a numpy integer as one; None for anything else (bools included)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _int(low: int, high: int) -> Check:
    def check(name: str, value: Any) -> Any:
        number = _integer(value)
        if number is None:
            raise TypeError(f"client option {name!r} takes an int, got {value!r}")
        if not low <= number <= high:
            raise ValueError(f"client option {name!r} must be in [{low}, {high}], got {number}")
        return number

    return check


def _bool(name: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise TypeError(f"client option {name!r} takes a bool, got {value!r}")
    return value


def _str(name: str, value: Any) -> Any:
    if not isinstance(value, str):
        raise TypeError(f"client option {name!r} takes a str, got {value!r}")
    return value


def _allocator(name: str, value: Any) -> Any:
    if _str(name, value).lower() not in ALLOCATORS:
        raise ValueError(f"client option {name!r} must be one of {ALLOCATORS}, got {value!r}")
    return value.lower()


def _fraction(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"client option {name!r} takes a float, got {value!r}")
    if not 0 < value <= 1:
        raise ValueError(f"client option {name!r} must be in (0, 1], got {value}")
    return float(value)  # sent as a float: an int would be read with the wrong type


def _int_list(name: str, value: Any) -> Any:
    numbers = [_integer(v) for v in value] if isinstance(value, (list, tuple)) else None
    if numbers is None or not all(n is not None and 0 <= n < 1 << 31 for n in numbers):
        raise TypeError(f"client option {name!r} takes a list of device numbers, got {value!r}")
    return numbers


# 65,536 CPU devices is far past any use; 100,000 took a minute to create.
_CPU_DEVICES = _int(1, 1 << 16)

KNOWN: dict[str, dict[str, Check]] = {
    "cpu": {"cpu_device_count": _CPU_DEVICES, "asynchronous": _bool},
    # jax's CUDA/ROCm plugin options (jax/_src/xla_bridge.py passes these).
    "cuda": {
        "platform_name": _str,
        "allocator": _allocator,
        "memory_fraction": _fraction,
        "preallocate": _bool,
        "collective_memory_size": _int(0, (1 << 63) - 1),
        "visible_devices": _int_list,
        "node_id": _int(0, 1 << 20),
        "num_nodes": _int(1, 1 << 20),
        "enable_mock_nccl": _bool,
        "mock_gpu_topology": _str,
        "should_stage_host_to_device_transfers": _bool,
        "abort_collectives_on_failure": _bool,
        "use_tfrt_gpu_client": _bool,
        "partition_index": _int(0, 1 << 20),
    },
}
KNOWN["rocm"] = KNOWN["cuda"]


def checked_options(platform: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` with each known one checked (and converted where it must be)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    known = KNOWN.get(platform, {})
    out = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise TypeError(f"option names must be str, got {name!r}")
        check = known.get(name)
        out[name] = check(name, value) if check is not None else value
    return out


# The options a CPU build reads as "this process is one of several": 0.81 and
# 0.106 take num_nodes / node_id, 0.115 process_id.
_PROCESS_OPTIONS = ("num_nodes", "node_id", "process_id")


def refuse_multiprocess_cpu(platform: str, options: Mapping[str, Any]) -> None:
    """``UnsupportedError`` for a CPU client asked to be one of several processes.

    No CPU build runs across processes through the C API: 0.81 and 0.106
    accept ``num_nodes`` / ``node_id`` and give every process a private world
    (a 2-process psum returns each process's own value), and 0.115 fails the
    first cross-process program. So the request is refused before the plugin
    can split the world silently.
    """
    if platform != "cpu":
        return
    asked = {k: options[k] for k in _PROCESS_OPTIONS if k in options}
    many = False
    for key, value in asked.items():  # a wrong value is said as such, not as "several"
        number, alone = _integer(value), 1 if key == "num_nodes" else 0
        if number is None:
            raise TypeError(f"client option {key!r} must be an int, not {type(value).__name__}")
        if number < alone:
            raise ValueError(f"client option {key!r} cannot be {number}")
        many = many or number != alone
    if many:
        raise UnsupportedError(
            f"a CPU client cannot be one of several processes ({asked}): no CPU plugin build "
            "runs across processes through the PJRT C API (0.81 and 0.106 would give each "
            "process a private world, 0.115 fails cross-process programs); see "
            "docs/distributed.md"
        )
