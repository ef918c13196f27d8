/* DLPack export: lending a Buffer's memory to another framework.
 *
 * A capsule made from a Buffer holds, until its deleter runs:
 *   - a strong reference to the Buffer (so its client stays alive too),
 *   - one "export" count on it: delete() makes the Buffer dead to Python at
 *     once but leaves the PJRT handle (and so the memory) to the last release,
 *   - a PJRT external reference, which also stops the plugin from donating it.
 * The deleter may run on any thread, with or without the GIL: it enters
 * Python through the gate (state.c) and releases through
 * run_with_gil_unless_exiting (releases.c). From exit on, or in a forked child, it leaves everything as
 * it is: the memory outlives any reader.
 */
#include "dlpack.h"

typedef struct {
  dlp_managed legacy;   /* one of the two is handed out */
  dlp_managed_v versioned;
  BufferObject* owner;  /* a strong reference */
  int external_ref;     /* a PJRT external reference is held */
  int64_t dims[];       /* shape, then strides */
} export_ctx;

/* Ends one export. With the GIL. */
static void export_finish(void* arg) {
  export_ctx* x = (export_ctx*)arg;
  BufferObject* b = x->owner;
  if (x->external_ref && b->buf != NULL && b->c != NULL && state_pjrt_allowed(b->c))
    buffer_release_memory(b);
  b->exports--;
  buffer_free_if_unused(b, false);
  Py_DECREF(b);
  free(x);
}

/* Ends one export, on any thread (see run_with_gil_unless_exiting). */
static void export_release(export_ctx* x) {
  /* Past exit: the Buffer, its handle and x stay. */
  run_with_gil_unless_exiting(export_finish, x);
}

static void export_deleter(dlp_managed* m) { export_release((export_ctx*)m->manager_ctx); }
static void export_deleter_v(dlp_managed_v* m) { export_release((export_ctx*)m->manager_ctx); }

/* A capsule no consumer took: its destructor frees what it holds. */
static void export_capsule_destructor(PyObject* capsule) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyCapsule_IsValid(capsule, DLP_NAME)) {
    dlp_managed* m = (dlp_managed*)PyCapsule_GetPointer(capsule, DLP_NAME);
    if (m != NULL && m->deleter != NULL) m->deleter(m);
  } else if (PyCapsule_IsValid(capsule, DLP_NAME_V)) {
    dlp_managed_v* m = (dlp_managed_v*)PyCapsule_GetPointer(capsule, DLP_NAME_V);
    if (m != NULL && m->deleter != NULL) m->deleter(m);
  }
  PyErr_Restore(type, value, traceback);
}

/* _dlpack(code, bits, device_type, device_id, versioned, flags) -> capsule.
 * The caller (pjrt_py.interop.dlpack) waited for the buffer and checked its layout;
 * flags go into a versioned tensor as they are. */
static PyObject* buffer_dlpack_export(BufferObject* b, PyObject* args) {
  int code, bits, device_type, device_id, versioned, ordered = 0;
  unsigned long long flags;
  if (!PyArg_ParseTuple(args, "iiiipK|p:_dlpack", &code, &bits, &device_type, &device_id,
                        &versioned, &flags, &ordered))
    return NULL;
  if (buffer_live(b) < 0) return NULL;
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return NULL;
  if (bits != 8 * (int)PyDataType_ELSIZE((PyArray_Descr*)PyTuple_GetItem(meta, 1))) {
    PyErr_SetString(PyExc_ValueError, "_dlpack: bits is not the size of the buffer's elements");
    return NULL;
  }
  /* ordered: the consumer's stream waits for the data (stream.c) or the
   * consumer asked for no synchronisation; else it must be there now. */
  if (!ordered && !buffer_ready_ok(b)) {
    PyErr_SetString(PyExc_BufferError, "the buffer is not ready: wait for it first");
    return NULL;
  }
  const PJRT_Api* api = b->c->api;
  PyObject* shape = PyTuple_GetItem(meta, 0);
  Py_ssize_t ndim = PyTuple_Size(shape);
  export_ctx* x = (export_ctx*)calloc(1, sizeof(export_ctx) + 2 * (size_t)ndim * sizeof(int64_t));
  if (x == NULL) return PyErr_NoMemory();
  for (Py_ssize_t i = 0; i < ndim; ++i) x->dims[i] = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
  if (!buffer_layout_strides(b, (size_t)ndim, x->dims, x->dims + ndim)) {
    free(x);
    PyErr_SetString(PyExc_BufferError, "the buffer's on-device layout is tiled or padded");
    return NULL;
  }
  /* With the GIL held, on purpose. Released here (a buffer pinned), two
   * threads exported one buffer at once and the CPU plugin aborted
   * ("Non-zero type 1 hold on destruction", 1 run in 3 of the delete race
   * in test_robustness.py): a buffer's external references are not safe
   * from two threads in the plugin. The cost: a plugin that waits here for
   * unready work (an ordered GPU export, if its client does) holds every
   * Python thread with it. */
  PJRT_Error* error = NULL;
  if (PJRT_PY_HAS(api, PJRT_Buffer_IncreaseExternalReferenceCount)) {
    error = buffer_hold_memory(b);
    if (error != NULL) {
      free(x);
      return raise_pjrt(api, error);
    }
    x->external_ref = 1;
  }
  void* data = NULL;
  error = buffer_data_address(b, &data);
  if (error != NULL) {
    if (x->external_ref) buffer_release_memory(b);
    free(x);
    return raise_pjrt(api, error);
  }
  dlp_tensor t = {0};
  t.data = data;
  t.device.device_type = device_type;
  t.device.device_id = device_id;
  t.ndim = (int32_t)ndim;
  t.dtype.code = (uint8_t)code;
  t.dtype.bits = (uint8_t)bits;
  t.dtype.lanes = 1;
  t.shape = x->dims;
  t.strides = x->dims + ndim;
  t.byte_offset = 0;
  Py_INCREF(b);
  x->owner = b;
  b->exports++;
  void* pointer;
  if (versioned) {
    x->versioned.version.major = DLP_VERSION_MAJOR;
    x->versioned.version.minor = DLP_VERSION_MINOR;
    x->versioned.manager_ctx = x;
    x->versioned.deleter = export_deleter_v;
    x->versioned.flags = (uint64_t)flags;
    x->versioned.dl_tensor = t;
    pointer = &x->versioned;
  } else {
    x->legacy.manager_ctx = x;
    x->legacy.deleter = export_deleter;
    x->legacy.dl_tensor = t;
    pointer = &x->legacy;
  }
  PyObject* capsule =
      PyCapsule_New(pointer, versioned ? DLP_NAME_V : DLP_NAME, export_capsule_destructor);
  if (capsule == NULL) export_release(x);
  return capsule;
}

static PyObject* buffer_get_exports(BufferObject* b, void* unused) {
  (void)unused;
  return PyLong_FromLong(b->exports);
}
