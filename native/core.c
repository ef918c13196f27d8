/* pjrt_py._core: the native core of pjrt_py, one translation unit.
 *
 * Built by the same `pip install` as the cffi module (setup.py), against the
 * same pjrt_c_api.h. See core.h for who owns what. The cffi module compiles
 * no C of ours: every helper and every piece of process state lives here,
 * once.
 */
#include "core.h"

#include <structmember.h>

#include "errors.c"
#include "events.c"
#include "state.c"
#include "gate_call.c"
#include "completion.c"
#include "client_ref.c"
#include "meta.c"
#include "host.c"
#include "buffer.c"
#include "accounting.c"
#include "donation.c"
#include "releases.c"
#include "layout.c"
#include "dlpack_export.c"
#include "dlpack_import.c"
#include "memory.c"
#include "stream.c"
#include "buffer_scalar.c"
#include "buffer_type.c"
#include "promise.c"
#include "callbacks.c"
#include "promise_types.c"
#include "loaded.c"
#include "admission.c"
#include "foreign.c"
#include "ffi.c"
#include "extensions.c"
#include "profiler.c"
#include "host_callback_attrs.c"
#include "host_callback_values.c"
#include "host_callback.c"
#include "host_callback_gpu.c"
#include "kv_store.c"
#include "outputs.c"
#include "dispatch.c"
#include "sharded.c"
#include "executable.c"
#include "client.c"
#include "stderr_replay.c"
#include "staging_pool.c"
#include "staging_ring.c"
#include "staging_h2d.c"
#include "staging_d2h.c"

static PyObject* hook_await = NULL;
static PyObject* hook_callback_error = NULL;

/* set_hooks(await_=, callback_error=, unpickle=, dlpack=, dlpack_device=, host_view=):
 * Python functions the types call for what is better said in Python (see
 * pjrt_py.runtime.promise / .buffer, pjrt_py.interop.dlpack). */
static PyObject* core_set_hooks(PyObject* self, PyObject* args, PyObject* kwargs) {
  (void)self;
  static char* names[] = {"await_",        "callback_error", "unpickle", "dlpack",
                          "dlpack_device", "host_view",      NULL};
  PyObject** hooks[] = {&hook_await,   &hook_callback_error, &hook_unpickle,
                        &hook_dlpack, &hook_dlpack_device,  &hook_host_view};
  PyObject* given[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOOO:set_hooks", names, &given[0],
                                   &given[1], &given[2], &given[3], &given[4], &given[5]))
    return NULL;
  for (int i = 0; i < 6; ++i) {
    if (given[i] == NULL) continue;
    Py_INCREF(given[i]);
    PJRT_PY_SETREF(*hooks[i], given[i]);
  }
  Py_RETURN_NONE;
}

static PyObject* core_generation(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return PyLong_FromUnsignedLong(g_generation);
}

/* live_clients() -> PJRT clients of this process not yet destroyed (tests). */
static PyObject* core_live_clients(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  long n = 0;
  pthread_mutex_lock(&g_registry_mu);
  for (pjrt_py_client* c = g_clients; c != NULL; c = c->next)
    if (c->client != NULL) n++;
  pthread_mutex_unlock(&g_registry_mu);
  return PyLong_FromLong(n);
}

