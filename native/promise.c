/* Promises: pjrt_py.Promise and its kinds BufferPromise and ArrayPromise.
 *
 * A promise holds PJRT events: a buffer promise makes its buffers' ready
 * events on first use (a promise nobody asks about costs none); an array
 * promise holds its device-to-host copy's event; a no-output execution's
 * promise holds its completion event. All state changes with the GIL held;
 * waits release it. Events are destroyed only at dealloc, so no thread can
 * see one freed while it waits on it.
 *
 * add_done_callback and await are driven by PJRT_Event_OnReady: a record
 * holding the promise is registered per event, and the PJRT thread that fires
 * the last one takes the GIL (through the gate, state.c) and runs the
 * callbacks. A callback's exception never stops the others.
 */

static PyObject* promise_new_blank(PyTypeObject* type, int kind, pjrt_py_client* c) {
  PromiseObject* p = PyObject_GC_New(PromiseObject, type);
  if (p == NULL) return NULL;
  p->kind = kind;
  p->arity = 1;
  p->one = NULL;
  p->buffers = NULL;
  p->raw = NULL;
  p->raw_meta = NULL;
  p->owner = NULL;
  p->raw_ready = 0;
  p->array = NULL;
  p->c = c;
  client_ref(c);
  p->api = c->api;
  p->events = NULL;
  p->num_events = 0;
  p->made = 0;
  p->done = 0;
  p->watching = 0;
  p->error = NULL;
  p->callbacks = NULL;
  p->weakrefs = NULL;
  PyObject_GC_Track(p);
  return (PyObject*)p;
}

/* A promise's buffers: one held directly (the common case, no tuple), one
 * not made yet (raw), or a tuple of several. */
static Py_ssize_t promise_count(PromiseObject* p) {
  if (p->one != NULL || p->raw != NULL) return 1;
  return p->buffers != NULL ? PyTuple_Size(p->buffers) : 0;
}

/* Buffer i (borrowed), made now from the raw handle if need be; NULL with an
 * exception if that failed. */
static BufferObject* promise_at(PromiseObject* p, Py_ssize_t i) {
  if (p->raw != NULL) {
    BufferObject* b = buffer_wrap(p->owner, p->c, p->raw, p->raw_meta);
    p->raw = NULL; /* taken by b, or destroyed by buffer_wrap's failure */
    Py_CLEAR(p->raw_meta);
    if (b == NULL) return NULL;
    b->ready = (unsigned char)p->raw_ready;
    p->one = b;
  }
  if (p->one != NULL) return p->one;
  return (BufferObject*)PyTuple_GetItem(p->buffers, i);
}

/* The PJRT handle of buffer i without making a Buffer; NULL with ValueError
 * if that buffer is dead. */
static PJRT_Buffer* promise_handle(PromiseObject* p, Py_ssize_t i) {
  if (p->raw != NULL) return p->raw;
  BufferObject* b = p->one != NULL ? p->one : (BufferObject*)PyTuple_GetItem(p->buffers, i);
  return b != NULL && buffer_live(b) == 0 ? b->buf : NULL;
}

static PromiseObject* promise_for_buffer(BufferObject* first, int arity) {
  if (first->c == NULL) {
    PyErr_SetString(PyExc_ValueError, buffer_dead_message(first));
    return NULL;
  }
  PromiseObject* p = (PromiseObject*)promise_new_blank(BufferPromiseType, PROMISE_BUFFERS, first->c);
  if (p != NULL) p->arity = arity;
  return p;
}

/* A promise of `buffers` (a tuple of Buffers; borrowed), all of one client. */
static PyObject* promise_of_buffers(PyObject* buffers, int arity) {
  BufferObject* first = (BufferObject*)PyTuple_GetItem(buffers, 0);
  if (first == NULL) return NULL;
  PromiseObject* p = promise_for_buffer(first, arity);
  if (p == NULL) return NULL;
  if (PyTuple_Size(buffers) == 1) {
    Py_INCREF(first);
    p->one = first;
  } else {
    Py_INCREF(buffers);
    p->buffers = buffers;
  }
  return (PyObject*)p;
}

