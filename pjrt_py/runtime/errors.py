"""Exceptions raised by pjrt_py.

``PjrtError`` is the base of every error that comes from a plugin; there is
one subclass per PJRT error code, each carrying ``.code`` (the numeric PJRT
code) and the plugin's message. Argument errors found in Python before any
PJRT call are plain ``TypeError`` / ``ValueError``.

This module imports nothing of pjrt_py's: it is the bottom layer, and the
native core (``pjrt_py._core``) makes its exceptions from ``BY_CODE``.
"""

from __future__ import annotations

import signal as _signal


class PjrtError(RuntimeError):
    """An error reported by a PJRT plugin.

    Attributes
    ----------
    code : int
        The PJRT error code (``PJRT_Error_Code``; absl status codes).
    message : str
        The plugin's message.
    """

    code: int = 2  # UNKNOWN

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class CancelledError(PjrtError):
    code = 1


class UnknownError(PjrtError):
    code = 2


class InvalidArgumentError(PjrtError):
    code = 3


class DeadlineExceededError(PjrtError):
    code = 4


class NotFoundError(PjrtError):
    code = 5


class AlreadyExistsError(PjrtError):
    code = 6


class PermissionDeniedError(PjrtError):
    code = 7


class ResourceExhaustedError(PjrtError):
    code = 8


class FailedPreconditionError(PjrtError):
    code = 9


class AbortedError(PjrtError):
    code = 10


class OutOfRangeError(PjrtError):
    code = 11


class UnimplementedError(PjrtError):
    code = 12


class InternalError(PjrtError):
    code = 13


class UnavailableError(PjrtError):
    code = 14


class DataLossError(PjrtError):
    code = 15


class UnauthenticatedError(PjrtError):
    code = 16


class UnsupportedError(UnimplementedError):
    """The plugin's API version has no such function (its slot lies beyond
    ``PJRT_Api.struct_size``). The function is never called through."""


class PluginLoadError(PjrtError):
    """A file could not be loaded as a PJRT plugin."""


class CompilerCrashError(PjrtError):
    """The compiler died: an isolated compile's helper process (see
    ``pjrt_py.isolate``) was killed by a signal (``SIGSEGV``, or
    ``SIGABRT`` from a failed ``CHECK``) or exited while compiling.

    Attributes
    ----------
    signal : signal.Signals or None
        The signal that killed the helper, or None if it exited.
    returncode : int or None
        The helper's exit status as ``subprocess`` reports it (``-signal``).
    output : str
        The tail of the helper's stderr and stdout, where XLA prints its
        ``CHECK`` failure message (also at the end of the message).
    """

    code = 13  # INTERNAL

    def __init__(
        self,
        message: str,
        code: int | None = None,
        *,
        signal: _signal.Signals | None = None,
        returncode: int | None = None,
        output: str = "",
    ) -> None:
        super().__init__(message, code)
        self.signal = signal
        self.returncode = returncode
        self.output = output


class ProgramError(PjrtError):
    """The program does not parse or verify (``pjrt_py.program_errors``).

    The message gives each diagnostic as ``NAME:LINE:COLUMN: error: ...``
    with the source line and a caret under the column; ``code`` is the one
    the plugin reported.

    Attributes
    ----------
    diagnostics : list of tuple
        ``(line, column, severity, message)`` for each diagnostic, 1-based
        (0 where the compiler gave no position).
    source : str
        The program text the positions refer to.
    notes : list of str
        The plugin's other lines, kept as they were.
    """

    def __init__(
        self,
        message: str,
        code: int | None = None,
        *,
        diagnostics: list[tuple[int, int, str, str]] | None = None,
        source: str = "",
        notes: list[str] | None = None,
    ) -> None:
        super().__init__(message, code)
        self.diagnostics = diagnostics or []
        self.source = source
        self.notes = notes or []


class SerializationError(ValueError):
    """Bytes given to ``Client.deserialize`` are not a pjrt_py executable, are
    damaged, or were made by a different plugin build than this client's."""


class ScalarOverflowError(OverflowError, ValueError):
    """A Python number that does not fit the parameter it is passed for
    (``2**40`` for an int32, ``2**200`` for a float32). An ``OverflowError``,
    as numpy's ``np.int32(2**40)`` and jax's tracing raise, and a
    ``ValueError``, as pjrt_py raised it first."""


# PJRT error code -> exception class (read by the native core).
BY_CODE: dict[int, type[PjrtError]] = {
    cls.code: cls
    for cls in (
        CancelledError,
        UnknownError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}
