"""``pjrt-py test``: check rewriting, host comparison, and whole runs on the
real installed plugins (crashes, hangs, mismatches, reports, exit codes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import pjrt_py
from pjrt_py.conformance import RewriteError, compare, rewrite, ulp_distance
from pjrt_py.conformance.worker import HOOK_ENV

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "conformance"

PRETTY = """
func.func @main() -> tensor<2xf32> {
  %a = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %b = stablehlo.add %a, %a : tensor<2xf32>
  stablehlo.custom_call @check.expect_close(%b, %a) {max_ulp_difference = 7 : i64} : (tensor<2xf32>, tensor<2xf32>) -> ()
  return %b : tensor<2xf32>
}
"""  # noqa: E501

GENERIC = """
func.func public @main() -> (tensor<3xi32> {jax.result_info = ""}) {
  %a = stablehlo.constant dense<[1, 2, 3]> : tensor<3xi32>
  "stablehlo.custom_call"(%a, %a) {call_target_name = "check.expect_eq", has_side_effect = true} : (tensor<3xi32>, tensor<3xi32>) -> ()
  return %a : tensor<3xi32>
}
"""  # noqa: E501

CONST = """
func.func @main() {
  %a = stablehlo.constant dense<[1.5, 2.5]> : tensor<2xf64>
  stablehlo.custom_call @check.expect_almost_eq_const(%a) {value = dense<[1.5, 2.5]> : tensor<2xf64>} : (tensor<2xf64>) -> ()
  return
}
"""  # noqa: E501

LEGACY = """
module @legacy {
  func.func public @main() -> tensor<i1> {
    %0 = call @value() : () -> tensor<2xi32>
    %1 = stablehlo.constant dense<[4, 5]> : tensor<2xi32>
    %2 = stablehlo.custom_call @check.eq(%0, %1) : (tensor<2xi32>, tensor<2xi32>) -> tensor<i1>
    return %2 : tensor<i1>
  }
  func.func private @value() -> tensor<2xi32> {
    %0 = stablehlo.constant dense<[4, 5]> : tensor<2xi32>
    return %0 : tensor<2xi32>
  }
}
"""  # noqa: E501

WRONG = """
func.func @main() -> tensor<4xf32> {
  %a = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %b = stablehlo.multiply %a, %a : tensor<4xf32>
  stablehlo.custom_call @check.expect_eq_const(%b) {value = dense<[1.0, 4.0, 9.5, 16.0]> : tensor<4xf32>} : (tensor<4xf32>) -> ()
  return %b : tensor<4xf32>
}
"""  # noqa: E501

RECURSIVE = """
func.func @main() -> tensor<f32> {
  %0 = call @main() : () -> tensor<f32>
  return %0 : tensor<f32>
}
"""  # noqa: E501

HOOK_CRASH = """// pjrt-py-conformance-hook: crash=SIGSEGV
func.func @main() -> tensor<f32> {
  %0 = stablehlo.constant dense<1.0> : tensor<f32>
  stablehlo.custom_call @check.expect_eq(%0, %0) : (tensor<f32>, tensor<f32>) -> ()
  return %0 : tensor<f32>
}
"""  # noqa: E501

# An endless while loop whose body does dense work, so it cannot run inline
# at dispatch and never returns.
HANG = """
func.func @main() -> tensor<64x64xf32> {
  %init = stablehlo.constant dense<0.5> : tensor<64x64xf32>
  %r = stablehlo.while(%it = %init) : tensor<64x64xf32>
    cond {
      %t = stablehlo.constant dense<true> : tensor<i1>
      stablehlo.return %t : tensor<i1>
    } do {
      %d = stablehlo.dot_general %it, %it, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
      stablehlo.return %d : tensor<64x64xf32>
    }
  stablehlo.custom_call @check.expect_eq(%r, %init) : (tensor<64x64xf32>, tensor<64x64xf32>) -> ()
  return %r : tensor<64x64xf32>
}
"""  # noqa: E501

GOOD = (EXAMPLES / "add_f32.mlir").read_text()


def pjrt_py_test(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pjrt_py", "test", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


# -- rewriting ---------------------------------------------------------------


def test_rewrite_turns_a_pretty_check_into_two_extra_results() -> None:
    out = rewrite(PRETTY)
    assert "custom_call" not in out.text
    assert "-> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>)" in out.text
    assert "return %b, %b, %a : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>" in out.text
    [check] = out.checks
    assert (check.kind, check.index, check.target) == ("close", 1, "check.expect_close")
    assert check.attrs == {"max_ulp_difference": 7}
    assert check.line == 5


def test_rewrite_reads_generic_custom_calls_and_keeps_result_attributes() -> None:
    out = rewrite(GENERIC)
    assert "custom_call" not in out.text
    assert '(tensor<3xi32> {jax.result_info = ""}, tensor<3xi32>, tensor<3xi32>)' in out.text
    assert [c.kind for c in out.checks] == ["eq"]


def test_rewrite_materialises_a_const_check_value_as_a_constant() -> None:
    out = rewrite(CONST)
    assert "stablehlo.constant dense<[1.5, 2.5]> : tensor<2xf64>" in out.text
    assert "-> (tensor<2xf64>, tensor<2xf64>)" in out.text
    assert [c.kind for c in out.checks] == ["almost_eq"]
    assert out.num_original_results == 0


def test_rewrite_replaces_a_used_check_result_by_true() -> None:
    out = rewrite(LEGACY)
    assert "%2 = stablehlo.constant dense<true> : tensor<i1>" in out.text
    assert "return %2, %0, %1 : tensor<i1>, tensor<2xi32>, tensor<2xi32>" in out.text
    assert out.checks[0].index == 1


def test_rewrite_leaves_a_program_without_checks_alone() -> None:
    text = (EXAMPLES / "scale_npy.mlir").read_text()
    assert rewrite(text).text == text


@pytest.mark.parametrize("text", [PRETTY, GENERIC, CONST, LEGACY, GOOD])
def test_rewritten_programs_compile_and_run(client: pjrt_py.Client, text: str) -> None:
    out = rewrite(text)
    results = client.compile(out.text).execute()
    results = results if isinstance(results, tuple) else (results,)
    assert len(results) == out.num_original_results + 2 * len(out.checks)


# -- comparison --------------------------------------------------------------


def test_ulp_distance_counts_representable_steps_across_zero() -> None:
    a = np.array([1.0, 0.0, -0.0, np.nan, 1.0], np.float32)
    b = np.array([np.nextafter(np.float32(1), np.float32(2)), -0.0, 1e-45, np.nan, np.nan])
    d = ulp_distance(a, b.astype(np.float32))
    assert d[:4].tolist() == [1, 0, 1, 0]
    assert d[4] == np.iinfo(np.uint64).max
    bf = np.array([1.0, 1.0078125], ml_dtypes.bfloat16)
    assert ulp_distance(bf[:1], bf[1:]).tolist() == [1]


# Every float type a plugin computes in, as numpy and ml_dtypes have them:
# numpy gives most of ml_dtypes' kind "V", and the 1-byte ones had no integer
# view, so float8 was compared as integers or raised KeyError.
NARROW_FLOATS = [
    np.dtype(getattr(ml_dtypes, name))
    for name in (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
        "float8_e4m3",
        "float8_e3m4",
        "float4_e2m1fn",
    )
    if hasattr(ml_dtypes, name)
]


@pytest.mark.parametrize("dtype", [np.dtype(np.float64), *NARROW_FLOATS], ids=str)
def test_ulp_distance_and_rules_for_every_float_type(dtype: np.dtype) -> None:
    info = ml_dtypes.finfo(dtype)
    # The representable values from -max to max in order: each is 1 ulp from the next.
    if dtype.itemsize == 1:
        values = np.arange(256, dtype=np.uint8).view(dtype)
        if info.bits == 4:
            values = np.arange(16, dtype=np.uint8).view(dtype)
        values = np.unique(values[np.isfinite(values.astype(np.float64))].astype(np.float64))
        values = values.astype(dtype)
    else:
        tiny = np.array([0, 1, 2], np.uint64).astype({2: np.uint16, 8: np.uint64}[dtype.itemsize])
        values = np.concatenate([-tiny[::-1].view(dtype)[:-1], tiny.view(dtype)])
    steps = ulp_distance(values[:-1], values[1:])
    assert steps.tolist() == [1] * (len(values) - 1), dtype
    lowest, one = values[:1], np.ones(1, dtype)
    assert ulp_distance(lowest, values[-1:]).tolist() == [len(values) - 1]
    assert compare("close", one, np.nextafter(one.astype(np.float64), 2).astype(dtype)) is None
    if np.isnan(np.array(np.nan, dtype).astype(np.float64)):
        nan = np.array([np.nan], dtype)
        assert compare("eq", nan, nan) is None
        assert compare("almost_eq", nan, nan) is None
        assert compare("eq", nan, one) is not None
    assert compare("eq", np.zeros(1, dtype), -np.zeros(1, dtype)) is None
    assert compare("almost_eq", one, one) is None


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)], ids=str)
def test_an_infinity_is_almost_equal_only_to_itself(dtype: np.dtype) -> None:
    inf, ninf = np.array([np.inf], dtype), np.array([-np.inf], dtype)
    for got, want in [(5.0, np.inf), (0.0, -np.inf), (np.inf, -np.inf), (np.inf, 5.0)]:
        result = compare("almost_eq", np.array([got], dtype), np.array([want], dtype))
        assert result is not None, (got, want)  # tol * |inf| made every pair near
    assert compare("almost_eq", inf, inf) is None
    assert compare("almost_eq", ninf, ninf) is None


def test_compare_rules_per_kind() -> None:
    x = np.array([1.0, 2.0], np.float32)
    near = x + np.float32(1e-5)
    assert compare("eq", x, near) is not None
    assert compare("almost_eq", x, near) is None
    assert compare("almost_eq", x, x + np.float32(1e-2)) is not None
    step = np.nextafter(x, np.float32(10))
    assert compare("close", x, step) is None
    assert compare("close", x, x, {"min_ulp_difference": 1}) is not None
    ints = np.array([1, 2], np.int32)
    assert compare("almost_eq", ints, ints + 1) is not None  # ints are exact
    z = np.array([1 + 2j], np.complex64)
    assert compare("almost_eq", z, z + np.complex64(1e-6j)) is None
    mismatch = compare("eq", np.array([[1, 2], [3, 4]], np.int32), np.array([[1, 2], [3, 5]]))
    assert mismatch is not None and "int32" in mismatch.message  # dtype differs
    mismatch = compare("eq", x, np.array([1.0, 3.0], np.float32))
    assert mismatch is not None and mismatch.first[0]["index"] == [1]
    assert mismatch.first[0]["ulp"] == 1 << 22


# -- whole runs on the real plugins -----------------------------------------


def test_examples_pass_on_every_installed_build() -> None:
    result = pjrt_py_test(str(EXAMPLES), "--all-plugins", "--json", "-")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    n_files = len(list(EXAMPLES.glob("*.mlir")))
    assert len(report["plugins"]) == len({i.path for i in pjrt_py.plugins()})
    for plugin in report["plugins"]:
        assert plugin["counts"]["pass"] == n_files, plugin
    assert {r["status"] for r in report["results"]} == {"pass"}
    assert "pass" in result.stderr  # the table goes to stderr with --json -


def test_a_wrong_expected_value_is_a_mismatch_with_detail(tmp_path: Path) -> None:
    cases = write(tmp_path / "cases", {"wrong.mlir": WRONG, "good.mlir": GOOD})
    result = pjrt_py_test(str(cases), "-v", "-j", "1")
    assert result.returncode == 1
    assert "MISMATCH" in result.stdout and "wrong.mlir" in result.stdout
    assert "check.expect_eq_const (line 5): 1 of 4 element(s) differ (exact)" in result.stdout
    assert "at (2,): got 9.0, expected 9.5  ulp 524288" in result.stdout
    assert "PASS" in result.stdout and "good.mlir" in result.stdout


def test_crashes_are_reported_with_the_signal_and_the_run_goes_on(tmp_path: Path) -> None:
    cases = write(
        tmp_path / "cases",
        {"a_hook.mlir": HOOK_CRASH, "b_good.mlir": GOOD, "c_recursive.mlir": RECURSIVE},
    )
    (cases / "d_good.mlir").write_text(GOOD)
    out = tmp_path / "report.json"
    result = pjrt_py_test(str(cases), "-j", "1", "--json", str(out), env={HOOK_ENV: "1"})
    assert result.returncode == 1
    by_file = {Path(r["path"]).name: r for r in json.loads(out.read_text())["results"]}
    hook = by_file["a_hook.mlir"]
    assert hook["status"] == "crash"
    assert "SIGSEGV" in hook["message"]
    assert "test hook: raising SIGSEGV" in hook["output"]
    # Pre-compile validation may turn the recursion into a clean error.
    assert by_file["c_recursive.mlir"]["status"] in ("crash", "error")
    if by_file["c_recursive.mlir"]["status"] == "crash":
        assert "SIG" in by_file["c_recursive.mlir"]["message"]
    assert by_file["b_good.mlir"]["status"] == by_file["d_good.mlir"]["status"] == "pass"
    assert "CRASH" in result.stdout and "SIGSEGV" in result.stdout


def test_the_test_hook_is_off_without_its_environment_variable(tmp_path: Path) -> None:
    cases = write(tmp_path / "cases", {"hook.mlir": HOOK_CRASH})
    result = pjrt_py_test(str(cases))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_hang_is_a_timeout_and_junit_counts_it(tmp_path: Path) -> None:
    cases = write(tmp_path / "cases", {"a_hang.mlir": HANG, "b_good.mlir": GOOD})
    junit = tmp_path / "junit.xml"
    result = pjrt_py_test(str(cases), "--timeout", "2", "-j", "1", "--junit", str(junit))
    assert result.returncode == 1
    assert "TIMEOUT" in result.stdout and "no result after 2 s" in result.stdout
    root = ET.parse(junit).getroot()
    [suite] = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("2", "1", "0")
    [error] = suite.iter("error")
    assert error.get("type") == "timeout"
    names = [case.get("name") for case in suite.iter("testcase")]
    assert [Path(str(n)).name for n in names] == ["a_hang.mlir", "b_good.mlir"]


def test_junit_has_one_suite_per_build_and_counts_mismatches(tmp_path: Path) -> None:
    cases = write(tmp_path / "cases", {"wrong.mlir": WRONG, "good.mlir": GOOD})
    junit = tmp_path / "junit.xml"
    result = pjrt_py_test(str(cases), "--all-plugins", "--junit", str(junit))
    assert result.returncode == 1
    suites = ET.parse(junit).getroot().findall("testsuite")
    assert len(suites) == len({i.path for i in pjrt_py.plugins()})
    for suite in suites:
        assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
        assert len(list(suite.iter("failure"))) == 1


def test_bad_arguments_exit_non_zero(tmp_path: Path) -> None:
    missing = pjrt_py_test(str(tmp_path / "nope"))
    assert missing.returncode == 1 and "no such file" in missing.stderr
    empty = pjrt_py_test(str(write(tmp_path / "empty", {})))
    assert empty.returncode == 1 and "no .mlir cases under" in empty.stdout
    plugin = pjrt_py_test(str(EXAMPLES), "--plugin", "no-such-plugin")
    assert plugin.returncode == 1 and "no-such-plugin" in plugin.stderr


def test_plugin_names_are_read_as_pjrt_py_run_reads_them(tmp_path: Path) -> None:
    # One resolver (pjrt_py.runtime.discovery.find_plugin) for `test --plugin`, `run
    # --plugin` and Client: a platform name, a distribution name, a path.
    from pjrt_py.conformance import targets

    cpu = pjrt_py.runtime.discovery.find_plugin("cpu")
    build = next(i for i in pjrt_py.plugins() if i.path == cpu)
    for spec in ("cpu", build.distribution, cpu):
        assert spec is not None
        assert [t.path for t in targets.resolve([spec], False)] == [cpu], spec
    one = write(tmp_path, {"add_f32.mlir": GOOD})
    result = pjrt_py_test(str(one), "--plugin", "cpu", "-j", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert cpu in result.stdout


@pytest.mark.parametrize("how", ["--plugin", "$PJRT_PLUGIN"])
def test_an_unknown_plugin_name_says_where_it_came_from(how: str) -> None:
    if how == "--plugin":
        result = pjrt_py_test(str(EXAMPLES), "--plugin", "no-such-plugin")
    else:
        result = pjrt_py_test(str(EXAMPLES), env={"PJRT_PLUGIN": "no-such-plugin"})
    assert result.returncode == 1
    assert f"PJRT plugin 'no-such-plugin' (from {how})" in result.stderr, result.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pjrt_py", "run", str(EXAMPLES / "add_f32.mlir")]
        + (["--plugin", "no-such-plugin"] if how == "--plugin" else []),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **({"PJRT_PLUGIN": "no-such-plugin"} if how != "--plugin" else {})},
    )
    assert run.returncode == 1
    assert f"PJRT plugin 'no-such-plugin' (from {how})" in run.stderr, run.stderr


ZYGOTE_RUN = """
import json, sys
from pjrt_py.conformance import runner, targets
chosen = targets.resolve([], False)
with runner.Pool(chosen, 1) as pool:
    assert pool.zygote is not None, "no zygote in a fresh single-threaded process"
    results, versions = runner.run(sys.argv[1:], chosen, 1, 60.0, pool=pool)
