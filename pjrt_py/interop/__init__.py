"""The interop layer: arrays in and out of numpy, jax and torch.

DLPack both ways (with the stream protocol on GPUs), foreign arguments,
``to_jax`` / ``to_torch``, and jax's typing rules that ``pjrt_py.jit``
follows. Built on the runtime layer only (docs/architecture.md).
"""
