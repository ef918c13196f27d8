"""The compiled cffi module: ``ffi`` and ``lib``, nothing else."""

from .._pjrt_cffi import ffi, lib

__all__ = ["ffi", "lib"]
