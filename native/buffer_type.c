/* pjrt_py.Buffer's Python face: reading data out, devices, copies and
 * pickling, and the type itself. Lifetime and metadata are in buffer.c. */
#include "staging.h"

/* ---- device to host -------------------------------------------------------------- */

/* A new numpy array, copied from b: returned (wait) or as an ArrayPromise.
 * Ready CPU buffers up to direct_limit bytes are read at once. Holds the
 * client for the call: another thread may delete b meanwhile (a large
 * direct read runs without the GIL), and then b no longer names it. */
static PyObject* buffer_copy_out(BufferObject* b, size_t direct_limit, int wait) {
  if (buffer_live(b) < 0) return NULL;
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return NULL;
  npy_intp dims[PJRT_PY_MAX_RANK];
  int ndim;
  PyArray_Descr* descr;
  if (meta_unpack(meta, dims, &ndim, &descr) < 0) return NULL;
  Py_INCREF(descr);
  PyObject* array = PyArray_Empty(ndim, dims, descr, 0);
  if (array == NULL) return NULL;
  /* An allocation may run the garbage collector, and a finalizer may let
   * another thread delete b: check again before using the handle. */
  if (buffer_live(b) < 0) {
    Py_DECREF(array);
    return NULL;
  }
  pjrt_py_client* c = b->c;
  client_ref(c);
  size_t nbytes = (size_t)PyArray_NBYTES((PyArrayObject*)array);
  void* data = PyArray_DATA((PyArrayObject*)array);
  PyObject* result = NULL;
  int permuted = 0;
  if (nbytes > 0 && staging_wanted(c, nbytes)) { /* large, and c stages copies (staging_d2h.c) */
    PyObject* staged = staged_from_device(b, array, (size_t)ndim);
    if (staged != STAGING_NOT_TAKEN) {
      result = wait ? promise_waited(staged) : staged;
      client_unref(c);
      return result;
    }
  }
  bool packed = PyArray_ITEMSIZE((PyArrayObject*)array) == 1 && /* numpy's packed: 1 byte */
                pjrt_type_packed(pjrt_type_of(PyArray_DESCR((PyArrayObject*)array)));
  if (nbytes == 0 ||
      (!packed && nbytes <= direct_limit && buffer_read_direct(b, data, nbytes, (size_t)ndim))) {
    result = wait ? array : promise_of_array(c, array, (PyObject*)b, NULL);
  } else if (c->cpu && !packed && buffer_dense_state(b, nbytes, (size_t)ndim) == 2 &&
             (permuted = buffer_read_permuted(b, (PyArrayObject*)array)) != 0) {
    /* A dense layout in another dimension order (layout.c); -1: an exception. */
    if (permuted < 0) {
      Py_DECREF(array);
    } else {
      result = wait ? array : promise_of_array(c, array, (PyObject*)b, NULL);
    }
  } else {
    PJRT_Event* done = NULL;
    PJRT_Error* error = buffer_to_host(b, data, nbytes, (size_t)ndim, &done);
    if (error != NULL) {
      Py_DECREF(array);
      raise_pjrt(c->api, error);
    } else {
      PyObject* promise = promise_of_array(c, array, (PyObject*)b, done);
      if (promise != NULL && wait) {
        result = promise_value_impl((PromiseObject*)promise, -1);
        Py_DECREF(promise);
      } else {
        result = promise;
      }
    }
  }
  client_unref(c);
  return result;
}

static PyObject* buffer_to_numpy_async(BufferObject* b, PyObject* unused) {
  (void)unused;
  return buffer_copy_out(b, PJRT_PY_DIRECT_READ_BYTES, 0);
}

/* The caller waits anyway: a ready CPU buffer of any size is read directly,
 * at memcpy speed (the plugin's own copy is slower for large buffers). */
static PyObject* buffer_to_numpy(BufferObject* b, PyObject* unused) {
  (void)unused;
  return buffer_copy_out(b, (size_t)-1, 1);
}

static PyObject* hook_host_view; /* (buffer, dtype) -> a read-only view, or ValueError */

/* numpy's conversion. copy=False (numpy 2) means a view or ValueError, never a
 * silent copy: the view is pjrt_py.interop.dlpack.host_view's. */