/* A promise of one execution output, `raw` (taken, with a new client
 * reference held by the promise), whose Buffer is made on first use. */
static PyObject* promise_of_output(PyObject* owner, pjrt_py_client* c, PJRT_Buffer* raw,
                                   PyObject* meta) {
  PromiseObject* p = (PromiseObject*)promise_new_blank(BufferPromiseType, PROMISE_BUFFERS, c);
  if (p == NULL) {
    PJRT_Buffer_Destroy_Args args = {0};
    args.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
    args.buffer = raw;
    error_destroy(c->api, c->api->PJRT_Buffer_Destroy(&args));
    return NULL;
  }
  p->raw = raw;
  Py_XINCREF(meta);
  p->raw_meta = meta;
  Py_INCREF(owner);
  p->owner = owner;
  return (PyObject*)p;
}

static PyObject* promise_of_one(BufferObject* buffer) {
  PromiseObject* p = promise_for_buffer(buffer, 1);
  if (p == NULL) return NULL;
  Py_INCREF(buffer);
  p->one = buffer;
  return (PyObject*)p;
}

static int promise_take_event(PromiseObject* p, PJRT_Event* event) {
  if (event == NULL) {
    p->made = 1;
    return 0;
  }
  p->events = (PJRT_Event**)PyMem_Malloc(sizeof(PJRT_Event*));
  if (p->events == NULL) {
    event_destroy(p->api, event);
    PyErr_NoMemory();
    return -1;
  }
  p->events[0] = event;
  p->num_events = 1;
  p->made = 1;
  return 0;
}

/* Takes `array` and `event` (NULL: the copy is done); `source` is kept
 * alive until then. */
static PyObject* promise_of_array(const PJRT_Api* api, PyObject* array, PyObject* source,
                                  PJRT_Event* event) {
  BufferObject* b = (BufferObject*)source;
  PromiseObject* p = (PromiseObject*)promise_new_blank(ArrayPromiseType, PROMISE_ARRAY, b->c);
  if (p == NULL) {
    Py_DECREF(array);
    release_on_ready(api, event, source); /* the copy may still write `array`: gone now */
    return NULL;
  }
  p->array = array;
  Py_INCREF(source);
  p->one = b;
  if (promise_take_event(p, event) < 0) {
    Py_DECREF(p);
    return NULL;
  }
  return (PyObject*)p;
}

/* A no-output execution's promise: readiness is its completion. Takes event. */
static PyObject* promise_of_completion(pjrt_py_client* c, PJRT_Event* event) {
  PromiseObject* p = (PromiseObject*)promise_new_blank(BufferPromiseType, PROMISE_COMPLETION, c);
  if (p == NULL) {
    event_destroy(c->api, event);
    return NULL;
  }
  p->arity = 0;
  if (promise_take_event(p, event) < 0) {
    Py_DECREF(p);
    return NULL;
  }
  return (PyObject*)p;
}

static PyObject* buffer_promise_get_buffers(PromiseObject* p, void* unused);

/* ---- events -------------------------------------------------------------- */

/* Makes the buffers' ready events on first use. With the GIL. */
static int promise_make_events(PromiseObject* p) {
  if (p->made) return 0;
  Py_ssize_t n = promise_count(p);
  PJRT_Event** events = (PJRT_Event**)PyMem_Calloc((size_t)(n ? n : 1), sizeof(PJRT_Event*));
  if (events == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PJRT_Buffer* handle = promise_handle(p, i);
    PJRT_Error* error = NULL;
    if (handle != NULL) {
      PJRT_Buffer_ReadyEvent_Args args = {0};
      args.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
      args.buffer = handle;
      error = p->api->PJRT_Buffer_ReadyEvent(&args);
      if (error == NULL) events[i] = args.event;
    }
    if (PyErr_Occurred() || error != NULL) {
      for (Py_ssize_t j = 0; j < i; ++j) event_destroy(p->api, events[j]);
      PyMem_Free(events);
      return error != NULL ? (raise_pjrt(p->api, error), -1) : -1;
    }
  }
  p->events = events;
  p->num_events = (int)n;
  p->made = 1;
  return 0;
}

