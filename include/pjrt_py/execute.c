/* Execution: one C call per dispatch, the PJRT structs on the C stack. */

#define PJRT_PY_MAX_DEVICES 64 /* per call without a heap allocation */

PJRT_Error* pjrt_py_execute_n(pjrt_py_client* c, PJRT_LoadedExecutable* exe, size_t num_devices,
                              PJRT_Buffer** args, size_t num_args, PJRT_Buffer** outputs,
                              size_t num_outputs, PJRT_Event** complete_events,
                              const int64_t* non_donatable, size_t num_non_donatable) {
  PJRT_ExecuteOptions options = {0};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  options.non_donatable_input_indices = non_donatable;
  options.num_non_donatable_input_indices = num_non_donatable;

  PJRT_Buffer* const* stack_args[PJRT_PY_MAX_DEVICES];
  PJRT_Buffer** stack_outs[PJRT_PY_MAX_DEVICES];
  PJRT_Event* stack_events[PJRT_PY_MAX_DEVICES];
  PJRT_Buffer* const** argument_lists = stack_args;
  PJRT_Buffer*** output_lists = stack_outs;
  PJRT_Event** events = stack_events;
  if (num_devices > PJRT_PY_MAX_DEVICES) {
    argument_lists = (PJRT_Buffer* const**)malloc(num_devices * sizeof(*argument_lists));
    output_lists = (PJRT_Buffer***)malloc(num_devices * sizeof(*output_lists));
    events = (PJRT_Event**)malloc(num_devices * sizeof(*events));
    if (argument_lists == NULL || output_lists == NULL || events == NULL) abort();
  }
  for (size_t d = 0; d < num_devices; ++d) {
    argument_lists[d] = args + d * num_args;
    output_lists[d] = outputs + d * num_outputs;
    events[d] = NULL;
  }

  PJRT_LoadedExecutable_Execute_Args exec_args = {0};
  exec_args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  exec_args.executable = exe;
  exec_args.options = &options;
  exec_args.argument_lists = argument_lists;
  exec_args.num_devices = num_devices;
  exec_args.num_args = num_args;
  exec_args.output_lists = output_lists;
  /* Always asked for: effects_barrier() waits on them (completion.c). */
  exec_args.device_complete_events = events;
  PJRT_Error* error = c->api->PJRT_LoadedExecutable_Execute(&exec_args);
  if (error == NULL) {
    pjrt_py_client_add(c, (long)(num_devices * num_outputs)); /* one per output buffer */
    for (size_t d = 0; d < num_devices; ++d) {
      if (events[d] == NULL) continue;
      pjrt_py_track(c, events[d]);
      if (complete_events != NULL) {
        complete_events[d] = events[d];
      } else {
        pjrt_py_event_destroy(c->api, events[d]);
      }
    }
  }
  if (events != stack_events) {
    free((void*)argument_lists);
    free(output_lists);
    free(events);
  }
  return error;
}

/* Errors of pjrt_py_execute1, which returns its output instead. */
static __thread PJRT_Error* pjrt_py_last_error = NULL;

/* The hot path. It asks for no completion event (one costs about 0.2 us, a
 * tenth of a dispatch): Python remembers the output for effects_barrier(). */
PJRT_Buffer* pjrt_py_execute1(pjrt_py_client* c, PJRT_LoadedExecutable* exe, PJRT_Buffer** args,
                              size_t num_args) {
  PJRT_ExecuteOptions options = {0};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  PJRT_Buffer* const* argument_lists[1] = {args};
  PJRT_Buffer* output = NULL;
  PJRT_Buffer** output_lists[1] = {&output};
  PJRT_LoadedExecutable_Execute_Args exec_args = {0};
  exec_args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  exec_args.executable = exe;
  exec_args.options = &options;
  exec_args.argument_lists = argument_lists;
  exec_args.num_devices = 1;
  exec_args.num_args = num_args;
  exec_args.output_lists = output_lists;
  PJRT_Event* event = NULL;
  exec_args.device_complete_events = &event;
  PJRT_Error* error = c->api->PJRT_LoadedExecutable_Execute(&exec_args);
  if (error == NULL) {
    pjrt_py_client_add(c, 1);
    if (event != NULL) {
      pjrt_py_track(c, event);
      pjrt_py_event_destroy(c->api, event);
    }
  }
  if (error != NULL) {
    pjrt_py_error_destroy(c->api, pjrt_py_last_error);
    pjrt_py_last_error = error;
    return NULL;
  }
  return output;
}

PJRT_Error* pjrt_py_take_error(void) {
  PJRT_Error* error = pjrt_py_last_error;
  pjrt_py_last_error = NULL;
  return error;
}

int pjrt_py_buffer_is_deleted(const PJRT_Api* api, PJRT_Buffer* buffer) {
  PJRT_Buffer_IsDeleted_Args args = {0};
  args.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE;
  args.buffer = buffer;
  PJRT_Error* error = api->PJRT_Buffer_IsDeleted(&args);
  if (error != NULL) {
    pjrt_py_error_destroy(api, error);
    return 0;
  }
  return args.is_deleted ? 1 : 0;
}
