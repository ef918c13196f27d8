"""The programs layer: from StableHLO text to a loaded executable, and running it.

Reading and checking MLIR text, compile options, the compiler with its
caches and crash-isolated helper, serialization, executables with their
arguments, donation, ordered effects and dynamic shapes. Built on the
runtime and interop layers (docs/architecture.md).
"""