print(json.dumps([[r.path, r.status, r.message, r.output] for r in results]))
"""


def test_workers_fork_from_a_zygote_and_a_crashed_one_is_replaced(tmp_path: Path) -> None:
    cases = write(tmp_path, {"a_hook.mlir": HOOK_CRASH, "b_good.mlir": GOOD, "c_good.mlir": GOOD})
    paths = [str(cases / name) for name in ("a_hook.mlir", "b_good.mlir", "c_good.mlir")]
    result = subprocess.run(
        [sys.executable, "-c", ZYGOTE_RUN, *paths],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, HOOK_ENV: "1"},
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(Path(p).name, s) for p, s, _, _ in rows] == [
        ("a_hook.mlir", "crash"),
        ("b_good.mlir", "pass"),
        ("c_good.mlir", "pass"),
    ]
    assert rows[0][2] == "worker killed by SIGSEGV"
    assert "test hook: raising SIGSEGV" in rows[0][3]


def test_without_a_zygote_workers_are_fresh_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pjrt_py.conformance import runner, targets

    monkeypatch.setattr(runner.Zygote, "usable", staticmethod(lambda: False))
    monkeypatch.setenv(HOOK_ENV, "1")
    cases = write(tmp_path, {"a_hook.mlir": HOOK_CRASH, "b_good.mlir": GOOD})
    paths = [str(cases / "a_hook.mlir"), str(cases / "b_good.mlir")]
    chosen = targets.resolve([], False)
    with runner.Pool(chosen, 1) as pool:
        assert pool.zygote is None
        results, versions = runner.run(paths, chosen, 1, 60.0, pool=pool)
    assert [r.status for r in results] == ["crash", "pass"]
    assert results[0].message == "worker killed by SIGSEGV"
    assert "test hook: raising SIGSEGV" in results[0].output
    assert versions[chosen[0].label]


def _live(group: int) -> list[str]:
    """The processes of a process group that are still running (not zombies)."""
    ps = subprocess.run(
        ["ps", "-o", "pid=,stat=", "-g", str(group)], capture_output=True, text=True
    ).stdout
    return [line for line in ps.splitlines() if line.split()[1][0] != "Z"]


def _hanging_run(tmp_path: Path) -> subprocess.Popen[str]:
    """``pjrt-py test -j 2`` busy on two hanging cases, in a new process group."""
    cases = write(tmp_path, {"a.mlir": HANG, "b.mlir": HANG, "c.mlir": GOOD})
    # `python -m pjrt_py test ...` with Python's SIGINT handler, as from an
    # interactive shell, even where this process was started with SIGINT ignored.
    command = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv[0] = 'pjrt-py'; runpy.run_module('pjrt_py', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", command, "test", str(cases), "-j", "2", "--timeout", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, HOOK_ENV: "1"},
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(_live(proc.pid)) < 4:  # the runner, the zygote, two busy workers
        assert time.monotonic() < deadline, _live(proc.pid)
        time.sleep(0.1)
    time.sleep(1.0)  # the workers are now inside their hanging case
    return proc


def test_ctrl_c_stops_the_run_at_once_and_kills_every_worker(tmp_path: Path) -> None:
    proc = _hanging_run(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole group
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "interrupted" in out and "Traceback" not in out and "CRASH" not in out, out
    deadline = time.monotonic() + 10
    while _live(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live(proc.pid) == []


def test_a_runner_killed_outright_leaves_no_worker_behind(tmp_path: Path) -> None:
    proc = _hanging_run(tmp_path)
    proc.kill()  # SIGKILL: no cleanup of its own runs
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while _live(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live(proc.pid) == []


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--timeout", "nan", "positive, finite"),  # ran no file and exited 0, before
        ("--timeout", "inf", "positive, finite"),
        ("--timeout", "-5", "positive, finite"),
        ("--timeout", "soon", "takes seconds"),
        ("-j", "-1", "at least 1"),  # an IndexError, before
        ("-j", "0", "at least 1"),
        ("-j", "2.5", "whole number"),
    ],
)
def test_numeric_options_are_refused_by_name(option: str, value: str, message: str) -> None:
    result = pjrt_py_test(str(EXAMPLES), option, value)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_workers_never_outnumber_the_files(tmp_path: Path) -> None:
    # -j 100000 on a directory started 100000 workers (358 processes after 20 s).
    cases = write(tmp_path / "cases", {"good.mlir": GOOD})
    result = pjrt_py_test(str(cases), "-j", "100000", "--timeout", "60")
    assert result.returncode == 0, result.stdout + result.stderr


def test_junit_names_with_control_characters_stay_valid_xml(tmp_path: Path) -> None:
    cases = write(tmp_path / "cases", {"bell\x07and\x1bescape.mlir": GOOD})
    junit = tmp_path / "junit.xml"
    result = pjrt_py_test(str(cases), "--junit", str(junit))
    assert result.returncode == 0, result.stdout + result.stderr
    (case,) = ET.parse(junit).getroot().iter("testcase")
    assert case.get("name", "").endswith("bell\\x07and\\x1bescape.mlir")


def test_a_plugin_that_fails_to_start_is_reported_by_its_exception() -> None:
    # A GPU build without its GPU used to say only "worker exited with code 1".
    from pjrt_py.conformance.runner import raised  # noqa: PLC0415

    tail = (
        "E1127 cuda_platform.cc:57] failed call to cuInit\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "    raise _core.error_from_pjrt(self.address, address(error))\n"
        "pjrt_py.runtime.errors.FailedPreconditionError: No visible GPU devices.\n"
    )
    assert raised(tail) == "FailedPreconditionError: No visible GPU devices."
    assert raised("Segmentation fault\n") is None
    assert raised("") is None


@pytest.mark.parametrize("kind", ["expect_eq", "expect_almost_eq", "expect_close"])
def test_a_failed_check_of_a_scalar_float_is_a_mismatch(tmp_path: Path, kind: str) -> None:
    # ulp_distance made a 0-d array 1-d: the failed check was an error
    # ("only 0-dimensional arrays can be converted"), a passing one passed.
    program = f"""
