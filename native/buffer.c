/* pjrt_py.Buffer: an array on a device, owning one PJRT_Buffer.
 *
 * The handle is freed exactly once: by delete() or by dealloc, whichever
 * comes first, and never while a call uses it. A call that uses the handle
 * without the GIL pins the buffer; delete() on a pinned buffer makes it dead
 * to Python at once and leaves the free to the last unpin. Calls made with
 * the GIL held need no pin: delete() needs the GIL too.
 */
#include "promise.h"

#define PJRT_PY_DIRECT_READ_BYTES (256 << 10) /* see DIRECT_READ_BYTES in buffer.py */

static PyObject* hook_unpickle; /* (array, device id) -> Buffer, from pjrt_py.runtime.buffer */

static const char* buffer_dead_message(const BufferObject* b) {
  return b->state == BUF_DONATED ? "buffer was donated to an execution and is no longer valid"
                                 : "buffer has been deleted";
}

/* 0 if b may be used now (with the GIL); else -1 with ValueError. */
static int buffer_live(BufferObject* b) {
  if (b->state != BUF_LIVE || b->buf == NULL) {
    PyErr_SetString(PyExc_ValueError, buffer_dead_message(b));
    return -1;
  }
  return state_check_usable(b->c, "buffer");
}

/* A Buffer for a handle whose bytes are not counted here: a view of memory
 * someone else owns, or a handle counted already (its owner moves its tag in).
 * Takes `buf` (a PJRT_Buffer of c) and a new reference on c. On failure the
 * handle is left to the caller (still theirs) and NULL returned. */
static BufferObject* buffer_wrap_or_leave(PyObject* client, pjrt_py_client* c, PJRT_Buffer* buf,
                                          PyObject* meta) {
  BufferObject* b = PyObject_GC_New(BufferObject, BufferType);
  if (b == NULL) return NULL;
  client_ref(c);
  b->buf = buf;
  b->c = c;
  Py_INCREF(client);
  b->client = client;
  Py_XINCREF(meta);
  b->meta = meta;
  b->weakrefs = NULL;
  b->device = NULL;
  b->memory = NULL;
  b->pins = 0;
  b->exports = 0;
  b->acct.bytes = 0;
  b->state = BUF_LIVE;
  b->ready = 0;
  b->dense = 0;
  b->host_aliased = 0;
  b->row_major = 0;
  PyObject_GC_Track(b);
  return b;
}

/* As buffer_wrap_or_leave, but on failure the handle is destroyed. */
static BufferObject* buffer_wrap_uncounted(PyObject* client, pjrt_py_client* c, PJRT_Buffer* buf,
                                           PyObject* meta) {
  BufferObject* b = buffer_wrap_or_leave(client, c, buf, meta);
  if (b == NULL) buffer_handle_destroy(c->api, buf);
  return b;
}

/* As buffer_wrap_uncounted, for memory pjrt_py allocated: its bytes count on
 * `device` (where buf lives; NULL: the plugin is asked). */
static BufferObject* buffer_wrap(PyObject* client, pjrt_py_client* c, PJRT_Buffer* buf,
                                 PyObject* meta, PJRT_Device* device) {
  BufferObject* b = buffer_wrap_uncounted(client, c, buf, meta);
  if (b != NULL) acct_buffer(b, device);
  return b;
}

/* Records what the maker of b knows of it (NULL, or a zero field: nothing;
 * what b already knows stays). */
static void buffer_set_origin(BufferObject* b, const buffer_origin* origin) {
  if (origin == NULL) return;
  if (origin->device != NULL) b->device = origin->device;
  if (origin->memory != NULL) b->memory = origin->memory;
  if (origin->row_major != 0) b->row_major = origin->row_major;
}

/* Destroys the PJRT handle and drops the client reference, once. With the
 * GIL; `unlocked`: released around the destroy, the client held for it as a
 * call (close() and the exit sequence wait for it), where the plugin may
 * wait in it (donation.c). */
