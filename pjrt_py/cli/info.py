"""``pjrt-py info``: the plugins found, their PJRT API versions and devices."""

from __future__ import annotations

import argparse
from typing import Any


def chosen(found: list[Any], name: str | None) -> list[Any]:
    """The plugins a --plugin NAME picks among ``found`` (all of them without one)."""
    if name is None:
        return found
    from ..runtime.discovery import PluginInfo, find_plugin

    path = find_plugin(name, origin="--plugin")
    return [i for i in found if i.path == path] or [PluginInfo("?", path)]


def command(args: argparse.Namespace) -> int:
    from .. import Client, load_plugin, plugins
    from ..programs import form as program_form
    from ..runtime import profiler

    found = chosen(plugins(), args.plugin)
    if not found:
        print("no PJRT plugins found")
        return 1
    failed = False
    for info in found:
        label = info.distribution or "?"
        print(f"{info.name}: {label} {info.version or ''} {info.path}")
        if info.default:
            if info.defects:
                why = "every installed build has a known wrong result; first by the rule"
            else:
                why = "no known wrong result (those come first, then the newest PJRT API)"
            print(f"  default for {info.name!r}: {why}")
        for defect in info.defects:
            print(f"  known wrong result: {defect}")
        for edge in info.edge_cases:
            print(f"  differs from jax.jit (edge inputs, ulps): {edge}")
        try:
            plugin = load_plugin(info.path)
            print(f"  PJRT API {plugin.version_text}")
            for key, value in sorted(plugin.attributes.items()):
                print(f"  {key} = {value}")
            print(f"  programs reach it as {program_form.describe(plugin)}")
            extensions = plugin.extensions
            print(f"  extensions: {', '.join(extensions) or 'none'}")
            if profiler.available(plugin):
                print("  traces: host spans and device activity (PJRT profiler extension)")
            else:
                print("  traces: host spans only (no PJRT profiler extension for device activity)")
            client = Client(plugin)
            print(f"  platform {client.platform_name} ({client.platform_version})")
            for device in client.devices:
                print(f"  {device!r}")
            print(f"  {_memory_line(client)}")
        except Exception as exc:  # report and go on to the next plugin
            print(f"  unavailable: {type(exc).__name__}: {exc}")
            failed = True
    # Listing every plugin, one that cannot run here (a GPU build on a machine
    # without a GPU) is information; the one plugin asked for is the answer.
    return 1 if failed and args.plugin else 0


def _memory_line(client: Any) -> str:
    """What a build offers for memory spaces and DLPack views (docs/interop.md)."""
    try:
        device = client.addressable_devices[0]
        default = device.default_memory
        kinds = ", ".join(m.kind + (" (default)" if m is default else "") for m in device.memories)
    except Exception as exc:  # UnsupportedError from an older plugin, and the like
        kinds = f"not reported ({exc})"
    views = client.plugin.supports("PJRT_Client_CreateViewOfDeviceBuffer")
    copies = client.plugin.supports("PJRT_Buffer_CopyToMemory")
    return (
        f"memories per device: {kinds}; copy_to_memory: {'yes' if copies else 'no'}; "
        f"DLPack import without copies: {'yes' if views else 'no'}"
    )
