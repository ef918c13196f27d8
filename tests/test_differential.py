"""Differential tier: pjrt_py on every installed CPU PJRT build vs ``jax.jit``.

Each case of the catalogue (``tests/differential/programs.py``) is lowered
once with ``jax.jit(f, keep_unused=True).lower(*args).as_text()``; jax's own
result is the reference. Every installed build then compiles that text through
``Client.compile`` and runs it on the same numpy inputs, and the results are
compared under the case's tolerance (exact, a few ulps, or scaled; the policy
is in the catalogue's docstring).

Attribution. A mismatch is the binding's or the plugin's:

1. Data path: every input must come back bit for bit from
   ``client.buffer(x).to_numpy()``; if not, the BINDING is wrong.
2. Program and options: the same StableHLO text is compiled with the same
   ``CompileOptionsProto`` bytes pjrt_py sends
   (:func:`pjrt_py.programs.compile_options.options_for_program`) on jaxlib's own CPU
   client, the XLA ``jax.jit`` uses. If that also differs from ``jax.jit``,
   what pjrt_py asks for is what changed the result: a BINDING defect.
3. Otherwise the plugin computes the same request differently from jax's
   XLA: a PLUGIN defect of that build.

What fails the tier: every BINDING mismatch, and nothing else by default.
A plugin's defect is not pjrt_py's, and XLA's CPU code generation follows
the host CPU, so a build can round differently on another machine: CI must
not fail for it. A PLUGIN mismatch is reported as xfail with its details
(``-ra`` prints them), marked UNLISTED when ``KNOWN_PLUGIN_DEFECTS`` lacks
it; a listed defect that no longer reproduces is a warning.
``PJRT_PY_DIFFERENTIAL_STRICT=1`` turns both into failures: run it when a
build changes, so the list and ``docs/plugin_defects.md`` stay true.

The default tier covers every category: 294 cases per build, each compiled
once per build, in 2-4 minutes for three builds on 2 cores.
``PJRT_PY_DIFFERENTIAL=full`` adds bigger shapes and more hypothesis examples.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.extend.backend
import ml_dtypes
import numpy as np
import pytest
from differential.programs import (
    DTYPES,
    KNOWN_PLUGIN_DEFECTS,
    Case,
    Tolerance,
    cases,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pjrt_py
from pjrt_py.programs.compile_options import options_for_program

FULL = os.environ.get("PJRT_PY_DIFFERENTIAL", "") == "full"
STRICT = os.environ.get("PJRT_PY_DIFFERENTIAL_STRICT", "") == "1"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugin_defects.md"

# -- the builds --------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    """An installed CPU PJRT plugin: its id in test names, package and library."""

    name: str
    package: str
    pjrt: str
    module: str
    library: str

    @functools.cached_property
    def path(self) -> str | None:
        for plugin in pjrt_py.plugins():
            if plugin.path.endswith(os.sep + self.library):
                return plugin.path
        try:
            spec = importlib.util.find_spec(self.module)
        except ImportError:
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        path = os.path.join(list(spec.submodule_search_locations)[0], self.library)
        return path if os.path.exists(path) else None


BUILDS = (
    Build("xla-cpu-pjrt", "xla-cpu-pjrt", "0.81", "xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so"),
    Build(
        "lammps",
        "lammps-jax-pjrt-cpu",
        "0.115",
        "lammps_jax_pjrt_cpu",
        "pjrt_c_api_cpu_plugin.so",
    ),
    Build(
        "fastatomstruct",
        "fastatomstruct-xla-cpu",
        "0.106",
        "fastatomstruct_xla_cpu",
        "libpjrt_cpu.so",
    ),
)


@functools.cache
def _client(build: Build) -> pjrt_py.Client:
    return pjrt_py.Client(build.path)


def plugin_client(build: Build) -> pjrt_py.Client:
    """The build's client, loaded once per session; skips when not installed."""
    if build.path is None:
        pytest.skip(f"{build.package} (PJRT {build.pjrt} CPU plugin) is not installed")
    return _client(build)


# -- jax's side ------------------------------------------------------------------------

CPU = jax.devices("cpu")[0]


def on_cpu(args: Sequence[Any]) -> list[Any]:
    return [jax.device_put(a, CPU) for a in args]


@dataclass
class Reference:
    """One program on one set of inputs, as jax lowers and runs it."""

    case_id: str
    text: str
    args: tuple[Any, ...]
    want: list[np.ndarray]
    names: list[str]
    tolerance: Tolerance
    scale: list[Any]


@functools.cache
def _jitted(case: Case) -> Any:
    return jax.jit(case.fn, keep_unused=True)


