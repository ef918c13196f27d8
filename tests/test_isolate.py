"""Crash-isolated compiles (pjrt_py.programs.isolate) on the real CPU plugin.

Crashes are made by the helper's documented test hook
(``$PJRT_PY_ISOLATE_TEST_CRASH`` and a marker in the program), so they do
not depend on a compiler bug. Anything that could take down the test process
itself if isolation failed (a real compiler crash, fork, exit) runs in a
subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ADD_F32_8, run_python

import pjrt_py
from pjrt_py.programs import compile_process, compile_worker, isolate

ROOT = Path(__file__).resolve().parents[1]

MLP = """
func.func @main(%x: tensor<4x8xf32>, %w1: tensor<8x16xf32>, %b1: tensor<16xf32>,
                %w2: tensor<16x3xf32>) -> tensor<4x3xf32> {
  %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0]
    : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  %bb = stablehlo.broadcast_in_dim %b1, dims = [1] : (tensor<16xf32>) -> tensor<4x16xf32>
  %hb = stablehlo.add %h, %bb : tensor<4x16xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<4x16xf32>
  %r = stablehlo.maximum %hb, %zero : tensor<4x16xf32>
  %o = stablehlo.dot_general %r, %w2, contracting_dims = [1] x [0]
    : (tensor<4x16xf32>, tensor<16x3xf32>) -> tensor<4x3xf32>
  return %o : tensor<4x3xf32>
}
"""

# Compiled by the helper only when its test hook is on: then it crashes.
CRASHING = f"// {compile_process.TEST_CRASH_MARKER.decode()}\n{ADD_F32_8}"

# A recursive @main: segfaulted every installed CPU build's compiler when written.
RECURSIVE = """
func.func @main() -> tensor<f32> {
  %0 = call @main() : () -> tensor<f32>
  return %0 : tensor<f32>
}
"""

# A type error the compiler reports (an ordinary PjrtError).
INVALID = """
func.func @main(%x: tensor<8xf32>, %y: tensor<4xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


def scaled(k: int) -> str:
    """A different program for each k: x * k."""
    return f"""
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {{
  %k = stablehlo.constant dense<{k}.0> : tensor<8xf32>
  %0 = stablehlo.multiply %x, %k : tensor<8xf32>
  return %0 : tensor<8xf32>
}}
"""


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` has ended (a zombie not reaped by init counts) within a time."""
    stop = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= stop:
            return False
        time.sleep(0.02)


@pytest.fixture
def iso() -> pjrt_py.Client:
    client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
    yield client
    client.close()


def test_isolated_compile_matches_in_process_and_numpy(iso: pjrt_py.Client) -> None:
    rng = np.random.default_rng(0)
    x, w1 = rng.standard_normal((4, 8), np.float32), rng.standard_normal((8, 16), np.float32)
    b1, w2 = rng.standard_normal(16, np.float32), rng.standard_normal((16, 3), np.float32)
    isolated = iso.compile(MLP)
    local = iso.compile(MLP, isolate=False, cache=False)
    assert iso.compile_helper.pid is not None
    got = isolated.execute(x, w1, b1, w2).to_numpy()
    np.testing.assert_array_equal(got, local.execute(x, w1, b1, w2).to_numpy())
    np.testing.assert_allclose(got, np.maximum(x @ w1 + b1, 0) @ w2, rtol=1e-5, atol=1e-5)
    assert isolated.input_signature == local.input_signature
    assert isolated.input_signature is not None
    assert [s.name for s in isolated.input_signature] == ["x", "w1", "b1", "w2"]


def test_helper_is_started_lazily_and_reused(iso: pjrt_py.Client) -> None:
    assert iso.compile_helper.pid is None
    x = np.arange(8, dtype=np.float32)
    pids = set()
    for k in range(1, 4):
        exe = iso.compile(scaled(k))
        np.testing.assert_array_equal(exe.execute(x).to_numpy(), x * k)
        pids.add(iso.compile_helper.pid)
    iso.compile(scaled(1), cache=False)
    pids.add(iso.compile_helper.pid)
    assert len(pids) == 1 and None not in pids


def test_cache_key_does_not_depend_on_isolate() -> None:
    client = pjrt_py.Client(cache_dir=False)
    try:
        first = client.compile(ADD_F32_8)
        again = client.compile(ADD_F32_8, isolate=True)  # a hit: nothing compiles
        assert client.compile_cache.misses == 1
        assert client.compile_helper.pid is None
        ones = np.ones(8, np.float32)
        np.testing.assert_array_equal(again.execute(ones, ones).to_numpy(), 2 * ones)
        del first
    finally:
        client.close()


def test_isolated_compile_fills_the_disk_cache(tmp_path: Path) -> None:
    client = pjrt_py.Client(cache_dir=tmp_path, isolate_compile=True)
    try:
        client.compile(ADD_F32_8)
        assert client.disk_cache is not None and client.disk_cache.writes == 1
        assert client.compile_helper.pid is not None
    finally:
        client.close()
    fresh = pjrt_py.Client(cache_dir=tmp_path, isolate_compile=True)
    try:
        fresh.compile(ADD_F32_8)  # a disk hit: no helper needed
        assert fresh.disk_cache is not None and fresh.disk_cache.hits == 1
        assert fresh.compile_helper.pid is None
    finally:
        fresh.close()


@pytest.mark.parametrize(("hook", "sig"), [("segv", signal.SIGSEGV), ("abort", signal.SIGABRT)])
def test_compiler_crash_raises_and_next_compile_starts_a_new_helper(
    monkeypatch: pytest.MonkeyPatch, hook: str, sig: signal.Signals
) -> None:
    monkeypatch.setenv(compile_process.ENV_TEST_CRASH, hook)
    client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
    try:
        client.compile(ADD_F32_8)
        crashed = client.compile_helper.pid
        assert crashed is not None
        with pytest.raises(pjrt_py.CompilerCrashError) as info:
            client.compile(CRASHING)
        error = info.value
        assert isinstance(error, pjrt_py.PjrtError)
        assert error.signal == sig and error.returncode == -sig
        assert sig.name in str(error)
        assert f"test hook {compile_process.ENV_TEST_CRASH}={hook}" in error.output
        assert error.output in str(error)
        assert "Fatal Python error" in error.output  # faulthandler's report, in the tail
        assert client.compile_helper.pid is None
        assert gone(crashed, within=0)  # reaped, not a zombie
        ones = np.ones(8, np.float32)
        exe = client.compile(ADD_F32_8, cache=False)  # a new helper
        assert client.compile_helper.pid not in (None, crashed)
        np.testing.assert_array_equal(exe.execute(ones, ones).to_numpy(), 2 * ones)
    finally:
        client.close()


def test_recursive_main_is_rejected_or_a_compiler_crash() -> None:
    # Pre-compile validation may reject it (ValueError) before any compile;
    # otherwise the compiler segfaults, in the helper only.
    code = f"""
        import numpy as np, pjrt_py
        client = pjrt_py.Client(cache_dir=False)
        try:
            client.compile({RECURSIVE!r}, isolate=True)
        except (ValueError, pjrt_py.CompilerCrashError) as exc:
            crash = getattr(exc, "signal", None)
            print("raised", type(exc).__name__, crash and crash.name)
        ones = np.ones(8, np.float32)
        exe = client.compile({ADD_F32_8!r}, isolate=True)
        print("then", exe.execute(ones, ones).to_numpy().tolist())
    """
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] in ("raised ValueError None", "raised CompilerCrashError SIGSEGV")
    assert lines[1] == f"then {[2.0] * 8}"


def test_compile_error_keeps_its_class_and_message(iso: pjrt_py.Client) -> None:
    with pytest.raises(Exception) as local:
        iso.compile(INVALID, isolate=False, cache=False)
    with pytest.raises(Exception) as isolated:
        iso.compile(INVALID, cache=False)
    assert type(isolated.value) is type(local.value)
    assert str(isolated.value) == str(local.value)
    if isinstance(local.value, pjrt_py.PjrtError):
        assert isinstance(isolated.value, pjrt_py.PjrtError)
        assert isolated.value.code == local.value.code
        assert iso.compile_helper.pid is not None  # an ordinary error keeps the helper


def test_error_descriptions_rebuild_their_classes() -> None:
    for exc in (
        pjrt_py.InvalidArgumentError("bad", 3),
        pjrt_py.UnsupportedError("no such function"),
        pjrt_py.SerializationError("damaged"),
        ValueError("program is empty"),
    ):
        rebuilt = isolate._rebuild(json.loads(compile_worker._describe(exc)))
        assert type(rebuilt) is type(exc) and str(rebuilt) == str(exc)
    other = isolate._rebuild(json.loads(compile_worker._describe(KeyError("k"))))
    assert type(other) is KeyError
    unknown = {"module": "somewhere", "name": "Odd", "message": "m", "code": None}
    assert "somewhere.Odd in the compile helper: m" in str(isolate._rebuild(unknown))


def test_environment_sets_the_client_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isolate.ENV_DEFAULT, "1")
    client = pjrt_py.Client(cache_dir=False)
    try:
        assert client.isolate_compile is True
        client.compile(ADD_F32_8)
        assert client.compile_helper.pid is not None
        assert pjrt_py.Client(cache_dir=False, isolate_compile=False).isolate_compile is False
    finally:
        client.close()
    monkeypatch.setenv(isolate.ENV_DEFAULT, "0")
    assert pjrt_py.Client(cache_dir=False).isolate_compile is False
    monkeypatch.setenv(isolate.ENV_DEFAULT, "perhaps")
    with pytest.raises(ValueError, match=isolate.ENV_DEFAULT):
        pjrt_py.Client(cache_dir=False)
    monkeypatch.delenv(isolate.ENV_DEFAULT)
    with pytest.raises(TypeError, match="isolate_compile"):
        pjrt_py.Client(cache_dir=False, isolate_compile=1)  # type: ignore[arg-type]


def test_close_stops_the_helper_and_is_idempotent() -> None:
    client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
    client.compile(ADD_F32_8)
    pid = client.compile_helper.pid
    assert pid is not None
    client.close()
    assert gone(pid, within=0)  # stopped and reaped by close()
    client.close()
    assert client.compile_helper.closed and client.compile_helper.pid is None
    with pytest.raises(ValueError, match="closed"):
        client.compile(ADD_F32_8, cache=False)
    with pytest.raises(ValueError, match="closed"):
        client.compile_helper.compile(ADD_F32_8, ADD_F32_8.encode(), b"")


def test_close_during_a_compile_kills_the_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compile_process.ENV_TEST_CRASH, "hang")
    client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
    client.compile(ADD_F32_8)
    pid = client.compile_helper.pid
    assert pid is not None
    raised: list[BaseException] = []

    def hang() -> None:
        try:
            client.compile(CRASHING)
        except BaseException as exc:  # checked below
            raised.append(exc)

    thread = threading.Thread(target=hang)
    thread.start()
    time.sleep(0.5)
    client.close()  # does not wait for the hung compile
    thread.join(30)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], ValueError), raised
    assert "closed" in str(raised[0])
    assert gone(pid, within=0) and client.compile_helper.pid is None


def test_timeout_kills_a_hung_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compile_process.ENV_TEST_CRASH, "hang")
    monkeypatch.setenv(isolate.ENV_TIMEOUT, "3")
    client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
    try:
        client.compile(ADD_F32_8)
        hung = client.compile_helper.pid
        assert hung is not None
        started = time.monotonic()
        with pytest.raises(pjrt_py.DeadlineExceededError, match=isolate.ENV_TIMEOUT):
            client.compile(CRASHING)
        assert time.monotonic() - started < 10
        assert gone(hung, within=0) and client.compile_helper.pid is None
        client.compile(ADD_F32_8, cache=False)  # a new helper
        assert client.compile_helper.pid not in (None, hung)
        monkeypatch.setenv(isolate.ENV_TIMEOUT, "soon")
        with pytest.raises(ValueError, match=isolate.ENV_TIMEOUT):
            client.compile(ADD_F32_8, cache=False)
    finally:
        client.close()


def test_threads_compile_concurrently_without_interleaving(iso: pjrt_py.Client) -> None:
    x = np.arange(8, dtype=np.float32)
    failures: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for k in range(offset, offset + 4):
                exe = iso.compile(scaled(k), cache=False)
                np.testing.assert_array_equal(exe.execute(x).to_numpy(), x * k)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(offset,)) for offset in (1, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert iso.compile_helper.pid is not None


@pytest.mark.needs_fork_children
def test_forked_child_starts_its_own_helper() -> None:
    code = f"""
        import os, numpy as np, pjrt_py
        ones = np.ones(8, np.float32)
        client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
        client.compile({ADD_F32_8!r})
        parent_helper = client.compile_helper.pid
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                fresh = pjrt_py.Client(cache_dir=False, isolate_compile=True)
                exe = fresh.compile({ADD_F32_8!r})
                mine = fresh.compile_helper.pid
                ok = (exe.execute(ones, ones).to_numpy() == 2).all()
                status = 0 if ok and mine not in (None, parent_helper) else 2
                fresh.close()
            finally:
                os._exit(status)
        _, wait_status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(wait_status))
        exe = client.compile({ADD_F32_8!r}, cache=False)
        print("same helper", client.compile_helper.pid == parent_helper)
        print("result", exe.execute(ones, ones).to_numpy().tolist())
    """
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["child 0", "same helper True", f"result {[2.0] * 8}"]


def test_helper_ends_with_the_interpreter() -> None:
    start = f"""
import os, pjrt_py
client = pjrt_py.Client(cache_dir=False, isolate_compile=True)
client.compile({ADD_F32_8!r})
print(client.compile_helper.pid, flush=True)
"""
    result = run_python(start)  # exits without close()
    assert result.returncode == 0, result.stderr
    assert gone(int(result.stdout.split()[0]), within=0)  # stopped by the exit sequence
    killed = run_python(start + "os.kill(os.getpid(), 9)\n")
    assert killed.returncode == -signal.SIGKILL
    assert gone(int(killed.stdout.split()[0]))  # the helper saw its pipe close and left


def test_helper_that_cannot_start_reports_why(tmp_path: Path) -> None:
    compiler = isolate.IsolatedCompiler(str(tmp_path / "missing.so"), {})
    try:
        with pytest.raises(Exception, match="missing.so") as info:
            compiler.compile(ADD_F32_8, ADD_F32_8.encode(), b"")
        assert not isinstance(info.value, pjrt_py.CompilerCrashError)
        assert compiler.pid is None
    finally:
        compiler.close()


def test_cli_run_survives_a_compiler_crash(tmp_path: Path) -> None:
    program = tmp_path / "crash.mlir"
    program.write_text(CRASHING)
    result = subprocess.run(
        [sys.executable, "-m", "pjrt_py", "run", str(program)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, compile_process.ENV_TEST_CRASH: "segv"},
    )
    assert result.returncode == 1
    assert "error: CompilerCrashError" in result.stderr and "SIGSEGV" in result.stderr


def test_benchmark_writes_well_formed_json(tmp_path: Path) -> None:
    out = tmp_path / "isolated_compile.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.isolated_compile", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["benchmark"] == "isolated_compile"
    assert set(report["seconds"]) >= {"in_process", "isolated_cold", "isolated_warm"}
    assert all(v > 0 for v in report["seconds"].values())
