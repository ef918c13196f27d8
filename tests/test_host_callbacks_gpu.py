"""Python host callbacks on GPU plugins (issue 24): the staged handler of
``native/host_callback_gpu.c``.

On the CPU builds: platform routing and its errors, the CUDA driver's
loading errors, the staged handler itself run with the ``"host"`` copiers
(memcpy in place of the CUDA copies: same staging, same checks), the
XLA_FFI_Api slot it asks for the stream through, and jax's CUDA lowering
through pjrt_py's rewrite. Tests marked ``gpu`` need a CUDA plugin with a
device and skip without one."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import build_so, child_code, run_python, session_client
from test_host_callbacks import mlir, unary

import pjrt_py
from pjrt_py.callbacks import host_callback
from pjrt_py.callbacks import jax_callbacks as _jax_callbacks


def _has_libcuda() -> bool:
    try:
        ctypes.CDLL(host_callback.CUDA_DRIVER)
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def cpu_client() -> pjrt_py.Client:
    """A client of a CPU plugin, whatever plugin the run is of: the tests
    below that use it check the CPU routing, or run the staged handler with
    memcpy copiers, which read device pointers as host memory."""
    session = session_client()
    if session.platform_name == "cpu":
        return session
    if not any(info.name == "cpu" for info in pjrt_py.plugins()):
        pytest.skip("needs a CPU plugin (the test extra installs three): none is installed")
    return pjrt_py.Client("cpu")


@pytest.fixture(scope="module")
def cuda_client() -> pjrt_py.Client:
    if not any(info.name == "cuda" for info in pjrt_py.plugins()):
        pytest.skip("needs a plugin whose devices are GPUs: no CUDA PJRT plugin is installed")
    # Neither this client nor jax's (test_cuda_jit_callbacks_match_jax) takes
    # most of the device's memory up front: they share it.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        return pjrt_py.Client("cuda", {"preallocate": False})
    except (pjrt_py.PjrtError, OSError) as e:
        pytest.skip(f"needs a plugin whose devices are GPUs: the CUDA plugin has none ({e})")


# -- routing and loading (any build) ---------------------------------------------


@pytest.mark.parametrize("platform", [None, "cpu", "CPU", "host", "Host"])
def test_cpu_spellings_use_the_direct_handler(cpu_client: pjrt_py.Client, platform: Any) -> None:
    assert host_callback._copier(cpu_client, platform, "callbacks") == (cpu_client, "direct")


@pytest.mark.parametrize("platform", ["cuda", "CUDA", "gpu", "GPU", "Cuda"])
def test_a_cuda_request_on_a_cpu_client_is_refused(
    cpu_client: pjrt_py.Client, platform: str
) -> None:
    with pytest.raises(
        pjrt_py.UnsupportedError,
        match=f"Python host callbacks for '{platform}' need a client of that platform; "
        "this one is 'cpu'",
    ):
        pjrt_py.register_callback("cuda_on_cpu", lambda x: x, platform=platform, client=cpu_client)


@pytest.mark.parametrize(("platform", "match"), [("rocm", "ROCm"), ("tpu", "CPU and CUDA")])
def test_other_platforms_are_refused(cpu_client: pjrt_py.Client, platform: str, match: str) -> None:
    with pytest.raises(pjrt_py.UnsupportedError, match=match):
        pjrt_py.register_callback("elsewhere", lambda x: x, platform=platform, client=cpu_client)
    with pytest.raises(TypeError, match="platform must be a str"):
        pjrt_py.register_callback("elsewhere", lambda x: x, platform=3, client=cpu_client)  # type: ignore[arg-type]


@pytest.mark.skipif(_has_libcuda(), reason="this machine has libcuda.so.1")
def test_without_libcuda_loading_the_driver_is_unsupported() -> None:
    with pytest.raises(
        pjrt_py.UnsupportedError, match=r"need the CUDA driver: cannot load libcuda"
    ):
        host_callback.load_cuda_driver()
    with pytest.raises(RuntimeError, match="the CUDA driver is not loaded"):
        pjrt_py._core.host_callback_staged(255, "no_driver", "cuda")


def test_a_library_that_is_not_the_driver_is_refused_and_not_kept() -> None:
    with pytest.raises(pjrt_py.UnsupportedError, match="cannot load /nonexistent/libcuda.so.1"):
        host_callback.load_cuda_driver("/nonexistent/libcuda.so.1")
    with pytest.raises(pjrt_py.UnsupportedError, match="has no cuMemcpyDtoHAsync_v2"):
        host_callback.load_cuda_driver("libm.so.6")


# -- the staged handler on CPU -----------------------------------------------------

STAGED_CASES = [
    (np.float32, (2, 3), np.sin),
    (np.float64, (5,), np.exp),
    (ml_dtypes.bfloat16, (3, 2), lambda x: x * 2),
    (np.int8, (7,), lambda x: x // 3),
    (np.int32, (), lambda x: x + 5),
    (np.bool_, (4,), np.logical_not),
    (np.complex64, (3,), np.conj),
    (np.float32, (0, 3), np.sin),
]


@pytest.mark.parametrize(("dtype", "shape", "fn"), STAGED_CASES, ids=str)
def test_staged_callbacks_match_numpy(
    cpu_client: pjrt_py.Client, dtype: Any, shape: tuple[int, ...], fn: Any
) -> None:
    name = f"staged_{np.dtype(dtype).name}_{len(shape)}_{int(np.prod(shape))}"
    host_callback._register(
        name, lambda x: np.asarray(fn(x), dtype=dtype).reshape(x.shape), cpu_client, False, "host"
    )
    x = (np.random.default_rng(1).standard_normal(shape) * 10).astype(dtype)
    got = cpu_client.compile(unary(name, mlir(dtype, shape))).execute(x).to_numpy()
    np.testing.assert_array_equal(got, np.asarray(fn(x), dtype=dtype).reshape(shape))


def test_staged_several_operands_results_and_attributes(cpu_client: pjrt_py.Client) -> None:
    host_callback._register(
        "staged_two", lambda a, b, *, k: (a + b * k, a * b), cpu_client, False, "host"
    )
    exe = cpu_client.compile("""
