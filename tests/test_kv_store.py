"""Key-value store callbacks (issue 15): the callbacks pjrt_py installs at
client creation, driven as a plugin drives them (a C shim replaying the
topology exchange from native threads), over the in-memory store and over
jaxlib's coordination service in two processes; and the refusal of
multi-process CPU clients on every build."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import build_so, free_port, installed_build, run_python

import pjrt_py
from pjrt_py import _core
from pjrt_py.distributed import stores
from pjrt_py.runtime import kv_store
from pjrt_py.runtime.discovery import BUILDS

# A stand-in for a plugin: what a PJRT client does with the three callbacks
# while it is created (XLA's topology exchange), on a thread of its own.
SHIM = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pjrt_c_api.h"

typedef struct { PJRT_Error_Code code; char text[512]; } shim_error;

static PJRT_Error* make_error(PJRT_Error_Code code, const char* message, size_t size) {
  shim_error* e = (shim_error*)calloc(1, sizeof(*e));
  e->code = code;
  if (size > sizeof(e->text) - 1) size = sizeof(e->text) - 1;
  memcpy(e->text, message, size);
  return (PJRT_Error*)e;
}
static PJRT_CallbackError make = make_error;

typedef struct {
  PJRT_KeyValueGetCallback get;
  PJRT_KeyValueTryGetCallback try_get;
  PJRT_KeyValuePutCallback put;
  void* arg;
  int nodes, node;
  char report[8192];
} job;

static int code_of(PJRT_Error* error) {
  if (error == NULL) return 0;
  int code = ((shim_error*)error)->code;
  free(error);
  return code;
}

static int put(job* j, const char* key, size_t key_size, const char* value, size_t size) {
  PJRT_KeyValuePutCallback_Args a;
  memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.key = key; a.key_size = key_size; a.value = value; a.value_size = size;
  a.callback_error = &make; a.user_arg = j->arg;
  return code_of(j->put(&a));
}

static int get(job* j, const char* key, size_t key_size, int timeout, char* out, size_t* size) {
  PJRT_KeyValueGetCallback_Args a;
  memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.key = key; a.key_size = key_size; a.timeout_in_ms = timeout;
  a.callback_error = &make; a.user_arg = j->arg;
  int code = code_of(j->get(&a));
  if (code == 0) {
    memcpy(out, a.value, a.value_size);
    *size = a.value_size;
    a.value_deleter_callback(a.value);
  }
  return code;
}

static int try_get(job* j, const char* key, size_t key_size) {
  PJRT_KeyValueTryGetCallback_Args a;
  memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.key = key; a.key_size = key_size;
  a.callback_error = &make; a.user_arg = j->arg;
  int code = code_of(j->try_get(&a));
  if (code == 0) a.value_deleter_callback(a.value);
  return code;
}

static void hex(char* out, const char* data, size_t size) {
  for (size_t i = 0; i < size; ++i) sprintf(out + 2 * i, "%02x", (unsigned char)data[i]);
}

static void* run(void* p) {
  job* j = (job*)p;
  char key[64], value[4] = {(char)j->node, 0, (char)0xff, '['};
  char all[1024], got[64], text[2048];
  size_t size = 0, total = 0;
  int n = snprintf(key, sizeof(key), "local_topology/cpu [%d]", j->node);
  int put_code = put(j, key, (size_t)n, value, sizeof(value));
  int get_code = 0;
  const char global_key[] = "global_topology/cpu";
  if (j->node == 0) {
    for (int i = 0; i < j->nodes && get_code == 0; ++i) {
      int m = snprintf(key, sizeof(key), "local_topology/cpu [%d]", i);
      get_code = get(j, key, (size_t)m, 20000, got, &size);
      memcpy(all + total, got, size);
      total += size;
    }
    if (get_code == 0) get_code = put(j, global_key, sizeof(global_key) - 1, all, total);
  } else {
    get_code = get(j, global_key, sizeof(global_key) - 1, 20000, all, &total);
  }
  hex(text, all, total);
  int missing_try = try_get(j, "no such key", 11);
  int missing_get = get(j, "no such key", 11, 50, got, &size);
  int again = put(j, key, (size_t)n, value, sizeof(value));
  snprintf(j->report, sizeof(j->report),
           "put=%d get=%d global=%s try_get_missing=%d get_missing=%d put_again=%d", put_code,
           get_code, get_code == 0 ? text : "-", missing_try, missing_get, again);
  return NULL;
}

/* One node's exchange, on a native thread; its report in `out`. */
int replay(void* get_cb, void* try_get_cb, void* put_cb, void* arg, int nodes, int node,
           char* out, size_t out_size) {
  job* j = (job*)calloc(1, sizeof(job));
  j->get = (PJRT_KeyValueGetCallback)get_cb;
  j->try_get = (PJRT_KeyValueTryGetCallback)try_get_cb;
  j->put = (PJRT_KeyValuePutCallback)put_cb;
  j->arg = arg; j->nodes = nodes; j->node = node;
  pthread_t thread;
  if (pthread_create(&thread, NULL, run, j) != 0) return -1;
  pthread_join(thread, NULL);
  snprintf(out, out_size, "%s", j->report);
  free(j);
  return 0;
}
"""