static PyMethodDef core_functions[] = {
    {"load_plugin", core_load_plugin, METH_VARARGS,
     "load_plugin(path) -> PJRT_Api address"},
    {"error_from_pjrt", (PyCFunction)(void (*)(void))core_error_from_pjrt, METH_FASTCALL,
     "error_from_pjrt(api, error) -> PjrtError; destroys the PJRT_Error"},
    {"set_spin_ns", core_set_spin_ns, METH_O, "How long waits poll before blocking (ns)."},
    {"spin_ns", core_spin_ns, METH_NOARGS, NULL},
    {"set_dtypes", core_set_dtypes, METH_O, NULL},
    {"intern_meta", core_intern_meta, METH_O, "The shared (shape, dtype) equal to this one."},
    {"pending_holds", core_pending_holds, METH_NOARGS,
     "Host-memory holds still waiting for PJRT."},
    {"effects_barrier", core_effects_barrier, METH_NOARGS, NULL},
    {"exit_sequence", core_exit_sequence, METH_O, NULL},
    {"after_fork_in_child", core_after_fork_in_child, METH_NOARGS, NULL},
    {"set_hooks", (PyCFunction)(void (*)(void))core_set_hooks, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {"generation", core_generation, METH_NOARGS, NULL},
    {"set_dlpack_codes", core_set_dlpack_codes, METH_O, NULL},
    {"plugin_extensions", core_plugin_extensions, METH_O,
     "plugin_extensions(api) -> the extension types in the plugin's chain"},
    {"stream_extension_usable", core_stream_extension_usable, METH_O,
     "stream_extension_usable(api) -> whether the plugin has a usable PJRT stream extension"},
    {"profiler_available", core_profiler_available, METH_O,
     "profiler_available(api) -> whether the plugin has a usable PJRT profiler extension"},
    {"ffi_register", core_ffi_register, METH_VARARGS,
     "ffi_register(api, name, handler, platform) -> 0, or 1/2 when the plugin has no way"},
    {"drain_releases", core_drain_releases, METH_NOARGS,
     "Run the DLPack releases queued by threads without the GIL (tests)."},
    {"dlpack_capsule_device", core_dlpack_capsule_device, METH_O,
     "dlpack_capsule_device(capsule) -> (device type, id), without taking the tensor; or None"},
    {"dlpack_unpack", core_dlpack_unpack, METH_O,
     "dlpack_unpack(capsule) -> DLPackTensor, taking the producer's tensor."},
    {"live_clients", core_live_clients, METH_NOARGS, NULL},
    {"accounting", core_accounting, METH_O,
     "accounting(reset) -> [(device address, live bytes, peak bytes)]; reset: peaks start again"},
    {"host_callback_setup", core_host_callback_setup, METH_VARARGS,
     "host_callback_setup(dtypes, routes, format_error) -> number of slots"},
    {"host_callback_set", core_host_callback_set, METH_VARARGS,
     "host_callback_set(slot, fn, name, copy) -> the slot's XLA FFI handler address"},
    {"host_callback_staged", core_host_callback_staged, METH_VARARGS,
     "host_callback_staged(slot, name, copier) -> the slot's GPU (staged) handler address"},
    {"cuda_driver_load", core_cuda_driver_load, METH_VARARGS,
     "cuda_driver_load(path) -> None, or why the CUDA driver cannot be used"},
    {"host_callback_calls", core_host_callback_calls, METH_NOARGS, NULL},
    {"kv_set_dispatch", core_kv_set_dispatch, METH_O, NULL},
    {"kv_callbacks", core_kv_callbacks, METH_NOARGS,
     "The (get, try_get, put) key-value callbacks' addresses for PJRT_Client_Create."},
    {"kv_holder_new", core_kv_holder_new, METH_O, "A callbacks' user_arg holding store."},
    {"kv_holder_free", core_kv_holder_free, METH_O, NULL},
    {"kv_calls", core_kv_calls, METH_NOARGS, NULL},
    {"in_host_callback", core_in_host_callback, METH_NOARGS,
     "Whether this thread is inside a host callback."},
    {"stderr_replay", core_stderr_replay, METH_VARARGS,
     "stderr_replay(from_fd, to_fd, offset): a fatal signal copies from_fd to to_fd first"},
    {"staging_configure", core_staging_configure, METH_VARARGS,
     "staging_configure(client, mode, min_bytes, chunk_bytes, slots, timeout)"},
    {"staging_stats", core_staging_stats, METH_O,
     "staging_stats(client) -> the staging ring's settings, state and counters"},
    {"staging_wanted", core_staging_wanted, METH_VARARGS,
     "staging_wanted(client, nbytes) -> whether a copy this large would be staged"},
    {"staging_copiers", (PyCFunction)(void (*)(void))core_staging_copiers, METH_FASTCALL,
     "staging_copiers(n=None) -> threads copying a staged chunk (sets it first if n)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "pjrt_py._core",
    "The native core of pjrt_py: buffers, promises, dispatch and lifetimes.", -1,
    core_functions,
};

static PyTypeObject* make_type(PyObject* module, PyType_Spec* spec, PyTypeObject* base,
                               const char* name) {
  PyObject* bases = base ? PyTuple_Pack(1, (PyObject*)base) : NULL;
  if (base != NULL && bases == NULL) return NULL;
  PyObject* type = PyType_FromModuleAndSpec(module, spec, bases);
  Py_XDECREF(bases);
  if (type == NULL) return NULL;
  if (PyModule_AddObjectRef(module, name, type) < 0) {
    Py_DECREF(type);
    return NULL;
  }
  return (PyTypeObject*)type; /* the module and this pointer each hold one */
}

PyMODINIT_FUNC PyInit__core(void) {
  import_array();
  PyObject* module = PyModule_Create(&core_module);
  if (module == NULL) return NULL;
  state_locks_init();
  g_metas = PyDict_New();
  g_non_donatable = PyUnicode_InternFromString("non_donatable");
  if (g_metas == NULL || g_non_donatable == NULL || errors_init() < 0) goto fail;
  if (!(BufferType = make_type(module, &buffer_spec, NULL, "Buffer"))) goto fail;
  if (!(PromiseType = make_type(module, &promise_spec, NULL, "Promise"))) goto fail;
  if (!(BufferPromiseType =
            make_type(module, &buffer_promise_spec, PromiseType, "BufferPromise")))
    goto fail;
  if (!(ArrayPromiseType = make_type(module, &array_promise_spec, PromiseType, "ArrayPromise")))
    goto fail;
  if (!(LoadedType = make_type(module, &loaded_spec, NULL, "Loaded"))) goto fail;
  if (!(ExecutableCoreType = make_type(module, &executable_spec, NULL, "ExecutableCore")))
    goto fail;
  if (!(TensorType = make_type(module, &tensor_spec, NULL, "DLPackTensor"))) goto fail;
  if (!(ClientCoreType = make_type(module, &client_core_spec, NULL, "ClientCore"))) goto fail;
  if (!(PluginProfilerType = make_type(module, &prof_spec, NULL, "PluginProfiler"))) goto fail;
  static int at_exit_hooked = 0; /* a module made again (a subinterpreter) hooks once */
  if (!at_exit_hooked && Py_AtExit(python_finalized) == 0) at_exit_hooked = 1;
  return module;
fail:
  Py_DECREF(module);
  return NULL;
}
