/* Process state: fork generations, the exit sequence, the registry of live
 * clients, the gate PJRT threads pass to enter Python, and the reaper.
 *
 * Fork. A child process inherits the parent's memory but none of its
 * threads: the plugin's worker threads are gone, and a PJRT client made
 * before the fork can neither run work nor be destroyed (destroying it joins
 * threads that do not exist). after_fork_in_child() starts a new generation:
 * objects of an older one raise when used, are freed without calling PJRT,
 * and are never destroyed at exit. A new Client in the child works.
 *
 * Exit. exit_sequence() (called by Python's atexit) stops PJRT threads from
 * entering Python, waits a bounded time for running executions and calls in
 * flight, destroys every idle client (joining the plugin's threads while the
 * memory they may touch is alive), and skips the others: a client whose
 * work never ends is left to the process exit, as is a destroy the reaper
 * still runs. From then on no PJRT call is made.
 *
 * Reaper. A client whose last owner goes while executions still run is not
 * destroyed there (destroying it would wait for them, maybe forever); a
 * thread of ours destroys it once they complete.
 */
#include "client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { PHASE_RUNNING = 0, PHASE_EXITING = 1, PHASE_FINISHED = 2 };

static unsigned long g_generation = 1;
static int g_phase = PHASE_RUNNING;
static int g_python_gone = 0; /* Python has finalized (python_finalized) */

static pthread_mutex_t g_registry_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_registry_cv = PTHREAD_COND_INITIALIZER; /* a zombie may be done */
static pjrt_py_client* g_clients = NULL;
static int g_reaper_started = 0;
static int g_reaping = 0; /* the reaper is destroying a client now */

static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static int g_gate_closed = 0;
static int g_gate_active = 0;

static int phase(void) { return __atomic_load_n(&g_phase, __ATOMIC_ACQUIRE); }

/* May `c` still reach PJRT at all (destroying handles included)? */
static bool state_pjrt_allowed(const pjrt_py_client* c) {
  return c->generation == g_generation && phase() != PHASE_FINISHED &&
         __atomic_load_n(&c->client, __ATOMIC_ACQUIRE) != NULL;
}

/* 0 if new work may use `c`; else -1 with ValueError naming `what`. */
static int state_check_usable(const pjrt_py_client* c, const char* what) {
  if (c->generation != g_generation) {
    PyErr_Format(PyExc_ValueError,
                 "%s belongs to a client created before os.fork() in the parent process; "
                 "create a new pjrt_py.Client in this process",
                 what);
    return -1;
  }
  if (phase() != PHASE_RUNNING) {
    PyErr_Format(PyExc_ValueError, "%s: the interpreter is exiting", what);
    return -1;
  }
  if (__atomic_load_n(&c->closed, __ATOMIC_ACQUIRE)) {
    PyErr_Format(PyExc_ValueError, "%s belongs to a closed client", what);
    return -1;
  }
  return 0;
}

/* ---- the gate: PJRT threads entering Python ------------------------------ */

/* How deep this thread is in callbacks that entered Python from PJRT. A
 * client whose last reference goes there must not be destroyed there: the
 * plugin would join the very thread doing it (client_unref hands it to the
 * reaper instead). */
static _Thread_local int t_in_callback = 0;

static bool gate_enter(void) {
  pthread_mutex_lock(&g_gate_mu);
  bool open = !g_gate_closed;
  if (open) g_gate_active++;
  pthread_mutex_unlock(&g_gate_mu);
  if (open) t_in_callback++;
  return open;
}

static void gate_leave(void) {
  t_in_callback--;
  pthread_mutex_lock(&g_gate_mu);
  if (--g_gate_active == 0) pthread_cond_broadcast(&g_gate_cv);
  pthread_mutex_unlock(&g_gate_mu);
}

/* ---- the registry ---------------------------------------------------------- */

static void registry_add(pjrt_py_client* c) {
  pthread_mutex_lock(&g_registry_mu);
  c->prev = NULL;
  c->next = g_clients;
  if (g_clients != NULL) g_clients->prev = c;
  g_clients = c;
  pthread_mutex_unlock(&g_registry_mu);
}

