/* Host arrays: transfers between numpy arrays and device buffers (the
 * element types and metadata they carry: meta.c). */
#include "staging.h"

#include <string.h>

/* ---- host to device ---------------------------------------------------------- */

#define PJRT_PY_GIL_FREE_BYTES (64 << 10) /* copies this large release the GIL */

/* Starts copying (or aliasing) a C-contiguous array to `device`. The array
 * stays referenced until PJRT is done with its memory. `host_aliased`: 0 a
 * copy; 1 the buffer aliases the caller's array (memory pjrt_py did not
 * allocate: not counted, accounting.h); 2 it aliases memory pjrt_py allocated
 * for it (a staged copy: counted). Returns a new Buffer, or NULL with an
 * exception set. */
static BufferObject* host_to_device(PyObject* client, pjrt_py_client* c, PyArrayObject* array,
                                    int type, int semantics, PJRT_Device* device,
                                    PJRT_Memory* memory, PyObject* meta, int host_aliased) {
  npy_intp nbytes = PyArray_NBYTES(array);
  if (semantics == PJRT_HostBufferSemantics_kImmutableOnlyDuringCall && memory == NULL &&
      staging_wanted(c, (size_t)nbytes)) { /* large, and c stages copies (staging_h2d.c) */
    BufferObject* staged = staged_to_device(client, c, array, type, device, meta);
    if (staged != STAGING_NOT_TAKEN) return staged;
  }
  int64_t dims[PJRT_PY_MAX_RANK];
  int ndim = PyArray_NDIM(array);
  for (int i = 0; i < ndim; ++i) dims[i] = (int64_t)PyArray_DIMS(array)[i];
  PJRT_Client_BufferFromHostBuffer_Args args = {0};
  args.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
  args.client = c->client;
  args.data = nbytes ? PyArray_DATA(array) : NULL;
  args.type = (PJRT_Buffer_Type)type;
  args.dims = dims;
  args.num_dims = (size_t)ndim;
  args.host_buffer_semantics = (PJRT_HostBufferSemantics)semantics;
  args.device = device;
  args.memory = memory; /* NULL: the device's default memory */
  PJRT_Error* error;
  if (nbytes >= PJRT_PY_GIL_FREE_BYTES) {
    client_enter_checked(c); /* the caller checked that c takes work */
    Py_BEGIN_ALLOW_THREADS
    error = c->api->PJRT_Client_BufferFromHostBuffer(&args);
    Py_END_ALLOW_THREADS
    client_leave(c);
  } else {
    error = c->api->PJRT_Client_BufferFromHostBuffer(&args);
  }
  if (error != NULL) return (BufferObject*)raise_pjrt(c->api, error);
  BufferObject* b = host_aliased == 1 ? buffer_wrap_uncounted(client, c, args.buffer, meta)
                                      : buffer_wrap(client, c, args.buffer, meta, device);
  if (b == NULL) return NULL; /* buffer_wrap freed the PJRT buffer */
  b->host_aliased = host_aliased != 0;
  b->row_major = 1; /* no device_layout asked for: the default, row-major */
  /* Known at creation (buffer_origin): no later call asks the plugin. */
  b->device = device;
  b->memory = memory != NULL ? memory : client_default_memory(c, device);
  /* An alias's event fires when the buffer is freed: not a copy to wait for. */
  if (!host_aliased) transfer_track(c, args.done_with_host_buffer);
  release_on_ready(c->api, args.done_with_host_buffer, (PyObject*)array);
  return b;
}

/* ---- device to host ------------------------------------------------------------ */

/* b's on-device layout as minor_to_major (ndim entries) where it is untiled:
 * 1, else 0 (tiled, another rank, or the plugin cannot say). With the GIL. */
static int buffer_minor_to_major(BufferObject* b, size_t ndim, int64_t* minor_to_major) {
  const PJRT_Api* api = b->c->api;
  if (!PJRT_PY_HAS(api, PJRT_Buffer_GetMemoryLayout)) return 0;
  PJRT_Buffer_GetMemoryLayout_Args l = {0};
  l.struct_size = PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE;
  l.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_GetMemoryLayout(&l);
  if (error != NULL) {
    error_destroy(api, error);
    return 0;
  }
  if (l.layout.type != PJRT_Buffer_MemoryLayout_Type_Tiled || l.layout.tiled.num_tiles != 0 ||
      l.layout.tiled.minor_to_major_size != ndim)
    return 0;
  for (size_t i = 0; i < ndim; ++i) minor_to_major[i] = l.layout.tiled.minor_to_major[i];
  return 1;
}

