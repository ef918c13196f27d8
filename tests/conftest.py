"""Shared fixtures: one real plugin client per session (``$PJRT_PLUGIN``, else
the CPU plugin), small programs, and capability skips.

A test that needs something not every plugin has (several devices, a memory
kind, host-readable buffers, zero-copy host buffers, host callbacks, the CPU
plugin's ``cpu_device_count`` option) says so with a marker, and is skipped
with a reason naming the capability and what the plugin has. Capabilities are
read from the client, never from the platform name::

    @pytest.mark.needs_devices(4)
    @pytest.mark.needs_memory_kinds("pinned_host")
    @pytest.mark.needs_host_buffers
    @pytest.mark.needs_zero_copy
    @pytest.mark.needs_host_callbacks
    @pytest.mark.needs_cpu_device_count
    @pytest.mark.needs_fork_children
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import pjrt_py

ADD_F32_8 = """
func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %y : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""

# A data-dependent loop: XLA cannot shorten it. Counts to %n.
COUNT_LOOP = """
func.func @main(%n: tensor<i64>) -> tensor<i64> {
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %one = stablehlo.constant dense<1> : tensor<i64>
  %r:2 = stablehlo.while(%i = %zero, %acc = %zero) : tensor<i64>, tensor<i64>
    cond {
      %c = stablehlo.compare LT, %i, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
    } do {
      %i1 = stablehlo.add %i, %one : tensor<i64>
      %a1 = stablehlo.add %acc, %i : tensor<i64>
      stablehlo.return %i1, %a1 : tensor<i64>, tensor<i64>
    }
  return %r#1 : tensor<i64>
}
"""


def matmul_chain(n: int, steps: int, tail: str = "") -> str:
    """x -> tanh(x @ x) repeated: dense work the CPU plugin runs asynchronously;
    then, if ``tail`` names one, a custom call (a host callback) on the result.
    The products ask for full float32 (HIGHEST): a GPU plugin's default is
    TF32, whose results differ from numpy's by more than the tests allow."""
    t = f"tensor<{n}x{n}xf32>"
    lines = [f"func.func @main(%x0: {t}) -> {t} {{"]
    for i in range(steps):
        lines.append(
            f"  %d{i} = stablehlo.dot_general %x{i}, %x{i}, contracting_dims = [1] x [0],"
            f" precision = [HIGHEST, HIGHEST] : ({t}, {t}) -> {t}"
        )
        lines.append(f"  %x{i + 1} = stablehlo.tanh %d{i} : {t}")
    result = f"%x{steps}"
    if tail:
        lines.append(
            f"  %y = stablehlo.custom_call @{tail}({result}) {{api_version = 4 : i32}}"
            f" : ({t}) -> {t}"
        )
        result = "%y"
    lines.append(f"  return {result} : {t}")
    lines.append("}")
    return "\n".join(lines)


# Dense work repeated %n times, %n given at run time (a data-dependent loop).
MATMUL_LOOP = """
func.func @main(%x: tensor<256x256xf32>, %n: tensor<i64>) -> tensor<256x256xf32> {
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %one = stablehlo.constant dense<1> : tensor<i64>
  %r:2 = stablehlo.while(%i = %zero, %y = %x) : tensor<i64>, tensor<256x256xf32>
    cond {
      %c = stablehlo.compare LT, %i, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
    } do {
      %d = stablehlo.dot_general %y, %y, contracting_dims = [1] x [0]
        : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
      %t = stablehlo.tanh %d : tensor<256x256xf32>
      %i1 = stablehlo.add %i, %one : tensor<i64>
      stablehlo.return %i1, %t : tensor<i64>, tensor<256x256xf32>
    }
  return %r#1 : tensor<256x256xf32>
}
"""


@functools.cache
def slow_loop_count(client: pjrt_py.Client, seconds: float = 0.1) -> int:
    """How many turns of ``MATMUL_LOOP`` run for about ``seconds`` on this plugin.

    "Slow enough" is measured, not assumed: work that takes tens of ms on a
    CPU ends in microseconds on a GPU. Calibrated on the client (one run of a
    few iterations, then one of the estimate). A child process of the same
    plugin runs ``SLOW_LOOP_CHILD`` with the count."""
    import time  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    exe = client.compile(MATMUL_LOOP)
    x = client.buffer(np.eye(256, dtype=np.float32) * 0.5)
    n = 4
    for _ in range(3):
        start = time.perf_counter()
        exe.execute(x, np.int64(n)).block_until_ready()
        took = time.perf_counter() - start
        if took >= seconds:
            break
        n = min(int(n * seconds / max(took, 1e-6) * 1.2) + 1, 1 << 30)
    return n