/* Caller holds g_registry_mu. */
static void registry_remove_locked(pjrt_py_client* c) {
  if (c->prev != NULL) c->prev->next = c->next;
  if (c->next != NULL) c->next->prev = c->prev;
  if (g_clients == c) g_clients = c->next;
  c->prev = c->next = NULL;
}

static void client_free(pjrt_py_client* c); /* client_ref.c */
static void client_destroy_pjrt(pjrt_py_client* c);

/* ---- the reaper ------------------------------------------------------------ */

static void* reaper_main(void* unused) {
  (void)unused;
  pthread_mutex_lock(&g_registry_mu);
  for (;;) {
    /* Once the exit sequence has run, no PJRT call is made: a zombie whose
     * work ended after it stays to the process exit. */
    if (phase() == PHASE_FINISHED) break;
    pjrt_py_client* done = NULL;
    for (pjrt_py_client* c = g_clients; c != NULL; c = c->next) {
      /* An effects_barrier() may hold a reference while it waits. */
      if (c->zombie && __atomic_load_n(&c->refs, __ATOMIC_RELAXED) == 0 &&
          completion_running(c) == 0 && transfers_in_flight(c) == 0) {
        done = c;
        break;
      }
    }
    if (done == NULL) {
      pthread_cond_wait(&g_registry_cv, &g_registry_mu);
      continue;
    }
    registry_remove_locked(done);
    g_reaping = 1;
    pthread_mutex_unlock(&g_registry_mu);
    client_destroy_pjrt(done);
    client_free(done);
    pthread_mutex_lock(&g_registry_mu);
    g_reaping = 0;
    pthread_cond_broadcast(&g_registry_cv);
  }
  pthread_mutex_unlock(&g_registry_mu);
  return NULL;
}

/* Hand `c` (no owner left, executions running) to the reaper. */
static void reaper_adopt(pjrt_py_client* c) {
  pthread_mutex_lock(&g_registry_mu);
  c->zombie = 1;
  if (!g_reaper_started) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, reaper_main, NULL) == 0) g_reaper_started = 1;
    pthread_attr_destroy(&attr);
    /* Without a thread the zombie is left for exit_sequence(): a leak, no hang. */
  }
  pthread_cond_broadcast(&g_registry_cv);
  pthread_mutex_unlock(&g_registry_mu);
}

/* A zombie may be done; touches no client. */
static void reaper_wake(void) {
  pthread_mutex_lock(&g_registry_mu);
  pthread_cond_broadcast(&g_registry_cv);
  pthread_mutex_unlock(&g_registry_mu);
}

/* Called by completion.c when an epoch empties: a zombie may be done. */
static void reaper_poke(pjrt_py_client* c) {
  if (__atomic_load_n(&c->zombie, __ATOMIC_ACQUIRE)) reaper_wake();
}

/* ---- fork -------------------------------------------------------------------- */

/* The registry's and the gate's locks, new: at import, so that the gate's
 * timed wait runs on the clock deadline_in measures (events.c), and in a
 * forked child, where a thread that does not exist may have held them. */
static void state_locks_init(void) {
  pthread_mutex_init(&g_registry_mu, NULL);
  cond_init(&g_registry_cv);
  pthread_mutex_init(&g_gate_mu, NULL);
  cond_init(&g_gate_cv);
}

static PyObject* core_after_fork_in_child(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  /* The parent's clients stay allocated, unreachable from the registry:
   * their locks may have been held by threads that do not exist here. */
  g_generation++;
  state_locks_init();
  g_clients = NULL;
  g_reaper_started = 0;
  g_reaping = 0;
  g_gate_closed = 0;
  g_gate_active = 0;
  t_in_callback = 0; /* a fork from inside a done callback */
  /* Host memory held for the parent's events: those events belong to the
   * parent's plugin instance, and a PJRT thread may have held the lock. */
  pthread_mutex_init(&g_release_mu, NULL);
  g_released = NULL;
  g_holds = 0;
  deferred_after_fork(); /* DLPack releases queued for the interpreter (releases.c) */
  staging_after_fork();  /* staged transfers' threads (staging_pool.c) */
  Py_RETURN_NONE;
}

