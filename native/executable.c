/* ExecutableCore: the base of pjrt_py.Executable, holding its dispatch fast
 * path (the compiled program itself is a Loaded, loaded.c).
 *
 * The fast path runs a call from its arguments to the returned promise in C:
 * every argument a live Buffer (or a one-buffer BufferPromise) of this client
 * whose interned (shape, dtype) is the one compiled for, a small numpy array
 * of exactly that shape and dtype (copied here, foreign.c), or on CPU another
 * framework's array viewed in place (foreign.c); no keywords, a one-device
 * program that donates nothing (several devices: sharded.c). Anything else goes to the Python method
 * _execute_async_slow, which checks, transfers and explains.
 *
 * During the call the arguments are pinned and the Loaded object held, so a
 * delete() from another thread cannot free what PJRT is reading; the GIL is
 * released around PJRT_LoadedExecutable_Execute.
 */
#include "executable.h"

/* ---- ExecutableCore -------------------------------------------------------------- */

static PyObject* executable_execute_async(ExecutableCoreObject* self, PyObject* const* args,
                                          Py_ssize_t nargs, PyObject* kwnames) {
  LoadedObject* loaded = self->loaded;
  PyObject* expect = self->expect;
  if (kwnames != NULL || self->blocked || loaded == NULL || expect == NULL ||
      self->num_devices != 1 || nargs != PyTuple_Size(expect) || nargs > PJRT_PY_STACK_ARGS ||
      state_check_usable(loaded->c, "executable") < 0) {
    clear_for_fallback();
    return call_python_method((PyObject*)self, "_execute_async_slow", args, nargs, kwnames);
  }
  PyObject* buffers[PJRT_PY_STACK_ARGS]; /* what the call uses (dispatch.c: arg_*) */
  /* Buffers made here (numpy copies, foreign views), owned until the call is made. */
  BufferObject* owned[PJRT_PY_STACK_ARGS];
  Py_ssize_t n_owned = 0;
  bool ran_python = false; /* a foreign producer's __dlpack__ ran */
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* meta = PyTuple_GetItem(expect, i);
    buffers[i] = fast_argument(args[i], loaded->c, meta, self->device, self->memory);
    if (buffers[i] == NULL) {
      BufferObject* made = numpy_argument(args[i], self->client, loaded->c, self->device, meta);
      if (made == NULL) {
        made = foreign_argument(args[i], self->client, loaded->c, self->device, meta);
        ran_python = ran_python || made != NULL;
      }
      if (made != NULL) owned[n_owned++] = made;
      buffers[i] = (PyObject*)made;
    }
    /* Python may have run (a producer's __dlpack__): check again before the call. */
    if (buffers[i] == NULL || (ran_python && state_check_usable(loaded->c, "executable") < 0) ||
        self->loaded != loaded) {
      clear_for_fallback();
      for (Py_ssize_t v = 0; v < n_owned; ++v) Py_DECREF(owned[v]);
      return call_python_method((PyObject*)self, "_execute_async_slow", args, nargs, kwnames);
    }
  }
  if (ran_python) { /* a producer's code ran: the Buffers must still be live */
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      if (!arg_live(buffers[i])) {
        for (Py_ssize_t v = 0; v < n_owned; ++v) Py_DECREF(owned[v]);
        return call_python_method((PyObject*)self, "_execute_async_slow", args, nargs, kwnames);
      }
    }
  }
  PyObject* promise = NULL;
  run_pinned(self, buffers, 1, (size_t)nargs, NULL, 0, &promise, true);
  for (Py_ssize_t v = 0; v < n_owned; ++v) Py_DECREF(owned[v]);
  return promise;
}

/* _run(rows, non_donatable): rows holds one list of Buffers per device (checked
 * by the caller); returns one promise per device. */
