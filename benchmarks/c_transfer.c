/* The baselines for benchmarks/bandwidth.py and benchmarks/small_transfers.py:
 * host-to-device and device-to-host transfers in plain C on the same plugin,
 * client and header that pjrt_py uses, so the plugin's own copy cost can be
 * told apart from pjrt_py's. Built at run time. Each function returns mean
 * ns per transfer, or -1 on a PJRT error. */
#include <stdint.h>

#include "c_common.h"

static int await_and_destroy(const PJRT_Api* api, PJRT_Event* event) {
  if (event == NULL) return 0;
  PJRT_Event_Await_Args w;
  memset(&w, 0, sizeof(w));
  w.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
  w.event = event;
  int failed = api->PJRT_Event_Await(&w) != NULL;
  event_destroy(api, event);
  return failed;
}

/* BufferFromHostBuffer, wait until the host data is released (for a copy)
 * and the buffer is ready, destroy the buffer (which releases a zero-copy
 * source). */
double c_h2d(const PJRT_Api* api, PJRT_Client* client, PJRT_Device* device, const void* data,
             int type, const int64_t* dims, size_t num_dims, int semantics, long iterations) {
  double start = now_ns();
  for (long i = 0; i < iterations; ++i) {
    PJRT_Client_BufferFromHostBuffer_Args a;
    memset(&a, 0, sizeof(a));
    a.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
    a.client = client;
    a.data = data;
    a.type = (PJRT_Buffer_Type)type;
    a.dims = dims;
    a.num_dims = num_dims;
    a.host_buffer_semantics = (PJRT_HostBufferSemantics)semantics;
    a.device = device;
    if (api->PJRT_Client_BufferFromHostBuffer(&a) != NULL) return -1.0;
    /* A zero-copy source is released only when the buffer is freed (below). */
    int zero_copy = semantics == PJRT_HostBufferSemantics_kImmutableZeroCopy;
    int failed = zero_copy ? 0 : await_and_destroy(api, a.done_with_host_buffer);
    PJRT_Buffer_ReadyEvent_Args r;
    memset(&r, 0, sizeof(r));
    r.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
    r.buffer = a.buffer;
    if (api->PJRT_Buffer_ReadyEvent(&r) != NULL) failed = 1;
    failed |= await_and_destroy(api, r.event);
    buffer_destroy(api, a.buffer);
    if (zero_copy) failed |= await_and_destroy(api, a.done_with_host_buffer);
    if (failed) return -1.0;
  }
  return (now_ns() - start) / (double)iterations;
}

/* ToHostBuffer into `dst` (the plugin's default host layout) and wait. */
double c_d2h(const PJRT_Api* api, PJRT_Buffer* buffer, void* dst, size_t dst_size,
             long iterations) {
  double start = now_ns();
  for (long i = 0; i < iterations; ++i) {
    PJRT_Buffer_ToHostBuffer_Args a;
    memset(&a, 0, sizeof(a));
    a.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
    a.src = buffer;
    a.dst = dst;
    a.dst_size = dst_size;
    if (api->PJRT_Buffer_ToHostBuffer(&a) != NULL) return -1.0;
    if (await_and_destroy(api, a.event)) return -1.0;
  }
  return (now_ns() - start) / (double)iterations;
}

/* The floor of an asynchronous small copy (buffer_async with its promise
 * dropped): BufferFromHostBuffer with kImmutableOnlyDuringCall (the data is
 * read during the call), destroy its done_with_host_buffer event without
 * waiting on it, destroy the buffer. */
double c_h2d_async(const PJRT_Api* api, PJRT_Client* client, PJRT_Device* device,
                   const void* data, int type, const int64_t* dims, size_t num_dims,
                   long iterations) {
  double start = now_ns();
  for (long i = 0; i < iterations; ++i) {
    PJRT_Client_BufferFromHostBuffer_Args a;
    memset(&a, 0, sizeof(a));
    a.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
    a.client = client;
    a.data = data;
    a.type = (PJRT_Buffer_Type)type;
    a.dims = dims;
    a.num_dims = num_dims;
    a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
    a.device = device;
    if (api->PJRT_Client_BufferFromHostBuffer(&a) != NULL) return -1.0;
    event_destroy(api, a.done_with_host_buffer);
    buffer_destroy(api, a.buffer);
  }
  return (now_ns() - start) / (double)iterations;
}

/* The floor of reading a ready buffer whose memory is host memory (the CPU
 * plugin): take an external reference (so the memory stays put), get its
 * address, memcpy `size` bytes into `dst` (allocated by the caller, once),
 * drop the reference. */
double c_read_direct(const PJRT_Api* api, PJRT_Buffer* buffer, void* dst, size_t size,
                     long iterations) {
  double start = now_ns();
  for (long i = 0; i < iterations; ++i) {
    PJRT_Buffer_IncreaseExternalReferenceCount_Args inc;
    memset(&inc, 0, sizeof(inc));
    inc.struct_size = PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE;
    inc.buffer = buffer;
    if (api->PJRT_Buffer_IncreaseExternalReferenceCount(&inc) != NULL) return -1.0;
    PJRT_Buffer_UnsafePointer_Args at;
    memset(&at, 0, sizeof(at));
    at.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE;
    at.buffer = buffer;
    int failed = api->PJRT_Buffer_UnsafePointer(&at) != NULL;
    if (!failed) memcpy(dst, (const void*)at.buffer_pointer, size);
    PJRT_Buffer_DecreaseExternalReferenceCount_Args dec;
    memset(&dec, 0, sizeof(dec));
    dec.struct_size = PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE;
    dec.buffer = buffer;
    failed |= api->PJRT_Buffer_DecreaseExternalReferenceCount(&dec) != NULL;
    if (failed) return -1.0;
  }
  return (now_ns() - start) / (double)iterations;
}
