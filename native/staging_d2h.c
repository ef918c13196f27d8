/* Device to host, staged (see staging_ring.c for why), and its promise.
 *
 * to_numpy_async returns at once: the ArrayPromise holds a job, not a PJRT
 * event. When the source buffer is ready (its ready event's callback), the
 * job goes to the driver thread (staging_pool.c), which asks the plugin for
 * raw copies of the buffer's chunks into ring slots (PJRT_Buffer_
 * CopyRawToHost), a few ahead, and copies each landed chunk into the numpy
 * array with the copier threads while the next ones are in their DMA.
 * Waiting for the source first keeps ring slots free while work upstream
 * runs. Only dense row-major buffers whose on-device size is the array's are
 * staged: their raw bytes are the array's.
 *
 * The promise behaves as an event-backed one: is_ready() never blocks,
 * value() waits in slices with the GIL released (Ctrl-C raises, the copy
 * goes on), add_done_callback and await are woken by the driver, and a
 * failure (the source's, a chunk's, or the interpreter exiting) is raised by
 * value() with the plugin's error code. The job holds what it writes into
 * and reads from: the array, the Buffer (pinned, so delete() leaves the
 * handle until the job ends; counted as lent, so no execution of ours
 * donates it; and, once ready, with a PJRT external reference: d2h_hold),
 * and the client; these are let go with the GIL at the end, and kept for
 * good if the interpreter is exiting by then.
 */
#include "staging.h"

#include <errno.h>

static void staged_job_release(struct staging_job* j) {
  pthread_mutex_lock(&j->mu);
  int left = --j->refs;
  pthread_mutex_unlock(&j->mu);
  if (left > 0) return;
  if (j->error != NULL && phase() != PHASE_FINISHED) error_destroy(j->api, j->error);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j);
}

/* ---- the promise's side (with the GIL) ---------------------------------------- */

/* 1 when the copy is over (its outcome now the promise's), 0 if not yet, -1
 * with an exception. */
static int staged_promise_poll(PromiseObject* p) {
  struct staging_job* j = p->job;
  pthread_mutex_lock(&j->mu);
  int done = j->done, code = j->code;
  PJRT_Error* error = done ? j->error : NULL;
  if (done) j->error = NULL;
  pthread_mutex_unlock(&j->mu);
  if (!done) return 0;
  if (error != NULL || code != 0) {
    PyObject* exc = error ? error_from_pjrt(j->api, error) : staging_exception(code, j->message);
    if (exc == NULL) { /* no memory: say the copy failed next time */
      pthread_mutex_lock(&j->mu);
      j->code = PJRT_Error_Code_UNKNOWN;
      j->message = "the staged copy failed (its error could not be made)";
      pthread_mutex_unlock(&j->mu);
      return -1;
    }
    p->error = exc;
  } else {
    p->one->ready = 1; /* its data was read */
  }
  p->done = 1;
  return 1;
}

/* Waits up to `timeout` seconds (< 0: as long as it takes): 1 done, 0 not
 * yet, -1 with an exception (a signal handler's, or a wait refused). */
static int staged_promise_wait(PromiseObject* p, double timeout) {
  struct staging_job* j = p->job;
  bool forever = timeout < 0;
  if (forever && refuse_wait_in_callback() < 0) return -1;
  long start = now_ns();
  for (;;) {
    long slice = PJRT_PY_SLICE_NS;
    if (!forever) {
      double left = timeout * 1e9 - (double)(now_ns() - start);
      if (left <= 0) break;
      if (left < (double)slice) slice = (long)left + 1;
    }
    int done;
    Py_BEGIN_ALLOW_THREADS
    struct timespec until;
    deadline_in(&until, slice);
    pthread_mutex_lock(&j->mu);
    while (!j->done && pthread_cond_timedwait(&j->cv, &j->mu, &until) != ETIMEDOUT) {
    }
    done = j->done;
    pthread_mutex_unlock(&j->mu);
    Py_END_ALLOW_THREADS
    if (done) break;
    if (PyErr_CheckSignals() < 0) return -1;
  }
  return staged_promise_poll(p);
}

