/* The execute hot path: one C call per dispatch, structs on the C stack. */

PJRT_Error* pjrt_py_execute(pjrt_py_client* c, PJRT_LoadedExecutable* exe,
                            PJRT_Buffer** args, size_t num_args, PJRT_Buffer** outputs,
                            size_t num_outputs, PJRT_Event** complete_event) {
  PJRT_ExecuteOptions options = {0};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;

  PJRT_Buffer* const* argument_lists[1] = {args};
  PJRT_Buffer** output_lists[1] = {outputs};

  PJRT_LoadedExecutable_Execute_Args exec_args = {0};
  exec_args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  exec_args.executable = exe;
  exec_args.options = &options;
  exec_args.argument_lists = argument_lists;
  exec_args.num_devices = 1;
  exec_args.num_args = num_args;
  exec_args.output_lists = output_lists;
  exec_args.device_complete_events = complete_event;
  PJRT_Error* error = c->api->PJRT_LoadedExecutable_Execute(&exec_args);
  if (error == NULL) pjrt_py_client_add(c, (long)num_outputs); /* one per output buffer */
  return error;
}

/* Errors of pjrt_py_execute1, which returns its output instead. */
static __thread PJRT_Error* pjrt_py_last_error = NULL;

PJRT_Buffer* pjrt_py_execute1(pjrt_py_client* c, PJRT_LoadedExecutable* exe, PJRT_Buffer** args,
                              size_t num_args) {
  PJRT_Buffer* output = NULL;
  PJRT_Error* error = pjrt_py_execute(c, exe, args, num_args, &output, 1, NULL);
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
