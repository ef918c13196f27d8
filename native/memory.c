/* Where a Buffer lives, and copies of it to a memory or a device. Which
 * memories a device has is read in Python (pjrt_py/runtime/device.py); the
 * client checks a target (and that the plugin has the call) before anything
 * here reaches PJRT. */
#include "promise.h"

/* The PJRT_Memory* holding b, as an int (asked once: buffer_memory). */
static PyObject* buffer_memory_address(BufferObject* b) {
  if (buffer_live(b) < 0) return NULL;
  const PJRT_Api* api = b->c->api;
  if (!PJRT_PY_HAS(api, PJRT_Buffer_Memory)) Py_RETURN_NONE;
  if (b->memory != NULL) return PyLong_FromVoidPtr(b->memory);
  PJRT_Buffer_Memory_Args args = {0};
  args.struct_size = PJRT_Buffer_Memory_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_Memory(&args);
  if (error != NULL) return raise_pjrt(api, error);
  b->memory = args.memory;
  return PyLong_FromVoidPtr(args.memory);
}

static PyObject* buffer_get_memory(BufferObject* b, void* unused) {
  (void)unused;
  PyObject* address = buffer_memory_address(b);
  if (address == NULL) return NULL;
  PyObject* memory = PyObject_CallMethod(b->client, "_memory_for", "O", address);
  Py_DECREF(address);
  return memory;
}

/* The plugin refused a copy of b (`error`, taken). A copy to where b already
 * is, which the CPU builds make and XLA's GPU client has refused ("cannot
 * accept the same source and destination"), is then made by a program on the
 * device (Client._copy_by_program, programs/device_programs.py). Where that
 * cannot be done either (a buffer outside the default memory, a client
 * without the method), the plugin's own error is raised, caused by the
 * program's. */
static PyObject* buffer_copy_refused(BufferObject* b, PJRT_Error* error, bool same_place) {
  const PJRT_Api* api = b->c->api;
  if (!same_place) return raise_pjrt(api, error);
  PyObject* promise = PyObject_CallMethod(b->client, "_copy_by_program", "O", (PyObject*)b);
  if (promise == NULL && !PyErr_ExceptionMatches(PyExc_Exception)) { /* Ctrl-C: that */
    error_destroy(api, error);
    return NULL;
  }
  if (promise == NULL) { /* the plugin's refusal, caused by why the program could not copy */
    PyObject *type, *why, *trace;
    PyErr_Fetch(&type, &why, &trace);
    PyErr_NormalizeException(&type, &why, &trace);
    if (why != NULL && trace != NULL) PyException_SetTraceback(why, trace);
    raise_pjrt(api, error);
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v != NULL && why != NULL) {
      PyException_SetCause(v, why); /* steals why */
      why = NULL;
    }
    Py_XDECREF(type);
    Py_XDECREF(why);
    Py_XDECREF(trace);
    PyErr_Restore(t, v, tb);
    return NULL;
  }
  error_destroy(api, error);
  return promise;
}

/* xla-cpu-pjrt 0.81 (PJRT before 0.106) copies a buffer laid out in another
 * dimension order (a program's result with an mhlo.layout_mode) without its
 * order: the copy says row-major and holds the other order's bytes
 * (docs/plugin_defects.md). Such a copy goes through the host instead, where
 * to_numpy reads the order right (Client._copy_through_host). */
static bool buffer_copy_loses_order(BufferObject* b) {
  PJRT_Api_Version v = b->c->api->pjrt_api_version;
  if (v.major_version > 0 || v.minor_version >= 106 || b->meta == NULL) return false;
  size_t ndim = (size_t)PyTuple_Size(PyTuple_GetItem(b->meta, 0));
  return buffer_row_major_state(b, ndim) == 2; /* layout.c: asked once, kept */
}

/* A copy of b to `target` (a Device or Memory, resolved, taken): through
 * the host where the plugin would lose b's order; NULL with an exception, or
 * the target's PJRT address in *dst for the plugin's own copy. */
