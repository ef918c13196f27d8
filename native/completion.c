/* Completion tracking, for effects_barrier() and for ending clients.
 *
 * Every execution's completion event comes here. One already ready (the CPU
 * plugin runs cheap programs inline at dispatch) is dropped at once, so the
 * common small call pays one readiness check. Otherwise it counts as running
 * in the client's newest epoch until its OnReady callback arrives.
 *
 * A barrier closes the newest epoch (opening a fresh one for later
 * dispatches) and waits until no epoch up to the closed one has executions
 * running: work dispatched after it started, from any thread, never extends
 * its wait. Epochs are a list, oldest first; one is freed once it is both
 * closed and empty.
 */
#include "client.h"

#include <errno.h>
#include <stdlib.h>

/* One execution being counted: over several devices, one record for all
 * their events, so that the epoch's lock is taken once at the start and
 * once at the end, not once per device each way. */
typedef struct {
  pjrt_py_client* c;
  pjrt_py_epoch* epoch;
  long pending; /* events not fired yet, plus one while they are registered (atomic) */
} running_record;

static void reaper_poke(pjrt_py_client* c); /* state.c */
static void reaper_wake(void);

/* Frees the empty closed epochs at the head. Caller holds c->mu. */
static void epochs_trim(pjrt_py_client* c) {
  while (c->oldest != c->newest && c->oldest->running == 0) {
    pjrt_py_epoch* e = c->oldest;
    c->oldest = e->next;
    free(e);
  }
}

static long completion_running_locked(pjrt_py_client* c) {
  long n = 0;
  for (pjrt_py_epoch* e = c->oldest; e != NULL; e = e->next) n += e->running;
  return n;
}

static long completion_running(pjrt_py_client* c) {
  pthread_mutex_lock(&c->mu);
  long n = completion_running_locked(c);
  pthread_mutex_unlock(&c->mu);
  return n;
}

/* One counted execution completed (or will never be reported). */
static void completion_done(running_record* r) {
  pjrt_py_client* c = r->c;
  pthread_mutex_lock(&c->mu);
  r->epoch->running--;
  epochs_trim(c);
  long left = completion_running_locked(c);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  free(r);
  if (left == 0) reaper_poke(c);
}

/* One of an execution's events fired; the last one ends its count. */
static void completion_release(running_record* r) {
  if (__atomic_sub_fetch(&r->pending, 1, __ATOMIC_ACQ_REL) == 0) completion_done(r);
}

static void completion_fired(PJRT_Error* error, void* user_arg) {
  running_record* r = (running_record*)user_arg;
  error_destroy(r->c->api, error); /* the outcome belongs to the execution's outputs */
  completion_release(r);
}

/* Counts one execution until its `n` completion events (one per device;
 * NULL ones skipped) are all ready. Does not take the events (the caller
 * destroys them when it likes; PJRT keeps the callbacks registered). Events
 * already ready (the CPU plugin runs cheap programs inline) cost one check
 * each and no count. Needs no GIL. */
static void completion_track(pjrt_py_client* c, PJRT_Event* const* events, size_t n) {
  size_t first = 0;
  while (first < n && (events[first] == NULL || event_is_ready(c->api, events[first]))) first++;
  if (first == n) return;
  running_record* r = (running_record*)malloc(sizeof(*r));
  if (r == NULL) return; /* the barrier cannot see this one; nothing worse */
  r->c = c;
  r->pending = 1; /* held until every callback is registered */
  pthread_mutex_lock(&c->mu);
  r->epoch = c->newest;
  r->epoch->running++;
  pthread_mutex_unlock(&c->mu);
  for (size_t d = first; d < n; ++d) {
    if (events[d] == NULL) continue;
    __atomic_add_fetch(&r->pending, 1, __ATOMIC_ACQ_REL);
    PJRT_Error* error = event_on_ready(c->api, events[d], completion_fired, r);
    if (error != NULL) { /* no callback will come for this one */
      error_destroy(c->api, error);
      completion_release(r);
    }
  }
  completion_release(r);
}

/* ---- copies in flight ------------------------------------------------------ */

/* Host-to-device and device-to-host copies are counted per client until
 * their event fires, so that neither the exit sequence nor the reaper
 * destroys a client under one: the CPU plugin's client destructor tears down
 * the work runner a device-to-host copy is still running on (SIGSEGV in
 * CpuRawBuffer::CopyToLiteralAsync, 3 exits in 50 with a to_numpy_async in
 * flight). Not part of effects_barrier(), which waits for executions. */