@functools.cache
def slow_work(client: pjrt_py.Client, seconds: float = 0.1) -> Callable[[], pjrt_py.BufferPromise]:
    """A dispatch of dense work that runs for about ``seconds`` on this plugin."""
    import numpy as np  # noqa: PLC0415

    exe = client.compile(MATMUL_LOOP)
    x = client.buffer(np.eye(256, dtype=np.float32) * 0.5)
    count = np.int64(slow_loop_count(client, seconds))
    return lambda: exe.execute_async(x, count)


DOUBLE_256 = """
func.func @main(%x: tensor<256x256xf32>{donor}) -> tensor<256x256xf32> {{
  %0 = stablehlo.add %x, %x : tensor<256x256xf32>
  return %0 : tensor<256x256xf32>
}}
"""


@functools.cache
def doubling(client: pjrt_py.Client, donate: bool = False) -> pjrt_py.Executable:
    """x + x on a 256x256 f32 (slow_work's result), donating x if asked."""
    return client.compile(DOUBLE_256.format(donor=" {tf.aliasing_output = 0 : i32}" * donate))


def queued_work(
    client: pjrt_py.Client, seconds: float = 0.3
) -> tuple[pjrt_py.BufferPromise, pjrt_py.BufferPromise]:
    """(running, queued): about ``seconds`` of work, and an execution queued
    behind it. XLA's CPU client gives a queued execution's output its memory
    only when it starts, and some PJRT calls on such a buffer wait for that."""
    running = slow_work(client, seconds)()
    return running, doubling(client).execute_async(running)


def lets_threads_run(call: Callable[[], object], running: pjrt_py.BufferPromise) -> object:
    """Runs ``call`` on another thread and checks this one ran while ``running``
    (work ``call`` may wait for) had not finished: the wait let go of the GIL.
    Returns what ``call`` returned, or raises what it raised."""
    entering = threading.Event()
    got: list[object] = []
    failed: list[BaseException] = []

    def run() -> None:
        entering.set()
        try:
            got.append(call())
        except BaseException as e:  # raised on the caller's thread below
            failed.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    entering.wait()
    time.sleep(0.05)  # the call has begun (or, rarely, is about to)
    assert not running.is_ready(), "the call held the GIL while it waited for the work"
    thread.join()
    if failed:
        raise failed[0]
    return got[0]


def slow_loop_child(client: pjrt_py.Client, seconds: float, name: str = "slow") -> str:
    """Code for a child process: ``{name}()`` dispatches about ``seconds`` of work
    (a promise of a 256x256 f32 result) on a client ``c`` the child made."""
    count = slow_loop_count(client, seconds)
    return (
        f"_slow_exe = c.compile({MATMUL_LOOP!r})\n"
        "_slow_x = c.buffer(np.eye(256, dtype=np.float32) * 0.5)\n"
        f"def {name}():\n"
        f"    return _slow_exe.execute_async(_slow_x, np.int64({count}))\n"
    )


def child_code(*parts: str) -> str:
    """Code for a child process from parts at any indentation, each dedented:
    generated lines (``slow_loop_child``) between two literal blocks."""
    return "".join(textwrap.dedent(part) for part in parts)


@functools.cache
def session_client() -> pjrt_py.Client:
    """The client of the plugin under test: ``$PJRT_PLUGIN``, else the CPU plugin.

    Four devices are asked for where the plugin takes ``cpu_device_count``
    (the CPU plugin's default too); another plugin has the devices it has.
    """
    return new_client()


def new_client() -> pjrt_py.Client:
    """A new client made as the session's is (the caller closes it)."""
    if os.environ.get(AS_ONE_DEVICE):
        return pjrt_py.Client(options={"cpu_device_count": 1})
    if accepts_cpu_device_count():
        return pjrt_py.Client(options={"cpu_device_count": 4})
    return pjrt_py.Client()


# Test-only: ``PJRT_PY_TEST_AS_ONE_DEVICE=1`` runs the suite on a CPU build as
# if its plugin were a one-device GPU plugin in the ways a CPU can show: the
# session client has one device, and the cpu_device_count option counts as
# refused. It finds tests that assume four devices or that option without
# saying so (issue 24's GPU tier); memory kinds and host views it cannot fake.
AS_ONE_DEVICE = "PJRT_PY_TEST_AS_ONE_DEVICE"


@pytest.fixture(scope="session")
def client() -> pjrt_py.Client:
    return session_client()


