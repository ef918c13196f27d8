"""Native XLA FFI handlers as custom-call targets (issue 14, part 2 and 4).

A tiny typed FFI handler is compiled here, against the XLA FFI header that
jaxlib ships (a build-time input, not a file of ours), and registered with
the real plugin. Registration is process-wide and permanent, so each case
runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import run_python

import pjrt_py

jaxlib = pytest.importorskip("jaxlib", reason="jaxlib (in the test extra) ships the XLA FFI header")
FFI_INCLUDE = Path(jaxlib.__file__).parent / "include"

HANDLER = r"""
#include <stddef.h>
#include "xla/ffi/api/c_api.h"

/* out = 10 * x for f32 buffers of any shape; an error for another dtype. */
static XLA_FFI_Error* times_ten(XLA_FFI_CallFrame* frame) {
  if (frame->extension_start != NULL &&
      frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    XLA_FFI_Metadata* m = ((XLA_FFI_Metadata_Extension*)frame->extension_start)->metadata;
    m->api_version.major_version = XLA_FFI_API_MAJOR;
    m->api_version.minor_version = FFI_MINOR;
    m->traits = 0;
    return NULL;
  }
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  XLA_FFI_Buffer* in = (XLA_FFI_Buffer*)frame->args.args[0];
  XLA_FFI_Buffer* out = (XLA_FFI_Buffer*)frame->rets.rets[0];
  if (in->dtype != XLA_FFI_DataType_F32) {
    XLA_FFI_Error_Create_Args e = {0};
    e.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    e.message = "times_ten takes f32";
    e.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
    return frame->api->XLA_FFI_Error_Create(&e);
  }
  size_t n = 1;
  for (int64_t i = 0; i < in->rank; ++i) n *= (size_t)in->dims[i];
  const float* x = (const float*)in->data;
  float* y = (float*)out->data;
  for (size_t i = 0; i < n; ++i) y[i] = 10.0f * x[i];
  return NULL;
}

void* handler_address(void) { return (void*)times_ten; }
"""


def build_handler(tmp_path: Path, minor: str) -> Path:
    src = tmp_path / "times_ten.c"
    src.write_text(HANDLER)
    so = tmp_path / f"times_ten_{minor}.so"
    cc = os.environ.get("CC", "cc")
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            f"-I{FFI_INCLUDE}",
            f"-DFFI_MINOR={minor}",
            str(src),
            "-o",
            str(so),
        ],
        check=True,
    )
    return so


SCRIPT = """
import ctypes, numpy as np, pjrt_py
lib = ctypes.CDLL({so!r})
lib.handler_address.restype = ctypes.c_void_p
client = pjrt_py.Client()
pjrt_py.register_ffi_target("times_ten", lib.handler_address(), client=client)
pjrt_py.register_ffi_target("times_ten", lib.handler_address(), client=client)  # again: a no-op
try:
    pjrt_py.register_ffi_target("times_ten", 4096, client=client)
except ValueError as e:
    print("conflict:", e)
def program(shape, dtype="f32"):
    t = "tensor<" + "x".join(map(str, shape)) + ("x" if shape else "") + dtype + ">"
    return (
        "func.func @main(%x: " + t + ") -> " + t + " {{\\n"
        "  %0 = stablehlo.custom_call @times_ten(%x) {{api_version = 4 : i32}}"
        " : (" + t + ") -> " + t + "\\n"
        "  return %0 : " + t + "\\n}}"
    )
try:
    for shape in [(8,), (3, 5), (2, 3, 4), ()]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        out = client.compile(program(shape)).execute(x).to_numpy()
        np.testing.assert_array_equal(out, 10 * x)
        print("ok", shape)
    try:
        client.compile(program((4,), "f64")).execute(np.ones(4))
    except pjrt_py.PjrtError as e:
        print("handler error:", type(e).__name__, e)
except pjrt_py.UnsupportedError as e:
    print("unsupported:", e)
