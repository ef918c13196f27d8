"""Finding PJRT plugins: the builds pjrt_py knows, what is installed, and which to load.

``plugins()`` lists the installed plugin builds; ``find_plugin`` turns a
platform name, a distribution name or a path (or ``$PJRT_PLUGIN``) into one
library's path; ``plugin_info`` reads what a path is. Loading the library
is ``pjrt_py.runtime.plugin``'s.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path


@dataclass(frozen=True)
class Build:
    """A plugin build pjrt_py knows, with what was measured of it.

    ``defects`` lists wrong results found in that build by pjrt_py's tests
    (``tests/test_differential.py``, ``tests/test_plugin_builds.py``;
    ``docs/plugins.md`` gives the evidence): values unrelated to the right
    ones on ordinary inputs. They decide the default. ``edge_cases`` lists
    where it differs from ``jax.jit`` only at subnormals or poles, or by a few
    ulps; every CPU build has some, so they do not (``docs/plugin_defects.md``).
    """

    distribution: str  # the PyPI name
    platform: str
    package: str  # the import package that holds the library
    pattern: str  # glob for the library inside it
    api: tuple[int, int] | None  # the PJRT C API it implements, as measured
    defects: tuple[str, ...] = ()
    edge_cases: tuple[str, ...] = ()


_ATAN_F64_SUBNORMAL = "f64 atan flushes a subnormal input to 0"

# Every build pjrt_py can find installed, in the order a platform name picks
# them: builds with no known wrong result first, then the newest API. The
# order is written out (and checked by tests against the rule) rather than
# computed, so that it reads as the decision it is.
BUILDS: tuple[Build, ...] = (
    Build(
        "fastatomstruct-xla-cpu",
        "cpu",
        "fastatomstruct_xla_cpu",
        "libpjrt_cpu.so",
        (0, 106),
        (),
        (_ATAN_F64_SUBNORMAL,),
    ),
    Build(
        "lammps-jax-pjrt-cpu",
        "cpu",
        "lammps_jax_pjrt_cpu",
        "pjrt_c_api_cpu_plugin.so",
        (0, 115),
        (
            "atan of an array of 50 or more elements is wrong in every float dtype "
            "(f32: up to 3.6 off at 64 elements)",
        ),
        (
            "a subnormal bf16 converts to bool False",
            "bf16 max, min, clamp and hypot keep subnormals that jax's XLA flushes to 0 "
            "(the plugin is right)",
            "f64 log1p, atanh and normal rng differ by 8-90 ulps (the plugin is closer to libm)",
        ),
    ),
    Build(
        "xla-cpu-pjrt",
        "cpu",
        "xla_plugins.xla_cpu_pjrt",
        "xla_cpu_pjrt.so",
        (0, 81),
        (
            "a gather of a constant operand can come back with two result dimensions "
            "swapped (tests/data/known_wrong_gather.mlir)",
        ),
        (_ATAN_F64_SUBNORMAL, "cbrt of subnormals differs from jax (both are wrong)"),
    ),
    Build("jax-cuda13-pjrt", "cuda", "jax_plugins", "xla_cuda13/xla_cuda_plugin.so", None),
    Build("jax-cuda12-pjrt", "cuda", "jax_plugins", "xla_cuda12/xla_cuda_plugin.so", None),
    Build("libtpu", "tpu", "libtpu", "libtpu.so", None),
    Build("jax-rocm-pjrt", "rocm", "jax_plugins", "xla_rocm*/xla_rocm_plugin.so", None),
)
PLATFORMS = ("cpu", "cuda", "tpu", "rocm")


@dataclass(frozen=True)
class PluginInfo:
    """A plugin found on this machine (nothing is loaded to find it).

    ``distribution`` is the PyPI distribution that installed it and
    ``version`` that distribution's version; ``api`` the PJRT C API version
    measured for that build, ``defects`` the wrong results known in it and
    ``edge_cases`` its differences at subnormals, poles or by ulps (see
    ``BUILDS``); ``default`` says whether its platform name picks it.

    Parameters
    ----------
    name : str
        The platform: ``"cpu"``, ``"cuda"``, ``"tpu"`` or ``"rocm"`` (``"?"``
        for a library no known build matches).
    path : str
        The plugin library's resolved path.
    distribution : str, optional
        The PyPI distribution that installed it.
    version : str, optional
        That distribution's installed version.
    api : tuple of (int, int), optional
        ``(major, minor)`` of the PJRT C API measured for the build; None if
        not measured.
    defects : tuple of str
        Wrong results known in the build.
    default : bool
        Whether the platform name picks this plugin.
    edge_cases : tuple of str
        Differences from ``jax.jit`` at subnormals, poles or by a few ulps.
    """

    name: str  # the platform: cpu, cuda, tpu, rocm
    path: str
    distribution: str | None = None
    version: str | None = None
    api: tuple[int, int] | None = None
    defects: tuple[str, ...] = ()
    default: bool = False
    edge_cases: tuple[str, ...] = ()


def _package_dirs(package: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def plugins() -> list[PluginInfo]:
    """The plugins installed as wheels; for each platform, the default first.

    Only the known builds (``BUILDS``) are looked for, in their import
    packages; nothing is loaded.

    Returns
    -------
    list of PluginInfo
        One entry per library found, in the order of ``BUILDS``; the first
        of each platform has ``default=True``.
    """
    found: list[PluginInfo] = []
    seen: set[str] = set()
    for build in BUILDS:
        for directory in _package_dirs(build.package):
            for so in sorted(directory.glob(build.pattern)):
                path = str(so.resolve())
                if path in seen:
                    continue
                seen.add(path)
                first = not any(i.name == build.platform for i in found)
                found.append(
                    PluginInfo(
                        build.platform,
                        path,
                        build.distribution,
                        _version(build.distribution),
                        build.api,
                        build.defects,
                        default=first,
                        edge_cases=build.edge_cases,
                    )
                )
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _from_distribution(name: str) -> str | None:
    """The library a distribution installed: a known build's, or its only ``.so``
    (of several, its only one named like a PJRT plugin, ``*pjrt*.so``)."""
    for info in plugins():
        if info.distribution is not None and _normal(info.distribution) == _normal(name):
            return info.path
    try:
        files = metadata.distribution(name).files or []
    except metadata.PackageNotFoundError:
        return None
    libraries = [f for f in files if f.name.endswith(".so")]
    if len(libraries) > 1:
        libraries = [f for f in libraries if "pjrt" in f.name.lower()]
    if len(libraries) != 1:
        return None
    return str(Path(str(libraries[0].locate())).resolve())


def find_plugin(spec: str | os.PathLike[str] | None = None, *, origin: str | None = None) -> str:
    """Resolve a plugin spec to a ``.so`` path.

    A spec is a path to a plugin library; a platform name (``"cpu"``,
    ``"cuda"``, ``"tpu"``, ``"rocm"``), which picks that platform's default
    build (the first of ``plugins``: no known wrong result first, then
    the newest PJRT API); or the PyPI distribution name of an installed
    plugin (``"xla-cpu-pjrt"``). With no spec, the ``PJRT_PLUGIN``
    environment variable (any of those), else ``"cpu"``. Every way of naming
    a plugin (``Client``, ``pjrt-py run --plugin``, ``pjrt-py test --plugin``)
    comes here.

    Parameters
    ----------
    spec : str or path, optional
        The plugin, as above.
    origin : str, optional
        Where ``spec`` came from (``"--plugin"``), for the error message;
        ``$PJRT_PLUGIN`` when it came from there.

    Raises
    ------
    FileNotFoundError
        If ``spec`` names no installed plugin and no file.
    """
    if spec is None and os.environ.get("PJRT_PLUGIN"):
        spec, origin = os.environ["PJRT_PLUGIN"], "$PJRT_PLUGIN"
    text = os.fspath("cpu" if spec is None else spec)
    named = f"{text!r}" if origin is None else f"{text!r} (from {origin})"
    if text in PLATFORMS:
        for info in plugins():
            if info.name == text:
                return info.path
        raise FileNotFoundError(
            f"PJRT plugin {named}: no {text} plugin is installed; found: "
            f"{[i.distribution for i in plugins()] or 'none'} (pass a path to a plugin .so, "
            f"a distribution name, or set PJRT_PLUGIN)"
        )
    path = Path(text).expanduser()
    if path.is_file():
        return str(path.resolve())
    if "/" not in text:
        found = _from_distribution(text)
        if found is not None:
            return found
    raise FileNotFoundError(
        f"PJRT plugin {named}: no such file or installed plugin distribution (expected a "
        f"path to a .so, one of {list(PLATFORMS)}, or a distribution such as "
        f"{[b.distribution for b in BUILDS if b.platform == 'cpu']})"
    )


def plugin_info(path: str) -> PluginInfo:
    """What ``plugins`` knows of the library at ``path`` (a bare entry if nothing)."""
    for info in plugins():
        if info.path == path:
            return info
    return PluginInfo("?", path)
