"""Element types: numpy dtypes <-> ``PJRT_Buffer_Type``."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .. import _core
from .capi import lib

# Every dtype pjrt_py moves between host and device.
#
# Sub-byte types (int4, uint4, int2, uint2, float4_e2m1fn): numpy (ml_dtypes)
# stores one element per byte; the plugins pack them on the device and take
# and give them unpacked on the host (BufferFromHostBuffer / ToHostBuffer),
# which every CPU build does right (tests/test_subbyte.py). pjrt_py's own
# direct copies apply only where the on-device size equals numpy's, so a
# packed buffer always goes through the plugin. pjrt_py gives DLPack no codes
# for them, and host callbacks refuse them (XLA's FFI hands the packed bytes).
_PAIRS: list[tuple[np.dtype[np.generic], int]] = [
    (np.dtype(np.bool_), lib.PJRT_Buffer_Type_PRED),
    (np.dtype(np.int8), lib.PJRT_Buffer_Type_S8),
    (np.dtype(np.int16), lib.PJRT_Buffer_Type_S16),
    (np.dtype(np.int32), lib.PJRT_Buffer_Type_S32),
    (np.dtype(np.int64), lib.PJRT_Buffer_Type_S64),
    (np.dtype(np.uint8), lib.PJRT_Buffer_Type_U8),
    (np.dtype(np.uint16), lib.PJRT_Buffer_Type_U16),
    (np.dtype(np.uint32), lib.PJRT_Buffer_Type_U32),
    (np.dtype(np.uint64), lib.PJRT_Buffer_Type_U64),
    (np.dtype(np.float16), lib.PJRT_Buffer_Type_F16),
    (np.dtype(np.float32), lib.PJRT_Buffer_Type_F32),
    (np.dtype(np.float64), lib.PJRT_Buffer_Type_F64),
    (np.dtype(ml_dtypes.bfloat16), lib.PJRT_Buffer_Type_BF16),
    (np.dtype(np.complex64), lib.PJRT_Buffer_Type_C64),
    (np.dtype(np.complex128), lib.PJRT_Buffer_Type_C128),
    (np.dtype(ml_dtypes.float8_e5m2), lib.PJRT_Buffer_Type_F8E5M2),
    (np.dtype(ml_dtypes.float8_e4m3fn), lib.PJRT_Buffer_Type_F8E4M3FN),
    (np.dtype(ml_dtypes.float8_e4m3b11fnuz), lib.PJRT_Buffer_Type_F8E4M3B11FNUZ),
    (np.dtype(ml_dtypes.float8_e5m2fnuz), lib.PJRT_Buffer_Type_F8E5M2FNUZ),
    (np.dtype(ml_dtypes.float8_e4m3fnuz), lib.PJRT_Buffer_Type_F8E4M3FNUZ),
    (np.dtype(ml_dtypes.float8_e4m3), lib.PJRT_Buffer_Type_F8E4M3),
    (np.dtype(ml_dtypes.float8_e3m4), lib.PJRT_Buffer_Type_F8E3M4),
    (np.dtype(ml_dtypes.float8_e8m0fnu), lib.PJRT_Buffer_Type_F8E8M0FNU),
    (np.dtype(ml_dtypes.int4), lib.PJRT_Buffer_Type_S4),
    (np.dtype(ml_dtypes.uint4), lib.PJRT_Buffer_Type_U4),
]
if hasattr(ml_dtypes, "int2"):  # ml_dtypes 0.5 and later
    _PAIRS += [
        (np.dtype(ml_dtypes.int2), lib.PJRT_Buffer_Type_S2),
        (np.dtype(ml_dtypes.uint2), lib.PJRT_Buffer_Type_U2),
    ]
if hasattr(ml_dtypes, "float4_e2m1fn"):  # ml_dtypes 0.5 and later
    _PAIRS.append((np.dtype(ml_dtypes.float4_e2m1fn), lib.PJRT_Buffer_Type_F4E2M1FN))

_core.set_dtypes(_PAIRS)  # the native core's copy of this table

# Packed on the device: no device buffer can alias a numpy array of these.
PACKED: frozenset[np.dtype[np.generic]] = frozenset(
    dt for dt, _ in _PAIRS if dt.name in ("int4", "uint4", "int2", "uint2", "float4_e2m1fn")
)

TO_PJRT: dict[np.dtype[np.generic], int] = dict(_PAIRS)
FROM_PJRT: dict[int, np.dtype[np.generic]] = {code: dt for dt, code in _PAIRS}
SUPPORTED: tuple[np.dtype[np.generic], ...] = tuple(dt for dt, _ in _PAIRS)

# MLIR element type spelling -> numpy dtype (for program signatures).
MLIR_NAMES: dict[str, np.dtype[np.generic]] = {
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "ui8": np.dtype(np.uint8),
    "ui16": np.dtype(np.uint16),
    "ui32": np.dtype(np.uint32),
    "ui64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "complex<f32>": np.dtype(np.complex64),
    "complex<f64>": np.dtype(np.complex128),
    "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8E4M3B11FNUZ": np.dtype(ml_dtypes.float8_e4m3b11fnuz),
    "f8E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "f8E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "f8E4M3": np.dtype(ml_dtypes.float8_e4m3),
    "f8E3M4": np.dtype(ml_dtypes.float8_e3m4),
    "f8E8M0FNU": np.dtype(ml_dtypes.float8_e8m0fnu),
    "i4": np.dtype(ml_dtypes.int4),
    "ui4": np.dtype(ml_dtypes.uint4),
}
if hasattr(ml_dtypes, "int2"):
    MLIR_NAMES.update({"i2": np.dtype(ml_dtypes.int2), "ui2": np.dtype(ml_dtypes.uint2)})
if hasattr(ml_dtypes, "float4_e2m1fn"):
    MLIR_NAMES["f4E2M1FN"] = np.dtype(ml_dtypes.float4_e2m1fn)


def pjrt_type(dtype: np.dtype[np.generic]) -> int:
    """The ``PJRT_Buffer_Type`` for a numpy dtype; ``TypeError`` if unsupported."""
    code = TO_PJRT.get(dtype)
    if code is None:
        names = ", ".join(str(d) for d in SUPPORTED)
        raise TypeError(f"dtype {dtype} is not supported by pjrt_py; supported dtypes: {names}")
    return code


def is_floating(dtype: np.dtype[Any]) -> bool:
    """numpy's floats and ml_dtypes' (bfloat16, the float8s, float4_e2m1fn:
    numpy gives most of these kind ``V``)."""
    return dtype.kind == "f" or dtype.name.startswith(("float", "bfloat"))


def numpy_dtype(code: int) -> np.dtype[np.generic]:
    """The numpy dtype for a ``PJRT_Buffer_Type``; ``TypeError`` if it has none."""
    dtype = FROM_PJRT.get(code)
    if dtype is None:
        raise TypeError(f"PJRT element type {code} has no numpy dtype in pjrt_py")
    return dtype


def as_dtype_of(array: np.ndarray[Any, Any], dtype: np.dtype[Any] | None) -> np.ndarray[Any, Any]:
    """A ``.npy`` array of ml_dtypes' types, given its meaning back.

    numpy writes bfloat16 and float8 arrays to ``.npy`` as raw bytes
    (``|V2``, ``|V1``): it has no names for them. Where the program says
    what the values are (``dtype``, of the same item size), such an array is
    viewed as that dtype; any other array is returned as it is.
    """
    if (
        dtype is not None
        and array.dtype.kind == "V"
        and array.dtype.names is None
        and array.dtype.itemsize == dtype.itemsize
    ):
        return array.view(dtype)
    return array
