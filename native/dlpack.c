/* DLPack: lending a Buffer's memory to another framework, and taking theirs.
 *
 * The structs below follow the DLPack ABI (versions 0.x "dltensor" and 1.x
 * "dltensor_versioned" capsules). The protocol decisions (which version, copy
 * or not, which device) are made in pjrt_py/dlpack.py; this file does only
 * what needs C: building and consuming the managed tensors, and keeping
 * every piece of memory alive exactly as long as someone may read it.
 *
 * Export. A capsule made from a Buffer holds, until its deleter runs:
 *   - a strong reference to the Buffer (so its client stays alive too),
 *   - one "export" count on it: delete() makes the Buffer dead to Python at
 *     once but leaves the PJRT handle (and so the memory) to the last release,
 *   - a PJRT external reference, which also stops the plugin from donating it.
 * The deleter may run on any thread, with or without the GIL: it enters
 * Python through the gate (state.c). From exit on, or in a forked child, it
 * leaves everything as it is: the memory outlives any reader.
 *
 * Import. dlpack_unpack() takes ownership of a producer's capsule into a
 * Tensor object; its dealloc calls the producer's deleter. A zero-copy view
 * (client.c: _view) holds the Tensor until PJRT's on_delete_callback says the
 * PJRT buffer is done with the memory.
 */

typedef struct {
  uint32_t major;
  uint32_t minor;
} dlp_version;

typedef struct {
  int32_t device_type;
  int32_t device_id;
} dlp_device;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} dlp_dtype;

typedef struct {
  void* data;
  dlp_device device;
  int32_t ndim;
  dlp_dtype dtype;
  int64_t* shape;
  int64_t* strides; /* in elements; NULL: compact row-major */
  uint64_t byte_offset;
} dlp_tensor;

typedef struct dlp_managed {
  dlp_tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct dlp_managed*);
} dlp_managed;

typedef struct dlp_managed_v {
  dlp_version version;
  void* manager_ctx;
  void (*deleter)(struct dlp_managed_v*);
  uint64_t flags;
  dlp_tensor dl_tensor;
} dlp_managed_v;

#define DLP_FLAG_READ_ONLY 1ULL
#define DLP_FLAG_IS_COPIED 2ULL
#define DLP_VERSION_MAJOR 1
#define DLP_VERSION_MINOR 1 /* the float8 type codes are 1.1 */

static PyObject* int64_tuple(const int64_t* values, int32_t n);

static const char DLP_NAME[] = "dltensor";
static const char DLP_NAME_V[] = "dltensor_versioned";
static const char DLP_USED[] = "used_dltensor";
static const char DLP_USED_V[] = "used_dltensor_versioned";

/* ---- releases from other threads ------------------------------------------------
 * A view's memory is released by PJRT's on_delete_callback, an export's by
 * the consumer's deleter: either may run on a thread of the plugin (or of the
 * consumer's runtime) that does not hold the GIL, when the last execution
 * reading the memory ends there. Such a thread must not wait for the GIL: the
 * work queued behind it would wait too, until Python next lets go (measured:
 * some 20 us per call in a jax round trip). It queues the release instead,
 * and asks the interpreter to run the queue at its next chance
 * (Py_AddPendingCall, made for this). A thread that holds the GIL (a Destroy
 * called from Python) releases at once. */

typedef struct {
  void (*fn)(void*); /* runs with the GIL */
  void* arg;
} deferred;

static pthread_mutex_t g_deferred_mu = PTHREAD_MUTEX_INITIALIZER;
static deferred* g_deferred = NULL;
static size_t g_deferred_len = 0, g_deferred_cap = 0;
static int g_deferred_scheduled = 0;

/* In a child made by fork(): a PJRT thread of the parent may have held the
 * lock, and the interpreter's pending call is not ours to count on. The
 * queued releases stay; the next release or drain runs them. */
static void deferred_after_fork(void) {
  pthread_mutex_init(&g_deferred_mu, NULL);
  g_deferred_scheduled = 0;
}

/* Runs the queued releases. With the GIL. */
static int deferred_drain(void* unused) {
  (void)unused;
  for (;;) {
    pthread_mutex_lock(&g_deferred_mu);
    g_deferred_scheduled = 0;
    deferred* items = g_deferred;
    size_t n = g_deferred_len;
    g_deferred = NULL;
    g_deferred_len = g_deferred_cap = 0;
    pthread_mutex_unlock(&g_deferred_mu);
    if (n == 0) return 0;
    for (size_t i = 0; i < n; ++i) items[i].fn(items[i].arg);
    free(items);
  }
}

