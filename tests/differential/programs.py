"""The differential tier's catalogue: jax programs, their inputs, their tolerances.

A :class:`Program` is a jax function, the dtypes it runs in, a seeded input
generator and a :class:`Tolerance`. ``cases()`` expands the catalogue into
``(program, dtype)`` cases whose id (``atan-f32``) names them in test ids and
in :data:`KNOWN_PLUGIN_DEFECTS`. Programs that group several ops return a dict,
so a mismatch names the op (``arith-f32['max']``).

Inputs mix seeded random values with the special values of each dtype (NaN,
+-inf, +-0, the smallest and largest subnormals, the smallest normal, +-max,
eps, halves for rounding); binary float ops see every pair of special values.
Programs whose float result depends on the order of additions (reductions,
dot_general, conv, scatter-add) get small integers, so that every order gives
the same bits and they compare exactly; their ``-random`` variants take
random floats under a :data:`SCALED` tolerance instead.

Tolerance policy (the reason for each level):

* :data:`EXACT` -- bit for bit, except that any NaN equals any NaN (payloads
  and NaN signs are not specified by StableHLO). For ints, bools, data
  movement, casts, sorts, rng bits and uniforms, and the float ops IEEE 754
  rounds correctly (+ - * /, sqrt, rem, min/max, compare, round, floor).
* :data:`TRANSCENDENTAL` -- at most 4 units in the last place of the result
  dtype, with NaN where jax has NaN and the same infinities. exp, log, tanh,
  atan, erf, pow ... are polynomial approximations that XLA revises between
  releases; 1-2 ulp changes are legitimate, and 4 ulps leaves room for a
  16-bit result rounded from an f32 computation. A wrong result (the PJRT
  0.115 atan) is off by far more.
* :data:`SCALED` -- ``|got - want| <= 8 * eps * scale`` where ``scale`` is the
  program on ``|inputs|`` (sums, dot, conv) or ``sum |x|`` (fft): the bound a
  different summation order or FFT algorithm can move a result, while a
  wrong element or a dropped term moves it by far more.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

# -- dtypes ------------------------------------------------------------------

DTYPES: dict[str, Any] = {
    "bool": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),
}
SINTS = ("i8", "i16", "i32", "i64")
UINTS = ("u8", "u16", "u32", "u64")
INTS = SINTS + UINTS
FLOATS = ("bf16", "f16", "f32", "f64")
COMPLEX = ("c64", "c128")
ALL = ("bool", *INTS, *FLOATS, *COMPLEX)
# For data movement the width matters, not the kind: one or two dtypes per width.
WIDTHS = ("bool", "u8", "i16", "bf16", "u32", "f32", "f64", "c128")
# Fewer dtypes for the programs that take longest to compile.
SOME = ("bool", "i8", "u16", "i32", "u64", "bf16", "f16", "f32", "f64", "c64")
SOME_INTS = ("i8", "u16", "i32", "u64")


def is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt == DTYPES["bf16"]


def real_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dt == np.complex64 else np.dtype(np.float64)


# -- tolerances --------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """How close a result must be: ``exact``, ``ulp`` (``ulps``) or ``scaled``."""

    kind: str
    ulps: int = 0
    eps_factor: float = 0.0
    scale: str = "self"  # scaled: "self" (the program on |inputs|) or "sum" (sum |x|)


EXACT = Tolerance("exact")
TRANSCENDENTAL = Tolerance("ulp", ulps=4)
SCALED = Tolerance("scaled", eps_factor=8.0)
SCALED_SUM = Tolerance("scaled", eps_factor=8.0, scale="sum")

# -- inputs ------------------------------------------------------------------

Inputs = Callable[[np.dtype, np.random.Generator], tuple[Any, ...]]


def special_floats(dt: np.dtype) -> np.ndarray:
    """NaN, +-inf, +-0, subnormals, the smallest normal, +-max, eps, halves."""
    fi = ml_dtypes.finfo(dt)
    sub, tiny = float(fi.smallest_subnormal), float(fi.smallest_normal)
    values = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.5]
    values += [sub, -sub, tiny - sub, tiny, float(fi.max), -float(fi.max), float(fi.eps)]
    return np.array(values, np.float64).astype(dt)


def random_floats(dt: np.dtype, rng: np.random.Generator, n: int) -> np.ndarray:
    """Half in [-1, 1] (every function's interesting range), half over 8 decades."""
    wide = rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)
    values = np.where(rng.random(n) < 0.5, rng.uniform(-1, 1, n), wide)
    with np.errstate(over="ignore"):
        return values.astype(dt)


