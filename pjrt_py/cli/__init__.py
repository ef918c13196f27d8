"""The ``pjrt-py`` command: one module per command, ``app`` parses and dispatches."""

from __future__ import annotations

from .app import main

__all__ = ["main"]
