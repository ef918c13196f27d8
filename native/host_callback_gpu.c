/* Python host callbacks on a GPU plugin: the staged handler.
 *
 * A GPU plugin calls an FFI handler on a host thread while the program's
 * work is queued on a stream, and the call frame's buffers are device
 * memory. The staged handler (a second pool of trampolines, registered for
 * the GPU platform only) does, per call:
 *
 *   1. ask XLA for the call's stream (XLA_FFI_Stream_Get, a CUstream);
 *   2. copy each operand into host staging memory on that stream, which
 *      orders the copies after the work that produced the operands, then
 *      synchronize the stream;
 *   3. run the Python function exactly as on CPU (hc_call, same checks,
 *      errors and view rules) on a copy of the call frame whose buffers point
 *      at the staging memory;
 *   4. copy the results back on the stream and synchronize before freeing
 *      the staging memory (simple and correct; the handler already waited
 *      for the stream in step 2, so the program's GPU work is stalled for the
 *      call either way, as it is with jax's own GPU callback).
 *
 * Operand views (copy=False) are views of the staging memory, freed when the
 * call returns: the CPU rule against keeping one applies unchanged.
 *
 * The copies go through a copier, a table of functions chosen per
 * registration (hcs_copiers): "cuda" uses the CUDA driver API, loaded with
 * dlopen("libcuda.so.1") at the first CUDA registration (the module never
 * links CUDA). Three more let the CPU builds test what does not need a GPU:
 * "host" (memcpy, no stream) the staging, "host-stream" (memcpy after asking
 * XLA for a stream, which a CPU plugin refuses) the XLA_FFI_Api slot this
 * file relies on, and "cuda-no-stream" (the CUDA copier on a null stream)
 * the driver calls, against a stand-in driver library.
 *
 * Anything that fails here fails the execution with an error naming the
 * callback and, for CUDA, the driver call and its CUDA error (INTERNAL). */
#include "host_callback.h"

enum { HCS_WHY = 256, HCS_ALIGN = 64, HCS_NAME = 96 };

typedef struct {
  const char* name; /* as copier names it in Python */
  int needs_stream;
  /* each: 0, or -1 with a message in `why` (HCS_WHY bytes) */
  int (*enter)(void* stream, void** saved, char* why); /* optional */
  void (*leave)(void* saved);                          /* optional */
  int (*to_host)(void* dst, void* src, size_t n, void* stream, char* why);
  int (*to_device)(void* dst, void* src, size_t n, void* stream, char* why);
  int (*sync)(void* stream, char* why);
} hcs_copier;

typedef struct {
  const hcs_copier* copier; /* NULL: slot never registered staged */
  char name[HCS_NAME];      /* the callback's name, for messages without the GIL */
} hcs_slot;

static hcs_slot g_hcs[HC_SLOTS];
static size_t g_hcs_elsize[HC_MAX_TYPE]; /* XLA type -> bytes per element; 0: none */

/* ---- copiers ------------------------------------------------------------- */

static int hcs_memcpy(void* dst, void* src, size_t n, void* stream, char* why) {
  (void)stream;
  (void)why;
  memcpy(dst, src, n);
  return 0;
}

static int hcs_no_sync(void* stream, char* why) {
  (void)stream;
  (void)why;
  return 0;
}

/* The CUDA driver API, the few entry points used (cuda.h's names and their
 * ABI: CUresult is an int enum, CUdeviceptr an unsigned long long, CUstream
 * and CUcontext pointers). The _v2 names are what cuda.h maps the plain
 * names to since CUDA 3.2; the unversioned cuStreamGetCtx keeps the
 * original two-argument signature. */
typedef int cu_result;
typedef struct {
  cu_result (*dtoh)(void*, unsigned long long, size_t, void*);
  cu_result (*htod)(unsigned long long, const void*, size_t, void*);
  cu_result (*stream_sync)(void*);
  cu_result (*stream_ctx)(void*, void**);
  cu_result (*ctx_current)(void**);
  cu_result (*ctx_push)(void*);
  cu_result (*ctx_pop)(void**);
  cu_result (*error_name)(cu_result, const char**);
  cu_result (*error_string)(cu_result, const char**);
} hcs_cuda_api;

static hcs_cuda_api g_cuda;
static int g_cuda_loaded = 0;

static int hcs_cuda_check(cu_result r, const char* call, char* why) {
  if (r == 0) return 0;
  const char *name = NULL, *text = NULL;
  if (g_cuda.error_name(r, &name) != 0 || name == NULL) name = "CUDA error";
  if (g_cuda.error_string(r, &text) != 0 || text == NULL) text = "no description";
  snprintf(why, HCS_WHY, "%s failed: %s %d (%s)", call, name, r, text);
  return -1;
}

