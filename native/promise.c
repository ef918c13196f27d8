/* Promises: what one holds, and waiting for it.
 *
 * A promise holds PJRT events: a buffer promise makes its buffers' ready
 * events on first use (a promise nobody asks about costs none); an array
 * promise holds its device-to-host copy's event; a no-output execution's
 * promise holds its completion event. All state changes with the GIL held;
 * waits release it. Events are destroyed only at dealloc, so no thread can
 * see one freed while it waits on it. Notifications are in callbacks.c, the
 * Python types in promise_types.c.
 */
#include "promise.h"

/* Freed promises, kept for reuse: one is made and freed per dispatch. Their
 * type reference was dropped; PyObject_Init takes it again. */
#define PJRT_PY_PROMISE_FREE_MAX 32
static PromiseObject* g_free_promises[PJRT_PY_PROMISE_FREE_MAX];
static int g_num_free_promises = 0;

static PyObject* promise_new_blank(PyTypeObject* type, int kind, pjrt_py_client* c) {
  PromiseObject* p;
  if (g_num_free_promises > 0) {
    p = g_free_promises[--g_num_free_promises];
    PyObject_Init((PyObject*)p, type);
  } else {
    p = PyObject_GC_New(PromiseObject, type);
    if (p == NULL) return NULL;
  }
  /* Every field after the object header starts zero. */
  memset((char*)p + sizeof(PyObject), 0, sizeof(PromiseObject) - sizeof(PyObject));
  p->kind = kind;
  p->arity = 1;
  p->c = c;
  client_ref(c);
  p->api = c->api;
  PyObject_GC_Track(p);
  return (PyObject*)p;
}

/* The memory of a dead promise: reused, or given back. */
static void promise_free(PromiseObject* p) {
  PyTypeObject* type = Py_TYPE(p);
  if (g_num_free_promises < PJRT_PY_PROMISE_FREE_MAX) {
    g_free_promises[g_num_free_promises++] = p;
  } else {
    PyObject_GC_Del(p);
  }
  Py_DECREF(type);
}

/* A promise's buffers: one held directly (the common case, no tuple), one
 * not made yet (raw), or a tuple of several. */
static Py_ssize_t promise_count(PromiseObject* p) {
  if (p->one != NULL || p->raw != NULL) return 1;
  return p->buffers != NULL ? PyTuple_Size(p->buffers) : 0;
}

/* The buffers a caller sees: none for a promise of arity 0, which may hold a
 * buffer only for its readiness (an ordered execution with no outputs holds
 * its runtime token, pjrt_py.programs.effects). */
static Py_ssize_t promise_visible(PromiseObject* p) {
  return p->arity == 0 ? 0 : promise_count(p);
}

/* Buffer i (borrowed), made now from the raw handle if need be; NULL with an
 * exception if that failed (the raw handle is then kept: a call may use it).
 * Calls using the raw handle (raw_pins) now use, and unpin, the Buffer. */
