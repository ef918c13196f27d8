"""Turn benchmark reports into docs/performance.md tables and PNG plots.

Only the part of performance.md between the ``generated`` markers is
rewritten; the prose around it is written by hand. Plots need matplotlib
(the ``bench`` extra); without it the tables are still written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

START = "<!-- generated: start (python -m benchmarks) -->"
END = "<!-- generated: end -->"
ORDER = (
    "dispatch",
    "small",
    "small_transfers",
    "bandwidth",
    "interop",
    "callbacks",
    "pipeline",
    "scaling",
    "sharded",
    "memory",
    "compile_cache",
    "isolated_compile",
    "conformance",
    "observability",
)


def markdown_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def targets_table(reports: dict[str, dict[str, Any]]) -> str:
    rows = [["benchmark", "target", "measured", "limit", "met"]]
    names = [n for n in ORDER if n in reports] + [n for n in reports if n not in ORDER]
    for name in names:  # the CPU page's order, then any other (the CUDA table's)
        for t in reports[name].get("targets", []):
            sign = "<=" if t["kind"] == "max" else ">="
            rows.append(
                [
                    name,
                    t["name"],
                    f"{t['value']:.3g}",
                    f"{sign} {t['limit']:g}",
                    "yes" if t["met"] else "**no**",
                ]
            )
    return markdown_table(rows)


def generated_section(reports: dict[str, dict[str, Any]], plots: dict[str, str]) -> str:
    machine = next(iter(reports.values())).get("machine", {})
    parts = [
        START,
        "",
        f"Measured by `python -m benchmarks` on {machine.get('cpus')} CPUs "
        f"({machine.get('processor')}, Python {machine.get('python')}), CPU plugin.",
        "",
        "### Targets",
        "",
        targets_table(reports),
    ]
    for name in ORDER:
        report = reports.get(name)
        if report is None:
            continue
        parts += ["", f"### {name}: {report.get('what', '')}", "", markdown_table(report["table"])]
        if report.get("notes"):
            parts += [""] + [f"- {note}" for note in report["notes"]]
        if name in plots:
            parts += ["", f"![{name}]({plots[name]})"]
    parts += ["", END]
    return "\n".join(parts)


def write_markdown(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else f"# Performance\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text = text.rstrip() + f"\n\n{START}\n{END}\n"
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: section, text, count=1))


def plot_all(reports: dict[str, dict[str, Any]], out_dir: Path) -> dict[str, str]:
    """PNG per benchmark that has a picture to show; returns name -> file name."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, str] = {}
    for name, draw in (
        ("small", _latency),
        ("bandwidth", _bandwidth),
        ("interop", _interop),
        ("pipeline", _pipeline),
        ("scaling", _scaling),
        ("memory", _memory),
    ):
        if name not in reports:
            continue
        fig = draw(plt, reports, reports[name])
        file = out_dir / f"{name}.png"
        fig.savefig(file, dpi=110, bbox_inches="tight")
        plt.close(fig)
        drawn[name] = f"{out_dir.name}/{file.name}"
    return drawn


def _latency(plt: Any, reports: dict[str, Any], small: dict[str, Any]) -> Any:
    bars: dict[str, float] = {}
    if "dispatch" in reports:
        bars.update({f"dispatch: {k}": v for k, v in reports["dispatch"]["us_per_call"].items()})
    for size, r in small["round_trip_us"].items():
        bars.update({f"round trip f32[{size}]: {k}": v for k, v in r.items()})
    bars.update({f"h2d f32[8]: {k}": v for k, v in small["h2d_us"].items()})
    if "small_transfers" in reports:
        floors = reports["small_transfers"]
        bars.update({f"f32[8] {k}": v for k, v in {**floors["h2d_us"], **floors["d2h_us"]}.items()})
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(bars) + 1))
    names = list(bars)[::-1]
    colors = ["tab:blue" if "pjrt_py" in n else "tab:gray" for n in names]
    ax.barh(names, [bars[n] for n in names], color=colors)
    ax.set_xlabel("microseconds per call (lower is better)")
    ax.set_title("Small-array latency, one run")
    return fig


def _bandwidth(plt: Any, reports: dict[str, Any], bw: dict[str, Any]) -> Any:
    rows = bw["seconds"]
    sizes = [r["bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 5))
    for key in rows[0]:
        if key != "bytes":
            ax.loglog(sizes, [r[key] for r in rows], marker="o", label=key)
    ax.set_xlabel("bytes")
    ax.set_ylabel("seconds per transfer")
    ax.set_title("Host <-> device copies against np.copy")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def _interop(plt: Any, reports: dict[str, Any], interop: dict[str, Any]) -> Any:
    rows = interop["us_per_call"]
    sizes = [r["bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 5))
    for key in rows[0]:
        if key != "bytes":
            copy = key.startswith("copy")
            ax.loglog(
                sizes,
                [r[key] for r in rows],
                marker="o",
                linestyle="--" if copy else "-",
                label=key,
            )
    ax.set_xlabel("bytes")
    ax.set_ylabel("microseconds per call")
    ax.set_title("DLPack exchange (solid) against copies (dashed)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def _pipeline(plt: Any, reports: dict[str, Any], pipe: dict[str, Any]) -> Any:
    shown = ("sync", "async")
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 3.2), sharex=True)
    for ax, pattern in zip(axes, shown, strict=True):
        tl = pipe["timelines"][pattern]
        ms = lambda spans: [(a * 1e3, (b - a) * 1e3) for a, b in spans]  # noqa: E731
        ax.broken_barh(ms(tl["host"]), (10, 8), color="tab:orange", label="host: prepare")
        ax.broken_barh(ms(tl["device"]), (0, 8), color="tab:blue", label="device: step")
        ax.set_yticks([4, 14], ["device", "host"])
        total = pipe["total_s"][pattern] * 1e3
        ax.set_title(f"{pattern}: {total:.0f} ms", fontsize=9, loc="left")
    axes[-1].set_xlabel("milliseconds")
    axes[0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def _scaling(plt: Any, reports: dict[str, Any], sc: dict[str, Any]) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, kind, label in zip(
        axes, ("matmul", "elementwise"), ("n (n x n matmul)", "elements"), strict=True
    ):
        rows = sc["seconds"][kind]
        sizes = [r["size"] for r in rows]
        for who in ("pjrt_py", "jax"):
            ax.loglog(sizes, [r[who] for r in rows], marker="o", label=who)
        ax.set_xlabel(label)
        ax.set_ylabel("seconds per call")
        ax.set_title(kind)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def _memory(plt: Any, reports: dict[str, Any], mem: dict[str, Any]) -> Any:
    its, grown = zip(*mem["trace"], strict=True)
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(its, [g / 2**20 for g in grown], marker="o")
    ax.axhline(1.0, color="tab:red", linestyle="--", label="target: 1 MiB")
    ax.set_xlabel("iterations after warm-up")
    ax.set_ylabel("RSS growth, MiB")
    ax.legend()
    return fig
