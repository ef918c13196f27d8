/* Staged transfers: host <-> device copies of large numpy arrays through a
 * ring of DMA-mapped host memory, in chunks, with the host copy of one chunk
 * overlapping the DMA of the others (staging_ring.c has the design).
 *
 *   staging_ring.c  the per-client ring: settings, memory, slots, statistics
 *   staging_pool.c  the copier threads (a parallel memcpy), the driver
 *                   threads (one per device) that run device-to-host jobs,
 *                   and the finisher that ends uploads
 *   staging_h2d.c   host to device, run by the calling thread
 *   staging_d2h.c   device to host, run by the driver, and its promise
 */
#ifndef PJRT_PY_STAGING_H
#define PJRT_PY_STAGING_H

#include "promise.h"

enum { STAGING_OFF = 0, STAGING_AUTO = 1, STAGING_ON = 2 };
enum { RING_UNTRIED = 0, RING_ALLOCATING = 1, RING_READY = 2, RING_FAILED = 3 };

#define STAGING_MAX_SLOTS 16

/* Work for a thread of staging_pool.c: run(arg), once. Embedded in what it
 * runs, so that posting it never allocates. `lane` picks the driver of a
 * download (staging_lane). */
typedef struct staging_work {
  void (*run)(void* arg);
  void* arg;
  int lane;
  struct staging_work* next;
} staging_work;

/* One chunk of the ring. */
typedef struct {
  char* mem;         /* chunk_bytes of the ring's memory */
  int busy;          /* owned by a job: being filled, in a DMA, or being emptied */
  int holds;         /* an upload's holds on it (staging_h2d.c) */
  void* job;         /* the upload owning it */
  PJRT_Event* event; /* its last DMA's event (fired): destroyed by the next owner */
} staging_slot;

struct staging_ring {
  pjrt_py_client* c;   /* the owner: the ring is freed when its PJRT client is */
  pthread_mutex_t mu;  /* guards everything below that changes */
  pthread_cond_t cv;   /* a slot came free, a job ended, or the memory was made */
  int mode;            /* STAGING_*: read once per transfer, with the GIL (configure
                        * may change it, and min_bytes, at any time) */
  size_t min_bytes;    /* transfers at least this large are staged */
  size_t chunk_bytes;  /* one slot */
  int nslots;
  int state;           /* RING_* */
  int dma_mapped;      /* the plugin took the memory with PJRT_Client_DmaMap */
  char* base;          /* nslots * chunk_bytes, page-aligned; NULL until first used */
  size_t size;
  long active;         /* jobs holding the ring (its settings and memory stay) */
  int starving;        /* jobs holding no slot that wait for one (staging_slot_take) */
  long h2d_jobs, d2h_jobs, chunks; /* counters, for tests and benchmarks */
  char why_unmapped[200];          /* the plugin's answer to DmaMap, if it refused */
  staging_slot slots[STAGING_MAX_SLOTS];
};
typedef struct staging_ring staging_ring;

/* A device-to-host job: shared by the promise that reports it and the
 * pipeline that runs it (staging_d2h.c). */
struct staging_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;     /* done */
  int refs;              /* the promise's and the pipeline's (mu) */
  int done;              /* (mu) */
  PJRT_Error* error;     /* the plugin's failure, taken by the promise (mu) */
  int code;              /* else a failure of ours: a PJRT error code, and why */
  const char* message;
  PromiseObject* watcher; /* a promise to notify when done (a reference; mu) */
  PromiseObject* notify;  /* the watcher, once done: notified with the GIL */
  staging_ring* ring;
  pjrt_py_client* c;     /* a reference, dropped with the GIL at the end */
  const PJRT_Api* api;
  BufferObject* b;       /* a reference and a pin: its handle stays valid */
  PJRT_Buffer* handle;
  int external_ref;      /* a PJRT external reference is held (no donation) */
  PyObject* array;       /* the destination (a reference) */
  char* dst;
  size_t nbytes;
  PJRT_Event* ready;     /* the source's ready event */
  int starts;            /* the job is posted when both its callback and its
                            registration are done with `ready` (atomic) */
  staging_work work;     /* d2h_run, on the driver */
  staging_work release;  /* d2h_release, on the notifier */
};

/* The answer of the staged paths when they do not take a transfer. */
static char g_staging_not_taken;
#define STAGING_NOT_TAKEN ((void*)&g_staging_not_taken)

/* staging_pool.c */
static void staging_copy(char* dst, const char* src, size_t len);
static void staging_post(staging_work* work);
static int staging_lane(const pjrt_py_client* c, PJRT_Device* device);
static void staging_notify(staging_work* work);
static void staging_finish(staging_work* work);

/* staging_ring.c */
static bool staging_wanted(pjrt_py_client* c, size_t nbytes);
static bool staging_hold(pjrt_py_client* c);
static void staging_unhold(staging_ring* r);
static int staging_ring_ensure(staging_ring* r);
static staging_slot* staging_slot_take(staging_ring* r, long wait_ns, bool holding);
static void staging_slot_give(staging_ring* r, staging_slot* s);
static bool staging_may_call(pjrt_py_client* c);
static PyObject* staging_exception(int code, const char* message);
static void staging_job_ended(staging_ring* r, pjrt_py_client* c);

/* staging_h2d.c, staging_d2h.c */
static BufferObject* staged_to_device(PyObject* client, pjrt_py_client* c, PyArrayObject* array,
                                      int type, PJRT_Device* device, PyObject* meta);
static PyObject* staged_from_device(BufferObject* b, PyObject* array, size_t ndim);

#endif