/* Makes the stream's context current if it is not (the handler's thread
 * normally has it; a pushed one is popped by hcs_cuda_leave). */
static int hcs_cuda_enter(void* stream, void** saved, char* why) {
  void *ctx = NULL, *current = NULL;
  *saved = NULL;
  if (hcs_cuda_check(g_cuda.stream_ctx(stream, &ctx), "cuStreamGetCtx", why) < 0 ||
      hcs_cuda_check(g_cuda.ctx_current(&current), "cuCtxGetCurrent", why) < 0)
    return -1;
  if (ctx == NULL || ctx == current) return 0;
  if (hcs_cuda_check(g_cuda.ctx_push(ctx), "cuCtxPushCurrent_v2", why) < 0) return -1;
  *saved = ctx;
  return 0;
}

static void hcs_cuda_leave(void* saved) {
  void* popped = NULL;
  if (saved != NULL) g_cuda.ctx_pop(&popped);
}

static int hcs_cuda_to_host(void* dst, void* src, size_t n, void* stream, char* why) {
  return hcs_cuda_check(g_cuda.dtoh(dst, (unsigned long long)(uintptr_t)src, n, stream),
                        "cuMemcpyDtoHAsync_v2", why);
}

static int hcs_cuda_to_device(void* dst, void* src, size_t n, void* stream, char* why) {
  return hcs_cuda_check(g_cuda.htod((unsigned long long)(uintptr_t)dst, src, n, stream),
                        "cuMemcpyHtoDAsync_v2", why);
}

static int hcs_cuda_sync(void* stream, char* why) {
  return hcs_cuda_check(g_cuda.stream_sync(stream), "cuStreamSynchronize", why);
}

static const hcs_copier hcs_copiers[] = {
    {"cuda", 1, hcs_cuda_enter, hcs_cuda_leave, hcs_cuda_to_host, hcs_cuda_to_device,
     hcs_cuda_sync},
    /* for the tests on CPU builds (see the top of this file) */
    {"host", 0, NULL, NULL, hcs_memcpy, hcs_memcpy, hcs_no_sync},
    {"host-stream", 1, NULL, NULL, hcs_memcpy, hcs_memcpy, hcs_no_sync},
    {"cuda-no-stream", 0, hcs_cuda_enter, hcs_cuda_leave, hcs_cuda_to_host, hcs_cuda_to_device,
     hcs_cuda_sync},
};

/* Loads the driver library at `path` into `api`: NULL, or why not. */
static PyObject* hcs_cuda_open(const char* path, hcs_cuda_api* api) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char* error = dlerror();
    return PyUnicode_FromFormat("cannot load %s (%s)", path, error ? error : "unknown error");
  }
  struct {
    const char* symbol;
    void** slot;
  } wanted[] = {
      {"cuMemcpyDtoHAsync_v2", (void**)&api->dtoh},
      {"cuMemcpyHtoDAsync_v2", (void**)&api->htod},
      {"cuStreamSynchronize", (void**)&api->stream_sync},
      {"cuStreamGetCtx", (void**)&api->stream_ctx},
      {"cuCtxGetCurrent", (void**)&api->ctx_current},
      {"cuCtxPushCurrent_v2", (void**)&api->ctx_push},
      {"cuCtxPopCurrent_v2", (void**)&api->ctx_pop},
      {"cuGetErrorName", (void**)&api->error_name},
      {"cuGetErrorString", (void**)&api->error_string},
  };
  for (size_t i = 0; i < sizeof(wanted) / sizeof(wanted[0]); ++i) {
    *wanted[i].slot = dlsym(lib, wanted[i].symbol);
    if (*wanted[i].slot == NULL) {
      dlclose(lib); /* not a usable driver: nothing of it is kept */
      return PyUnicode_FromFormat("%s has no %s (not a CUDA driver library, or too old)", path,
                                  wanted[i].symbol);
    }
  }
  return NULL;
}

/* ---- the handler --------------------------------------------------------- */

/* An XLA FFI error for the slot's callback: "host callback 'name': what: why".
 * Slot 0 routes jax's callbacks: named by route, as hc_run names them. */
static void* hcs_error(const hc_frame* frame, int slot, int code, const char* what,
                       const char* why) {
  char name[HCS_NAME + 32], message[HCS_WHY + 2 * HCS_NAME + 96];
  unsigned long long key = 0;
  if (slot == 0 && hc_route_key(&frame->attrs, &key) == 0)
    snprintf(name, sizeof name, "'jax callback %llu'", key);
  else
    snprintf(name, sizeof name, "%s", g_hcs[slot].name);
  snprintf(message, sizeof(message), "host callback %s: %s: %s", name, what, why);
  return hc_error(frame, code, message);
}