/* ---- exit ---------------------------------------------------------------------- */

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whether every client is idle: nothing running, no copy or call in
 * flight, the reaper not busy. Caller holds g_registry_mu. */
static bool registry_idle_locked(void) {
  if (g_reaping) return false;
  for (pjrt_py_client* c = g_clients; c != NULL; c = c->next) {
    if (c->client == NULL) continue;
    if (completion_running(c) != 0 || transfers_in_flight(c) != 0 ||
        __atomic_load_n(&c->calls, __ATOMIC_RELAXED) != 0)
      return false;
  }
  return true;
}

/* Where a client was left running, the process must end before the C
 * library runs the plugin's static destructors under its still-running
 * threads (which crashes it now and then). Registered last, this runs first
 * in exit(), after Python has finalized: it flushes C stdio and ends the
 * process with exit()'s own status. glibc only (on_exit passes the status);
 * elsewhere the destructors run as before. */
static void quick_exit_handler(int status, void* unused) {
  (void)unused;
  fflush(NULL);
  _exit(status);
}

static int g_left_running = 0; /* the exit sequence left a client undestroyed */

/* Py_AtExit: the very end of Python's finalization, just before exit().
 * exit() runs its handlers newest first, and a plugin thread still running
 * registers static destructors as it goes (a function-local static made on
 * first use: oneDNN's JIT kernels, seen freeing code other threads ran in 3
 * exits of 60). Registering the handler again here makes it the newest one
 * but for what a thread registers in the few microseconds left. */
static void python_finalized(void) {
  __atomic_store_n(&g_python_gone, 1, __ATOMIC_RELEASE);
#ifdef __GLIBC__
  if (__atomic_load_n(&g_left_running, __ATOMIC_ACQUIRE)) on_exit(quick_exit_handler, NULL);
#endif
}

/* Step 3 of the exit sequence, under g_registry_mu: the clients it may
 * destroy go into *idle (their count in *n_idle); the others are reported
 * and counted, and so is a destroy the reaper still runs. */
static long exit_sort_clients_locked(double timeout, int callbacks_stuck,
                                     pjrt_py_client*** idle, size_t* n_idle) {
  long skipped = 0;
  /* The reaper may be inside PJRT_Client_Destroy of a client it has already
   * taken off the registry: that destroy, too, must not meet the plugin's
   * static destructors (exit() runs them), so the process ends as for a
   * client left running (tests/test_lifetimes.py makes a destroy slow). */
  if (g_reaping) {
    skipped++;
    fprintf(stderr,
            "pjrt_py: at exit, a dropped client was still being destroyed after %.3g s; "
            "the process ends without waiting for it (set PJRT_PY_EXIT_TIMEOUT to wait longer)\n",
            timeout);
  }
  size_t n = 0;
  for (pjrt_py_client* c = g_clients; c != NULL; c = c->next) n++;
  *idle = n ? (pjrt_py_client**)calloc(n, sizeof(**idle)) : NULL;
  for (pjrt_py_client* c = g_clients; c != NULL; c = c->next) {
    if (c->client == NULL) continue;
    long running = completion_running(c);
    long copies = transfers_in_flight(c);
    long calls = __atomic_load_n(&c->calls, __ATOMIC_RELAXED);
    /* A callback still inside Python could be on a thread the plugin
     * would join while this thread holds the GIL: destroy nothing then.
     * Without memory for the list, nothing is destroyed either. */
    if (running != 0 || copies != 0 || calls != 0 || (g_reaping && c->zombie) ||
        callbacks_stuck || *idle == NULL) {
      skipped++;
      fprintf(stderr,
              "pjrt_py: at exit, a client still had %ld execution(s) running, %ld copies "
              "and %ld call(s) in flight after %.3g s; it is left to the process exit, not "
              "destroyed (set PJRT_PY_EXIT_TIMEOUT to wait longer)\n",
              running, copies, calls, timeout);
      continue;
    }
    (*idle)[(*n_idle)++] = c;
  }
  return skipped;
}

