/* ClientCore: the base of pjrt_py.Client, owning its reference on the
 * reference-counted PJRT client (client_ref.c).
 *
 * close() marks the client closed (new work on it or its objects raises) and
 * drops this object's reference; the PJRT client goes with the last one.
 * After close the struct may be freed, so this object never reads it again,
 * except to balance a pin taken before (a pin holds a reference).
 */
#include "promise.h"
#include "dlpack.h"

#define PJRT_PY_STAGED_COPY_BYTES (32 << 20) /* see STAGED_COPY_BYTES in buffer.py */

static PyTypeObject* ClientCoreType;

static PyObject* client_core_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  (void)args;
  (void)kwargs;
  ClientCoreObject* self = (ClientCoreObject*)PyType_GenericAlloc(type, 0);
  return (PyObject*)self;
}

/* Checked access: the struct, or NULL with ValueError. */
static pjrt_py_client* client_core_open(ClientCoreObject* self) {
  if (self->c == NULL) {
    PyErr_SetString(PyExc_ValueError, "client is closed");
    return NULL;
  }
  if (state_check_usable(self->c, "this object") < 0) {
    if (self->c->generation != g_generation) return NULL; /* the fork message says it */
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "client is closed");
    return NULL;
  }
  return self->c;
}

/* _attach(api, client, cpu, kv=None): take ownership of a PJRT_Client (and
 * of the key-value store holder its callbacks were given, kv_store.c). */
static PyObject* client_core_attach(ClientCoreObject* self, PyObject* args) {
  PyObject *api_address, *client_address, *kv_address = Py_None;
  int cpu;
  if (!PyArg_ParseTuple(args, "OOp|O:_attach", &api_address, &client_address, &cpu, &kv_address))
    return NULL;
  void* kv = kv_address == Py_None ? NULL : PyLong_AsVoidPtr(kv_address);
  if (PyErr_Occurred()) return NULL;
  if (self->c != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "client already attached");
    return NULL;
  }
  const PJRT_Api* api = address_of_api(api_address);
  PJRT_Client* client = (PJRT_Client*)PyLong_AsVoidPtr(client_address);
  if (api == NULL || client == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "NULL PJRT_Client");
    return NULL;
  }
  self->c = client_new(api, client, cpu);
  if (self->c == NULL) {
    PJRT_Client_Destroy_Args d = {0};
    d.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
    d.client = client;
    error_destroy(api, api->PJRT_Client_Destroy(&d));
    if (kv != NULL) kv_holder_release(kv);
    return PyErr_NoMemory();
  }
  self->c->kv = kv;
  Py_RETURN_NONE;
}

/* _set_devices(places): ((device, memory or None), ...), the addressable
 * devices with their default memories; the first device is where
 * buffer_async puts data. Once, at creation. */
static PyObject* client_core_set_devices(ClientCoreObject* self, PyObject* places) {
  pjrt_py_client* c = client_core_open(self);
  if (c == NULL) return NULL;
  if (!PyTuple_Check(places) || PyTuple_Size(places) < 1 || c->num_places != 0) {
    PyErr_SetString(PyExc_ValueError, "_set_devices: a tuple of (device, memory), once");
    return NULL;
  }
  size_t n = (size_t)PyTuple_Size(places);
  PJRT_Device** devices = (PJRT_Device**)calloc(n, sizeof(PJRT_Device*));
  PJRT_Memory** memories = (PJRT_Memory**)calloc(n, sizeof(PJRT_Memory*));
  if (devices == NULL || memories == NULL) {
    free(devices);
    free(memories);
    return PyErr_NoMemory();
  }
  for (size_t i = 0; i < n && !PyErr_Occurred(); ++i) {
    PyObject *device, *memory;
    if (!PyArg_ParseTuple(PyTuple_GetItem(places, (Py_ssize_t)i), "OO", &device, &memory)) break;
    devices[i] = (PJRT_Device*)PyLong_AsVoidPtr(device);
    if (memory != Py_None) memories[i] = (PJRT_Memory*)PyLong_AsVoidPtr(memory);
  }
  if (PyErr_Occurred()) {
    free(devices);
    free(memories);
    return NULL;
  }
  c->place_devices = devices;
  c->place_memories = memories;
  c->num_places = n;
  c->default_device = devices[0];
  Py_RETURN_NONE;
}