/* Runs fn(arg) with the GIL: now if this thread holds it, else soon on a
 * Python thread. Inside the gate (the caller entered it). */
static void run_with_gil(void (*fn)(void*), void* arg) {
  if (PyGILState_Check()) {
    fn(arg);
    return;
  }
  pthread_mutex_lock(&g_deferred_mu);
  int queued = 0, schedule = 0;
  if (g_deferred_len == g_deferred_cap) {
    size_t cap = g_deferred_cap ? 2 * g_deferred_cap : 16;
    deferred* grown = (deferred*)realloc(g_deferred, cap * sizeof(deferred));
    if (grown != NULL) {
      g_deferred = grown;
      g_deferred_cap = cap;
    }
  }
  if (g_deferred_len < g_deferred_cap) {
    g_deferred[g_deferred_len].fn = fn;
    g_deferred[g_deferred_len].arg = arg;
    g_deferred_len++;
    queued = 1;
    schedule = !g_deferred_scheduled;
    g_deferred_scheduled = 1;
  }
  pthread_mutex_unlock(&g_deferred_mu);
  if (schedule && Py_AddPendingCall(deferred_drain, NULL) < 0) {
    pthread_mutex_lock(&g_deferred_mu);
    g_deferred_scheduled = 0; /* the interpreter's queue is full: the next release asks again */
    pthread_mutex_unlock(&g_deferred_mu);
  }
  if (!queued) { /* no memory for the queue: wait for the GIL after all */
    PyGILState_STATE gil = PyGILState_Ensure();
    fn(arg);
    PyGILState_Release(gil);
  }
}

static void drop_reference(void* object) { Py_DECREF((PyObject*)object); }

/* ---- export ------------------------------------------------------------------ */

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
  buffer_free_if_unused(b);
  Py_DECREF(b);
  free(x);
}

