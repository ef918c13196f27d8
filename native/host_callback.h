/* Python host callbacks: the XLA FFI call frame as the handlers read it
 * (host_callback.c, host_callback_attrs.c).
 *
 * Struct layouts are XLA FFI API 0.x's (see ffi.c): the call frame's prefix
 * and XLA_FFI_Api's prefix up to XLA_FFI_Error_Create have not changed since
 * the API was versioned. */
#ifndef PJRT_PY_HOST_CALLBACK_H
#define PJRT_PY_HOST_CALLBACK_H

enum {
  HC_SLOTS = 256,
  HC_MAX_TYPE = 64,
  /* XLA_FFI_DataType (xla::PrimitiveType numbers) */
  HC_PRED = 1,
  HC_S8 = 2,
  HC_S16 = 3,
  HC_S32 = 4,
  HC_S64 = 5,
  HC_U8 = 6,
  HC_U16 = 7,
  HC_U32 = 8,
  HC_U64 = 9,
  HC_F32 = 11,
  HC_F64 = 12,
  HC_TOKEN = 17,
  /* XLA_FFI_AttrType */
  HC_ATTR_ARRAY = 1,
  HC_ATTR_DICTIONARY = 2,
  HC_ATTR_SCALAR = 3,
  HC_ATTR_STRING = 4,
  /* XLA_FFI_Error_Code */
  HC_CANCELLED = 1,
  HC_UNKNOWN = 2,
  HC_INVALID_ARGUMENT = 3,
  HC_NOT_FOUND = 5,
  HC_FAILED_PRECONDITION = 9,
  HC_UNAVAILABLE = 14,
};

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  const char* message;
  int errc;
} hc_error_args;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  ffi_api_version api_version;
  void* internal_api;
  void* (*error_create)(hc_error_args*);
} hc_api;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  int64_t size;
  int* types; /* XLA_FFI_ArgType / RetType: 1 = buffer */
  void** items;
} hc_list;

typedef struct {
  const char* ptr;
  size_t len;
} hc_span;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  int64_t size;
  int* types;
  hc_span** names;
  void** attrs;
} hc_attrs;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  const hc_api* api;
  void* ctx;
  int stage;
  hc_list args;
  hc_list rets;
  hc_attrs attrs;
} hc_frame;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  int dtype;
  void* data;
  int64_t rank;
  int64_t* dims;
} hc_buffer;

typedef struct {
  int dtype;
  void* value;
} hc_scalar;

typedef struct {
  int dtype;
  size_t size;
  void* data;
} hc_array;

/* XLA element type -> numpy dtype (host_callback.c); NULL: numpy has none. */
static PyObject* hc_descr(int dtype);

#endif
