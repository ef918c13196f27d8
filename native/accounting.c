/* Byte accounting (accounting.h): the device table, a handle's bytes, and
 * accounting(), which pjrt_py.runtime.memory_watch reads.
 *
 * A handle's bytes are its shape times its element size, read from its
 * interned (shape, dtype) (cached per meta object, which the cache holds so
 * its address stays its own); where pjrt_py does not know the shape (an
 * output no metadata was found for), PJRT_Buffer_OnDeviceSizeInBytes. The
 * two agree on every CPU build for every dtype pjrt_py supports (tested).
 * Device memory a program uses inside an execution (its temporaries) is the
 * plugin's and is not seen here: Executable.memory_analysis() reports it.
 */
#include "buffer.h"

static int g_acct_used = 0;                 /* slots of g_acct in use */
static PJRT_Device* g_acct_last_device = NULL; /* the last device looked up ... */
static int g_acct_last_slot = 0;            /* ... and its slot */

/* The counter of `device` (not NULL), made on first use; -1 when the table
 * is full (those devices go uncounted). A device keeps its slot for the
 * process: a device pointer freed with its client and reused by a new one
 * finds its slot back, with nothing left on it. */
static int acct_slot(PJRT_Device* device) {
  if (device == g_acct_last_device) return g_acct_last_slot;
  int slot = 0;
  while (slot < g_acct_used && g_acct[slot].device != device) slot++;
  if (slot == g_acct_used) {
    if (slot == PJRT_PY_ACCT_DEVICES) return -1;
    g_acct[slot].device = device;
    g_acct_used++;
  }
  g_acct_last_device = device;
  g_acct_last_slot = slot;
  return slot;
}

/* ---- bytes ---------------------------------------------------------------- */

#define PJRT_PY_ACCT_METAS 64 /* a power of two */

typedef struct {
  PyObject* meta; /* held */
  int64_t bytes;
} acct_meta;

static acct_meta g_acct_metas[PJRT_PY_ACCT_METAS];

/* Whether a PJRT type is packed on the device (two int4 or four int2 to a
 * byte, float4 too) while numpy gives each element a byte: such bytes are
 * neither counted from numpy's size nor read as they lie, only through the
 * plugin's copy, which unpacks them (buffer_type.c). */
static bool pjrt_type_packed(int type) {
  return type == PJRT_Buffer_Type_S4 || type == PJRT_Buffer_Type_U4 || type == PJRT_Buffer_Type_S2 ||
         type == PJRT_Buffer_Type_U2 || type == PJRT_Buffer_Type_F4E2M1FN;
}

/* Bytes of an interned (shape, dtype) on the device: shape times element
 * size; -1 if unreadable, or for sub-byte integers, whose packing is the
 * plugin's to say (every CPU build packs them; acct_handle asks). */
static int64_t acct_meta_bytes(PyObject* meta) {
  uintptr_t h = (uintptr_t)meta;
  acct_meta* e = &g_acct_metas[((h >> 4) ^ (h >> 10)) & (PJRT_PY_ACCT_METAS - 1)];
  if (e->meta == meta) return e->bytes;
  npy_intp dims[PJRT_PY_MAX_RANK];
  int ndim;
  PyArray_Descr* descr;
  if (meta_unpack(meta, dims, &ndim, &descr) < 0) {
    PyErr_Clear();
    return -1;
  }
  if (pjrt_type_packed(pjrt_type_of(descr))) return -1;
  int64_t bytes = (int64_t)PyDataType_ELSIZE(descr);
  for (int i = 0; i < ndim; ++i) bytes *= (int64_t)dims[i];
  Py_INCREF(meta);
  PJRT_PY_SETREF(e->meta, meta);
  e->bytes = bytes;
  return bytes;
}

/* The plugin's size of a handle pjrt_py has no metadata for; -1 if it cannot say. */
static int64_t acct_ask_bytes(const PJRT_Api* api, PJRT_Buffer* buf) {
  if (!PJRT_PY_HAS(api, PJRT_Buffer_OnDeviceSizeInBytes)) return -1;
  size_t bytes;
  PJRT_Error* error = buffer_device_bytes(api, buf, &bytes);
  if (error != NULL) {
    error_destroy(api, error);
    return -1;
  }
  return (int64_t)bytes;
}

static PJRT_Device* acct_ask_device(const PJRT_Api* api, PJRT_Buffer* buf) {
  PJRT_Buffer_Device_Args args = {0};
  args.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE;
  args.buffer = buf;
  PJRT_Error* error = api->PJRT_Buffer_Device(&args);
  if (error != NULL) {
    error_destroy(api, error);
    return NULL;
  }
  return args.device;
}

