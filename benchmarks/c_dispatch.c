/* The baseline for benchmarks/dispatch.py: a raw C loop of
 * PJRT_LoadedExecutable_Execute + PJRT_Buffer_Destroy of the outputs, on the
 * executable and argument buffers pjrt_py already made (same plugin, same
 * client, same header). Built at run time by dispatch.py. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pjrt_c_api.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Runs `iterations` dispatches and returns the mean ns per call (or -1 on a
 * PJRT error). */
double c_dispatch_loop(const PJRT_Api* api, PJRT_LoadedExecutable* exe, PJRT_Buffer** args,
                       size_t num_args, size_t num_outputs, long iterations) {
  PJRT_Buffer** outputs = (PJRT_Buffer**)calloc(num_outputs ? num_outputs : 1, sizeof(void*));
  PJRT_ExecuteOptions options;
  memset(&options, 0, sizeof(options));
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  PJRT_Buffer* const* argument_lists[1] = {args};
  PJRT_Buffer** output_lists[1] = {outputs};
  double start = now_ns();
  for (long i = 0; i < iterations; ++i) {
    PJRT_LoadedExecutable_Execute_Args a;
    memset(&a, 0, sizeof(a));
    a.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
    a.executable = exe;
    a.options = &options;
    a.argument_lists = argument_lists;
    a.num_devices = 1;
    a.num_args = num_args;
    a.output_lists = output_lists;
    if (api->PJRT_LoadedExecutable_Execute(&a) != NULL) {
      free(outputs);
      return -1.0;
    }
    for (size_t o = 0; o < num_outputs; ++o) {
      PJRT_Buffer_Destroy_Args d;
      memset(&d, 0, sizeof(d));
      d.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
      d.buffer = outputs[o];
      api->PJRT_Buffer_Destroy(&d);
    }
  }
  double elapsed = now_ns() - start;
  free(outputs);
  return elapsed / (double)iterations;
}