"""


def run_handler(tmp_path: Path, minor: str) -> str:
    so = build_handler(tmp_path, minor)
    result = run_python(textwrap.dedent(SCRIPT.format(so=str(so))), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def header_ffi_minor() -> int:
    header = (FFI_INCLUDE / "xla" / "ffi" / "api" / "c_api.h").read_text()
    return int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", header).group(1))  # type: ignore[union-attr]


def plugin_version() -> tuple[int, int]:
    return pjrt_py.load_plugin().api_version


def test_a_c_handler_runs_as_a_custom_call_target(tmp_path: Path) -> None:
    out = run_handler(tmp_path, "XLA_FFI_API_MINOR")  # built like any handler today
    assert "conflict: custom-call target 'times_ten' is already registered" in out
    if plugin_version() < (0, 100):
        # xla-cpu-pjrt 0.81 refuses a handler built for a newer XLA FFI API
        assert "unsupported:" in out and "newer XLA FFI API" in out, out
        return
    if "unsupported:" in out:
        # A jaxlib newer than the plugin (0.12's headers say FFI API 0.5; the
        # 0.106 build takes 0.3): refused with the reason, never run wrongly.
        assert "newer XLA FFI API" in out and header_ffi_minor() > 3, out
        return
    for shape in ["(8,)", "(3, 5)", "(2, 3, 4)", "()"]:
        assert f"ok {shape}" in out, out
    assert "handler error: InvalidArgumentError times_ten takes f32" in out, out


def test_a_handler_for_the_oldest_ffi_api_runs_on_every_build(tmp_path: Path) -> None:
    out = run_handler(tmp_path, "1")
    for shape in ["(8,)", "(3, 5)", "(2, 3, 4)", "()"]:
        assert f"ok {shape}" in out, out


def test_bad_registrations_are_refused(client: pjrt_py.Client) -> None:
    with pytest.raises(TypeError, match="name must be a str"):
        pjrt_py.register_ffi_target(b"x", 4096, client=client)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a custom-call target name"):
        pjrt_py.register_ffi_target("two words", 4096, client=client)
    with pytest.raises(ValueError, match="null pointer"):
        pjrt_py.register_ffi_target("t", 0, client=client)
    with pytest.raises(TypeError, match="handler must be"):
        pjrt_py.register_ffi_target("t", "0x1000", client=client)
    with pytest.raises(TypeError, match="not a bool"):
        pjrt_py.register_ffi_target("t", True, client=client)
    closed = pjrt_py.Client()
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        pjrt_py.register_ffi_target("t", 4096, client=closed)


def test_an_unregistered_target_is_the_plugins_not_found(client: pjrt_py.Client) -> None:
    with pytest.raises(pjrt_py.NotFoundError, match="nobody_registered_this"):
        client.compile(
            "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
            "  %0 = stablehlo.custom_call @nobody_registered_this(%x) {api_version = 4 : i32}"
            " : (tensor<2xf32>) -> tensor<2xf32>\n  return %0 : tensor<2xf32>\n}"
        )


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (pjrt_py.NotFoundError, "No FFI handler registered for {t} on a platform Host"),
        # Older XLA GPU emitters name a missing target in their own words.
        (
            pjrt_py.UnimplementedError,
            "No registered implementation for custom call to {t} for platform CUDA",
        ),
    ],
)
def test_a_registered_target_the_compiler_cannot_see_is_explained(
    client: pjrt_py.Client, kind: type, message: str
) -> None:
    from pjrt_py.programs.diagnostics import explain_compile_error  # noqa: PLC0415

    targets = client.plugin.ffi_targets
    key = ("Host", "explained_target")
    targets[key] = 4096
    try:
        error = kind(message.format(t="explained_target"))
        explained = explain_compile_error(client, error)
        assert isinstance(explained, pjrt_py.UnsupportedError)
        assert "'explained_target' is registered" in str(explained)
        other = kind(message.format(t="never_registered"))
        assert explain_compile_error(client, other) is other
    finally:
        del targets[key]
