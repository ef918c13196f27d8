"""The example scripts run, and the code blocks in the docs work as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "async_pipeline.py"
ASYNC_DOC = ROOT / "docs" / "async.md"
AOT_DOC = ROOT / "docs" / "aot.md"
DEVICES_DOC = ROOT / "docs" / "devices.md"
EFFECTS_DOC = ROOT / "docs" / "effects.md"
LIFETIMES_DOC = ROOT / "docs" / "lifetimes.md"
INTEROP_DOC = ROOT / "docs" / "interop.md"
CALLBACKS_DOC = ROOT / "docs" / "callbacks.md"
DISTRIBUTED_DOC = ROOT / "docs" / "distributed.md"
DYNAMIC_DOC = ROOT / "docs" / "dynamic.md"
TRACING_DOC = ROOT / "docs" / "tracing.md"
MEMORY_DOC = ROOT / "docs" / "memory.md"
GPU_DOC = ROOT / "docs" / "gpu.md"
SGD_EXAMPLE = ROOT / "examples" / "data_parallel_sgd.py"

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks(path: Path) -> list[str]:
    """The contents of every ```python fenced block in a Markdown file."""
    return _FENCE.findall(path.read_text())


def test_async_pipeline_example_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for section in (
        "== 1. sync vs async ==",
        "== 2. chaining",
        "== 3. readiness",
        "== 4. training-loop pipeline",
        "all checks passed",
    ):
        assert section in result.stdout, result.stdout


@pytest.mark.needs_cpu_device_count  # the script asks a CPU client for its 4 devices
def test_data_parallel_sgd_example_runs() -> None:
    # The script asserts its own results: 4 replicas equal, a 1-device run and numpy.
    result = subprocess.run(
        [sys.executable, str(SGD_EXAMPLE)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 replicas agree exactly; matches a 1-device run and numpy" in result.stdout


def test_async_doc_has_code_blocks() -> None:
    assert len(python_blocks(ASYNC_DOC)) >= 2


@pytest.mark.parametrize(
    "index",
    [
        pytest.param(i, marks=[pytest.mark.needs_zero_copy] if "zero_copy=True" in code else [])
        for i, code in enumerate(python_blocks(ASYNC_DOC))
    ],
)
def test_async_doc_code_block_runs(index: int) -> None:
    code = python_blocks(ASYNC_DOC)[index]
    namespace: dict[str, object] = {"__name__": f"async_md_block_{index}"}
    try:
        exec(compile(code, f"{ASYNC_DOC.name}[block {index}]", "exec"), namespace)
    finally:
        namespace.clear()  # drop the block's clients, buffers and promises now


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # jax's, from other tests
@pytest.mark.parametrize(
    ("doc", "min_blocks"),
    [
        (AOT_DOC, 6),
        pytest.param(
            DEVICES_DOC,
            4,
            marks=[pytest.mark.needs_devices(4), pytest.mark.needs_memory_kinds("pinned_host")],
        ),
        pytest.param(EFFECTS_DOC, 3, marks=pytest.mark.needs_devices(2)),
        (LIFETIMES_DOC, 5),
        pytest.param(
            INTEROP_DOC,
            10,
            marks=[  # views of host memory, and the CPU builds' memories; torch
                pytest.mark.needs_torch,
                pytest.mark.needs_host_buffers,
                pytest.mark.needs_zero_copy,
                pytest.mark.needs_memory_kinds("device", "pinned_host", "unpinned_host"),
            ],
        ),
        pytest.param(CALLBACKS_DOC, 4, marks=pytest.mark.needs_host_callbacks),
        (DISTRIBUTED_DOC, 1),
        (DYNAMIC_DOC, 3),
        (TRACING_DOC, 2),
        (MEMORY_DOC, 2),
        (GPU_DOC, 1),
    ],
)
def test_walk_through_doc_runs_top_to_bottom(doc: Path, min_blocks: int) -> None:
    # These pages are walk-throughs: later blocks use what earlier ones made.
    blocks = python_blocks(doc)
    assert len(blocks) >= min_blocks
    namespace: dict[str, object] = {"__name__": doc.stem}
    try:
        for index, code in enumerate(blocks):
            exec(compile(code, f"{doc.name}[block {index}]", "exec"), namespace)
    finally:
        namespace.clear()
