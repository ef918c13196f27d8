/* The staging ring of a client: host memory the plugin DMAs from and to.
 *
 * Why. XLA's GPU client copies a numpy array to the device through pinned
 * memory of its own: one memcpy into it (one thread), then the DMA, one
 * after the other; and back the same way. Memory registered with
 * PJRT_Client_DmaMap it DMAs from and to directly (TransferData and
 * CopyRawToHost check that the whole range is mapped, IsDmaMapped; its own
 * pinned_host buffers are not in that table). So a ring of our own memory,
 * mapped once per client, lets pjrt_py do the host copy itself, with
 * several threads (staging_pool.c), one chunk while the plugin DMAs others:
 *
 *   to the device    caller: [copy 0][copy 1][copy 2]...      (staging_h2d.c)
 *                    plugin:         [DMA 0 ][DMA 1 ][DMA 2]
 *   to the host      plugin: [DMA 0][DMA 1][DMA 2]...         (staging_d2h.c)
 *                    driver:        [copy 0][copy 1][copy 2]
 *
 * When. Mode "auto" stages transfers of at least min_bytes where the plugin
 * mapped the ring; Python resolves "auto" to "off" on CPU plugins, which map
 * nothing (all three builds answer DmaMap with UNIMPLEMENTED). Mode "on"
 * stages even into unmapped memory: how the tests run the pipeline on CPU.
 *
 * Lifetime. The memory is made on first use and freed only when the PJRT
 * client is destroyed, which happens only when no copy is in flight: every
 * staged job counts as one (c->transfers) from before its first DMA until
 * after its last touch of the ring. Where the client is never destroyed (a
 * fork, an exit with work left running) the ring is never freed: no DMA can
 * land in freed memory.
 */
#include "staging.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

/* The ring of c, with jobs counted: from here until staging_unhold its
 * settings and memory stay as they are. With the GIL. */
static bool staging_hold(pjrt_py_client* c) {
  staging_ring* r = c->staging;
  if (r == NULL) return false;
  pthread_mutex_lock(&r->mu);
  r->active++;
  pthread_mutex_unlock(&r->mu);
  return true;
}