static PyObject* buffer_array(BufferObject* b, PyObject* args, PyObject* kwargs) {
  static char* names[] = {"dtype", "copy", NULL};
  PyObject* dtype = Py_None;
  PyObject* copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", names, &dtype, &copy))
    return NULL;
  if (copy == Py_False) {
    if (hook_host_view == NULL) {
      PyErr_SetString(PyExc_TypeError, "pjrt_py.interop.dlpack is not initialised");
      return NULL;
    }
    return PyObject_CallFunctionObjArgs(hook_host_view, (PyObject*)b, dtype, NULL);
  }
  PyObject* array = buffer_to_numpy(b, NULL);
  if (array == NULL || dtype == Py_None) return array;
  PyObject* astype = PyObject_GetAttrString(array, "astype");
  PyObject* pos = astype ? PyTuple_Pack(1, dtype) : NULL;
  PyObject* kw = pos ? Py_BuildValue("{s:O}", "copy", Py_False) : NULL;
  PyObject* cast = kw ? PyObject_Call(astype, pos, kw) : NULL;
  Py_XDECREF(kw);
  Py_XDECREF(pos);
  Py_XDECREF(astype);
  Py_DECREF(array);
  return cast;
}

/* Without the GIL, b pinned: XLA's CPU client waits for a buffer whose work has
 * not run; in a host or done callback block_until_ready refuses that wait. */
static PyObject* buffer_unsafe_pointer(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (callback_on_pjrt_thread() != NULL && b->state == BUF_LIVE && !buffer_ready_ok(b)) {
    PyObject* ready = buffer_block_until_ready(b, NULL);
    if (ready == NULL) return NULL;
    Py_DECREF(ready);
  }
  if (buffer_pin(b) < 0) return NULL;
  pjrt_py_client* c = b->c;
  client_enter_checked(c); /* b is live: c takes work */
  PJRT_Buffer_UnsafePointer_Args args = {0};
  args.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  PJRT_Error* error;
  Py_BEGIN_ALLOW_THREADS
  error = c->api->PJRT_Buffer_UnsafePointer(&args);
  Py_END_ALLOW_THREADS
  buffer_unpin(b); /* frees the handle now if another thread deleted b */
  client_leave(c);
  if (error != NULL) return raise_pjrt(c->api, error);
  return PyLong_FromUnsignedLongLong((unsigned long long)args.buffer_pointer);
}

/* ---- copies and pickling ------------------------------------------------------------
 * Like a jax.Array: copy.copy and copy.deepcopy make a new buffer with the
 * same data on the same device (memory.c); pickling stores the data and the
 * device id, and unpickling places it with pjrt_py.default_client() (see
 * pjrt_py.runtime.buffer._unpickle). */

static PyObject* buffer_reduce(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (hook_unpickle == NULL) {
    PyErr_SetString(PyExc_TypeError, "pjrt_py.runtime.buffer is not initialised");
    return NULL;
  }
  PyObject* device = buffer_get_device(b, NULL);
  if (device == NULL) return NULL;
  PyObject* id = PyObject_GetAttrString(device, "id");
  Py_DECREF(device);
  if (id == NULL) return NULL;
  PyObject* array = buffer_to_numpy(b, NULL);
  if (array == NULL) {
    Py_DECREF(id);
    return NULL;
  }
  PyObject* reduced = Py_BuildValue("O(NN)", hook_unpickle, array, id);
  return reduced;
}

/* ---- DLPack ------------------------------------------------------------------------
 * The protocol (versions, copy=, dl_device=, stream=) is decided in
 * pjrt_py/interop/dlpack.py; the capsule is made in dlpack_export.c. */

static PyObject* hook_dlpack;        /* (buffer, *args, **kwargs) -> capsule */
static PyObject* hook_dlpack_device; /* buffer -> (device_type, device_id) */

static PyObject* buffer_call_hook(PyObject* hook, BufferObject* b, PyObject* args,
                                  PyObject* kwargs) {
  if (hook == NULL) {
    PyErr_SetString(PyExc_TypeError, "pjrt_py.interop.dlpack is not initialised");
    return NULL;
  }
  Py_ssize_t n = args ? PyTuple_Size(args) : 0;
  PyObject* all = PyTuple_New(n + 1);
  if (all == NULL) return NULL;
  Py_INCREF(b);
  PyTuple_SetItem(all, 0, (PyObject*)b);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GetItem(args, i);
    Py_INCREF(item);
    PyTuple_SetItem(all, i + 1, item);
  }
  PyObject* result = PyObject_Call(hook, all, kwargs);
  Py_DECREF(all);
  return result;
}

