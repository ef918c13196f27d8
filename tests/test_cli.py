"""The pjrt-py command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ADD_F32_8

import pjrt_py as pjrt_py_lib


def pjrt_py(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pjrt_py", *args], capture_output=True, text=True, timeout=300
    )


def test_info_lists_plugins_versions_and_devices() -> None:
    result = pjrt_py("info")
    assert result.returncode == 0, result.stderr
    default = pjrt_py_lib.plugins()[0]
    assert default.path in result.stdout
    assert f"PJRT API {default.api[0]}.{default.api[1]}" in result.stdout  # type: ignore[index]
    assert "Device(id=0, kind='cpu'" in result.stdout
    # Which build "cpu" picks, and why; and what is known wrong in the others.
    assert result.stdout.count("default for 'cpu'") == 1
    # The form programs reach each plugin in, and its extensions (issue 25, 28).
    assert result.stdout.count("programs reach it as ") == len(pjrt_py_lib.plugins())
    assert result.stdout.count("  extensions: ") == len(pjrt_py_lib.plugins())
    # Whether traces can hold device activity (issue 28): every plugin says which.
    traced = result.stdout.count("  traces: host spans only (no PJRT profiler extension")
    traced += result.stdout.count("  traces: host spans and device activity (PJRT profiler")
    assert traced == len(pjrt_py_lib.plugins())
    for info in pjrt_py_lib.plugins():
        for defect in info.defects:
            assert f"known wrong result: {defect}" in result.stdout
        for edge in info.edge_cases:
            assert f"differs from jax.jit (edge inputs, ulps): {edge}" in result.stdout
    # Memory spaces and DLPack views: the same on every CPU build (docs/interop.md);
    # another platform's plugin, installed beside them, reports its own.
    memories = (
        "memories per device: device (default), pinned_host, unpinned_host; "
        "copy_to_memory: yes; DLPack import without copies: yes"
    )
    cpu_builds = [i for i in pjrt_py_lib.plugins() if i.name == "cpu"]
    assert result.stdout.count(memories) >= len(cpu_builds)


def test_smoke_runs_every_plugin() -> None:
    result = pjrt_py("smoke")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok ") >= 1
    assert "FAIL" not in result.stdout


def test_smoke_child_fails_for_a_broken_plugin() -> None:
    result = pjrt_py("smoke", "--only", "/nonexistent/plugin.so")
    assert result.returncode == 1
    assert "FileNotFoundError" in result.stderr


def test_run_with_npy_inputs_and_outputs(tmp_path: Path) -> None:
    program = tmp_path / "add.mlir"
    program.write_text(ADD_F32_8)
    x, y = np.arange(8, dtype=np.float32), np.full(8, 0.5, np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    out = tmp_path / "out.npy"
    result = pjrt_py(
        "run",
        str(program),
        "-i",
        str(tmp_path / "x.npy"),
        "-i",
        str(tmp_path / "y.npy"),
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(out), x + y)
    inputs = ["-i", str(tmp_path / "x.npy"), "-i", str(tmp_path / "y.npy")]
    printed = pjrt_py("run", str(program), *inputs)
    assert printed.returncode == 0
    assert "output 0: float32[8]" in printed.stdout and "7.5]" in printed.stdout
    # --trace writes the run's spans; -o names the file written, suffix or
    # not (np.save would add ".npy").
    trace_file = tmp_path / "run.json"
    traced = pjrt_py("run", str(program), *inputs, "--trace", str(trace_file))
    assert traced.returncode == 0, traced.stderr
    categories = {e.get("cat") for e in json.loads(trace_file.read_text())["traceEvents"]}
    assert {"compile", "dispatch", "transfer"} <= categories
    bare = tmp_path / "result"
    named = pjrt_py("run", str(program), *inputs, "-o", str(bare))
    assert named.returncode == 0, named.stderr
    assert not (tmp_path / "result.npy").exists()
    np.testing.assert_array_equal(np.load(bare), x + y)


def test_run_reports_errors_cleanly(tmp_path: Path) -> None:
    program = tmp_path / "bad.mlir"
    program.write_text("this is not mlir")
    result = pjrt_py("run", str(program))
    assert result.returncode == 1
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr


def test_run_refuses_a_program_over_several_devices(tmp_path: Path) -> None:
    if len(pjrt_py_lib.default_client().devices) < 2:
        pytest.skip("needs a plugin with two devices")
    program = tmp_path / "two.mlir"
    program.write_text(
        "module @two attributes {mhlo.num_replicas = 2 : i32} {\n"
        + ADD_F32_8.replace("func.func @main", "func.func public @main")
        + "}\n"
    )
    result = pjrt_py("run", str(program))
    # It said to call execute_sharded(), which a command line cannot.
    assert result.returncode == 2 and "runs on 2 devices" in result.stderr, result.stderr
    assert "pjrt-py run runs one-device programs" in result.stderr


def test_version_help_and_exit_codes() -> None:
    version = pjrt_py("--version")
    assert (
        version.returncode == 0 and version.stdout.strip() == f"pjrt-py {pjrt_py_lib.__version__}"
    )
    bare = pjrt_py()  # no command: the help, not an error
    assert bare.returncode == 0 and "usage: pjrt-py" in bare.stdout
    assert "exit status:" in bare.stdout and "130" in bare.stdout


def test_info_and_smoke_take_a_plugin() -> None:
    build = next(p for p in pjrt_py_lib.plugins() if p.distribution)
    info = pjrt_py("info", "--plugin", build.distribution)
    assert info.returncode == 0, info.stderr
    assert info.stdout.count("programs reach it as") == 1 and build.path in info.stdout
    smoke = pjrt_py("smoke", "--plugin", build.distribution)
    assert smoke.returncode == 0 and smoke.stdout.count("ok ") == 1, smoke.stdout
    bogus = pjrt_py("info", "--plugin", "no-such-plugin")
    assert bogus.returncode == 1 and "(from --plugin)" in bogus.stderr


def test_info_of_a_file_that_is_no_plugin_fails(tmp_path: Path) -> None:
    # It printed "unavailable" and exited 0: a script asking whether the
    # plugin it names works got yes.
    program = tmp_path / "garbage.mlir"
    program.write_text("not a shared library\n")
    result = pjrt_py("info", "--plugin", str(program))
    assert result.returncode == 1, result.stdout
    assert "unavailable: PluginLoadError" in result.stdout


def test_every_command_refuses_a_platform_without_a_plugin_the_same_way(tmp_path: Path) -> None:
    # issue 24 item 8: `test --plugin cuda` called cuda "not a platform name"
    # while `run --plugin cuda` accepted it. On a machine with no plugin of a
    # platform, each command now fails alike, naming the platform.
    from pjrt_py.runtime.discovery import PLATFORMS

    served = {p.name for p in pjrt_py_lib.plugins()}
    missing = next((name for name in PLATFORMS if name not in served), None)
    if missing is None:
        pytest.skip(f"every platform pjrt_py names has a plugin here: {sorted(served)}")
    program = tmp_path / "add.mlir"
    program.write_text(ADD_F32_8)
    x = tmp_path / "x.npy"
    np.save(x, np.ones(8, np.float32))
    commands = {
        "run": ["run", str(program), "-i", str(x), "-i", str(x)],
        "test": ["test", str(program)],
        "info": ["info"],
        "smoke": ["smoke"],
        "demo": ["demo", "--quick"],
    }
    want = f"PJRT plugin '{missing}' (from --plugin): no {missing} plugin is installed"
    for name, args in commands.items():
        result = pjrt_py(*args, "--plugin", missing)
        assert result.returncode == 1, (name, result.stdout, result.stderr)
        assert result.stderr.startswith(f"error: FileNotFoundError: {want}"), (name, result.stderr)
        assert "Traceback" not in result.stderr


def test_run_reads_stdin_and_checks_inputs_before_compiling(tmp_path: Path) -> None:
    x = np.arange(8, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    piped = subprocess.run(
        [
            sys.executable,
            "-m",
            "pjrt_py",
            "run",
            "-",
            "-i",
            str(tmp_path / "x.npy"),
            "-i",
            str(tmp_path / "x.npy"),
        ],
        input=ADD_F32_8,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0, piped.stderr
    assert "output 0: float32[8]" in piped.stdout
    (tmp_path / "bad.txt").write_text("not an array")
    missing = pjrt_py("run", "/nonexistent.mlir", "-i", str(tmp_path / "x.npy"))
    assert missing.returncode == 1
    program = tmp_path / "add.mlir"
    program.write_text(ADD_F32_8)
    for name, message in [("absent.npy", "does not exist"), ("bad.txt", "is not a .npy file")]:
        result = pjrt_py("run", str(program), "-i", str(tmp_path / name))
        assert result.returncode == 1
        assert f"input '{tmp_path / name}' {message}" in result.stderr
    # A big-endian array is taken in native byte order (it was refused as
    # ">f4", which no program declares), as pjrt-py test takes it.
    np.save(tmp_path / "be.npy", np.arange(8, dtype=">f4"))
    out = tmp_path / "out.npy"
    big = pjrt_py(
        "run",
        str(program),
        "-i",
        str(tmp_path / "be.npy"),
        "-i",
        str(tmp_path / "be.npy"),
        "-o",
        str(out),
    )
    assert big.returncode == 0, big.stderr
    np.testing.assert_array_equal(np.load(out), 2 * np.arange(8, dtype=np.float32))


def test_run_refuses_a_program_that_is_no_file_and_takes_bytecode(
    tmp_path: Path, client: pjrt_py_lib.Client
) -> None:
    # `pjrt-py run /dev/zero` read zeros until memory ran out. A device is now
    # refused before it is read, and a NUL byte (which no MLIR text holds)
    # stops the read where it is, also from a pipe that never ends.
    device = pjrt_py("run", "/dev/zero")
    assert device.returncode == 1
    assert device.stderr.startswith("error: ValueError: program '/dev/zero' is not a file or")
    endless = subprocess.run(
        f"cat /dev/zero | {sys.executable} -m pjrt_py run -",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert endless.returncode == 1
    assert "program '<stdin>' is neither MLIR text (a NUL byte at offset 0)" in endless.stderr
    text = ADD_F32_8.encode()
    for data, message in [
        (text + b"\0" + text, f"a NUL byte at offset {len(text)}"),
        (b"func.func \xff", "is not UTF-8 MLIR text"),
    ]:
        (tmp_path / "bad.mlir").write_bytes(data)
        result = pjrt_py("run", str(tmp_path / "bad.mlir"))
        assert result.returncode == 1 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    # Portable bytecode (what jax exports) runs as the text does.
    from pjrt_py.programs.form import for_plugin

    bytecode = for_plugin(client.plugin, ADD_F32_8)  # the default plugin, as `run` uses
    if bytecode is None:
        pytest.skip("jaxlib, which writes portable bytecode, is not installed")
    (tmp_path / "add.mlirbc").write_bytes(bytecode)
    x = np.arange(8, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npy"
    args = ["-i", str(tmp_path / "x.npy"), "-i", str(tmp_path / "x.npy"), "-o", str(out)]
    result = pjrt_py("run", str(tmp_path / "add.mlirbc"), *args)
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(out), x + x)


def test_a_closed_pipe_is_not_an_error() -> None:
    # `pjrt-py info | head -1`: the reader leaves early.
    proc = subprocess.Popen(
        [sys.executable, "-m", "pjrt_py", "info"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "BrokenPipeError" not in err and "Traceback" not in err


def test_demo_runs_from_the_package() -> None:
    result = pjrt_py("demo", "--quick")
    assert result.returncode == 0, result.stderr
    assert "== 4. training-loop pipeline" in result.stdout
    assert "all checks passed" in result.stdout


def test_bf16_and_float8_npy_files_are_inputs_and_expected_values(tmp_path: Path) -> None:
    # numpy writes them as raw bytes (|V2, |V1); the program says what they are.
    import ml_dtypes

    for dtype, mlir in ((ml_dtypes.bfloat16, "bf16"), (ml_dtypes.float8_e4m3fn, "f8E4M3FN")):
        t = f"tensor<2x{mlir}>"
        stem = tmp_path / f"double_{mlir}"
        stem.with_suffix(".mlir").write_text(
            f"func.func @main(%x: {t}) -> {t} {{\n  %0 = stablehlo.add %x, %x : {t}\n"
            f"  return %0 : {t}\n}}\n"
        )
        np.save(f"{stem}.input0.npy", np.array([1.5, 2.25], dtype))
        np.save(f"{stem}.expected0.npy", np.array([3, 4.5], dtype))
        ran = pjrt_py("run", str(stem.with_suffix(".mlir")), "-i", f"{stem}.input0.npy")
        assert ran.returncode == 0, ran.stderr
        assert "[3 4.5]" in ran.stdout
    tested = pjrt_py("test", str(tmp_path))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_ctrl_c_during_run_exits_130_without_a_traceback(tmp_path: Path) -> None:
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import time  # noqa: PLC0415

    from conftest import MATMUL_LOOP  # noqa: PLC0415

    program = tmp_path / "loop.mlir"
    program.write_text(MATMUL_LOOP)
    np.save(tmp_path / "x.npy", np.eye(256, dtype=np.float32) * 0.5)
    np.save(tmp_path / "n.npy", np.array(10**9, np.int64))  # hours of work
    proc = subprocess.Popen(
        [sys.executable, "-m", "pjrt_py", "run", str(program)]
        + ["-i", str(tmp_path / "x.npy"), "-i", str(tmp_path / "n.npy")],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PJRT_PY_EXIT_TIMEOUT": "0"},  # the loop is left to the exit
    )
    time.sleep(4)  # compiled and running
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
