"""Every class of bad input in docs/reliability.md, and what it gets.

All cases run in one fresh interpreter per plugin (a case that killed the
process would fail the test, naming the last case reached); each prints the
exception it got. The table in docs/reliability.md lists the same ids: a test
keeps the two in step.
"""

from __future__ import annotations

import builtins
import json
import re
import textwrap
from pathlib import Path

import pytest
from conftest import ADD_F32_8, capability_skip, run_python

import pjrt_py
from pjrt_py.programs.plugin_guards import PACKED_LAYOUTS_FROM

ROOT = Path(__file__).resolve().parents[1]

# id -> (code run with `client`, `np`, `pjrt_py`, `ADD` in scope; the exception expected)
CASES: dict[str, tuple[str, str]] = {
    # client options, checked against the types the plugin reads them as
    "client-option-str": ("pjrt_py.Client(options={'cpu_device_count': '4'})", "TypeError"),
    "client-option-float": ("pjrt_py.Client(options={'cpu_device_count': 1.5})", "TypeError"),
    "client-option-bool": ("pjrt_py.Client(options={'cpu_device_count': True})", "TypeError"),
    "client-option-list": ("pjrt_py.Client(options={'cpu_device_count': []})", "TypeError"),
    "client-option-negative": ("pjrt_py.Client(options={'cpu_device_count': -1})", "ValueError"),
    "client-option-int64": ("pjrt_py.Client(options={'x': 1 << 70})", "ValueError"),
    "client-options-not-dict": ("pjrt_py.Client(options=[('a', 1)])", "TypeError"),
    # programs the compiler or parser would crash on
    "recursive-main": (
        "client.compile('func.func @main() -> tensor<f32> {\\n"
        " %0 = call @main() : () -> tensor<f32>\\n return %0 : tensor<f32>\\n}')",
        "ValueError",
    ),
    "mutual-recursion": (
        "client.compile('func.func @main() -> tensor<f32> {\\n %0 = call @f() : () -> tensor<f32>"
        "\\n return %0 : tensor<f32>\\n}\\nfunc.func private @f() -> tensor<f32> {\\n"
        " %0 = call @main() : () -> tensor<f32>\\n return %0 : tensor<f32>\\n}')",
        "ValueError",
    ),
    "deep-nesting": (
        "client.compile('module attributes {a = ' + '[' * 30000 + ']' * 30000 + '} {}')",
        "ValueError",
    ),
    "element-count-overflow": (
        "client.compile('func.func @main() -> tensor<4294967296x4294967296x2xf32> {\\n"
        " %0 = stablehlo.constant dense<0.0> : tensor<4294967296x4294967296x2xf32>\\n"
        " return %0 : tensor<4294967296x4294967296x2xf32>\\n}')",
        "ValueError",
    ),
    "empty-program": ("client.compile('')", "ValueError"),
    "program-not-text": ("client.compile(42)", "TypeError"),
    "invalid-op": ("client.compile(ADD.replace('stablehlo.add', 'stablehlo.nope'))", "PjrtError"),
    "bytes-not-mlir": ("client.compile(b'\\x00garbage')", "PjrtError"),
    # compile options given as bytes or keywords
    "options-zero-replicas": ("client.compile(ADD, compile_options=b'\\x1a\\x00')", "ValueError"),
    "options-not-proto": ("client.compile(ADD, compile_options=b'\\xff\\xff')", "ValueError"),
    "options-unknown-device": (
        "client.compile(ADD, compile_options=pjrt_py.encode_compile_options("
        "device_assignment=[[99]]))",
        "ValueError",
    ),
    "options-too-many-replicas": ("client.compile(ADD, num_replicas=64)", "ValueError"),
    "options-zero-partitions": ("client.compile(ADD, num_partitions=0)", "ValueError"),
    "debug-option-unknown": ("client.compile(ADD, debug_options={'xla_nope': 1})", "ValueError"),
    "debug-option-type": (
        "client.compile(ADD, debug_options={'xla_cpu_enable_fast_math': 1})",
        "TypeError",
    ),
    # arguments
    "arg-count": ("client.compile(ADD).execute(np.ones(8, np.float32))", "TypeError"),
    "arg-dtype": (
        "client.compile(ADD).execute(np.ones(8, np.float64), np.ones(8, np.float32))",
        "TypeError",
    ),
    "arg-shape": (
        "client.compile(ADD).execute(np.ones(4, np.float32), np.ones(8, np.float32))",
        "TypeError",
    ),
    "arg-float-for-int": ("client.compile(INT).execute(2.5)", "TypeError"),
    "arg-float-for-bool": ("client.compile(BOOL).execute(0.5)", "TypeError"),
    "arg-int-overflow": ("client.compile(INT).execute(1 << 40)", "ScalarOverflowError"),
    "arg-int-overflows-float": ("client.compile(F32).execute(1 << 200)", "ScalarOverflowError"),
    "arg-unsupported-dtype": ("client.buffer(np.array(['a']))", "TypeError"),
    "arg-not-an-array": ("client.compile(INT).execute(object())", "TypeError"),
    "non-donatable-int": (
        "client.compile(ADD).execute(np.ones(8, np.float32), np.ones(8, np.float32),"
        " non_donatable=0)",
        "TypeError",
    ),
    # handles used after their end
    "buffer-after-delete": (
        "b = client.buffer(np.ones(8, np.float32)); b.delete(); b.to_numpy()",
        "ValueError",
    ),
    "client-after-close": (
        "c = pjrt_py.Client(); c.close(); c.buffer(np.ones(2))",
        "ValueError",
    ),
    "executable-after-delete": (
        "e = client.compile(ADD, cache=False); e.delete(); "
        "e.execute(np.ones(8, np.float32), np.ones(8, np.float32))",
        "ValueError",
    ),
    # DLPack, memory spaces, layouts (docs/interop.md)
    "dlpack-not-a-producer": ("client.from_dlpack([1, 2, 3])", "TypeError"),
    "dlpack-used-capsule": (
        "cap = np.ones(3).__dlpack__(); client.from_dlpack(cap); client.from_dlpack(cap)",
        "TypeError",
    ),
    "dlpack-copy-false-unaligned": (
        "a = pjrt_py.aligned_empty(65, np.float32)[1:]; client.from_dlpack(a, copy=False)",
        "BufferError",
    ),
    "dlpack-stream-on-cpu": ("client.buffer(np.ones(2)).__dlpack__(stream=1)", "BufferError"),
    "dlpack-float8-for-1-0": (
        "import ml_dtypes; client.buffer(np.ones(2, ml_dtypes.float8_e4m3fn))"
        ".__dlpack__(max_version=(1, 0))",
        "TypeError",
    ),
    "memory-unknown-kind": ("client.buffer(np.ones(2), memory='hbm')", "ValueError"),
    "memory-other-device": (
        "client.buffer(np.ones(2), client.addressable_devices[0], "
        "memory=client.addressable_devices[1].memory('device'))",
        "ValueError",
    ),
    "layout-mismatch": (
        "client.compile(COLUMN_MAJOR_IN).execute(np.ones((2, 3), np.float32))",
        "ValueError",
    ),
    # plugins
    "plugin-missing": ("pjrt_py.Client('/nonexistent/plugin.so')", "FileNotFoundError"),
    "plugin-not-a-library": ("pjrt_py.load_plugin(NOT_ELF)", "PluginLoadError"),
    # what one plugin build aborts on (programs/plugin_guards.py)
    "packed-layout-before-0-106": ("client.compile(PACKED_MOVED)", "ValueError"),
    # a compiler crash nothing could foresee: isolate=True turns it into an exception
    "compiler-crash-isolated": (
        "from pjrt_py.programs.compile_process import TEST_CRASH_MARKER as MARK\n"
        "client.compile('// ' + MARK.decode() + '\\n' + ADD, isolate=True, cache=False)",
        "CompilerCrashError",
    ),
    # flags and names that used to be taken for something else
    "isolate-not-bool": ("client.compile(ADD, isolate='false', cache=False)", "TypeError"),
    "ordered-not-bool": (
        "client.compile(ADD).execute_async(*[np.ones(8, np.float32)] * 2, ordered='yes')",
        "TypeError",
    ),
    "cache-dir-empty": ("pjrt_py.Client(cache_dir='')", "ValueError"),
    "serialized-raw-garbage": (
        "client.deserialize(b'garbage' * 10, raw=True)",
        "SerializationError",
    ),
    "serialized-envelope-as-raw": (
        "client.deserialize(client.compile(ADD).serialize(), raw=True)",
        "SerializationError",
    ),
    "dynamic-over-bound": (
        "client.compile('func.func @main(%x: tensor<?xf32, #stablehlo.bounds<4>>) -> "
        "tensor<?xf32, #stablehlo.bounds<4>> {\\n return %x : tensor<?xf32, "
        "#stablehlo.bounds<4>>\\n}').execute(np.ones(5, np.float32))",
        "ValueError",
    ),
    "dlpack-cuda-stream-zero": (
        "pjrt_py.interop.dlpack.consumer_stream(pjrt_py.interop.dlpack.CUDA, 0)",
        "BufferError",
    ),
}

