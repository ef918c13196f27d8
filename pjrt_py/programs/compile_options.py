"""``xla.CompileOptionsProto``, encoded and checked in protobuf wire format by hand.

pjrt_py takes no protobuf dependency: the few fields it sets are written
directly, and options given as bytes are decoded just far enough to check
them. Field numbers are those of xla/pjrt/proto/compile_options.proto and
xla/xla.proto.

PJRT plugins CHECK-fail (abort the process) on options they cannot use, for
example empty options (replica count 0). Everything is validated here first,
whether it came as keywords or as bytes, and the encoding always carries
num_replicas and num_partitions.

By default the options are the ones ``jax.jit`` sends for the same program
(``like_jax=True``): jax's ``DebugOptions`` (recorded in ``_jax_options`` from
jaxlib; among them ``xla_cpu_enable_fast_min_max = false``, so
``max(1, NaN)`` is NaN as the StableHLO spec and jax say, where a plugin's own
default returns 1), SPMD partitioning on, and the few other build fields jax
sets. ``debug_options`` overrides single fields by name or number.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from . import jax_options as _jax_options
from . import option_fields as opt
from .debug_options import DebugValue, encode_debug_options
from .mlir_text import bytecode_to_text, module_attribute_int
from .placement import Placement, check_placement, positive_count
from .proto import bytes_field, int_field, write_varint

# CompileOptionsProto
opt.EXECUTABLE_BUILD_OPTIONS = 3
opt.COMPILE_PORTABLE_EXECUTABLE = 4
# ExecutableBuildOptionsProto
opt.DEVICE_ORDINAL = 1
opt.DEBUG_OPTIONS = 3
opt.NUM_REPLICAS = 4
opt.NUM_PARTITIONS = 5
opt.USE_SPMD_PARTITIONING = 6
opt.DEVICE_ASSIGNMENT = 9
opt.USE_SHARDY_PARTITIONER = 19
# DeviceAssignmentProto
opt.REPLICA_COUNT = 1
opt.COMPUTATION_COUNT = 2
opt.COMPUTATION_DEVICES = 3
# DeviceAssignmentProto.ComputationDevice
opt.REPLICA_DEVICE_IDS = 1


def encode_device_assignment(assignment: Sequence[Sequence[int]]) -> bytes:
    """Encode ``assignment[replica][partition] = device id``."""
    replicas = len(assignment)
    if replicas == 0:
        raise ValueError("device_assignment needs at least one replica")
    partitions = len(assignment[0])
    if partitions == 0 or any(len(row) != partitions for row in assignment):
        raise ValueError("device_assignment must be a non-empty rectangle [replica][partition]")
    ids = [i for row in assignment for i in row]
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"device ids must be non-negative ints, got {ids}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"device_assignment uses a device twice: {ids}")
    out = int_field(opt.REPLICA_COUNT, replicas) + int_field(opt.COMPUTATION_COUNT, partitions)
    for p in range(partitions):
        packed = b"".join(write_varint(assignment[r][p]) for r in range(replicas))
        out += bytes_field(opt.COMPUTATION_DEVICES, bytes_field(opt.REPLICA_DEVICE_IDS, packed))
    return out


# -- debug options ---------------------------------------------------------


# -- CompileOptionsProto -----------------------------------------------------


def encode_compile_options(
    *,
    num_replicas: int = 1,
    num_partitions: int = 1,
    device_assignment: Sequence[Sequence[int]] | None = None,
    use_spmd_partitioning: bool | None = None,
    use_shardy_partitioner: bool | None = None,
    compile_portable_executable: bool = False,
    debug_options: Mapping[str | int, DebugValue] | None = None,
    like_jax: bool = True,
) -> bytes:
    """Serialized ``CompileOptionsProto``.

    ``like_jax`` (default) writes what ``jax.jit`` sends besides the counts
    and placement: jax's ``DebugOptions``, SPMD partitioning on, and its other
    build fields. ``like_jax=False`` leaves the plugin its own defaults; with
    one replica and one partition that encodes to the 6 bytes
    ``1a 04 20 01 28 01``, the smallest options the CPU plugins accept.
    ``use_spmd_partitioning`` defaults to ``like_jax or num_partitions > 1``,
    ``use_shardy_partitioner`` to ``like_jax`` (as jax 0.10 does: a plugin
    falls back to GSPMD for a module with GSPMD shardings, checked on all
    three CPU builds).
    ``debug_options`` sets single ``xla.DebugOptions`` fields, by name
    (``DEBUG_OPTION_NAMES``) or by field number.

    Parameters
    ----------
    num_replicas, num_partitions : int, optional
        The replica and partition counts (default 1 each): positive ints
        below ``2**31``.
    device_assignment : sequence of sequences of int, optional
        ``device_assignment[replica][partition]`` is a device id: a
        ``num_replicas`` x ``num_partitions`` rectangle of distinct,
        non-negative ids. None leaves the placement to the plugin.
    use_spmd_partitioning : bool, optional
        ``ExecutableBuildOptions.use_spmd_partitioning``; None for the
        default above.
    use_shardy_partitioner : bool, optional
        ``ExecutableBuildOptions.use_shardy_partitioner``; None for the
        default above.
    compile_portable_executable : bool, optional
        Set ``CompileOptionsProto.compile_portable_executable`` (off by
        default).
    debug_options : mapping, optional
        ``xla.DebugOptions`` fields to set, by name or field number, each to
        a bool, int, float, str or bytes; they override jax's values where
        ``like_jax`` writes them.
    like_jax : bool, optional
        Write what ``jax.jit`` sends (default True); False leaves the plugin
        its own defaults for everything the other arguments do not set.

    Returns
    -------
    bytes
        The serialized ``CompileOptionsProto``, for ``Client.compile``'s
        ``compile_options``.

    Raises
    ------
    ValueError
        If a count is not a positive int below ``2**31``; if
        ``device_assignment`` is not a ``num_replicas`` x ``num_partitions``
        rectangle of distinct, non-negative int ids; or if ``debug_options``
        names an unknown field or gives an int that does not fit 64 bits.
    TypeError
        If ``debug_options`` is not a mapping, a key is neither a str nor an
        int field number in ``[1, 2**29)``, or a value is not of its field's
        type (a named field's bool, int or str; for a field number, one of
        the types above).
    """
    num_replicas = positive_count("num_replicas", num_replicas)
    num_partitions = positive_count("num_partitions", num_partitions)
    if use_spmd_partitioning is None:
        use_spmd_partitioning = like_jax or num_partitions > 1
    if use_shardy_partitioner is None:
        use_shardy_partitioner = like_jax
    build = b""
    if like_jax or debug_options:
        build += bytes_field(
            opt.DEBUG_OPTIONS, encode_debug_options(debug_options, like_jax=like_jax)
        )
    build += int_field(opt.NUM_REPLICAS, num_replicas) + int_field(
        opt.NUM_PARTITIONS, num_partitions
    )
    if use_spmd_partitioning:
        build += int_field(opt.USE_SPMD_PARTITIONING, 1)
    if use_shardy_partitioner:
        build += int_field(opt.USE_SHARDY_PARTITIONER, 1)
    if device_assignment is not None:
        if len(device_assignment) != num_replicas or any(
            len(row) != num_partitions for row in device_assignment
        ):
            raise ValueError(
                f"device_assignment must be {num_replicas} replicas x {num_partitions} "
                f"partitions, got {[len(r) for r in device_assignment]}"
            )
        build += bytes_field(opt.DEVICE_ASSIGNMENT, encode_device_assignment(device_assignment))
    if like_jax:
        build += b"".join(int_field(n, v) for n, v in _jax_options.BUILD_INT_FIELDS.items())
        build += b"".join(bytes_field(n, v) for n, v in _jax_options.BUILD_BYTES_FIELDS.items())
    out = bytes_field(opt.EXECUTABLE_BUILD_OPTIONS, build)
    if compile_portable_executable:
        out += int_field(opt.COMPILE_PORTABLE_EXECUTABLE, 1)
    if like_jax:
        out += b"".join(int_field(n, v) for n, v in _jax_options.TOP_INT_FIELDS.items())
    return out


# -- options for a program -------------------------------------------------


def module_count(
    program: str | bytes, name: str, read: Callable[[bytes], str | None] = bytecode_to_text
) -> int:
    """``mhlo.num_replicas`` / ``mhlo.num_partitions`` of a module, else 1.

    Text is read by a real lex of the module's attribute dictionary. Bytecode
    is read through jax's MLIR bindings when the attribute's name is in it
    (by ``read``: the compiler's, which reads it once, and out of process
    when compiles are isolated); without them such bytecode is refused:
    compiling it for one replica would silently give other results.
    """
    attribute = f"mhlo.{name}"
    if isinstance(program, bytes):
        if attribute.encode() not in program:
            return 1  # the name is in the bytecode's string table if it is set
        text = read(program)
        if text is None:
            raise ValueError(
                f"this bytecode program sets {attribute}, which pjrt_py reads with jax's "
                f"MLIR bindings (not installed, or they cannot read it): pass {name}= "
                f"explicitly, or compile the text form"
            )
        program = text
    value = module_attribute_int(program, attribute)
    return 1 if value is None else value


def program_bytes(program: str | bytes) -> bytes:
    """The bytes handed to the compiler; ValueError for an empty program."""
    code = program.encode() if isinstance(program, str) else program
    if not code:
        raise ValueError("program is empty")
    return code


def options_for_program(
    program: str | bytes,
    *,
    num_replicas: int | None,
    num_partitions: int | None,
    device_assignment: Sequence[Sequence[int]] | None,
    device: int | None,
    device_ids: Sequence[int],
    debug_options: Mapping[str | int, DebugValue] | None = None,
    read: Callable[[bytes], str | None] = bytecode_to_text,
) -> bytes:
    """The CompileOptionsProto for ``Client.compile``'s keyword arguments.

    ``device_assignment`` and ``device`` are device ids here; ``device_ids``
    lists the client's devices (the default assignment takes them in order).
    ``read`` reads a bytecode program's text (``module_count``).
    """
    # Validated first: the device counts below multiply them.
    replicas = positive_count(
        "num_replicas",
        module_count(program, "num_replicas", read) if num_replicas is None else num_replicas,
    )
    partitions = positive_count(
        "num_partitions",
        module_count(program, "num_partitions", read) if num_partitions is None else num_partitions,
    )
    assignment: list[list[int]] | None = None
    if device is not None:
        if device_assignment is not None or replicas * partitions != 1:
            raise ValueError(
                "device= places a single-device program; for replicas or partitions "
                "pass device_assignment"
            )
        assignment = [[device]]
    elif device_assignment is not None:
        assignment = [list(row) for row in device_assignment]
    check_placement(Placement(replicas, partitions, assignment), device_ids)
    if assignment is None and replicas * partitions > 1:
        ids = list(device_ids)
        assignment = [ids[r * partitions : (r + 1) * partitions] for r in range(replicas)]
    return encode_compile_options(
        num_replicas=replicas,
        num_partitions=partitions,
        device_assignment=assignment,
        debug_options=debug_options,
    )
