/* What the C baselines (benchmarks/c_dispatch.c, benchmarks/c_transfer.c)
 * share: a clock and the two PJRT destroy calls they make outside their
 * timed work's hot loop. */
#ifndef PJRT_PY_BENCH_C_COMMON_H
#define PJRT_PY_BENCH_C_COMMON_H

#include <string.h>
#include <time.h>

#include "pjrt_c_api.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void event_destroy(const PJRT_Api* api, PJRT_Event* event) {
  if (event == NULL) return;
  PJRT_Event_Destroy_Args d;
  memset(&d, 0, sizeof(d));
  d.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  d.event = event;
  api->PJRT_Event_Destroy(&d);
}

static void buffer_destroy(const PJRT_Api* api, PJRT_Buffer* buffer) {
  PJRT_Buffer_Destroy_Args d;
  memset(&d, 0, sizeof(d));
  d.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
  d.buffer = buffer;
  api->PJRT_Buffer_Destroy(&d);
}

#endif
