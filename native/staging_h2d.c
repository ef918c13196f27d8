/* Host to device, staged (see staging_ring.c for why).
 *
 * The calling thread, without the GIL, copies the array into ring slots a
 * chunk at a time (with the copier threads) and hands each slot to the
 * plugin's async transfer manager (PJRT_AsyncHostToDeviceTransferManager_
 * TransferData at the chunk's offset); the plugin's DMA of one slot overlaps
 * the copy into the next. A slot comes free when its DMA's event fires.
 *
 * Decision: buffer_async keeps its copy semantics. The call returns once the
 * whole array has been read into the ring (so the caller may change it at
 * once, as documented), with the last chunks' DMAs still in flight: the
 * returned promise is ready when the device has every byte. XLA's own path
 * also reads the array during the call (into its pinned buffer), one thread,
 * before any DMA starts; this one returns sooner.
 *
 * Failures never leave a half-written buffer that looks ready: a chunk the
 * plugin refuses, Ctrl-C (looked for every 50 ms), close() of the client
 * from another thread, or the interpreter exiting stop the issuing, the
 * buffer is failed with SetBufferError and dropped, and the call raises.
 * Chunks already handed over finish their DMA into a buffer nobody sees; the
 * job (a copy in flight, staging_ring.c) ends with the last of them, when
 * the finisher destroys the transfer manager.
 */
#include "staging.h"

#define H2D_SIGNAL_CHECK_NS (50L * 1000 * 1000)

typedef struct {
  staging_ring* ring;
  pjrt_py_client* c;
  PJRT_AsyncHostToDeviceTransferManager* manager;
  long inflight; /* chunks whose DMA has not finished (ring->mu) */
  int closed;    /* no chunk will be issued any more (ring->mu) */
  staging_work work;
} h2d_job;

enum { H2D_DONE = 0, H2D_PLUGIN, H2D_SIGNAL, H2D_STOPPED };

static void h2d_manager_destroy(const PJRT_Api* api, PJRT_AsyncHostToDeviceTransferManager* m) {
  PJRT_AsyncHostToDeviceTransferManager_Destroy_Args args = {0};
  args.struct_size = PJRT_AsyncHostToDeviceTransferManager_Destroy_Args_STRUCT_SIZE;
  args.transfer_manager = m;
  error_destroy(api, api->PJRT_AsyncHostToDeviceTransferManager_Destroy(&args));
}

/* The finisher, after the last chunk's DMA: the manager goes, the job ends. */
static void h2d_finish(void* arg) {
  h2d_job* j = (h2d_job*)arg;
  if (staging_may_call(j->c)) h2d_manager_destroy(j->c->api, j->manager);
  staging_job_ended(j->ring, j->c);
  free(j);
}

/* Drops one of a chunk's two holds on its slot: its DMA's callback's, and
 * the issuer's (held until its PJRT_Event_OnReady call has returned, so that
 * the slot's next owner cannot destroy the event under that call). The slot
 * is free when both are gone. */
static void h2d_slot_release(staging_slot* s) {
  h2d_job* j = (h2d_job*)s->job;
  staging_ring* r = j->ring;
  pthread_mutex_lock(&r->mu);
  if (--s->holds > 0) {
    pthread_mutex_unlock(&r->mu);
    return;
  }
  s->busy = 0;
  s->job = NULL;
  bool last = --j->inflight == 0 && j->closed;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  if (last) staging_finish(&j->work);
}

/* A chunk's DMA is over. On a PJRT thread, or the issuer's. XLA's plugins
 * complete this event without an error even when the copy failed: the
 * transfer manager fails the buffer itself then. */
static void h2d_chunk_done(PJRT_Error* error, void* arg) {
  staging_slot* s = (staging_slot*)arg;
  error_destroy(((h2d_job*)s->job)->c->api, error);
  h2d_slot_release(s);
}

/* Whether buffer's ready event has fired: before its last chunk, only a
 * chunk that failed (the manager failed the buffer) makes it so. No GIL. */
static bool h2d_buffer_settled(const PJRT_Api* api, PJRT_Buffer* buffer) {
  PJRT_Buffer_ReadyEvent_Args args = {0};
  args.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  args.buffer = buffer;
  PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&args);
  if (error != NULL) {
    error_destroy(api, error);
    return false;
  }
  bool settled = event_is_ready(api, args.event);
  event_destroy(api, args.event);
  return settled;
}

static void h2d_fail_buffer(const PJRT_Api* api, PJRT_AsyncHostToDeviceTransferManager* m,
                            int code, const char* message) {
  PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args args = {0};
  args.struct_size = PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args_STRUCT_SIZE;
  args.transfer_manager = m;
  args.buffer_index = 0;
  args.error_code = (PJRT_Error_Code)code;
  args.error_message = message;
  args.error_message_size = strlen(message);
  error_destroy(api, api->PJRT_AsyncHostToDeviceTransferManager_SetBufferError(&args));
}

/* A transfer manager for one array of `type` and `dims` in the device's
 * default memory, whose buffer is exactly nbytes; NULL where the plugin will
 * not make one (the plain path then takes the transfer). With the GIL. */
