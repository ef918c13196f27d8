/* Events: readiness, interruptible waits, and releasing host memory.
 *
 * PJRT runs OnReady callbacks on its own threads, and sometimes at once on the
 * registering thread. The callbacks here do the minimum: signal a condition
 * variable, or take the GIL (through the gate, see state.c) to drop a
 * reference.
 *
 * Waits run with the GIL released, in slices: between slices the thread takes
 * the GIL back and runs Python's signal handlers, so Ctrl-C raises
 * KeyboardInterrupt within a slice while the work goes on.
 */
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

#define PJRT_PY_SLICE_NS (20L * 1000 * 1000) /* how often a wait looks for signals */

static int event_is_ready(const PJRT_Api* api, PJRT_Event* event) {
  PJRT_Event_IsReady_Args args = {0};
  args.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE;
  args.event = event;
  PJRT_Error* error = api->PJRT_Event_IsReady(&args);
  if (error != NULL) { /* a failing query counts as ready: PJRT_Event_Error reports */
    error_destroy(api, error);
    return 1;
  }
  return args.is_ready ? 1 : 0;
}

static PJRT_Error* event_error(const PJRT_Api* api, PJRT_Event* event) {
  PJRT_Event_Error_Args args = {0};
  args.struct_size = PJRT_Event_Error_Args_STRUCT_SIZE;
  args.event = event;
  return api->PJRT_Event_Error(&args);
}

static void event_destroy(const PJRT_Api* api, PJRT_Event* event) {
  if (event == NULL) return;
  PJRT_Event_Destroy_Args args = {0};
  args.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  args.event = event;
  error_destroy(api, api->PJRT_Event_Destroy(&args));
}

static PJRT_Error* event_on_ready(const PJRT_Api* api, PJRT_Event* event,
                                  PJRT_Event_OnReadyCallback callback, void* arg) {
  PJRT_Event_OnReady_Args args = {0};
  args.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  args.event = event;
  args.callback = callback;
  args.user_arg = arg;
  return api->PJRT_Event_OnReady(&args);
}

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* ---- spinning ------------------------------------------------------------- */

/* Work on the CPU plugin often finishes a few microseconds after the caller
 * starts waiting, while putting a thread to sleep and waking it costs some
 * 30 us on a small VM: a wait polls PJRT_Event_IsReady this long first.
 * Measured in benchmarks/small.py; $PJRT_PY_SPIN_US overrides it. */
static long g_spin_ns = 50000;

static PyObject* core_set_spin_ns(PyObject* self, PyObject* arg) {
  (void)self;
  long ns = PyLong_AsLong(arg);
  if (ns == -1 && PyErr_Occurred()) return NULL;
  g_spin_ns = ns < 0 ? 0 : ns;
  Py_RETURN_NONE;
}

static PyObject* core_spin_ns(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return PyLong_FromLong(g_spin_ns);
}

/* ---- timed, interruptible waits --------------------------------------------- */

/* A waiter: the callback and the waiting thread each hold a reference. */
typedef struct {
  const PJRT_Api* api;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  int refs;
} waiter;

static void waiter_release(waiter* w) {
  pthread_mutex_lock(&w->mu);
  int left = --w->refs;
  pthread_mutex_unlock(&w->mu);
  if (left == 0) {
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
  }
}

static void waiter_ready(PJRT_Error* error, void* arg) {
  waiter* w = (waiter*)arg;
  error_destroy(w->api, error); /* ours to free; the status is read through PJRT_Event_Error */
  pthread_mutex_lock(&w->mu);
  w->done = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  waiter_release(w);
}

/* The clock of every timed wait on a condition variable made by cond_init.
 * Monotonic where the C library can say so: a wall-clock step (NTP on a
 * virtual machine) would stretch a 20 ms slice, and with it the time before
 * Ctrl-C is seen, by the size of the step. */
#if defined(__linux__)
#define PJRT_PY_WAIT_CLOCK CLOCK_MONOTONIC
#else
#define PJRT_PY_WAIT_CLOCK CLOCK_REALTIME
#endif

/* A condition variable whose timed waits take deadline_in's deadlines. */
static void cond_init(pthread_cond_t* cv) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
#if defined(__linux__)
  pthread_condattr_setclock(&attr, PJRT_PY_WAIT_CLOCK);
