"""A client's reader of bytecode programs: their text, read out of process.

Damaged bytecode crashes or hangs MLIR's reader, jax's and the plugins'
alike (one flipped byte is enough: ``docs/reliability.md``), so a client
parses no bytecode in its own process where jax is installed. The compile
helper process (``pjrt_py.programs.isolate``) reads it as text, and the
text is what gets compiled: checked like any text, and handed to the plugin
in pjrt_py's own serialization. Without jax the bytes go to the plugin as
they are. Each program is read once (a small memo).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

from ..runtime.client import RuntimeClient
from .isolate import IsolatedCompiler
from .mlir_text import bytecode_to_text, can_read_bytecode

MEMO = 16  # programs whose text is kept


class BytecodeReader:
    """Reads bytecode programs as text through ``helper``.

    Attributes
    ----------
    in_process : bool
        Read here instead: True in the helper process, which is the isolation.
    """

    def __init__(self, helper: IsolatedCompiler) -> None:
        self.helper = helper
        self.in_process = False
        self._texts: OrderedDict[bytes, str | None] = OrderedDict()

    def plan(
        self, client: RuntimeClient, program: bytes, isolate: bool
    ) -> tuple[str | bytes, bool]:
        """What to compile for bytecode ``program``, and whether in isolation:
        its text where it can be read. Bytecode jax cannot read (a newer
        StableHLO than jaxlib's, or damage) is compiled in the helper, so the
        plugin's verdict comes back as an error, except for a client of
        several processes, which no helper can join."""
        text = self.text(program)
        if text is not None:
            return text, isolate
        if can_read_bytecode() and not client._spans_processes:
            return program, True
        return program, isolate

    def text(self, program: bytes) -> str | None:
        """The text of ``program`` (``mlir_text.bytecode_to_text``), or None."""
        texts = self._texts
        try:  # another thread may drop it in between: then it is read again
            texts.move_to_end(program)
            return texts[program]
        except KeyError:
            pass
        if self.in_process or not can_read_bytecode():
            text = bytecode_to_text(program)
        else:
            text = self.helper.read_bytecode(program)
        texts[program] = text
        while len(texts) > MEMO:
            with contextlib.suppress(KeyError):  # a thread beside this one popped it
                texts.popitem(last=False)
        return text


__all__ = ["BytecodeReader"]
