/* The baselines for benchmarks/bandwidth.py: host-to-device and
 * device-to-host transfers in plain C on the same plugin, client and header
 * that pjrt_py uses, so the plugin's own copy cost can be told apart from
 * pjrt_py's. Built at run time. Each function returns mean ns per transfer,
 * or -1 on a PJRT error. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "pjrt_c_api.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int await_and_destroy(const PJRT_Api* api, PJRT_Event* event) {
  if (event == NULL) return 0;
  PJRT_Event_Await_Args w;
  memset(&w, 0, sizeof(w));
  w.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
  w.event = event;
  int failed = api->PJRT_Event_Await(&w) != NULL;
  PJRT_Event_Destroy_Args d;
  memset(&d, 0, sizeof(d));
  d.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  d.event = event;
  api->PJRT_Event_Destroy(&d);
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
    PJRT_Buffer_Destroy_Args d;
    memset(&d, 0, sizeof(d));
    d.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
    d.buffer = a.buffer;
    api->PJRT_Buffer_Destroy(&d);
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