static PJRT_AsyncHostToDeviceTransferManager* h2d_manager(pjrt_py_client* c, PJRT_Device* device,
                                                          int type, const int64_t* dims,
                                                          size_t ndim, size_t nbytes) {
  const PJRT_Api* api = c->api;
  PJRT_Device_DefaultMemory_Args dm = {0};
  dm.struct_size = PJRT_Device_DefaultMemory_Args_STRUCT_SIZE;
  dm.device = device;
  PJRT_Error* error = api->PJRT_Device_DefaultMemory(&dm);
  PJRT_ShapeSpec spec = {0};
  spec.struct_size = PJRT_ShapeSpec_STRUCT_SIZE;
  spec.dims = dims;
  spec.num_dims = ndim;
  spec.element_type = (PJRT_Buffer_Type)type;
  PJRT_Client_CreateBuffersForAsyncHostToDevice_Args args = {0};
  args.struct_size = PJRT_Client_CreateBuffersForAsyncHostToDevice_Args_STRUCT_SIZE;
  args.client = c->client;
  args.shape_specs = &spec;
  args.num_shape_specs = 1;
  args.memory = dm.memory;
  if (error == NULL) error = api->PJRT_Client_CreateBuffersForAsyncHostToDevice(&args);
  if (error != NULL) {
    error_destroy(api, error);
    return NULL;
  }
  PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args size = {0};
  size.struct_size = PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args_STRUCT_SIZE;
  size.transfer_manager = args.transfer_manager;
  error = PJRT_PY_HAS(api, PJRT_AsyncHostToDeviceTransferManager_BufferSize)
              ? api->PJRT_AsyncHostToDeviceTransferManager_BufferSize(&size)
              : NULL;
  if (error != NULL || size.buffer_size != nbytes) { /* packed or padded on the device */
    error_destroy(api, error);
    h2d_manager_destroy(api, args.transfer_manager);
    return NULL;
  }
  return args.transfer_manager;
}

/* The manager's buffer as a Buffer, if its layout is row-major (raw bytes of
 * the array are then the buffer's bytes); else NULL (failed, dropped).
 * With the GIL. */
static BufferObject* h2d_buffer(PyObject* client, pjrt_py_client* c,
                                PJRT_AsyncHostToDeviceTransferManager* m, PyObject* meta,
                                size_t ndim, PJRT_Device* device) {
  PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args args = {0};
  args.struct_size = PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args_STRUCT_SIZE;
  args.transfer_manager = m;
  PJRT_Error* error = c->api->PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer(&args);
  if (error != NULL) {
    error_destroy(c->api, error);
    return NULL;
  }
  BufferObject* b = buffer_wrap(client, c, args.buffer_out, meta, device); /* counted */
  if (b == NULL) return NULL;
  int64_t order[PJRT_PY_MAX_RANK];
  bool row_major = buffer_minor_to_major(b, ndim, order);
  for (size_t k = 0; row_major && k < ndim; ++k) row_major = order[k] == (int64_t)(ndim - 1 - k);
  if (!row_major) {
    h2d_fail_buffer(c->api, m, PJRT_Error_Code_CANCELLED, "not staged: not row-major");
    Py_DECREF(b);
    return NULL;
  }
  b->row_major = 1;
  return b;
}

/* The staged copy of a C-contiguous array to `device`'s default memory: a
 * new Buffer, NULL with an exception, or STAGING_NOT_TAKEN (nothing done:
 * the plain path takes it). With the GIL; the caller checked c takes work. */