static PyObject* client_core_close(ClientCoreObject* self, PyObject* unused) {
  (void)unused;
  pjrt_py_client* c = self->c;
  if (c == NULL) Py_RETURN_NONE;
  self->c = NULL;
  __atomic_store_n(&c->closed, 1, __ATOMIC_RELEASE);
  client_unref(c);
  Py_RETURN_NONE;
}

/* _cpu_fast_paths: the CPU-only paths (direct reads of ready buffers) are on.
 * Set from the platform name; benchmarks turn it off to time the plugin's own
 * copies. */
static PyObject* client_core_get_cpu(ClientCoreObject* self, void* unused) {
  (void)unused;
  return PyBool_FromLong(self->c != NULL && self->c->cpu);
}

static int client_core_set_cpu(ClientCoreObject* self, PyObject* value, void* unused) {
  (void)unused;
  int truth = value ? PyObject_IsTrue(value) : -1;
  if (truth < 0) return -1;
  if (client_core_open(self) == NULL) return -1;
  self->c->cpu = truth;
  return 0;
}

/* _handle: the PJRT_Client* (0 once closed), for C baselines and tests. */
static PyObject* client_core_get_handle(ClientCoreObject* self, void* unused) {
  (void)unused;
  return PyLong_FromVoidPtr(self->c ? self->c->client : NULL);
}

/* _closed_reason(what) -> why `what` (the name of one of this client's
 * objects, or None for the client itself) cannot be used now, or None. */
static PyObject* client_core_closed_reason(ClientCoreObject* self, PyObject* what) {
  static const char fork[] =
      "created before os.fork() in the parent process; create a new pjrt_py.Client in this "
      "process";
  bool own = what == Py_None;
  if (!own && !PyUnicode_Check(what)) {
    PyErr_SetString(PyExc_TypeError, "_closed_reason takes a str or None");
    return NULL;
  }
  if (self->c != NULL && self->c->generation != g_generation) {
    if (own) return PyUnicode_FromFormat("client was %s", fork);
    return PyUnicode_FromFormat("%U belongs to a client %s", what, fork);
  }
  if (self->c == NULL) {
    if (own) return PyUnicode_FromString("client is closed");
    return PyUnicode_FromFormat("%U belongs to a closed client", what);
  }
  if (phase() != PHASE_RUNNING) return PyUnicode_FromString("the interpreter is exiting");
  Py_RETURN_NONE;
}

static PyObject* client_core_get_closed(ClientCoreObject* self, void* unused) {
  (void)unused;
  return PyBool_FromLong(self->c == NULL || self->c->generation != g_generation);
}

/* _pin() -> (PJRT_Client address, token): the client is held for a PJRT call
 * the cffi layer makes without the GIL, until _unpin(token). The token names
 * the struct, which the pin keeps alive even if close() runs meanwhile. */
static PyObject* client_core_pin(ClientCoreObject* self, PyObject* unused) {
  (void)unused;
  pjrt_py_client* c = client_core_open(self);
  if (c == NULL || client_enter(c, "client") < 0) return NULL;
  PyObject* token = PyCapsule_New(c, "pjrt_py_client", NULL);
  if (token == NULL) {
    client_leave(c);
    return NULL;
  }
  return Py_BuildValue("(NN)", PyLong_FromVoidPtr(c->client), token);
}

static PyObject* client_core_unpin(ClientCoreObject* self, PyObject* token) {
  (void)self;
  pjrt_py_client* c = (pjrt_py_client*)PyCapsule_GetPointer(token, "pjrt_py_client");
  if (c == NULL) return NULL;
  if (PyCapsule_SetName(token, "pjrt_py_client (released)") < 0) return NULL; /* once only */
  client_leave(c);
  Py_RETURN_NONE;
}

static PyObject* client_core_running(ClientCoreObject* self, PyObject* unused) {
  (void)unused;
  pjrt_py_client* c = client_core_open(self);
  return c ? PyLong_FromLong(completion_running(c)) : NULL;
}

static PyObject* client_core_refs(ClientCoreObject* self, PyObject* unused) {
  (void)unused;
  if (self->c == NULL) return PyLong_FromLong(-1);
  return PyLong_FromLong(self->c->refs);
}

/* _from_host(array, type, semantics, device, meta, host_aliased, memory=None)
 * -> Buffer: the general host-to-device primitive (host_aliased: 0, 1 or 2, as
 * host_to_device takes it). `array` is C-contiguous;
 * the caller chose the semantics (copy, zero-copy) and the memory (an address,
 * checked), and checked everything else. */
