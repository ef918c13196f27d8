"""Python host callbacks: a program's ``stablehlo.custom_call`` runs a Python function.

``register_callback`` binds a custom-call target name to a Python
function. A program that contains::

    %r = stablehlo.custom_call @name(%a, %b) {api_version = 4 : i32}
        : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>

calls ``fn(a, b)`` with numpy arrays of its operands while it runs, and the
arrays ``fn`` returns become the custom call's results. The handler the
plugin calls is a C function of pjrt_py's (``native/host_callback.c``): it
takes the GIL on the plugin's thread, calls ``fn``, checks each returned
array's shape and dtype against the result the program declares, and copies
it in. Anything that goes wrong fails the execution with a
``PjrtError`` raised where its results are read, whose message
names the callback and carries the Python traceback's last frames.

Decisions (see docs/callbacks.md):

* **Scope.** Registration is process-wide, as the plugin's FFI registry is:
  every client of the plugin sees the name, and XLA cannot forget it. A
  ``client`` argument only names the plugin. Registering a name again
  replaces its function (pjrt_py owns that table), which is how a notebook
  redefines a callback.
* **CPU and CUDA.** On CPU the handler reads operands and writes results in
  place. On CUDA they are device memory: the handler copies the operands to
  host memory on the call's stream, synchronizes, runs ``fn`` the same way,
  and copies the results back (``native/host_callback_gpu.c``). The CUDA
  driver is loaded with ``dlopen`` at the first CUDA registration; without
  it, and on any other platform (ROCm included), ``UnsupportedError``.
* **Operands are copies** (``copy=True``, the default): numpy arrays ``fn``
  owns, which it may write to and keep. ``copy=False`` hands out read-only
  views of the program's memory instead, with no copy whatever the size,
  valid during the call only. That is an unsafe opt-in, like
  ``Buffer.unsafe_pointer``: a view kept past the call (or any array made
  from it) reads memory XLA has freed or reused, which can be wrong numbers
  or a crash. pjrt_py sees a kept view and fails the execution with a
  message that says so, but it cannot take the view back.
* **Results** must match exactly: a numpy array (or anything
  ``np.asarray`` takes) of the declared shape and dtype; no silent casts.
  A callback with one result returns an array (or a 1-tuple), with several a
  tuple or list. With none, its return value is ignored.
* **Attributes** of the custom call (``mhlo.backend_config = {...}``, XLA
  FFI's attribute dictionary) reach ``fn`` as keyword arguments: integers and
  floats as Python numbers, arrays as read-only numpy arrays, strings as
  ``str``, dictionaries as ``dict``.
* **Tokens** (``!stablehlo.token`` operands and results, which order
  side-effecting calls) are not passed to ``fn``.
* **Re-entry.** ``fn`` may dispatch work (``execute_async``) and read
  results that are ready. Waiting inside a callback for a result that is not
  ready raises ``RuntimeError``: the plugin thread running the callback may be
  the one that work needs (see ``in_host_callback``).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from ..defaults import default_client
from ..runtime.dtypes import SUPPORTED
from ..runtime.errors import UnsupportedError
from .ffi import check_target_name, register_ffi_target

if TYPE_CHECKING:
    from ..client import Client

# XLA's element type numbers (xla::PrimitiveType, also XLA_FFI_DataType).
_XLA_NUMBERS = {
    "bool": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
    "uint16": 7,
    "uint32": 8,
    "uint64": 9,
    "float16": 10,
    "float32": 11,
    "float64": 12,
    "complex64": 15,
    "bfloat16": 16,
    "complex128": 18,
    "float8_e5m2": 19,
    "float8_e4m3fn": 20,
    "float8_e4m3b11fnuz": 23,
    "float8_e5m2fnuz": 24,
    "float8_e4m3fnuz": 25,
    "float8_e4m3": 28,
    "float8_e3m4": 29,
    "float8_e8m0fnu": 33,
}
XLA_DTYPES: dict[int, np.dtype[Any]] = {
    _XLA_NUMBERS[dt.name]: dt for dt in SUPPORTED if dt.name in _XLA_NUMBERS
}

ROUTER_TARGET = "pjrt_py_host_callback"  # slot 0: jax's callbacks, routed by key
_lock = threading.Lock()
_routes: dict[int, Callable[..., Any]] = {}  # key -> jax callable (read by the C handler)
_slots: dict[str, int] = {ROUTER_TARGET: 0}  # target name -> trampoline slot
_functions: dict[int, tuple[Callable[..., Any], str, bool]] = {}  # slot -> (fn, name, copy)
_observer: Callable[[str, float], None] | None = None  # pjrt_py.trace's, while it records


def _format_error(name: str, error: BaseException) -> str:
    """The message of an execution failed by callback ``name`` raising ``error``:
    the exception and the innermost frames of its traceback."""
    text = str(error)
    if text.startswith(f"host callback {name!r}"):  # pjrt_py's own check of the results
        return text
    head = f"host callback {name!r} raised {type(error).__name__}: {text}"
    frames = "".join(traceback.format_tb(error.__traceback__)[-4:]).rstrip()
    if not frames:
        return head
    return f"{head}\nTraceback (innermost frames):\n{frames}"


_SLOTS = _core.host_callback_setup(XLA_DTYPES, _routes, _format_error)


def in_host_callback() -> bool:
    """Whether the calling thread is running a host callback for a plugin.

    Waiting there, with no timeout, for a result that is not ready raises
    ``RuntimeError``: the plugin thread running the callback may be the one
    that work needs.

    Returns
    -------
    bool
        True inside a function registered with ``register_callback`` (or
        a jax callback routed through ``pjrt_py.jit``) while it runs.
    """
    return bool(_core.in_host_callback())


def calls() -> int:
    """How many host callbacks have completed in this process (for tests)."""
    return int(_core.host_callback_calls())


CUDA_DRIVER = "libcuda.so.1"
# How a platform is spelled -> what pjrt_py runs callbacks on.
_KINDS = {"cpu": "cpu", "host": "cpu", "cuda": "cuda", "gpu": "cuda", "rocm": "rocm"}


def load_cuda_driver(path: str = CUDA_DRIVER) -> None:
    """Load the CUDA driver API the GPU handler copies with (once per process).

    Raises
    ------
    UnsupportedError
        If ``path`` cannot be loaded or lacks an entry point pjrt_py uses.
    """
    why = _core.cuda_driver_load(path)
    if why is not None:
        raise UnsupportedError(f"Python host callbacks on CUDA need the CUDA driver: {why}")


def _copier(client: Client | None, platform: str | None, what: str) -> tuple[Client, str]:
    """The client to register with and how its handler reaches the buffers:
    ``"direct"`` (CPU: in place) or ``"cuda"`` (staged through host memory)."""
    if platform is not None and not isinstance(platform, str):
        raise TypeError(f"platform must be a str, got {type(platform).__name__}")
    client = default_client() if client is None else client
    client._check_open()
    have = _KINDS.get(client.platform_name.lower())
    want = have if platform is None else _KINDS.get(platform.lower())
    if want is None or have is None or want == "rocm" or have == "rocm":
        asked = "" if platform is None else f"asked for {platform!r} "
        raise UnsupportedError(
            f"{what} run on CPU and CUDA plugins ({asked}on a {client.platform_name!r} "
            "client): on GPUs the handler copies through the CUDA driver API, which ROCm "
            "does not have"
        )
    if want != have:
        raise UnsupportedError(
            f"{what} for {platform!r} need a client of that platform; this one is "
            f"{client.platform_name!r} (registration goes to the client's plugin)"
        )
    if want == "cuda":
        load_cuda_driver()
    return client, "direct" if want == "cpu" else want


def _observed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn``, reporting each call's start and end to the observer (pjrt_py.trace)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            observer = _observer
            if observer is not None:
                observer(name, start)

    return call


def set_call_observer(observer: Callable[[str, float], None] | None) -> None:
    """Report every registered callback's calls to ``observer(name, start_ns)``
    (None: stop). Used by ``pjrt_py.trace``: without an observer the slots
    hold the functions themselves, and nothing is added to a call."""
    global _observer
    with _lock:
        _observer = observer
        for slot, (fn, name, copy) in _functions.items():
            _core.host_callback_set(
                slot, fn if observer is None else _observed(fn, name), name, copy
            )


def _set(slot: int, fn: Callable[..., Any] | None, name: str, copy: bool, copier: str) -> int:
    """Put ``fn`` in ``slot``; the address of its handler for ``copier``."""
    if fn is None:
        _functions.pop(slot, None)
    else:
        _functions[slot] = (fn, name, copy)
        if _observer is not None:
            fn = _observed(fn, name)
    address = _core.host_callback_set(slot, fn, name, copy)
    if copier == "direct":
        return address
    return _core.host_callback_staged(slot, name, copier)


def register_callback(
    name: str,
    fn: Callable[..., Any],
    *,
    platform: str | None = None,
    client: Client | None = None,
    copy: bool = True,
) -> None:
    """Make ``stablehlo.custom_call @name`` (``api_version = 4``) call ``fn``.

    Parameters
    ----------
    name : str
        The custom-call target, as programs name it.
    fn : callable
        Called as ``fn(*operands, **attributes)`` with numpy arrays; returns
        the result array (one result), a tuple or list of them, or anything
        (no results). Registering ``name`` again replaces the function.
    platform : str, optional
        ``"cpu"`` or ``"cuda"`` (``"gpu"``); the client's own if None. It must
        be the client's: see the module documentation.
    client : Client, optional
        Names the plugin to register with (the default client's if None).
        Registration is process-wide.
    copy : bool
        True (the default): hand ``fn`` copies of the operands, which it may
        write to and keep. False: read-only views of the program's memory,
        valid during the call only; keeping one is unsafe (see above).

    Raises
    ------
    UnsupportedError
        On a plugin that cannot run FFI targets, a platform other than CPU
        and CUDA or other than the client's, or CUDA without its driver.
    ValueError
        For a bad name, a name taken by a native handler
        (``register_ffi_target``), or when all of pjrt_py's callback
        handlers are in use.
    TypeError
        If ``fn`` is not callable.
    """
    check_target_name(name)
    if name == ROUTER_TARGET:
        raise ValueError(f"{name!r} is not a custom-call target name pjrt_py can register")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    client, copier = _copier(client, platform, "Python host callbacks")
    _register(name, fn, client, bool(copy), copier)


def _register(name: str, fn: Callable[..., Any], client: Client, copy: bool, copier: str) -> None:
    """Bind ``name`` to ``fn`` on ``client``'s plugin with ``copier``'s handler
    (tests use the ``"host"`` copiers to run the staged handler on CPU)."""
    with _lock:
        slot = _slots.get(name)
        if slot is None:
            slot = len(_slots)
            if slot >= _SLOTS:
                raise ValueError(
                    f"pjrt_py has {_SLOTS - 1} host-callback targets and all are taken; "
                    "register fewer names (a name can be given a new function)"
                )
        address = _set(slot, fn, name, copy, copier)
        try:
            register_ffi_target(name, address, client=client)
        except BaseException:
            if name not in _slots:  # a new name the plugin refused: free its slot
                _functions.pop(slot, None)
                _core.host_callback_set(slot, None, name, False)
            raise
        _slots[name] = slot


# -- jax's callbacks (pjrt_py.jit) ---------------------------------------------
def install_router(client: Client) -> None:
    """Register the target jax's callbacks are rewritten to with ``client``'s plugin."""
    client, copier = _copier(client, None, "jax host callbacks through pjrt_py.jit")
    address = _set(0, None, ROUTER_TARGET, True, copier)
    register_ffi_target(ROUTER_TARGET, address, client=client)


def add_route(key: int, fn: Callable[..., Any]) -> None:
    _routes[key] = fn


def drop_routes(keys: list[int]) -> None:
    for key in keys:
        _routes.pop(key, None)


__all__ = ["in_host_callback", "register_callback", "set_call_observer"]
