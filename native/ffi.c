/* XLA FFI custom-call targets: registering a C handler with a plugin.
 *
 * A plugin takes handlers through its PJRT FFI extension (type
 * PJRT_Extension_Type_FFI in the PJRT_Api extension chain). The structs are
 * declared here, as the CPU builds pjrt_py runs on read them (measured on PJRT
 * 0.81, 0.106 and 0.115): the registration arguments have no api_version
 * field. Older XLA headers put an `int api_version` before `handler`; given
 * that layout, all three builds read a pointer as a string length and abort.
 *
 * The probe handler answers XLA's metadata query (which it makes at compile
 * time) and does nothing when run: pjrt_py compiles a call to it once per
 * plugin to learn whether the plugin's compiler sees registered targets
 * (xla-cpu-pjrt 0.81 registers, then compiles "NotFound"). */
#include "common.h"

typedef struct {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler; /* an XLA_FFI_Handler*: typed FFI, custom_call api_version = 4 */
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
} ffi_register_args;

typedef struct {
  PJRT_Extension_Base base;
  void* type_id_register;
  void* user_data_add;
  PJRT_Error* (*register_handler)(ffi_register_args*);
} ffi_extension;

/* The prefix of XLA FFI's call frame and its metadata extension (XLA FFI API 0.x). */
typedef struct ffi_ext_base {
  size_t struct_size;
  int type; /* 1: metadata */
  struct ffi_ext_base* next;
} ffi_ext_base;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  int major_version;
  int minor_version;
} ffi_api_version;

typedef struct {
  size_t struct_size;
  ffi_api_version api_version;
  uint32_t traits;
} ffi_metadata;

typedef struct {
  ffi_ext_base base;
  ffi_metadata* metadata;
} ffi_metadata_extension;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
} ffi_call_frame_head;

/* 1 if the call is XLA's metadata query (made at compile time), answered
 * with the FFI API version pjrt_py's handlers speak: 0.1, the one every CPU
 * build runs (0.81 refuses a handler newer than its own API). */
static int ffi_answer_metadata(ffi_ext_base* ext) {
  if (ext == NULL || ext->type != 1) return 0;
  ffi_metadata* m = ((ffi_metadata_extension*)ext)->metadata;
  m->api_version.major_version = 0;
  m->api_version.minor_version = 1;
  m->traits = 0;
  return 1;
}

static void* ffi_probe_handler(ffi_call_frame_head* frame) {
  ffi_answer_metadata(frame->extension_start);
  return NULL; /* no error; nothing to compute */
}

static const ffi_extension* ffi_find(const PJRT_Api* api) {
  for (PJRT_Extension_Base* e = api->extension_start; e != NULL; e = e->next) {
    if (e->type == PJRT_Extension_Type_FFI) return (const ffi_extension*)e;
  }
  return NULL;
}

/* ffi_register(api, name, handler, platform) -> 0 registered, 1 no FFI
 * extension, 2 an extension without handler registration. Raises the
 * plugin's error as a PjrtError. handler 0: pjrt_py's probe handler. */
static PyObject* core_ffi_register(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *api_address, *handler_address;
  const char *name, *platform;
  Py_ssize_t name_size, platform_size;
  if (!PyArg_ParseTuple(args, "Os#Os#:ffi_register", &api_address, &name, &name_size,
                        &handler_address, &platform, &platform_size))
    return NULL;
  const PJRT_Api* api = address_of_api(api_address);
  if (api == NULL) return NULL;
  void* handler = PyLong_AsVoidPtr(handler_address);
  if (PyErr_Occurred()) return NULL;
  if (handler == NULL) handler = (void*)ffi_probe_handler;
  const ffi_extension* ext = ffi_find(api);
  if (ext == NULL) return PyLong_FromLong(1);
  if (ext->base.struct_size < sizeof(ffi_extension) || ext->register_handler == NULL)
    return PyLong_FromLong(2);
  ffi_register_args r = {0};
  r.struct_size = sizeof(r);
  r.target_name = name;
  r.target_name_size = (size_t)name_size;
  r.handler = handler;
  r.platform_name = platform;
  r.platform_name_size = (size_t)platform_size;
  PJRT_Error* error = ext->register_handler(&r);
  if (error != NULL) return raise_pjrt(api, error);
  return PyLong_FromLong(0);
}