static PyObject* client_core_from_host(ClientCoreObject* self, PyObject* args) {
  PyObject *array, *device_address, *meta, *memory_address = Py_None;
  int type, semantics, host_aliased;
  if (!PyArg_ParseTuple(args, "O!iiOOi|O:_from_host", &PyArray_Type, &array, &type, &semantics,
                        &device_address, &meta, &host_aliased, &memory_address))
    return NULL;
  pjrt_py_client* c = client_core_open(self);
  if (c == NULL) return NULL;
  if (!PyArray_IS_C_CONTIGUOUS((PyArrayObject*)array)) {
    PyErr_SetString(PyExc_ValueError, "_from_host needs a C-contiguous array");
    return NULL;
  }
  if (PyArray_NDIM((PyArrayObject*)array) > PJRT_PY_MAX_RANK) {
    return PyErr_Format(PyExc_ValueError, "arrays of rank %d are not supported (max %d)",
                        PyArray_NDIM((PyArrayObject*)array), PJRT_PY_MAX_RANK);
  }
  int64_t dims[PJRT_PY_MAX_RANK];
  for (int i = 0; i < PyArray_NDIM((PyArrayObject*)array); ++i)
    dims[i] = (int64_t)PyArray_DIMS((PyArrayObject*)array)[i];
  if (meta_check(meta, type, PyArray_NDIM((PyArrayObject*)array), dims,
                 PyArray_DESCR((PyArrayObject*)array)) < 0)
    return NULL;
  PJRT_Device* device = (PJRT_Device*)PyLong_AsVoidPtr(device_address);
  PJRT_Memory* memory =
      memory_address == Py_None ? NULL : (PJRT_Memory*)PyLong_AsVoidPtr(memory_address);
  if (PyErr_Occurred()) return NULL;
  return (PyObject*)host_to_device((PyObject*)self, c, (PyArrayObject*)array, type, semantics,
                                   device, memory, meta, host_aliased);
}

/* _view(tensor, type, device, meta, stream=0) -> Buffer: a zero-copy view of a DLPack
 * tensor's memory (see dlpack_import.c). pjrt_py.interop.dlpack checked the plugin has
 * CreateViewOfDeviceBuffer, the dtype, the alignment and the layout. */
static PyObject* client_core_view(ClientCoreObject* self, PyObject* args) {
  PyObject *tensor, *device_address, *meta;
  int type;
  Py_ssize_t stream = 0;
  if (!PyArg_ParseTuple(args, "O!iOO|n:_view", TensorType, &tensor, &type, &device_address, &meta,
                        &stream))
    return NULL;
  pjrt_py_client* c = client_core_open(self);
  if (c == NULL) return NULL;
  if (!PJRT_PY_HAS(c->api, PJRT_Client_CreateViewOfDeviceBuffer)) {
    PyErr_SetString(PyExc_BufferError, "the plugin cannot view memory it does not own");
    return NULL;
  }
  dlp_tensor* t = ((TensorObject*)tensor)->t;
  if (meta_check(meta, type, t->ndim, t->shape, NULL) < 0) return NULL;
  PyArray_Descr* descr = (PyArray_Descr*)PyTuple_GetItem(meta, 1);
  if ((int64_t)t->dtype.bits * t->dtype.lanes != 8 * (int64_t)PyDataType_ELSIZE(descr)) {
    PyErr_SetString(PyExc_ValueError, "_view: the tensor's elements are not of the type's size");
    return NULL;
  }
  PJRT_Device* device = (PJRT_Device*)PyLong_AsVoidPtr(device_address);
  if (PyErr_Occurred()) return NULL;
  return (PyObject*)tensor_view((PyObject*)self, c, (TensorObject*)tensor, type, device, meta,
                                (intptr_t)stream);
}

/* _ready_stream(device) -> int | None: see stream.c. */
static PyObject* client_core_ready_stream(ClientCoreObject* self, PyObject* device_address) {
  pjrt_py_client* c = client_core_open(self);
  return c == NULL ? NULL : stream_for_device(c, device_address);
}

/* buffer_async(value, device=None, *, zero_copy=False): the common case (a
 * numpy array of a supported dtype, C-contiguous, smaller than the staged-copy
 * size, to the default device) in C; anything else in Python. */
