/* Events: readiness, timed waits, and notifications to Python.
 *
 * PJRT runs OnReady callbacks on its own threads. The callbacks here do the
 * minimum: signal a condition variable, or hand a handle to Python. Python is
 * entered only while pjrt_py_shutdown() has not run, and shutdown waits for
 * callbacks already inside Python, so no PJRT thread touches a finalizing
 * interpreter. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

static void pjrt_py_event_ready_cb(PJRT_Error* error, void* user_arg);

int pjrt_py_event_is_ready(const PJRT_Api* api, PJRT_Event* event) {
  PJRT_Event_IsReady_Args args = {0};
  args.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE;
  args.event = event;
  PJRT_Error* error = api->PJRT_Event_IsReady(&args);
  if (error != NULL) {
    /* Treat a failing query as ready: PJRT_Event_Error then reports. */
    pjrt_py_error_destroy(api, error);
    return 1;
  }
  return args.is_ready ? 1 : 0;
}

PJRT_Error* pjrt_py_event_error(const PJRT_Api* api, PJRT_Event* event) {
  PJRT_Event_Error_Args args = {0};
  args.struct_size = PJRT_Event_Error_Args_STRUCT_SIZE;
  args.event = event;
  return api->PJRT_Event_Error(&args);
}

void pjrt_py_event_destroy(const PJRT_Api* api, PJRT_Event* event) {
  if (event == NULL) return;
  PJRT_Event_Destroy_Args args = {0};
  args.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  args.event = event;
  pjrt_py_error_destroy(api, api->PJRT_Event_Destroy(&args));
}

static PJRT_Error* pjrt_py_on_ready(const PJRT_Api* api, PJRT_Event* event, void* arg) {
  PJRT_Event_OnReady_Args args = {0};
  args.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  args.event = event;
  args.callback = pjrt_py_event_ready_cb;
  args.user_arg = arg;
  return api->PJRT_Event_OnReady(&args);
}

/* One record per registration; the callback tells the kinds apart. */
typedef struct {
  const PJRT_Api* api;
  int kind; /* 0: timed waiter, 1: Python notification */
  /* waiter */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  int refs; /* waiter and callback each hold one */
  /* notification */
  void* handle;
} pjrt_py_ready_record;

static pthread_mutex_t g_py_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_py_cv = PTHREAD_COND_INITIALIZER;
static int g_py_shutdown = 0;
static int g_py_active = 0;

static void pjrt_py_waiter_release(pjrt_py_ready_record* r) {
  pthread_mutex_lock(&r->mu);
  int left = --r->refs;
  pthread_mutex_unlock(&r->mu);
  if (left == 0) {
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
  }
}

static void pjrt_py_event_ready_cb(PJRT_Error* error, void* user_arg) {
  pjrt_py_ready_record* r = (pjrt_py_ready_record*)user_arg;
  pjrt_py_error_destroy(r->api, error); /* the status is read via PJRT_Event_Error */
  if (r->kind == 0) {
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pjrt_py_waiter_release(r);
    return;
  }
  pthread_mutex_lock(&g_py_mu);
  int enter = !g_py_shutdown;
  if (enter) g_py_active++;
  pthread_mutex_unlock(&g_py_mu);
  if (enter) {
    _pjrt_py_event_ready(r->handle);
    pthread_mutex_lock(&g_py_mu);
    if (--g_py_active == 0) pthread_cond_broadcast(&g_py_cv);
    pthread_mutex_unlock(&g_py_mu);
  }
  free(r);
}

/* Spin before blocking. Work on the CPU plugin often finishes a few
 * microseconds after the caller starts waiting (a small device-to-host copy
 * on a worker thread), while putting the caller to sleep and waking it again
 * costs some 30 us on a small VM. Polling PJRT_Event_IsReady for about as
 * long as a sleep costs bounds the loss at 2x in the worst case and removes
 * the wake-up from the common one. Measured in benchmarks/small.py. */
static long g_spin_ns = 50000;

void pjrt_py_set_spin_ns(long ns) { g_spin_ns = ns < 0 ? 0 : ns; }
long pjrt_py_spin_ns(void) { return g_spin_ns; }

static long pjrt_py_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static int pjrt_py_spin_until_ready(const PJRT_Api* api, PJRT_Event* event, long budget_ns) {
  if (budget_ns <= 0) return 0;
  long until = pjrt_py_now_ns() + budget_ns;
  do {
    if (pjrt_py_event_is_ready(api, event)) return 1;
  } while (pjrt_py_now_ns() < until);
  return 0;
}

int pjrt_py_event_wait(const PJRT_Api* api, PJRT_Event* event, double timeout) {
  int forever = timeout < 0;
  long spin = g_spin_ns;
  if (!forever && timeout * 1e9 < (double)spin) spin = (long)(timeout * 1e9);
  if (pjrt_py_spin_until_ready(api, event, spin)) return 1;
  if (!forever) {
    timeout -= (double)spin * 1e-9;
    if (timeout < 0) timeout = 0;
  }
  if (forever) {
    PJRT_Event_Await_Args args = {0};
    args.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
    args.event = event;
    pjrt_py_error_destroy(api, api->PJRT_Event_Await(&args));
    return 1;
  }
  if (pjrt_py_event_is_ready(api, event)) return 1;
  pjrt_py_ready_record* r = (pjrt_py_ready_record*)calloc(1, sizeof(*r));
  if (r == NULL) return 0;
  r->api = api;
  r->kind = 0;
  r->refs = 2;
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  PJRT_Error* error = pjrt_py_on_ready(api, event, r);
  if (error != NULL) {
    pjrt_py_error_destroy(api, error);
    r->refs = 1; /* no callback will come */
    pjrt_py_waiter_release(r);
    return pjrt_py_event_is_ready(api, event);
  }
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  double whole = (double)(long long)timeout;
  deadline.tv_sec += (time_t)whole;
  deadline.tv_nsec += (long)((timeout - whole) * 1e9);
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&r->mu);
  while (!r->done) {
    if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) == ETIMEDOUT) break;
  }
  int done = r->done;
  pthread_mutex_unlock(&r->mu);
  pjrt_py_waiter_release(r);
  return done;
}

int pjrt_py_event_notify(const PJRT_Api* api, PJRT_Event* event, void* handle) {
  pjrt_py_ready_record* r = (pjrt_py_ready_record*)calloc(1, sizeof(*r));
  if (r == NULL) return -1;
  r->api = api;
  r->kind = 1;
  r->handle = handle;
  PJRT_Error* error = pjrt_py_on_ready(api, event, r);
  if (error != NULL) {
    pjrt_py_error_destroy(api, error);
    free(r);
    return -1;
  }
  return 0;
}

void pjrt_py_shutdown(void) {
  pthread_mutex_lock(&g_py_mu);
  g_py_shutdown = 1;
  while (g_py_active > 0) pthread_cond_wait(&g_py_cv, &g_py_mu);
  pthread_mutex_unlock(&g_py_mu);
}
