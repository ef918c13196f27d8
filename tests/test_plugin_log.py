"""A quiet happy path: the plugin's log lines go through logging (pjrt_py.runtime.plugin_log)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from pjrt_py.runtime import plugin_log

HAPPY_PATH = textwrap.dedent(
    """
    import sys, tempfile, numpy as np, pjrt_py
    c = pjrt_py.Client(cache_dir=tempfile.mkdtemp())
    program = ("func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {"
               " %0 = stablehlo.add %x, %x : tensor<8xf32>\\n return %0 : tensor<8xf32> }")
    exe = c.compile(program)
    exe.execute(np.ones(8, np.float32)).to_numpy()
    sys.stderr.write("LOADS\\n"); sys.stderr.flush()  # compiles are not captured
    c.deserialize(exe.serialize())
    pjrt_py.Client(cache_dir=c.disk_cache.directory).compile(program)  # a disk cache hit
    c.compile(program.replace("8x", "4x").replace("<8", "<4"), isolate=True, cache=False)
    print("done")
    """
)


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, **env},
    )


def test_loading_executables_writes_nothing_to_stderr() -> None:
    # deserialize, a disk cache hit, an isolated compile (which loads what the
    # helper compiled); compiles keep the plugin's lines (plugin_log's doc)
    result = _run(HAPPY_PATH)
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr
    assert result.stderr.split("LOADS\n", 1)[1] == ""


def test_nothing_is_hidden_from_who_asks() -> None:
    raw = _run(HAPPY_PATH, PJRT_PY_PLUGIN_LOG="raw")
    loads = raw.stderr.split("LOADS\n", 1)[1]
    plugin_lines = [line for line in loads.splitlines() if line.strip()]
    if not plugin_lines:
        pytest.skip("this plugin build logs nothing on the happy path")
    asked = _run(
        "import logging; logging.basicConfig(level=logging.DEBUG, format='%(name)s %(message)s')\n"
        + HAPPY_PATH
    )
    assert asked.returncode == 0, asked.stderr
    logged = [line for line in asked.stderr.splitlines() if line.startswith("pjrt_py.plugin ")]
    for line in plugin_lines:  # the same lines (timestamps and thread ids aside)
        text = line.split("] ", 1)[-1]
        assert any(entry.endswith(text) for entry in logged), line


def test_lines_keep_the_plugins_level_but_known_noise(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="pjrt_py.plugin")
    plugin_log.forward(
        "E0000 00:00:1.5   12 cpu_aot_loader.cc:195] Loading XLA:CPU AOT result. Target machine "
        "feature +prefer-no-gather is not  supported on the host machine.\n"
        "E0000 00:00:1.6   12 compiler.cc:10] a real failure\n"
        "W0000 00:00:1.7   12 thing.cc:3] a warning\n"
        "some other thread's output\n"
    )
    levels = {r.getMessage().split("] ", 1)[-1][:14]: r.levelno for r in caplog.records}
    assert levels == {
        "Loading XLA:CP": logging.DEBUG,
        "a real failure": logging.ERROR,
        "a warning": logging.WARNING,
    }
    assert capfd.readouterr().err == "some other thread's output\n"


def test_another_threads_stderr_during_a_capture_is_not_lost(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with plugin_log.captured():
        os.write(2, b"written meanwhile\n")
        with plugin_log.captured():  # overlapping captures share one
            os.write(2, b"and meanwhile again\n")
        assert capfd.readouterr().err == ""
    assert capfd.readouterr().err == "written meanwhile\nand meanwhile again\n"