static PyObject* client_core_buffer_async(ClientCoreObject* self, PyObject* const* args,
                                          Py_ssize_t nargs, PyObject* kwnames) {
  pjrt_py_client* c = self->c;
  bool fast = nargs == 1 && kwnames == NULL && c != NULL && c->default_device != NULL &&
              PyArray_CheckExact(args[0]);
  PyArrayObject* array = fast ? (PyArrayObject*)args[0] : NULL;
  int type = -1;
  if (fast) {
    type = pjrt_type_of(PyArray_DESCR(array));
    fast = type >= 0 && PyArray_IS_C_CONTIGUOUS(array) && PyArray_ISALIGNED(array) &&
           PyArray_NDIM(array) <= PJRT_PY_MAX_RANK && state_check_usable(c, "client") == 0 &&
           (!c->cpu || PyArray_NBYTES(array) < PJRT_PY_STAGED_COPY_BYTES);
    PyErr_Clear();
  }
  if (!fast) return call_python_method((PyObject*)self, "_buffer_async_slow", args, nargs, kwnames);
  PyObject* meta = meta_of_array(array);
  if (meta == NULL) return NULL;
  BufferObject* b = host_to_device((PyObject*)self, c, array, type,
                                   PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
                                   c->default_device, NULL, meta, 0);
  Py_DECREF(meta);
  if (b == NULL) return NULL;
  PyObject* promise = promise_of_one(b);
  Py_DECREF(b);
  return promise;
}

static void client_core_dealloc(ClientCoreObject* self) {
  PyObject_GC_UnTrack(self);
  if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject*)self);
  Py_CLEAR(self->dict);
  pjrt_py_client* c = self->c;
  self->c = NULL;
  if (c != NULL) client_unref(c);
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

static int client_core_traverse(ClientCoreObject* self, visitproc visit, void* arg) {
  Py_VISIT(self->dict);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static int client_core_clear(ClientCoreObject* self) {
  Py_CLEAR(self->dict);
  return 0;
}

static PyMethodDef client_core_methods[] = {
    {"buffer_async", (PyCFunction)(void (*)(void))client_core_buffer_async,
     METH_FASTCALL | METH_KEYWORDS,
     "buffer_async($self, /, value, device=None, *, zero_copy=False, memory=None)\n--\n\n"
     "Start moving a numpy array or scalar to device; returns a BufferPromise at once.\n\n"
     "The data is copied: changing value after this returns does not change the device\n"
     "buffer. zero_copy=True (CPU only, 64-byte aligned C-contiguous arrays) makes the\n"
     "buffer alias value instead: the array is kept alive with the buffer, and writing\n"
     "to it changes the buffer's contents -- the caller must not."},
    {"_attach", (PyCFunction)client_core_attach, METH_VARARGS, NULL},
    {"_set_devices", (PyCFunction)client_core_set_devices, METH_O, NULL},
    {"_close", (PyCFunction)client_core_close, METH_NOARGS, NULL},
    {"_pin", (PyCFunction)client_core_pin, METH_NOARGS, NULL},
    {"_unpin", (PyCFunction)client_core_unpin, METH_O, NULL},
    {"_running", (PyCFunction)client_core_running, METH_NOARGS, NULL},
    {"_closed_reason", (PyCFunction)client_core_closed_reason, METH_O, NULL},
    {"_refs", (PyCFunction)client_core_refs, METH_NOARGS, NULL},
    {"_from_host", (PyCFunction)client_core_from_host, METH_VARARGS, NULL},
    {"_view", (PyCFunction)client_core_view, METH_VARARGS, NULL},
    {"_ready_stream", (PyCFunction)client_core_ready_stream, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_core_getset[] = {
    {"closed", (getter)client_core_get_closed, NULL,
     "True after close(), or in a process forked after the client was made.", NULL},
    {"_handle", (getter)client_core_get_handle, NULL, NULL, NULL},
    {"_cpu_fast_paths", (getter)client_core_get_cpu, (setter)client_core_set_cpu, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef client_core_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(ClientCoreObject, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ClientCoreObject, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot client_core_slots[] = {
    {Py_tp_doc, "The native part of pjrt_py.Client: its PJRT client reference."},
    {Py_tp_new, client_core_new},
    {Py_tp_dealloc, client_core_dealloc},
    {Py_tp_traverse, client_core_traverse},
    {Py_tp_clear, client_core_clear},
    {Py_tp_methods, client_core_methods},
    {Py_tp_getset, client_core_getset},
    {Py_tp_members, client_core_members},
    {0, NULL},
};

static PyType_Spec client_core_spec = {
    "pjrt_py._core.ClientCore", sizeof(ClientCoreObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE, client_core_slots,
};
