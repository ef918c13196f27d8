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

import numpy as np
import numpy.typing as npt

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

_INT_OF_WIDTH: dict[int, type[np.signedinteger[Any]]] = {2: np.int16, 4: np.int32, 8: np.int64}


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


def _is_float(dtype: np.dtype[Any]) -> bool:
    return dtype.kind == "f" or dtype.name in ALMOST_EQ_TOLERANCE


def _parts(a: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
    return [a.real, a.imag] if a.dtype.kind == "c" else [a]


def ulp_distance(got: npt.NDArray[Any], want: npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """Element-wise distance in ulps of two float arrays of one dtype.

    NaN against NaN is 0; NaN against a number is the largest uint64."""
    if got.dtype.kind == "c":
        parts = [ulp_distance(g, w) for g, w in zip(_parts(got), _parts(want), strict=True)]
        return np.maximum(parts[0], parts[1])
    signed = _INT_OF_WIDTH[got.dtype.itemsize]
    ordered = []
    for a in (got, want):
        bits = np.ascontiguousarray(a).view(signed).astype(np.int64)
        sign_min = np.int64(-(2 ** (8 * got.dtype.itemsize - 1)))
        ordered.append(np.where(bits < 0, sign_min - bits, bits).astype(np.uint64))
    forward = ordered[0] - ordered[1]
    distance: npt.NDArray[np.uint64] = np.minimum(forward, -forward)
    g_nan, w_nan = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    distance = np.where(g_nan & w_nan, np.uint64(0), distance)
    return np.where(g_nan ^ w_nan, np.uint64(np.iinfo(np.uint64).max), distance)


def _equal(got: npt.NDArray[Any], want: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    same: npt.NDArray[np.bool_] = np.ones(got.shape, bool)
    for g, w in zip(_parts(got), _parts(want), strict=True):
        if _is_float(g.dtype):
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            same &= (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
        else:
            same &= g == w
    return same


def _almost_equal(got: npt.NDArray[Any], want: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    same: npt.NDArray[np.bool_] = np.ones(got.shape, bool)
    for g, w in zip(_parts(got), _parts(want), strict=True):
        tol = ALMOST_EQ_TOLERANCE.get(g.dtype.name, 1e-4)
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        with np.errstate(invalid="ignore"):
            near = np.abs(g64 - w64) <= tol + tol * np.abs(w64)
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
    floating = _is_float(got.dtype) or got.dtype.kind == "c"
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
