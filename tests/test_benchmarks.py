"""The benchmarks run (tiny sizes) and report well-formed results. No timing
is asserted here: speed is judged by the ratios the benchmarks print."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The suite compares against torch as well as jax (the bench extra has both).
pytestmark = pytest.mark.needs_torch

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


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    return result


def test_dispatch_benchmark_writes_well_formed_json(tmp_path: Path) -> None:
    out = tmp_path / "dispatch.json"
    result = run_module("benchmarks.dispatch", "--quick", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["benchmark"] == "dispatch"
    timings = report["us_per_call"]
    assert {
        "c_loop",
        "c_loop + completion event",
        "pjrt_py.execute_async",
        "jax.compiled",
    } <= set(timings)
    assert all(math.isfinite(v) and v > 0 for v in timings.values())
    assert report["ratio_to_c_loop"]["c_loop"] == 1.0
    assert "pjrt_py.execute_async" in result.stdout
    assert "c_loop + completion event" in [row[0] for row in report["table"]]
    # The issue's limits; the event variant is shown, not a target.
    assert [(t["name"], t["limit"], t["kind"]) for t in report["targets"]] == [
        ("dispatch / C loop", 1.3, "max"),
        ("dispatch / jax", 0.4, "max"),
    ]
    ratio = report["ratio_to_c_loop"]["pjrt_py.execute_async"]
    assert report["targets"][0]["value"] == ratio


def test_sharded_benchmark_writes_well_formed_json(tmp_path: Path) -> None:
    out = tmp_path / "sharded.json"
    result = run_module("benchmarks.sharded", "--quick", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["benchmark"] == "sharded"
    us = report["us_per_call"]
    assert list(us) == ["1", "2", "4", "8"]
    for devices, timings in us.items():
        assert {"pjrt_py execute_sharded_async", "C: Execute over every device + events"} <= set(
            timings
        ), devices
        assert all(math.isfinite(v) and v > 0 for v in timings.values())
    assert "jax.jit, inputs sharded over 8 devices" in us["8"]
    assert set(report["chain_us"]) == {
        "pjrt_py 3-stage execute_async chain",
        "C: 3 chained Executes + events",
    }
    threads = report["threads_calls_per_s"]
    assert set(threads) == {"pjrt_py", "C", "jax"}  # jax is in the test extra
    assert all(set(rates) == {"1", "2", "4"} for rates in threads.values())
    # The issue's limits.
    assert [(t["name"], t["limit"]) for t in report["targets"]] == [
        *[(f"execute_sharded_async / C loop, {d} device(s)", 1.3) for d in (1, 2, 4, 8)],
        ("execute_sharded_async / jax.jit, 8 devices", 0.6),
        ("3-stage chain / C chain", 1.05),
    ]
    assert "target 3-stage chain / C chain" in result.stdout


def test_small_transfers_benchmark_writes_well_formed_json(tmp_path: Path) -> None:
    out = tmp_path / "small_transfers.json"
    result = run_module("benchmarks.small_transfers", "--quick", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["benchmark"] == "small_transfers"
    h2d, d2h = report["h2d_us"], report["d2h_us"]
    (h2d_c, h2d_ours), (d2h_c, d2h_ours) = h2d, d2h  # the C floor first
    assert h2d_c.startswith("h2d, C:") and "buffer_async" in h2d_ours
    assert d2h_c.startswith("d2h, C:") and "to_numpy" in d2h_ours
    assert "no alloc" in d2h_c  # the label says the floor allocates nothing
    us = {**h2d, **d2h}
    assert all(math.isfinite(v) and v > 0 for v in us.values())
    ratios = report["ratio_to_c"]
    assert ratios == {
        "buffer_async": us[h2d_ours] / us[h2d_c],
        "to_numpy": us[d2h_ours] / us[d2h_c],
    }
    assert [(t["name"], t["value"], t["limit"], t["kind"]) for t in report["targets"]] == [
        ("buffer_async f32[8] / C floor", ratios["buffer_async"], 1.5, "max"),
        ("to_numpy f32[8] / C floor", ratios["to_numpy"], 1.5, "max"),
    ]
    header, *rows = report["table"]
    assert header == ["what", "us/call", "x C floor"]
    assert [row[0] for row in rows] == [h2d_c, h2d_ours, d2h_c, d2h_ours]
    assert "target to_numpy f32[8] / C floor" in result.stdout


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    docs = tmp_path_factory.mktemp("docs")
    (docs / "performance.md").write_text("# Performance\n\nHand-written prose stays.\n")
    result = run_module("benchmarks", "--quick", "--out", str(docs))
    return docs, result.stdout


def test_suite_writes_a_report_for_every_benchmark(suite: tuple[Path, str]) -> None:
    docs, stdout = suite
    reports = json.loads((docs / "performance" / "results.json").read_text())
    assert list(reports) == list(ORDER)
    for name, report in reports.items():
        assert report["benchmark"] == name
        header, *rows = report["table"]
        assert rows and all(len(row) == len(header) for row in rows)
        for t in report["targets"]:
            assert math.isfinite(t["value"]) and t["kind"] in ("max", "min")
            assert t["met"] == (
                t["value"] <= t["limit"] if t["kind"] == "max" else t["value"] >= t["limit"]
            )
    assert "targets missed:" in stdout


def test_suite_measures_what_the_issue_asks(suite: tuple[Path, str]) -> None:
    docs, _ = suite
    reports = json.loads((docs / "performance" / "results.json").read_text())
    targets = {name: [t["name"] for t in r["targets"]] for name, r in reports.items()}
    assert targets["dispatch"] == ["dispatch / C loop", "dispatch / jax"]
    assert "c_loop + completion event" in reports["dispatch"]["us_per_call"]
    assert targets["small_transfers"] == [
        "buffer_async f32[8] / C floor",
        "to_numpy f32[8] / C floor",
    ]
    small = reports["small"]
    assert {"pjrt_py async", "pjrt_py sync", "jax"} <= set(small["round_trip_us"]["8"])
    bandwidth = reports["bandwidth"]["seconds"][0]
    assert {"np.copy", "h2d copy", "h2d copy, C", "h2d zero-copy", "d2h", "d2h, C"} <= set(
        bandwidth
    )
    pipeline = reports["pipeline"]
    assert set(pipeline["total_s"]) == {"sync", "async", "async+metrics"}
    for tl in pipeline["timelines"].values():
        assert len(tl["host"]) == len(tl["device"]) == pipeline["steps"]
        assert all(0 <= a <= b for a, b in tl["host"] + tl["device"])
    scaling = reports["scaling"]["seconds"]
    assert all(r["pjrt_py"] > 0 and r["jax"] > 0 for rows in scaling.values() for r in rows)
    assert reports["memory"]["iterations"] > 0
    cache = reports["compile_cache"]
    assert set(cache["seconds"]) == {
        "cold",
        "memory_hit",
        "fresh_process_cold",
        "fresh_process_disk_hit",
    }
    assert all(math.isfinite(s) and s > 0 for s in cache["seconds"].values())
    assert set(cache["ratio_to_cold"]) == {"memory_hit", "fresh_process_disk_hit"}
    assert set(cache["jit_us_per_call"]) == {"pjrt_py.jit", "jax.jit"}
    assert all(math.isfinite(v) and v > 0 for v in cache["jit_us_per_call"].values())
    assert cache["jit_ratio_to_jax"]["jax.jit"] == 1.0
    assert cache["disk_entry_bytes"] > 0
    assert [t["name"] for t in cache["targets"]] == [
        "memory-cache hit / cold compile",
        "disk-cache hit / cold compile, fresh process",
    ]


@pytest.mark.needs_host_buffers  # numpy, torch and jax views of buffers
@pytest.mark.needs_zero_copy
def test_suite_measures_interop_as_the_issue_asks(suite: tuple[Path, str]) -> None:
    docs, stdout = suite
    report = json.loads((docs / "performance" / "results.json").read_text())["interop"]
    assert report["sizes"] == [1024, 64 * 1024]  # --quick: tiny sizes only
    exchanges = {
        "export numpy: np.from_dlpack(buf)",
        "export jax: pjrt_py.to_jax(buf)",
        "export jax: jnp.from_dlpack(buf)",
        "export torch: torch.from_dlpack(buf)",
        "import numpy: client.from_dlpack(x)",
        "import jax: client.from_dlpack(jx)",
        "import torch: client.from_dlpack(tx)",
    }
    copies = {"copy: np.copyto(dst, x)", "copy in: client.buffer(x)", "copy out: buf.to_numpy()"}
    for row, shared in zip(report["us_per_call"], report["zero_copy"], strict=True):
        assert row["bytes"] == shared["bytes"]
        assert set(row) == exchanges | copies | {"bytes"}
        assert all(math.isfinite(v) and v > 0 for k, v in row.items() if k != "bytes")
        # Pointer equality, checked once per size: every exchange shared memory.
        assert set(shared) == exchanges | {"bytes"}
        assert all(shared[k] is True for k in exchanges)
    # Flat in size: each framework and direction, largest size over smallest.
    first, last = report["us_per_call"][0], report["us_per_call"][-1]
    flat = [
        (f"{direction} {fw} time, 64 KiB / 1 KiB", last[key] / first[key], 3.0, "max")
        for key in sorted(exchanges)
        if key != "export jax: jnp.from_dlpack(buf)"
        for direction, fw in [key.split(":")[0].split()]
    ]
    trips = report["round_trip_us"]
    assert list(trips) == [
        "numpy -> execute -> to_numpy",
        "jax -> execute -> to_jax",
        "Buffers -> execute (on the device)",
        "torch -> execute -> to_torch",
        "jax.jit (jax's own)",
    ]
    assert all(math.isfinite(v) and v > 0 for v in trips.values())
    ratio = trips["jax -> execute -> to_jax"] / trips["numpy -> execute -> to_numpy"]
    assert report["round_trip_ratio"]["numpy -> execute -> to_numpy"] == 1.0
    targets = [(t["name"], t["value"], t["limit"], t["kind"]) for t in report["targets"]]
    assert sorted(targets[:-1]) == sorted(flat)
    assert targets[-1] == ("round trip f32[8]: jax / numpy", ratio, 1.5, "max")
    rt = report["round_trip_zero_copy"]
    assert rt["jax arguments viewed"] and rt["jax result shared"] and rt["torch result shared"]
    assert "torch arguments viewed" in rt
    # The round trips in pieces: the parts add up to what was timed whole.
    for fw, name in (
        ("jax", "jax -> execute -> to_jax"),
        ("numpy", "numpy -> execute -> to_numpy"),
    ):
        assert math.isclose(sum(report["breakdown_us"][fw].values()), trips[name], rel_tol=1e-9)
    assert {"jx.__dlpack__() (jax's export)", "out.__dlpack__() (pjrt_py's export)"} <= set(
        report["pieces_us"]
    )
    assert report["notes"] and "Where the jax round trip goes" in report["notes"][1]
    assert "target round trip f32[8]: jax / numpy" in stdout


def test_suite_regenerates_performance_md_and_plots(suite: tuple[Path, str]) -> None:
    docs, _ = suite
    text = (docs / "performance.md").read_text()
    assert "Hand-written prose stays." in text
    assert text.count("<!-- generated: start") == 1
    assert "### Targets" in text and "| dispatch |" in text
    assert "### compile_cache:" in text and "| compile_cache |" in text
    assert "### small_transfers:" in text and "| buffer_async f32[8] / C floor |" in text
    assert "| c_loop + completion event |" in text
    assert "### interop:" in text and "| round trip f32[8]: jax / numpy |" in text
    for name in ("small", "bandwidth", "interop", "pipeline", "scaling", "memory"):
        png = docs / "performance" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"performance/{name}.png" in text


def test_suite_measures_traces_memory_reports_and_dynamic_shapes(suite: tuple[Path, str]) -> None:
    docs, _ = suite
    report = json.loads((docs / "performance" / "results.json").read_text())["observability"]
    us = report["us_per_call"]
    assert list(us) == [
        "execute_async",
        "execute_async, memory_watch open",
        "execute_async, trace open",
        "execute_async, after a trace block",
        "DynamicExecutable, seen shapes",
        "DynamicExecutable, dimension argument",
    ]
    assert all(math.isfinite(v) and v > 0 for v in us.values())
    assert report["ratio_to_execute_async"]["execute_async"] == 1.0
    for key in ("memory_watch_block_us", "compile_ms", "deserialize_raw_ms"):
        assert math.isfinite(report[key]) and report[key] > 0
    assert [t["name"] for t in report["targets"]] == [
        "memory_watch open / dispatch",
        "after a trace / dispatch",
        "dynamic, seen shapes / dispatch",
    ]


@pytest.mark.needs_host_callbacks
def test_suite_measures_a_host_callback_round_trip(suite: tuple[Path, str]) -> None:
    docs, _ = suite
    report = json.loads((docs / "performance" / "results.json").read_text())["callbacks"]
    us = report["us_per_call"]
    assert list(us) == [
        "pjrt_py: register_callback",
        "pjrt_py: register_callback, copy=False",
        "pjrt_py: same program, no callback",
        "pjrt_py.jit: jax.pure_callback",
        "jax.jit: jax.pure_callback",
        "jax.jit: x + x, no callback",
    ]
    assert all(math.isfinite(v) and v > 0 for v in us.values())
    assert report["ratio"]["jax.jit: jax.pure_callback"] == 1.0
    ratio = us["pjrt_py: register_callback"] / us["jax.jit: jax.pure_callback"]
    targets = [(t["name"], t["value"], t["limit"]) for t in report["targets"]]
    assert targets == [("register_callback round trip / jax.jit pure_callback", ratio, 0.75)]


def test_cuda_table_writes_a_gpu_checks_figures_between_its_markers(
    suite: tuple[Path, str], tmp_path: Path
) -> None:
    # A GPU check's output folder, made of this run's CPU reports (the JSON
    # is the same on a GPU) and a device.json as tools/gpu_check.sh writes it.
    docs, _ = suite
    reports = json.loads((docs / "performance" / "results.json").read_text())
    out = tmp_path / "gpu_out"
    out.mkdir()
    for name in ("bandwidth", "dispatch"):
        (out / f"{name}.json").write_text(json.dumps(reports[name]))
    run_module("benchmarks.gpu_figures", "--quick", "--json", str(out / "gpu_figures.json"))
    device = {"gpu": "NVIDIA H100 80GB HBM3, 81559 MiB", "plugin": "jax-cuda13-pjrt 0.11.2"}
    (out / "device.json").write_text(json.dumps({**device, "pjrt": "0.90", "jax": "0.11.2"}))
    page = tmp_path / "performance.md"
    markers = (
        "<!-- cuda: start (python -m benchmarks.cuda_table GPU_OUT) -->\nNo CUDA run yet.\n"
        "<!-- cuda: end -->"
    )
    page.write_text(f"# Performance\n\nProse before.\n\n{markers}\n\nProse after.\n")
    run_module("benchmarks.cuda_table", str(out), "--doc", str(page))
    text = page.read_text()
    assert text.startswith("# Performance\n\nProse before.\n") and text.endswith("Prose after.\n")
    assert "No CUDA run yet." not in text
    assert "NVIDIA H100 80GB HBM3, 81559 MiB, jax-cuda13-pjrt 0.11.2 (PJRT 0.90)" in text
    assert "torch absent" in text and "Not in this run: callbacks." in text
    assert "| dispatch | dispatch / C loop |" in text  # the targets, from the reports
    assert f"### bandwidth: {reports['bandwidth']['what']}" in text
    assert "### gpu_figures: matmul rate, dtype round trips, memory beside torch" in text
    assert "| dtypes round-tripped bit-exactly | 11 of 11 |" in text
    assert "| gpu_figures | dtypes not round-tripped bit-exactly | 0 | <= 0 | yes |" in text
    assert "| " + " | ".join(reports["dispatch"]["table"][1]) + " |" in text
    (out / "callbacks.json").write_text(json.dumps(reports["callbacks"]))
    run_module("benchmarks.cuda_table", str(out), "--doc", str(page))
    again = page.read_text()
    assert again.count("<!-- cuda: start") == 1 and "Not in this run" not in again
    assert "The GPU round trip was not measured: needs a plugin whose devices are GPUs" in again
    assert again.endswith("Prose after.\n")
    gpu_part = {"device": "cuda:0", "us_per_call": {"pjrt_py: register_callback": 31.5}}
    gpu_part["ratio"] = {"pjrt_py: register_callback": 0.25}  # the shape callbacks._gpu writes
    (out / "callbacks.json").write_text(json.dumps({**reports["callbacks"], "gpu": gpu_part}))
    run_module("benchmarks.cuda_table", str(out), "--doc", str(page))
    written = page.read_text()
    assert "| pjrt_py: register_callback | 31.50 | 0.25 |" in written
    # As tools/gpu_check.sh brings them back: packed into gpu_out.tar.gz beside
    # summary.txt (the device tool returns 8 files at most), or that archive alone.
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "summary.txt").write_text("device: exit 0 after 3 s\n")
    with tarfile.open(packed / "gpu_out.tar.gz", "w:gz") as tar:
        for path in sorted(out.iterdir()):
            tar.add(path, arcname=path.name)
    for given in (packed, packed / "gpu_out.tar.gz"):
        page.write_text(f"# Performance\n\n{markers}\n")
        run_module("benchmarks.cuda_table", str(given), "--doc", str(page))
        assert page.read_text() == written.replace("\nProse before.\n", "").replace(
            "\n\nProse after.\n", "\n"
        )
    # A member that would land outside the folder is refused, not written.
    with tarfile.open(packed / "gpu_out.tar.gz", "w:gz") as tar:
        tar.add(out / "device.json", arcname="../escaped.json")
    failed = subprocess.run(
        [sys.executable, "-m", "benchmarks.cuda_table", str(packed), "--doc", str(page)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 2 and "outside the destination" in failed.stderr, failed.stderr


def test_gpu_figures_measure_what_issue_24_measured(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    run_module("benchmarks.gpu_figures", "--quick", "--json", str(out))
    report = json.loads(out.read_text())
    assert len(report["round_trip"]) == 11 and set(report["round_trip"].values()) == {"exact"}
    assert {"bfloat16", "float8_e4m3fn", "complex128", "bool"} <= set(report["round_trip"])
    assert report["matmul"]["n"] == 256 and report["matmul"]["pjrt_py_tflops"] > 0
    if report["platform"] not in ("cuda", "rocm"):
        assert report["beside_torch"] == {
            "skipped": f"needs a GPU plugin; this one is {report['platform']}"
        }
    assert report["targets"][0] == {
        "name": "dtypes not round-tripped bit-exactly",
        "value": 0,
        "limit": 0,
        "kind": "max",
        "met": True,
    }