/* exit_sequence(timeout) -> number of clients left undestroyed. */
static PyObject* core_exit_sequence(PyObject* self, PyObject* arg) {
  (void)self;
  double timeout = PyFloat_AsDouble(arg);
  if (timeout == -1.0 && PyErr_Occurred()) return NULL;
  if (!(timeout >= 0)) { /* NaN: no deadline ever passes; inf waits as long as it takes */
    PyErr_SetString(PyExc_ValueError, "exit_sequence: timeout must be seconds >= 0");
    return NULL;
  }
  if (callback_on_pjrt_thread() != NULL) { /* it would wait for its own callback */
    PyErr_SetString(PyExc_RuntimeError, "exit_sequence: not from inside a callback");
    return NULL;
  }
  if (phase() != PHASE_RUNNING) return PyLong_FromLong(0);
  double deadline = now_seconds() + timeout;
  __atomic_store_n(&g_phase, PHASE_EXITING, __ATOMIC_RELEASE);
  int callbacks_stuck = 0;

  Py_BEGIN_ALLOW_THREADS
  /* 1. PJRT threads stop entering Python; wait out those inside. */
  pthread_mutex_lock(&g_gate_mu);
  g_gate_closed = 1;
  while (g_gate_active > 0 && now_seconds() < deadline) {
    struct timespec ts;
    deadline_in(&ts, 20 * 1000 * 1000);
    pthread_cond_timedwait(&g_gate_cv, &g_gate_mu, &ts);
  }
  callbacks_stuck = g_gate_active;
  pthread_mutex_unlock(&g_gate_mu);
  /* 2. Wait (bounded) for running executions and calls in flight. Polled:
   * the wait spans many clients, and ends at the deadline regardless. */
  pthread_mutex_lock(&g_registry_mu);
  while (!registry_idle_locked() && now_seconds() < deadline) {
    pthread_mutex_unlock(&g_registry_mu);
    struct timespec pause = {0, 2 * 1000 * 1000};
    nanosleep(&pause, NULL);
    pthread_mutex_lock(&g_registry_mu);
  }
  pthread_mutex_unlock(&g_registry_mu);
  Py_END_ALLOW_THREADS

  /* 3. With the GIL held, so that no Python thread can start a PJRT call:
   * destroy every idle client. PJRT threads no longer enter Python, so none
   * of them waits for the GIL while the plugin joins it. */
  if (callbacks_stuck)
    fprintf(stderr, "pjrt_py: at exit, %d callback(s) were still running Python after %.3g s\n",
            callbacks_stuck, timeout);
  pjrt_py_client** idle = NULL;
  size_t n_idle = 0;
  pthread_mutex_lock(&g_registry_mu);
  long skipped = exit_sort_clients_locked(timeout, callbacks_stuck, &idle, &n_idle);
  __atomic_store_n(&g_phase, PHASE_FINISHED, __ATOMIC_RELEASE); /* the reaper starts nothing */
  pthread_cond_broadcast(&g_registry_cv);                       /* and ends */
  pthread_mutex_unlock(&g_registry_mu);
  /* Not under the registry's lock: a PJRT thread that has just finished a
   * copy or an execution takes it (reaper_wake) after its count reached 0,
   * and destroying the client joins that thread. */
  for (size_t i = 0; i < n_idle; ++i) client_destroy_pjrt(idle[i]);
  free(idle);
#ifdef __GLIBC__
  if (skipped) {
    __atomic_store_n(&g_left_running, 1, __ATOMIC_RELEASE);
    on_exit(quick_exit_handler, NULL); /* in case Py_AtExit was refused */
  }
#endif
  fflush(stderr);
  return PyLong_FromLong(skipped);
}
