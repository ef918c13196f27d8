/* The promise types: pjrt_py.Promise, BufferPromise and ArrayPromise.
 *
 * Promises stand for one piece of running work: they are shared, never copied
 * or pickled.
 */
#include "promise.h"

static PyObject* promise_repr(PromiseObject* p) {
  PyObject* ready = promise_is_ready(p, NULL);
  const char* state = "pending";
  if (ready == NULL) {
    PyErr_Clear();
    state = "unavailable";
  } else if (ready == Py_True) {
    state = "ready";
  }
  Py_XDECREF(ready);
  PyObject* name = PyObject_GetAttrString((PyObject*)Py_TYPE(p), "__name__");
  if (name == NULL) return NULL;
  PyObject* text = PyUnicode_FromFormat("<%U %s>", name, state);
  Py_DECREF(name);
  return text;
}

static PyObject* promise_no_copy(PyObject* p, PyObject* unused) {
  (void)unused;
  PyObject* name = PyObject_GetAttrString((PyObject*)Py_TYPE(p), "__name__");
  if (name == NULL) return NULL;
  PyErr_Format(PyExc_TypeError,
               "a %U cannot be copied or pickled: it stands for work in flight; share the "
               "object, or copy its value()",
               name);
  Py_DECREF(name);
  return NULL;
}

static PyObject* promise_event_count(PromiseObject* p, void* unused) {
  (void)unused;
  return PyLong_FromLong(p->made ? p->num_events : -1);
}

static void promise_dealloc(PromiseObject* p) {
  PyObject_GC_UnTrack(p);
  if (p->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject*)p);
  if (p->events != NULL) {
    bool allowed = p->c->generation == g_generation && phase() != PHASE_FINISHED;
    for (int i = 0; i < p->num_events; ++i) {
      if (!allowed) continue; /* after fork or exit: never touch PJRT */
      if (p->kind == PROMISE_ARRAY && !p->done) {
        /* The copy may still write the array: keep it until it is done. */
        PyObject* keep = PyTuple_Pack(2, p->array, (PyObject*)p->one);
        if (keep == NULL) {
          PyErr_Clear();
          Py_XINCREF(p->array); /* cannot track it: keep the memory forever */
        }
        release_on_ready(p->api, p->events[i], keep);
        Py_XDECREF(keep);
      } else {
        event_destroy(p->api, p->events[i]);
      }
    }
    PyMem_Free(p->events);
    /* After exit a copy left running may still write the array, and nothing
     * will say when it is done: the array is never freed. */
    if (!allowed && p->kind == PROMISE_ARRAY && !p->done) p->array = NULL;
  }
  acct_drop(&p->raw_acct);
  /* (raw_pins is 0 here: a call using raw holds a reference to p.) */
  if (p->raw != NULL && p->raw_pins == 0 && state_pjrt_allowed(p->c)) {
    buffer_handle_destroy(p->api, p->raw);
  }
  /* A staged copy holds its own array; after fork its lock may be a parent thread's. */
  if (p->job != NULL && p->c->generation == g_generation) staged_job_release(p->job);
  Py_CLEAR(p->raw_meta);
  Py_CLEAR(p->owner);
  Py_CLEAR(p->one);
  Py_CLEAR(p->buffers);
  Py_CLEAR(p->array);
  Py_CLEAR(p->error);
  Py_CLEAR(p->callbacks);
  client_unref(p->c);
  promise_free(p);
}

static int promise_traverse(PromiseObject* p, visitproc visit, void* arg) {
  Py_VISIT(p->one);
  Py_VISIT(p->owner);
  Py_VISIT(p->buffers);
  Py_VISIT(p->array);
  Py_VISIT(p->error);
  Py_VISIT(p->callbacks);
  Py_VISIT(Py_TYPE(p));
  return 0;
}

static int promise_clear(PromiseObject* p) {
  Py_CLEAR(p->callbacks); /* callbacks are what close cycles back to a promise */
  Py_CLEAR(p->error);
  return 0;
}

static PyObject* promise_base_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  (void)args;
  (void)kwargs;
  PyObject* name = PyObject_GetAttrString((PyObject*)type, "__name__");
  if (name == NULL) return NULL;
  PyErr_Format(PyExc_TypeError, "%U objects are made by pjrt_py's async calls", name);
  Py_DECREF(name);
  return NULL;
}

/* __array__(dtype=None, copy=None): numpy's conversion waits for the work, as it
 * does for a jax.Array, then converts the value as the value itself does (a
 * Buffer's rules, or the numpy array's). Without this, numpy would read a
 * promise of buffers as a sequence of promises, nested without end. */
