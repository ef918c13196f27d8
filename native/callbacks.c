/* Promise notifications: add_done_callback and await.
 *
 * Driven by PJRT_Event_OnReady: a record holding the promise is registered per
 * event, and the PJRT thread that fires the last one takes the GIL (through
 * the gate, state.c) and runs the callbacks. A callback's exception never
 * stops the others.
 */
#include "promise.h"

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
      clear_for_fallback();
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
  if (p->job == NULL) {
    promise_harvest(p);
  } else if (!p->done && staged_promise_poll(p) < 0) { /* a staged copy: the job's outcome */
    PyErr_Clear(); /* (its events are none: harvesting said "done, no error" of failed work) */
  }
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

/* promise_notified on a PJRT thread, inside the plugin's event callback.
 * Waits without a bound are refused in the done callbacks run there
 * (refuse_wait_in_callback), as in host callbacks: when every plugin worker
 * ran a callback waiting for new work, none was left to run it, and
 * effects_barrier() waited for the execution whose event ran the callback.
 * (The staging notifier is pjrt_py's own thread: its callbacks may wait.) */
static void promise_notified_on_pjrt_thread(PromiseObject* p) {
  t_in_done_callback++;
  promise_notified(p);
  t_in_done_callback--;
}

/* With the GIL. */
static void watch_notify(void* arg) {
  watch_record* r = (watch_record*)arg;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb); /* the callback may fire inside a call with one set */
  promise_notified_on_pjrt_thread(r->p);
  Py_DECREF(r->p);
  PyErr_Restore(type, value, tb);
}

static void watch_fired(PJRT_Error* error, void* arg) {
  watch_record* r = (watch_record*)arg;
  error_destroy(r->api, error); /* ours; the status is read through PJRT_Event_Error */
  gate_call(watch_notify, r); /* exiting: the promise is leaked, never touched */
  free(r);
}

static PyObject* promise_add_done_callback(PromiseObject* p, PyObject* fn) {
  if (!PyCallable_Check(fn)) {
    PyObject* name = type_name(fn);
    PyErr_Format(PyExc_TypeError, "add_done_callback takes a callable, not %U", name);
    Py_DECREF(name);
    return NULL;
  }
  if (promise_poll(p) < 0) return NULL;
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
  p->watching = p->num_events + 1 + (p->job != NULL);
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
  if (p->job != NULL && !staged_promise_watch(p)) p->watching--; /* ended meanwhile */
  promise_notified(p); /* the +1 above */
  Py_RETURN_NONE;
}

/* await: the iterator comes from pjrt_py.runtime.promise (an asyncio future woken by
 * a done callback). */
static PyObject* promise_await(PromiseObject* p) {
  if (hook_await == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "pjrt_py.runtime.promise is not initialised");
    return NULL;
  }
  PyObject* awaitable = PyObject_CallFunctionObjArgs(hook_await, (PyObject*)p, NULL);
  if (awaitable == NULL) return NULL;
  PyObject* iterator = PyObject_GetIter(awaitable);
  Py_DECREF(awaitable);
  return iterator;
}
