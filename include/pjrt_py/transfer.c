/* Host transfers, and buffer and executable teardown. */
#include <stddef.h>
#include <string.h>

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

#define PJRT_PY_HAS(api, fn) \
  ((api)->struct_size >= offsetof(PJRT_Api, fn) + sizeof((api)->fn) && (api)->fn != NULL)

/* Whether the buffer is ready, without error. */
static int pjrt_py_buffer_ready_ok(const PJRT_Api* api, PJRT_Buffer* buffer) {
  PJRT_Event* event = NULL;
  PJRT_Error* error = pjrt_py_buffer_ready_event(api, buffer, &event);
  if (error != NULL) {
    pjrt_py_error_destroy(api, error);
    return 0;
  }
  int ok = pjrt_py_event_is_ready(api, event);
  if (ok) {
    error = pjrt_py_event_error(api, event);
    if (error != NULL) {
      pjrt_py_error_destroy(api, error);
      ok = 0;
    }
  }
  pjrt_py_event_destroy(api, event);
  return ok;
}

/* Whether the buffer's memory is dense row-major, `size` bytes long. */
static int pjrt_py_buffer_dense(const PJRT_Api* api, PJRT_Buffer* buffer, size_t size,
                                size_t num_dims) {
  PJRT_Buffer_GetMemoryLayout_Args l = {0};
  l.struct_size = PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE;
  l.buffer = buffer;
  PJRT_Error* error = api->PJRT_Buffer_GetMemoryLayout(&l);
  if (error != NULL) {
    pjrt_py_error_destroy(api, error);
    return 0;
  }
  if (l.layout.type != PJRT_Buffer_MemoryLayout_Type_Tiled || l.layout.tiled.num_tiles != 0 ||
      l.layout.tiled.minor_to_major_size != num_dims)
    return 0;
  for (size_t i = 0; i < num_dims; ++i)
    if (l.layout.tiled.minor_to_major[i] != (int64_t)(num_dims - 1 - i)) return 0;
  PJRT_Buffer_OnDeviceSizeInBytes_Args z = {0};
  z.struct_size = PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE;
  z.buffer = buffer;
  error = api->PJRT_Buffer_OnDeviceSizeInBytes(&z);
  if (error != NULL) {
    pjrt_py_error_destroy(api, error);
    return 0;
  }
  return z.on_device_size_in_bytes == size;
}

int pjrt_py_buffer_read_ready(const PJRT_Api* api, PJRT_Buffer* buffer, void* dst, size_t size,
                              size_t num_dims) {
  if (!PJRT_PY_HAS(api, PJRT_Buffer_GetMemoryLayout) ||
      !PJRT_PY_HAS(api, PJRT_Buffer_IncreaseExternalReferenceCount) ||
      !PJRT_PY_HAS(api, PJRT_Buffer_DecreaseExternalReferenceCount) ||
      !PJRT_PY_HAS(api, PJRT_Buffer_IsOnCpu) || !PJRT_PY_HAS(api, PJRT_Buffer_UnsafePointer))
    return 0;
  PJRT_Buffer_IsOnCpu_Args cpu = {0};
  cpu.struct_size = PJRT_Buffer_IsOnCpu_Args_STRUCT_SIZE;
  cpu.buffer = buffer;
  PJRT_Error* error = api->PJRT_Buffer_IsOnCpu(&cpu);
  if (error != NULL) {
    pjrt_py_error_destroy(api, error);
    return 0;
  }
  if (!cpu.is_on_cpu || !pjrt_py_buffer_ready_ok(api, buffer) ||
      !pjrt_py_buffer_dense(api, buffer, size, num_dims))
    return 0;
  /* An external reference pins the memory and makes the plugin refuse to
   * donate the buffer while it is read. */
  PJRT_Buffer_IncreaseExternalReferenceCount_Args inc = {0};
  inc.struct_size = PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE;
  inc.buffer = buffer;
  error = api->PJRT_Buffer_IncreaseExternalReferenceCount(&inc);
  if (error != NULL) {
    pjrt_py_error_destroy(api, error);
    return 0;
  }
  PJRT_Buffer_UnsafePointer_Args at = {0};
  at.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE;
  at.buffer = buffer;
  error = api->PJRT_Buffer_UnsafePointer(&at);
  int copied = 0;
  if (error == NULL) {
    if (size) memcpy(dst, (const void*)at.buffer_pointer, size);
    copied = 1;
  } else {
    pjrt_py_error_destroy(api, error);
  }
  PJRT_Buffer_DecreaseExternalReferenceCount_Args dec = {0};
  dec.struct_size = PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE;
  dec.buffer = buffer;
  pjrt_py_error_destroy(api, api->PJRT_Buffer_DecreaseExternalReferenceCount(&dec));
  return copied;
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