/* Asks the job to notify p (promise_notified) when it ends: 1, or 0 if it
 * has already ended (nothing will come). */
static int staged_promise_watch(PromiseObject* p) {
  struct staging_job* j = p->job;
  pthread_mutex_lock(&j->mu);
  int watching = !j->done && j->watcher == NULL;
  if (watching) {
    Py_INCREF(p);
    j->watcher = p;
  }
  pthread_mutex_unlock(&j->mu);
  return watching;
}

/* ---- the pipeline's side (the driver thread) ------------------------------------- */

/* What the job holds, let go, and its promise's done callbacks run: with the
 * GIL, on the notifier thread. */
static void d2h_release_with_gil(void* arg) {
  struct staging_job* j = (struct staging_job*)arg;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PromiseObject* watcher = j->notify;
  j->notify = NULL;
  if (watcher != NULL) {
    promise_notified(watcher); /* not a PJRT thread: its callbacks may wait */
    Py_DECREF(watcher);
  }
  BufferObject* b = j->b;
  j->b = NULL;
  b->exports--;
  buffer_unpin(b); /* frees the handle if b was deleted meanwhile */
  Py_DECREF(b);
  Py_CLEAR(j->array);
  pjrt_py_client* c = j->c;
  staged_job_release(j);
  client_unref(c);
  PyErr_Restore(type, value, traceback);
}

/* The chunks: raw copies into slots, a few ahead; each landed one copied
 * into the array. Leaves the first failure in *failure (the plugin's) or
 * *code / *why (ours). Every slot it took is given back, its DMA over. */
static void d2h_pipeline(struct staging_job* j, PJRT_Error** failure, int* code, const char** why) {
  staging_ring* r = j->ring;
  const PJRT_Api* api = j->api;
  size_t chunk = r->chunk_bytes, total = j->nbytes, count = (total + chunk - 1) / chunk;
  staging_slot* held[STAGING_MAX_SLOTS];
  size_t issued = 0, landed = 0;
  bool stop = false;
  for (;;) {
    while (!stop && issued < count && issued - landed < (size_t)r->nslots) {
      staging_slot* s =
          staging_slot_take(r, issued == landed ? PJRT_PY_SLICE_NS : 0, issued > landed);
      if (s == NULL) break;
      size_t offset = issued * chunk;
      PJRT_Buffer_CopyRawToHost_Args a = {0};
      a.struct_size = PJRT_Buffer_CopyRawToHost_Args_STRUCT_SIZE;
      a.buffer = j->handle;
      a.dst = s->mem;
      a.offset = (int64_t)offset;
      a.transfer_size = (int64_t)(total - offset < chunk ? total - offset : chunk);
      *failure = api->PJRT_Buffer_CopyRawToHost(&a);
      if (*failure != NULL) {
        staging_slot_give(r, s);
        stop = true;
        break;
      }
      s->event = a.event; /* destroyed by the slot's next owner */
      held[issued++ % STAGING_MAX_SLOTS] = s;
    }
    if (landed == issued) {
      if (stop || issued == count) return;
    } else {
      staging_slot* s = held[landed % STAGING_MAX_SLOTS];
      PJRT_Event_Await_Args w = {0};
      w.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
      w.event = s->event;
      PJRT_Error* error = api->PJRT_Event_Await(&w);
      if (error != NULL && (stop || *failure != NULL)) {
        error_destroy(api, error);
      } else if (error != NULL) {
        *failure = error;
        stop = true;
      } else if (!stop) {
        size_t offset = landed * chunk;
        staging_copy(j->dst + offset, s->mem, total - offset < chunk ? total - offset : chunk);
      }
      staging_slot_give(r, s);
      landed++;
    }
    if (!stop && phase() != PHASE_RUNNING) {
      stop = true;
      *code = PJRT_Error_Code_CANCELLED;
      *why = "the staged copy was stopped: the interpreter is exiting";
    }
  }
}

