/* The threads of staged transfers: copiers and the driver.
 *
 * Copiers. One memcpy thread moves some 5-10 GB/s on a server, a fifth of
 * what a PCIe 5 link carries, so a chunk is copied by several threads:
 * staging_copy() cuts it into parts, hands them to the copier threads and
 * takes parts itself, so it never waits for a copier that is busy elsewhere
 * (it can always finish alone). Parts start at 4 KiB multiples of the
 * chunk's offset, which keeps each part's alignment the chunk's.
 *
 * Drivers. A driver thread runs what no caller waits for: device-to-host
 * jobs (staging_d2h.c, queued when their source is ready). It blocks on
 * DMAs, never on Python. There is one driver per device (a lane:
 * the device's place in its client, modulo STAGING_DRIVERS): each device has
 * a link of its own, and with one driver for all, a read from device 1 waited
 * for a large read from device 0 to end, which made gathering a result
 * spread over several GPUs a serial walk. Jobs of one device keep their
 * order. A job never waits for a ring slot while it holds one whose DMA has
 * not landed (d2h_pipeline), so drivers sharing a ring cannot deadlock.
 * The finisher ends uploads (destroying a transfer manager once its last
 * chunk is done: a short call) on a thread of its own. On the driver of the
 * upload's device it waited behind that device's downloads, and a download
 * of a few GB held an upload's ring hold, and close(), for as long.
 * Another thread, the notifier, lets go of what a finished download held
 * and runs its promise's done callbacks, with the GIL: a callback that waits
 * for another staged copy must not wait on the very thread that would run it.
 *
 * All are process-wide and started on first use. In a child made by fork()
 * they do not exist: staging_after_fork() forgets them, and the next use
 * starts new ones (the parent's clients, and so their jobs, are unusable
 * there anyway).
 */
#include "staging.h"

#include <string.h>
#include <unistd.h>

#define STAGING_PART_MIN (256 << 10) /* smaller parts are not worth a thread */
#define STAGING_MAX_COPIERS 64
#define STAGING_DRIVERS 8 /* lanes: the devices of a large GPU host */

typedef struct copy_task {
  char* dst;
  const char* src;
  size_t len, part, nparts;
  size_t next;  /* the next part to take (atomic) */
  int users;    /* copier threads inside the task (g_pool_mu) */
  struct copy_task* link;
} copy_task;

static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_pool_work = PTHREAD_COND_INITIALIZER; /* a task was posted */
static pthread_cond_t g_pool_left = PTHREAD_COND_INITIALIZER; /* a copier left a task */
static copy_task* g_pool_tasks = NULL;
static int g_copiers = -1;       /* threads that copy, the caller included; -1: not set */
static int g_copiers_started = 0; /* copier threads running (g_copiers - 1 wanted) */

/* A queue of work and the thread that runs it, started on first use. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  staging_work* head;
  staging_work* tail;
  int started;
} work_queue;

#define QUEUE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0}
static work_queue g_drivers[STAGING_DRIVERS] = {QUEUE_INIT, QUEUE_INIT, QUEUE_INIT, QUEUE_INIT,
                                                QUEUE_INIT, QUEUE_INIT, QUEUE_INIT, QUEUE_INIT};
_Static_assert(STAGING_DRIVERS == 8, "one QUEUE_INIT per driver");
static work_queue g_notifier = QUEUE_INIT;
static work_queue g_finisher = QUEUE_INIT;

/* Copies the parts of t not taken yet; returns when none is left to take. */
static void copy_parts(copy_task* t) {
  for (;;) {
    size_t i = __atomic_fetch_add(&t->next, 1, __ATOMIC_ACQ_REL);
    if (i >= t->nparts) return;
    size_t offset = i * t->part;
    size_t n = t->len - offset < t->part ? t->len - offset : t->part;
    memcpy(t->dst + offset, t->src + offset, n);
  }
}

static int copiers_wanted(void) {
  int n = __atomic_load_n(&g_copiers, __ATOMIC_ACQUIRE);
  if (n >= 1) return n;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN); /* default: up to 8, one per core */
  return cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
}

static void* copier_main(void* arg) {
  int index = (int)(intptr_t)arg; /* copier 1, 2, ...: the caller is copier 0 */
  pthread_mutex_lock(&g_pool_mu);
  for (;;) {
    copy_task* t = g_pool_tasks;
    while (t != NULL && __atomic_load_n(&t->next, __ATOMIC_ACQUIRE) >= t->nparts) t = t->link;
    if (t == NULL || index >= copiers_wanted()) {
      pthread_cond_wait(&g_pool_work, &g_pool_mu);
      continue;
    }
    t->users++;
    pthread_mutex_unlock(&g_pool_mu);
    copy_parts(t);
    pthread_mutex_lock(&g_pool_mu);
    if (--t->users == 0) pthread_cond_broadcast(&g_pool_left);
  }
  return NULL;
}

