"""The compile helper process: the other end of ``pjrt_py.isolate``.

It makes a client of the same plugin with the same options (at its first
compile request), then compiles each request and answers with the
serialized executable, or with a description of the exception. It also
reads bytecode programs as text for the parent (``_READ``), with no client.
It is a module of its own so that ``pjrt_py.programs.isolate`` starts it by
name and never imports it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from typing import BinaryIO

from ..runtime.client import RuntimeClient
from ..runtime.errors import PjrtError
from .compile_process import (
    _ERROR,
    _FATAL,
    _MAX_OUTPUT,
    _OK,
    _READ,
    _REPLY,
    _REQUEST,
    _TEXT,
    ENV_TEST_CRASH,
    TEST_CRASH_MARKER,
)
from .compiler import Compiler
from .mlir_text import bytecode_to_text


def _describe(exc: BaseException) -> bytes:
    cls = type(exc)
    message = exc.message if isinstance(exc, PjrtError) else str(exc)
    code = exc.code if isinstance(exc, PjrtError) else None
    return json.dumps(
        {"module": cls.__module__, "name": cls.__qualname__, "message": message, "code": code}
    ).encode()


def _test_crash(how: str) -> None:
    print(f"pjrt_py.isolate: test hook {ENV_TEST_CRASH}={how}", file=sys.stderr, flush=True)
    if how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif how == "abort":
        os.abort()
    elif how == "hang":
        while True:
            time.sleep(3600)


def _reply(out: BinaryIO, status: int, payload: bytes) -> None:
    out.write(_REPLY.pack(status, len(payload)))
    out.write(payload)
    out.flush()


def main() -> None:
    """The helper process's loop.

    Run as ``python -c 'from pjrt_py.programs.compile_worker import main; main()' IN OUT PLUGIN
    OPTIONS``:
    the request and reply pipes' descriptors, the plugin path, the client
    create options as JSON.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # The plugin's lines stay on stderr, which the parent keeps for a crash report.
    os.environ["PJRT_PY_PLUGIN_LOG"] = "raw"
    faulthandler.enable()  # a crash prints the Python stack into the output tail

    in_fd, out_fd, plugin_path, options = sys.argv[1:5]
    requests = os.fdopen(int(in_fd), "rb")
    replies = os.fdopen(int(out_fd), "wb")
    # The client is made at the first compile: a helper that only reads
    # bytecode takes no device (on a GPU, no context and no memory).
    client: RuntimeClient | None = None
    compiler: Compiler | None = None
    crash = os.environ.get(ENV_TEST_CRASH)
    while True:
        head = requests.read(_REQUEST.size)
        if len(head) < _REQUEST.size:
            os._exit(0)  # the parent closed the pipe, or died
        kind, code_size, options_size = _REQUEST.unpack(head)
        code, compile_options = requests.read(code_size), requests.read(options_size)
        if len(code) < code_size or len(compile_options) < options_size:
            os._exit(0)
        if os.fstat(2).st_size > _MAX_OUTPUT:
            sys.stderr.flush()
            os.ftruncate(2, 0)
            os.lseek(2, 0, os.SEEK_SET)
        if crash and TEST_CRASH_MARKER in code:
            _test_crash(crash)
        if kind == _READ:  # what could hang or abort on bytecode is jax's reader, here
            text = bytecode_to_text(code)
            _reply(replies, _OK, b"" if text is None else text.encode())
            continue
        if client is None or compiler is None:
            try:
                client = RuntimeClient(plugin_path, json.loads(options))
                compiler = Compiler(
                    plugin_path, client.options, cache_dir=False, isolate_compile=False
                )
                compiler.bytecode.in_process = True  # this process is the isolation
            except Exception as exc:
                _reply(replies, _FATAL, _describe(exc))
                os._exit(1)
        try:
            program = code.decode() if kind == _TEXT else code
            compiled = compiler.compile_code(client, program, code, compile_options, guard=False)
            data = compiled.serialize(compiled.signature)
            del compiled
        except Exception as exc:
            _reply(replies, _ERROR, _describe(exc))
        else:
            _reply(replies, _OK, data)