/* Takes a PJRT external reference on the ready source, so that not even a
 * donation from outside pjrt_py takes it from under the copy. Only now: XLA's
 * CPU client answers IncreaseExternalReferenceCount on a buffer still being
 * computed by waiting for it (CpuRawBuffer::OpaqueDeviceMemoryDataPointer),
 * which, taken at to_numpy_async with the GIL, held the caller and every
 * Python thread until the work upstream was done. */
static void d2h_hold(struct staging_job* j) {
  if (!PJRT_PY_HAS(j->api, PJRT_Buffer_IncreaseExternalReferenceCount) || !staging_may_call(j->c))
    return;
  PJRT_Error* error = handle_hold_memory(j->api, j->handle);
  j->external_ref = error == NULL;
  error_destroy(j->api, error);
}

static void d2h_run(void* arg) {
  struct staging_job* j = (struct staging_job*)arg;
  const PJRT_Api* api = j->api;
  PJRT_Error* failure = NULL;
  int code = 0;
  const char* why = NULL;
  if (!staging_may_call(j->c)) {
    code = PJRT_Error_Code_CANCELLED;
    why = "the staged copy was stopped: the interpreter is exiting";
  } else {
    PJRT_Event_Await_Args w = {0}; /* ready, unless no callback could be had */
    w.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
    w.event = j->ready;
    failure = api->PJRT_Event_Await(&w); /* the source's own failure */
    event_destroy(api, j->ready);
    if (failure == NULL) {
      d2h_hold(j);
      d2h_pipeline(j, &failure, &code, &why);
    }
    if (j->external_ref && staging_may_call(j->c)) handle_release_memory(api, j->handle);
  }
  staging_job_ended(j->ring, j->c); /* the ring is not touched again */
  pthread_mutex_lock(&j->mu);
  j->error = failure;
  j->code = failure != NULL ? 0 : code;
  j->message = why;
  j->done = 1;
  j->notify = j->watcher;
  j->watcher = NULL;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  staging_notify(&j->release);
}

/* On the notifier thread. */
static void d2h_release(void* arg) {
  gate_call(d2h_release_with_gil, arg); /* exiting: everything the job holds stays */
}

/* One of the two things the job waits for to start: the source's ready
 * callback, and the return of the call registering it (d2h_run destroys
 * the event, which must not happen under that call). */
static void d2h_start(struct staging_job* j) {
  if (__atomic_sub_fetch(&j->starts, 1, __ATOMIC_ACQ_REL) == 0) staging_post(&j->work);
}

/* The source is ready (or failed): on a PJRT thread, or the caller's. */
static void d2h_source_ready(PJRT_Error* error, void* arg) {
  struct staging_job* j = (struct staging_job*)arg;
  error_destroy(j->api, error); /* d2h_run reads the status from the event */
  d2h_start(j);
}

/* ---- starting ---------------------------------------------------------------------- */

/* Whether b is in its device's default memory (where the plugin cannot say:
 * yes). With the GIL. */
static bool d2h_in_default_memory(BufferObject* b) {
  const PJRT_Api* api = b->c->api;
  PJRT_Memory* memory = buffer_memory(b);
  PJRT_Device* device = buffer_device(b);
  if (memory == NULL || device == NULL || !PJRT_PY_HAS(api, PJRT_Device_DefaultMemory))
    return true;
  PJRT_Device_DefaultMemory_Args dm = {0};
  dm.struct_size = PJRT_Device_DefaultMemory_Args_STRUCT_SIZE;
  dm.device = device;
  PJRT_Error* error = api->PJRT_Device_DefaultMemory(&dm);
  error_destroy(api, error);
  return error != NULL || dm.memory == memory;
}

/* Whether b's on-device bytes are `nbytes` of row-major data in its
 * device's default memory. With the GIL. */