/* ---- hooks ---------------------------------------------------------------- */

/* Counts handle `buf` under tag t (which counts nothing yet). `device` and
 * `meta` where the caller knows them (the dispatch path does): else the
 * plugin is asked. A handle whose device or size cannot be had counts nothing. */
static void acct_handle(acct_tag* t, const PJRT_Api* api, PJRT_Buffer* buf, PJRT_Device* device,
                        PyObject* meta) {
  int64_t bytes = meta != NULL ? acct_meta_bytes(meta) : -1;
  if (bytes < 0) bytes = acct_ask_bytes(api, buf);
  if (device == NULL) device = acct_ask_device(api, buf);
  int slot = device != NULL ? acct_slot(device) : -1;
  if (bytes > 0 && slot >= 0) acct_add(t, slot, bytes);
}

/* Counts a new Buffer (buffer_wrap); its device is asked (and kept in
 * b->device) where the caller does not know it. */
static void acct_buffer(BufferObject* b, PJRT_Device* device) {
  if (device == NULL) {
    error_destroy(b->c->api, buffer_ask_device(b));
    device = b->device;
    if (device == NULL) return;
  }
  acct_handle(&b->acct, b->c->api, b->buf, device, b->meta);
}

/* After an execution that may donate: arguments the plugin consumed stop
 * counting now, before its outputs (which may reuse their memory) count.
 * Python retires them right after (pjrt_py.programs.executable). */
static void acct_donated(const PJRT_Api* api, BufferObject** args, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    BufferObject* b = args[i];
    if (b->acct.bytes == 0 || b->buf == NULL) continue;
    PJRT_Buffer_IsDeleted_Args d = {0};
    d.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE;
    d.buffer = b->buf;
    PJRT_Error* error = api->PJRT_Buffer_IsDeleted(&d);
    if (error == NULL && d.is_deleted) acct_drop(&b->acct);
    error_destroy(api, error);
  }
}

/* ---- reading -------------------------------------------------------------- */

/* accounting(reset) -> [(device address, live bytes, peak bytes), ...], one
 * per device counted so far. reset: each peak starts again from live, after
 * it was read (memory_watch marks the start of a watch this way). */
static PyObject* core_accounting(PyObject* self, PyObject* reset_arg) {
  (void)self;
  int reset = PyObject_IsTrue(reset_arg);
  if (reset < 0) return NULL;
  /* Copied first, reset at once: making the list may run the collector, and
   * a finalizer may free a Buffer; the snapshot stays one instant. */
  int n = g_acct_used;
  acct_counter snapshot[PJRT_PY_ACCT_DEVICES];
  memcpy(snapshot, g_acct, (size_t)n * sizeof(acct_counter));
  if (reset)
    for (int i = 0; i < n; ++i) g_acct[i].peak = g_acct[i].live;
  PyObject* out = PyList_New(n);
  for (int i = 0; out != NULL && i < n; ++i) {
    PyObject* row = Py_BuildValue("(NLL)", PyLong_FromVoidPtr(snapshot[i].device),
                                  (long long)snapshot[i].live, (long long)snapshot[i].peak);
    if (row == NULL) {
      Py_CLEAR(out);
      break;
    }
    PyList_SetItem(out, i, row);
  }
  return out;
}

/* Buffer.on_device_size_in_bytes(): what the buffer takes on its device, as
 * the plugin counts it (half of nbytes for packed int4; more where a layout
 * pads or tiles). The GIL is released around the call, the buffer pinned. */
static PyObject* buffer_on_device_size(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  pjrt_py_client* c = b->c;
  const PJRT_Api* api = c->api;
  if (!PJRT_PY_HAS(api, PJRT_Buffer_OnDeviceSizeInBytes)) {
    PyObject* message = PyUnicode_FromString("the plugin has no PJRT_Buffer_OnDeviceSizeInBytes");
    PyObject* exc = message ? error_for_code(message, PJRT_Error_Code_UNIMPLEMENTED) : NULL;
    if (exc != NULL) PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_XDECREF(exc);
    Py_XDECREF(message);
    return NULL;
  }
  if (client_enter(c, "the buffer") < 0) return NULL;
  if (buffer_pin(b) < 0) {
    client_leave(c);
    return NULL;
  }
  size_t bytes;
  PJRT_Error* error;
  Py_BEGIN_ALLOW_THREADS error = buffer_device_bytes(api, b->buf, &bytes);
  Py_END_ALLOW_THREADS buffer_unpin(b);
  client_leave(c);
  if (error != NULL) return raise_pjrt(api, error);
  return PyLong_FromSize_t(bytes);
}
