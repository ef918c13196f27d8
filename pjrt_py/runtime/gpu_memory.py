"""How much GPU memory a client takes: pjrt_py's default and jax's environment variables.

XLA's GPU client reserves a share of the device's memory for its allocator
when it is created. The CUDA plugin's own default is to preallocate 75 %
(measured on an H100: 59.4 GiB at ``Client("cuda")``), after which torch in the
same process ran out of memory allocating 1 GiB. pjrt_py is often embedded
next to torch or jax, so its default differs from the plugin's:

* **Default: no preallocation** (``preallocate=False``). The allocator (XLA's
  BFC allocator) grows on demand and keeps what it took for reuse, up to
  ``memory_fraction`` of the device (the plugin's default fraction when none
  is given). torch and pjrt_py then share one GPU; a process that wants all of
  it preallocated asks for it (``XLA_PYTHON_CLIENT_PREALLOCATE=true``, or
  ``options={"preallocate": True}``).
* **jax's environment variables** are read with jax's meanings, so one
  setting governs both in a process that uses both:

  - ``XLA_PYTHON_CLIENT_PREALLOCATE``: ``false``, ``False`` or ``0`` turn
    preallocation off, anything else on;
  - ``XLA_CLIENT_MEM_FRACTION`` (or the older
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``; both at once is an error, as in jax):
    the share of the device the allocator may take, in (0, 1];
  - ``XLA_PYTHON_CLIENT_ALLOCATOR``: ``default``, ``platform``, ``bfc``,
    ``cuda_async`` or ``vmm`` (``platform`` allocates and frees exactly what
    is used: slow, smallest footprint);
  - ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB``: memory for collectives.

  A fraction without a preallocation setting is a cap on growth here, where
  in jax (which preallocates by default) it is also the amount taken at once.

* **Precedence**: ``Client(options=...)`` over the environment over the
  default. CPU plugins read none of this: the variables are ignored there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

GPU_PLATFORMS = frozenset({"cuda", "rocm"})

# What jax 0.12 and the CUDA plugin 0.11.2 take ("address" is new there; the
# plugin names the same six when refusing another, measured without a GPU).
ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm", "address")

# Boolean variables jax also reads into client options, "0" or "1" ("1" on).
_FLAGS = {
    "XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE": "abort_collectives_on_failure",
    "XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT": "use_tfrt_gpu_client",
}

# What pjrt_py asks for where neither the caller nor the environment says.
DEFAULTS: dict[str, Any] = {"preallocate": False}

_FRACTION, _OLD_FRACTION = "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"


def from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The GPU client options jax's environment variables ask for (see the module doc)."""
    options: dict[str, Any] = {}
    allocator = environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "")
    if allocator:
        if allocator.lower() not in ALLOCATORS:
            raise ValueError(
                f"XLA_PYTHON_CLIENT_ALLOCATOR must be one of {', '.join(ALLOCATORS)}, "
                f"got {allocator!r}"
            )
        options["allocator"] = allocator.lower()
    fraction, old = environ.get(_FRACTION, ""), environ.get(_OLD_FRACTION, "")
    if fraction and old:
        raise ValueError(f"{_FRACTION} and {_OLD_FRACTION} are both set: keep one (the first)")
    name = _FRACTION if fraction else _OLD_FRACTION
    if fraction or old:
        text = fraction or old
        try:
            options["memory_fraction"] = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number in (0, 1], got {text!r}") from None
    preallocate = environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "")
    if preallocate:
        options["preallocate"] = preallocate not in ("false", "False", "0")
    for variable, option in _FLAGS.items():  # only where set: older plugins lack them
        text = environ.get(variable, "")
        if text:
            try:
                options[option] = bool(int(text))
            except ValueError:
                raise ValueError(f"{variable} must be 0 or 1, got {text!r}") from None
    megabytes = environ.get("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "")
    if megabytes:
        try:
            options["collective_memory_size"] = int(megabytes) << 20
        except ValueError:
            raise ValueError(
                f"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB must be a whole number, "
                f"got {megabytes!r}"
            ) from None
    return options


def with_memory_policy(
    platform: str, options: Any, environ: Mapping[str, str] | None = None
) -> Any:
    """``options`` completed with the environment's and pjrt_py's memory settings.

    Parameters
    ----------
    platform : str
        The plugin's platform (``"cuda"``, ``"rocm"``, ``"cpu"``, ...); only
        GPU platforms are changed.
    options : Mapping or None
        The caller's client options; they win over everything else. Anything
        but a mapping is returned as is, for the option check to refuse.
    environ : Mapping, optional
        The environment to read (default ``os.environ``).

    Returns
    -------
    Mapping
        The options to create the client with.

    Raises
    ------
    ValueError
        If an environment variable has a value jax would refuse.
    """
    if options is None:
        options = {}
    if platform not in GPU_PLATFORMS or not isinstance(options, Mapping):
        return options
    merged = dict(DEFAULTS)
    merged.update(from_environment(os.environ if environ is None else environ))
    merged.update(options)
    return merged
