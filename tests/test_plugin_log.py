"""A quiet happy path: the plugin's log lines go through logging (pjrt_py.runtime.plugin_log).

Checked at the file-descriptor level: each case runs in a fresh interpreter
whose stderr is a pipe, on each installed CPU build (their log lines differ).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import needs_build

from pjrt_py.runtime import plugin_log
from pjrt_py.runtime.discovery import BUILDS

BUILD = pytest.mark.parametrize(
    "build",
    [pytest.param(b.distribution, marks=needs_build(b.distribution)) for b in BUILDS
     if b.platform == "cpu"],
)  # fmt: skip

ADD = (
    "func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {"
    " %0 = stablehlo.add %x, %x : tensor<8xf32>\\n return %0 : tensor<8xf32> }"
)

HAPPY_PATH = textwrap.dedent(
    f"""
    import sys, tempfile, numpy as np, pjrt_py
    c = pjrt_py.Client(cache_dir=tempfile.mkdtemp())
    program = "{ADD}"
    exe = c.compile(program)
    exe.execute(np.ones(8, np.float32)).to_numpy()
    c.compile(program.replace("add", "multiply"), cache=False)
    c.deserialize(exe.serialize())
    pjrt_py.Client(cache_dir=c.disk_cache.directory).compile(program)  # a disk cache hit
    c.compile(program.replace("8x", "4x").replace("<8", "<4"), isolate=True, cache=False)
    print("done")
    """
)

# A real CHECK failure inside the plugin's compiler, on every build: compile
# options that ask for zero replicas (Client.compile refuses them; the
# compiler's own entry point is called here to get past that check).
CRASHING_COMPILE = textwrap.dedent(
    f"""
    import pjrt_py
    c = pjrt_py.Client()
    program = "{ADD}"
    c.compile(program)  # the capture's handler is in place
    c._compiler.compile_code(c, program, program.encode(), b"")
    """
)


def _run(code: str, build: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
    environ.pop("PYTHONFAULTHANDLER", None)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, "PJRT_PLUGIN": build, **env},
    )


@BUILD
def test_the_happy_path_writes_nothing_to_stderr(build: str) -> None:
    # compile, execute, a second compile, serialize, deserialize, a disk cache
    # hit and an isolated compile: not one byte on descriptor 2
    result = _run(HAPPY_PATH, build)
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr
    assert result.stderr == ""


@BUILD
def test_nothing_is_hidden_from_who_asks(build: str) -> None:
    raw = _run(HAPPY_PATH, build, PJRT_PY_PLUGIN_LOG="raw")
    assert raw.returncode == 0, raw.stderr
    plugin_lines = [line for line in raw.stderr.splitlines() if line.strip()]
    if not plugin_lines:
        pytest.skip(f"{build} logs nothing on the happy path")
    asked = _run(
        "import logging; logging.basicConfig(level=logging.DEBUG, format='%(name)s %(message)s')\n"
        + HAPPY_PATH,
        build,
    )
    assert asked.returncode == 0, asked.stderr
    logged = [line for line in asked.stderr.splitlines() if line.startswith("pjrt_py.plugin ")]
    for line in plugin_lines:  # the same lines (timestamps and thread ids aside)
        text = line.split("] ", 1)[-1]
        assert any(entry.endswith(text) for entry in logged), line


@BUILD
@pytest.mark.parametrize("faulthandler", ["", "1"], ids=["plain", "faulthandler"])
def test_a_crashing_compile_still_shows_its_last_words(build: str, faulthandler: str) -> None:
    result = _run(CRASHING_COMPILE, build, PYTHONFAULTHANDLER=faulthandler)
    assert result.returncode == -signal.SIGABRT, result.stderr
    # absl's fatal line and its stack, written to the capture, then replayed
    assert "] Check failed: replica_count > 0" in result.stderr, result.stderr
    assert "*** Check failure stack trace: ***" in result.stderr
    if faulthandler:  # the chained handler still runs, and shows where
        assert "Fatal Python error: Aborted" in result.stderr
        assert "in compile_code" in result.stderr


def test_lines_keep_the_plugins_level_but_known_noise(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="pjrt_py.plugin")
    plugin_log.forward(
        "E0000 00:00:1.5   12 cpu_aot_loader.cc:195] Loading XLA:CPU AOT result. Target machine "
        "feature +prefer-no-gather is not  supported on the host machine.\n"
        "E0000 00:00:1.5   12 library_matcher.h:53] Unsupported fusion type: 5\n"
        "E0000 00:00:1.6   12 compiler.cc:10] a real failure\n"
        "W0000 00:00:1.7   12 thing.cc:3] a warning\n"
        "some other thread's output\n"
    )
    levels = {r.getMessage().split("] ", 1)[-1][:14]: r.levelno for r in caplog.records}
    assert levels == {
        "Loading XLA:CP": logging.DEBUG,
        "Unsupported fu": logging.DEBUG,
        "a real failure": logging.ERROR,
        "a warning": logging.WARNING,
    }
    assert capfd.readouterr().err == "some other thread's output\n"


def test_other_output_during_a_long_capture_arrives_before_it_ends(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    # A compile may take minutes: other threads' stderr is not held that long.
    caplog.set_level(logging.DEBUG, logger="pjrt_py.plugin")
    with plugin_log.captured():
        os.write(2, b"written meanwhile\nW0000 00:00:1.7   12 thing.cc:3] held for logging\n")
        with plugin_log.captured():  # overlapping captures share one
            os.write(2, b"and meanwhile again\n")
        seen = ""
        deadline = time.monotonic() + 10 * plugin_log.PUMP_SECONDS + 5
        while "again" not in seen and time.monotonic() < deadline:
            time.sleep(plugin_log.PUMP_SECONDS / 2)
            seen += capfd.readouterr().err
        assert seen == "written meanwhile\nand meanwhile again\n"
        assert not caplog.records  # the plugin's line: when the capture ends
    assert capfd.readouterr().err == ""
    assert [r.getMessage()[-16:] for r in caplog.records] == ["held for logging"]


def _in_subprocess(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"},
    )


@pytest.mark.parametrize("how", ["SIGSEGV", "SIGABRT", "SIGTERM"])
def test_a_fatal_signal_replays_what_was_not_delivered_once(how: str) -> None:
    result = _in_subprocess(
        f"""
        import os, signal, time
        from pjrt_py.runtime import plugin_log
        with plugin_log.captured():
            os.write(2, b"delivered before\\n")
            time.sleep(4 * plugin_log.PUMP_SECONDS)
            os.write(2, b"E0000 00:00:1.6   12 compiler.cc:10] held\\nlast words\\n")
            os.kill(os.getpid(), signal.{how})
        """
    )
    assert result.returncode == -getattr(signal, how), result.stderr
    assert result.stderr == (
        "delivered before\nE0000 00:00:1.6   12 compiler.cc:10] held\nlast words\n"
    )


def test_outside_a_capture_a_fault_reaches_the_handler_installed_before() -> None:
    # The replay handler stays installed after the first capture; outside a
    # capture it must be invisible: a fault reaches faulthandler (installed
    # first, so our handler chains to it) and ends the process as a SIGSEGV.
    result = _in_subprocess(
        """
        import ctypes, faulthandler
        faulthandler.enable()
        from pjrt_py.runtime import plugin_log
        with plugin_log.captured():
            pass
        ctypes.string_at(0)
        """
    )
    assert result.returncode == -signal.SIGSEGV, result.stderr
    assert "Fatal Python error: Segmentation fault" in result.stderr


def test_exit_during_a_capture_shows_what_it_holds() -> None:
    # Another thread is still in the plugin (here: blocked) when the main
    # thread exits normally.
    result = _in_subprocess(
        """
        import os, sys, threading
        from pjrt_py.runtime import plugin_log
        inside = threading.Event()
        def compile_forever():
            with plugin_log.captured():
                os.write(2, b"E0000 00:00:1.6   12 compiler.cc:10] a real failure\\n")
                inside.set()
                threading.Event().wait()
        threading.Thread(target=compile_forever, daemon=True).start()
        inside.wait()
        sys.exit(3)
        """
    )
    assert result.returncode == 3
    assert "compiler.cc:10] a real failure" in result.stderr


def test_a_child_forked_during_a_capture_has_its_own_stderr() -> None:
    result = _in_subprocess(
        """
        import os, threading
        from pjrt_py.runtime import plugin_log
        inside, done = threading.Event(), threading.Event()
        def compiling():
            with plugin_log.captured():
                inside.set()
                done.wait()
        t = threading.Thread(target=compiling)
        t.start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            os.write(2, b"from the child\\n")
            with plugin_log.captured():  # the child's own capture works
                os.write(2, b"E0000 00:00:1.6   12 compiler.cc:10] child's plugin line\\n")
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        done.set()
        t.join()
        print("child status", status)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "child status 0" in result.stdout
    assert "from the child\n" in result.stderr
    assert "child's plugin line" in result.stderr  # logged (lastResort) in the child


def test_a_process_without_stderr_still_compiles() -> None:
    # Nothing to take (descriptor 2 closed, as under `2>&-`): the capture
    # steps aside instead of failing the compile.
    result = _in_subprocess(
        f"""
        import os, numpy as np, pjrt_py
        os.close(2)
        c = pjrt_py.Client()
        exe = c.compile("{ADD}")
        c.deserialize(exe.serialize())
        print(exe.execute(np.ones(8, np.float32)).to_numpy().sum())
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "16.0", result.stdout