SCRIPT = """
import json, os, sys, tempfile
import numpy as np
import pjrt_py
import pjrt_py.programs.compile_process
ADD = ADD_TEXT
INT = "func.func @main(%x: tensor<i32>) -> tensor<i32> {\\n return %x : tensor<i32>\\n}"
BOOL = "func.func @main(%x: tensor<i1>) -> tensor<i1> {\\n return %x : tensor<i1>\\n}"
F32 = "func.func @main(%x: tensor<f32>) -> tensor<f32> {\\n return %x : tensor<f32>\\n}"
COLUMN_MAJOR_IN = (
    'func.func @main(%x: tensor<2x3xf32> {mhlo.layout_mode = "{0,1}"}) -> tensor<2x3xf32> {\\n'
    " return %x : tensor<2x3xf32>\\n}"
)
PACKED_MOVED = (
    'func.func @main(%x: tensor<2x3xi4>) -> (tensor<2x3xi4> {mhlo.layout_mode = "{0,1}"}) {\\n'
    " return %x : tensor<2x3xi4>\\n}"
)
NOT_ELF = os.path.join(tempfile.mkdtemp(), "bogus.so")
open(NOT_ELF, "w").write("not an ELF file")
client = pjrt_py.Client()
cases = json.loads(sys.argv[1] if len(sys.argv) > 1 else CASES_JSON)
for name, code in cases.items():
    print("START", name, flush=True)
    try:
        exec(code)
        got = "no exception"
    except Exception as e:
        got = type(e).__name__
        assert str(e), f"{name}: {got} without a message"
    print("GOT", name, got, flush=True)
print("DONE")
"""