static PyObject* promise_array(PromiseObject* p, PyObject* args, PyObject* kwargs) {
  PyObject* value = promise_value_impl(p, -1);
  if (value == NULL) return NULL;
  PyObject* out = NULL;
  if (Py_TYPE(value) == BufferType || PyArray_Check(value)) {
    PyObject* convert = PyObject_GetAttrString(value, "__array__");
    out = convert ? PyObject_Call(convert, args, kwargs) : NULL;
    Py_XDECREF(convert);
  } else if (PyTuple_Check(value)) {
    PyErr_Format(PyExc_TypeError,
                 "this promise holds %zd buffers, not one array: convert one, "
                 "np.asarray(promise[i])",
                 PyTuple_Size(value));
  } else if (value == Py_None) {
    PyErr_SetString(PyExc_TypeError, "this promise is of a program with no outputs");
  } else {
    PyObject* name = type_name(value);
    if (name != NULL) {
      PyErr_Format(PyExc_TypeError, "a promise of %U is not an array", name);
      Py_DECREF(name);
    }
  }
  Py_DECREF(value);
  return out;
}

static PyMethodDef promise_methods[] = {
    {"value", (PyCFunction)(void (*)(void))promise_value, METH_FASTCALL | METH_KEYWORDS,
     "value($self, /, timeout=None)\n--\n\n"
     "Wait for the work and return its result.\n\n"
     "The GIL is released while waiting; Ctrl-C raises KeyboardInterrupt.\n\n"
     "Parameters\n----------\ntimeout : float, optional\n"
     "    Seconds to wait; None or inf waits as long as it takes.\n\n"
     "Returns\n-------\nobject\n"
     "    A Buffer (one output), a tuple of them, None (no outputs), or the\n"
     "    numpy array (an ArrayPromise).\n\n"
     "Raises\n------\nTimeoutError\n    If the timeout passes first (the work goes on).\n"
     "PjrtError\n    The error of the work, if it failed.\n"
     "RuntimeError\n    Inside a host callback, for work that is not ready (no timeout)."},
    {"is_ready", (PyCFunction)promise_is_ready, METH_NOARGS,
     "is_ready($self, /)\n--\n\n"
     "Whether the work is complete (or has failed). Never blocks.\n\n"
     "Returns\n-------\nbool"},
    {"exception", (PyCFunction)promise_exception, METH_NOARGS,
     "exception($self, /)\n--\n\n"
     "The error of the work, waiting for it; None if it succeeded.\n\n"
     "Returns\n-------\nPjrtError or None"},
    {"block_until_ready", (PyCFunction)promise_block_until_ready, METH_NOARGS,
     "block_until_ready($self, /)\n--\n\n"
     "Wait for the work.\n\n"
     "Returns\n-------\nPromise\n    This promise.\n\n"
     "Raises\n------\nPjrtError\n    The error of the work, if it failed."},
    {"add_done_callback", (PyCFunction)promise_add_done_callback, METH_O,
     "add_done_callback($self, fn, /)\n--\n\n"
     "Call fn(promise) once the work is complete.\n\n"
     "Runs at once if the promise is ready, else on a PJRT thread when the work\n"
     "completes: keep fn short and thread-safe. An exception from fn is logged\n"
     "(logger 'pjrt_py') and never stops the other callbacks.\n\n"
     "Parameters\n----------\nfn : callable\n    Called with this promise.\n\n"
     "Raises\n------\nTypeError\n    If fn is not callable."},
    {"__array__", (PyCFunction)(void (*)(void))promise_array, METH_VARARGS | METH_KEYWORDS,
     "__array__($self, /, dtype=None, copy=None)\n--\n\n"
     "numpy's conversion: wait for the work, then convert its array or single Buffer."},
    {"__copy__", (PyCFunction)promise_no_copy, METH_NOARGS, NULL},
    {"__deepcopy__", (PyCFunction)promise_no_copy, METH_O, NULL},
    {"__reduce__", (PyCFunction)promise_no_copy, METH_NOARGS, NULL},
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef promise_getset[] = {
    {"_event_count", (getter)promise_event_count, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef promise_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(PromiseObject, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot promise_slots[] = {
    {Py_tp_doc, "The result of asynchronous work: value(), is_ready(), await."},
    {Py_tp_new, promise_base_new},
    {Py_tp_dealloc, promise_dealloc},
    {Py_tp_traverse, promise_traverse},
    {Py_tp_clear, promise_clear},
    {Py_tp_repr, promise_repr},
    {Py_am_await, promise_await},
    {Py_tp_methods, promise_methods},
    {Py_tp_getset, promise_getset},
    {Py_tp_members, promise_members},
    {0, NULL},
};

static PyType_Spec promise_spec = {
    "pjrt_py.Promise", sizeof(PromiseObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE, promise_slots,
};

/* ---- BufferPromise ---------------------------------------------------------------- */

/* BufferPromise(buffers, arity=1): a promise of Buffers already made. */
static PyObject* buffer_promise_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  (void)type;
  static char* names[] = {"buffers", "arity", NULL};
  PyObject* buffers;
  int arity = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|i:BufferPromise", names, &buffers, &arity))
    return NULL;
  PyObject* tuple = PySequence_Tuple(buffers);
  if (tuple == NULL) return NULL;
  Py_ssize_t n = PyTuple_Size(tuple);
  PyObject* result = NULL;
  if (n == 0) {
    PyErr_SetString(PyExc_ValueError, "BufferPromise needs at least one Buffer");
  } else if (arity < 0 || arity > n) {
    PyErr_Format(PyExc_ValueError, "BufferPromise arity must be 0 to %zd, not %d", n, arity);
  } else {
    BufferObject* first = (BufferObject*)PyTuple_GetItem(tuple, 0);
    for (Py_ssize_t i = 0; i < n; ++i) {
      BufferObject* b = (BufferObject*)PyTuple_GetItem(tuple, i);
      if (Py_TYPE(b) != BufferType) {
        PyObject* name = type_name((PyObject*)b);
        PyErr_Format(PyExc_TypeError, "BufferPromise takes Buffers, not %U", name);
        Py_DECREF(name);
        break;
      }
      if (b->c != first->c || b->c == NULL) {
        PyErr_SetString(PyExc_ValueError, "BufferPromise takes live Buffers of one client");
        break;
      }
    }
    if (!PyErr_Occurred()) result = promise_of_buffers(tuple, arity);
  }
  Py_DECREF(tuple);
  return result;
}

static PyObject* buffer_promise_buffer(PromiseObject* p, PyObject* unused) {
  (void)unused;
  if (promise_check_failed(p) < 0) return NULL;
  Py_ssize_t n = promise_visible(p);
  if (n != 1) {
    return PyErr_Format(PyExc_ValueError,
                        "this promise holds %zd buffers; pick one with promise[i]", n);
  }
  PyObject* b = (PyObject*)promise_at(p, 0);
  Py_XINCREF(b);
  return b;
}

static PyObject* buffer_promise_to_numpy_async(PromiseObject* p, PyObject* unused) {
  PyObject* b = buffer_promise_buffer(p, unused);
  if (b == NULL) return NULL;
  PyObject* out = buffer_copy_out((BufferObject*)b, PJRT_PY_DIRECT_READ_BYTES, 0);
  Py_DECREF(b);
  return out;
}

static PyObject* buffer_promise_to_numpy(PromiseObject* p, PyObject* unused) {
  PyObject* b = buffer_promise_buffer(p, unused);
  if (b == NULL) return NULL;
  PyObject* out = buffer_copy_out((BufferObject*)b, (size_t)-1, 1);
  Py_DECREF(b);
  return out;
}

/* __dlpack__ / __dlpack_device__ of the single buffer, without a host wait:
 * the export orders the consumer after the work (the stream protocol on a GPU,
 * a wait on the host otherwise), as for a Buffer. */
static PyObject* buffer_promise_call_buffer(PromiseObject* p, const char* method, PyObject* args,
                                            PyObject* kwargs) {
  PyObject* b = buffer_promise_buffer(p, NULL);
  if (b == NULL) return NULL;
  PyObject* bound = PyObject_GetAttrString(b, method);
  Py_DECREF(b);
  if (bound == NULL) return NULL;
  PyObject* out = PyObject_Call(bound, args, kwargs);
  Py_DECREF(bound);
  return out;
}

static PyObject* buffer_promise_dlpack(PromiseObject* p, PyObject* args, PyObject* kwargs) {
  return buffer_promise_call_buffer(p, "__dlpack__", args, kwargs);
}

static PyObject* buffer_promise_dlpack_device(PromiseObject* p, PyObject* unused) {
  (void)unused;
  PyObject* none = PyTuple_New(0);
  PyObject* out = none ? buffer_promise_call_buffer(p, "__dlpack_device__", none, NULL) : NULL;
  Py_XDECREF(none);
  return out;
}

static Py_ssize_t buffer_promise_len(PromiseObject* p) {
  if (promise_forked(p) < 0) return -1;
  return p->failed ? p->arity : promise_visible(p);
}

static PyObject* buffer_promise_item(PromiseObject* p, Py_ssize_t i) {
  if (promise_check_failed(p) < 0) return NULL;
  Py_ssize_t n = promise_visible(p);
  if (i < 0) i += n;
  if (i < 0 || i >= n) {
    PyErr_SetString(PyExc_IndexError, "promise index out of range");
    return NULL;
  }
  BufferObject* b = promise_at(p, i);
  return b != NULL ? promise_of_one(b) : NULL;
}

static PyObject* buffer_promise_get_buffers(PromiseObject* p, void* unused) {
  (void)unused;
  if (promise_check_failed(p) < 0) return NULL;
  if (promise_visible(p) == 0) return PyTuple_New(0);
  if (p->one != NULL || p->raw != NULL) {
    BufferObject* b = promise_at(p, 0);
    return b != NULL ? PyTuple_Pack(1, (PyObject*)b) : NULL;
  }
  if (p->buffers == NULL) return PyTuple_New(0);
  Py_INCREF(p->buffers);
  return p->buffers;
}

static PyMethodDef buffer_promise_methods[] = {
    {"buffer", (PyCFunction)buffer_promise_buffer, METH_NOARGS,
     "buffer($self, /)\n--\n\n"
     "The single buffer, without waiting (to chain it into the next call).\n\n"
     "Returns\n-------\nBuffer\n    The output, which may still be computing.\n\n"
     "Raises\n------\nValueError\n    If the promise holds several buffers (pick one with promise[i]).\n"
     "PjrtError\n    If the work failed as it was dispatched."},
    {"to_numpy_async", (PyCFunction)buffer_promise_to_numpy_async, METH_NOARGS,
     "to_numpy_async($self, /)\n--\n\n"
     "Chain a device-to-host copy after the work, at once.\n\n"
     "Returns\n-------\nArrayPromise\n    The single buffer's data as a numpy array, once copied.\n\n"
     "Raises\n------\nValueError\n    If the promise holds several buffers."},
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_promise_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "The single buffer's DLPack export (Buffer.__dlpack__), ordered after the work."},
    {"__dlpack_device__", (PyCFunction)buffer_promise_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\nThe single buffer's (device type, device id)."},
    {"to_numpy", (PyCFunction)buffer_promise_to_numpy, METH_NOARGS,
     "to_numpy($self, /)\n--\n\n"
     "Wait for the work and copy the single buffer to a new numpy array.\n\n"
     "Returns\n-------\nnumpy.ndarray\n\n"
     "Raises\n------\nPjrtError\n    The error of the work, if it failed.\n"
     "ValueError\n    If the promise holds several buffers."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buffer_promise_getset[] = {
    {"_buffers", (getter)buffer_promise_get_buffers, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot buffer_promise_slots[] = {
    {Py_tp_doc, "Device buffers that may still be computing or transferring.\n\n"
                "value() gives a Buffer (one output), a tuple of them (several outputs), or\n"
                "None (a program with no outputs). A promise of one buffer is a valid\n"
                "argument to the next execution: PJRT orders the work itself, with no host\n"
                "wait."},
    {Py_tp_new, buffer_promise_new},
    {Py_tp_traverse, promise_traverse},
    {Py_tp_clear, promise_clear},
    {Py_tp_dealloc, promise_dealloc},
    {Py_tp_methods, buffer_promise_methods},
    {Py_tp_getset, buffer_promise_getset},
    {Py_sq_length, buffer_promise_len},
    {Py_sq_item, buffer_promise_item},
    {0, NULL},
};

static PyType_Spec buffer_promise_spec = {
    "pjrt_py.BufferPromise", sizeof(PromiseObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    buffer_promise_slots,
};

static PyType_Slot array_promise_slots[] = {
    {Py_tp_doc, "A numpy array being filled by a device-to-host copy."},
    {Py_tp_new, promise_base_new},
    {Py_tp_traverse, promise_traverse},
    {Py_tp_clear, promise_clear},
    {Py_tp_dealloc, promise_dealloc},
    {0, NULL},
};

static PyType_Spec array_promise_spec = {
    "pjrt_py.ArrayPromise", sizeof(PromiseObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    array_promise_slots,
};
