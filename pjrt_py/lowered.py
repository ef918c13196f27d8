"""``Lowered``: a function ``pjrt_py.jit`` traced and lowered to StableHLO for one call signature.

The stage between tracing and compiling, as in jax's ahead-of-time API:
``jitted.lower(*args)`` gives one; ``as_text()`` shows the program and
``compile()`` compiles it on the function's client.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .callbacks import jax_callbacks as _jax_callbacks
from .client import Client
from .programs.executable import Executable
from .runtime.device import Device


class Lowered:
    """A function lowered to StableHLO for one call signature (seed 004's stage 2).

    Made by ``Jitted.lower`` (and by a call with a new signature).

    Parameters
    ----------
    client : Client
        The client that compiles the program (the jitted function's).
    text : str
        The StableHLO (MLIR text) to compile: jax's, with its host callbacks
        pointed at pjrt_py's router and, for ordered effects, ``@main``'s
        token parameters and results made inside.
    in_tree : PyTreeDef
        The structure of the non-static arguments, ``(args, kwargs)``.
    out_tree : PyTreeDef
        The structure of the outputs.
    names : list of str
        A name per flat argument (``x``, ``params['w']``), given to the
        compiled executable's parameters for its argument errors.
    routes : Routes, optional
        jax's host callbacks the program calls (``pure_callback``,
        ``io_callback``, ``debug.print``), kept by the executable.
    ordered : bool, optional
        Whether the program has jax's ordered effects: every execution of the
        compiled executable is then ordered (see ``pjrt_py.effects``).
    """

    def __init__(
        self,
        client: Client,
        text: str,
        in_tree: Any,
        out_tree: Any,
        names: list[str],
        routes: _jax_callbacks.Routes | None = None,
        ordered: bool = False,
    ):
        self._client = client
        self._routes = routes  # jax's host callbacks, while an executable may call them
        self._ordered = ordered  # jax's ordered effects: executions run in order
        self._text = text
        self.in_tree = in_tree  # structure of the (non-static) arguments
        self.out_tree = out_tree  # structure of the outputs
        self.arg_names = names
        self.weak_outputs: tuple[bool, ...] = ()  # outputs jax returns weakly typed
        self.key_outputs: tuple[Any, ...] = ()  # each output's PRNG key dtype, or None
        self.device: Device | None = None  # where the lowering's Buffers were (jitted.lower)

    def as_text(self) -> str:
        """The StableHLO (MLIR text) handed to the compiler.

        Returns
        -------
        str
            The program text, as ``compile`` compiles it.
        """
        return self._text

    def compile(self, device: Device | None = None) -> Executable:
        """Compile for the client: an ``Executable`` taking the
        flattened array arguments (static ones removed), in ``in_tree`` order.

        Parameters
        ----------
        device : Device, optional
            The device it runs on. If None: the device of the Buffers it was
            lowered for (as jax's AOT compiles for its arrays' device), else
            the client's default device.

        Returns
        -------
        Executable
            The compiled program, its parameters named after the arguments
            (``arg_names``); ordered on every execution if the function has
            jax's ordered effects. The client's compile cache may supply it.

        Raises
        ------
        PjrtError
            With the compiler's message, if the plugin refuses the program.
        """
        exe = self._client.compile(self._text, device=device if device is not None else self.device)
        signature = exe.input_signature
        if signature is not None and len(signature) == len(self.arg_names):
            named = zip(self.arg_names, signature, strict=True)
            exe._signature = [dataclasses.replace(s, name=name) for name, s in named]
        if self._routes is not None:
            exe._host_routes = self._routes
        if self._ordered:
            exe._ordered = True
        return exe


__all__ = ["Lowered"]
