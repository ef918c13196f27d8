/* Memory spaces of a Buffer: where it lives, and copies between memories.
 * Which memories a device has is read in Python (pjrt_py/memory.py); the
 * client checks a target Memory (and that the plugin has the call) before
 * anything here reaches PJRT. */
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
 * without the method), the plugin's own error is raised. */
static PyObject* buffer_copy_refused(BufferObject* b, PJRT_Error* error, bool same_place) {
  const PJRT_Api* api = b->c->api;
  if (!same_place) return raise_pjrt(api, error);
  PyObject* promise = PyObject_CallMethod(b->client, "_copy_by_program", "O", (PyObject*)b);
  if (promise == NULL && !PyErr_ExceptionMatches(PyExc_Exception)) { /* Ctrl-C: that */
    error_destroy(api, error);
    return NULL;
  }
  if (promise == NULL) {
    PyErr_Clear();
    return raise_pjrt(api, error);
  }
  error_destroy(api, error);
  return promise;
}

static PyObject* buffer_copy_to_memory_async(BufferObject* b, PyObject* memory) {
  if (buffer_live(b) < 0) return NULL;
  PJRT_Memory* dst = (PJRT_Memory*)buffer_target_address(
      b, PyObject_CallMethod(b->client, "_memory_target", "OO", memory, (PyObject*)b));
  if (dst == NULL) return NULL;
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