EXPECTED_CODES = "try_get_missing=5 get_missing=4 put_again=6"


def global_topology(nodes: int) -> str:
    return "".join(f"{i:02x}00ff5b" for i in range(nodes))


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_so(tmp_path_factory.mktemp("shim"), "kv_shim", SHIM, include_header=True)


def replay(library: Path, store: Any, nodes: int, node: int) -> str:
    lib = ctypes.CDLL(str(library))
    lib.replay.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int]
    lib.replay.argtypes += [ctypes.c_char_p, ctypes.c_size_t]
    holder = _core.kv_holder_new(store)
    out = ctypes.create_string_buffer(8192)
    try:
        assert lib.replay(*_core.kv_callbacks(), holder, nodes, node, out, len(out)) == 0
    finally:
        _core.kv_holder_free(holder)
    return out.value.decode()


def test_the_topology_exchange_through_the_callbacks_from_native_threads(shim: Path) -> None:
    store = stores.InMemoryStore()
    nodes = 4
    reports: dict[int, str] = {}
    before = kv_store.calls()
    threads = [
        threading.Thread(target=lambda i=i: reports.__setitem__(i, replay(shim, store, nodes, i)))
        for i in range(nodes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    want = f"put=0 get=0 global={global_topology(nodes)} {EXPECTED_CODES}"
    assert [reports[i] for i in range(nodes)] == [want] * nodes
    assert b"local_topology/cpu [3]" in set(store.keys())  # keys with spaces and brackets
    assert store.try_get(b"local_topology/cpu [2]") == b"\x02\x00\xff["  # binary values
    assert kv_store.calls() - before >= nodes * 5


class Faulty:
    """A store whose every call raises what it is told."""

    def __init__(self, error: BaseException | None, value: Any = b"v") -> None:
        self.error, self.value = error, value

    def get(self, key: bytes, timeout_ms: int) -> Any:
        if self.error is not None:
            raise self.error
        return self.value

    try_get = lambda self, key: self.get(key, 0)  # noqa: E731

    def put(self, key: bytes, value: bytes) -> None:
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (KeyError("k"), 5),
        (TimeoutError(), 4),
        (FileExistsError(), 6),
        (pjrt_py.NotFoundError("x"), 5),
        (pjrt_py.PermissionDeniedError("x"), 7),
        (RuntimeError("other"), 2),
        (KeyboardInterrupt(), 1),
    ],
)
def test_store_exceptions_become_the_codes_the_plugin_reads(
    error: BaseException, code: int
) -> None:
    assert kv_store._dispatch(Faulty(error), 0, b"key", 10) == (
        code,
        f"key-value store get(b'key') raised {type(error).__name__}: {error}",
        isinstance(error, KeyboardInterrupt),
    )


def test_values_must_be_bytes_like() -> None:
    assert kv_store._dispatch(Faulty(None, bytearray(b"ab")), 1, b"k", 0) == (0, b"ab", False)
    code, text, _ = kv_store._dispatch(Faulty(None, "text"), 1, b"k", 0)
    assert code == 2 and "TypeError" in text


@pytest.mark.parametrize("code", [0, -3, 17, 999, True])
def test_a_pjrt_error_with_no_failure_code_is_unknown(code: int) -> None:
    # Code 0 is OK: passed on, a failed put would read as a success.
    got, text, _ = kv_store._dispatch(Faulty(pjrt_py.PjrtError("odd", code=code)), 2, b"k", b"v")
    assert got == 2 and "PjrtError: odd" in text


def test_an_exception_that_cannot_be_printed_is_still_unknown() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no")

    got, text, interrupted = kv_store._dispatch(Faulty(Unprintable()), 0, b"k", 10)
    assert (got, interrupted) == (2, False)
    assert "Unprintable" in text and "could not be printed" in text


def test_a_failing_store_reaches_the_shim_as_its_code(shim: Path) -> None:
    report = replay(shim, Faulty(TimeoutError("slow")), 1, 0)
    assert report.startswith("put=4 get=4 global=- try_get_missing=4 get_missing=4 put_again=4")


