/* DLPack import: taking another framework's memory.
 *
 * dlpack_unpack() takes ownership of a producer's capsule into a Tensor
 * object; its dealloc calls the producer's deleter. A zero-copy view
 * (client.c: _view) holds the Tensor until PJRT's on_delete_callback says the
 * PJRT buffer is done with the memory (view_released, through releases.c).
 */
#include "dlpack.h"

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

/* dlpack_capsule_device(capsule) -> (device type, id) of an unconsumed
 * capsule, read without taking it; None for anything else. */
static PyObject* core_dlpack_capsule_device(PyObject* module, PyObject* capsule) {
  (void)module;
  int versioned = PyCapsule_IsValid(capsule, DLP_NAME_V);
  if (!versioned && !PyCapsule_IsValid(capsule, DLP_NAME)) Py_RETURN_NONE;
  void* managed = PyCapsule_GetPointer(capsule, versioned ? DLP_NAME_V : DLP_NAME);
  if (managed == NULL) return NULL;
  const dlp_tensor* t = &((const dlp_managed*)managed)->dl_tensor;
  if (versioned) {
    const dlp_managed_v* m = (const dlp_managed_v*)managed;
    if (m->version.major != DLP_VERSION_MAJOR) Py_RETURN_NONE; /* its layout is unknown */
    t = &m->dl_tensor;
  }
  return Py_BuildValue("(ii)", (int)t->device.device_type, (int)t->device.device_id);
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

/* as_array(dtype) -> a numpy array over the tensor's memory, keeping this
 * Tensor alive as its base. Host memory only: anything else is a
 * BufferError here, since numpy would read a device pointer from the host. */
static PyObject* tensor_as_array(TensorObject* self, PyObject* dtype) {
  int kind = self->t->device.device_type;
  if (kind != 1 && kind != 3 && kind != 11 && kind != 13) /* CPU, CUDA/ROCm host, managed */
    return PyErr_Format(PyExc_BufferError,
                        "a tensor on DLPack device type %d is not in host memory", kind);
  PyArray_Descr* descr = NULL;
  if (!PyArray_DescrConverter(dtype, &descr)) return NULL;
  dlp_tensor* t = self->t;
  int64_t bits = (int64_t)t->dtype.bits * t->dtype.lanes, size = PyDataType_ELSIZE(descr);
  if (PyDataType_REFCHK(descr) || !(bits == 8 * size || (bits < 8 && size == 1))) {
    Py_DECREF(descr); /* packed sub-byte elements are read a byte each */
    PyErr_SetString(PyExc_ValueError, "as_array: the dtype is not the tensor's element size");
    return NULL;
  }
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

/* Made only by dlpack_unpack: one made from Python would hold no tensor. */
static PyType_Spec tensor_spec = {"pjrt_py._core.DLPackTensor", sizeof(TensorObject), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                  tensor_slots};

/* Who releases a view's Tensor. PJRT calls on_delete_callback once the view's
 * memory is done with; but a failed CreateViewOfDeviceBuffer may also call it
 * during the call (XLA's GPU client wraps the pointer, callback included,
 * before the steps that can fail) or never (its CPU client checks first).
 * The state says which side drops the reference, exactly once. */
enum { VIEW_PENDING, VIEW_OWNED, VIEW_ABANDONED, VIEW_FIRED };
typedef struct {
  TensorObject* tensor; /* a strong reference, until released */
  int state;            /* atomic */
} view_token;

/* PJRT is done with a view's memory: the Tensor goes, and with it the producer's. */
static void view_released(void* device_buffer_ptr, void* arg) {
  (void)device_buffer_ptr;
  view_token* token = (view_token*)arg;
  TensorObject* tensor = token->tensor;
  int was = __atomic_exchange_n(&token->state, VIEW_FIRED, __ATOMIC_ACQ_REL);
  if (was != VIEW_ABANDONED) /* Exiting: the producer's memory outlives every reader. */
    run_with_gil_unless_exiting(drop_reference, tensor);
  if (was != VIEW_PENDING) free(token); /* else the creating call frees it */
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
  view_token* token = (view_token*)malloc(sizeof(view_token));
  if (token == NULL) return (BufferObject*)PyErr_NoMemory();
  token->tensor = tensor;
  token->state = VIEW_PENDING;
  args.on_delete_callback = view_released;
  args.on_delete_callback_arg = token;
  args.stream = stream; /* where the producer made the data ready (GPU), or 0 */
  Py_INCREF(tensor); /* dropped once, by view_released or below (view_token) */
  PJRT_Error* error = c->api->PJRT_Client_CreateViewOfDeviceBuffer(&args);
  int was = error != NULL
                ? __atomic_exchange_n(&token->state, VIEW_ABANDONED, __ATOMIC_ACQ_REL)
                : __sync_val_compare_and_swap(&token->state, VIEW_PENDING, VIEW_OWNED);
  if (was == VIEW_FIRED) free(token); /* released during the call */
  if (error != NULL) {
    /* Not released yet: drop it here. Should PJRT call back later after all,
     * view_released frees the token and drops nothing. */
    if (was == VIEW_PENDING) Py_DECREF(tensor);
    return (BufferObject*)raise_pjrt(c->api, error);
  }
  BufferObject* b = buffer_wrap_uncounted(client, c, args.buffer, meta);
  if (b == NULL) return NULL;
  b->host_aliased = 1; /* memory the producer owns: never donated */
  b->row_major = 1;    /* viewed with no layout given: the default, row-major */
  return b;
}