# -- capabilities -----------------------------------------------------------------
# Each is read from a client of the plugin under test; the skip says what the
# test needs and what the plugin has ("needs 4 addressable devices; the cuda
# plugin has 1").


def _plugin(client: pjrt_py.Client) -> str:
    return f"the {client.platform_name} plugin"


@functools.cache
def accepts_cpu_device_count() -> bool:
    """Whether the plugin under test takes the ``cpu_device_count`` create option.

    Measured: a client asked for 3 devices has 3 (a plugin that refuses the
    option, as a GPU plugin does, or ignores it, does not)."""
    if os.environ.get(AS_ONE_DEVICE):
        return False
    try:
        probe = pjrt_py.Client(options={"cpu_device_count": 3}, cache_dir=False)
    except Exception:  # the plugin refuses an option it does not know
        return False
    try:
        return len(probe.addressable_devices) == 3
    finally:
        probe.close()


def memory_kinds(client: pjrt_py.Client) -> list[str]:
    """The memory kinds of the client's default device ([] if the plugin cannot say)."""
    try:
        return [m.kind for m in client.default_device.memories]
    except pjrt_py.PjrtError:  # UnsupportedError from an older plugin, and the like
        return []


def host_readable(client: pjrt_py.Client, memory: str | None = None) -> bool:
    """Whether a buffer (in ``memory``, else the default) is host memory numpy reads in
    place: its DLPack device is the CPU (kDLCPU)."""
    import numpy as np  # noqa: PLC0415

    buf = client.buffer(np.zeros(1, np.float32), memory=memory)
    try:
        return bool(buf.__dlpack_device__()[0] == 1)
    finally:
        buf.delete()


@functools.cache
def _zero_copy(client: pjrt_py.Client) -> str | None:
    """Why the plugin cannot alias a host array with ``zero_copy=True`` (None: it can)."""
    import numpy as np  # noqa: PLC0415

    host = pjrt_py.aligned_empty(16, np.float32)
    try:
        buf = client.buffer(host, zero_copy=True)
    except ValueError as e:
        return str(e)
    try:
        if buf.unsafe_pointer() != host.ctypes.data:
            return "the buffer does not alias the array"
        return None
    finally:
        buf.delete()


@functools.cache
def _host_callbacks(client: pjrt_py.Client) -> str | None:
    """Why the plugin cannot run Python host callbacks (None: it can)."""
    from pjrt_py.callbacks.host_callback import register_callback  # noqa: PLC0415

    try:
        register_callback("pjrt_py_tests_capability_probe", lambda: None, client=client)
    except pjrt_py.UnsupportedError as e:
        return str(e)
    return None


FORK_PROBE = """
import os, numpy as np, pjrt_py
ADD = {add!r}
x = np.ones(8, np.float32)
c = pjrt_py.Client()
c.compile(ADD).execute(x, x).to_numpy()
pid = os.fork()
if pid == 0:
    try:
        child = pjrt_py.Client()
        ok = (child.compile(ADD).execute(x, x).to_numpy() == 2).all()
        os._exit(0 if ok else 3)
    except BaseException as e:
        print(type(e).__name__, e, flush=True)
        os._exit(4)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@functools.cache
def _fork_children() -> str | None:
    """Why a child forked after the parent used the plugin cannot use it (None: it can).

    Measured in a fresh interpreter: the CPU builds give the child a new
    instance of the plugin; CUDA's driver refuses a child forked after it was
    initialized."""
    result = run_python(FORK_PROBE.format(add=ADD_F32_8), timeout=120)
    if result.returncode == 0 and "child 0" in result.stdout:
        return None
    return (result.stdout.strip() or result.stderr.strip() or "no answer").splitlines()[-1]


def capability_skip(client: pjrt_py.Client, marker: pytest.Mark) -> str | None:
    """The reason to skip a test marked ``marker`` on ``client``'s plugin, or None."""
    name = marker.name
    if name == "needs_devices":
        want = int(marker.args[0])
        have = len(client.addressable_devices)
        if have < want:
            return f"needs {want} addressable devices; {_plugin(client)} has {have}"
    elif name == "needs_memory_kinds":
        kinds = memory_kinds(client)
        missing = [k for k in marker.args if k not in kinds]
        if missing:
            return (
                f"needs memory kind(s) {missing}; {_plugin(client)} has {kinds or 'none reported'}"
            )
    elif name == "needs_host_buffers":
        memory = marker.kwargs.get("memory")
        if memory is not None and memory not in memory_kinds(client):
            return f"needs memory kind {memory!r}; {_plugin(client)} has {memory_kinds(client)}"
        if not host_readable(client, memory):
            where = f"{memory!r} buffers" if memory else "buffers in the default memory"
            return (
                f"needs host-readable buffers (DLPack on the CPU); "
                f"{_plugin(client)}'s {where} are not"
            )
    elif name == "needs_zero_copy":
        why = _zero_copy(client)
        if why is not None:
            return f"needs zero-copy host buffers; {_plugin(client)}: {why}"
    elif name == "needs_host_callbacks":
        why = _host_callbacks(client)
        if why is not None:
            return f"needs Python host callbacks; {_plugin(client)}: {why}"
    elif name == "needs_fork_children":
        why = _fork_children()
        if why is not None:
            return f"needs a plugin that works in a forked child; {_plugin(client)}: {why}"
    elif name == "needs_cpu_device_count" and not accepts_cpu_device_count():
        return f"needs the cpu_device_count client option; {_plugin(client)} does not take it"
    elif name == "needs_torch" and not _has_torch():
        return 'needs torch, which is not installed (pip install -e ".[torch]")'
    return None