static void staging_unhold(staging_ring* r) {
  pthread_mutex_lock(&r->mu);
  r->active--;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* Whether a transfer of nbytes on c takes the staged path (as far as can be
 * told before the memory exists). With the GIL. Never inside a host or done
 * callback:
 * a staged copy may wait for ring memory that work blocked on the callback
 * holds. */
static bool staging_wanted(pjrt_py_client* c, size_t nbytes) {
  staging_ring* r = c->staging;
  if (r == NULL || r->mode == STAGING_OFF || nbytes < r->min_bytes ||
      callback_on_pjrt_thread() != NULL)
    return false;
  int state = __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
  if (state == RING_FAILED) return false;
  return !(r->mode == STAGING_AUTO && state == RING_READY && !r->dma_mapped);
}

/* May a job of c still call PJRT? Not after fork, nor once the exit sequence
 * is over, nor once the client is destroyed. No GIL needed. */
static bool staging_may_call(pjrt_py_client* c) { return state_pjrt_allowed(c); }

/* Makes the ring's memory (first use) and maps it. 1 if the ring may be used
 * in its mode, 0 if not. Without the GIL; the caller holds the client. */
static int staging_ring_ensure(staging_ring* r) {
  pthread_mutex_lock(&r->mu);
  while (r->state == RING_ALLOCATING) pthread_cond_wait(&r->cv, &r->mu);
  if (r->state == RING_UNTRIED) {
    r->state = RING_ALLOCATING;
    size_t size = r->chunk_bytes * (size_t)r->nslots;
    pthread_mutex_unlock(&r->mu);
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE; /* touched now, not by a DMA */
    void* base = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    int mapped = 0;
    char why[sizeof r->why_unmapped] = "";
    const PJRT_Api* api = r->c->api;
    if (base != MAP_FAILED && PJRT_PY_HAS(api, PJRT_Client_DmaMap)) {
      PJRT_Client_DmaMap_Args args = {0};
      args.struct_size = PJRT_Client_DmaMap_Args_STRUCT_SIZE;
      args.client = r->c->client;
      args.data = base;
      args.size = size;
      PJRT_Error* error = api->PJRT_Client_DmaMap(&args);
      mapped = error == NULL;
      /* Pinned pages shared with a forked child would be copied on the
       * parent's next write, and its DMAs would go on reading the old ones:
       * a child never uses a parent's ring, so it gets none. */
      if (mapped) madvise(base, size, MADV_DONTFORK);
      if (error != NULL) {
        PJRT_Error_Message_Args m = {0};
        m.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
        m.error = error;
        api->PJRT_Error_Message(&m);
        snprintf(why, sizeof why, "%.*s", (int)m.message_size, m.message);
        error_destroy(api, error);
      }
    } else {
      snprintf(why, sizeof why, "%s", base == MAP_FAILED ? "no memory" : "no PJRT_Client_DmaMap");
    }
    pthread_mutex_lock(&r->mu);
    memcpy(r->why_unmapped, why, sizeof why);
    if (base == MAP_FAILED) {
      __atomic_store_n(&r->state, RING_FAILED, __ATOMIC_RELEASE);
    } else {
      r->base = (char*)base;
      r->size = size;
      r->dma_mapped = mapped;
      for (int i = 0; i < r->nslots; ++i) r->slots[i].mem = r->base + (size_t)i * r->chunk_bytes;
      __atomic_store_n(&r->state, RING_READY, __ATOMIC_RELEASE);
    }
    pthread_cond_broadcast(&r->cv);
  }
  int usable = r->state == RING_READY && (r->mode == STAGING_ON || r->dma_mapped);
  pthread_mutex_unlock(&r->mu);
  return usable;
}

/* A free slot, taken; waits up to wait_ns for one (< 0: as long as it
 * takes), else NULL. The event of the slot's last DMA is destroyed here. No
 * GIL needed. A job `holding` slots whose DMA is in flight leaves free slots
 * to jobs holding none that wait for one (r->starving): without that, a
 * large read retook each slot it gave back before a waiting job woke, and a
 * small read of another device could wait for the whole of it. */
static staging_slot* staging_slot_take(staging_ring* r, long wait_ns, bool holding) {
  bool starving = wait_ns != 0 && !holding;
  struct timespec until;
  if (wait_ns > 0) deadline_in(&until, wait_ns);
  staging_slot* s = NULL;
  pthread_mutex_lock(&r->mu);
  if (starving) r->starving++;
  bool last = wait_ns == 0;
  for (;;) {
    for (int i = 0; s == NULL && i < r->nslots && (!holding || r->starving == 0); ++i)
      if (!r->slots[i].busy) s = &r->slots[i];
    if (s != NULL || last) break;
    if (wait_ns < 0) {
      pthread_cond_wait(&r->cv, &r->mu);
    } else if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT) {
      last = true; /* one last look */
    }
  }
  if (starving && --r->starving == 0) pthread_cond_broadcast(&r->cv); /* holders may take */
  PJRT_Event* old = NULL;
  if (s != NULL) {
    s->busy = 1;
    old = s->event;
    s->event = NULL;
    r->chunks++;
  }
  pthread_mutex_unlock(&r->mu);
  event_destroy(r->c->api, old);
  return s;
}

