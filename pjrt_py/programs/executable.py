"""Executables: a compiled program and the ways to run it.

``Executable.execute_async`` is native (``native/executable.c``): a call whose
arguments are all live Buffers (or one-buffer promises) of this client with
the compiled shapes and dtypes runs from call to promise in C. Every other
call comes to ``Executable._execute_async_slow`` here, which checks the
arguments (see ``pjrt_py.arguments``), transfers host values, and handles
donation, ordered execution and several devices.

What pjrt_py knows about the program (signature, outputs, inspection) lives
in a ``CompiledProgram``, shared by the executables
``Client.compile`` returns for one cached program.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from ..runtime.buffer import Buffer
from ..runtime.errors import PjrtError
from ..runtime.promise import BufferPromise
from . import effects
from .arguments import checked_row, non_donatable_indices
from .compiled import CompiledProgram, MemoryStats
from .program_info import ProgramInfo

if TYPE_CHECKING:
    from ..runtime.device import Memory

__all__ = ["Executable", "MemoryStats"]


class Executable(ProgramInfo, _core.ExecutableCore):
    """A program compiled for a client's device(s). Made by ``Client.compile``
    or ``Client.deserialize``.

    Call ``execute(*args)`` for outputs that are ready on return, or
    ``execute_async(*args)`` for a ``BufferPromise`` at once.
    Arguments may be ``Buffer``, promises of one buffer, or
    numpy arrays / scalars (transferred to the executable's device first).

    Arguments are checked against ``input_signature`` before anything
    reaches the plugin: a wrong count, shape or dtype raises ``TypeError``.
    Python scalars take the dtype of their parameter, as JAX's weakly typed
    scalars do; numpy arrays and buffers must match exactly.

    ``copy.copy`` / ``copy.deepcopy`` give another executable sharing the
    compiled program (deleting one leaves the other usable); pickling raises
    ``TypeError``: use ``serialize``.

    Parameters
    ----------
    program : CompiledProgram
        The loaded program and what pjrt_py read from it (name, devices,
        signature, outputs). ``Client.compile`` and ``Client.deserialize``
        make it; the executables of one cached program share it.
    """

    def __init__(self, program: CompiledProgram) -> None:
        self._program = program
        self._signature = program.signature
        # Ordered execution (pjrt_py.effects): the program text and options,
        # set by Client.compile, from which a token-threaded form is compiled
        # on first use; _ordered makes every execution ordered.
        self._source: tuple[str, bytes, bool] | None = None  # text, options, isolate
        self._token_form: Executable | None = None
        self._ordered = False
        # Device address -> the memory parameters are read from there (see
        # arguments.parameter_memory).
        self._parameter_memories: dict[int, Memory | None] = {}
        self._host_routes: Any = None  # jax's host callbacks this program calls (jit)
        # Calls that cannot take the native path: donation, parameters in a
        # layout other than the default (checked in Python). A program over
        # several devices takes it through execute_sharded(_async) only.
        layouts = program.signature is not None and any(
            not spec.default_layout for spec in program.signature
        )
        # Parameters read from another memory than the default (jax's host
        # offloading) are checked in Python too.
        kinds = program.signature is not None and any(
            spec.memory_kind is not None for spec in program.signature
        )
        blocked = bool(program.donated) or layouts or kinds
        devices, memories = program.dispatch_places()
        self._attach(
            program._handles(),
            program.client,
            program.expected_metas(),
            program.out_metas,
            program.num_outputs,
            blocked,
            devices,
            memories,
        )

    # -- lifetime -------------------------------------------------------
    def _live(self) -> CompiledProgram:
        if self._loaded is None:
            raise ValueError("executable has been deleted")
        reason = self.client._closed_reason("executable")
        if reason is not None:
            raise ValueError(reason)
        return self._program

    @property
    def is_deleted(self) -> bool:
        """Whether ``delete`` (or ``close``) has been called on this executable."""
        return self._loaded is None

    def delete(self) -> None:
        """Release this executable. Idempotent; later calls on it raise.

        The compiled program is freed once nothing holds it: executables
        returned by ``Client.compile`` for the same program share it with the
        client's compile cache (``client.compile_cache.clear()`` drops the
        cache's hold), and a call running in another thread holds it until it
        returns. Deleting one never breaks another.
        """
        self._detach()
        if self._program.loaded is not None:
            # Keep what was read (name, outputs, devices); drop the handle.
            self._program = copy.copy(self._program)
            self._program.loaded = None

    close = delete

    def _share(self) -> Executable:
        """Another executable for the same compiled program."""
        other = Executable(self._live())
        other._signature, other._source = self._signature, self._source
        return other

    def __copy__(self) -> Executable:
        return self._share()

    def __deepcopy__(self, memo: Any) -> Executable:
        return self._share()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a pjrt_py.Executable cannot be pickled: use exe.serialize() and "
            "client.deserialize(data)"
        )

    def __enter__(self) -> Executable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    # -- execution ------------------------------------------------------
    def _execute_async_slow(
        self, *args: Any, ordered: bool = False, non_donatable: Iterable[int] | None = None
    ) -> BufferPromise:
        """execute_async for every call the native path does not take."""
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be True or False, got {ordered!r}")
        self._live()
        if len(self.devices) != 1:
            raise ValueError(
                f"{self.name} runs on {len(self.devices)} devices: call "
                f"execute_sharded() with one argument list per device"
            )
        if ordered or self._ordered:
            return self._dispatch_ordered(args, non_donatable)
        return self._dispatch_rows([args], non_donatable)[0]

    def _dispatch_rows(
        self, arg_lists: Sequence[Sequence[Any]], non_donatable: Iterable[int] | None
    ) -> list[BufferPromise]:
        """Check, transfer, run on every device, and retire donated arguments."""
        many = len(self.devices) > 1
        rows = [
            checked_row(self, args, d, f" on device {i}" if many else "")
            for i, (args, d) in enumerate(zip(arg_lists, self.devices, strict=True))
        ]
        refused = non_donatable_indices(self._donated, rows, non_donatable)
        promises: list[BufferPromise] = self._run(rows, refused)
        self._retire_donated(rows, refused)
        return promises

    def _retire_donated(self, rows: list[list[Buffer]], refused: list[int]) -> None:
        """Mark the arguments PJRT consumed by donation dead in Python too.

        PJRT invalidates a donated buffer but the handle is still ours; it is
        released here, so any later use raises instead of reaching freed or
        reused memory. Asking PJRT (rather than assuming) covers a plugin
        that declines to donate.
        """
        for i in self._donated:
            if i in refused:
                continue
            for row in rows:
                if not row[i].is_deleted and row[i]._pjrt_deleted():
                    row[i]._retire_donated()

    # -- ordered execution (pjrt_py.effects) ----------------------------
    def _ordered_form(self) -> Executable:
        """The token-threaded form of this program (compiled once, then kept)."""
        form = self._token_form
        if form is None:
            if self._source is None:
                raise ValueError(
                    f"{self.name}: ordered execution compiles a token-threaded form of "
                    f"the program, which needs the StableHLO text it was compiled from "
                    f"(this executable was deserialized, or compiled from bytecode without jax "
                    f"installed to read it as text)"
                )
            program, options, isolate = self._source
            form = self.client.compile(
                effects.with_runtime_token(program), compile_options=options, isolate=isolate
            )
            self._token_form = form
        return form

    def _dispatch_ordered(
        self, args: tuple[Any, ...], non_donatable: Iterable[int] | None
    ) -> BufferPromise:
        form = self._ordered_form()
        device = self.devices[0]
        row = checked_row(self, args, device)  # checked against this program's names
        token = effects.token_for(self.client, device)
        (promise,) = form._dispatch_rows([[*row, token]], non_donatable)
        try:
            *outputs, token_out = promise._buffers
        except PjrtError:
            # Failed as it was dispatched (a plugin runs cheap programs
            # inline): no outputs, no new token. The error stays in the
            # promise, as for any execute_async, and the thread's token is
            # unchanged, so later ordered calls run (docs/effects.md).
            return promise
        effects.set_token(self.client, token_out, device)
        if not outputs:
            # No outputs of its own: the promise is the token's readiness.
            return BufferPromise((token_out,), 0)
        return BufferPromise(tuple(outputs), len(outputs))

    def _execute_sharded_async_slow(
        self,
        per_device_args: Sequence[Sequence[Any]],
        *,
        non_donatable: Iterable[int] | None = None,
    ) -> list[BufferPromise]:
        """execute_sharded_async for every call the native path does not take.

        ``execute_sharded_async`` and ``execute_sharded`` are native
        (``native/sharded.c``): a call whose arguments are all live Buffers (or
        one-buffer promises) of this client, on their row's device, with the
        compiled shapes and dtypes, runs from call to promises in C. Every
        other call comes here, which checks, explains and transfers.
        """
        self._live()
        n = len(self.devices)
        if isinstance(per_device_args, (Buffer, BufferPromise, np.ndarray)) or not isinstance(
            per_device_args, Sequence
        ):
            raise TypeError("execute_sharded takes a list with one argument list per device")
        if len(per_device_args) != n:
            raise ValueError(
                f"{self.name} runs on {n} device(s) and takes one argument list per "
                f"device; got {len(per_device_args)} list(s)"
            )
        for i, args in enumerate(per_device_args):
            if isinstance(args, (str, bytes, np.ndarray)) or not isinstance(args, Sequence):
                raise TypeError(
                    f"execute_sharded: entry {i} must be a list of arguments, "
                    f"got {type(args).__name__}"
                )
        return self._dispatch_rows(per_device_args, non_donatable)

    def execute(
        self, *args: Any, ordered: bool = False, non_donatable: Iterable[int] | None = None
    ) -> Any:
        """Run the program; outputs are ready on return.

        Returns a Buffer (one output), a tuple of Buffers, or None (no outputs).

        Parameters
        ----------
        *args : Buffer, BufferPromise, numpy array or scalar
            One argument per parameter, checked against
            ``input_signature``; host values (and other frameworks'
            arrays, through DLPack) are placed on the executable's device first.
        ordered : bool, optional
            Start only after every earlier ordered execution of this thread
            has completed, on any device (see ``pjrt_py.effects``).
            An executable compiled with ``ordered=True`` always runs ordered.
        non_donatable : iterable of int, optional
            Indices of donated parameters this call must not donate: their
            buffers stay valid.

        Returns
        -------
        Buffer, tuple of Buffer or None
            The outputs: one Buffer for one output, a tuple for several, None
            for none.

        Raises
        ------
        TypeError
            For a wrong argument count, shape or dtype, an argument of a type
            it cannot take, a Python scalar of another kind than its parameter
            (``2.5`` for an int), or a ``non_donatable`` that is not a sequence
            of indices.
        ValueError
            If an argument is a dead buffer, another client's, or on another
            device; if a Python scalar does not fit its parameter's dtype or
            a ``non_donatable`` entry is not a parameter index; if the program
            runs on several devices (use ``execute_sharded``); if
            ``ordered`` is asked of an executable without its program text
            (deserialized, or compiled from bytecode without jax to read it as
            text); or if the executable has been deleted or its client closed.
        PjrtError
            If the execution fails.
        """
        if ordered is not False or non_donatable is not None:
            return self.execute_async(*args, ordered=ordered, non_donatable=non_donatable).value()
        return self.execute_async(*args).value()  # keywords would leave the native path

    def __call__(self, *args: Any) -> Any:
        return self.execute(*args)

    def __repr__(self) -> str:
        state = "deleted" if self.is_deleted else f"{self.num_outputs} output(s)"
        return f"<Executable {self.name!r} {state}>"