def test_bad_stores_are_refused() -> None:
    with pytest.raises(TypeError, match="lacks try_get"):
        pjrt_py.Client(kv_store=type("Half", (), {"get": lambda s, k, t: b"", "put": print})())


def test_the_store_lives_as_long_as_the_client() -> None:
    import gc
    import weakref

    store = stores.InMemoryStore()
    ref = weakref.ref(store)
    client = pjrt_py.Client(kv_store=store)
    assert client.kv_store is store
    exe = client.compile(
        "func.func @main(%x: tensor<f32>) -> tensor<f32> { return %x : tensor<f32> }"
    )
    del store
    client.close()
    gc.collect()
    assert ref() is not None  # the executable still holds the PJRT client
    del exe, client
    gc.collect()
    _core.drain_releases()
    assert ref() is None


CPU_BUILDS = [b.distribution for b in BUILDS if b.platform == "cpu"]


@pytest.mark.parametrize("build", CPU_BUILDS)
@pytest.mark.parametrize(
    "options", [{"num_nodes": 2, "node_id": 0}, {"node_id": 1}, {"process_id": 1}, {"num_nodes": 2}]
)
def test_a_multiprocess_cpu_client_is_refused_on_every_build(
    build: str, options: dict[str, int]
) -> None:
    path = installed_build(build)
    if path is None:
        pytest.skip(f"the {build} plugin (in the test extra) is not installed")
    with pytest.raises(pjrt_py.UnsupportedError, match="cannot be one of several processes"):
        pjrt_py.Client(path, options, kv_store=stores.InMemoryStore())


NODE = """
import sys, threading
import pjrt_py
from pjrt_py import _core
from pjrt_py.distributed import stores
from pjrt_py.runtime import kv_store
from jax._src.lib import _jax
sys.path.insert(0, {tests!r})
from test_kv_store import replay

address, nodes, node = {address!r}, {nodes}, int(sys.argv[1])
service = _jax.get_distributed_runtime_service(address, nodes) if node == 0 else None
connection = _jax.get_distributed_runtime_client(address, node, init_timeout=60)
connection.connect()
store = stores.JaxCoordinationStore(connection, prefix="job-1/")
print("report", replay({shim!r}, store, nodes, node), flush=True)
# The adapter itself: binary keys and values, and the codes of each failure.
store.put(b"bin \\x00\\xff key " + bytes([node]), bytes(range(256)))
other = store.get(b"bin \\x00\\xff key " + bytes([1 - node]), 20000)
print("binary", other == bytes(range(256)), flush=True)
for call in (lambda: store.try_get(b"nope"), lambda: store.get(b"nope", 50),
             lambda: store.put(b"bin \\x00\\xff key " + bytes([node]), b"again")):
    try:
        call()
        print("no error")
    except pjrt_py.PjrtError as e:
        print("code", e.code, flush=True)
# From threads the plugin would use: many at once.
got = []
threads = [threading.Thread(target=lambda i=i: got.append(
    store.get(b"bin \\x00\\xff key " + bytes([i % nodes]), 20000))) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print("threads", len(got), flush=True)
connection.wait_at_barrier("done", 30000)
connection.shutdown()
if service is not None:
    service.shutdown()
print("bye", flush=True)
"""


def test_the_exchange_over_jaxlibs_coordination_service_in_two_processes(shim: Path) -> None:
    pytest.importorskip("jax", reason="jaxlib's coordination service (in the test extra)")
    code = NODE.format(
        tests=str(Path(__file__).parent),
        address=f"127.0.0.1:{free_port()}",
        nodes=2,
        shim=str(shim),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(node)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
        for node in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out + err
        lines = out.strip().split("\n")
        want = f"report put=0 get=0 global={global_topology(2)} {EXPECTED_CODES}"
        assert lines == [want, "binary True", "code 5", "code 4", "code 6", "threads 8", "bye"]


def test_initialize_with_one_process_and_cpu_refusal() -> None:
    pytest.importorskip("jax", reason="jaxlib's coordination service (in the test extra)")
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        from pjrt_py import distributed
        try:
            distributed.initialize("127.0.0.1:{free_port()}", 2, 0)
        except pjrt_py.UnsupportedError as e:
            print("refused:", "CPU plugin" in str(e))
        client = distributed.initialize("127.0.0.1:{free_port()}", 1, 0)
        print(client.kv_store.prefix, client.process_index)
        print(client.buffer(np.arange(3.0)).to_numpy().tolist())
        distributed.shutdown()
        distributed.shutdown()
        print("bye")
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:4] == [
        "refused: True",
        "pjrt_py/ 0",
        "[0.0, 1.0, 2.0]",
        "bye",
    ]