def make_reference(case: Case, args: tuple[Any, ...]) -> Reference:
    jitted = _jitted(case)
    with jax.enable_x64(True), jax.default_device(CPU):
        committed = on_cpu(args)
        lowered = jitted.lower(*committed)
        text = lowered.as_text()
        out = lowered.compile()(*committed)
        paths, _ = zip(*jax.tree_util.tree_flatten_with_path(out)[0], strict=True)
        want = [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]
        scale = _scale(case, jitted, args)
    names = [case.id + jax.tree_util.keystr(p) for p in paths]
    return Reference(case.id, text, args, want, names, case.program.tolerance, scale)


def _scale(case: Case, jitted: Any, args: tuple[Any, ...]) -> list[Any]:
    tol = case.program.tolerance
    if tol.kind != "scaled":
        return []
    if tol.scale == "sum":
        total = sum(float(np.sum(np.abs(a.astype(np.complex128)))) for a in args)
        return [total] * len(jax.tree_util.tree_leaves(jax.eval_shape(jitted, *args)))
    magnitudes = [np.abs(a).astype(a.dtype) for a in args]
    out = jitted(*on_cpu(magnitudes))
    return [np.abs(np.asarray(x)).astype(np.float64) for x in jax.tree_util.tree_leaves(out)]


@functools.cache
def reference(case: Case) -> Reference:
    return make_reference(case, case.args())


@functools.cache
def _jaxlib_executable(text: str, options: bytes) -> Any:
    backend = jax.extend.backend.get_backend("cpu")
    parse = type(jax.extend.backend.get_compile_options(1, 1)).ParseFromString
    return backend.compile_and_load(text, backend.devices()[:1], parse(options))


def jaxlib_outputs(text: str, options: bytes, args: Sequence[Any]) -> list[np.ndarray]:
    """The program run by jaxlib's own CPU client, compiled with ``options``."""
    with jax.enable_x64(True):
        outs = _jaxlib_executable(text, options).execute(on_cpu(args))
        return [np.asarray(x) for x in outs]


# -- comparing ---------------------------------------------------------------------------


def _ordered(a: np.ndarray) -> np.ndarray:
    """Float bits as integers ordered like the floats (-0 one below +0)."""
    bits = a.view(np.dtype(f"u{a.itemsize}")).astype(object)
    top = 1 << (8 * a.itemsize - 1)
    return np.where(bits >= top, top - bits - 1, bits)


def _float_parts(a: np.ndarray) -> np.ndarray:
    return np.stack([a.real, a.imag], axis=-1) if a.dtype.kind == "c" else a


def _is_float(dt: np.dtype) -> bool:
    return dt.kind in "fc" or dt == np.dtype(ml_dtypes.bfloat16)


def differences(
    want: np.ndarray, got: np.ndarray, tol: Tolerance, scale: Any
) -> tuple[np.ndarray, np.ndarray | None]:
    """A mask of the elements out of tolerance, and their ulp distances (ulp mode)."""
    if not _is_float(want.dtype):
        return want != got, None
    w, g = _float_parts(want), _float_parts(got)
    nan_w, nan_g = np.isnan(w.astype(np.float64)), np.isnan(g.astype(np.float64))
    bad = nan_w != nan_g
    both = ~nan_w & ~nan_g
    ulps = None
    if tol.kind == "exact":
        bad |= both & (w.view(np.dtype(f"u{w.itemsize}")) != g.view(np.dtype(f"u{g.itemsize}")))
    elif tol.kind == "ulp":
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        inf = np.isinf(w64) | np.isinf(g64)
        bad |= both & inf & (w64 != g64)
        ulps = np.abs(
            _ordered(np.where(both, w, 0).astype(w.dtype))
            - _ordered(np.where(both, g, 0).astype(g.dtype))
        )
        bad |= both & ~inf & (ulps > tol.ulps).astype(bool)
    else:
        w128, g128 = want.astype(np.complex128), got.astype(np.complex128)
        eps = float(ml_dtypes.finfo(w.dtype).eps)
        close = (w128 == g128) | (np.abs(w128 - g128) <= tol.eps_factor * eps * scale)
        nan_w, nan_g = np.isnan(w128), np.isnan(g128)
        return (nan_w != nan_g) | (~nan_w & ~nan_g & ~close), None
    if want.dtype.kind == "c":
        bad = bad.any(axis=-1)
        ulps = None if ulps is None else ulps.max(axis=-1)
    return bad, ulps