/* Reads the (ready) events' status once; keeps the first error. */
static void promise_harvest(PromiseObject* p) {
  if (p->done) return;
  for (int i = 0; i < p->num_events; ++i) {
    PJRT_Error* error = event_error(p->api, p->events[i]);
    if (error == NULL) continue;
    PyObject* exc = error_from_pjrt(p->api, error);
    if (exc == NULL) {
      PyErr_Clear();
      continue;
    }
    if (p->error == NULL) {
      p->error = exc;
    } else {
      Py_DECREF(exc);
    }
  }
  if (p->kind == PROMISE_BUFFERS && p->error == NULL) {
    if (p->raw != NULL) p->raw_ready = 1;
    if (p->one != NULL) p->one->ready = 1;
    for (Py_ssize_t i = 0; p->buffers != NULL && i < PyTuple_Size(p->buffers); ++i)
      ((BufferObject*)PyTuple_GetItem(p->buffers, i))->ready = 1;
  }
  p->done = 1;
}

static PyObject* promise_result(PromiseObject* p) {
  PyObject* result;
  if (p->kind == PROMISE_ARRAY) {
    result = p->array;
  } else if (p->arity == 0) {
    result = Py_None;
  } else if (p->arity == 1) {
    result = (PyObject*)promise_at(p, 0);
    if (result == NULL) return NULL;
  } else {
    return buffer_promise_get_buffers(p, NULL);
  }
  Py_XINCREF(result);
  return result;
}

static PyObject* promise_is_ready(PromiseObject* p, PyObject* unused) {
  (void)unused;
  if (p->done) Py_RETURN_TRUE;
  if (promise_make_events(p) < 0) return NULL;
  for (int i = 0; i < p->num_events; ++i)
    if (!event_is_ready(p->api, p->events[i])) Py_RETURN_FALSE;
  promise_harvest(p);
  Py_RETURN_TRUE;
}

/* Waits (timeout < 0: forever) and returns the result, or raises. */
static PyObject* promise_value_impl(PromiseObject* p, double timeout) {
  if (!p->done) {
    if (promise_make_events(p) < 0) return NULL;
    double deadline = timeout < 0 ? 0 : (double)now_ns() * 1e-9 + timeout;
    for (int i = 0; i < p->num_events; ++i) {
      double left = -1;
      if (timeout >= 0) {
        left = deadline - (double)now_ns() * 1e-9;
        if (left < 0) left = 0;
      }
      int ready = wait_event(p->api, p->events[i], left);
      if (ready < 0) return NULL;
      if (ready == 0) {
        PyObject* seconds = PyFloat_FromDouble(timeout);
        if (seconds != NULL) {
          PyErr_Format(PyExc_TimeoutError, "promise not ready after %R s", seconds);
          Py_DECREF(seconds);
        }
        return NULL;
      }
    }
    promise_harvest(p);
  }
  if (p->error != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(p->error), p->error);
    return NULL;
  }
  return promise_result(p);
}

static PyObject* promise_value(PromiseObject* p, PyObject* const* args, Py_ssize_t nargs,
                               PyObject* kwnames) {
  PyObject* arg = NULL;
  if (nargs > 1 || (kwnames != NULL && PyTuple_Size(kwnames) > 1)) {
    PyErr_SetString(PyExc_TypeError, "value() takes one optional argument, timeout");
    return NULL;
  }
  if (nargs == 1) arg = args[0];
  if (kwnames != NULL && PyTuple_Size(kwnames) == 1) {
    PyObject* name = PyTuple_GetItem(kwnames, 0);
    if (nargs == 1 || PyUnicode_CompareWithASCIIString(name, "timeout") != 0) {
      PyErr_SetString(PyExc_TypeError, "value() takes one optional argument, timeout");
      return NULL;
    }
    arg = args[nargs];
  }
  double timeout;
  if (parse_timeout(arg, &timeout) < 0) return NULL;
  return promise_value_impl(p, timeout);
}

static PyObject* promise_exception(PromiseObject* p, PyObject* unused) {
  (void)unused;
  PyObject* value = promise_value_impl(p, -1);
  if (value != NULL) {
    Py_DECREF(value);
    Py_RETURN_NONE;
  }
  if (p->error != NULL && PyErr_ExceptionMatches(g_pjrt_error)) {
    PyErr_Clear();
    Py_INCREF(p->error);
    return p->error;
  }
  return NULL;
}