func.func @main(%a: tensor<4xf32>, %b: tensor<4xi32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %bf = stablehlo.convert %b : (tensor<4xi32>) -> tensor<4xf32>
  %0:2 = stablehlo.custom_call @staged_two(%a, %bf) {api_version = 4 : i32,
      backend_config = {k = 2.0 : f32}}
    : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  return %0#0, %0#1 : tensor<4xf32>, tensor<4xf32>
}""")
    a, b = np.arange(4, dtype=np.float32), np.array([3, 1, 4, 1], np.int32)
    s, p = exe.execute(a, b)
    np.testing.assert_array_equal(s.to_numpy(), a + 2 * b)
    np.testing.assert_array_equal(p.to_numpy(), a * b)


def test_staged_errors_are_the_cpu_errors(cpu_client: pjrt_py.Client) -> None:
    def broken(x: np.ndarray) -> np.ndarray:
        raise ValueError("staged says no")

    host_callback._register("staged_broken", broken, cpu_client, False, "host")
    with pytest.raises(
        pjrt_py.PjrtError, match="'staged_broken' raised ValueError: staged says no"
    ):
        cpu_client.compile(unary("staged_broken", "tensor<2xf32>")).execute(np.ones(2, np.float32))
    host_callback._register(
        "staged_shape", lambda x: np.ones(3, np.float32), cpu_client, False, "host"
    )
    with pytest.raises(pjrt_py.InvalidArgumentError, match=r"returned float32 \(3,\) for result 0"):
        cpu_client.compile(unary("staged_shape", "tensor<2xf32>")).execute(np.ones(2, np.float32))


def test_staged_views_may_not_be_kept_unless_copied(cpu_client: pjrt_py.Client) -> None:
    kept: list[np.ndarray] = []

    def keep(x: np.ndarray) -> np.ndarray:
        kept.append(x[1:])
        return x

    host_callback._register("staged_keeps", keep, cpu_client, False, "host")
    exe = cpu_client.compile(unary("staged_keeps", "tensor<3xf32>"))
    with pytest.raises(pjrt_py.FailedPreconditionError, match="kept a reference"):
        exe.execute(np.zeros(3, np.float32)).to_numpy()
    kept.clear()
    host_callback._register("staged_keeps", keep, cpu_client, True, "host")
    exe.execute(np.full(3, 7, np.float32)).to_numpy()
    assert kept[0].tolist() == [7, 7]


def test_staged_tokens_and_no_results(cpu_client: pjrt_py.Client) -> None:
    log: list[float] = []
    host_callback._register(
        "staged_log", lambda v: log.append(float(v[0])), cpu_client, False, "host"
    )
    exe = cpu_client.compile("""