# Cases that need a capability not every plugin has (tests/conftest.py): on a
# plugin without it they are left out of the run.
NEEDS: dict[str, pytest.MarkDecorator] = {
    **{
        name: pytest.mark.needs_cpu_device_count  # pjrt_py checks the CPU option's type
        for name in CASES
        if CASES[name][0].startswith("pjrt_py.Client(options={'cpu_device_count'")
    },
    "dlpack-stream-on-cpu": pytest.mark.needs_host_buffers,  # a stream means nothing on the host
    "memory-other-device": pytest.mark.needs_devices(2),
}


# Cases of one plugin build's defect: left out from the PJRT version that has it no more.
ONLY_BEFORE: dict[str, tuple[int, int]] = {"packed-layout-before-0-106": PACKED_LAYOUTS_FROM}


def test_every_class_of_bad_input_gets_its_exception(client: pjrt_py.Client) -> None:
    left_out = {n for n, need in NEEDS.items() if capability_skip(client, need.mark) is not None}
    left_out |= {n for n, v in ONLY_BEFORE.items() if tuple(client.plugin.api_version) >= v}
    cases = {name: code for name, (code, _) in CASES.items() if name not in left_out}
    script = SCRIPT.replace("CASES_JSON", repr(json.dumps(cases)))
    script = script.replace("ADD_TEXT", repr(ADD_F32_8))
    prelude = "import os\nos.environ['PJRT_PY_ISOLATE_TEST_CRASH'] = 'segv'\n"
    result = run_python(prelude + script, timeout=600)
    reached = re.findall(r"^START (\S+)", result.stdout, re.M)
    assert result.returncode == 0 and "DONE" in result.stdout, (
        f"the process died in case {reached[-1] if reached else '?'}: "
        f"rc={result.returncode}\n{result.stderr[-3000:]}"
    )
    got = dict(re.findall(r"^GOT (\S+) (.+)$", result.stdout, re.M))
    wrong = {}
    for name, (_, expected) in CASES.items():
        if name in left_out:
            continue
        cls = getattr(pjrt_py, got[name], None) or getattr(builtins, got[name], None)
        want = getattr(pjrt_py, expected, None) or getattr(builtins, expected, None)
        ok = isinstance(cls, type) and isinstance(want, type) and issubclass(cls, want)
        if not ok:
            wrong[name] = (got[name], expected)
    assert not wrong, wrong


def test_the_reliability_table_lists_every_case() -> None:
    table = (ROOT / "docs" / "reliability.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M))
    assert listed == set(CASES), (sorted(set(CASES) - listed), sorted(listed - set(CASES)))
    for name, (_, expected) in CASES.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"`{expected}`" in row, (name, expected, row)


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_ids_are_readable(name: str) -> None:
    assert re.fullmatch(r"[a-z0-9-]+", name)
    assert textwrap.dedent(CASES[name][0]) == CASES[name][0]