static bool d2h_raw_is_dense(BufferObject* b, size_t ndim, size_t nbytes) {
  const PJRT_Api* api = b->c->api;
  int64_t order[PJRT_PY_MAX_RANK];
  if (!PJRT_PY_HAS(api, PJRT_Buffer_CopyRawToHost) || !d2h_in_default_memory(b) ||
      !buffer_minor_to_major(b, ndim, order))
    return false;
  for (size_t k = 0; k < ndim; ++k)
    if (order[k] != (int64_t)(ndim - 1 - k)) return false;
  size_t on_device;
  PJRT_Error* error = buffer_device_bytes(api, b->buf, &on_device);
  error_destroy(api, error);
  return error == NULL && on_device == nbytes;
}

/* A staged copy of b into `array` (new, C-contiguous, b's shape and dtype):
 * an ArrayPromise; NULL with an exception; or STAGING_NOT_TAKEN (nothing
 * done). Takes `array` unless not taken. With the GIL; b is live. */
static PyObject* staged_from_device(BufferObject* b, PyObject* array, size_t ndim) {
  pjrt_py_client* c = b->c;
  const PJRT_Api* api = c->api;
  size_t nbytes = (size_t)PyArray_NBYTES((PyArrayObject*)array);
  if (!d2h_raw_is_dense(b, ndim, nbytes) || !staging_hold(c)) return STAGING_NOT_TAKEN;
  staging_ring* r = c->staging;
  int usable = 1;
  if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != RING_READY) {
    client_enter_checked(c); /* b is live: c takes work */
    Py_BEGIN_ALLOW_THREADS
    usable = staging_ring_ensure(r);
    Py_END_ALLOW_THREADS
    client_leave(c); /* b holds c */
  }
  if (!usable || !(r->mode == STAGING_ON || r->dma_mapped)) {
    staging_unhold(r);
    return STAGING_NOT_TAKEN;
  }
  if (buffer_live(b) < 0) { /* the GIL was let go: b may have been deleted */
    staging_unhold(r);
    Py_DECREF(array);
    return NULL;
  }
  PJRT_Buffer_ReadyEvent_Args ready = {0};
  ready.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  ready.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&ready);
  struct staging_job* j = error ? NULL : (struct staging_job*)calloc(1, sizeof(*j));
  if (j == NULL) {
    event_destroy(api, ready.event);
    staging_unhold(r);
    Py_DECREF(array);
    return error ? raise_pjrt(api, error) : PyErr_NoMemory();
  }
  PyObject* promise = promise_of_array(c, array, (PyObject*)b, NULL); /* takes array */
  if (promise == NULL) {
    free(j);
    event_destroy(api, ready.event);
    staging_unhold(r);
    return NULL;
  }
  pthread_mutex_init(&j->mu, NULL);
  cond_init(&j->cv);
  j->refs = 2; /* the promise's and the pipeline's */
  j->ring = r;
  j->c = c;
  client_ref(c);
  j->api = api;
  Py_INCREF(b);
  b->pins++;
  b->exports++; /* lent: no execution of ours donates it (non_donatable_indices) */
  j->b = b;
  j->handle = b->buf;
  Py_INCREF(array);
  j->array = array;
  j->dst = (char*)PyArray_DATA((PyArrayObject*)array);
  j->nbytes = nbytes;
  j->ready = ready.event;
  j->starts = 2;
  j->work.run = d2h_run;
  j->work.arg = j;
  j->work.lane = staging_lane(c, buffer_device(b));
  j->release.run = d2h_release;
  j->release.arg = j;
  ((PromiseObject*)promise)->job = j;
  pthread_mutex_lock(&r->mu);
  r->d2h_jobs++;
  pthread_mutex_unlock(&r->mu);
  __atomic_add_fetch(&c->transfers, 1, __ATOMIC_ACQ_REL); /* until d2h_run ends */
  error = event_on_ready(api, ready.event, d2h_source_ready, j);
  if (error != NULL) { /* no callback will come: the driver waits for the source */
    error_destroy(api, error);
    d2h_start(j);
  }
  d2h_start(j); /* the registration's part */
  return promise;
}
