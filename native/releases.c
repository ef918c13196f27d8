/* Releases from threads without the GIL: run_with_gil() and its queue.
 *
 * Shared by DLPack export (a consumer's deleter) and import (PJRT's
 * on_delete_callback for a view); see the comment below.
 */
#include "common.h"

/* ---- releases from other threads ------------------------------------------------
 * A view's memory is released by PJRT's on_delete_callback, an export's by
 * the consumer's deleter: either may run on a thread of the plugin (or of the
 * consumer's runtime) that does not hold the GIL, when the last execution
 * reading the memory ends there. Such a thread must not wait for the GIL: the
 * work queued behind it would wait too, until Python next lets go (measured:
 * some 20 us per call in a jax round trip). It queues the release instead,
 * and asks the interpreter to run the queue at its next chance
 * (Py_AddPendingCall, made for this). A thread that holds the GIL (a Destroy
 * called from Python) releases at once. */

typedef struct {
  void (*fn)(void*); /* runs with the GIL */
  void* arg;
} deferred;

static pthread_mutex_t g_deferred_mu = PTHREAD_MUTEX_INITIALIZER;
static deferred* g_deferred = NULL;
static size_t g_deferred_len = 0, g_deferred_cap = 0;
static int g_deferred_scheduled = 0;

/* In a child made by fork(): a PJRT thread of the parent may have held the
 * lock, and the interpreter's pending call is not ours to count on. The
 * queued releases stay; the next release or drain runs them. */
static void deferred_after_fork(void) {
  pthread_mutex_init(&g_deferred_mu, NULL);
  g_deferred_scheduled = 0;
}

/* Runs the queued releases. With the GIL. */
static int deferred_drain(void* unused) {
  (void)unused;
  for (;;) {
    pthread_mutex_lock(&g_deferred_mu);
    g_deferred_scheduled = 0;
    deferred* items = g_deferred;
    size_t n = g_deferred_len;
    g_deferred = NULL;
    g_deferred_len = g_deferred_cap = 0;
    pthread_mutex_unlock(&g_deferred_mu);
    if (n == 0) return 0;
    for (size_t i = 0; i < n; ++i) items[i].fn(items[i].arg);
    free(items);
  }
}

/* Runs fn(arg) with the GIL: now if this thread holds it, else soon on a
 * Python thread. Inside the gate (the caller entered it). */
static void run_with_gil(void (*fn)(void*), void* arg) {
  if (PyGILState_Check()) {
    fn(arg);
    return;
  }
  pthread_mutex_lock(&g_deferred_mu);
  int queued = 0, schedule = 0;
  if (g_deferred_len == g_deferred_cap) {
    size_t cap = g_deferred_cap ? 2 * g_deferred_cap : 16;
    deferred* grown = (deferred*)realloc(g_deferred, cap * sizeof(deferred));
    if (grown != NULL) {
      g_deferred = grown;
      g_deferred_cap = cap;
    }
  }
  if (g_deferred_len < g_deferred_cap) {
    g_deferred[g_deferred_len].fn = fn;
    g_deferred[g_deferred_len].arg = arg;
    g_deferred_len++;
    queued = 1;
    schedule = !g_deferred_scheduled;
    g_deferred_scheduled = 1;
  }
  pthread_mutex_unlock(&g_deferred_mu);
  if (schedule && Py_AddPendingCall(deferred_drain, NULL) < 0) {
    pthread_mutex_lock(&g_deferred_mu);
    g_deferred_scheduled = 0; /* the interpreter's queue is full: the next release asks again */
    pthread_mutex_unlock(&g_deferred_mu);
  }
  if (!queued) { /* no memory for the queue: wait for the GIL after all */
    PyGILState_STATE gil = PyGILState_Ensure();
    fn(arg);
    PyGILState_Release(gil);
  }
}

/* run_with_gil from a thread that is not in the gate, unless the exit
 * sequence has begun: then fn does not run, and what it would release is
 * kept to the process exit. */
static void run_with_gil_unless_exiting(void (*fn)(void*), void* arg) {
  if (!gate_enter()) return;
  run_with_gil(fn, arg);
  gate_leave();
}

static void drop_reference(void* object) { Py_DECREF((PyObject*)object); }
