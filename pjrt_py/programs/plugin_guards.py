"""Refusing programs a known plugin build kills the process on while compiling.

``mlir_checks`` refuses text that any plugin's parser would crash on. This
module holds what particular builds abort on, found by the PJRT API version
they report, each one measured. Such a program is a ``ValueError`` before
the plugin sees it, unless the compile is isolated: ``compile(...,
isolate=True)`` runs the compiler in a helper process, where the abort is a
``CompilerCrashError`` and a build that does compile it still can.

- **Packed arrays between layouts** (PJRT before 0.106). xla-cpu-pjrt (PJRT
  0.81) aborts (``dims and input_strides_in_bytes must have equal sizes``)
  compiling a program that copies an int4, uint4, int2, uint2 or
  float4_e2m1fn parameter or result into another layout, such as
  ``return %x`` with only the parameter, or only the result, column-major.
  The program is refused on such a build whenever a packed parameter or
  result asks for an explicit order that is not row-major (``mhlo.layout_mode
  = "{0,1}"``, with or without a tiling suffix such as ``"{0,1:T(2,2)}"``, or
  one it cannot read); which programs abort exactly is the compiler's
  business, so the check is wider than the defect. The 0.106 and 0.115
  builds compile and run all of them correctly.
- **Empty results in two layouts** (CPU builds from PJRT 0.106).
  fastatomstruct-xla-cpu (0.106) and lammps-jax-pjrt-cpu (0.115) die of
  SIGFPE in their tiled-fusion emitter compiling a program with two
  zero-element results of one shape, one of them in another explicit order
  (``-> (tensor<0x3xf32> {mhlo.layout_mode = "{0,1}"}, tensor<0x3xf32>)``);
  each alone, in one order, of two dtypes, or "auto" beside "{0,1}",
  compiles (a helper's fuzz, then measured).
  xla-cpu-pjrt (0.81) compiles it. Refused on the CPU builds from 0.106
  whenever zero-element results of one shape and dtype ask for different
  explicit orders.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..runtime.dtypes import PACKED
from .mlir_text import main_signature, read_main, tensor_type
from .signature import ArgSpec

PACKED_LAYOUTS_FROM = (0, 106)  # the oldest build measured not to abort
EMPTY_RESULTS_FROM = (0, 106)  # the oldest build measured to abort

_LAYOUT = re.compile(r'mhlo\.layout_mode\s*=\s*"([^"]*)"')


def check_for_plugin(text: str, api_version: Sequence[int], platform: str = "cpu") -> None:
    """Raise ``ValueError`` for a program the plugin of ``api_version`` (and
    ``platform``) is known to abort on (see the module's docstring)."""
    if platform == "cpu" and tuple(api_version) >= EMPTY_RESULTS_FROM:
        _check_empty_results(text, api_version)
    if tuple(api_version) >= PACKED_LAYOUTS_FROM:
        return
    for what, spec in _declared(text):
        if spec.dtype not in PACKED or spec.default_layout or spec.layout == "auto":
            continue
        order = _order(spec)
        if order is None or order != tuple(range(len(order) - 1, -1, -1)):
            raise ValueError(
                f"{what} is {spec} in layout {spec.layout}: PJRT "
                f"{api_version[0]}.{api_version[1]} builds abort the process compiling a "
                f"packed array copied between layouts (builds from PJRT "
                f"{PACKED_LAYOUTS_FROM[0]}.{PACKED_LAYOUTS_FROM[1]} compile it); keep it "
                f"row-major, or "
                f"compile(..., isolate=True) to try in a helper process"
            )


def _order(spec: ArgSpec) -> tuple[int, ...] | None:
    """The dimension order of an explicit layout, before any tiling or
    element-size suffix ("{0,1:T(2,2)}"); None if it cannot be read."""
    dims = re.fullmatch(r"\{\s*([\d\s,]*?)\s*(?::.*)?\}", spec.layout or "")
    return tuple(int(d) for d in re.findall(r"\d+", dims.group(1))) if dims else None


def _check_empty_results(text: str, api_version: Sequence[int]) -> None:
    """Zero-element results of one shape and dtype in two explicit orders
    (the default counts as row-major; "auto", the compiler's choice, as none)."""
    orders: dict[tuple[tuple[int | None, ...], object], set[object]] = {}
    for what, spec in _declared(text):
        if not what.startswith("result") or spec.shape is None or 0 not in spec.shape:
            continue
        if spec.layout == "auto":  # measured: compiles next to "{0,1}"
            continue
        row_major = tuple(range(len(spec.shape) - 1, -1, -1))
        order = row_major if spec.default_layout else _order(spec)
        orders.setdefault((spec.shape, spec.dtype), set()).add(order or spec.layout)
    for (shape, _), seen in orders.items():
        if len(seen) > 1:
            raise ValueError(
                f"two empty results of shape {list(shape)} ask for different layouts: PJRT "
                f"{api_version[0]}.{api_version[1]} CPU builds kill the process compiling "
                f"that (SIGFPE); give them one layout, or compile(..., isolate=True) to try "
                f"in a helper process"
            )


def _declared(text: str) -> list[tuple[str, ArgSpec]]:
    """@main's parameters and results with their layouts; [] if unreadable."""
    try:
        main = read_main(text)
    except ValueError:
        return []
    if main is None:
        return []
    found = [(f"parameter {spec.name!r}", spec) for spec in main_signature(text) or []]
    for index, (declared, kind) in enumerate(zip(main.results, main.result_types, strict=True)):
        shape, dtype = tensor_type(kind)
        mode = _LAYOUT.search(declared)
        found.append((f"result {index}", ArgSpec("", shape, dtype, mode and mode.group(1))))
    return found