def test_exit_without_shutdown_is_clean() -> None:
    pytest.importorskip("jax", reason="jaxlib's coordination service (in the test extra)")
    result = run_python(
        f"""
        from pjrt_py import distributed
        client = distributed.initialize("127.0.0.1:{free_port()}", 1, 0)
        print("up", client.process_index)
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "up 0"


def test_a_client_that_is_not_the_world_asked_for_is_closed() -> None:
    # What a plugin that ignores num_nodes / node_id gets after creation (the
    # CPU builds are refused before; this runs the later check on one).
    client = pjrt_py.Client()
    with pytest.raises(pjrt_py.UnsupportedError, match="process_index 0, asked node 1"):
        client._check_processes({"node_id": 1})
    with pytest.raises(ValueError, match="closed"):
        client.buffer(b"")
    other = pjrt_py.Client()
    with pytest.raises(pjrt_py.UnsupportedError, match="all of them local, asked 2 nodes"):
        other._check_processes({"num_nodes": 2})


def test_launcher_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    from pjrt_py import distributed

    for name in ("SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PMI_RANK", raising=False)
    assert distributed.from_environment() is None
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    assert distributed.from_environment() == (3, 8)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert distributed.from_environment() == (1, 2)


def test_an_isolated_compile_is_refused_for_a_client_spanning_processes() -> None:
    # A CPU client cannot span processes; the flag stands for what a CUDA
    # client with num_nodes > 1 sets, to run the check on a real client.
    client = pjrt_py.Client()
    client._spans_processes = True
    with pytest.raises(pjrt_py.UnsupportedError, match="helper process, which cannot join"):
        client.compile("func.func @main() -> () { return }", isolate=True)
    client.compile("func.func @main() -> () { return }", isolate=False)


def test_in_memory_get_takes_a_real_timeout() -> None:
    # NaN never passed its deadline: the wait spun a core forever; inf and
    # 10**30 overflowed the condition's wait instead of waiting.
    from pjrt_py.distributed.stores import InMemoryStore  # noqa: PLC0415

    store = InMemoryStore()
    with pytest.raises(ValueError, match="NaN"):
        store.get(b"k", float("nan"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a number"):
        store.get(b"k", "5")  # type: ignore[arg-type]
    for forever in (float("inf"), 10**30, 10**400):
        fresh = InMemoryStore()
        threading.Timer(0.2, fresh.put, (b"k", b"v")).start()
        assert fresh.get(b"k", forever) == b"v"  # type: ignore[arg-type]


def test_in_memory_store_takes_bytes_and_nothing_it_would_misread() -> None:
    # bytes(5) is five zero bytes: an int key was stored under b"\0" * 5, past
    # the no-overwrite check (which looked for the int), and try_get(5) then
    # said "not found"; an int value became that many zero bytes.
    from pjrt_py.distributed.stores import InMemoryStore  # noqa: PLC0415

    store = InMemoryStore()
    for call in (
        lambda: store.put(5, b"v"),  # type: ignore[arg-type]
        lambda: store.put(b"k", 7),  # type: ignore[arg-type]
        lambda: store.put("k", b"v"),  # type: ignore[arg-type]
        lambda: store.try_get(5),  # type: ignore[arg-type]
        lambda: store.get("k", 10_000),  # type: ignore[arg-type]  # was: a 10 s wait
    ):
        with pytest.raises(TypeError, match="must be bytes"):
            call()
    assert store.keys() == []
    store.put(bytearray(b"k"), memoryview(b"v"))  # bytes-like: stored as bytes
    assert store.try_get(b"k") == b"v" and store.keys() == [b"k"]
    with pytest.raises(pjrt_py.AlreadyExistsError):
        store.put(b"k", b"w")


def test_wrong_process_options_and_a_store_class_say_what_is_wrong() -> None:
    # num_nodes=0, -1 or "2" were refused as "cannot be one of several
    # processes"; the store's class (not an instance) was accepted.
    from pjrt_py.distributed.stores import InMemoryStore  # noqa: PLC0415

    for options, error, says in (
        ({"num_nodes": 0}, ValueError, "cannot be 0"),
        ({"node_id": -1}, ValueError, "cannot be -1"),
        ({"num_nodes": "2"}, TypeError, "must be an int, not str"),
    ):
        with pytest.raises(error, match=says):
            pjrt_py.Client(options=options)
    with pytest.raises(TypeError, match="not the class InMemoryStore"):
        pjrt_py.Client(kv_store=InMemoryStore)