/* Gives a slot back: its DMA (if any) is over. No GIL needed. */
static void staging_slot_give(staging_ring* r, staging_slot* s) {
  pthread_mutex_lock(&r->mu);
  s->busy = 0;
  s->job = NULL;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* The end of a job: the ring is let go, then the copy stops counting (after
 * which c's PJRT client may be destroyed, and the ring with it). */
static void staging_job_ended(staging_ring* r, pjrt_py_client* c) {
  staging_unhold(r);
  if (__atomic_sub_fetch(&c->transfers, 1, __ATOMIC_ACQ_REL) == 0) reaper_wake();
}

/* Frees the memory and the slots' events. Nothing uses the ring, and
 * r->state keeps others off it (RING_ALLOCATING) or the ring is going. `client`:
 * the PJRT client to unmap from, or NULL where PJRT may not be called. */
static void ring_free_memory(staging_ring* r, PJRT_Client* client) {
  bool pjrt = client != NULL;
  /* Memory the plugin mapped and cannot unmap stays: it may still treat it as its own. */
  bool unmap = r->dma_mapped && pjrt && PJRT_PY_HAS(r->c->api, PJRT_Client_DmaUnmap);
  for (int i = 0; i < STAGING_MAX_SLOTS; ++i) {
    if (pjrt) event_destroy(r->c->api, r->slots[i].event);
    r->slots[i].event = NULL;
    r->slots[i].mem = NULL;
  }
  if (r->base != NULL && unmap) {
    PJRT_Client_DmaUnmap_Args args = {0};
    args.struct_size = PJRT_Client_DmaUnmap_Args_STRUCT_SIZE;
    args.client = client;
    args.data = r->base;
    PJRT_Error* error = r->c->api->PJRT_Client_DmaUnmap(&args);
    unmap = error == NULL;
    error_destroy(r->c->api, error);
  }
  if (r->base != NULL && (unmap || !r->dma_mapped)) munmap(r->base, r->size);
  r->base = NULL;
  r->size = 0;
  r->dma_mapped = 0; /* r->state is the caller's to set */
}

/* From client_destroy_pjrt, before PJRT_Client_Destroy(client): no copy is
 * in flight. */
static void staging_ring_release(pjrt_py_client* c, PJRT_Client* client) {
  staging_ring* r = c->staging;
  if (r == NULL) return;
  c->staging = NULL;
  ring_free_memory(r, client);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

static pjrt_py_client* staging_client(PyObject* client) {
  if (!PyObject_TypeCheck(client, ClientCoreType)) {
    PyErr_SetString(PyExc_TypeError, "expected a pjrt_py.Client");
    return NULL;
  }
  return client_core_open((ClientCoreObject*)client);
}

/* Waits, the GIL released, until no job holds r or `timeout` seconds pass:
 * 0 idle (r->mu held), -1 with an exception (r->mu not held). With the GIL. */
static int ring_wait_idle(staging_ring* r, double timeout) {
  long start = now_ns();
  pthread_mutex_lock(&r->mu);
  while (r->active > 0) {
    double left = timeout * 1e9 - (double)(now_ns() - start);
    if (left <= 0) {
      pthread_mutex_unlock(&r->mu);
      /* PyErr_Format has no float conversion: Python 3.12 raises SystemError
       * for "%g" (3.11 printed it as is), so the number goes in as an object. */
      PyObject* seconds = PyFloat_FromDouble(timeout);
      if (seconds != NULL) {
        PyErr_Format(PyExc_RuntimeError,
                     "staged transfers of this client were still in flight after %S s: its "
                     "chunks can change when they are done",
                     seconds);
        Py_DECREF(seconds);
      }
      return -1;
    }
    struct timespec until;
    deadline_in(&until, left < PJRT_PY_SLICE_NS ? (long)left + 1 : PJRT_PY_SLICE_NS);
    int active;
    Py_BEGIN_ALLOW_THREADS
    pthread_cond_timedwait(&r->cv, &r->mu, &until);
    active = r->active;
    pthread_mutex_unlock(&r->mu);
    Py_END_ALLOW_THREADS
    if (active > 0 && PyErr_CheckSignals() < 0) return -1;
    pthread_mutex_lock(&r->mu);
  }
  return 0;
}

/* staging_configure(client, mode, min_bytes, chunk_bytes, slots, timeout):
 * settings checked by pjrt_py.runtime.staging. The mode and the threshold
 * change at once (a copy decides when it starts); a new chunk size or slot
 * count remakes the ring, once no staged copy runs (waiting up to timeout s). */
static PyObject* core_staging_configure(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* client;
  int mode, slots;
  Py_ssize_t min_bytes, chunk_bytes;
  double timeout;
  if (!PyArg_ParseTuple(args, "Oinnid:staging_configure", &client, &mode, &min_bytes,
                        &chunk_bytes, &slots, &timeout))
    return NULL;
  pjrt_py_client* c = staging_client(client);
  if (c == NULL) return NULL;
  /* Chunks to 1 GiB, as pjrt_py.runtime.staging takes them: chunk_bytes x
   * slots is the ring's size, and a product past size_t wrapped into a small
   * mapping the copies then wrote far past. */
  if (mode < STAGING_OFF || mode > STAGING_ON || min_bytes < 1 || chunk_bytes < 4096 ||
      chunk_bytes > (1 << 30) || chunk_bytes % 4096 != 0 || slots < 1 ||
      slots > STAGING_MAX_SLOTS || !(timeout >= 0)) {
    PyErr_SetString(PyExc_ValueError, "staging_configure: settings out of range");
    return NULL;
  }
  staging_ring* r = c->staging;
  if (r == NULL) {
    r = (staging_ring*)calloc(1, sizeof(*r));
    if (r == NULL) return PyErr_NoMemory();
    pthread_mutex_init(&r->mu, NULL);
    cond_init(&r->cv);
    r->c = c;
    c->staging = r;
  }
  bool remake = r->chunk_bytes != (size_t)chunk_bytes || r->nslots != slots;
  client_ref(c); /* a close() while it waits must not free c, nor r with it */
  if (remake || r->state == RING_FAILED) {
    int waited = ring_wait_idle(r, timeout); /* 0: r->mu held */
    if (waited == 0 && state_check_usable(c, "client") < 0) {
      pthread_mutex_unlock(&r->mu);
      waited = -1;
    }
    if (waited < 0) {
      client_unref(c);
      return NULL;
    }
    /* Unmapping may wait for the plugin's own threads (XLA's TFRT GPU client
     * runs DmaUnmap on a pool and blocks until it is done), which may be
     * waiting for the GIL: it is freed without the GIL or r->mu, and a job
     * that starts meanwhile waits in staging_ring_ensure for the new ring. */
    PJRT_Client* unmap_from = state_pjrt_allowed(c) ? c->client : NULL;
    r->state = RING_ALLOCATING;
    r->chunk_bytes = (size_t)chunk_bytes;
    r->nslots = slots;
    pthread_mutex_unlock(&r->mu);
    Py_BEGIN_ALLOW_THREADS
    ring_free_memory(r, unmap_from);
    Py_END_ALLOW_THREADS
    pthread_mutex_lock(&r->mu);
    r->state = RING_UNTRIED;
    pthread_cond_broadcast(&r->cv);
  } else {
    pthread_mutex_lock(&r->mu);
  }
  r->mode = mode;
  r->min_bytes = (size_t)min_bytes;
  pthread_mutex_unlock(&r->mu);
  client_unref(c);
  Py_RETURN_NONE;
}

/* staging_stats(client) -> dict: settings, the memory's state, counters. */
static PyObject* core_staging_stats(PyObject* self, PyObject* client) {
  (void)self;
  pjrt_py_client* c = staging_client(client);
  if (c == NULL) return NULL;
  staging_ring* r = c->staging;
  if (r == NULL) return PyDict_New();
  static const char* modes[] = {"off", "auto", "on"};
  static const char* states[] = {"untried", "allocating", "ready", "failed"};
  pthread_mutex_lock(&r->mu);
  PyObject* stats = Py_BuildValue(
      "{s:s,s:n,s:n,s:i,s:s,s:O,s:s,s:n,s:l,s:l,s:l,s:l}", "mode", modes[r->mode], "min_bytes",
      (Py_ssize_t)r->min_bytes, "chunk_bytes", (Py_ssize_t)r->chunk_bytes, "slots", r->nslots,
      "memory", states[r->state], "dma_mapped", r->dma_mapped ? Py_True : Py_False,
      "why_unmapped", r->why_unmapped, "bytes", (Py_ssize_t)r->size, "active", r->active,
      "h2d", r->h2d_jobs, "d2h", r->d2h_jobs, "chunks", r->chunks);
  pthread_mutex_unlock(&r->mu);
  return stats;
}

/* A new exception of pjrt_py for a PJRT error code of ours. With the GIL. */
static PyObject* staging_exception(int code, const char* message) {
  PyObject* key = PyLong_FromLong(code);
  PyObject* cls = key ? PyDict_GetItemWithError(g_errors_by_code, key) : NULL; /* borrowed */
  Py_XDECREF(key);
  if (cls == NULL && !PyErr_Occurred()) cls = g_pjrt_error;
  return cls ? PyObject_CallFunction(cls, "si", message, code) : NULL;
}

/* staging_wanted(client, nbytes) -> whether a copy of nbytes would be staged
 * (pjrt_py.runtime.buffer asks before staging large CPU copies its own way). */
static PyObject* core_staging_wanted(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* client;
  Py_ssize_t nbytes;
  if (!PyArg_ParseTuple(args, "On:staging_wanted", &client, &nbytes)) return NULL;
  pjrt_py_client* c = staging_client(client);
  if (c == NULL) return NULL;
  return PyBool_FromLong(nbytes > 0 && staging_wanted(c, (size_t)nbytes));
}
