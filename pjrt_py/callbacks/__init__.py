"""The callbacks layer: Python and C code the plugin calls while a program runs.

FFI targets (``register_ffi_target``), host callbacks
(``register_callback``) and the bridge that runs jax's
``pure_callback`` / ``debug.print`` through them. Built on the client
(docs/architecture.md).
"""
