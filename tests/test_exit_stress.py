"""Interpreter exit wherever work is: executions, a host callback running
Python, transfers (plain and staged) and a key-value call in flight, each
exit repeated many times while a second driver loads the machine
(tests/exit_cases.py). Every exit must end with the status the program chose,
no signal, in time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import build_so

# A plugin thread calling the key-value store's put, again and again.
SHIM = r"""
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "pjrt_c_api.h"

static PJRT_Error* make_error(PJRT_Error_Code code, const char* message, size_t size) {
  (void)code; (void)message; (void)size;
  return (PJRT_Error*)malloc(1);
}
static PJRT_CallbackError make = make_error;

typedef struct { PJRT_KeyValuePutCallback put; void* arg; } job;

static void* run(void* p) {
  job* j = (job*)p;
  for (;;) {
    PJRT_KeyValuePutCallback_Args a;
    memset(&a, 0, sizeof(a));
    a.struct_size = sizeof(a);
    a.key = "k"; a.key_size = 1; a.value = "v"; a.value_size = 1;
    a.callback_error = &make; a.user_arg = j->arg;
    PJRT_Error* error = j->put(&a);
    if (error != NULL) {
      free(error);
      struct timespec pause = {0, 1000000};
      nanosleep(&pause, NULL);
    }
  }
  return NULL;
}

int start_putting(void* put, void* arg) {
  job* j = (job*)malloc(sizeof(job));
  j->put = (PJRT_KeyValuePutCallback)put;
  j->arg = arg;
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&thread, &attr, run, j);
  pthread_attr_destroy(&attr);
  return rc;
}
"""

# Exits per case and driver; two drivers run at once. The default build
# ("cpu": fastatomstruct-xla-cpu) runs 2 x 25 = 50 of each; the other two
# builds, which CI runs the whole suite on as well, 2 x 10.
DEFAULT_BUILD = os.environ.get("PJRT_PLUGIN") in (None, "", "cpu", "fastatomstruct-xla-cpu")
REPS = 25 if DEFAULT_BUILD else 10
CHILD_TIMEOUT = 30.0
CASES = ["executions", "callback", "transfer", "staged", "kv"]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    shim = build_so(tmp_path_factory.mktemp("exit_shim"), "kv_putter", SHIM, include_header=True)
    driver = Path(__file__).with_name("exit_cases.py")
    command = [sys.executable, str(driver), str(shim), str(REPS), str(CHILD_TIMEOUT)]
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    drivers = [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    found: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    for d in drivers:
        out, err = d.communicate(timeout=600)
        assert d.returncode == 0, err[-3000:]
        for line in out.splitlines():
            record = json.loads(line)
            found[record["case"]].extend(record["results"])
    return found


@pytest.mark.parametrize("case", CASES)
def test_exit_with_work_in_flight_ends_with_the_programs_status(
    outcomes: dict[str, list[dict[str, Any]]], case: str
) -> None:
    results = outcomes[case]
    assert len(results) == 2 * REPS
    bad = [r for r in results if r["status"] != r["expected"]]
    assert not bad, f"{len(bad)} of {len(results)} exits went wrong; first: {bad[0]}"
    # With PJRT_PY_EXIT_TIMEOUT=0 the work was really in flight: the exit
    # sequence left its client running.
    idle = [r for r in results if r["wait"] == 0 and not r["left_running"]]
    assert not idle, f"nothing was in flight in {len(idle)} exit(s); first: {idle[0]}"
    # The exit sequence waits at most 0.3 s here; the rest is finalization.
    slowest = max(r["exit_s"] for r in results)
    assert slowest < 10, f"an exit took {slowest:.1f} s"


DAEMON_COMPILES = """
import sys, threading, time
import pjrt_py

c = pjrt_py.Client()


def program(i: int) -> str:
    t = f"tensor<{64 + i % 200}x{64 + i % 200}xf32>"
    body = "".join(f"  %a{k} = stablehlo.tanh %a{k - 1} : {t}\\n" for k in range(1, 200))
    return f"func.func @main(%a0: {t}) -> {t} {{\\n{body}  return %a199 : {t}\\n}}"


def compile_forever() -> None:
    i = 0
    while True:
        i += 1
        try:
            c.compile(program(i), cache=False)
        except (ValueError, RuntimeError):  # the interpreter is exiting
            pass


for _ in range(2):
    threading.Thread(target=compile_forever, daemon=True).start()
time.sleep(0.3)
sys.exit(3)
"""


def test_exit_while_daemon_threads_compile() -> None:
    # jaxlib serializes each program to portable bytecode in C++ that releases
    # the GIL; CPython ends a daemon thread that asks for it back during
    # finalization with pthread_exit, which jaxlib's frames turn into SIGABRT
    # ("FATAL: exception not rethrown"): 7 of 40 exits here before such calls
    # ran on a thread the exit joins (programs/joined.py).
    exits_with_status_3(DAEMON_COMPILES, 12 if DEFAULT_BUILD else 6, PJRT_PY_EXIT_TIMEOUT="0")


def exits_with_status_3(program: str, runs: int, **environ: str) -> None:
    """Runs ``program`` ``runs`` times; each must end with its own status, 3."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", **environ}
    for _ in range(runs):
        result = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env
        )
        assert result.returncode == 3, result.stderr[-2000:]


ATEXIT_COMPILES = """
import atexit, sys, threading, time
import pjrt_py
from pjrt_py.programs import form

c = pjrt_py.Client()
t = "tensor<64x64xf32>"
body = "".join(f"  %a{k} = stablehlo.tanh %a{k - 1} : {t}\\n" for k in range(1, 2000))
text = f"func.func @main(%a0: {t}) -> {t} {{\\n{body}  return %a1999 : {t}\\n}}"
go = threading.Event()


def serialize_forever() -> None:  # compile's jaxlib step alone, to be in it at exit
    go.wait()
    while True:
        form.for_plugin(c.plugin, text)


for _ in range(2):
    threading.Thread(target=serialize_forever, daemon=True).start()


def late() -> None:  # the threads start compiling after shutdown joined its threads
    go.set()
    time.sleep(0.3)


atexit.register(late)
sys.exit(3)
"""


def test_exit_while_daemon_threads_compile_in_an_atexit_handler() -> None:
    # After the shutdown has joined its threads (atexit handlers run then), a
    # new non-daemon thread is joined by nothing: the first version of
    # programs/joined.py let the abort back in, in 5 exits of 5 here.
    exits_with_status_3(ATEXIT_COMPILES, 3)