@functools.cache
def _has_torch() -> bool:
    try:
        import torch  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def gpu_client_or_skip() -> pjrt_py.Client:
    """A new client of an installed GPU plugin, or a skip saying none is there."""
    gpus = [p for p in pjrt_py.plugins() if p.name in ("cuda", "rocm")]
    if not gpus:
        pytest.skip("needs a PJRT plugin with GPU devices (none installed)")
    try:
        return pjrt_py.Client(gpus[0].path)
    except pjrt_py.PjrtError as e:
        pytest.skip(f"needs a GPU device: the {gpus[0].name} plugin found none ({e})")


def needs_memory_kinds(client: pjrt_py.Client, *kinds: str) -> None:
    """Skip unless the client's devices have memories of ``kinds`` (for parametrized kinds)."""
    reason = capability_skip(client, pytest.mark.needs_memory_kinds(*kinds).mark)
    if reason is not None:
        pytest.skip(reason)


CAPABILITY_MARKERS = {
    "needs_devices(n)": "needs n addressable devices",
    "needs_memory_kinds(*kinds)": "needs devices with memories of these kinds",
    "needs_host_buffers(memory=None)": "needs buffers numpy reads in place (DLPack on the CPU)",
    "needs_zero_copy": "needs client.buffer(..., zero_copy=True) to alias host arrays",
    "needs_host_callbacks": "needs Python host callbacks (register_callback)",
    "needs_cpu_device_count": "needs a plugin that takes the cpu_device_count create option",
    "needs_fork_children": "needs a plugin a child forked after the parent used it can use",
    "needs_torch": "needs torch (the torch extra; the test extra does not install it)",
}


def pytest_configure(config: pytest.Config) -> None:
    for signature, meaning in CAPABILITY_MARKERS.items():
        config.addinivalue_line("markers", f"{signature}: {meaning} (skipped with a reason)")
    # A shell that starts the suite in the background (`pytest &`, nohup)
    # makes it ignore SIGINT, and every child inherits that: Python then
    # installs no KeyboardInterrupt handler, and the tests of Ctrl-C (real
    # signals, and interrupts passed on from plugin threads) see none. With
    # a handler here, exec gives each child the default action back.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # A GPU plugin computes float32 products in TF32 unless the program asks
    # for HIGHEST, as jax does on such a GPU: results differ from numpy's by
    # more than the tests' float32 tolerances. Programs jax lowers for the
    # tests (and their children) ask for full float32 there; hand-written
    # ones say so themselves (matmul_chain). CPU plugins compute float32 in
    # full either way, so their runs are left as they are.
    if not _plugin_under_test_is_cpu():
        os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