def special_ints(dt: np.dtype) -> np.ndarray:
    ii = np.iinfo(dt)
    values = [0, 1, 2, ii.max, ii.max - 1, ii.min, ii.min + 1]
    if ii.min < 0:
        values += [-1, -2]
    return np.array(values, dt)


def values(dt: np.dtype, rng: np.random.Generator, n: int = 64) -> np.ndarray:
    """``n`` values of ``dt``, its special values among them, in seeded order."""
    if dt == np.bool_:
        return rng.random(n) < 0.5
    if dt.kind == "c":
        out = np.empty(n, dt)  # re + 1j * im would turn an infinite im into a NaN re
        out.real, out.imag = values(real_dtype(dt), rng, n), values(real_dtype(dt), rng, n)
        return out
    special = special_ints(dt) if dt.kind in "iu" else special_floats(dt)
    special = special[: n // 2]
    k = n - len(special)
    if dt.kind in "iu":
        ii = np.iinfo(dt)
        small = rng.integers(max(ii.min, -8), 9, k // 4).astype(dt)
        wide = rng.integers(ii.min, ii.max, k - len(small), dt, endpoint=True)
        rest = np.concatenate([small, wide])
    else:
        rest = random_floats(dt, rng, k)
    return rng.permutation(np.concatenate([special, rest]))


def pairs(dt: np.dtype, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays holding every pair of special values, then random pairs."""
    if dt == np.bool_:
        return values(dt, rng), values(dt, rng)
    if dt.kind == "c":
        return values(dt, rng), values(dt, rng)
    special = special_ints(dt) if dt.kind in "iu" else special_floats(dt)
    x, y = (a.ravel() for a in np.meshgrid(special, special))
    return np.concatenate([x, values(dt, rng)]), np.concatenate([y, values(dt, rng)])


def small(dt: np.dtype, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Small integers in ``dt``: sums and products of them are exact in any order."""
    lo = 0 if dt.kind in "ub" else -3
    out = rng.integers(lo, 4, shape)
    if dt.kind == "c":
        return (out + 1j * rng.integers(-3, 4, shape)).astype(dt)  # finite: no NaN from 1j*inf
    return out.astype(dt)


def unary(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    return (values(dt, rng),)


def binary(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    return pairs(dt, rng)


def ternary(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    x, y = pairs(dt, rng)
    return x, y, rng.permutation(y)


# -- programs ----------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    """A jax function, the dtypes it runs in, its inputs and its tolerance.

    ``full`` programs run only under ``PJRT_PY_DIFFERENTIAL=full``;
    ``takes_dtype`` ones get the dtype first (their inputs do not carry it).
    """

    name: str
    fn: Callable[..., Any]
    inputs: Inputs
    dtypes: tuple[str, ...]
    tolerance: Tolerance = EXACT
    full: bool = False
    takes_dtype: bool = False


@dataclass(frozen=True)
class Case:
    program: Program
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.program.name}-{self.dtype}"

    @property
    def fn(self) -> Callable[..., Any]:
        if self.program.takes_dtype:
            return functools.partial(self.program.fn, DTYPES[self.dtype])
        return self.program.fn

    def args(self) -> tuple[Any, ...]:
        """The inputs, seeded by the case id (the same on every run)."""
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        return self.program.inputs(DTYPES[self.dtype], rng)


PROGRAMS: list[Program] = []


def program(
    name: str,
    dtypes: tuple[str, ...],
    inputs: Inputs,
    tolerance: Tolerance = EXACT,
    *,
    full: bool = False,
    takes_dtype: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        PROGRAMS.append(Program(name, fn, inputs, dtypes, tolerance, full, takes_dtype))
        return fn

    return register


def add(
    name: str,
    fn: Callable[..., Any],
    dtypes: tuple[str, ...],
    inputs: Inputs,
    tolerance: Tolerance = EXACT,
    *,
    full: bool = False,
) -> None:
    PROGRAMS.append(Program(name, fn, inputs, dtypes, tolerance, full))


# Elementwise transcendental functions, one program each (a fused group
# would hide which one a plugin gets wrong), on 64 elements: PJRT 0.115's
# atan is wrong from about 50 elements on.
_special = jax.scipy.special
for _name, _fn in {
    "exp": jnp.exp,
    "expm1": jnp.expm1,
    "log": jnp.log,
    "log1p": jnp.log1p,
    "tanh": jnp.tanh,
    "logistic": lax.logistic,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tan": jnp.tan,
    "atan": jnp.arctan,
    "asin": jnp.arcsin,
    "acos": jnp.arccos,
    "sinh": jnp.sinh,
    "cosh": jnp.cosh,
    "asinh": jnp.arcsinh,
    "acosh": jnp.arccosh,
    "atanh": jnp.arctanh,
    "erf": _special.erf,
    "erfc": _special.erfc,
    "erf_inv": lax.erf_inv,
    "lgamma": lax.lgamma,
    "digamma": lax.digamma,
    "cbrt": jnp.cbrt,
    "rsqrt": lax.rsqrt,
}.items():
    add(_name, _fn, FLOATS, unary, TRANSCENDENTAL)

for _name, _fn in {
    "cexp": jnp.exp,
    "clog": jnp.log,
    "csqrt": jnp.sqrt,
    "ctanh": jnp.tanh,
    "csin": jnp.sin,
    "cabs": jnp.abs,
}.items():
    add(_name, _fn, COMPLEX, unary, TRANSCENDENTAL)

for _name, _fn in {
    "pow": jnp.power,
    "atan2": jnp.arctan2,
    "hypot": jnp.hypot,
    "logaddexp": jnp.logaddexp,
}.items():
    add(_name, _fn, FLOATS, binary, TRANSCENDENTAL)


@program("exact_unary", FLOATS, unary)
def _exact_unary(x: Any) -> dict[str, Any]:
    return {
        "abs": jnp.abs(x),
        "neg": -x,
        "sign": jnp.sign(x),
        "floor": jnp.floor(x),
        "ceil": jnp.ceil(x),
        "round_even": jnp.round(x),
        "round_away": lax.round(x),
        "sqrt": jnp.sqrt(x),
        "reciprocal": 1 / x,
        "square": x * x,
        "isfinite": jnp.isfinite(x),
        "signbit": jnp.signbit(x),
    }


@program("arith", FLOATS, binary)
def _arith(x: Any, y: Any) -> dict[str, Any]:
    return {
        "add": x + y,
        "sub": x - y,
        "mul": x * y,
        "div": x / y,
        "rem": lax.rem(x, y),
        "remainder": jnp.remainder(x, y),
        "nextafter": jnp.nextafter(x, y),
        "copysign": jnp.copysign(x, y),
        "lt": x < y,
        "le": x <= y,
        "eq": x == y,
        "ne": x != y,
    }


@program("minmax", FLOATS + SOME_INTS, ternary)
def _minmax(x: Any, y: Any, z: Any) -> dict[str, Any]:
    return {
        "max": jnp.maximum(x, y),
        "min": jnp.minimum(x, y),
        "clamp": lax.clamp(y, x, z),
        "clip": jnp.clip(x, y, z),
    }


@program("complex_unary", COMPLEX, unary)
def _complex_unary(x: Any) -> dict[str, Any]:
    return {"neg": -x, "conj": jnp.conj(x), "real": x.real, "imag": x.imag, "twice": x + x}


@program("complex_arith", COMPLEX, binary)
def _complex_arith(x: Any, y: Any) -> dict[str, Any]:
    return {"add": x + y, "sub": x - y, "eq": x == y, "ne": x != y}


@program("complex_muldiv", COMPLEX, binary, TRANSCENDENTAL)
def _complex_muldiv(x: Any, y: Any) -> dict[str, Any]:
    return {"mul": x * y, "div": x / y, "pow": x**y}


@program("int_unary", INTS, unary)
def _int_unary(x: Any) -> dict[str, Any]:
    return {
        "abs": jnp.abs(x),
        "neg": -x,
        "sign": jnp.sign(x),
        "not": ~x,
        "popcount": lax.population_count(x),
        "clz": lax.clz(x),
    }


@program("int_binary", INTS, binary)
def _int_binary(x: Any, y: Any) -> dict[str, Any]:
    bits = np.iinfo(x.dtype).bits
    shift = y & x.dtype.type(2 * bits - 1)  # in range and just beyond it
    return {
        "add": x + y,
        "sub": x - y,
        "mul": x * y,
        "div": lax.div(x, y),  # y = 0 and MIN / -1 included: XLA defines both
        "rem": lax.rem(x, y),
        "floor_divide": jnp.floor_divide(x, y),
        "and": x & y,
        "or": x | y,
        "xor": x ^ y,
        "shl": lax.shift_left(x, shift),
        "shr_logical": lax.shift_right_logical(x, shift),
        "shr_arith": lax.shift_right_arithmetic(x, shift),
        "shl_raw": lax.shift_left(x, y),
        "pow": jnp.power(x, y & x.dtype.type(7)),
        "lt": x < y,
        "eq": x == y,
    }


@program("logic", ("bool",), ternary)
def _logic(x: Any, y: Any, z: Any) -> dict[str, Any]:
    return {
        "and": x & y,
        "or": x | y,
        "xor": x ^ y,
        "not": ~x,
        "eq": x == y,
        "select": jnp.where(z, x, y),
    }


# -- reductions ----------------------------------------------------------------


def _reduce_inputs(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    """A (16, 8) array and a (16, 8) array for products.

    Floats: small integers, with rows holding a NaN, an inf, both infs and
    all -0; products of +-1/2, +-1, +-2 (exact in any order).
    """
    if dt.kind in "iu":
        x = values(dt, rng, 128).reshape(16, 8)
        return x, values(dt, rng, 128).reshape(16, 8)
    x = small(dt, rng, (16, 8))
    p = rng.choice(np.array([-2, -1, -0.5, 0.5, 1, 2]), (16, 8)).astype(dt)
    if is_float(dt):
        x[12, 3], x[13, 5], x[14, 1], x[14, 6], x[15] = np.nan, np.inf, np.inf, -np.inf, -0.0
        p[12, 2], p[13, 0], p[14, 4] = np.nan, np.inf, -0.0
    return x, p


@program("reduce", SOME_INTS + FLOATS, _reduce_inputs)
def _reduce(x: Any, p: Any) -> dict[str, Any]:
    return {
        "sum": jnp.sum(x, axis=1),
        "sum0": jnp.sum(x, axis=0),
        "prod": jnp.prod(p, axis=1),
        "max": jnp.max(x, axis=1),
        "min": jnp.min(x, axis=1),
        "max0": jnp.max(x, axis=0),
        "argmax": jnp.argmax(x, axis=1),
        "argmin": jnp.argmin(x, axis=1),
        "cumsum": jnp.cumsum(x, axis=1),
        "cummax": lax.cummax(x, axis=1),
    }


@program("reduce_complex", COMPLEX, _reduce_inputs)
def _reduce_complex(x: Any, p: Any) -> dict[str, Any]:
    return {"sum": jnp.sum(x, axis=1), "prod": jnp.prod(p, axis=1), "cumsum": jnp.cumsum(x, 0)}


@program("reduce_bool", ("bool",), lambda dt, rng: (values(dt, rng, 128).reshape(16, 8),))
def _reduce_bool(x: Any) -> dict[str, Any]:
    return {"any": jnp.any(x, axis=1), "all": jnp.all(x, axis=0), "count": jnp.sum(x, axis=1)}


@program(
    "sum_random",
    FLOATS + COMPLEX,
    lambda dt, rng: (values(dt, rng, 1024).reshape(8, 128),),
    SCALED,
)
def _sum_random(x: Any) -> dict[str, Any]:
    finite = jnp.where(jnp.isfinite(x), x, 0)
    return {"sum": jnp.sum(finite, axis=1), "all": jnp.sum(finite)}


# -- dot_general and conv ----------------------------------------------------------


def _dot_inputs(make: Callable[..., np.ndarray]) -> Inputs:
    def inputs(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
        return (
            make(dt, rng, (16, 8)),
            make(dt, rng, (8, 12)),
            make(dt, rng, (3, 5, 8)),
            make(dt, rng, (3, 8, 4)),
        )

    return inputs


def _dot(a: Any, b: Any, c: Any, d: Any) -> dict[str, Any]:
    return {
        "matmul": a @ b,
        "matvec": a @ b[:, 0],
        "batched": jnp.einsum("bij,bjk->bik", c, d),
        "contract_first": lax.dot_general(a, a, (((0,), (0,)), ((), ()))),
    }


def _random_normal(dt: np.dtype, rng: np.random.Generator, shape: tuple[int, ...]) -> Any:
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


add("dot", _dot, SOME_INTS + FLOATS + COMPLEX, _dot_inputs(small))
add("dot_random", _dot, FLOATS + COMPLEX, _dot_inputs(_random_normal), SCALED)


@program("dot_widening", ("i8", "bf16", "f16"), _dot_inputs(small))
def _dot_widening(a: Any, b: Any, c: Any, d: Any) -> Any:
    wide = jnp.int32 if a.dtype == jnp.int8 else jnp.float32
    return lax.dot_general(c, d, (((2,), (1,)), ((0,), (0,))), preferred_element_type=wide)


def _conv_inputs(make: Callable[..., np.ndarray]) -> Inputs:
    def inputs(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
        return make(dt, rng, (2, 4, 9, 9)), make(dt, rng, (6, 4, 3, 3))

    return inputs


def _conv(x: Any, w: Any) -> dict[str, Any]:
    conv = lax.conv_general_dilated
    return {
        "valid": conv(x, w, (1, 1), "VALID"),
        "strided_same": conv(x, w, (2, 2), "SAME"),
        "padded": conv(x, w, (1, 2), [(2, 1), (0, 3)]),
        "dilated": conv(x, w, (1, 1), [(0, 0), (1, 1)], lhs_dilation=(2, 1), rhs_dilation=(1, 2)),
        "grouped": conv(x, w[:, :2], (1, 1), "SAME", feature_group_count=2),
        "nhwc": conv(
            x.transpose(0, 2, 3, 1),
            w.transpose(2, 3, 1, 0),
            (1, 1),
            "VALID",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        ),
    }


add("conv", _conv, ("i32", *FLOATS, "c64"), _conv_inputs(small))
add("conv_random", _conv, ("f32", "c64"), _conv_inputs(_random_normal), SCALED)


# -- gather, scatter, sort, slices, layout -------------------------------------------


def _gather_inputs(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    x = values(dt, rng, 64)
    base = values(dt, rng, 32) if not (is_float(dt) or dt.kind == "c") else small(dt, rng, (32,))
    if is_float(dt):
        base[[3, 17, 30]] = [np.nan, np.inf, -0.0]
    idx = rng.integers(-70, 70, 40).astype(np.int32)  # out-of-range ones included
    unique = rng.permutation(32)[:12].astype(np.int32)
    dup = rng.integers(0, 32, 48).astype(np.int32)
    upd = small(dt, rng, (48,)) if dt != np.bool_ else values(dt, rng, 48)
    return x, base, idx, unique, dup, upd


@program("gather_scatter", SOME, _gather_inputs)
def _gather_scatter(x: Any, base: Any, idx: Any, unique: Any, dup: Any, upd: Any) -> Any:
    out = {
        "take_clip": jnp.take(x, idx, mode="clip"),
        "take_fill": jnp.take(x, idx, mode="fill"),
        "take_wrap": jnp.take(x, idx, mode="wrap"),
        "take_along": jnp.take_along_axis(x.reshape(8, 8), jnp.abs(idx[:32] % 8).reshape(8, 4), 1),
        "set": base.at[unique].set(upd[:12]),
        "set_drop": base.at[idx[:12]].set(upd[:12], mode="drop"),
    }
    if x.dtype != jnp.bool_:
        out["add"] = base.at[dup].add(upd)
        out["add_drop"] = base.at[idx].add(upd[:40], mode="drop")
    if x.dtype != jnp.bool_ and not jnp.issubdtype(x.dtype, jnp.complexfloating):
        out["max"] = base.at[dup].max(upd)
        out["min"] = base.at[dup].min(upd)
    return out


def _sort_inputs(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    x = values(dt, rng, 64)
    x[40:56] = x[:16]  # ties, for stability
    return x, values(dt, rng, 64).reshape(8, 8)


@program("sort", SOME, _sort_inputs)
def _sort(x: Any, m: Any) -> dict[str, Any]:
    out = {
        "sort": jnp.sort(x),
        "argsort": jnp.argsort(x, stable=True),
        "argsort_desc": jnp.argsort(x, stable=True, descending=True),
        "sort_axis0": jnp.sort(m, axis=0),
        "sort_pairs": lax.sort((m[0], m[1]), num_keys=1)[1],
    }
    if x.dtype != jnp.bool_ and not jnp.issubdtype(x.dtype, jnp.complexfloating):
        out["top_k"] = lax.top_k(x, 5)[1]
    return out


def _slice_inputs(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    x = values(dt, rng, 64).reshape(8, 8)
    upd = values(dt, rng, 9).reshape(3, 3)
    return x, upd, np.int32(rng.integers(0, 6)), np.int32(-3), np.int32(rng.integers(10, 99))


@program("dynamic", WIDTHS, _slice_inputs)
def _dynamic(x: Any, upd: Any, i: Any, neg: Any, big: Any) -> dict[str, Any]:
    ds, dus = lax.dynamic_slice, lax.dynamic_update_slice
    return {
        "slice": ds(x, (i, i + 1), (3, 4)),
        "slice_clamped": ds(x, (neg, big), (3, 4)),  # starts clamp into range
        "update": dus(x, upd, (i, i - i + 2)),
        "update_clamped": dus(x, upd, (big, neg)),
        "index": lax.dynamic_index_in_dim(x, i, axis=1, keepdims=False),
    }


@program(
    "layout", WIDTHS, lambda dt, rng: (values(dt, rng, 64).reshape(4, 16), rng.random(64) < 0.5)
)
def _layout(x: Any, mask: Any) -> dict[str, Any]:
    return {
        "transpose": x.T,
        "reverse": jnp.flip(x, axis=(0, 1)),
        "pad": lax.pad(x, x[0, 0], [(1, -1, 1), (-2, 3, 2)]),
        "concat": jnp.concatenate([x, x[:, ::-3]], axis=1),
        "reshape": x.reshape(8, 2, 4).transpose(2, 0, 1),
        "broadcast": jnp.broadcast_to(x[1], (3, 16)),
        "strided": x[::2, 1::3],
        "select": jnp.where(mask.reshape(4, 16), x, x[::-1]),
        "iota_eq": jnp.arange(64).reshape(4, 16) == jnp.real(x).astype(jnp.int32),
    }


# -- loops ---------------------------------------------------------------------------


def _loop_inputs(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    xs = small(dt, rng, (16, 8))
    if is_float(dt):
        xs[5, 2], xs[9, 7] = np.nan, np.inf
    return xs, small(dt, rng, (8,))


@program("loops", ("i8", "u32", "i64", "bf16", "f32", "f64"), _loop_inputs)
def _loops(xs: Any, init: Any) -> dict[str, Any]:
    # Scaling by 1/2 (floats) or 3 (ints) then adding is exact-per-step for
    # floats (a multiply by a power of two never rounds), modular for ints.
    scale = xs.dtype.type(3 if jnp.issubdtype(xs.dtype, jnp.integer) else 0.5)

    def step(carry: Any, x: Any) -> tuple[Any, Any]:
        carry = carry * scale + x
        return carry, carry - x

    carry, ys = lax.scan(step, init, xs)
    body = lambda i, c: c * scale + xs[i]  # noqa: E731
    return {
        "scan_carry": carry,
        "scan_ys": ys,
        "scan_reverse": lax.scan(step, init, xs, reverse=True)[1],
        "fori": lax.fori_loop(0, 16, body, init),
        "cumprod_like": lax.associative_scan(jnp.maximum, xs, axis=0),
    }


@program(
    "while_collatz",
    ("i32", "i64", "u32", "u64"),
    lambda dt, rng: (rng.integers(1, 10**4, 16).astype(dt),),
)
def _while_collatz(n: Any) -> Any:
    """Steps for each n to reach 1: a data-dependent trip count per element."""

    def cond(state: Any) -> Any:
        return jnp.any(state[0] != 1)

    def body(state: Any) -> Any:
        x, steps = state
        done = x == 1
        nxt = jnp.where(x % 2 == 0, x // 2, 3 * x + 1)
        return jnp.where(done, x, nxt), steps + (~done).astype(steps.dtype)

    return lax.while_loop(cond, body, (n, jnp.zeros_like(n)))[1]


# -- casts ---------------------------------------------------------------------------


def _cast_inputs(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    x = values(dt, rng, 96)
    if is_float(dt) or dt.kind == "c":
        # Values at and past every integer type's range, and rounding ties.
        edges = [127.5, -128.5, 255.5, 256.0, -0.7, 0.5, 1.5, 32767.5, 65535.5, 65536.0, 2.0**31]
        edges += [-(2.0**31) - 1, 2.0**32, 2.0**63, -(2.0**63), 2.0**64, 1e30, -1e30]
        with np.errstate(over="ignore"):
            x[: len(edges)] = np.array(edges).astype(dt)
    return (x,)


@program("cast", ALL, _cast_inputs)
def _cast(x: Any) -> dict[str, Any]:
    out = {}
    for name, dt in DTYPES.items():
        src = x
        if jnp.issubdtype(x.dtype, jnp.complexfloating) and dt.kind != "c":
            src = x.real  # what numpy's astype does, without its warning
        out[name] = lax.convert_element_type(src, dt)
    return out


_SAME_WIDTH = {2: ("i16", "u16", "f16", "bf16"), 4: ("i32", "u32", "f32"), 8: ("i64", "u64", "f64")}


@program("bitcast", INTS[1:4] + INTS[5:] + FLOATS, unary)
def _bitcast(x: Any) -> dict[str, Any]:
    names = _SAME_WIDTH[x.dtype.itemsize]
    return {name: lax.bitcast_convert_type(x, DTYPES[name]) for name in names}


# -- rng -------------------------------------------------------------------------------


def _key(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    """A legacy threefry key: uint32[2]."""
    return (rng.integers(0, 2**32, 2, dtype=np.uint64).astype(np.uint32),)


@program("rng_uniform", FLOATS, _key, takes_dtype=True)
def _rng_uniform(dt: Any, key: Any) -> dict[str, Any]:
    return {
        "uniform": jax.random.uniform(key, (64,), dt),
        "ranged": jax.random.uniform(key, (8, 8), dt, minval=-3, maxval=5),
    }


@program("rng_normal", ("bf16", "f32", "f64"), _key, TRANSCENDENTAL, takes_dtype=True)
def _rng_normal(dt: Any, key: Any) -> dict[str, Any]:
    return {
        "normal": jax.random.normal(key, (64,), dt),
        "exponential": jax.random.exponential(key, (64,), dt),
    }


@program("rng_int", ("i8", "u16", "i32", "u64"), _key, takes_dtype=True)
def _rng_int(dt: Any, key: Any) -> dict[str, Any]:
    ii = np.iinfo(dt)
    return {
        "randint": jax.random.randint(key, (64,), ii.min, min(ii.max, 2**62), dt),
        "randint_small": jax.random.randint(key, (64,), -5 if ii.min < 0 else 0, 7, dt),
        "bits": jax.random.bits(key, (64,), np.dtype(f"uint{ii.bits}")),
    }


@program("rng_misc", ("u32",), _key)
def _rng_misc(key: Any) -> dict[str, Any]:
    a, b = jax.random.split(key)
    return {
        "split": jax.random.split(key, 5),
        "fold_in": jax.random.fold_in(key, 42),
        "permutation": jax.random.permutation(a, 64),
        "bernoulli": jax.random.bernoulli(b, 0.3, (64,)),
        "choice": jax.random.choice(a, 100, (10,), replace=False),
    }


# -- fft -------------------------------------------------------------------------------


@program("fft", COMPLEX, lambda dt, rng: (_random_normal(dt, rng, (4, 64)),), SCALED_SUM)
def _fft(x: Any) -> dict[str, Any]:
    return {"fft": jnp.fft.fft(x), "ifft": jnp.fft.ifft(x), "fft2": jnp.fft.fft2(x)}


@program("rfft", ("f32", "f64"), lambda dt, rng: (_random_normal(dt, rng, (4, 64)),), SCALED_SUM)
def _rfft(x: Any) -> dict[str, Any]:
    return {"rfft": jnp.fft.rfft(x), "irfft": jnp.fft.irfft(jnp.fft.rfft(x), 64)}


# -- the full tier: bigger shapes ----------------------------------------------------------


def _big_unary(dt: np.dtype, rng: np.random.Generator) -> tuple[Any, ...]:
    return (values(dt, rng, 4096),)


for _name, _fn in {
    "exp": jnp.exp,
    "tanh": jnp.tanh,
    "atan": jnp.arctan,
    "erf": _special.erf,
}.items():
    add(f"{_name}_4096", _fn, ("f32", "f64"), _big_unary, TRANSCENDENTAL, full=True)
add(
    "matmul_128",
    lambda a, b: a @ b,
    ("f32", "f64"),
    lambda dt, rng: (_random_normal(dt, rng, (128, 128)), _random_normal(dt, rng, (128, 96))),
    SCALED,
    full=True,
)
add(
    "fft_1024",
    jnp.fft.fft,
    COMPLEX,
    lambda dt, rng: (_random_normal(dt, rng, (1024,)),),
    SCALED_SUM,
    full=True,
)


def cases(full: bool) -> list[Case]:
    """Every (program, dtype) case of the tier (``full`` adds the bigger ones)."""
    return [Case(p, d) for p in PROGRAMS if full or not p.full for d in p.dtypes]


# -- known plugin defects --------------------------------------------------------------------

#: (build, case id) -> what is wrong. A mismatch attributed to the plugin
#: must be listed here (and in docs/plugin_defects.md), and a listed one
#: must still reproduce: the tier fails otherwise, so the list stays true.
#: Each entry says which side is right where a reference (glibc's libm,
#: scipy, or the definition) settles it: some differences are jax's XLA
#: being less accurate than the plugin's.
_ATAN = "wrong: atan of arrays of 50+ elements returns unrelated values (even +-inf)"
_JAX_LESS_ACCURATE = "differs by {} ulps; the plugin is right (glibc/scipy), jax's XLA is off"
_JAX_FLUSHES_BF16 = "keeps bf16 subnormals; the plugin is right (IEEE), jax's XLA flushes them to 0"
KNOWN_PLUGIN_DEFECTS: dict[tuple[str, str], str] = {
    ("xla-cpu-pjrt", "cbrt-bf16"): "wrong: cbrt of subnormals and tiny normals",
    ("xla-cpu-pjrt", "cbrt-f32"): "wrong: cbrt of subnormals (jax's is wrong too); 12-15 ulps",
    ("xla-cpu-pjrt", "cbrt-f64"): "subnormals: cbrt(5e-324) 1.35e-108 (jax 0.0); 75 ulps at max",
    ("xla-cpu-pjrt", "atan-f64"): "subnormal flushed: atan(2.2250738585072e-308) = 0",
    ("fastatomstruct", "atan-f64"): "subnormal flushed: atan(2.2250738585072e-308) = 0",
    ("lammps", "atan-bf16"): _ATAN,
    ("lammps", "atan-f16"): _ATAN,
    ("lammps", "atan-f32"): _ATAN,
    ("lammps", "atan-f64"): _ATAN,
    ("lammps", "atan_4096-f32"): _ATAN,
    ("lammps", "atan_4096-f64"): _ATAN,
    ("xla-cpu-pjrt", "atan_4096-f64"): "subnormal flushed: atan(2.2250738585072e-308) = 0",
    ("fastatomstruct", "atan_4096-f64"): "subnormal flushed: atan(2.2250738585072e-308) = 0",
    ("lammps", "cast-bf16"): "wrong: subnormal bf16 converts to bool False",
    ("lammps", "log1p-f64"): _JAX_LESS_ACCURATE.format(90),
    ("lammps", "atanh-f64"): _JAX_LESS_ACCURATE.format(20),
    ("lammps", "rng_normal-f64"): _JAX_LESS_ACCURATE.format("8-19"),
    ("lammps", "minmax-bf16"): _JAX_FLUSHES_BF16,
    ("lammps", "hypot-bf16"): _JAX_FLUSHES_BF16,
}
