"""The native core's private entry points refuse what they would misread.

``pjrt_py._core`` is private, but it is reachable from Python, and a fuzz of
every function, type, method and property found calls that made the core or
the plugin read memory by the wrong size: a dtype table remapped after
import, metadata that was not a (shape, dtype) pair, an element type that
was not the data's, a staging ring whose size wrapped. Each case runs in a
child process and must end with the Python exception named, not a signal.
(Entry points that take raw PJRT addresses as ints, such as ``Loaded`` and
``kv_holder_free``, are as trusting as ctypes and are not covered here.)
"""

from __future__ import annotations

import pytest
from conftest import run_python

PRELUDE = """
import numpy as np, pjrt_py
from pjrt_py import _core
c = pjrt_py.Client()
"""

ONE_CALLBACK = """
pjrt_py.register_callback("cb", fn, client=c)
exe = c.compile('''
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = stablehlo.custom_call @cb(%x) {api_version = 4 : i32} : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}''')
exe.execute(np.ones(4, np.float32)).to_numpy()
"""

CASES = {
    # The tables pjrt_py sets at import do not change: a float32 remapped to
    # F64 read twice an array's bytes, to float16 viewed a producer's memory
    # as twice its size, and an object dtype read float bits as pointers.
    "set_dtypes-again": (
        "_core.set_dtypes([(np.dtype(np.float64), 11), (np.dtype(np.float32), 12)])",
        "RuntimeError: set_dtypes: the table set at import cannot change",
    ),
    "set_dlpack_codes-again": (
        "_core.set_dlpack_codes([(11, 2, 16)])",
        "RuntimeError: set_dlpack_codes: the table set at import cannot change",
    ),
    "host_callback_setup-again": (
        "_core.host_callback_setup({11: np.dtype(np.float64)}, {}, lambda n, e: 'x')",
        "RuntimeError: host_callback_setup: the dtypes set cannot change",
    ),
    # Metadata is an exact (tuple of ints, plain dtype) pair; an object that
    # hashed and compared like one was interned and then read as one.
    "intern_meta-impostor": (
        "class Evil:\n"
        "    def __hash__(self): return hash(np.dtype(np.float32))\n"
        "    def __eq__(self, other): return True\n"
        "_core.intern_meta(((4,), Evil()))",
        "ValueError: not a buffer's metadata",
    ),
    "intern_meta-object-dtype": (
        "_core.intern_meta(((4,), np.dtype(object)))",
        "ValueError: not a buffer's metadata",
    ),
    "from_host-meta-not-a-pair": (
        "c._from_host(np.arange(4, dtype=np.float32), 11, 0, c.default_device._addr, 5, 0)",
        "ValueError: not a buffer's metadata",
    ),
    "from_host-type-wider-than-data": (
        "m = ((1 << 20,), np.dtype(np.float64))\n"
        "c._from_host(np.zeros(1 << 20, np.uint8), 12, 0, c.default_device._addr, m, 0)",
        "ValueError: not a buffer's metadata",
    ),
    "from_host-type-out-of-range": (
        "m = ((4,), np.dtype(np.float32))\n"
        "c._from_host(np.zeros(4, np.float32), 63, 0, c.default_device._addr, m, 0)",
        "ValueError: not a buffer's metadata",
    ),
    "view-type-wider-than-tensor": (
        "src = pjrt_py.aligned_empty((1 << 20,), np.uint8)\n"
        "t = _core.dlpack_unpack(src.__dlpack__())\n"
        "c._view(t, 12, c.default_device._addr, ((1 << 20,), np.dtype(np.float64)))",
        "ValueError: _view: the tensor's elements are not of the type's size",
    ),
    "as_array-object-dtype": (
        "t = _core.dlpack_unpack(np.arange(4.0).__dlpack__())\nt.as_array(np.dtype(object))",
        "ValueError: as_array: the dtype is not the tensor's element size",
    ),
    "as_array-wider-dtype": (
        "t = _core.dlpack_unpack(np.arange(4, dtype=np.uint8).__dlpack__())\n"
        "t.as_array(np.dtype(np.float64))",
        "ValueError: as_array: the dtype is not the tensor's element size",
    ),
    "dlpack-export-wider-bits": (
        "b = c.buffer(np.zeros(1 << 20, np.uint8))\nb._dlpack(5, 128, 1, 0, False, 0)",
        "ValueError: _dlpack: bits is not the size",
    ),
    # chunk_bytes x slots wrapped size_t into a 64 KiB ring the copies overran.
    "staging-ring-size-wraps": (
        "_core.staging_configure(c, 2, 1, 2**60 + 4096, 16, 1.0)",
        "ValueError: staging_configure: settings out of range",
    ),
    "exit_sequence-nan": (
        "_core.exit_sequence(float('nan'))",
        "ValueError: exit_sequence: timeout must be seconds >= 0",
    ),
    "host_callback_setup-object-dtype": (
        "_core.host_callback_setup({11: np.dtype(object)}, {}, lambda n, e: 'x')",
        "ValueError: host_callback_setup: bad dtype entry",
    ),
    # From a callback it waited for its own callback to end: forever.
    "exit_sequence-in-a-callback": (
        "def fn(x):\n    _core.exit_sequence(1.0)\n    return x\n" + ONE_CALLBACK,
        "exit_sequence: not from inside a callback",
    ),
    "closed_reason-not-a-str": (
        "c.close()\nc._closed_reason(12345)",
        "TypeError: _closed_reason takes a str or None",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_private_entry_point_refuses_what_it_would_misread(case: str) -> None:
    code, says = CASES[case]
    result = run_python(
        PRELUDE
        + "try:\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + "except BaseException as e:\n"
        + "    print(f'{type(e).__name__}: {e}')\n"
        + "else:\n"
        + "    print('accepted')\n"
        + "x = np.arange(8, dtype=np.float32)\n"
        + "assert (c.buffer(x).to_numpy() == x).all() if not c.closed else True\n"
        + "print('still works')\n",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert says in result.stdout, result.stdout
    assert "still works" in result.stdout


def test_the_tables_set_at_import_take_the_same_table_again() -> None:
    # pjrt_py imported anew (its modules dropped from sys.modules, or one
    # reloaded) sets the same tables again: that must work, as it did.
    result = run_python(
        """
        import importlib, sys
        import numpy as np
        import pjrt_py
        for name in [m for m in sys.modules if m == "pjrt_py" or m.startswith("pjrt_py.")]:
            if name != "pjrt_py._core":
                del sys.modules[name]
        import pjrt_py
        from pjrt_py.runtime import dtypes
        from pjrt_py.interop import dlpack
        from pjrt_py.callbacks import host_callback
        for module in (dtypes, dlpack, host_callback):
            importlib.reload(module)
        from pjrt_py import _core
        try:
            _core.set_dtypes([(np.dtype(np.float64), 11)])  # a change is still refused
        except RuntimeError as e:
            print("refused:", e)
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused: set_dtypes: the table set at import cannot change" in result.stdout
    assert "ok" in result.stdout


def test_an_exit_timeout_of_inf_still_waits_for_running_work() -> None:
    # exit_sequence refused inf for a while, and the atexit hook then skipped
    # the exit's wait entirely.
    result = run_python(
        """
        import os
        os.environ["PJRT_PY_EXIT_TIMEOUT"] = "inf"
        from pjrt_py import _core
        print("left", _core.exit_sequence(float("inf")))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "left 0" in result.stdout