static BufferObject* staged_to_device(PyObject* client, pjrt_py_client* c, PyArrayObject* array,
                                      int type, PJRT_Device* device, PyObject* meta) {
  const PJRT_Api* api = c->api;
  if (!PJRT_PY_HAS(api, PJRT_Client_CreateBuffersForAsyncHostToDevice) ||
      !PJRT_PY_HAS(api, PJRT_AsyncHostToDeviceTransferManager_SetBufferError) ||
      !PJRT_PY_HAS(api, PJRT_Device_DefaultMemory) || !staging_hold(c))
    return STAGING_NOT_TAKEN;
  staging_ring* r = c->staging;
  const char* src = (const char*)PyArray_DATA(array);
  size_t nbytes = (size_t)PyArray_NBYTES(array);
  size_t ndim = (size_t)PyArray_NDIM(array);
  int64_t dims[PJRT_PY_MAX_RANK];
  for (size_t i = 0; i < ndim; ++i) dims[i] = (int64_t)PyArray_DIMS(array)[i];
  client_enter_checked(c);
  int usable = 1;
  if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != RING_READY) {
    Py_BEGIN_ALLOW_THREADS
    usable = staging_ring_ensure(r);
    Py_END_ALLOW_THREADS
  }
  usable = usable && (r->mode == STAGING_ON || r->dma_mapped);
  PJRT_AsyncHostToDeviceTransferManager* m =
      usable ? h2d_manager(c, device, type, dims, ndim, nbytes) : NULL;
  BufferObject* b = m ? h2d_buffer(client, c, m, meta, ndim, device) : NULL;
  h2d_job* j = b ? (h2d_job*)calloc(1, sizeof(h2d_job)) : NULL;
  if (j == NULL) {
    if (b != NULL) h2d_fail_buffer(api, m, PJRT_Error_Code_RESOURCE_EXHAUSTED, "no memory");
    Py_XDECREF(b);
    if (m != NULL) h2d_manager_destroy(api, m);
    client_leave(c);
    staging_unhold(r);
    if (PyErr_Occurred()) return NULL; /* no memory for the Buffer */
    return STAGING_NOT_TAKEN;
  }
  j->ring = r;
  j->c = c;
  j->manager = m;
  j->work.run = h2d_finish;
  j->work.arg = j;
  __atomic_add_fetch(&c->transfers, 1, __ATOMIC_ACQ_REL); /* until h2d_finish */
  pthread_mutex_lock(&r->mu);
  r->h2d_jobs++;
  pthread_mutex_unlock(&r->mu);

  int stop = H2D_DONE;
  PJRT_Error* refused = NULL;
  size_t chunk = r->chunk_bytes, offset = 0;
  Py_BEGIN_ALLOW_THREADS
  long checked = now_ns();
  while (offset < nbytes) {
    if (now_ns() - checked > H2D_SIGNAL_CHECK_NS) {
      Py_BLOCK_THREADS
      if (PyErr_CheckSignals() < 0) stop = H2D_SIGNAL;
      Py_UNBLOCK_THREADS
      checked = now_ns();
      if (stop) break;
    }
    if (phase() != PHASE_RUNNING || __atomic_load_n(&c->closed, __ATOMIC_ACQUIRE)) {
      stop = H2D_STOPPED;
      break;
    }
    pthread_mutex_lock(&r->mu);
    bool holding = j->inflight > 0; /* slots in DMAs: let a job that has none go first */
    pthread_mutex_unlock(&r->mu);
    staging_slot* s = staging_slot_take(r, H2D_SIGNAL_CHECK_NS, holding);
    if (s == NULL) continue; /* all in DMAs: look for signals, then wait again */
    size_t len = nbytes - offset < chunk ? nbytes - offset : chunk;
    s->job = j;
    staging_copy(s->mem, src + offset, len);
    PJRT_AsyncHostToDeviceTransferManager_TransferData_Args t = {0};
    t.struct_size = PJRT_AsyncHostToDeviceTransferManager_TransferData_Args_STRUCT_SIZE;
    t.transfer_manager = m;
    t.buffer_index = 0;
    t.data = s->mem;
    t.offset = (int64_t)offset;
    t.transfer_size = (int64_t)len;
    t.is_last_transfer = offset + len == nbytes;
    refused = api->PJRT_AsyncHostToDeviceTransferManager_TransferData(&t);
    if (refused != NULL) {
      staging_slot_give(r, s);
      stop = H2D_PLUGIN;
      break;
    }
    pthread_mutex_lock(&r->mu);
    s->event = t.done_with_h2d_transfer;
    s->holds = 2;
    j->inflight++;
    pthread_mutex_unlock(&r->mu);
    offset += len;
    PJRT_Error* error = event_on_ready(api, t.done_with_h2d_transfer, h2d_chunk_done, s);
    if (error != NULL) { /* no callback will come: wait for the DMA here */
      error_destroy(api, error);
      PJRT_Event_Await_Args a = {0};
      a.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
      a.event = t.done_with_h2d_transfer;
      h2d_chunk_done(api->PJRT_Event_Await(&a), s);
    }
    h2d_slot_release(s); /* the issuer's hold */
  }
  if (stop != H2D_DONE && staging_may_call(c)) {
    /* XLA's transfer manager aborts the process (a CHECK) when a buffer that
     * a failed chunk has already failed is failed again: so the chunks in
     * flight are waited for (a few DMAs at most), and the buffer is failed
     * only if none of them did. */
    pthread_mutex_lock(&r->mu);
    while (j->inflight > 0) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    if (!h2d_buffer_settled(api, b->buf))
      h2d_fail_buffer(api, m, PJRT_Error_Code_CANCELLED, "the staged transfer was stopped");
  }
  pthread_mutex_lock(&r->mu);
  j->closed = 1;
  bool last = j->inflight == 0;
  pthread_mutex_unlock(&r->mu);
  if (last) staging_finish(&j->work); /* j is the finisher's from here */
  Py_END_ALLOW_THREADS
  client_leave(c);
  if (stop == H2D_DONE) return b;
  Py_DECREF(b); /* failed: nobody may see it */
  if (stop == H2D_PLUGIN) return (BufferObject*)raise_pjrt(api, refused);
  if (stop == H2D_STOPPED) /* else H2D_SIGNAL: the signal handler's exception is set */
    PyErr_SetString(PyExc_ValueError,
                    phase() != PHASE_RUNNING ? "the interpreter is exiting" : "client is closed");
  return NULL;
}
