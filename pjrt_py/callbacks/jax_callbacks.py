"""jax's host callbacks (``pure_callback``, ``io_callback``, ``debug.print``)
in programs lowered by ``pjrt_py.jit``.

jax lowers each callback to ``stablehlo.custom_call
@xla_ffi_python_cpu_callback`` (``@xla_ffi_python_gpu_callback`` when it
lowers for CUDA or ROCm; nothing else differs) with an ``index`` attribute
into the list of
Python callables it keeps beside the lowering, and its runtime hands that
list to its own handler with each execution. pjrt_py rewrites the text
instead (decided over attaching the list per execution, which needs PJRT
execute contexts that not every plugin build has, and an FFI type id that
must match jaxlib's):

* either target becomes ``@pjrt_py_host_callback``, pjrt_py's router
  (``native/host_callback.c``, slot 0), registered for the client's
  platform: on CUDA its handler stages the buffers through host memory
  (``native/host_callback_gpu.c``), so a program jax lowered for CPU or for
  CUDA runs on either;
* ``index = i`` becomes a key unique in this process, mapped to callable
  ``i`` while the program's executable lives. A key carries a random
  per-process salt, so an executable serialized and loaded elsewhere finds
  no callable and fails clearly instead of calling the wrong one.

Ordered effects (``io_callback(ordered=True)``): jax threads a token through
``@main``, a parameter and a result of type ``!stablehlo.token``. pjrt_py
makes the token inside the program (``stablehlo.after_all``), which orders
the callbacks within an execution, and runs the executable ordered (a
runtime token, ``docs/effects.md``), which orders executions of a thread as
jax does.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..programs.mlir_text import read_main, wrap_main
from . import host_callback
from .host_callback import ROUTER_TARGET

_JAX_TARGETS = re.compile(r"@xla_ffi(?:_partitioned)?_python_(?:cpu|gpu)_callback\(")
_INDEX = re.compile(r"mhlo\.backend_config = \{index = (\d+) : ui64\}")
_EMPTY_CONFIG = re.compile(r'\bbackend_config = "", |, backend_config = ""(?=[,}])')
_TOKEN = "!stablehlo.token"
_BODY = "@pjrt_py_jax_main"

_salt = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
_counter = 0
_lock = threading.Lock()


class Routes:
    """The keys of one lowering's callbacks; dropped when the last holder
    (the Lowered, its executables) goes."""

    def __init__(self, callables: Sequence[Callable[..., Any]]) -> None:
        global _counter
        with _lock:
            first = _counter
            _counter += len(callables)
        self.keys = [(_salt << 32) | (first + i) for i in range(len(callables))]
        for key, fn in zip(self.keys, callables, strict=True):
            host_callback.add_route(key, fn)

    def __del__(self) -> None:
        host_callback.drop_routes(self.keys)


def route_callbacks(text: str, routes: Routes) -> str:
    """``text`` with jax's callback targets pointed at pjrt_py's router."""
    out = []
    for line in text.splitlines(keepends=True):
        m = _JAX_TARGETS.search(line)
        if m is None:
            out.append(line)
            continue
        # jax writes the FFI attributes as mhlo.backend_config beside an empty
        # backend_config; the plugins read a backend_config dictionary.
        head, rest = line[: m.start()], line[m.end() :]
        rest = _EMPTY_CONFIG.sub("", rest, count=1)
        index = _INDEX.search(rest)
        if index is None or int(index.group(1)) >= len(routes.keys):
            raise NotImplementedError(f"cannot read jax's callback index in: {line.strip()}")
        key = routes.keys[int(index.group(1))]
        config = f"backend_config = {{index = {key} : ui64}}"
        if "api_version" not in rest:  # typed FFI (jax's printer leaves it implicit)
            config = f"api_version = 4 : i32, {config}"
        rest = rest[: index.start()] + config + rest[index.end() :]
        line = f"{head}@{ROUTER_TARGET}({rest}"
        out.append(line)
    return "".join(out)


def without_main_tokens(program: str) -> str:
    """``program`` with ``@main``'s token parameters and results made inside.

    The original ``@main`` becomes the private ``@pjrt_py_jax_main``; a new
    ``@main`` takes the other parameters, makes a token with
    ``stablehlo.after_all``, calls it and returns the other results. Unchanged
    if ``@main`` has no token.
    """
    main = read_main(program)
    if main is None:
        raise ValueError("the lowering has no func.func @main")
    tokens = [t == _TOKEN for t in main.param_types]
    if not any(tokens) and _TOKEN not in main.result_types:
        return program
    token = "%pjrt_py_jax_token"
    return wrap_main(
        program,
        main,
        _BODY,
        params=[p for p, is_token in zip(main.params, tokens, strict=True) if not is_token],
        args=[token if is_token else n for n, is_token in zip(main.names, tokens, strict=True)],
        keep=[i for i, t in enumerate(main.result_types) if t != _TOKEN],
        prologue=(f"{token} = stablehlo.after_all : {_TOKEN}",),
    )