static PyObject* promise_block_until_ready(PromiseObject* p, PyObject* unused) {
  (void)unused;
  PyObject* value = promise_value_impl(p, -1);
  if (value == NULL) return NULL;
  Py_DECREF(value);
  Py_INCREF(p);
  return (PyObject*)p;
}

/* ---- callbacks ------------------------------------------------------------------- */

/* Runs each callback; one that raises (anything) is reported through the
 * hook and the others still run. Where the callbacks run on the thread that
 * asked for them (`inline_`), a KeyboardInterrupt or SystemExit among them is
 * raised again there afterwards, so Ctrl-C is not lost. Returns -1 then. */
static int promise_run_callbacks(PromiseObject* p, PyObject* callbacks, int inline_) {
  PyObject* pending = NULL; /* a BaseException to raise again */
  for (Py_ssize_t i = 0; i < PyList_Size(callbacks); ++i) {
    PyObject* fn = PyList_GetItem(callbacks, i);
    PyObject* out = PyObject_CallFunctionObjArgs(fn, (PyObject*)p, NULL);
    if (out != NULL) {
      Py_DECREF(out);
      continue;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
    PyObject* reported =
        hook_callback_error ? PyObject_CallFunctionObjArgs(hook_callback_error, fn, value, NULL)
                            : NULL;
    if (reported == NULL) {
      PyErr_Clear();
    } else {
      Py_DECREF(reported);
    }
    if (inline_ && pending == NULL && value != NULL &&
        !PyErr_GivenExceptionMatches(value, PyExc_Exception)) {
      Py_INCREF(value);
      pending = value;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  }
  if (pending != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(pending), pending);
    Py_DECREF(pending);
    return -1;
  }
  return 0;
}

static void promise_fire(PromiseObject* p, int inline_) {
  promise_harvest(p);
  PyObject* callbacks = p->callbacks;
  p->callbacks = NULL;
  if (callbacks == NULL) return;
  if (promise_run_callbacks(p, callbacks, inline_) < 0 && !inline_) PyErr_Clear();
  Py_DECREF(callbacks);
}

typedef struct {
  PromiseObject* p; /* a strong reference, dropped when the record fires */
  const PJRT_Api* api;
} watch_record;

static void promise_notified(PromiseObject* p) {
  if (--p->watching == 0) promise_fire(p, 0);
}

static void watch_fired(PJRT_Error* error, void* arg) {
  watch_record* r = (watch_record*)arg;
  error_destroy(r->api, error); /* ours; the status is read through PJRT_Event_Error */
  if (gate_enter()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* the callback may fire inside a call with one set */
    promise_notified(r->p);
    Py_DECREF(r->p);
    PyErr_Restore(type, value, tb);
    PyGILState_Release(gil);
    gate_leave();
  } /* else exiting: the promise is leaked, never touched */
  free(r);
}

static PyObject* promise_add_done_callback(PromiseObject* p, PyObject* fn) {
  if (!PyCallable_Check(fn)) {
    PyObject* name = type_name(fn);
    PyErr_Format(PyExc_TypeError, "add_done_callback takes a callable, not %U", name);
    Py_DECREF(name);
    return NULL;
  }
  if (!p->done) {
    PyObject* ready = promise_is_ready(p, NULL);
    if (ready == NULL) return NULL;
    Py_DECREF(ready);
  }
  if (p->done) {
    PyObject* one = PyList_New(1);
    if (one == NULL) return NULL;
    Py_INCREF(fn);
    PyList_SetItem(one, 0, fn);
    int failed = promise_run_callbacks(p, one, 1);
    Py_DECREF(one);
    if (failed) return NULL;
    Py_RETURN_NONE;
  }
  if (p->callbacks != NULL) { /* already watched: it fires them all */
    if (PyList_Append(p->callbacks, fn) < 0) return NULL;
    Py_RETURN_NONE;
  }
  p->callbacks = PyList_New(1);
  if (p->callbacks == NULL) return NULL;
  Py_INCREF(fn);
  PyList_SetItem(p->callbacks, 0, fn);
  /* Count every event first: one may fire during its own registration. */
  p->watching = p->num_events + 1;
  for (int i = 0; i < p->num_events; ++i) {
    watch_record* r = (watch_record*)malloc(sizeof(*r));
    PJRT_Error* error = NULL;
    if (r != NULL) {
      Py_INCREF(p);
      r->p = p;
      r->api = p->api;
      error = event_on_ready(p->api, p->events[i], watch_fired, r);
    }
    if (r == NULL || error != NULL) { /* no callback will come: count it as fired */
      error_destroy(p->api, error);
      if (r != NULL) {
        Py_DECREF(p);
        free(r);
      }
      p->watching--;
    }
  }
  promise_notified(p); /* the +1 above */
  Py_RETURN_NONE;
}

/* await: the iterator comes from pjrt_py.promise (an asyncio future woken by
 * a done callback). */
static PyObject* promise_await(PromiseObject* p) {
  if (hook_await == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "pjrt_py.promise is not initialised");
    return NULL;
  }
  PyObject* awaitable = PyObject_CallFunctionObjArgs(hook_await, (PyObject*)p, NULL);
  if (awaitable == NULL) return NULL;
  PyObject* iterator = PyObject_GetIter(awaitable);
  Py_DECREF(awaitable);
  return iterator;
}

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