func.func @main(%v: tensor<1xf32>) -> tensor<1xf32> {
  %t0 = stablehlo.after_all : !stablehlo.token
  %t1 = stablehlo.custom_call @staged_log(%t0, %v) {api_version = 4 : i32, has_side_effect = true}
    : (!stablehlo.token, tensor<1xf32>) -> !stablehlo.token
  return %v : tensor<1xf32>
}""")
    for i in range(3):
        exe.execute(np.array([i], np.float32)).to_numpy()
    assert log == [0.0, 1.0, 2.0]


def test_the_stream_is_asked_for_through_xla_ffi_stream_get(cpu_client: pjrt_py.Client) -> None:
    # A CPU plugin has no stream: its XLA_FFI_Stream_Get (the fifth function of
    # XLA_FFI_Api) answers with an error, which the handler reads with
    # XLA_FFI_Error_GetMessage and reports. A wrong slot would crash or differ.
    host_callback._register("staged_stream", lambda x: x, cpu_client, False, "host-stream")
    with pytest.raises(
        pjrt_py.UnimplementedError,
        match="host callback 'staged_stream': no stream for the call: XLA_FFI_Stream_Get: "
        "XLA FFI GPU context is not available",
    ):
        cpu_client.compile(unary("staged_stream", "tensor<2xf32>")).execute(np.ones(2, np.float32))


# A stand-in for libcuda.so.1: the entry points pjrt_py uses, copying with
# memcpy (device pointers are host pointers here), counting context pushes and
# pops, and failing cuStreamSynchronize with `fake_fail` when it is set.
FAKE_DRIVER = r"""
#include <stdint.h>
#include <string.h>
int fake_fail = 0, fake_pushes = 0, fake_pops = 0, fake_syncs = 0;
int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t n, void* stream) {
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return 0;
}
int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t n, void* stream) {
  memcpy((void*)(uintptr_t)dst, src, n);
  return 0;
}
int cuStreamSynchronize(void* stream) { fake_syncs++; return fake_fail; }
int cuStreamGetCtx(void* stream, void** ctx) { *ctx = (void*)&fake_pushes; return 0; }
int cuCtxGetCurrent(void** ctx) { *ctx = NULL; return 0; }
int cuCtxPushCurrent_v2(void* ctx) { fake_pushes++; return 0; }
int cuCtxPopCurrent_v2(void** ctx) { fake_pops++; return 0; }
int cuGetErrorName(int e, const char** s) { *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; return 0; }
int cuGetErrorString(int e, const char** s) { *s = "an illegal memory access"; return 0; }
"""


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="needs a C compiler")
def test_the_cuda_copier_against_a_stand_in_driver(tmp_path: Path) -> None:
    # In a fresh interpreter: the first driver that loads is the process's.
    driver = build_so(tmp_path, "fake_cuda", FAKE_DRIVER)
    result = run_python(
        f"""
        import ctypes, numpy as np, pjrt_py
        from pjrt_py.callbacks import host_callback
        host_callback.load_cuda_driver({str(driver)!r})
        fake = ctypes.CDLL({str(driver)!r})
        client = pjrt_py.Client()
        host_callback._register("fake_cuda", lambda x: x * 2, client, False, "cuda-no-stream")
        exe = client.compile({unary("fake_cuda", "tensor<3xf32>")!r})
        print(exe.execute(np.arange(3, dtype=np.float32)).to_numpy().tolist())
        count = lambda name: ctypes.c_int.in_dll(fake, name).value
        print(count("fake_syncs"), count("fake_pushes"), count("fake_pops"))
        ctypes.c_int.in_dll(fake, "fake_fail").value = 700
        try:
            exe.execute(np.arange(3, dtype=np.float32)).to_numpy()
        except pjrt_py.InternalError as e:
            print(e)
        print(count("fake_pushes") - count("fake_pops"))
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "[0.0, 2.0, 4.0]"
    assert lines[1] == "2 1 1"  # operands in, results out; the context pushed once, popped
    assert (
        "host callback 'fake_cuda': copying the operands to the host: cuStreamSynchronize "
        "failed: CUDA_ERROR_ILLEGAL_ADDRESS 700 (an illegal memory access)"
    ) in lines[2]
    assert lines[-1] == "0"