def compare(ref: Reference, got: Sequence[np.ndarray] | Exception) -> list[str]:
    """Each output out of tolerance, described; [] when all agree."""
    if isinstance(got, Exception):
        return [f"{ref.case_id}: {type(got).__name__}: {str(got)[:300]}"]
    if len(got) != len(ref.want):
        return [f"{ref.case_id}: {len(got)} outputs, jax has {len(ref.want)}"]
    problems = []
    for i, (name, w, g) in enumerate(zip(ref.names, ref.want, got, strict=True)):
        if g.dtype != w.dtype or g.shape != w.shape:
            problems.append(f"{name}: got {g.dtype}{g.shape}, jax {w.dtype}{w.shape}")
            continue
        scale = ref.scale[i] if ref.scale else None
        bad, ulps = differences(w, g, ref.tolerance, scale)
        if not bad.any():
            continue
        where = np.argwhere(bad)
        first = tuple(int(j) for j in where[0])
        detail = f"{name}: {len(where)}/{bad.size} differ; at {list(first)} jax {w[first]!r}"
        detail += f" got {g[first]!r}"
        if ulps is not None:
            detail += f" (max {max(int(u) for u in ulps[bad])} ulps)"
        if _is_float(w.dtype) and w.dtype.kind != "c":
            err = np.abs(w[bad].astype(np.float64) - g[bad].astype(np.float64))
            finite = err[np.isfinite(err)]
            if finite.size and finite.max() > 0:
                detail += f" max |error| {finite.max():.3g}"
        problems.append(detail)
    return problems


# -- running on a plugin, and attribution ----------------------------------------------------


def run_on_plugin(
    client: pjrt_py.Client, ref: Reference, options: bytes | None = None
) -> list[np.ndarray] | Exception:
    """``ref``'s program compiled by ``client`` (with ``options`` if given) and run."""
    try:
        out = client.compile(ref.text, compile_options=options).execute(*ref.args)
    except pjrt_py.PjrtError as error:
        return error
    return [b.to_numpy() for b in (out if isinstance(out, tuple) else (out,))]


def data_path_problems(client: pjrt_py.Client, args: Sequence[Any]) -> list[str]:
    """Inputs that do not come back bit for bit from the plugin."""
    problems = []
    for i, a in enumerate(args):
        back = client.buffer(a).to_numpy()
        a = np.asarray(a)
        if back.dtype != a.dtype or back.shape != a.shape or back.tobytes() != a.tobytes():
            problems.append(f"argument {i} ({a.dtype}{a.shape}) changed on its round trip")
    return problems


def sent_options(client: pjrt_py.Client, text: str) -> bytes:
    """The CompileOptionsProto bytes ``client.compile(text)`` sends."""
    return options_for_program(
        text,
        num_replicas=None,
        num_partitions=None,
        device_assignment=None,
        device=None,
        device_ids=[d.id for d in client.devices],
    )


def attribute(
    client: pjrt_py.Client, ref: Reference, options: bytes | None = None
) -> tuple[str, list[str]]:
    """("BINDING" | "PLUGIN", why) for a mismatch of ``ref`` on ``client``.

    ``options``: the bytes the program was compiled with, if not Client.compile's own.
    """
    moved = data_path_problems(client, ref.args)
    if moved:
        return "BINDING", ["data path: " + m for m in moved]
    if options is None:
        options = sent_options(client, ref.text)
    try:
        via_jaxlib = compare(ref, jaxlib_outputs(ref.text, options, ref.args))
    except Exception as error:  # jaxlib rejects what pjrt_py sends
        via_jaxlib = [f"jaxlib's client rejects pjrt_py's options {options.hex()}: {error}"]
    if via_jaxlib:
        return "BINDING", [
            f"jaxlib's own CPU client, given pjrt_py's compile options ({options.hex()}), "
            "differs from jax.jit too:",
            *via_jaxlib,
        ]
    return "PLUGIN", ["jaxlib's own CPU client, given pjrt_py's compile options, agrees"]


def check(build: Build, client: pjrt_py.Client, ref: Reference, *, seeded: bool) -> None:
    """Fail on a binding mismatch; xfail a plugin one (fail on it if STRICT and unlisted).

    ``seeded``: the catalogue's own inputs, on which a listed defect must reproduce.
    """
    key = (build.name, ref.case_id)
    problems = compare(ref, run_on_plugin(client, ref))
    if not problems:
        if seeded and key in KNOWN_PLUGIN_DEFECTS:
            stale = (
                f"listed plugin defect no longer reproduces on {build.package}: "
                f"{KNOWN_PLUGIN_DEFECTS[key]} -- remove it from KNOWN_PLUGIN_DEFECTS and "
                "docs/plugin_defects.md"
            )
            if STRICT:
                pytest.fail(stale)
            warnings.warn(stale, stacklevel=2)
        return
    who, why = attribute(client, ref)
    report = "\n  ".join([*problems, *why])
    if who == "BINDING":
        pytest.fail(f"BINDING mismatch on {build.package} (PJRT {build.pjrt}):\n  {report}")
    if key not in KNOWN_PLUGIN_DEFECTS:
        unlisted = (
            f"UNLISTED plugin defect of {build.package} (PJRT {build.pjrt}):\n  {report}\n"
            f"  add {key} to KNOWN_PLUGIN_DEFECTS and docs/plugin_defects.md"
        )
        if STRICT:
            pytest.fail(unlisted)
        pytest.xfail(unlisted)
    if seeded:  # on hypothesis's inputs, a listed defect lets the search go on
        pytest.xfail(f"known plugin defect: {KNOWN_PLUGIN_DEFECTS[key]}: {problems[0]}")