func.func @main() {{
  %a = stablehlo.constant dense<6.0> : tensor<f32>
  %b = stablehlo.constant dense<7.0> : tensor<f32>
  stablehlo.custom_call @check.{kind}(%a, %b) : (tensor<f32>, tensor<f32>) -> ()
  return
}}
"""
    cases = write(tmp_path / "cases", {"scalar.mlir": program})
    result = pjrt_py_test(str(cases), "-j", "1")
    assert result.returncode == 1 and "MISMATCH" in result.stdout, result.stdout


def test_a_check_the_rewrite_cannot_run_is_refused_not_passed() -> None:
    # One in a private function was skipped (the file passed with 0 checks);
    # one in a while body cut @main apart and the compiler's error followed.
    in_private = """
func.func private @helper(%a: tensor<2xf32>) {
  %w = stablehlo.constant dense<[9.0, 9.0]> : tensor<2xf32>
  stablehlo.custom_call @check.expect_eq(%a, %w) : (tensor<2xf32>, tensor<2xf32>) -> ()
  return
}
func.func @main() {
  %a = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  func.call @helper(%a) : (tensor<2xf32>) -> ()
  return
}
"""
    in_region = """
func.func @main() {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %r = stablehlo.while(%i = %c0) : tensor<i32>
  cond {
    %lim = stablehlo.constant dense<3> : tensor<i32>
    %p = stablehlo.compare LT, %i, %lim : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %n = stablehlo.add %i, %i : tensor<i32>
    stablehlo.custom_call @check.expect_eq(%n, %n) : (tensor<i32>, tensor<i32>) -> ()
    stablehlo.return %n : tensor<i32>
  }
  return
}
"""
    with pytest.raises(RewriteError, match="outside @main"):
        rewrite(in_private)
    with pytest.raises(RewriteError, match="inside a region"):
        rewrite(in_region)
    assert rewrite(PRETTY).checks  # a check at @main's top level still rewrites


IDENTITY_2X3 = """
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  return %x : tensor<2x3xf32>
}
"""


def test_case_files_are_read_by_what_they_are(tmp_path: Path) -> None:
    # A sibling that is no .npy was reported as "pickled (object) data" to
    # allow, a big-endian expected result as a mismatch of >f4 and float32,
    # and a case with a NUL byte or bad UTF-8 with no file named.
    cases = write(tmp_path / "cases", {f"{n}.mlir": IDENTITY_2X3 for n in ("be", "txt")})
    (cases / "nul.mlir").write_bytes(IDENTITY_2X3.encode() + b"\0")
    (cases / "latin.mlir").write_bytes(b"\xff" + IDENTITY_2X3.encode())
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(cases / "be.input0.npy", a.astype(">f4"))
    np.save(cases / "be.expected0.npy", a.astype(">f4"))
    np.save(cases / "txt.expected0.npy", a)
    (cases / "txt.input0.npy").write_text("hello, not numpy\n")
    result = pjrt_py_test(str(cases), "-j", "1")
    lines = {}
    for line in result.stdout.splitlines():
        for name in ("be", "txt", "nul", "latin"):
            if f"{name}.mlir" in line:
                lines[name] = line
    assert lines["be"].startswith("PASS"), result.stdout
    assert "input" in lines["txt"] and "is not a .npy file (no numpy header)" in lines["txt"]
    assert "pickle" not in result.stdout
    assert "case" in lines["nul"] and "nul.mlir" in lines["nul"] and "NUL byte" in lines["nul"]
    assert "latin.mlir" in lines["latin"] and "not UTF-8" in lines["latin"]