static PyObject* buffer_copy_around_plugin(BufferObject* b, PyObject* target, void** dst) {
  *dst = NULL;
  if (target == NULL) return NULL;
  if (buffer_live(b) < 0) { /* resolving the target ran Python: b may be gone */
    Py_DECREF(target);
    return NULL;
  }
  if (buffer_copy_loses_order(b)) {
    PyObject* copy = PyObject_CallMethod(b->client, "_copy_through_host", "OO", b, target);
    Py_DECREF(target);
    return copy;
  }
  *dst = buffer_target_address(b, target);
  return NULL;
}

static PyObject* buffer_copy_to_memory_async(BufferObject* b, PyObject* memory) {
  if (buffer_live(b) < 0) return NULL;
  void* dst = NULL;
  PyObject* around = buffer_copy_around_plugin(
      b, PyObject_CallMethod(b->client, "_memory_target", "OO", memory, (PyObject*)b), &dst);
  if (dst == NULL) return around;
  PJRT_Buffer_CopyToMemory_Args args = {0};
  args.struct_size = PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  args.dst_memory = dst;
  PJRT_Error* error = b->c->api->PJRT_Buffer_CopyToMemory(&args);
  if (error != NULL) return buffer_copy_refused(b, error, dst == buffer_memory(b));
  buffer_origin origin = {NULL, dst, 0};
  return buffer_copy_promise(b, args.dst_buffer, &origin);
}

static PyObject* buffer_copy_to_memory(BufferObject* b, PyObject* memory) {
  return promise_waited(buffer_copy_to_memory_async(b, memory));
}

/* ---- copies to a device ----------------------------------------------------------- */

static PyObject* buffer_copy_to_device_async(BufferObject* b, PyObject* device) {
  if (device == Py_None) { /* the client's default device would be taken: not b's */
    PyErr_SetString(PyExc_TypeError, "copy_to_device takes a pjrt_py.Device, not None");
    return NULL;
  }
  if (buffer_live(b) < 0) return NULL;
  void* dst = NULL;
  PyObject* around = buffer_copy_around_plugin(
      b, PyObject_CallMethod(b->client, "_target", "O", device), &dst);
  if (dst == NULL) return around;
  PJRT_Buffer_CopyToDevice_Args args = {0};
  args.struct_size = PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  args.dst_device = dst;
  PJRT_Error* error = b->c->api->PJRT_Buffer_CopyToDevice(&args);
  if (error != NULL) return buffer_copy_refused(b, error, dst == buffer_device(b));
  buffer_origin origin = {dst, NULL, 0};
  return buffer_copy_promise(b, args.dst_buffer, &origin);
}

static PyObject* buffer_copy_to_device(BufferObject* b, PyObject* device) {
  return promise_waited(buffer_copy_to_device_async(b, device));
}

/* copy.copy and copy.deepcopy, like a jax.Array's: a new buffer with the same
 * data on the same device and in the same memory (a pinned_host buffer's copy
 * was made in device memory), so deleting or donating one leaves the other
 * alone. A plugin without memories, or one that refuses the copy to the same
 * memory where no program can make it, gets the copy to the device. */
static PyObject* buffer_copy(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL; /* deleted or donated: b->c is gone */
  PyObject* promise = NULL;
  if (PJRT_PY_HAS(b->c->api, PJRT_Buffer_CopyToMemory)) {
    PyObject* memory = buffer_get_memory(b, NULL);
    promise = memory != NULL ? buffer_copy_to_memory_async(b, memory) : NULL;
    Py_XDECREF(memory);
    if (promise == NULL && PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) return NULL;
    if (promise == NULL) PyErr_Clear();
  }
  if (promise == NULL) {
    PyObject* device = buffer_get_device(b, NULL);
    if (device == NULL) return NULL;
    promise = buffer_copy_to_device_async(b, device);
    Py_DECREF(device);
  }
  if (promise == NULL) return NULL;
  /* buffer(): a program's promise makes its Buffer on first use */
  PyObject* copy = PyObject_CallMethod(promise, "buffer", NULL);
  Py_DECREF(promise);
  return copy;
}

static PyObject* buffer_deepcopy(BufferObject* b, PyObject* memo) {
  (void)memo;
  return buffer_copy(b, NULL);
}