static long transfers_in_flight(pjrt_py_client* c) {
  return __atomic_load_n(&c->transfers, __ATOMIC_ACQUIRE);
}

static void transfer_fired(PJRT_Error* error, void* user_arg) {
  pjrt_py_client* c = (pjrt_py_client*)user_arg;
  error_destroy(c->api, error); /* the copy's outcome is read through its own event */
  /* From here on c may be freed (by its last owner or the reaper). */
  if (__atomic_sub_fetch(&c->transfers, 1, __ATOMIC_ACQ_REL) == 0) reaper_wake();
}

/* Counts one copy until `event` is ready. Does not take the event. Needs no
 * GIL. */
static void transfer_track(pjrt_py_client* c, PJRT_Event* event) {
  if (event == NULL || event_is_ready(c->api, event)) return;
  __atomic_add_fetch(&c->transfers, 1, __ATOMIC_ACQ_REL);
  PJRT_Error* error = event_on_ready(c->api, event, transfer_fired, c);
  if (error != NULL) { /* no callback will come */
    error_destroy(c->api, error);
    __atomic_sub_fetch(&c->transfers, 1, __ATOMIC_ACQ_REL);
  }
}

/* Closes c's newest epoch; returns its id (-1: out of memory). */
static long barrier_close_epoch(pjrt_py_client* c) {
  pjrt_py_epoch* fresh = (pjrt_py_epoch*)calloc(1, sizeof(*fresh));
  if (fresh == NULL) return -1;
  pthread_mutex_lock(&c->mu);
  long closed = c->newest->id;
  fresh->id = closed + 1;
  c->newest->next = fresh;
  c->newest = fresh;
  epochs_trim(c);
  pthread_mutex_unlock(&c->mu);
  return closed;
}

/* Waits up to one slice for epochs up to `closed` to empty. Needs no GIL.
 * 1: they have. */
static int barrier_wait_slice(pjrt_py_client* c, long closed) {
  struct timespec until;
  deadline_in(&until, PJRT_PY_SLICE_NS);
  pthread_mutex_lock(&c->mu);
  while (c->oldest->id <= closed) {
    if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT) break;
  }
  int done = c->oldest->id > closed;
  pthread_mutex_unlock(&c->mu);
  return done;
}

/* effects_barrier(): waits for every execution dispatched so far on every
 * client of this process that still has an owner. Interruptible. */
static PyObject* core_effects_barrier(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  const char* inside = callback_on_pjrt_thread(); /* it would wait for itself */
  if (inside != NULL)
    return PyErr_Format(PyExc_RuntimeError,
                        "effects_barrier() inside a %s would wait for the execution "
                        "that runs the callback", inside);
  /* Take a reference on each client, under the registry lock, so that a
   * concurrent close() or the reaper cannot free one while this waits. */
  size_t n = 0, cap = 8;
  pjrt_py_client** clients = (pjrt_py_client**)malloc(cap * sizeof(*clients));
  if (clients == NULL) return PyErr_NoMemory();
  pthread_mutex_lock(&g_registry_mu);
  for (pjrt_py_client* c = g_clients; c != NULL; c = c->next) {
    if (c->client == NULL) continue;
    if (n == cap) {
      pjrt_py_client** more = (pjrt_py_client**)realloc(clients, 2 * cap * sizeof(*clients));
      if (more == NULL) break; /* wait for those collected so far */
      clients = more;
      cap *= 2;
    }
    client_ref(c);
    clients[n++] = c;
  }
  pthread_mutex_unlock(&g_registry_mu);

  int failed = 0;
  for (size_t i = 0; i < n && !failed; ++i) {
    long closed = barrier_close_epoch(clients[i]);
    if (closed < 0) {
      PyErr_NoMemory();
      failed = 1;
      break;
    }
    for (;;) {
      int done;
      Py_BEGIN_ALLOW_THREADS
      done = barrier_wait_slice(clients[i], closed);
      Py_END_ALLOW_THREADS
      if (done) break;
      if (PyErr_CheckSignals() < 0) {
        failed = 1;
        break;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) client_unref(clients[i]);
  free(clients);
  if (failed) return NULL;
  Py_RETURN_NONE;
}
