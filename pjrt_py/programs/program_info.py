"""What an executable's compiled program is: names, devices, signature, outputs and analyses.

``ProgramInfo`` is the read-only side of ``pjrt_py.Executable``, kept apart
from running it (``pjrt_py.programs.executable``): every property and
method here reads the ``CompiledProgram`` the executable holds, which
``Client.compile`` or ``Client.deserialize`` made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .compiled import CompiledProgram, MemoryStats
from .signature import ArgSpec

if TYPE_CHECKING:
    from ..runtime.device import Device


class ProgramInfo:
    """The program side of an ``Executable`` (see ``pjrt_py.Executable``)."""

    _program: CompiledProgram
    _signature: list[ArgSpec] | None

    if TYPE_CHECKING:

        def _live(self) -> CompiledProgram: ...

    @property
    def name(self) -> str:
        """The program's name, as the plugin reports it (``PJRT_Executable_Name``)."""
        return self._program.name

    @property
    def num_outputs(self) -> int:
        """How many outputs one execution gives, per device."""
        return self._program.num_outputs

    @property
    def devices(self) -> list[Device]:
        """The devices the program runs on, in execution order.

        One per replica and partition (replicas x partitions of the device
        assignment); ``execute_sharded`` takes one argument list per entry.
        """
        return self._program.devices

    @property
    def num_replicas(self) -> int:
        """The replica count the program was compiled for (1 where the plugin cannot tell)."""
        return self._program.num_replicas

    @property
    def num_partitions(self) -> int:
        """The partition count the program was compiled for (1 where the plugin cannot tell)."""
        return self._program.num_partitions

    @property
    def _donated(self) -> tuple[int, ...]:
        return self._program.donated

    @property
    def num_args(self) -> int | None:
        """The parameter count, or None where neither the program nor the plugin tells."""
        return None if self._signature is None else len(self._signature)

    @property
    def input_signature(self) -> list[ArgSpec] | None:
        """Name, shape and dtype of each parameter, as compiled (None if unknown).

        Names come from ``jax.arg_info`` or the ``%name`` in a text program's
        ``@main``; where there is no text (bytecode), parameters are named by
        position and shapes come from the compiled module.
        """
        return None if self._signature is None else list(self._signature)

    @property
    def output_dtypes(self) -> list[np.dtype[Any]]:
        """The numpy dtype of each output, as the plugin reports it.

        Reading it raises ``ValueError`` once the executable is deleted or its
        client closed.
        """
        return self._live().output_dtypes()

    @property
    def output_shapes(self) -> list[tuple[int, ...]]:
        """The shape of each output, as the plugin reports it.

        Reading it raises ``ValueError`` once the executable is deleted or its
        client closed.
        """
        return self._live().output_shapes()

    @property
    def fingerprint(self) -> str | None:
        """The plugin's fingerprint of the compiled program, or None if it has none.

        Per the PJRT header, compiling the same program with the same options
        and compiler gives the same fingerprint.
        """
        return self._live().fingerprint()

    def optimized_program(self) -> tuple[str, bytes]:
        """``(format, bytes)`` of the program after optimization.

        XLA plugins answer ``"hlo_with_config"`` (a serialized
        ``HloModuleProtoWithConfig``) or ``"hlo"`` (an ``HloModuleProto``).

        Returns
        -------
        tuple of (str, bytes)
            The format name and the serialized program.

        Raises
        ------
        UnimplementedError
            If the plugin cannot give the optimized program:
            ``UnsupportedError`` (a subclass) where its API has no
            ``PJRT_Executable_OptimizedProgram``.
        ValueError
            If the executable has been deleted or its client closed.
        """
        return self._live().optimized_program()

    def as_text(self) -> str:
        """The optimized program as HLO text.

        PJRT hands over a protobuf, not text; printing it takes XLA's HLO
        printer, which pjrt_py borrows from ``jaxlib`` when it is installed.
        Without jaxlib this raises ``UnsupportedError``;
        ``optimized_program`` still returns the raw module.

        Returns
        -------
        str
            The HLO module, as XLA's printer writes it.

        Raises
        ------
        UnsupportedError
            If jaxlib is not installed, or its printer cannot read this
            plugin's module (another XLA version, say).
        UnimplementedError
            If the plugin cannot give the optimized program (see
            ``optimized_program``).
        ValueError
            If the executable has been deleted or its client closed.
        """
        return self._live().as_text()

    def cost_analysis(self) -> dict[str, Any] | None:
        """The plugin's cost estimates (``flops``, ``bytes accessed``, ...), or None.

        Returns
        -------
        dict or None
            The plugin's ``PJRT_Executable_GetCostAnalysis`` properties by
            name (numbers, strings, bools or lists of ints, as the plugin
            types them); None where the plugin does not implement it.

        Raises
        ------
        ValueError
            If the executable has been deleted or its client closed.
        """
        return self._live().cost_analysis()

    def memory_analysis(self) -> MemoryStats | None:
        """Compiled memory statistics, or None where the plugin has none.

        Returns
        -------
        MemoryStats or None
            Sizes in bytes from ``PJRT_Executable_GetCompiledMemoryStats``;
            None where the plugin does not implement it.

        Raises
        ------
        ValueError
            If the executable has been deleted or its client closed.
        """
        return self._live().memory_analysis()

    def serialize(self, *, raw: bool = False) -> bytes:
        """The compiled program as bytes, for ``Client.deserialize`` later.

        Only a client of the same plugin build and devices can load them (see
        ``pjrt_py.serialization``); the bytes carry a checksum and the
        parameter signature.

        Parameters
        ----------
        raw : bool, optional
            Return the plugin's own bytes (``PJRT_Executable_Serialize``),
            without pjrt_py's envelope: what other PJRT bindings and
            ``Client.deserialize(data, raw=True)`` load. They carry no
            identity, checksum or signature (see ``docs/aot.md``).

        Returns
        -------
        bytes
            The plugin's serialized executable, wrapped with the plugin's
            identity, the parameter signature and a checksum (unless ``raw``).

        Raises
        ------
        PjrtError
            If the plugin cannot serialize the executable.
        ValueError
            If the executable has been deleted or its client closed.
        """
        if not isinstance(raw, bool):
            raise TypeError(f"raw must be True or False, got {raw!r}")
        program = self._live()
        return program.serialize_raw() if raw else program.serialize(self._signature)


__all__ = ["ProgramInfo"]