/* The call's stream from XLA: 0, or -1 with XLA's reason in `why`. */
static int hcs_stream(const hc_frame* frame, void** stream, char* why) {
  const hc_api* api = frame->api;
  if (api->struct_size < offsetof(hc_api, stream_get) + sizeof(void*) || api->stream_get == NULL) {
    snprintf(why, HCS_WHY, "the plugin's XLA FFI API has no XLA_FFI_Stream_Get");
    return -1;
  }
  hc_stream_args a = {sizeof(a), NULL, frame->ctx, NULL};
  void* error = api->stream_get(&a);
  if (error == NULL) {
    *stream = a.stream;
    return 0;
  }
  hc_error_message_args m = {sizeof(m), NULL, error, NULL};
  api->error_get_message(&m);
  snprintf(why, HCS_WHY, "XLA_FFI_Stream_Get: %s", m.message ? m.message : "no message");
  hc_error_destroy_args d = {sizeof(d), NULL, error};
  api->error_destroy(&d);
  return -1;
}

static int hcs_staged(const hc_list* list, int64_t i) {
  const hc_buffer* b = (const hc_buffer*)list->items[i];
  return list->types[i] == 1 && b->dtype != HC_TOKEN;
}

/* Bytes of a buffer (0 for a type numpy lacks: hc_call reports it). */
static size_t hcs_bytes(const hc_buffer* b) {
  size_t n = b->dtype > 0 && b->dtype < HC_MAX_TYPE ? g_hcs_elsize[b->dtype] : 0;
  for (int64_t d = 0; d < b->rank; ++d) n *= b->dims[d] > 0 ? (size_t)b->dims[d] : 0;
  return n;
}

/* A copy of `frame` whose staged buffers point at host memory, all in one
 * malloc'd block (*block; NULL when out of memory). */
static void hcs_shadow(const hc_frame* frame, hc_frame* shadow, void** block) {
  int64_t n = frame->args.size + frame->rets.size;
  size_t head = (size_t)n * (sizeof(hc_buffer) + sizeof(void*));
  size_t total = (head + HCS_ALIGN - 1) / HCS_ALIGN * HCS_ALIGN;
  for (int64_t k = 0; k < n; ++k) {
    const hc_list* list = k < frame->args.size ? &frame->args : &frame->rets;
    int64_t i = k < frame->args.size ? k : k - frame->args.size;
    if (hcs_staged(list, i))
      total += (hcs_bytes((const hc_buffer*)list->items[i]) + HCS_ALIGN - 1) / HCS_ALIGN * HCS_ALIGN;
  }
  char* mem = NULL;
  *block = posix_memalign((void**)&mem, HCS_ALIGN, total > 0 ? total : HCS_ALIGN) == 0 ? mem : NULL;
  if (mem == NULL) return;
  hc_buffer* buffers = (hc_buffer*)mem;
  void** items = (void**)(buffers + n);
  char* data = mem + (head + HCS_ALIGN - 1) / HCS_ALIGN * HCS_ALIGN;
  *shadow = *frame;
  shadow->args.items = items;
  shadow->rets.items = items + frame->args.size;
  for (int64_t k = 0; k < n; ++k) {
    const hc_list* list = k < frame->args.size ? &frame->args : &frame->rets;
    int64_t i = k < frame->args.size ? k : k - frame->args.size;
    items[k] = list->items[i];
    if (!hcs_staged(list, i)) continue;
    buffers[k] = *(const hc_buffer*)list->items[i];
    buffers[k].data = data;
    items[k] = &buffers[k];
    data += (hcs_bytes(&buffers[k]) + HCS_ALIGN - 1) / HCS_ALIGN * HCS_ALIGN;
  }
}

/* Copies the staged buffers of `list` between `device` (XLA's frame) and
 * `host` (the shadow), to the host or to the device. */
static int hcs_copy(const hcs_copier* c, const hc_list* device, const hc_list* host, int to_host,
                    void* stream, char* why) {
  for (int64_t i = 0; i < device->size; ++i) {
    if (!hcs_staged(device, i)) continue;
    hc_buffer* d = (hc_buffer*)device->items[i];
    hc_buffer* h = (hc_buffer*)host->items[i];
    size_t n = hcs_bytes(d);
    if (n == 0) continue;
    int status = to_host ? c->to_host(h->data, d->data, n, stream, why)
                         : c->to_device(d->data, h->data, n, stream, why);
    if (status < 0) return -1;
  }
  return c->sync(stream, why);
}

