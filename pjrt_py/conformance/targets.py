"""Which plugin builds a conformance run uses, and their labels.

``--plugin`` takes what ``pjrt-py run --plugin`` and ``Client`` take, read
by the one resolver, ``pjrt_py.plugin.find_plugin``: a ``.so`` path, a
platform name (``cpu``, ``cuda``: that platform's default build) or an
installed distribution's name (``lammps-jax-pjrt-cpu``: the PJRT plugin file
that distribution installed). With none, ``$PJRT_PLUGIN``, else ``cpu``.
``--all-plugins`` takes every plugin ``pjrt_py.plugins`` finds. Each build
is labelled by its distribution name where one is known, else by its file
name.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
from dataclasses import dataclass
from pathlib import Path

from ..runtime.discovery import find_plugin, plugins


@dataclass(frozen=True)
class Target:
    """One plugin build to run the cases on."""

    label: str
    path: str


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution_files(name: str) -> list[Path]:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return []
    return [Path(str(dist.locate_file(f))).resolve() for f in dist.files or []]


def distribution_of(path: str) -> str | None:
    """The distribution that installed the plugin file ``path``, if known.

    ``pjrt_py.plugins`` knows it for the builds it finds; for another
    file inside a site-packages, a distribution named like the file's
    directory is taken when it owns the file (no scan of every installed
    distribution: that costs a third of a second)."""
    resolved = Path(path).resolve()
    for info in plugins():
        if Path(info.path).resolve() == resolved:
            known = getattr(info, "distribution", None)
            if isinstance(known, str):
                return known
    if not any(p.name == "site-packages" for p in resolved.parents):
        return None
    name = _normalise(resolved.parent.name)
    return name if resolved in _distribution_files(name) else None


def _label(path: str, taken: set[str]) -> str:
    base = distribution_of(path) or Path(path).name
    label, n = base, 2
    while label in taken:
        label, n = f"{base}#{n}", n + 1
    taken.add(label)
    return label


def resolve(specs: list[str], all_plugins: bool) -> list[Target]:
    """The builds named by ``--plugin`` specs and ``--all-plugins``, deduplicated.

    Raises
    ------
    FileNotFoundError
        For a spec that names no plugin found on this machine.
    """
    paths: list[str] = []
    if all_plugins:
        paths += [info.path for info in plugins()]
    for spec in specs:
        paths.append(find_plugin(spec, origin="--plugin"))
    if not paths:
        paths.append(find_plugin())  # $PJRT_PLUGIN, else cpu
    unique = list(dict.fromkeys(str(Path(p).resolve()) for p in paths))
    taken: set[str] = set()
    return [Target(_label(p, taken), p) for p in unique]
