/* The baselines for benchmarks/dispatch.py and benchmarks/sharded.py: raw C
 * loops of PJRT_LoadedExecutable_Execute + PJRT_Buffer_Destroy of the
 * outputs, on the executable and argument buffers pjrt_py already made (same
 * plugin, same client, same header), with and without asking PJRT for the
 * completion event that pjrt_py asks for on every execution; over several
 * devices at once; and a chain of executions, each on the last one's output.
 * Built at run time by the benchmarks (and tools/callgrind_per_call.py). */
#include <stdlib.h>

#include "c_common.h"

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

/* ---- several devices, and chains (benchmarks/sharded.py) ------------------------- */

static void await_event(const PJRT_Api* api, PJRT_Event* event) {
  if (event == NULL) return;
  PJRT_Event_Await_Args w;
  memset(&w, 0, sizeof(w));
  w.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
  w.event = event;
  PJRT_Error* error = api->PJRT_Event_Await(&w);
  if (error != NULL) {
    PJRT_Error_Destroy_Args d;
    memset(&d, 0, sizeof(d));
    d.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
    d.error = error;
    api->PJRT_Error_Destroy(&d);
  }
}

/* One Execute over `num_devices` argument lists (`args`: num_devices x
 * num_args, device-major), asking for every device's completion event;
 * destroys the events at once (with `wait`, once they fire: the last call
 * of a timed loop, so that no work spills into the next measurement). The
 * outputs go to `outputs` (num_devices x num_outputs). 0, or -1 on a PJRT
 * error. */
static int execute_rows(const PJRT_Api* api, PJRT_LoadedExecutable* exe, PJRT_Buffer** args,
                        size_t num_devices, size_t num_args, PJRT_Buffer** outputs,
                        size_t num_outputs, PJRT_Buffer* const** arg_lists,
                        PJRT_Buffer*** output_lists, PJRT_Event** events,
                        const PJRT_ExecuteOptions* options, int wait) {
  for (size_t d = 0; d < num_devices; ++d) {
    arg_lists[d] = args + d * num_args;
    output_lists[d] = outputs + d * num_outputs;
    events[d] = NULL;
  }
  PJRT_LoadedExecutable_Execute_Args a;
  memset(&a, 0, sizeof(a));
  a.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  a.executable = exe;
  a.options = (PJRT_ExecuteOptions*)options;
  a.argument_lists = arg_lists;
  a.num_devices = num_devices;
  a.num_args = num_args;
  a.output_lists = output_lists;
  a.device_complete_events = events;
  if (api->PJRT_LoadedExecutable_Execute(&a) != NULL) return -1;
  for (size_t d = 0; d < num_devices; ++d) {
    if (wait) await_event(api, events[d]);
    event_destroy(api, events[d]);
  }
  return 0;
}

/* The floor of execute_sharded_async with the promises dropped: a raw loop
 * of one multi-device Execute with completion events (destroyed at once),
 * then every output destroyed; the last call's events are waited for. Mean
 * ns per call, or -1 on a PJRT error. */
double c_sharded_loop_event(const PJRT_Api* api, PJRT_LoadedExecutable* exe, PJRT_Buffer** args,
                            size_t num_devices, size_t num_args, size_t num_outputs,
                            long iterations) {
  size_t outs = num_devices * (num_outputs ? num_outputs : 1);
  PJRT_Buffer** outputs = (PJRT_Buffer**)calloc(outs, sizeof(void*));
  PJRT_Buffer* const** arg_lists = (PJRT_Buffer* const**)calloc(num_devices, sizeof(void*));
  PJRT_Buffer*** output_lists = (PJRT_Buffer***)calloc(num_devices, sizeof(void*));
  PJRT_Event** events = (PJRT_Event**)calloc(num_devices, sizeof(void*));
  PJRT_ExecuteOptions options;
  memset(&options, 0, sizeof(options));
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  double result = -1.0;
  double start = now_ns();
  for (long i = 0; i < iterations; ++i) {
    if (execute_rows(api, exe, args, num_devices, num_args, outputs, num_outputs, arg_lists,
                     output_lists, events, &options, i == iterations - 1) < 0)
      goto done;
    for (size_t o = 0; o < num_devices * num_outputs; ++o) buffer_destroy(api, outputs[o]);
  }
  result = (now_ns() - start) / (double)iterations;
done:
  free(outputs);
  free((void*)arg_lists);
  free(output_lists);
  free(events);
  return result;
}

/* The floor of a chain of `stages` one-device executions of a two-argument,
 * one-output program, each stage's output the next one's first argument
 * (`x`, then the output; `y` every time), each asking for its completion
 * event: pjrt_py's exe.execute_async(exe.execute_async(x, y), y) ... with
 * the result dropped. A stage's input is destroyed once the next stage is
 * dispatched, as pjrt_py drops an intermediate promise. */
double c_chain_loop_event(const PJRT_Api* api, PJRT_LoadedExecutable* exe, PJRT_Buffer* x,
                          PJRT_Buffer* y, long stages, long iterations) {
  PJRT_ExecuteOptions options;
  memset(&options, 0, sizeof(options));
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  PJRT_Buffer* const* arg_lists[1];
  PJRT_Buffer** output_lists[1];
  PJRT_Event* events[1];
  double start = now_ns();
  for (long i = 0; i < iterations; ++i) {
    PJRT_Buffer* held = NULL; /* the previous stage's output */
    for (long s = 0; s < stages; ++s) {
      PJRT_Buffer* args[2] = {held ? held : x, y};
      PJRT_Buffer* out = NULL;
      if (execute_rows(api, exe, args, 1, 2, &out, 1, arg_lists, output_lists, events, &options,
                       i == iterations - 1 && s == stages - 1) < 0)
        return -1.0;
      if (held != NULL) buffer_destroy(api, held);
      held = out;
    }
    if (held != NULL) buffer_destroy(api, held);
  }
  return (now_ns() - start) / (double)iterations;
}