static void* hcs_handle(int slot, hc_frame* frame) {
  if (ffi_answer_metadata(frame->extension_start)) return NULL;
  if (frame->stage != HC_EXECUTE) return NULL;
  const hcs_copier* c = __atomic_load_n(&g_hcs[slot].copier, __ATOMIC_ACQUIRE);
  char why[HCS_WHY] = "";
  void *stream = NULL, *saved = NULL, *block = NULL, *error = NULL;
  if (c == NULL) return hc_error(frame, HC_NOT_FOUND, "host callback: no staged copier");
  if (c->needs_stream && hcs_stream(frame, &stream, why) < 0)
    return hcs_error(frame, slot, HC_UNIMPLEMENTED, "no stream for the call", why);
  hc_frame shadow;
  hcs_shadow(frame, &shadow, &block);
  if (block == NULL)
    return hcs_error(frame, slot, HC_RESOURCE_EXHAUSTED, "staging", "out of host memory");
  if (c->enter != NULL && c->enter(stream, &saved, why) < 0) {
    free(block);
    return hcs_error(frame, slot, HC_INTERNAL, "making the stream's context current", why);
  }
  if (hcs_copy(c, &frame->args, &shadow.args, 1, stream, why) < 0) {
    error = hcs_error(frame, slot, HC_INTERNAL, "copying the operands to the host", why);
  } else {
    error = hc_call(slot, &shadow);
    if (error == NULL && hcs_copy(c, &frame->rets, &shadow.rets, 0, stream, why) < 0)
      error = hcs_error(frame, slot, HC_INTERNAL, "copying the results to the device", why);
  }
  if (error != NULL && c->sync != NULL) {
    /* Copies queued before the one that failed use `block`. It is pageable
     * memory, which the driver copies synchronously, but the stream is
     * waited for anyway before the block is freed. */
    char ignored[HCS_WHY];
    c->sync(stream, ignored);
  }
  if (c->leave != NULL) c->leave(saved);
  free(block);
  return error;
}

HC_POOL(hcs_t_, hcs_handle)
static void* (*const hcs_trampolines[HC_SLOTS])(hc_frame*) = {HC_NAMES(hcs_t_)};

/* ---- Python entry points ------------------------------------------------- */

/* cuda_driver_load(path) -> None, or why the CUDA driver cannot be used. The
 * first library that loads with every entry point becomes the driver, for
 * the process (never unloaded); later calls only check `path`. */
static PyObject* core_cuda_driver_load(PyObject* self, PyObject* args) {
  (void)self;
  const char* path;
  if (!PyArg_ParseTuple(args, "s:cuda_driver_load", &path)) return NULL;
  hcs_cuda_api api;
  PyObject* why = hcs_cuda_open(path, &api);
  if (why != NULL) return why;
  if (!__atomic_load_n(&g_cuda_loaded, __ATOMIC_ACQUIRE)) {
    g_cuda = api;
    __atomic_store_n(&g_cuda_loaded, 1, __ATOMIC_RELEASE);
  }
  Py_RETURN_NONE;
}

/* host_callback_staged(slot, name, copier) -> the slot's staged handler
 * address, for the GPU platform. The slot's function is host_callback_set's. */
static PyObject* core_host_callback_staged(PyObject* self, PyObject* args) {
  (void)self;
  int slot;
  const char *name, *copier;
  if (!PyArg_ParseTuple(args, "iss:host_callback_staged", &slot, &name, &copier)) return NULL;
  if (slot < 0 || slot >= HC_SLOTS) return PyErr_Format(PyExc_ValueError, "no slot %d", slot);
  const hcs_copier* c = NULL;
  for (size_t i = 0; i < sizeof(hcs_copiers) / sizeof(hcs_copiers[0]); ++i)
    if (strcmp(hcs_copiers[i].name, copier) == 0) c = &hcs_copiers[i];
  if (c == NULL) return PyErr_Format(PyExc_ValueError, "no copier %s", copier);
  if (c->enter == hcs_cuda_enter && !__atomic_load_n(&g_cuda_loaded, __ATOMIC_ACQUIRE))
    return PyErr_Format(PyExc_RuntimeError, "the CUDA driver is not loaded (cuda_driver_load)");
  for (int t = 1; t < HC_MAX_TYPE; ++t) { /* element sizes, read without the GIL later */
    PyObject* descr = hc_descr(t);
    PyObject* size = descr ? PyObject_GetAttrString(descr, "itemsize") : NULL;
    g_hcs_elsize[t] = size ? PyLong_AsSize_t(size) : 0;
    Py_XDECREF(size);
    if (PyErr_Occurred()) return NULL;
  }
  snprintf(g_hcs[slot].name, HCS_NAME, "'%s'", name);
  __atomic_store_n(&g_hcs[slot].copier, c, __ATOMIC_RELEASE);
  return PyLong_FromVoidPtr((void*)hcs_trampolines[slot]);
}