# -- jax's CUDA lowering ------------------------------------------------------------


def _lower(jax: Any, f: Any, platform: str) -> tuple[str, list[Any]]:
    """jax's lowering of ``f`` for ``platform``. jax asks for a backend of that
    platform while lowering a callback (only TPU's lowering uses it); without a
    GPU there is none, so the test stands in for it."""
    from jax._src.interpreters import mlir as jax_mlir

    x = jax.ShapeDtypeStruct((3,), np.float32)
    get_backend = jax_mlir.ModuleContext.get_backend
    jax_mlir.ModuleContext.get_backend = lambda self, optional=False: None
    try:
        lowered = jax.jit(f).trace(x).lower(lowering_platforms=(platform,))
    finally:
        jax_mlir.ModuleContext.get_backend = get_backend
    return lowered.as_text(), list(lowered._lowering.compile_args["host_callbacks"])


def test_jax_cuda_lowering_is_rewritten_as_the_cpu_one(cpu_client: pjrt_py.Client) -> None:
    jax = pytest.importorskip("jax", reason="pjrt_py.jit traces with jax (in the test extra)")
    io_callback = jax.experimental.io_callback
    log: list[float] = []

    def f(x: Any) -> Any:
        y = jax.pure_callback(np.sinh, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        io_callback(lambda s: log.append(float(s)), None, y.sum(), ordered=True)
        jax.debug.print("sum {}", x.sum())
        return y * 2

    rewritten = {}
    for platform in ("cpu", "cuda"):
        text, callbacks = _lower(jax, f, platform)
        assert f"xla_ffi_python_{'gpu' if platform == 'cuda' else 'cpu'}_callback" in text
        routes = _jax_callbacks.Routes(callbacks)
        out = _jax_callbacks.route_callbacks(text, routes)
        assert "xla_ffi_python" not in out and out.count(f"@{host_callback.ROUTER_TARGET}(") == 3
        rewritten[platform] = (out, routes)
    keys = re.compile(r"index = \d+ : ui64")
    assert keys.sub("KEY", rewritten["cuda"][0]) == keys.sub("KEY", rewritten["cpu"][0])
    # The CUDA lowering, rewritten, runs (here on the CPU client).
    host_callback.install_router(cpu_client)
    program = _jax_callbacks.without_main_tokens(rewritten["cuda"][0])
    x = np.arange(3, dtype=np.float32)
    got = cpu_client.compile(program).execute(x).to_numpy()
    np.testing.assert_allclose(got, 2 * np.sinh(x), rtol=1e-6)
    assert log == [pytest.approx(float(np.sinh(x).sum()))]


# -- on a CUDA device -----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "shape", "fn"), STAGED_CASES, ids=str)
def test_cuda_callbacks_match_numpy(
    cuda_client: pjrt_py.Client, dtype: Any, shape: tuple[int, ...], fn: Any
) -> None:
    name = f"cuda_{np.dtype(dtype).name}_{len(shape)}_{int(np.prod(shape))}"
    pjrt_py.register_callback(
        name, lambda x: np.asarray(fn(x), dtype=dtype).reshape(x.shape), client=cuda_client
    )
    x = (np.random.default_rng(2).standard_normal(shape) * 10).astype(dtype)
    got = cuda_client.compile(unary(name, mlir(dtype, shape))).execute(x).to_numpy()
    np.testing.assert_array_equal(got, np.asarray(fn(x), dtype=dtype).reshape(shape))


@pytest.mark.gpu
def test_cuda_callback_after_device_work_sees_its_result(cuda_client: pjrt_py.Client) -> None:
    seen: list[np.ndarray] = []
    pjrt_py.register_callback(
        "cuda_after_work", lambda x: seen.append(np.array(x)) or x + 1, client=cuda_client
    )
    exe = cuda_client.compile("""
func.func @main(%x: tensor<1024xf32>) -> tensor<1024xf32> {
  %y = stablehlo.multiply %x, %x : tensor<1024xf32>
  %z = stablehlo.custom_call @cuda_after_work(%y) {api_version = 4 : i32}
    : (tensor<1024xf32>) -> tensor<1024xf32>
  %w = stablehlo.add %z, %z : tensor<1024xf32>
  return %w : tensor<1024xf32>
}""")
    x = np.linspace(-3, 3, 1024, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(exe.execute(x).to_numpy(), 2 * (x * x + 1))
    np.testing.assert_array_equal(seen[-1], x * x)


@pytest.mark.gpu
def test_cuda_errors_are_the_cpu_errors(cuda_client: pjrt_py.Client) -> None:
    def broken(x: np.ndarray) -> np.ndarray:
        raise ValueError("gpu says no")

    pjrt_py.register_callback("cuda_broken", broken, platform="cuda", client=cuda_client)
    exe = cuda_client.compile(unary("cuda_broken", "tensor<2xf32>"))
    with pytest.raises(pjrt_py.PjrtError, match="'cuda_broken' raised ValueError: gpu says no"):
        exe.execute(np.ones(2, np.float32)).to_numpy()
    pjrt_py.register_callback("cuda_shape", lambda x: np.ones(3, np.float32), client=cuda_client)
    exe = cuda_client.compile(unary("cuda_shape", "tensor<2xf32>"))
    with pytest.raises(pjrt_py.InvalidArgumentError, match=r"returned float32 \(3,\) for result 0"):
        exe.execute(np.ones(2, np.float32)).to_numpy()
    # The client stays usable.
    pjrt_py.register_callback("cuda_shape", lambda x: x * 3, client=cuda_client)
    np.testing.assert_array_equal(exe.execute(np.ones(2, np.float32)).to_numpy(), [3, 3])


@pytest.mark.gpu
def test_cuda_jit_callbacks_match_jax(cuda_client: pjrt_py.Client) -> None:
    jax = pytest.importorskip("jax", reason="pjrt_py.jit traces with jax (in the test extra)")
    io_callback = jax.experimental.io_callback

    def run(jit: Any, log: list[Any]) -> Any:
        def f(x: Any) -> Any:
            y = jax.pure_callback(np.cosh, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
            io_callback(lambda s: log.append(float(s)), None, y.sum(), ordered=True)
            jax.debug.print("cuda sum {}", x.sum())
            return y * 2

        g = jit(f)
        return [np.asarray(g(np.full(4, i, np.float32))) for i in range(3)]

    ours_log: list[float] = []
    jax_log: list[float] = []
    ours = run(lambda f: pjrt_py.jit(f, client=cuda_client), ours_log)
    pjrt_py.effects_barrier()
    want = run(jax.jit, jax_log)
    jax.effects_barrier()
    for g, w in zip(ours, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert ours_log == pytest.approx(jax_log)


def test_a_staged_failure_of_a_jax_callback_names_its_route() -> None:
    # The router's slot serves every jax callback: a failure in its staging
    # (here: no stream, on a CPU plugin) names the callback's route, as a
    # failure of the Python function does, not the router. In a child: the
    # router is registered process-wide with one handler.
    result = run_python(
        child_code(
            """
            import numpy as np, pjrt_py
            from pjrt_py.callbacks import host_callback
            from pjrt_py.callbacks.ffi import register_ffi_target
            client = pjrt_py.Client()
            router = host_callback.ROUTER_TARGET
            address = host_callback._set(0, None, router, True, "host-stream")
            register_ffi_target(router, address, client=client)
            exe = client.compile(
                "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\\n"
                "  %0 = stablehlo.custom_call @" + router + "(%x) {api_version = 4 : i32, "
                "backend_config = {index = 7 : ui64}} : (tensor<2xf32>) -> tensor<2xf32>\\n"
                "  return %0 : tensor<2xf32>\\n}"
            )
            try:
                exe.execute(np.ones(2, np.float32)).to_numpy()
            except pjrt_py.PjrtError as e:
                print(type(e).__name__, e)
            """
        )
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "host callback 'jax callback 7': no stream for the call" in result.stdout, (
        result.stdout + result.stderr[-2000:]
    )
