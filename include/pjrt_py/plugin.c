/* Plugin loading and error access. */
#include <dlfcn.h>
#include <stdio.h>

void pjrt_py_error_destroy(const PJRT_Api* api, PJRT_Error* error) {
  if (error == NULL) return;
  PJRT_Error_Destroy_Args args = {0};
  args.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
  args.error = error;
  api->PJRT_Error_Destroy(&args);
}

const PJRT_Api* pjrt_py_load_plugin(const char* path, char* err, size_t err_size) {
  /* RTLD_LOCAL: plugins bundle their own copies of LLVM, protobuf, ...; they
   * must not resolve against each other or against jaxlib. */
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    snprintf(err, err_size, "%s", dlerror());
    return NULL;
  }
  typedef const PJRT_Api* (*get_api_fn)(void);
  get_api_fn get_api = (get_api_fn)dlsym(handle, "GetPjrtApi");
  if (get_api == NULL) {
    snprintf(err, err_size, "%s has no GetPjrtApi symbol: not a PJRT plugin", path);
    return NULL;
  }
  const PJRT_Api* api = get_api();
  if (api == NULL) {
    snprintf(err, err_size, "GetPjrtApi in %s returned NULL", path);
  }
  return api;
}

int pjrt_py_error_code(const PJRT_Api* api, PJRT_Error* error) {
  PJRT_Error_GetCode_Args args = {0};
  args.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE;
  args.error = error;
  PJRT_Error* inner = api->PJRT_Error_GetCode(&args);
  if (inner != NULL) {
    pjrt_py_error_destroy(api, inner);
    return PJRT_Error_Code_UNKNOWN;
  }
  return (int)args.code;
}

const char* pjrt_py_error_message(const PJRT_Api* api, PJRT_Error* error, size_t* size) {
  PJRT_Error_Message_Args args = {0};
  args.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
  args.error = error;
  api->PJRT_Error_Message(&args);
  *size = args.message_size;
  return args.message;
}