static void buffer_free_handle(BufferObject* b, bool unlocked) {
  PJRT_Buffer* buf = b->buf;
  pjrt_py_client* c = b->c;
  b->buf = NULL;
  b->c = NULL;
  acct_drop(&b->acct);
  if (c == NULL) return;
  if (buf != NULL && state_pjrt_allowed(c)) {
    if (unlocked) {
      client_enter_checked(c);
      Py_BEGIN_ALLOW_THREADS
      buffer_handle_destroy(c->api, buf);
      Py_END_ALLOW_THREADS
      client_leave(c);
    } else {
      buffer_handle_destroy(c->api, buf);
    }
  }
  client_unref(c);
}

/* With the GIL; the caller also holds the client for the call (client_enter). */
static int buffer_pin(BufferObject* b) {
  if (buffer_live(b) < 0) return -1;
  b->pins++;
  return 0;
}

/* Frees the handle of a buffer dead to Python once nothing uses it: no call
 * (pins) and no DLPack export lending its memory (exports, dlpack_export.c).
 * `unlocked`: as buffer_free_handle. */
static void buffer_free_if_unused(BufferObject* b, bool unlocked) {
  if (b->pins == 0 && b->exports == 0 && b->state != BUF_LIVE) buffer_free_handle(b, unlocked);
}

static void buffer_unpin(BufferObject* b) {
  b->pins--;
  buffer_free_if_unused(b, false);
}

/* Makes b dead to Python; frees the handle now, or when the last call using
 * it (unpin) or the last DLPack export lending its memory (dlpack_export.c) ends. */
static void buffer_retire(BufferObject* b, int state, bool unlocked) {
  if (b->state == BUF_LIVE) b->state = (unsigned char)state;
  buffer_free_if_unused(b, unlocked);
}

static void buffer_dealloc(BufferObject* b) {
  PyObject_GC_UnTrack(b);
  if (b->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject*)b);
  buffer_free_handle(b, false);
  Py_CLEAR(b->client);
  Py_CLEAR(b->meta);
  PyTypeObject* type = Py_TYPE(b);
  PyObject_GC_Del(b);
  Py_DECREF(type);
}

static int buffer_traverse(BufferObject* b, visitproc visit, void* arg) {
  Py_VISIT(b->client);
  Py_VISIT(b->meta);
  Py_VISIT(Py_TYPE(b));
  return 0;
}

static PyObject* buffer_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  (void)type;
  (void)args;
  (void)kwargs;
  PyErr_SetString(PyExc_TypeError,
                  "Buffers are made by Client.buffer() or by executing a program");
  return NULL;
}

/* ---- metadata -------------------------------------------------------------- */

/* (shape, dtype), read from PJRT on first use (borrowed). */
static PyObject* buffer_meta(BufferObject* b) {
  if (b->meta != NULL) return b->meta;
  if (buffer_live(b) < 0) return NULL;
  const PJRT_Api* api = b->c->api;
  PJRT_Buffer_Dimensions_Args d = {0};
  d.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE;
  d.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_Dimensions(&d);
  if (error != NULL) return raise_pjrt(api, error);
  PJRT_Buffer_ElementType_Args t = {0};
  t.struct_size = PJRT_Buffer_ElementType_Args_STRUCT_SIZE;
  t.buffer = b->buf;
  error = api->PJRT_Buffer_ElementType(&t);
  if (error != NULL) return raise_pjrt(api, error);
  if (d.num_dims > PJRT_PY_MAX_RANK) {
    return PyErr_Format(PyExc_ValueError, "buffer of rank %zu (pjrt_py supports %d)", d.num_dims,
                        PJRT_PY_MAX_RANK);
  }
  b->meta = meta_from_dims(d.dims, d.num_dims, (int)t.type);
  return b->meta;
}

