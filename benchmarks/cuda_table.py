"""Write the CUDA part of docs/performance.md from a GPU check's output.

    python -m benchmarks.cuda_table GPU_OUT [--doc docs/performance.md]

GPU_OUT is the folder ``tools/gpu_check.sh run`` wrote (``gpu_out/``, or the
device tool's copy of it): ``device.json`` (the GPU, the plugin, versions)
and the JSON of the ``figures`` (``gpu_figures.json``), ``bandwidth``,
``dispatch`` and ``callbacks`` steps,
loose or packed in its ``gpu_out.tar.gz`` (or that archive itself).
Only the part of the page between the CUDA markers is rewritten; a step that
did not run is named as missing, not guessed. The tables are the benchmarks'
own, as on CPU, so the CUDA figures read like the CPU ones beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .report import markdown_table, targets_table

START = "<!-- cuda: start (python -m benchmarks.cuda_table GPU_OUT) -->"
END = "<!-- cuda: end -->"
STEPS = ("gpu_figures", "bandwidth", "dispatch", "callbacks")
PACKED = "gpu_out.tar.gz"


@contextlib.contextmanager
def unpacked(path: Path) -> Iterator[Path]:
    """The folder of a GPU check's outputs: ``path`` itself, or a temporary
    one holding what its ``gpu_out.tar.gz`` (or ``path``, an archive) packed.
    Members are extracted with tarfile's ``data`` filter: no links out of the
    folder, no absolute paths, no devices."""
    archive = path if path.is_file() else path / PACKED
    if not archive.is_file():
        yield path
        return
    with tempfile.TemporaryDirectory() as folder, tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
        yield Path(folder)


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _notes(notes: list[str]) -> list[str]:
    return ["\n".join(f"- {note}" for note in notes)] if notes else []


def _callbacks_gpu(report: dict[str, Any]) -> list[str]:
    gpu = report.get("gpu", {})
    if "us_per_call" not in gpu:
        return [f"The GPU round trip was not measured: {gpu.get('skipped', 'no GPU part')}."]
    ratio = gpu.get("ratio", {})
    rows = [["call (f32[8], waited for)", "us per call", "x jax.jit pure_callback"]]
    for name, us in gpu["us_per_call"].items():
        rows.append([name, f"{us:.2f}", f"{ratio[name]:.2f}" if name in ratio else "-"])
    return [markdown_table(rows)] + _notes(gpu.get("notes", []))


def section(folder: Path) -> str:
    """The CUDA section for the outputs in ``folder``."""
    device = _load(folder, "device") or {}
    reports = {name: r for name in STEPS if (r := _load(folder, name)) is not None}
    missing = [name for name in STEPS if name not in reports]
    machine = next(iter(reports.values()), {}).get("machine", {})
    blocks = [
        START,
        f"Measured by `tools/gpu_check.sh` on {device.get('gpu', 'an unnamed GPU')}, "
        f"{device.get('plugin', 'an unnamed plugin')} (PJRT {device.get('pjrt', '?')}), "
        f"Python {machine.get('python', '?')}, {machine.get('cpus', '?')} CPUs; "
        f"jax {device.get('jax', 'absent')}, torch {device.get('torch', 'absent')}.",
    ]
    if missing:
        blocks.append("Not in this run: " + ", ".join(missing) + ".")
    if any(report.get("targets") for report in reports.values()):
        blocks += ["### Targets", targets_table(reports)]
    for name, report in reports.items():
        blocks.append(f"### {name}: {report.get('what', '')}")
        if name == "callbacks":
            blocks += _callbacks_gpu(report)
        else:
            blocks += [markdown_table(report["table"])] + _notes(report.get("notes", []))
    blocks.append(END)
    return "\n\n".join(blocks)


def write(doc: Path, text: str) -> None:
    """Replace the CUDA section of ``doc`` (or append one)."""
    page = doc.read_text()
    if START not in page or END not in page:
        raise SystemExit(f"{doc} has no CUDA markers ({START} ... {END})")
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    doc.write_text(pattern.sub(lambda _: text, page, count=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "gpu_out", type=Path, help=f"the folder tools/gpu_check.sh run wrote, or its {PACKED}"
    )
    parser.add_argument("--doc", type=Path, default=Path("docs/performance.md"))
    opts = parser.parse_args()
    if not (opts.gpu_out.is_dir() or (opts.gpu_out.is_file() and tarfile.is_tarfile(opts.gpu_out))):
        parser.error(f"{opts.gpu_out} is neither a folder nor a tar archive")
    try:
        with unpacked(opts.gpu_out) as folder:
            write(opts.doc, section(folder))
    except tarfile.TarError as e:  # a damaged archive, or a member the filter refuses
        parser.error(f"{opts.gpu_out}: {e}")
    print(f"wrote the CUDA section of {opts.doc}")


if __name__ == "__main__":
    main()
