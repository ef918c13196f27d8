"""XLA FFI custom-call targets: C handlers a program calls through
``stablehlo.custom_call @name(...) {api_version = 4 : i32}``.

``register_ffi_target`` hands an existing C function (an
``XLA_FFI_Handler``, e.g. one written with XLA's FFI headers and loaded with
``ctypes``) to a plugin through its PJRT FFI extension. Registration belongs
to the plugin library, for the whole process: every client of that plugin
sees the target, and it cannot be taken back (XLA's registry has no removal).
That is why it takes a client only to name the plugin.

Before the first registration with a plugin, pjrt_py compiles a call to a
probe handler of its own, to learn whether that plugin's compiler sees
registered targets at all; a plugin that does not, or has no FFI extension,
gets ``UnsupportedError`` at registration, before anything is
registered. A handler also says which XLA FFI API version it was built for,
when XLA asks at compile time. xla-cpu-pjrt (PJRT 0.81) refuses one newer
than its own (a handler built with jaxlib 0.10.2's headers says 0.3; one
saying 0.1 runs) and reports it as ``NotFound``: pjrt_py turns that into an
``UnsupportedError`` that says so (``explain_compile_error``). What each
CPU build does is in ``docs/callbacks.md``.

A handler is trusted native code: pjrt_py cannot check a function pointer,
and a wrong one crashes the process the way any wrong C call does.
"""

from __future__ import annotations

import ctypes
import re
import threading
from typing import TYPE_CHECKING, Any

from .. import _core
from ..defaults import default_client
from ..runtime.errors import NotFoundError, UnimplementedError, UnsupportedError

if TYPE_CHECKING:
    from ..client import Client

# PJRT platform names -> the names XLA's FFI registry files handlers under.
_FFI_PLATFORMS = {"cpu": "Host", "host": "Host", "cuda": "CUDA", "gpu": "CUDA", "rocm": "ROCM"}
_NAME = re.compile(r"[A-Za-z_][\w.$-]*\Z")
_PROBE_TARGET = "pjrt_py_ffi_probe"
# A call shaped like a real one (an operand, a result): XLA looks the target up
# while it compiles such a call.
_PROBE = (
    "func.func @main(%x: tensor<1xf32>) -> tensor<1xf32> {\n"
    f"  %0 = stablehlo.custom_call @{_PROBE_TARGET}(%x) {{api_version = 4 : i32}} "
    ": (tensor<1xf32>) -> tensor<1xf32>\n"
    "  return %0 : tensor<1xf32>\n}\n"
)

_lock = threading.Lock()
_supported: dict[tuple[str, int], str | None] = {}  # (plugin path, generation) -> why not


def _address(handler: Any) -> int:
    """The address of a C function given as a ctypes function, pointer or int."""
    if isinstance(handler, bool):
        raise TypeError("handler must be a C function pointer, not a bool")
    if isinstance(handler, int):
        address = handler
    elif isinstance(handler, ctypes._CFuncPtr):  # type: ignore[attr-defined]
        address = ctypes.cast(handler, ctypes.c_void_p).value or 0
    elif isinstance(handler, ctypes.c_void_p):
        address = handler.value or 0
    else:
        raise TypeError(
            "handler must be a ctypes function (e.g. ctypes.CDLL(path).my_handler), a "
            f"ctypes.c_void_p or an int address, got {type(handler).__name__}"
        )
    if address <= 0:
        raise ValueError("handler is a null pointer")
    return address


def check_target_name(name: object) -> None:
    """``TypeError`` / ``ValueError`` unless ``name`` can name a custom-call target."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a custom-call target name (letters, digits, _ . $ -)")


def ffi_platform(platform: str) -> str:
    """The FFI registry's name for a PJRT platform (``"cpu"`` -> ``"Host"``)."""
    if not isinstance(platform, str):
        raise TypeError(f"platform must be a str, got {type(platform).__name__}")
    return _FFI_PLATFORMS.get(platform.lower(), platform)


def _why_unsupported(client: Client) -> str | None:
    """Why ``client``'s plugin cannot take FFI targets (None: it can). Probed once."""
    plugin = client.plugin
    key = (plugin.path, plugin.generation)
    if key in _supported:
        return _supported[key]
    platform = ffi_platform(client.platform_name)
    code = _core.ffi_register(plugin.address, _PROBE_TARGET, 0, platform)
    why: str | None = None
    if code == 1:
        why = "it has no PJRT FFI extension"
    elif code == 2:
        why = "its PJRT FFI extension cannot register handlers"
    else:
        try:
            client.compile(_PROBE, cache=False)
        except (NotFoundError, UnimplementedError) as e:
            # NotFound from XLA's FFI lookup; Unimplemented ("No registered
            # implementation for custom call to ...") from older GPU emitters.
            if _PROBE_TARGET not in str(e):
                raise
            why = "it accepts registrations, but its compiler does not see registered targets"
    _supported[key] = why
    return why


def register_ffi_target(
    name: str, handler: Any, *, platform: str | None = None, client: Client | None = None
) -> None:
    """Register a C ``XLA_FFI_Handler`` as the custom-call target ``name``.

    Parameters
    ----------
    name : str
        The target, as programs name it: ``stablehlo.custom_call @name``.
    handler : ctypes function, ctypes.c_void_p or int
        The handler's address. It must follow XLA's typed FFI
        (``api_version = 4``): answer the metadata query and run at the
        execute stage.
    platform : str, optional
        The platform to register for; the client's own if None.
    client : Client, optional
        Names the plugin (the default client's if None); see the module doc.

    Raises
    ------
    UnsupportedError
        If the plugin cannot take FFI targets (no extension, or its compiler
        does not see them).
    ValueError
        For a bad name, a null handler, or a name already registered with
        another handler.
    """
    check_target_name(name)
    address = _address(handler)
    client = default_client() if client is None else client
    client._check_open()
    where = ffi_platform(client.platform_name if platform is None else platform)
    with _lock:
        why = _why_unsupported(client)
        if why is not None:
            raise UnsupportedError(
                f"{client.plugin.path} (PJRT {client.plugin.version_text}) cannot run FFI "
                f"targets: {why}"
            )
        targets = client.plugin.ffi_targets  # read by compile's error explanation
        previous = targets.get((where, name))
        if previous is not None:
            if previous != address:
                raise ValueError(
                    f"custom-call target {name!r} is already registered for {where} with "
                    "another handler; XLA's registry keeps the first"
                )
            return
        _core.ffi_register(client.plugin.address, name, address, where)
        targets[where, name] = address


__all__ = ["ffi_platform", "register_ffi_target"]