static PyObject* buffer_meta_part(BufferObject* b, Py_ssize_t i) {
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return NULL;
  PyObject* part = PyTuple_GetItem(meta, i);
  Py_XINCREF(part);
  return part;
}

static PyObject* buffer_get_shape(BufferObject* b, void* unused) {
  (void)unused;
  return buffer_meta_part(b, 0);
}

static PyObject* buffer_get_dtype(BufferObject* b, void* unused) {
  (void)unused;
  return buffer_meta_part(b, 1);
}

static PyObject* buffer_get_ndim(BufferObject* b, void* unused) {
  (void)unused;
  PyObject* meta = buffer_meta(b);
  return meta ? PyLong_FromSsize_t(PyTuple_Size(PyTuple_GetItem(meta, 0))) : NULL;
}

static Py_ssize_t buffer_size_of(BufferObject* b) {
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return -1;
  PyObject* shape = PyTuple_GetItem(meta, 0);
  Py_ssize_t size = 1;
  for (Py_ssize_t i = 0; i < PyTuple_Size(shape); ++i)
    size *= PyLong_AsSsize_t(PyTuple_GetItem(shape, i));
  return size;
}

static PyObject* buffer_get_size(BufferObject* b, void* unused) {
  (void)unused;
  Py_ssize_t size = buffer_size_of(b);
  return size < 0 ? NULL : PyLong_FromSsize_t(size);
}

static PyObject* buffer_get_nbytes(BufferObject* b, void* unused) {
  (void)unused;
  Py_ssize_t size = buffer_size_of(b);
  if (size < 0) return NULL;
  PyArray_Descr* descr = (PyArray_Descr*)PyTuple_GetItem(b->meta, 1);
  return PyLong_FromSsize_t(size * (Py_ssize_t)PyDataType_ELSIZE(descr));
}

static PyObject* buffer_get_meta(BufferObject* b, void* unused) {
  (void)unused;
  PyObject* meta = b->meta ? b->meta : Py_None;
  Py_INCREF(meta);
  return meta;
}

/* _metadata(): (shape, dtype) of a live buffer; ValueError if it is dead. */
static PyObject* buffer_metadata(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  PyObject* meta = buffer_meta(b);
  Py_XINCREF(meta);
  return meta;
}

static PyObject* buffer_get_client(BufferObject* b, void* unused) {
  (void)unused;
  Py_INCREF(b->client);
  return b->client;
}

static PyObject* buffer_get_is_deleted(BufferObject* b, void* unused) {
  (void)unused;
  return PyBool_FromLong(b->state != BUF_LIVE);
}

/* _handle: the PJRT_Buffer* (0 once freed), for C baselines and tests. */
static PyObject* buffer_get_handle(BufferObject* b, void* unused) {
  (void)unused;
  return PyLong_FromVoidPtr(b->buf);
}

static PyObject* buffer_get_host_aliased(BufferObject* b, void* unused) {
  (void)unused;
  return PyBool_FromLong(b->host_aliased);
}

/* Asks the plugin for b's device once (a buffer never moves) and keeps it in
 * b->device. b is live. NULL, or the plugin's error. */
static PJRT_Error* buffer_ask_device(BufferObject* b) {
  if (b->device != NULL) return NULL;
  PJRT_Buffer_Device_Args args = {0};
  args.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  PJRT_Error* error = b->c->api->PJRT_Buffer_Device(&args);
  if (error == NULL) b->device = args.device;
  return error;
}

/* The memory space of a live buffer, asked once (a buffer never moves) and
 * kept in b->memory; NULL if the plugin cannot say. */
static PJRT_Memory* buffer_memory(BufferObject* b) {
  if (b->memory != NULL || !PJRT_PY_HAS(b->c->api, PJRT_Buffer_Memory)) return b->memory;
  PJRT_Buffer_Memory_Args args = {0};
  args.struct_size = PJRT_Buffer_Memory_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  PJRT_Error* error = b->c->api->PJRT_Buffer_Memory(&args);
  if (error == NULL) b->memory = args.memory;
  error_destroy(b->c->api, error);
  return b->memory;
}