static PyObject* buffer_dunder_dlpack(BufferObject* b, PyObject* args, PyObject* kwargs) {
  return buffer_call_hook(hook_dlpack, b, args, kwargs);
}

static PyObject* buffer_dunder_dlpack_device(BufferObject* b, PyObject* unused) {
  (void)unused;
  return buffer_call_hook(hook_dlpack_device, b, NULL, NULL);
}

static PyObject* buffer_repr(BufferObject* b) {
  if (b->state != BUF_LIVE) return PyUnicode_FromString("<Buffer deleted>");
  PyObject* meta = buffer_meta(b);
  PyObject* device = meta ? buffer_get_device(b, NULL) : NULL;
  if (device == NULL) PyErr_Clear(); /* a closed client: say what is known */
  if (meta == NULL) return PyUnicode_FromString("<Buffer (metadata unavailable)>");
  PyObject* shape = PySequence_List(PyTuple_GetItem(meta, 0));
  PyObject* dtype = PyTuple_GetItem(meta, 1);
  PyObject* text = shape == NULL ? NULL
                   : device      ? PyUnicode_FromFormat("<Buffer %S%S on %R>", dtype, shape, device)
                                 : PyUnicode_FromFormat("<Buffer %S%S, device unknown>", dtype, shape);
  Py_XDECREF(shape);
  Py_XDECREF(device);
  return text;
}

/* _origin: (device address, memory address, row_major) as known now, without
 * asking the plugin: None or 0 where not known yet (tests). */
static PyObject* buffer_get_origin(BufferObject* b, void* unused) {
  (void)unused;
  PyObject* device = b->device ? PyLong_FromVoidPtr(b->device) : (Py_INCREF(Py_None), Py_None);
  PyObject* memory = b->memory ? PyLong_FromVoidPtr(b->memory) : (Py_INCREF(Py_None), Py_None);
  PyObject* result = device && memory ? Py_BuildValue("(OOi)", device, memory, b->row_major) : NULL;
  Py_XDECREF(device);
  Py_XDECREF(memory);
  return result;
}

/* _plugin_origin(): the same triple, asked of the plugin afresh; what b
 * knows is left as it was (tests compare the two). */
static PyObject* buffer_plugin_origin(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return NULL;
  buffer_origin known = {b->device, b->memory, b->row_major};
  buffer_origin none = {NULL, NULL, 0};
  buffer_set_origin(b, &none);
  PJRT_Error* error = buffer_ask_device(b);
  buffer_memory(b);
  buffer_row_major_state(b, (size_t)PyTuple_Size(PyTuple_GetItem(meta, 0)));
  PyObject* said = error == NULL ? buffer_get_origin(b, NULL) : raise_pjrt(b->c->api, error);
  buffer_set_origin(b, &known);
  return said;
}

