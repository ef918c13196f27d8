"""The worker process: runs cases on one plugin, one at a time.

    python -m pjrt_py.conformance.worker PLUGIN

Started by the runner (``pjrt_py.conformance.runner``), usually not as a
fresh interpreter but forked from its zygote, which then runs ``serve``
the same way. It loads the plugin once, answers ``{"ready": ...}``, then
reads one JSON request per line on stdin (``{"path": "..."}``) and writes one
JSON result per line. The results go to their own pipe (the process's
original stdout); fd 1 is pointed at stderr, so anything the plugin prints
cannot corrupt the protocol. Comparison happens here, so only paths and small
result records cross the pipe.

Test hook: with ``PJRT_PY_CONFORMANCE_TEST_HOOKS=1`` in the environment, a
case whose text contains ``// pjrt-py-conformance-hook: crash=SIGNAME``
makes the worker send itself that signal before compiling (a crash no
pre-compile validation can catch), and ``hang`` makes it sleep forever.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..runtime.dtypes import as_dtype_of
from ..runtime.errors import UnimplementedError
from .cases import load
from .checks import RewriteError, rewrite
from .compare import compare

HOOK_ENV = "PJRT_PY_CONFORMANCE_TEST_HOOKS"
_HOOK = re.compile(r"//\s*pjrt-py-conformance-hook:\s*(crash=(SIG\w+)|hang)")


def _test_hook(text: str) -> None:
    if os.environ.get(HOOK_ENV) != "1":
        return
    match = _HOOK.search(text)
    if match is None:
        return
    if match.group(2):
        sys.stderr.write(f"test hook: raising {match.group(2)}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), getattr(signal, match.group(2)))
    while True:  # "hang"
        time.sleep(3600)


def _outputs(result: Any) -> list[Any]:
    if result is None:
        return []
    return list(result) if isinstance(result, tuple) else [result]


def run_case(client: Any, path: Path) -> dict[str, Any]:
    """Compile, execute and check one case; a JSON-able result record."""
    case = load(path)
    _test_hook(case.text)
    try:
        program = rewrite(case.text)
    except RewriteError as exc:
        return {"status": "error", "message": f"rewrite: {exc}"}
    checks = program.checks
    exe = client.compile(program.text)
    # bf16 / float8 .npy files hold raw bytes: the program says what they are.
    specs = exe.input_signature or []
    inputs = [
        as_dtype_of(a, specs[i].dtype if i < len(specs) else None)
        for i, a in enumerate(case.inputs)
    ]
    outputs = [b.to_numpy() for b in _outputs(exe.execute(*inputs))]
    failures: list[dict[str, Any]] = []
    for i, want in enumerate(case.expected):
        if i >= len(outputs):
            failures.append({"check": f"expected{i}", "message": f"only {len(outputs)} results"})
            continue
        mismatch = compare("almost_eq", outputs[i], as_dtype_of(np.asarray(want), outputs[i].dtype))
        if mismatch:
            failures.append({"check": f"expected{i}.npy", "line": None, **mismatch.as_dict()})
    for check in checks:
        got, want = outputs[check.index], outputs[check.index + 1]
        mismatch = compare(check.kind, got, want, check.attrs)
        if mismatch:
            failures.append({"check": check.target, "line": check.line, **mismatch.as_dict()})
    n = len(checks) + len(case.expected)
    if failures:
        return {"status": "mismatch", "message": failures[0]["message"], "failures": failures}
    return {"status": "pass", "message": f"{n} check(s)", "checks": n}


def serve(plugin: str, requests: IO[str], replies: IO[str]) -> None:
    from ..client import Client
    from ..runtime.plugin import load_plugin

    def reply(record: dict[str, Any]) -> None:
        replies.write(json.dumps(record) + "\n")
        replies.flush()

    loaded = load_plugin(plugin)
    client = Client(loaded)
    reply({"ready": True, "platform": client.platform_name, "pjrt": loaded.version_text})
    for line in requests:
        request = json.loads(line)
        started = time.perf_counter()
        try:
            record = run_case(client, Path(request["path"]))
        except UnimplementedError as exc:
            record = {"status": "unsupported", "message": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:  # a failure of this case, never of the worker
            status = "unsupported" if "UNIMPLEMENTED" in str(exc) else "error"
            record = {"status": status, "message": f"{type(exc).__name__}: {exc}"}
        record["seconds"] = time.perf_counter() - started
        reply(record)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's: it kills us
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the plugin's prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    serve(sys.argv[1], sys.stdin, replies)


if __name__ == "__main__":
    main()