# -- the tests -------------------------------------------------------------------------------

CASES = cases(FULL)


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: b.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_plugin_matches_jax(case: Case, build: Build) -> None:
    client = plugin_client(build)
    ref = reference(case)
    assert data_path_problems(client, ref.args) == [], "BINDING: the data path changed inputs"
    check(build, client, ref, seeded=True)


# Hypothesis picks the inputs (same shapes and dtypes as the catalogue's, so
# each build compiles each program once).
HYPOTHESIS_CASES = {
    c.id: c
    for c in CASES
    if c.id in {"atan-f32", "pow-f64", "minmax-f32", "arith-f16", "int_binary-i32", "cast-f64"}
}


def _inputs_like(args: tuple[Any, ...]) -> st.SearchStrategy[tuple[Any, ...]]:
    arrays = []
    for a in args:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            elements = st.floats(width=8 * a.itemsize, allow_subnormal=True)
            arrays.append(hnp.arrays(a.dtype, a.shape, elements=elements))
        else:
            arrays.append(hnp.arrays(a.dtype, a.shape))
    return st.tuples(*arrays)


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: b.name)
@pytest.mark.parametrize("case_id", sorted(HYPOTHESIS_CASES))
def test_plugin_matches_jax_on_hypothesis_inputs(case_id: str, build: Build) -> None:
    client = plugin_client(build)
    case = HYPOTHESIS_CASES[case_id]

    @settings(
        max_examples=40 if FULL else 4,
        deadline=None,
        derandomize=not FULL,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(_inputs_like(case.args()))
    def agrees(args: tuple[Any, ...]) -> None:
        check(build, client, make_reference(case, args), seeded=False)

    agrees()


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: b.name)
def test_every_bit_pattern_round_trips(build: Build) -> None:
    """All 16-bit patterns (NaN payloads, subnormals, -0) and random wider ones."""
    client = plugin_client(build)
    rng = np.random.default_rng(0)
    patterns = {2: np.arange(2**16, dtype=np.uint16)}
    for size in (1, 4, 8):
        patterns[size] = rng.integers(0, 256, 4096 * size, dtype=np.uint8).view(f"u{size}")
    for name, dt in DTYPES.items():
        if dt == np.bool_:
            x = rng.random(4096) < 0.5
        elif dt.kind == "c":
            x = patterns[dt.itemsize // 2].view(dt)
        else:
            x = patterns[dt.itemsize].view(dt)
        assert data_path_problems(client, (x,)) == [], name


# What Client.compile sent before it took jax's DebugOptions: max(1, NaN) = 1.
MINIMAL_OPTIONS = bytes.fromhex("1a0420012801")


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: b.name)
def test_attribution_blames_the_binding_for_options_unlike_jax(build: Build) -> None:
    """The method's own check: options that change results are the binding's doing."""
    client = plugin_client(build)
    ref = reference(next(c for c in CASES if c.id == "minmax-f32"))
    problems = compare(ref, run_on_plugin(client, ref, MINIMAL_OPTIONS))
    assert any("['max']" in p for p in problems), problems
    who, why = attribute(client, ref, MINIMAL_OPTIONS)
    assert who == "BINDING", why


def test_known_plugin_defects_are_documented() -> None:
    page = DOCS.read_text()
    for build, case_id in KNOWN_PLUGIN_DEFECTS:
        assert build in {b.name for b in BUILDS}
        assert f"`{case_id}`" in page, f"{case_id} ({build}) is not in docs/plugin_defects.md"


def test_attribution_blames_the_plugin_for_the_0115_atan() -> None:
    """The method's other side: a build's own wrong result is the plugin's."""
    build = next(b for b in BUILDS if b.name == "lammps")
    client = plugin_client(build)
    ref = reference(next(c for c in CASES if c.id == "atan-f32"))
    problems = compare(ref, run_on_plugin(client, ref))
    assert problems, "the PJRT 0.115 build's atan of 64 elements is wrong (KNOWN_PLUGIN_DEFECTS)"
    who, why = attribute(client, ref)
    assert who == "PLUGIN", why