/* Starts the copier threads still wanted. Caller holds g_pool_mu. */
static void copiers_start_locked(int wanted) {
  while (g_copiers_started < wanted - 1 && g_copiers_started < STAGING_MAX_COPIERS) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &attr, copier_main,
                                (void*)(intptr_t)(g_copiers_started + 1));
    pthread_attr_destroy(&attr);
    if (failed) break; /* fewer copiers: slower, never wrong */
    g_copiers_started++;
  }
}

/* memcpy(dst, src, len) by the copier threads and this one. No GIL needed. */
static void staging_copy(char* dst, const char* src, size_t len) {
  int wanted = copiers_wanted();
  if (wanted <= 1 || len < 2 * (size_t)STAGING_PART_MIN) {
    memcpy(dst, src, len);
    return;
  }
  size_t nparts = len / STAGING_PART_MIN;
  if (nparts > (size_t)wanted) nparts = (size_t)wanted;
  size_t part = ((len + nparts - 1) / nparts + 4095) & ~(size_t)4095;
  copy_task t = {dst, src, len, part, (len + part - 1) / part, 0, 0, NULL};
  pthread_mutex_lock(&g_pool_mu);
  copiers_start_locked(wanted);
  copy_task** end = &g_pool_tasks;
  while (*end != NULL) end = &(*end)->link;
  *end = &t;
  pthread_cond_broadcast(&g_pool_work);
  pthread_mutex_unlock(&g_pool_mu);
  copy_parts(&t);
  /* Every part is taken; wait for the copiers still copying theirs. */
  pthread_mutex_lock(&g_pool_mu);
  for (copy_task** at = &g_pool_tasks; *at != NULL; at = &(*at)->link) {
    if (*at == &t) {
      *at = t.link;
      break;
    }
  }
  while (t.users > 0) pthread_cond_wait(&g_pool_left, &g_pool_mu);
  pthread_mutex_unlock(&g_pool_mu);
}

/* ---- the driver and the notifier ------------------------------------------ */

static void* queue_main(void* arg) {
  work_queue* q = (work_queue*)arg;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    staging_work* w = q->head;
    if (w == NULL) {
      pthread_cond_wait(&q->cv, &q->mu);
      continue;
    }
    q->head = w->next;
    if (q->head == NULL) q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    w->run(w->arg);
    pthread_mutex_lock(&q->mu);
  }
  return NULL;
}

/* Queues `work` for q's thread. Any thread, no GIL; takes no lock of PJRT's.
 * Without a thread (none could be made) it runs here. */
static void queue_post(work_queue* q, staging_work* work) {
  work->next = NULL;
  pthread_mutex_lock(&q->mu);
  if (!q->started) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, queue_main, q) == 0) q->started = 1;
    pthread_attr_destroy(&attr);
  }
  if (!q->started) {
    pthread_mutex_unlock(&q->mu);
    work->run(work->arg);
    return;
  }
  if (q->tail != NULL) {
    q->tail->next = work;
  } else {
    q->head = work;
  }
  q->tail = work;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

static void queue_init(work_queue* q) {
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  q->head = q->tail = NULL;
  q->started = 0;
}

/* The driver lane of a job on `device` of c: its place among c's devices. */
static int staging_lane(const pjrt_py_client* c, PJRT_Device* device) {
  for (size_t i = 0; device != NULL && i < c->num_places; i++)
    if (c->place_devices[i] == device) return (int)(i % STAGING_DRIVERS);
  return 0;
}

static void staging_post(staging_work* work) {
  queue_post(&g_drivers[(unsigned)work->lane % STAGING_DRIVERS], work);
}

static void staging_notify(staging_work* work) { queue_post(&g_notifier, work); }

static void staging_finish(staging_work* work) { queue_post(&g_finisher, work); }

/* After fork(), in the child: no copier or driver thread exists, and their
 * locks may have been held by one. Queued work was the parent's. */
static void staging_after_fork(void) {
  pthread_mutex_init(&g_pool_mu, NULL);
  pthread_cond_init(&g_pool_work, NULL);
  pthread_cond_init(&g_pool_left, NULL);
  g_pool_tasks = NULL;
  g_copiers_started = 0;
  for (int i = 0; i < STAGING_DRIVERS; i++) queue_init(&g_drivers[i]);
  queue_init(&g_notifier);
  queue_init(&g_finisher);
}

/* staging_copiers(n=None) -> the number of threads a staged chunk is copied
 * by (the caller's included); sets it first when n is given (1 to 64). */
static PyObject* core_staging_copiers(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs > 1) {
    PyErr_SetString(PyExc_TypeError, "staging_copiers() takes at most one argument");
    return NULL;
  }
  if (nargs == 1 && args[0] != Py_None) {
    long n = PyLong_AsLong(args[0]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > STAGING_MAX_COPIERS + 1) {
      return PyErr_Format(PyExc_ValueError, "copier threads must be 1 to %d, not %ld",
                          STAGING_MAX_COPIERS + 1, n);
    }
    __atomic_store_n(&g_copiers, (int)n, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g_pool_mu);
    pthread_cond_broadcast(&g_pool_work); /* copiers above the new number go idle */
    pthread_mutex_unlock(&g_pool_mu);
  }
  return PyLong_FromLong(copiers_wanted());
}
