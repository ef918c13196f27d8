"""Comparing a result with its expected value on the host.

Rules (``docs/conformance.md``):

- integers and booleans are always compared exactly;
- ``eq``: floats exactly (``-0.0 == 0.0``; NaN equals NaN), complex per part;
- ``almost_eq``: ``|got - want| <= tol + tol * |want|`` with ``tol`` from
  ``ALMOST_EQ_TOLERANCE`` (the StableHLO interpreter's 1e-4, widened to
  two machine epsilons for the narrow float types); NaN equals NaN, an
  infinity only itself;
- ``close``: the distance in units in the last place is within
  ``[min_ulp_difference, max_ulp_difference]`` (defaults 0 and 3, as in the
  StableHLO ``check.expect_close``); complex numbers take the larger of the
  two parts' distances.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..runtime.dtypes import is_floating

ALMOST_EQ_TOLERANCE: dict[str, float] = {
    "float64": 1e-4,
    "float32": 1e-4,
    "float16": 2 * 2.0**-10,
    "bfloat16": 2 * 2.0**-7,
}
"""Tolerance of ``almost_eq`` per float dtype (complex types use their parts')."""

DEFAULT_MAX_ULP = 3
DEFAULT_MIN_ULP = 0
SHOWN = 5  # differing elements kept per mismatch

_UINT_OF_SIZE: dict[int, type[np.unsignedinteger[Any]]] = {
    1: np.uint8,
    2: np.uint16,
    4: np.uint32,
    8: np.uint64,
}


@dataclass
class Mismatch:
    """A failed comparison: how many elements differ and the first few."""

    message: str
    differing: int = 0
    total: int = 0
    first: list[dict[str, Any]] = field(default_factory=list)
    max_ulp: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "message": self.message,
            "differing": self.differing,
            "total": self.total,
            "first": self.first,
            "max_ulp": self.max_ulp,
        }


def _tolerance(dtype: np.dtype[Any]) -> float:
    """``almost_eq``'s tolerance: the table's, else 1e-4 or two machine
    epsilons, whichever is larger (the float8 and float4 types)."""
    if dtype.name in ALMOST_EQ_TOLERANCE:
        return ALMOST_EQ_TOLERANCE[dtype.name]
    return max(1e-4, 2 * float(ml_dtypes.finfo(dtype).eps))  # type: ignore[no-untyped-call]


def _sign_magnitude(a: npt.NDArray[Any]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.uint64]]:
    """Each element's sign bit and the bits below it, as unsigned integers:
    for IEEE-like formats the magnitude's bits count representable steps.
    Sub-byte types sit in the low bits of their byte; float8_e8m0fnu has no
    sign bit."""
    # ascontiguousarray makes a 0-d array 1-d: the shape is put back.
    raw = np.ascontiguousarray(a).view(_UINT_OF_SIZE[a.dtype.itemsize]).astype(np.uint64)
    raw = raw.reshape(a.shape)
    if a.dtype.kind == "f" and a.dtype.name in ("float16", "float32", "float64"):
        width = 8 * a.dtype.itemsize
    else:
        info = ml_dtypes.finfo(a.dtype)  # type: ignore[no-untyped-call]
        if float(info.min) > 0:  # unsigned: every bit counts steps
            return np.zeros(raw.shape, bool), raw
        width = int(info.bits)
    sign = (raw >> np.uint64(width - 1)) & np.uint64(1)
    return sign.astype(bool), raw & np.uint64((1 << (width - 1)) - 1)


def _parts(a: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
    return [a.real, a.imag] if a.dtype.kind == "c" else [a]


def ulp_distance(got: npt.NDArray[Any], want: npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """Element-wise distance in ulps of two float arrays of one dtype.

    NaN against NaN is 0; NaN against a number is the largest uint64."""
    if got.dtype.kind == "c":
        parts = [ulp_distance(g, w) for g, w in zip(_parts(got), _parts(want), strict=True)]
        return np.maximum(parts[0], parts[1])
    (g_sign, g_mag), (w_sign, w_mag) = _sign_magnitude(got), _sign_magnitude(want)
    # Same sign: the steps between the magnitudes; else through zero (+0 and
    # -0 are 0 apart). Below 2**63 each, so the sum does not wrap.
    distance: npt.NDArray[np.uint64] = np.where(
        g_sign == w_sign, np.maximum(g_mag, w_mag) - np.minimum(g_mag, w_mag), g_mag + w_mag
    )
    g_nan, w_nan = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    distance = np.where(g_nan & w_nan, np.uint64(0), distance)
    return np.where(g_nan ^ w_nan, np.uint64(np.iinfo(np.uint64).max), distance)


def _equal(got: npt.NDArray[Any], want: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    same: npt.NDArray[np.bool_] = np.ones(got.shape, bool)
    for g, w in zip(_parts(got), _parts(want), strict=True):
        if is_floating(g.dtype):
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            same &= (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
        else:
            same &= g == w
    return same


def _almost_equal(got: npt.NDArray[Any], want: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    same: npt.NDArray[np.bool_] = np.ones(got.shape, bool)
    for g, w in zip(_parts(got), _parts(want), strict=True):
        tol = _tolerance(g.dtype)
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        with np.errstate(invalid="ignore"):
            near = np.abs(g64 - w64) <= tol + tol * np.abs(w64)
        # tol * |inf| is inf: an infinity is near only itself (g64 == w64).
        near &= np.isfinite(g64) & np.isfinite(w64)
        same &= near | (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
    return same


def compare(
    kind: str,
    got: npt.NDArray[Any],
    want: npt.NDArray[Any],
    attrs: dict[str, int] | None = None,
) -> Mismatch | None:
    """Compare by ``kind`` ("eq", "almost_eq" or "close"); None when they match."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return Mismatch(
            f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}",
            got.size,
            got.size,
        )
    floating = is_floating(got.dtype) or got.dtype.kind == "c"
    attrs = attrs or {}
    lo = attrs.get("min_ulp_difference", DEFAULT_MIN_ULP)
    hi = attrs.get("max_ulp_difference", DEFAULT_MAX_ULP)
    ulps = ulp_distance(got, want) if floating else None
    if not floating or kind == "eq":
        ok = _equal(got, want)
    elif kind == "almost_eq":
        ok = _almost_equal(got, want)
    else:
        assert ulps is not None
        ok = (ulps >= lo) & (ulps <= hi)
    if ok.all():
        return None
    bad = np.argwhere(~ok)
    first = []
    for index in bad[:SHOWN]:
        at = tuple(int(i) for i in index)
        first.append(
            {
                "index": list(at),
                "got": str(got[at]),
                "expected": str(want[at]),
                "ulp": None if ulps is None else int(ulps[at]),
            }
        )
    max_ulp = None if ulps is None else int(ulps[~ok].max())
    rule = {"eq": "exact", "almost_eq": "almost_eq", "close": f"ulp in [{lo}, {hi}]"}[kind]
    message = f"{len(bad)} of {got.size} element(s) differ ({rule})"
    return Mismatch(message, int(len(bad)), int(got.size), first, max_ulp)
