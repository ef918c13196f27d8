/* The baselines for benchmarks/dispatch.py: a raw C loop of
 * PJRT_LoadedExecutable_Execute + PJRT_Buffer_Destroy of the outputs, on the
 * executable and argument buffers pjrt_py already made (same plugin, same
 * client, same header), with and without asking PJRT for the completion
 * event that pjrt_py asks for on every execution. Built at run time by
 * dispatch.py. */
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
 * PJRT error). With `completion_event` (a constant at each call site, so
 * each entry point below is compiled without the other's work), every
 * execution also asks for its device_complete_events and destroys the event. */
static inline __attribute__((always_inline)) double dispatch_loop(
    const PJRT_Api* api, PJRT_LoadedExecutable* exe, PJRT_Buffer** args, size_t num_args,
    size_t num_outputs, long iterations, int completion_event) {
  PJRT_Buffer** outputs = (PJRT_Buffer**)calloc(num_outputs ? num_outputs : 1, sizeof(void*));
  PJRT_ExecuteOptions options;
  memset(&options, 0, sizeof(options));
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  PJRT_Buffer* const* argument_lists[1] = {args};
  PJRT_Buffer** output_lists[1] = {outputs};
  PJRT_Event* events[1] = {NULL};
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
    if (completion_event) a.device_complete_events = events;
    if (api->PJRT_LoadedExecutable_Execute(&a) != NULL) {
      free(outputs);
      return -1.0;
    }
    if (completion_event && events[0] != NULL) {
      PJRT_Event_Destroy_Args e;
      memset(&e, 0, sizeof(e));
      e.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
      e.event = events[0];
      api->PJRT_Event_Destroy(&e);
      events[0] = NULL;
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

/* Execute + destroy the outputs: the floor. */
double c_dispatch_loop(const PJRT_Api* api, PJRT_LoadedExecutable* exe, PJRT_Buffer** args,
                       size_t num_args, size_t num_outputs, long iterations) {
  return dispatch_loop(api, exe, args, num_args, num_outputs, iterations, 0);
}

/* The same, also asking for the completion event and destroying it. */
double c_dispatch_loop_event(const PJRT_Api* api, PJRT_LoadedExecutable* exe, PJRT_Buffer** args,
                             size_t num_args, size_t num_outputs, long iterations) {
  return dispatch_loop(api, exe, args, num_args, num_outputs, iterations, 1);
}