static PyObject* executable_run(ExecutableCoreObject* self, PyObject* args) {
  PyObject* rows;
  PyObject* refused_list;
  if (!PyArg_ParseTuple(args, "OO:_run", &rows, &refused_list)) return NULL;
  Py_ssize_t n_dev = PyList_Size(rows);
  if (n_dev < 1) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_run: no rows");
    return NULL;
  }
  Py_ssize_t n_args = PyList_Size(PyList_GetItem(rows, 0));
  Py_ssize_t n_refused = PyList_Size(refused_list);
  if (n_args < 0 || n_refused < 0) return NULL;
  PyObject** bufs = PyMem_Calloc((size_t)(n_dev * n_args + 1), sizeof(PyObject*));
  int64_t* refused = PyMem_Calloc((size_t)(n_refused + 1), sizeof(int64_t));
  PyObject** promises = PyMem_Calloc((size_t)n_dev, sizeof(PyObject*));
  PyObject* result = NULL;
  if (bufs == NULL || refused == NULL || promises == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t d = 0; d < n_dev; ++d) {
    PyObject* row = PyList_GetItem(rows, d);
    if (row == NULL || PyList_Size(row) != n_args) {
      PyErr_SetString(PyExc_ValueError, "_run: rows differ in length");
      goto done;
    }
    for (Py_ssize_t i = 0; i < n_args; ++i) {
      PyObject* b = PyList_GetItem(row, i);
      if (Py_TYPE(b) != BufferType) {
        PyErr_SetString(PyExc_TypeError, "_run takes Buffers");
        goto done;
      }
      bufs[d * n_args + i] = b;
    }
  }
  for (Py_ssize_t i = 0; i < n_refused; ++i) {
    refused[i] = PyLong_AsLongLong(PyList_GetItem(refused_list, i));
    if (refused[i] == -1 && PyErr_Occurred()) goto done;
  }
  if (run_pinned(self, bufs, (size_t)n_dev, (size_t)n_args, refused, (size_t)n_refused,
                 promises, false) < 0)
    goto done;
  result = PyList_New(n_dev);
  for (Py_ssize_t d = 0; d < n_dev; ++d) {
    if (result != NULL) {
      PyList_SetItem(result, d, promises[d]); /* steals */
    } else {
      Py_DECREF(promises[d]);
    }
  }
done:
  PyMem_Free(bufs);
  PyMem_Free(refused);
  PyMem_Free(promises);
  return result;
}

/* The addresses in `addresses` (a tuple of ints, or None where `nullable`)
 * into a new PyMem array of n pointers; NULL with an exception. */
static void** address_array(PyObject* addresses, Py_ssize_t n, bool nullable) {
  if (!PyTuple_Check(addresses) || PyTuple_Size(addresses) != n) {
    PyErr_SetString(PyExc_TypeError, "_attach: one address per device");
    return NULL;
  }
  void** out = PyMem_Calloc((size_t)n + 1, sizeof(void*));
  if (out == NULL) return (void**)PyErr_NoMemory();
  for (Py_ssize_t d = 0; d < n; ++d) {
    PyObject* address = PyTuple_GetItem(addresses, d);
    if (nullable && address == Py_None) continue;
    out[d] = PyLong_AsVoidPtr(address);
    if (out[d] == NULL) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_attach: NULL address");
      PyMem_Free(out);
      return NULL;
    }
  }
  return out;
}

/* _attach(loaded, client, expect, out_metas, num_outputs, blocked, devices,
 *         memories): devices, the addresses of the program's devices in
 * execution order; memories, for each, that of the memory its parameters are
 * read from there, or None (then the device is compared instead). */