/* The plugin's count of buf's bytes on its device (PJRT_Buffer_
 * OnDeviceSizeInBytes) into *bytes: NULL, or the plugin's error for the
 * caller to raise or destroy (then *bytes is 0). No GIL needed. */
static PJRT_Error* buffer_device_bytes(const PJRT_Api* api, PJRT_Buffer* buf, size_t* bytes) {
  PJRT_Buffer_OnDeviceSizeInBytes_Args args = {0};
  args.struct_size = PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE;
  args.buffer = buf;
  PJRT_Error* error = api->PJRT_Buffer_OnDeviceSizeInBytes(&args);
  *bytes = error == NULL ? args.on_device_size_in_bytes : 0;
  return error;
}

/* Whether b's memory is host memory, dense row-major and `size` bytes long:
 * then it can be read directly. Asked once per buffer. */
static int buffer_is_dense_on_host(BufferObject* b, size_t size, size_t ndim) {
  const PJRT_Api* api = b->c->api;
  if (!PJRT_PY_HAS(api, PJRT_Buffer_GetMemoryLayout) ||
      !PJRT_PY_HAS(api, PJRT_Buffer_IncreaseExternalReferenceCount) ||
      !PJRT_PY_HAS(api, PJRT_Buffer_DecreaseExternalReferenceCount) ||
      !PJRT_PY_HAS(api, PJRT_Buffer_IsOnCpu) || !PJRT_PY_HAS(api, PJRT_Buffer_UnsafePointer))
    return 0;
  PJRT_Buffer_IsOnCpu_Args cpu = {0};
  cpu.struct_size = PJRT_Buffer_IsOnCpu_Args_STRUCT_SIZE;
  cpu.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_IsOnCpu(&cpu);
  if (error != NULL || !cpu.is_on_cpu) {
    error_destroy(api, error);
    return 0;
  }
  int64_t order[PJRT_PY_MAX_RANK];
  if (!buffer_minor_to_major(b, ndim, order)) return 0;
  for (size_t i = 0; i < ndim; ++i)
    if (order[i] != (int64_t)(ndim - 1 - i)) return 0;
  size_t on_device;
  error = buffer_device_bytes(api, b->buf, &on_device);
  error_destroy(api, error);
  return error == NULL && on_device == size;
}

/* b->dense, asked of the plugin once: 1 dense row-major host memory, 2 not. */
static int buffer_dense_state(BufferObject* b, size_t size, size_t ndim) {
  if (b->dense == 0) b->dense = buffer_is_dense_on_host(b, size, ndim) ? 1 : 2;
  return b->dense;
}

/* Whether b is ready without error; remembered once true. With the GIL. */
static int buffer_ready_ok(BufferObject* b) {
  if (b->ready) return 1;
  const PJRT_Api* api = b->c->api;
  PJRT_Buffer_ReadyEvent_Args args = {0};
  args.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&args);
  if (error != NULL) {
    error_destroy(api, error);
    return 0;
  }
  int ok = event_is_ready(api, args.event);
  if (ok) {
    error = event_error(api, args.event);
    if (error != NULL) {
      error_destroy(api, error);
      ok = 0;
    }
  }
  event_destroy(api, args.event);
  b->ready = (unsigned char)ok;
  return ok;
}

/* ---- holding a buffer's memory -------------------------------------------------- */

/* Takes a PJRT external reference on a handle: until it is dropped, the
 * memory stays where it is and the plugin will not donate it. No GIL needed
 * (staging_d2h.c holds a pinned handle from its driver thread). */
static PJRT_Error* handle_hold_memory(const PJRT_Api* api, PJRT_Buffer* buf) {
  PJRT_Buffer_IncreaseExternalReferenceCount_Args inc = {0};
  inc.struct_size = PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE;
  inc.buffer = buf;
  return api->PJRT_Buffer_IncreaseExternalReferenceCount(&inc);
}

static void handle_release_memory(const PJRT_Api* api, PJRT_Buffer* buf) {
  PJRT_Buffer_DecreaseExternalReferenceCount_Args dec = {0};
  dec.struct_size = PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE;
  dec.buffer = buf;
  error_destroy(api, api->PJRT_Buffer_DecreaseExternalReferenceCount(&dec));
}