static PyMethodDef buffer_methods[] = {
    {"_plugin_origin", (PyCFunction)buffer_plugin_origin, METH_NOARGS, NULL},
    {"delete", (PyCFunction)buffer_delete, METH_NOARGS,
     "delete($self, /)\n--\n\n"
     "Free the device memory once pending work is done.\n\n"
     "Idempotent. The Buffer is dead to Python at once: later uses raise\n"
     "ValueError. Memory lent to a DLPack consumer is freed when it lets go."},
    {"is_ready", (PyCFunction)buffer_is_ready, METH_NOARGS,
     "is_ready($self, /)\n--\n\n"
     "Whether the buffer's data is there. Never blocks.\n\n"
     "Returns\n-------\nbool\n    True once the work that makes the data has completed (or failed)."},
    {"block_until_ready", (PyCFunction)buffer_block_until_ready, METH_NOARGS,
     "block_until_ready($self, /)\n--\n\n"
     "Wait until the data is there (the GIL released).\n\n"
     "Returns\n-------\nBuffer\n    This buffer.\n\n"
     "Raises\n------\nPjrtError\n    The error of the work that makes the data, if it failed.\n"
     "ValueError\n    If the buffer was deleted or donated."},
    {"to_numpy_async", (PyCFunction)buffer_to_numpy_async, METH_NOARGS,
     "to_numpy_async($self, /)\n--\n\n"
     "Start copying to a new numpy array (dense, row-major), at once.\n\n"
     "Returns\n-------\nArrayPromise\n    The array once the copy is done (value()).\n\n"
     "Raises\n------\nValueError\n    If the buffer was deleted or donated, or its client closed.\n"
     "TypeError\n    If its element type has no numpy dtype."},
    {"on_device_size_in_bytes", (PyCFunction)buffer_on_device_size, METH_NOARGS,
     "on_device_size_in_bytes($self, /)\n--\n\nBytes the buffer takes on its device, as the plugin "
     "counts them\n(packed int4 takes half its nbytes).\n\nReturns\n-------\nint"},
    {"to_numpy", (PyCFunction)buffer_to_numpy, METH_NOARGS,
     "to_numpy($self, /)\n--\n\n"
     "Copy to a new numpy array, waiting for the data.\n\n"
     "Returns\n-------\nnumpy.ndarray\n    A copy, dense and row-major, that the caller owns.\n\n"
     "Raises\n------\nPjrtError\n    The error of the work that makes the data, if it failed.\n"
     "ValueError\n    If the buffer was deleted or donated, or its client closed."},
    {"__array__", (PyCFunction)(void (*)(void))buffer_array, METH_VARARGS | METH_KEYWORDS, NULL},
    {"copy_to_device_async", (PyCFunction)buffer_copy_to_device_async, METH_O,
     "copy_to_device_async($self, device, /)\n--\n\n"
     "Start copying to another device of the same client, at once.\n\n"
     "PJRT_Buffer_CopyToDevice: the copy waits for this buffer's pending work on\n"
     "the device side, not on the host.\n\n"
     "Parameters\n----------\ndevice : Device\n    Where the copy goes; a Device of this buffer's client.\n\n"
     "Returns\n-------\nBufferPromise\n    The copy.\n\n"
     "Raises\n------\nValueError\n    If the device belongs to another client, or the buffer is dead."},
    {"copy_to_device", (PyCFunction)buffer_copy_to_device, METH_O,
     "copy_to_device($self, device, /)\n--\n\n"
     "Copy to another device of the same client, and wait until it is there.\n\n"
     "Parameters\n----------\ndevice : Device\n    Where the copy goes; a Device of this buffer's client.\n\n"
     "Returns\n-------\nBuffer\n    The copy, ready.\n\n"
     "Raises\n------\nValueError\n    If the device belongs to another client, or the buffer is dead.\n"
     "PjrtError\n    If the copy (or the work making this buffer) failed."},
    {"unsafe_pointer", (PyCFunction)buffer_unsafe_pointer, METH_NOARGS,
     "unsafe_pointer($self, /)\n--\n\n"
     "The buffer's device address as PJRT reports it (debugging only).\n\n"
     "Returns\n-------\nint\n    The address; meaningless once the buffer is freed."},
    {"copy_to_memory_async", (PyCFunction)buffer_copy_to_memory_async, METH_O,
     "copy_to_memory_async($self, memory, /)\n--\n\n"
     "Start copying to a memory space, at once (PJRT_Buffer_CopyToMemory).\n\n"
     "Parameters\n----------\nmemory : Memory or str\n"
     "    A Memory of this client, or a memory kind of this buffer's device\n"
     "    (\"pinned_host\", ...).\n\n"
     "Returns\n-------\nBufferPromise\n    The copy.\n\n"
     "Raises\n------\nUnsupportedError\n    Where the plugin lacks PJRT_Buffer_CopyToMemory.\n"
     "ValueError\n    For an unknown kind, another client's Memory, or a dead buffer."},
    {"copy_to_memory", (PyCFunction)buffer_copy_to_memory, METH_O,
     "copy_to_memory($self, memory, /)\n--\n\n"
     "Copy to a memory space, and wait until it is there.\n\n"
     "Parameters\n----------\nmemory : Memory or str\n"
     "    A Memory of this client, or a memory kind of this buffer's device.\n\n"
     "Returns\n-------\nBuffer\n    The copy, ready.\n\n"
     "Raises\n------\nUnsupportedError\n    Where the plugin lacks PJRT_Buffer_CopyToMemory.\n"
     "ValueError\n    For an unknown kind, another client's Memory, or a dead buffer."},
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dunder_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "A DLPack capsule of this buffer (the Python array API protocol; see\n"
     "docs/interop.md). Zero-copy on CPU: waits for the data first."},
    {"__dlpack_device__", (PyCFunction)buffer_dunder_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\n"
     "(DLPack device type, device id) of this buffer."},
    {"_dlpack", (PyCFunction)buffer_dlpack_export, METH_VARARGS, NULL},
    {"_dlpack_layout_ok", (PyCFunction)buffer_dlpack_layout_ok, METH_NOARGS, NULL},
    {"_wait_on_stream", (PyCFunction)buffer_wait_on_stream, METH_O, NULL},
    {"_layout", (PyCFunction)buffer_get_layout, METH_NOARGS, NULL},
    {"_metadata", (PyCFunction)buffer_metadata, METH_NOARGS, NULL},
    {"_pjrt_deleted", (PyCFunction)buffer_pjrt_deleted, METH_NOARGS, NULL},
    {"_retire_donated", (PyCFunction)buffer_retire_donated, METH_NOARGS, NULL},
    {"__complex__", (PyCFunction)buffer_complex, METH_NOARGS, NULL},
    {"__format__", (PyCFunction)buffer_format, METH_O, NULL},
    {"__copy__", (PyCFunction)buffer_copy, METH_NOARGS, NULL},
    {"__deepcopy__", (PyCFunction)buffer_deepcopy, METH_O, NULL},
    {"__reduce__", (PyCFunction)buffer_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyObject* buffer_get_itemsize(BufferObject* b, void* unused) {
  (void)unused;
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return NULL;
  return PyLong_FromSsize_t((Py_ssize_t)PyDataType_ELSIZE((PyArray_Descr*)PyTuple_GetItem(meta, 1)));
}

static PyGetSetDef buffer_getset[] = {
    {"shape", (getter)buffer_get_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"dtype", (getter)buffer_get_dtype, NULL, "The numpy dtype.", NULL},
    {"ndim", (getter)buffer_get_ndim, NULL, "The number of dimensions.", NULL},
    {"size", (getter)buffer_get_size, NULL, "The number of elements.", NULL},
    {"nbytes", (getter)buffer_get_nbytes, NULL, "The size of the data in bytes (dense).", NULL},
    {"itemsize", (getter)buffer_get_itemsize, NULL, "The size of one element in bytes (numpy's).",
     NULL},
    {"device", (getter)buffer_get_device, NULL, "The Device holding the data.", NULL},
    {"client", (getter)buffer_get_client, NULL, "The Client that owns the buffer.", NULL},
    {"is_deleted", (getter)buffer_get_is_deleted, NULL, "Deleted, or donated to an execution.",
     NULL},
    {"memory", (getter)buffer_get_memory, NULL, "The Memory holding the data.", NULL},
    {"_meta", (getter)buffer_get_meta, NULL, NULL, NULL},
    {"_exports", (getter)buffer_get_exports, NULL, NULL, NULL},
    {"_host_aliased", (getter)buffer_get_host_aliased, NULL, NULL, NULL},
    {"_handle", (getter)buffer_get_handle, NULL, NULL, NULL},
    {"_origin", (getter)buffer_get_origin, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef buffer_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(BufferObject, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot buffer_slots[] = {
    {Py_tp_doc, "An array on a device, owned by a pjrt_py.Client.\n\n"
                "Made by Client.buffer / Client.buffer_async or by executions. Shape,\n"
                "dtype and device are read from PJRT on first use."},
    {Py_tp_new, buffer_new},
    {Py_tp_dealloc, buffer_dealloc},
    {Py_tp_traverse, buffer_traverse},
    {Py_tp_repr, buffer_repr},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {Py_tp_members, buffer_members},
    {Py_nb_bool, buffer_nb_bool}, /* buffer_scalar.c */
    {Py_nb_int, buffer_nb_int},
    {Py_nb_float, buffer_nb_float},
    {Py_nb_index, buffer_nb_index},
    {0, NULL},
};

static PyType_Spec buffer_spec = {
    "pjrt_py.Buffer", sizeof(BufferObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    buffer_slots,
};