static PyObject* executable_attach(ExecutableCoreObject* self, PyObject* args) {
  PyObject *loaded, *client, *expect, *out_metas, *devices, *memories;
  Py_ssize_t num_outputs;
  int blocked;
  if (!PyArg_ParseTuple(args, "O!OOOnpO!O!:_attach", LoadedType, &loaded, &client, &expect,
                        &out_metas, &num_outputs, &blocked, &PyTuple_Type, &devices,
                        &PyTuple_Type, &memories))
    return NULL;
  if ((expect != Py_None && !PyTuple_Check(expect)) ||
      (out_metas != Py_None && !PyTuple_Check(out_metas))) {
    PyErr_SetString(PyExc_TypeError, "_attach: expect and out_metas are tuples or None");
    return NULL;
  }
  /* No device: a program none of whose devices this process addresses
   * (another process's share of a job); every call then goes to Python. */
  Py_ssize_t n_dev = PyTuple_Size(devices);
  if (n_dev > INT_MAX) {
    PyErr_SetString(PyExc_ValueError, "_attach: too many devices");
    return NULL;
  }
  PJRT_Device** devs = NULL;
  PJRT_Memory** mems = NULL;
  if (n_dev > 0) {
    devs = (PJRT_Device**)address_array(devices, n_dev, false);
    if (devs == NULL) return NULL;
    mems = (PJRT_Memory**)address_array(memories, n_dev, true);
    if (mems == NULL) {
      PyMem_Free(devs);
      return NULL;
    }
  } else if (PyTuple_Size(memories) != 0) {
    PyErr_SetString(PyExc_TypeError, "_attach: one address per device");
    return NULL;
  }
  PyMem_Free(self->devices);
  PyMem_Free(self->memories);
  self->devices = devs;
  self->memories = mems;
  self->num_devices = (int)n_dev;
  self->device = n_dev == 1 ? devs[0] : NULL;
  self->memory = n_dev == 1 ? mems[0] : NULL;
  Py_INCREF(loaded);
  PJRT_PY_SETREF(self->loaded, (LoadedObject*)loaded);
  Py_INCREF(client);
  PJRT_PY_SETREF(self->client, client);
  PJRT_PY_SETREF(self->expect, expect == Py_None ? NULL : (Py_INCREF(expect), expect));
  PJRT_PY_SETREF(self->out_metas, out_metas == Py_None ? NULL : (Py_INCREF(out_metas), out_metas));
  self->num_outputs = num_outputs;
  self->blocked = blocked;
  Py_RETURN_NONE;
}

/* _detach(): drop this executable's hold on the compiled program. */
static PyObject* executable_detach(ExecutableCoreObject* self, PyObject* unused) {
  (void)unused;
  Py_CLEAR(self->loaded);
  self->blocked = 1;
  Py_RETURN_NONE;
}

static PyObject* executable_get_blocked(ExecutableCoreObject* self, void* unused) {
  (void)unused;
  return PyBool_FromLong(self->blocked);
}

static int executable_set_blocked(ExecutableCoreObject* self, PyObject* value, void* unused) {
  (void)unused;
  int truth = value ? PyObject_IsTrue(value) : -1;
  if (truth < 0) return -1;
  self->blocked = truth || self->loaded == NULL;
  return 0;
}

static PyObject* executable_get_loaded(ExecutableCoreObject* self, void* unused) {
  (void)unused;
  PyObject* loaded = self->loaded ? (PyObject*)self->loaded : Py_None;
  Py_INCREF(loaded);
  return loaded;
}

static PyObject* executable_get_client(ExecutableCoreObject* self, void* unused) {
  (void)unused;
  PyObject* client = self->client ? self->client : Py_None;
  Py_INCREF(client);
  return client;
}

static void executable_dealloc(ExecutableCoreObject* self) {
  PyObject_GC_UnTrack(self);
  if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject*)self);
  Py_CLEAR(self->dict);
  Py_CLEAR(self->loaded);
  Py_CLEAR(self->client);
  Py_CLEAR(self->expect);
  Py_CLEAR(self->out_metas);
  PyMem_Free(self->devices);
  PyMem_Free(self->memories);
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

