"""jax.export's ``Exported``, compiled as jax's own ``Exported.call`` runs it.

``Client.compile(exported)`` takes the object ``jax.export.export(f)(...)``
(or ``jax.export.deserialize(data)``) returns. Its program is the portable
artifact in ``mlir_module_serialized``; what else decides how to run it:

- ``platforms``: the program is lowered for these only (lowering rules
  differ by platform), so a client of another platform refuses it, as
  ``Exported.call`` does.
- A program lowered for several platforms takes the platform's index as an
  extra first parameter (``jax.global_constant = "_platform_index"``) and
  picks its code with it. pjrt_py binds that parameter to this client's
  platform: the executable takes the same arguments as a one-platform
  export (``exported.in_avals``).
- Effects: a program with jax's effects threads tokens that only jax's
  runtime supplies. Such an export is refused.

The executable takes the flat arguments (``exported.in_avals``, in
``exported.in_tree`` order) and gives the flat results (``out_avals``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime.errors import UnsupportedError
from .mlir_text import read_main, wrap_main

PLATFORM_INDEX = '"_platform_index"'  # the attribute value jax marks the parameter with
_BODY = "@pjrt_py_exported_main"
_INDEX = "%pjrt_py_platform_index"


def is_exported(program: Any) -> bool:
    """Whether ``program`` is a ``jax.export.Exported``."""
    kind = type(program)
    return kind.__name__ == "Exported" and kind.__module__.startswith("jax")


def exported_text(exported: Any, platform: str, read: Callable[[bytes], str | None]) -> str:
    """The program of ``exported`` for ``platform``, as MLIR text to compile.

    ``read`` turns the artifact into text (the client's bytecode reader).
    """
    platforms = tuple(str(p).lower() for p in exported.platforms)
    if platform not in platforms:
        raise ValueError(
            f"this jax.export.Exported was lowered for {platforms}, not for this client's "
            f"{platform!r} (lowering differs by platform): export it with "
            f"platforms=[..., {platform!r}]"
        )
    effects = tuple(exported.ordered_effects) + tuple(exported.unordered_effects)
    if effects:
        raise UnsupportedError(
            f"this jax.export.Exported has effects {effects}, whose tokens only jax's "
            "runtime threads; pjrt_py compiles exports without effects"
        )
    text = read(bytes(exported.mlir_module_serialized))
    if text is None:
        raise UnsupportedError(
            "cannot read this jax.export.Exported's program: jax's MLIR bindings (jaxlib) "
            "could not deserialize it (is it from a newer jax than the one installed?)"
        )
    if len(platforms) > 1:
        text = bind_platform_index(text, platforms.index(platform))
    return text


def bind_platform_index(text: str, index: int) -> str:
    """``text`` with ``@main``'s platform index parameter made a constant ``index``."""
    main = read_main(text)
    if (
        main is None
        or not main.params
        or PLATFORM_INDEX not in main.params[0]
        or main.param_types[0] != "tensor<i32>"
    ):
        raise ValueError(
            "a jax.export.Exported for several platforms takes its platform index as "
            "@main's first parameter (an i32 marked jax.global_constant = "
            '"_platform_index"); this one does not'
        )
    return wrap_main(
        text,
        main,
        _BODY,
        params=main.params[1:],
        args=[_INDEX, *main.names[1:]],
        keep=list(range(len(main.result_types))),
        prologue=(f"{_INDEX} = stablehlo.constant dense<{index}> : tensor<i32>",),
    )


__all__ = ["bind_platform_index", "exported_text", "is_exported"]