static BufferObject* promise_at(PromiseObject* p, Py_ssize_t i) {
  if (p->raw != NULL) {
    BufferObject* b = buffer_wrap_or_leave(p->owner, p->c, p->raw, p->raw_meta);
    if (b == NULL) return NULL;
    p->raw = NULL; /* taken by b */
    Py_CLEAR(p->raw_meta);
    acct_move(&b->acct, &p->raw_acct);
    buffer_set_origin(b, &p->raw_origin);
    b->ready = (unsigned char)p->raw_ready;
    b->pins = p->raw_pins;
    p->raw_pins = 0;
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
 * reference held by the promise), whose Buffer is made on first use, knowing
 * `origin` (NULL: nothing) of it. Its bytes count from now on origin's
 * device (none known: the plugin is asked). */
static PyObject* promise_of_output(PyObject* owner, pjrt_py_client* c, PJRT_Buffer* raw,
                                   PyObject* meta, const buffer_origin* origin) {
  PromiseObject* p = (PromiseObject*)promise_new_blank(BufferPromiseType, PROMISE_BUFFERS, c);
  if (p == NULL) {
    buffer_handle_destroy(c->api, raw);
    return NULL;
  }
  p->raw = raw;
  if (origin != NULL) p->raw_origin = *origin;
  acct_handle(&p->raw_acct, c->api, raw, origin != NULL ? origin->device : NULL, meta);
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
static PyObject* promise_of_array(pjrt_py_client* c, PyObject* array, PyObject* source,
                                  PJRT_Event* event) {
  BufferObject* b = (BufferObject*)source;
  PromiseObject* p = (PromiseObject*)promise_new_blank(ArrayPromiseType, PROMISE_ARRAY, c);
  if (p == NULL) {
    /* The copy may still write `array`: keep it until the copy is done. */
    release_on_ready(c->api, event, array);
    Py_DECREF(array);
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

/* The promise of work that failed as it was dispatched: done, with `error`
 * (borrowed) and no buffers; asking for its results raises the error. */
static PyObject* promise_failed(pjrt_py_client* c, PyObject* error, int arity) {
  PromiseObject* p = (PromiseObject*)promise_new_blank(BufferPromiseType, PROMISE_COMPLETION, c);
  if (p == NULL) return NULL;
  p->arity = arity;
  p->made = p->done = p->failed = 1;
  Py_INCREF(error);
  p->error = error;
  return (PyObject*)p;
}

/* -1 with a ValueError if `p` is of a client made before fork() in a parent:
 * its events never fire here (docs/lifetimes.md). Every use asks this first. */
static int promise_forked(PromiseObject* p) {
  if (p->c->generation == g_generation) return 0;
  PyErr_SetString(PyExc_ValueError,
                  "promise belongs to a client created before os.fork() in the parent "
                  "process; create a new pjrt_py.Client in this process");
  return -1;
}

/* -1 with the work's error set if `p` failed at dispatch (or is a parent's). */
static int promise_check_failed(PromiseObject* p) {
  if (promise_forked(p) < 0) return -1;
  if (!p->failed) return 0;
  promise_raise_error(p->error);
  return -1;
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

/* Whether every buffer of a buffer promise is already known to be ready
 * without error (a copy of its data completed, or it was read directly).
 * Plugins may fulfil a buffer's ready event a little after its data is
 * defined (the CPU plugin: ~0.2 ms under load), and what was observed must
 * not go back. */
static bool promise_known_ready(PromiseObject* p) {
  if (p->kind != PROMISE_BUFFERS) return false;
  if (p->raw != NULL) return p->raw_ready;
  if (p->one != NULL) return p->one->ready;
  Py_ssize_t n = p->buffers != NULL ? PyTuple_Size(p->buffers) : 0;
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!((BufferObject*)PyTuple_GetItem(p->buffers, i))->ready) return false;
  return n > 0;
}

/* Reads the (ready) events' status once; keeps the first error. */
static void promise_harvest(PromiseObject* p) {
  if (p->done) return;
  for (int i = 0; i < p->num_events; ++i) {
    PJRT_Error* error = event_error(p->api, p->events[i]);
    if (error == NULL) continue;
    PyObject* exc = error_from_pjrt(p->api, error);
    if (exc == NULL) exc = error_take(); /* out of memory: still a failure, never a success */
    if (exc == NULL) continue;
    if (p->error == NULL) {
      p->error = exc;
    } else {
      Py_DECREF(exc);
    }
  }
  if (p->kind == PROMISE_ARRAY && p->error == NULL) p->one->ready = 1; /* the data was read */
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

/* 1 if the work is done (error harvested), 0 if pending, -1 on failure. Never
 * blocks. A pending event of a buffer known ready counts as done (plugin lag). */
static int promise_poll(PromiseObject* p) {
  if (promise_forked(p) < 0) return -1; /* first: a parent's is refused, read or not */
  if (p->done) return 1;
  if (p->job != NULL) return staged_promise_poll(p);
  if (promise_make_events(p) < 0) return -1;
  for (int i = 0; i < p->num_events; ++i) {
    if (event_is_ready(p->api, p->events[i])) continue;
    if (!promise_known_ready(p)) return 0;
    p->done = 1; /* without error: the data was defined */
    return 1;
  }
  promise_harvest(p);
  return 1;
}

static PyObject* promise_is_ready(PromiseObject* p, PyObject* unused) {
  (void)unused;
  int done = promise_poll(p);
  return done < 0 ? NULL : PyBool_FromLong(done);
}

static PyObject* promise_timed_out(double timeout) {
  PyObject* seconds = PyFloat_FromDouble(timeout);
  if (seconds != NULL) {
    PyErr_Format(PyExc_TimeoutError, "promise not ready after %R s", seconds);
    Py_DECREF(seconds);
  }
  return NULL;
}

/* Waits (timeout < 0: forever) and returns the result, or raises. */
static PyObject* promise_value_impl(PromiseObject* p, double timeout) {
  if (promise_poll(p) < 0) return NULL;
  if (!p->done && p->job != NULL) {
    int ready = staged_promise_wait(p, timeout);
    if (ready <= 0) return ready < 0 ? NULL : promise_timed_out(timeout);
  }
  if (!p->done) {
    double deadline = timeout < 0 ? 0 : (double)now_ns() * 1e-9 + timeout;
    for (int i = 0; i < p->num_events; ++i) {
      double left = -1;
      if (timeout >= 0) {
        left = deadline - (double)now_ns() * 1e-9;
        if (left < 0) left = 0;
      }
      int ready = wait_event(p->api, p->events[i], left);
      if (ready < 0) return NULL;
      if (ready == 0) return promise_timed_out(timeout);
    }
    promise_harvest(p);
  }
  if (p->error != NULL) {
    promise_raise_error(p->error);
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