static int executable_traverse(ExecutableCoreObject* self, visitproc visit, void* arg) {
  Py_VISIT(self->dict);
  Py_VISIT(self->client);
  Py_VISIT(self->expect);
  Py_VISIT(self->out_metas);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static int executable_clear(ExecutableCoreObject* self) {
  Py_CLEAR(self->dict);
  return 0;
}

static PyMethodDef executable_methods[] = {
    {"execute_async", (PyCFunction)(void (*)(void))executable_execute_async,
     METH_FASTCALL | METH_KEYWORDS,
     "execute_async($self, /, *args, ordered=False, non_donatable=None)\n--\n\n"
     "Dispatch the program and return a BufferPromise of its outputs at once.\n\n"
     "Arguments may be Buffers, promises of one buffer, or numpy arrays and scalars\n"
     "(transferred first). ordered=True runs it after every earlier ordered execution\n"
     "of this thread has completed, on any device, without waiting on the host (see\n"
     "docs/effects.md). non_donatable lists parameters this call must not donate."},
    {"execute_sharded_async",
     (PyCFunction)(void (*)(void))executable_execute_sharded_async, METH_FASTCALL | METH_KEYWORDS,
     "execute_sharded_async($self, per_device_args, *, non_donatable=None)\n--\n\n"
     "Run a replicated or partitioned program on all its devices at once.\n\n"
     "per_device_args[d] holds the arguments for self.devices[d] (the executable's\n"
     "device order: replicas x partitions of its device assignment). Returns one\n"
     "promise per device, of that device's outputs, at once. A call whose arguments\n"
     "are all Buffers (or promises of one) already on their row's device runs from\n"
     "call to promises in C; any other is checked and transferred first.\n\n"
     "Parameters\n----------\n"
     "per_device_args : sequence of sequences\n"
     "    One argument list per device, len(self.devices) of them. Each holds\n"
     "    Buffers, promises of one buffer, or numpy arrays / scalars (transferred\n"
     "    to that device first), checked against input_signature.\n"
     "non_donatable : iterable of int, optional\n"
     "    Indices of donated parameters this call must not donate: their buffers\n"
     "    stay valid.\n\n"
     "Returns\n-------\nlist of BufferPromise\n"
     "    One promise per device, in self.devices order, returned at once.\n\n"
     "Raises\n------\nTypeError\n"
     "    If per_device_args is not a list of argument lists (a Buffer, promise or\n"
     "    array given instead, or an entry that is not a list), for a wrong argument\n"
     "    count, shape, dtype or type (as execute), or if non_donatable is not a\n"
     "    sequence of indices.\n"
     "ValueError\n"
     "    If the number of argument lists is not the number of devices; if an\n"
     "    argument is a dead buffer, another client's, on another device than its\n"
     "    list's, or a Python scalar that does not fit its parameter's dtype; if a\n"
     "    non_donatable entry is not a parameter index; or if the executable has\n"
     "    been deleted or its client closed."},
    {"execute_sharded", (PyCFunction)(void (*)(void))executable_execute_sharded,
     METH_FASTCALL | METH_KEYWORDS,
     "execute_sharded($self, per_device_args, *, non_donatable=None)\n--\n\n"
     "execute_sharded_async, waited for: one list of output Buffers per device.\n\n"
     "Parameters\n----------\n"
     "per_device_args : sequence of sequences\n"
     "    One argument list per device, as for execute_sharded_async.\n"
     "non_donatable : iterable of int, optional\n"
     "    Indices of donated parameters this call must not donate.\n\n"
     "Returns\n-------\nlist of list of Buffer\n"
     "    Each device's outputs, in self.devices order, ready on return.\n\n"
     "Raises\n------\nTypeError, ValueError\n"
     "    For arguments execute_sharded_async refuses.\n"
     "PjrtError\n    If the execution fails on any device."},
    {"_run", (PyCFunction)executable_run, METH_VARARGS, NULL},
    {"_attach", (PyCFunction)executable_attach, METH_VARARGS, NULL},
    {"_detach", (PyCFunction)executable_detach, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef executable_getset[] = {
    {"_blocked", (getter)executable_get_blocked, (setter)executable_set_blocked, NULL, NULL},
    {"_loaded", (getter)executable_get_loaded, NULL, NULL, NULL},
    {"client", (getter)executable_get_client, NULL, "The Client it was compiled for.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef executable_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(ExecutableCoreObject, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ExecutableCoreObject, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot executable_slots[] = {
    {Py_tp_doc, "The native part of pjrt_py.Executable: the dispatch fast path."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, executable_dealloc},
    {Py_tp_traverse, executable_traverse},
    {Py_tp_clear, executable_clear},
    {Py_tp_methods, executable_methods},
    {Py_tp_getset, executable_getset},
    {Py_tp_members, executable_members},
    {0, NULL},
};

static PyType_Spec executable_spec = {
    "pjrt_py._core.ExecutableCore", sizeof(ExecutableCoreObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE, executable_slots,
};