#endif
  pthread_cond_init(cv, &attr);
  pthread_condattr_destroy(&attr);
}

static void deadline_in(struct timespec* ts, long ns) {
  clock_gettime(PJRT_PY_WAIT_CLOCK, ts);
  ts->tv_sec += ns / 1000000000L;
  ts->tv_nsec += ns % 1000000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec += 1;
    ts->tv_nsec -= 1000000000L;
  }
}

/* -1 with RuntimeError inside a host callback or a done callback run on a
 * PJRT thread, where a wait without a bound for work not ready may never
 * end; else 0. */
static int refuse_wait_in_callback(void) {
  const char* inside = callback_on_pjrt_thread();
  if (inside == NULL) return 0;
  PyErr_Format(PyExc_RuntimeError,
               "cannot wait for a result that is not ready inside a %s: the "
               "plugin thread running the callback may be the one that work needs, so the "
               "wait could never end. %s, read results that are ready, or wait with a timeout",
               inside,
               t_in_host_callback ? "Dispatch (execute_async) and return"
                                  : "Hand the work to another thread (a queue, an Event), "
                                    "chain it with execute_async");
  return -1;
}

/* Waits until `event` is ready or `timeout` seconds pass (< 0 or inf:
 * forever). Called with the GIL; releases it while waiting. Returns 1 when
 * ready, 0 on timeout, -1 with an exception set (a signal handler raised). */
static int wait_event(const PJRT_Api* api, PJRT_Event* event, double timeout) {
  if (event_is_ready(api, event)) return 1;
  bool forever = timeout < 0 || isinf(timeout);
  if (forever && refuse_wait_in_callback() < 0) return -1;
  long start = now_ns();
  double limit_ns = forever ? 0 : timeout * 1e9;
  long spin = g_spin_ns;
  if (!forever && limit_ns < (double)spin) spin = (long)limit_ns;
  int ready = 0;
  if (spin > 0) {
    Py_BEGIN_ALLOW_THREADS
    long until = start + spin;
    do {
      ready = event_is_ready(api, event);
    } while (!ready && now_ns() < until);
    Py_END_ALLOW_THREADS
    if (ready) return 1;
  }
  /* No time left (value(timeout=0) polling): no callback registered, which
   * the plugin would keep until the event fires, one per poll. */
  if (!forever && (double)(now_ns() - start) >= limit_ns) return event_is_ready(api, event);
  waiter* w = (waiter*)calloc(1, sizeof(*w));
  if (w == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  w->api = api;
  pthread_mutex_init(&w->mu, NULL);
  cond_init(&w->cv);
  w->refs = 2;
  PJRT_Error* error = event_on_ready(api, event, waiter_ready, w);
  if (error != NULL) { /* no callback will come: poll instead */
    error_destroy(api, error);
    w->refs = 1;
  }
  bool polling = error != NULL;
  for (;;) {
    long slice = PJRT_PY_SLICE_NS;
    if (!forever) {
      double left = limit_ns - (double)(now_ns() - start);
      if (left <= 0) break;
      if (left < (double)slice) slice = (long)left;
    }
    Py_BEGIN_ALLOW_THREADS
    if (polling) {
      struct timespec pause = {0, slice < 1000000L ? slice : 1000000L};
      nanosleep(&pause, NULL);
      ready = event_is_ready(api, event);
    } else {
      struct timespec until;
      deadline_in(&until, slice);
      pthread_mutex_lock(&w->mu);
      while (!w->done) {
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT) break;
      }
      ready = w->done;
      pthread_mutex_unlock(&w->mu);
    }
    Py_END_ALLOW_THREADS
    if (ready) break;
    if (PyErr_CheckSignals() < 0) {
      waiter_release(w);
      return -1;
    }
  }
  if (!ready) ready = event_is_ready(api, event);
  waiter_release(w);
  return ready;
}

/* Reads a timeout argument: None -> -1 (forever); inf -> -1; NaN or negative
 * -> ValueError. Returns 0, or -1 with an exception set. */