def _plugin_under_test_is_cpu() -> bool:
    from pjrt_py.runtime.discovery import find_plugin

    try:
        path = os.path.realpath(find_plugin())
    except FileNotFoundError:
        return True  # no plugin: the tests say so themselves
    return any(
        info.name == "cpu" and os.path.realpath(info.path) == path for info in pjrt_py.plugins()
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    marks = [m for m in item.iter_markers() if m.name in _CAPABILITY_NAMES]
    if not marks:
        return
    client = session_client()
    for mark in marks:
        reason = capability_skip(client, mark)
        if reason is not None:
            pytest.skip(reason)


_CAPABILITY_NAMES = {s.split("(")[0] for s in CAPABILITY_MARKERS}


@pytest.fixture(scope="session")
def add_exe(client: pjrt_py.Client) -> pjrt_py.Executable:
    return client.compile(ADD_F32_8)


def installed_build(distribution: str) -> str | None:
    """The library of an installed plugin distribution (e.g. ``xla-cpu-pjrt``), if any."""
    found = [p.path for p in pjrt_py.plugins() if p.distribution == distribution]
    return found[0] if found else None


def needs_build(distribution: str) -> pytest.MarkDecorator:
    """Skip unless that plugin distribution is installed (the test extra has all three)."""
    return pytest.mark.skipif(
        installed_build(distribution) is None,
        reason=f"the {distribution} plugin (in the test extra) is not installed",
    )


def other_build() -> str:
    """A CPU build other than the one ``Client()`` loads (the plugin matrix changes that)."""
    mine = pjrt_py.runtime.discovery.find_plugin()
    others = [p.path for p in pjrt_py.plugins() if p.name == "cpu" and p.path != mine]
    if not others:
        pytest.skip("only one CPU plugin build is installed (the test extra has three)")
    return others[0]


def newer_plugin() -> str | None:
    """The PJRT 0.115 CPU plugin (lammps-jax-pjrt-cpu, in the test extra), if installed."""
    newer = [p.path for p in pjrt_py.plugins() if p.path.endswith("pjrt_c_api_cpu_plugin.so")]
    return newer[0] if newer else None


NEEDS_NEWER_PLUGIN = pytest.mark.skipif(
    newer_plugin() is None,
    reason="lammps-jax-pjrt-cpu (a PJRT 0.115 plugin, in the test extra) is not installed",
)


def in_threads(fn: Callable[[int], object], count: int, timeout: float = 60) -> list[BaseException]:
    """Run ``fn(0)`` ... ``fn(count - 1)`` on as many threads at once; what they raised."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            fn(k)
        except BaseException as e:  # handed to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return errors


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on just now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter (for exits, aborts and crashes).

    A child still running after ``timeout`` seconds gets SIGABRT first, so
    that faulthandler prints where every thread is, then SIGKILL; the
    AssertionError then says what the child wrote.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)
        try:
            out, err = child.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
        raise AssertionError(
            f"the child ran past {timeout} s; its stdout:\n{out[-3000:]}\n"
            f"its stderr (faulthandler's report of every thread last):\n{err[-6000:]}"
        ) from None
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


# A plugin that forwards to a real one: GetPjrtApi hands out a copy of the
# real plugin's PJRT_Api (as `api`), changed by the statements in EDIT.
FORWARDING_PLUGIN = """
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "pjrt_c_api.h"

static PJRT_Api api;
DECLARATIONS

const PJRT_Api* GetPjrtApi(void) {
  void* h = dlopen(REAL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  if (!h) return NULL;
  const PJRT_Api* (*get)(void) = (const PJRT_Api* (*)(void))dlsym(h, "GetPjrtApi");
  const PJRT_Api* real = get();
  memcpy(&api, real, sizeof(api));
  EDIT
  return &api;
}
"""


def forwarding_plugin(
    tmp_path: Path, name: str, real: str, edit: str, declarations: str = ""
) -> Path:
    """Build a plugin that is `real` (a plugin's path) but for `edit`: C
    statements run on `api`, the copy of its PJRT_Api it hands out (`real`
    points at the original). `declarations` go before GetPjrtApi. Nothing
    is mocked: every function not replaced is the real plugin's."""
    source = (
        FORWARDING_PLUGIN.replace("REAL_PLUGIN", json.dumps(real))
        .replace("DECLARATIONS", declarations)
        .replace("EDIT", edit)
    )
    return build_so(tmp_path, name, source, include_header=True)


def build_so(tmp_path: Path, name: str, source: str, include_header: bool = False) -> Path:
    """Compile a small C file into a shared library for plugin-loading tests."""
    src = tmp_path / f"{name}.c"
    src.write_text(textwrap.dedent(source))
    so = tmp_path / f"{name}.so"
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:  # a GPU machine may have none
        pytest.skip(f"needs a C compiler ({compiler}) to build a test library")
    cmd = [compiler, "-shared", "-fPIC", str(src), "-o", str(so)]
    if include_header:
        from benchmarks._common import header_dir  # noqa: PLC0415

        try:
            cmd.insert(1, f"-I{header_dir()}")
        except FileNotFoundError as e:  # a GPU machine has no CPU plugin's wheel
            pytest.skip(f"needs pjrt_c_api.h to build a test plugin: {e}")
    subprocess.run(cmd, check=True)
    return so