static PJRT_Error* buffer_hold_memory(BufferObject* b) {
  return handle_hold_memory(b->c->api, b->buf);
}

static void buffer_release_memory(BufferObject* b) { handle_release_memory(b->c->api, b->buf); }

/* The address of b's data (valid while an external reference is held). */
static PJRT_Error* buffer_data_address(BufferObject* b, void** data) {
  const PJRT_Api* api = b->c->api;
  if (PJRT_PY_HAS(api, PJRT_Buffer_OpaqueDeviceMemoryDataPointer)) {
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args at = {0};
    at.struct_size = PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args_STRUCT_SIZE;
    at.buffer = b->buf;
    PJRT_Error* error = api->PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&at);
    *data = at.device_memory_ptr;
    return error;
  }
  PJRT_Buffer_UnsafePointer_Args at = {0};
  at.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE;
  at.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_UnsafePointer(&at);
  *data = (void*)(uintptr_t)at.buffer_pointer;
  return error;
}

/* The CPU fast path of a device-to-host copy: if b is ready and its memory
 * is dense host memory, copy `size` bytes into dst now and return 1; else 0,
 * touching nothing. With the GIL; released for large copies, b pinned.
 * Decision: a small copy under the GIL of a buffer no call of ours uses (no
 * pin) takes no external reference: a delete(), a dealloc, and an execution
 * that could donate b (it pins b first) all need the GIL this thread holds,
 * and the pointer query still checks b is alive. The reference (the plugin
 * then refuses to donate b) stays for copies without the GIL and pinned
 * buffers. It was ~800 of a small to_numpy's 3,000 instructions. */
static int buffer_read_direct(BufferObject* b, void* dst, size_t size, size_t ndim) {
  if (!b->c->cpu || !buffer_ready_ok(b)) return 0;
  if (buffer_dense_state(b, size, ndim) != 1) return 0;
  const PJRT_Api* api = b->c->api;
  bool unlocked = size >= PJRT_PY_GIL_FREE_BYTES;
  bool hold = unlocked || b->pins != 0;
  PJRT_Error* error = hold ? buffer_hold_memory(b) : NULL;
  if (error != NULL) {
    error_destroy(api, error);
    return 0;
  }
  void* src = NULL;
  error = buffer_data_address(b, &src);
  int copied = error == NULL;
  error_destroy(api, error);
  /* A large copy runs without the GIL, with b pinned: a delete() from
   * another thread meanwhile leaves the handle for the unpin below, which
   * must come after the external reference is dropped. */
  unlocked = unlocked && copied;
  pjrt_py_client* c = b->c;
  if (unlocked) {
    client_enter_checked(c); /* b is live (checked above): c takes work */
    b->pins++;
    Py_BEGIN_ALLOW_THREADS
    memcpy(dst, src, size);
    Py_END_ALLOW_THREADS
  } else if (copied) {
    memcpy(dst, src, size);
  }
  if (hold) buffer_release_memory(b);
  if (unlocked) {
    buffer_unpin(b); /* frees the handle now if another thread deleted b */
    client_leave(c);
  }
  return copied;
}

/* Starts PJRT's own copy of b into dst (dense row-major, asked for
 * explicitly: the device layout may differ). With the GIL. */
static PJRT_Error* buffer_to_host(BufferObject* b, void* dst, size_t size, size_t ndim,
                                  PJRT_Event** done) {
  int64_t minor_to_major[PJRT_PY_MAX_RANK];
  for (size_t i = 0; i < ndim; ++i) minor_to_major[i] = (int64_t)(ndim - 1 - i);
  PJRT_Buffer_MemoryLayout layout = {0};
  layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
  layout.type = PJRT_Buffer_MemoryLayout_Type_Tiled;
  layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
  layout.tiled.minor_to_major = minor_to_major;
  layout.tiled.minor_to_major_size = ndim;
  PJRT_Buffer_ToHostBuffer_Args args = {0};
  args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  args.src = b->buf;
  args.host_layout = &layout;
  args.dst = dst;
  args.dst_size = size;
  PJRT_Error* error = b->c->api->PJRT_Buffer_ToHostBuffer(&args);
  if (error == NULL) {
    *done = args.event;
    transfer_track(b->c, args.event);
  }
  return error;
}