/* Ends one export, on any thread (see run_with_gil). */
static void export_release(export_ctx* x) {
  if (!gate_enter()) return; /* past exit: the Buffer, its handle and x stay */
  run_with_gil(export_finish, x);
  gate_leave();
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

/* Element strides of b's on-device layout where it is dense, without tiles or
 * padding, in any dimension order (row-major, column-major, ...): 1 with
 * `strides` filled; else 0 (tiled, padded, or the plugin cannot say). */
static int buffer_layout_strides(BufferObject* b, size_t ndim, const int64_t* dims,
                                 int64_t* strides) {
  int64_t order[PJRT_PY_MAX_RANK];
  if (!buffer_minor_to_major(b, ndim, order)) return 0;
  unsigned char seen[PJRT_PY_MAX_RANK] = {0};
  int64_t step = 1;
  for (size_t k = 0; k < ndim; ++k) {
    int64_t axis = order[k];
    if (axis < 0 || (size_t)axis >= ndim || seen[axis]) return 0;
    seen[axis] = 1;
    strides[axis] = step;
    step *= dims[axis] > 0 ? dims[axis] : 1;
  }
  return 1;
}

/* Whether b is row-major (1) or in another layout the plugin reports (2);
 * asked once. A plugin that cannot say counts as row-major: its buffers are
 * what it made them. With the GIL; b is live. */
static int buffer_row_major_state(BufferObject* b, size_t ndim) {
  if (b->row_major != 0) return b->row_major;
  int state = 1;
  if (PJRT_PY_HAS(b->c->api, PJRT_Buffer_GetMemoryLayout)) {
    int64_t order[PJRT_PY_MAX_RANK];
    if (!buffer_minor_to_major(b, ndim, order)) state = 2; /* tiled or padded */
    for (size_t k = 0; state == 1 && k < ndim; ++k)
      if (order[k] != (int64_t)(ndim - 1 - k)) state = 2;
  }
  b->row_major = (unsigned char)state;
  return state;
}

/* _layout(): minor_to_major of the buffer's on-device layout, or None where
 * it is tiled or not reported. A buffer known to be row-major (made so, or
 * asked before) is not asked again. */
static PyObject* buffer_get_layout(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return NULL;
  size_t ndim = (size_t)PyTuple_Size(PyTuple_GetItem(meta, 0));
  int64_t order[PJRT_PY_MAX_RANK];
  if (b->row_major == 1 && PJRT_PY_HAS(b->c->api, PJRT_Buffer_GetMemoryLayout)) {
    for (size_t k = 0; k < ndim; ++k) order[k] = (int64_t)(ndim - 1 - k);
  } else if (!buffer_minor_to_major(b, ndim, order)) {
    Py_RETURN_NONE;
  }
  return int64_tuple(order, (int32_t)ndim);
}

/* The buffer's dims (from its metadata) into `dims`; its rank, or -1. */
static Py_ssize_t buffer_dims(BufferObject* b, int64_t* dims) {
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return -1;
  PyObject* shape = PyTuple_GetItem(meta, 0);
  Py_ssize_t ndim = PyTuple_Size(shape);
  for (Py_ssize_t i = 0; i < ndim; ++i) dims[i] = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
  return ndim;
}

/* _dlpack_layout_ok(): whether the buffer can be lent as is (dense, untiled,
 * any dimension order: the capsule then carries its strides). */
static PyObject* buffer_dlpack_layout_ok(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  int64_t dims[PJRT_PY_MAX_RANK], strides[PJRT_PY_MAX_RANK];
  Py_ssize_t ndim = buffer_dims(b, dims);
  if (ndim < 0) return NULL;
  return PyBool_FromLong(buffer_layout_strides(b, (size_t)ndim, dims, strides));
}

/* The CPU path of to_numpy for a buffer whose layout is dense but not
 * row-major (a program's output with another mhlo.layout_mode): numpy copies
 * it through its strides into the row-major `array`. PJRT_Buffer_ToHostBuffer
 * ignores the requested host layout on some builds (xla-cpu-pjrt 0.81 returns
 * the column-major bytes as they lie). Waits for the buffer. 1 if copied, 0 if
 * not this case, -1 with an exception. */
static int buffer_read_permuted(BufferObject* b, PyArrayObject* array) {
  int64_t dims[PJRT_PY_MAX_RANK], strides[PJRT_PY_MAX_RANK];
  Py_ssize_t ndim = PyArray_NDIM(array);
  for (Py_ssize_t i = 0; i < ndim; ++i) dims[i] = (int64_t)PyArray_DIMS(array)[i];
  if (!buffer_layout_strides(b, (size_t)ndim, dims, strides)) return 0;
  bool row_major = true;
  int64_t step = 1;
  for (Py_ssize_t i = ndim - 1; i >= 0; --i) {
    if (dims[i] != 1 && strides[i] != step) row_major = false;
    step *= dims[i] > 0 ? dims[i] : 1;
  }
  if (row_major) return 0;
  PyObject* ready = buffer_block_until_ready(b, NULL); /* raises the work's error */
  if (ready == NULL) return -1;
  Py_DECREF(ready);
  if (buffer_live(b) < 0) return -1; /* the wait let other threads run */
  const PJRT_Api* api = b->c->api;
  PJRT_Error* error = buffer_hold_memory(b);
  if (error != NULL) {
    raise_pjrt(api, error);
    return -1;
  }
  void* data = NULL;
  error = buffer_data_address(b, &data);
  int copied = -1;
  if (error != NULL) {
    raise_pjrt(api, error);
  } else {
    npy_intp byte_strides[PJRT_PY_MAX_RANK];
    npy_intp item = (npy_intp)PyArray_ITEMSIZE(array);
    for (Py_ssize_t i = 0; i < ndim; ++i) byte_strides[i] = (npy_intp)strides[i] * item;
    PyArray_Descr* descr = PyArray_DESCR(array);
    Py_INCREF(descr);
    PyObject* source = PyArray_NewFromDescr(&PyArray_Type, descr, (int)ndim, PyArray_DIMS(array),
                                            byte_strides, data, 0, NULL);
    if (source != NULL) {
      copied = PyArray_CopyInto(array, (PyArrayObject*)source) < 0 ? -1 : 1;
      Py_DECREF(source);
    }
  }
  buffer_release_memory(b);
  return copied;
}

/* _dlpack(code, bits, device_type, device_id, versioned, flags) -> capsule.
 * The caller (pjrt_py.dlpack) waited for the buffer and checked its layout;
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

/* ---- import ------------------------------------------------------------------ */

typedef struct {
  PyObject_HEAD
  void* managed;  /* dlp_managed or dlp_managed_v, owned: its deleter runs at dealloc */
  int versioned;
  dlp_tensor* t;
  uint64_t flags;
} TensorObject;

static PyTypeObject* TensorType;

static void tensor_dealloc(TensorObject* self) {
  if (self->managed != NULL) {
    if (self->versioned) {
      dlp_managed_v* m = (dlp_managed_v*)self->managed;
      if (m->deleter != NULL) m->deleter(m);
    } else {
      dlp_managed* m = (dlp_managed*)self->managed;
      if (m->deleter != NULL) m->deleter(m);
    }
  }
  PyTypeObject* type = Py_TYPE(self);
  PyObject_Free(self);
  Py_DECREF(type);
}

/* dlpack_unpack(capsule) -> Tensor, taking ownership of the managed tensor. */
static PyObject* core_dlpack_unpack(PyObject* module, PyObject* capsule) {
  (void)module;
  int versioned;
  if (PyCapsule_IsValid(capsule, DLP_NAME_V)) {
    versioned = 1;
  } else if (PyCapsule_IsValid(capsule, DLP_NAME)) {
    versioned = 0;
  } else {
    PyErr_SetString(PyExc_TypeError,
                    "expected an unconsumed DLPack capsule ('dltensor' or 'dltensor_versioned')");
    return NULL;
  }
  void* managed = PyCapsule_GetPointer(capsule, versioned ? DLP_NAME_V : DLP_NAME);
  if (managed == NULL) return NULL;
  dlp_tensor* t;
  uint64_t flags = 0;
  if (versioned) {
    dlp_managed_v* m = (dlp_managed_v*)managed;
    if (m->version.major != DLP_VERSION_MAJOR) {
      /* Not ours to take: the producer's capsule destructor frees it. */
      return PyErr_Format(PyExc_BufferError,
                          "DLPack version %u.%u is not supported (pjrt_py reads %d.x)",
                          (unsigned)m->version.major, (unsigned)m->version.minor,
                          DLP_VERSION_MAJOR);
    }
    t = &m->dl_tensor;
    flags = m->flags;
  } else {
    t = &((dlp_managed*)managed)->dl_tensor;
  }
  if (t->ndim < 0 || t->ndim > PJRT_PY_MAX_RANK || (t->ndim > 0 && t->shape == NULL)) {
    return PyErr_Format(PyExc_BufferError, "DLPack tensor of rank %d is not supported (max %d)",
                        (int)t->ndim, PJRT_PY_MAX_RANK);
  }
  TensorObject* self = PyObject_New(TensorObject, TensorType);
  if (self == NULL) return NULL;
  if (PyCapsule_SetName(capsule, versioned ? DLP_USED_V : DLP_USED) < 0) {
    self->managed = NULL;
    Py_DECREF(self);
    return NULL;
  }
  self->managed = managed;
  self->versioned = versioned;
  self->t = t;
  self->flags = flags;
  return (PyObject*)self;
}

static PyObject* int64_tuple(const int64_t* values, int32_t n) {
  PyObject* out = PyTuple_New(n);
  if (out == NULL) return NULL;
  for (int32_t i = 0; i < n; ++i) {
    PyObject* v = PyLong_FromLongLong(values[i]);
    if (v == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyTuple_SetItem(out, i, v);
  }
  return out;
}

static PyObject* tensor_get_shape(TensorObject* self, void* unused) {
  (void)unused;
  return int64_tuple(self->t->shape, self->t->ndim);
}

static PyObject* tensor_get_strides(TensorObject* self, void* unused) {
  (void)unused;
  if (self->t->strides == NULL) Py_RETURN_NONE;
  return int64_tuple(self->t->strides, self->t->ndim);
}

static PyObject* tensor_get_dtype(TensorObject* self, void* unused) {
  (void)unused;
  return Py_BuildValue("(iii)", self->t->dtype.code, self->t->dtype.bits, self->t->dtype.lanes);
}

static PyObject* tensor_get_device(TensorObject* self, void* unused) {
  (void)unused;
  return Py_BuildValue("(ii)", self->t->device.device_type, self->t->device.device_id);
}

static PyObject* tensor_get_data(TensorObject* self, void* unused) {
  (void)unused;
  return PyLong_FromVoidPtr((char*)self->t->data + self->t->byte_offset);
}

static PyObject* tensor_get_read_only(TensorObject* self, void* unused) {
  (void)unused;
  return PyBool_FromLong((self->flags & DLP_FLAG_READ_ONLY) != 0);
}

static PyObject* tensor_get_versioned(TensorObject* self, void* unused) {
  (void)unused;
  return PyBool_FromLong(self->versioned);
}

/* as_array(dtype) -> a numpy array over the tensor's memory (host devices
 * only; the caller checked), keeping this Tensor alive as its base. */
static PyObject* tensor_as_array(TensorObject* self, PyObject* dtype) {
  PyArray_Descr* descr = NULL;
  if (!PyArray_DescrConverter(dtype, &descr)) return NULL;
  dlp_tensor* t = self->t;
  npy_intp dims[PJRT_PY_MAX_RANK], strides[PJRT_PY_MAX_RANK];
  npy_intp item = (npy_intp)PyDataType_ELSIZE(descr);
  npy_intp step = item;
  for (int i = t->ndim - 1; i >= 0; --i) {
    dims[i] = (npy_intp)t->shape[i];
    strides[i] = t->strides ? (npy_intp)t->strides[i] * item : step;
    step *= dims[i] > 0 ? dims[i] : 1;
  }
  int flags = (self->flags & DLP_FLAG_READ_ONLY) ? 0 : NPY_ARRAY_WRITEABLE;
  PyObject* array = PyArray_NewFromDescr(&PyArray_Type, descr, t->ndim, dims, strides,
                                         (char*)t->data + t->byte_offset, flags, NULL);
  if (array == NULL) return NULL;
  Py_INCREF(self);
  if (PyArray_SetBaseObject((PyArrayObject*)array, (PyObject*)self) < 0) {
    Py_DECREF(array);
    return NULL;
  }
  PyArray_UpdateFlags((PyArrayObject*)array, NPY_ARRAY_UPDATE_ALL);
  return array;
}

static PyMethodDef tensor_methods[] = {
    {"as_array", (PyCFunction)tensor_as_array, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_getset[] = {
    {"shape", (getter)tensor_get_shape, NULL, NULL, NULL},
    {"strides", (getter)tensor_get_strides, NULL, "In elements; None: compact row-major.", NULL},
    {"dtype", (getter)tensor_get_dtype, NULL, "(code, bits, lanes)", NULL},
    {"device", (getter)tensor_get_device, NULL, "(device_type, device_id)", NULL},
    {"data", (getter)tensor_get_data, NULL, "The address of the first element.", NULL},
    {"read_only", (getter)tensor_get_read_only, NULL, NULL, NULL},
    {"versioned", (getter)tensor_get_versioned, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot tensor_slots[] = {
    {Py_tp_doc, "A DLPack tensor pjrt_py took from a producer (internal)."},
    {Py_tp_dealloc, tensor_dealloc},
    {Py_tp_methods, tensor_methods},
    {Py_tp_getset, tensor_getset},
    {0, NULL},
};

static PyType_Spec tensor_spec = {"pjrt_py._core.DLPackTensor", sizeof(TensorObject), 0,
                                  Py_TPFLAGS_DEFAULT, tensor_slots};

/* PJRT is done with a view's memory: the Tensor goes, and with it the producer's. */
static void view_released(void* device_buffer_ptr, void* arg) {
  (void)device_buffer_ptr;
  if (!gate_enter()) return; /* exiting: the producer's memory outlives every reader */
  run_with_gil(drop_reference, arg);
  gate_leave();
}

/* drain_releases(): run the queued releases now (tests). */
static PyObject* core_drain_releases(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  deferred_drain(NULL);
  Py_RETURN_NONE;
}

/* A Buffer viewing the tensor's memory on `device` (no copy), or NULL with an
 * exception. The caller checked dtype, alignment and layout. */
static BufferObject* tensor_view(PyObject* client, pjrt_py_client* c, TensorObject* tensor,
                                 int type, PJRT_Device* device, PyObject* meta, intptr_t stream) {
  dlp_tensor* t = tensor->t;
  PJRT_Client_CreateViewOfDeviceBuffer_Args args = {0};
  args.struct_size = PJRT_Client_CreateViewOfDeviceBuffer_Args_STRUCT_SIZE;
  args.client = c->client;
  args.device_buffer_ptr = (char*)t->data + t->byte_offset;
  args.dims = t->shape;
  args.num_dims = (size_t)t->ndim;
  args.element_type = (PJRT_Buffer_Type)type;
  args.device = device;
  args.on_delete_callback = view_released;
  args.on_delete_callback_arg = tensor;
  args.stream = stream; /* where the producer made the data ready (GPU), or 0 */
  Py_INCREF(tensor); /* dropped by view_released */
  PJRT_Error* error = c->api->PJRT_Client_CreateViewOfDeviceBuffer(&args);
  if (error != NULL) {
    Py_DECREF(tensor); /* no view: PJRT will not call back */
    return (BufferObject*)raise_pjrt(c->api, error);
  }
  BufferObject* b = buffer_wrap(client, c, args.buffer, meta);
  if (b == NULL) return NULL;
  b->host_aliased = 1; /* memory the producer owns: never donated */
  b->row_major = 1;    /* viewed with no layout given: the default, row-major */
  return b;
}
