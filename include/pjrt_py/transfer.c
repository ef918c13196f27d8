/* Host transfers, and buffer and executable teardown. */

#define PJRT_PY_MAX_RANK 64

PJRT_Error* pjrt_py_buffer_from_host(pjrt_py_client* c, const void* data, int type, const int64_t* dims,
                                     size_t num_dims, int semantics, PJRT_Device* device,
                                     PJRT_Buffer** buffer, PJRT_Event** done_with_host) {
  PJRT_Client_BufferFromHostBuffer_Args args = {0};
  args.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
  args.client = c->client;
  args.data = data;
  args.type = (PJRT_Buffer_Type)type;
  args.dims = dims;
  args.num_dims = num_dims;
  args.host_buffer_semantics = (PJRT_HostBufferSemantics)semantics;
  args.device = device;
  PJRT_Error* error = c->api->PJRT_Client_BufferFromHostBuffer(&args);
  if (error == NULL) {
    pjrt_py_client_add(c, 1);
    *buffer = args.buffer;
    *done_with_host = args.done_with_host_buffer;
  }
  return error;
}

PJRT_Error* pjrt_py_buffer_to_host(const PJRT_Api* api, PJRT_Buffer* buffer, void* dst,
                                   size_t dst_size, size_t num_dims, PJRT_Event** done) {
  /* Ask for a dense row-major layout explicitly: the device layout may differ
   * (a plugin may tile, or pick another dimension order). */
  int64_t minor_to_major[PJRT_PY_MAX_RANK];
  if (num_dims > PJRT_PY_MAX_RANK) num_dims = PJRT_PY_MAX_RANK; /* Python rejects this case */
  for (size_t i = 0; i < num_dims; ++i) minor_to_major[i] = (int64_t)(num_dims - 1 - i);
  PJRT_Buffer_MemoryLayout layout = {0};
  layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
  layout.type = PJRT_Buffer_MemoryLayout_Type_Tiled;
  layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
  layout.tiled.minor_to_major = minor_to_major;
  layout.tiled.minor_to_major_size = num_dims;

  PJRT_Buffer_ToHostBuffer_Args args = {0};
  args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  args.src = buffer;
  args.host_layout = &layout;
  args.dst = dst;
  args.dst_size = dst_size;
  PJRT_Error* error = api->PJRT_Buffer_ToHostBuffer(&args);
  if (error == NULL) *done = args.event;
  return error;
}

PJRT_Error* pjrt_py_buffer_meta(const PJRT_Api* api, PJRT_Buffer* buffer, int64_t* dims,
                                size_t max_dims, size_t* num_dims, int* type) {
  PJRT_Buffer_Dimensions_Args d = {0};
  d.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE;
  d.buffer = buffer;
  PJRT_Error* error = api->PJRT_Buffer_Dimensions(&d);
  if (error != NULL) return error;
  PJRT_Buffer_ElementType_Args t = {0};
  t.struct_size = PJRT_Buffer_ElementType_Args_STRUCT_SIZE;
  t.buffer = buffer;
  error = api->PJRT_Buffer_ElementType(&t);
  if (error != NULL) return error;
  *num_dims = d.num_dims;
  for (size_t i = 0; i < d.num_dims && i < max_dims; ++i) dims[i] = d.dims[i];
  *type = (int)t.type;
  return NULL;
}

PJRT_Error* pjrt_py_buffer_ready_event(const PJRT_Api* api, PJRT_Buffer* buffer,
                                       PJRT_Event** event) {
  PJRT_Buffer_ReadyEvent_Args args = {0};
  args.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  args.buffer = buffer;
  PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&args);
  if (error == NULL) *event = args.event;
  return error;
}

void pjrt_py_buffer_destroy(pjrt_py_client* c, PJRT_Buffer* buffer) {
  PJRT_Buffer_Destroy_Args args = {0};
  args.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
  args.buffer = buffer;
  pjrt_py_error_destroy(c->api, c->api->PJRT_Buffer_Destroy(&args));
  pjrt_py_client_unref(c);
}

void pjrt_py_loaded_executable_destroy(pjrt_py_client* c, PJRT_LoadedExecutable* exe,
                                       PJRT_Executable* unloaded) {
  const PJRT_Api* api = c->api;
  if (unloaded != NULL) {
    PJRT_Executable_Destroy_Args args = {0};
    args.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
    args.executable = unloaded;
    pjrt_py_error_destroy(api, api->PJRT_Executable_Destroy(&args));
  }
  PJRT_LoadedExecutable_Destroy_Args args = {0};
  args.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
  args.executable = exe;
  pjrt_py_error_destroy(api, api->PJRT_LoadedExecutable_Destroy(&args));
  pjrt_py_client_unref(c);
}