/* Promises stand for one piece of running work: they are shared, never
 * copied or pickled. */
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
  }
  if (p->raw != NULL && state_pjrt_allowed(p->c)) {
    PJRT_Buffer_Destroy_Args args = {0};
    args.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
    args.buffer = p->raw;
    error_destroy(p->api, p->api->PJRT_Buffer_Destroy(&args));
  }
  Py_CLEAR(p->raw_meta);
  Py_CLEAR(p->owner);
  Py_CLEAR(p->one);
  Py_CLEAR(p->buffers);
  Py_CLEAR(p->array);
  Py_CLEAR(p->error);
  Py_CLEAR(p->callbacks);
  client_unref(p->c);
  PyTypeObject* type = Py_TYPE(p);
  PyObject_GC_Del(p);
  Py_DECREF(type);
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

static PyMethodDef promise_methods[] = {
    {"value", (PyCFunction)(void (*)(void))promise_value, METH_FASTCALL | METH_KEYWORDS,
     "value(timeout=None)\n--\n\n"
     "Wait (GIL released, Ctrl-C raises KeyboardInterrupt) for the work and return its\n"
     "result. timeout: seconds (inf or None: forever). Raises TimeoutError if it passes\n"
     "first (the work goes on), or the PjrtError of the work if it failed."},
    {"is_ready", (PyCFunction)promise_is_ready, METH_NOARGS,
     "True once the work is complete (or has failed). Never blocks."},
    {"exception", (PyCFunction)promise_exception, METH_NOARGS,
     "The PjrtError of the work once ready (blocks until then), else None."},
    {"block_until_ready", (PyCFunction)promise_block_until_ready, METH_NOARGS,
     "Wait for the work; raise its error if it failed. Returns self."},
    {"add_done_callback", (PyCFunction)promise_add_done_callback, METH_O,
     "Call fn(promise) once the work is complete.\n\n"
     "Runs at once if the promise is ready, else on a PJRT thread when the work\n"
     "completes: keep fn short and thread-safe. An exception from fn is logged\n"
     "(logger 'pjrt_py') and never stops the other callbacks."},
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
  Py_ssize_t n = promise_count(p);
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

static Py_ssize_t buffer_promise_len(PromiseObject* p) { return promise_count(p); }

static PyObject* buffer_promise_item(PromiseObject* p, Py_ssize_t i) {
  Py_ssize_t n = promise_count(p);
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
     "The single buffer, without waiting (for chaining)."},
    {"to_numpy_async", (PyCFunction)buffer_promise_to_numpy_async, METH_NOARGS,
     "Chain a device-to-host copy after the work; returns an ArrayPromise at once."},
    {"to_numpy", (PyCFunction)buffer_promise_to_numpy, METH_NOARGS,
     "Wait for the work and copy the single buffer to a new numpy array."},
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
