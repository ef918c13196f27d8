/* Promises: events and what they will give (promise.c, promise_types.c,
 * callbacks.c). */
#ifndef PJRT_PY_PROMISE_H
#define PJRT_PY_PROMISE_H

#include "buffer.h"

/* A promise: events (made on first use), what they said, and callbacks. */
enum { PROMISE_BUFFERS = 0, PROMISE_ARRAY = 1, PROMISE_COMPLETION = 2 };

typedef struct {
  PyObject_HEAD
  int kind;            /* PROMISE_* */
  int arity;           /* buffers: 1 -> a Buffer, 0 -> None, else a tuple */
  BufferObject* one;   /* the one Buffer (buffers), or the copy's source (array) */
  PyObject* buffers;   /* a tuple of Buffers, where there are several or none */
  /* A one-output execution's output until someone asks for its Buffer (most
   * dispatched results are only chained or dropped): the handle, owned here. */
  PJRT_Buffer* raw;
  PyObject* raw_meta;
  PyObject* owner; /* the Python Client, to make that Buffer */
  acct_tag raw_acct; /* the bytes raw counts, handed to its Buffer (accounting.h) */
  buffer_origin raw_origin; /* what is known of it (device, memory, layout) */
  int raw_ready;
  int raw_pins; /* calls using raw without the GIL (dispatch.c); moved to its Buffer once made */
  PyObject* array;     /* the numpy destination (array) */
  pjrt_py_client* c;   /* completion promises hold one reference */
  const PJRT_Api* api;
  PJRT_Event** events; /* NULL until made */
  int num_events;
  int made;            /* events made */
  int done;            /* all events ready; error harvested */
  int failed;          /* the work failed at dispatch: no buffers, only `error` */
  int watching;        /* OnReady notifications outstanding */
  PyObject* error;     /* the first error of the work, or NULL */
  PyObject* callbacks; /* list, or NULL */
  PyObject* weakrefs;
  struct staging_job* job; /* a staged copy's outcome instead of events (staging_d2h.c) */
} PromiseObject;

/* promise.c */
static PyTypeObject* PromiseType;
static PyTypeObject* BufferPromiseType;
static PyTypeObject* ArrayPromiseType;
static PyObject* promise_of_buffers(PyObject* buffers, int arity);
static PyObject* promise_of_one(BufferObject* buffer);
static PyObject* promise_of_output(PyObject* owner, pjrt_py_client* c, PJRT_Buffer* raw,
                                   PyObject* meta, const buffer_origin* origin);
static BufferObject* promise_at(PromiseObject* p, Py_ssize_t i);
static PyObject* promise_of_array(pjrt_py_client* c, PyObject* array, PyObject* source,
                                  PJRT_Event* event);
static PyObject* promise_of_completion(pjrt_py_client* c, PJRT_Event* event);

/* Raises a promise's stored error afresh: every value() raises the same
 * object, whose traceback grew by one entry per raise (a million polls of a
 * failed promise kept a million frames). */
static inline void promise_raise_error(PyObject* error) {
  PyException_SetTraceback(error, Py_None);
  PyErr_SetObject((PyObject*)Py_TYPE(error), error);
}

/* staging_d2h.c: a promise whose outcome is a staged copy's (p->job) */
static int staged_promise_poll(PromiseObject* p);
static int staged_promise_wait(PromiseObject* p, double timeout);
static int staged_promise_watch(PromiseObject* p);
static void staged_job_release(struct staging_job* job);

#endif
