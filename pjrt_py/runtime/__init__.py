"""The runtime layer: everything that talks to the plugin through ``_core``.

Plugins and their loading, the client's devices and memories, buffers,
promises, transfers, errors and dtypes. Nothing here knows about programs,
DLPack or callbacks; every other layer builds on this one
(docs/architecture.md). This ``__init__`` imports nothing, so importing one
module of the layer never drags in the others.
"""