/* The device of a live buffer; NULL if the plugin cannot say. */
static PJRT_Device* buffer_device(BufferObject* b) {
  error_destroy(b->c->api, buffer_ask_device(b));
  return b->device;
}

static PyObject* buffer_device_address(BufferObject* b) {
  if (buffer_live(b) < 0) return NULL;
  PJRT_Error* error = buffer_ask_device(b);
  if (error != NULL) return raise_pjrt(b->c->api, error);
  return PyLong_FromVoidPtr(b->device);
}

static PyObject* buffer_get_device(BufferObject* b, void* unused) {
  (void)unused;
  PyObject* address = buffer_device_address(b);
  if (address == NULL) return NULL;
  PyObject* device = PyObject_CallMethod(b->client, "_device_for", "O", address);
  Py_DECREF(address);
  return device;
}

static PyObject* promise_value_impl(PromiseObject* p, double timeout);

/* ---- copies --------------------------------------------------------------------- */

/* The PJRT object a target (a Device or Memory of b's client, as the client
 * resolved it) stands for: its `_addr`. NULL with an exception; b is checked
 * again, since resolving the target ran Python. Takes `target`. */
static void* buffer_target_address(BufferObject* b, PyObject* target) {
  if (target == NULL) return NULL;
  PyObject* address = PyObject_GetAttrString(target, "_addr");
  Py_DECREF(target);
  if (address == NULL) return NULL;
  void* pointer = PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  if (PyErr_Occurred() || buffer_live(b) < 0) return NULL;
  return pointer;
}

/* A BufferPromise of a new copy of b (a PJRT handle the plugin just made),
 * knowing `origin` of it (where it went: its layout is the plugin's choice).
 * Its bytes count on origin's device (none given: the plugin is asked). */
static PyObject* buffer_copy_promise(BufferObject* b, PJRT_Buffer* copied,
                                     const buffer_origin* origin) {
  PJRT_Device* device = origin != NULL ? origin->device : NULL;
  BufferObject* copy = buffer_wrap(b->client, b->c, copied, b->meta, device);
  if (copy == NULL) return NULL;
  buffer_set_origin(copy, origin);
  PyObject* promise = promise_of_one(copy);
  Py_DECREF(copy);
  return promise;
}

/* The value of a promise the caller just made, waited for; takes `promise`. */
static PyObject* promise_waited(PyObject* promise) {
  if (promise == NULL) return NULL;
  PyObject* value = promise_value_impl((PromiseObject*)promise, -1);
  Py_DECREF(promise);
  return value;
}

/* ---- lifetime ------------------------------------------------------------------ */

static PyObject* buffer_delete(BufferObject* b, PyObject* unused) {
  (void)unused;
  buffer_retire(b, BUF_DELETED, false);
  Py_RETURN_NONE;
}

/* ---- readiness ----------------------------------------------------------------- */

static PyObject* buffer_is_ready(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  if (b->ready) Py_RETURN_TRUE;
  const PJRT_Api* api = b->c->api;
  PJRT_Buffer_ReadyEvent_Args args = {0};
  args.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&args);
  if (error != NULL) return raise_pjrt(api, error);
  int ready = event_is_ready(api, args.event);
  if (ready) {
    error = event_error(api, args.event);
    b->ready = error == NULL;
    error_destroy(api, error);
  }
  event_destroy(api, args.event);
  return PyBool_FromLong(ready);
}

static PyObject* buffer_block_until_ready(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  if (!b->ready) {
    PromiseObject* p = (PromiseObject*)promise_of_one(b);
    if (p == NULL) return NULL;
    PyObject* value = promise_value_impl(p, -1);
    Py_DECREF(p);
    if (value == NULL) return NULL;
    Py_DECREF(value);
  }
  Py_INCREF(b);
  return (PyObject*)b;
}