static int parse_timeout(PyObject* arg, double* timeout) {
  if (arg == NULL || arg == Py_None) {
    *timeout = -1;
    return 0;
  }
  if (PyBool_Check(arg) || PyArray_IsScalar(arg, Bool) || !PyNumber_Check(arg)) {
    PyObject* name = type_name(arg);
    PyErr_Format(PyExc_TypeError, "timeout must be a number of seconds or None, not %U", name);
    Py_DECREF(name);
    return -1;
  }
  double t = PyFloat_AsDouble(arg);
  if (t == -1.0 && PyErr_Occurred()) { /* an int past any float: as inf, or negative */
    if (!PyLong_Check(arg) || !PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
    PyObject* zero = PyLong_FromLong(0);
    int positive = zero != NULL ? PyObject_RichCompareBool(arg, zero, Py_GT) : -1;
    Py_XDECREF(zero);
    if (positive < 0) return -1;
    t = positive ? INFINITY : -1.0;
  }
  if (isnan(t) || t < 0) {
    PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds (or None, or inf), not %R",
                 arg);
    return -1;
  }
  *timeout = isinf(t) ? -1 : t;
  return 0;
}

/* ---- host memory PJRT may still use ---------------------------------------- */

/* Memory PJRT reads (a host-to-device source, a zero-copy alias) or writes (a
 * device-to-host destination) after the call that handed it over: a
 * reference is kept until the event says PJRT is done. The callback drops it
 * under the GIL; the event is destroyed at the next sweep, not inside its own
 * callback. After exit or fork the reference is simply kept. */
typedef struct release_record {
  const PJRT_Api* api;
  PJRT_Event* event;
  PyObject* keep;
  struct release_record* next;
} release_record;

static pthread_mutex_t g_release_mu = PTHREAD_MUTEX_INITIALIZER;
static release_record* g_released = NULL; /* fired: their events await destruction */
static long g_holds = 0;                  /* records whose callback has not run */

static void release_drop(void* arg) { Py_CLEAR(((release_record*)arg)->keep); }

static void release_fired(PJRT_Error* error, void* arg) {
  release_record* r = (release_record*)arg;
  error_destroy(r->api, error); /* ours to free */
  gate_call(release_drop, r); /* exiting: the reference is simply kept */
  pthread_mutex_lock(&g_release_mu);
  g_holds--;
  r->next = g_released;
  g_released = r;
  pthread_mutex_unlock(&g_release_mu);
}

/* Destroys the events of fired records. With the GIL, from ordinary calls. */
static void release_sweep(void) {
  pthread_mutex_lock(&g_release_mu);
  release_record* r = g_released;
  g_released = NULL;
  pthread_mutex_unlock(&g_release_mu);
  while (r != NULL) {
    release_record* next = r->next;
    event_destroy(r->api, r->event);
    free(r);
    r = next;
  }
}

/* Keeps `keep` alive until `event` is ready, then destroys the event. Takes
 * the event; borrows `keep`. With the GIL. */
static void release_on_ready(const PJRT_Api* api, PJRT_Event* event, PyObject* keep) {
  if (event == NULL) return;
  if (event_is_ready(api, event)) {
    event_destroy(api, event);
    return;
  }
  release_sweep(); /* events of records fired since the last new one */
  release_record* r = (release_record*)calloc(1, sizeof(*r));
  if (r == NULL) { /* cannot track it: keep the memory forever rather than free it early */
    Py_XINCREF(keep);
    return;
  }
  r->api = api;
  r->event = event;
  r->keep = keep;
  Py_XINCREF(keep);
  pthread_mutex_lock(&g_release_mu);
  g_holds++;
  pthread_mutex_unlock(&g_release_mu);
  PJRT_Error* error = event_on_ready(api, event, release_fired, r);
  if (error != NULL) { /* no callback will come: keep it forever */
    error_destroy(api, error);
    pthread_mutex_lock(&g_release_mu);
    g_holds--;
    pthread_mutex_unlock(&g_release_mu);
  }
}

static PyObject* core_pending_holds(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  release_sweep();
  pthread_mutex_lock(&g_release_mu);
  long n = g_holds;
  pthread_mutex_unlock(&g_release_mu);
  return PyLong_FromLong(n);
}
