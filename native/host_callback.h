/* Python host callbacks: what host_callback.c, host_callback_attrs.c,
 * host_callback_values.c and host_callback_gpu.c share, the XLA FFI call frame
 * as the handlers read it and the trampoline pools.
 *
 * Struct layouts are XLA FFI API 0.x's (see ffi.c): the call frame's prefix
 * and XLA_FFI_Api's prefix up to XLA_FFI_Stream_Get have not changed since
 * the API was versioned (0.1's header declares the same first five
 * functions in the same order; the CPU builds' XLA_FFI_Stream_Get answers in
 * that slot, tests/test_host_callbacks_gpu.py). */
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
  HC_RESOURCE_EXHAUSTED = 8,
  HC_FAILED_PRECONDITION = 9,
  HC_UNIMPLEMENTED = 12,
  HC_INTERNAL = 13,
  HC_UNAVAILABLE = 14,
  /* XLA_FFI_ExecutionStage */
  HC_EXECUTE = 3,
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
  void* error;
  const char* message; /* out */
} hc_error_message_args;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  void* error;
} hc_error_destroy_args;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  void* ctx;
  void* stream; /* out: a CUstream on CUDA */
} hc_stream_args;

/* XLA_FFI_Api's prefix. XLA FFI API 0.1's table already ends at stream_get
 * (its struct_size covers it), and later versions only append. */
typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  ffi_api_version api_version;
  void* internal_api;
  void* (*error_create)(hc_error_args*);
  void (*error_get_message)(hc_error_message_args*);
  void (*error_destroy)(hc_error_destroy_args*);
  void* handler_register;
  void* (*stream_get)(hc_stream_args*);
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

/* A pool of trampolines: HC_POOL(p, fn) defines p##XY(frame), which calls
 * fn(0xXY, frame); HC_NAMES(p) lists them in slot order. */
#define HC_T(p, fn, x) \
  static void* p##x(hc_frame* f) { return fn(0x##x, f); }
#define HC_T16(p, fn, h)                                                                   \
  HC_T(p, fn, h##0) HC_T(p, fn, h##1) HC_T(p, fn, h##2) HC_T(p, fn, h##3) HC_T(p, fn, h##4) \
  HC_T(p, fn, h##5) HC_T(p, fn, h##6) HC_T(p, fn, h##7) HC_T(p, fn, h##8) HC_T(p, fn, h##9) \
  HC_T(p, fn, h##a) HC_T(p, fn, h##b) HC_T(p, fn, h##c) HC_T(p, fn, h##d) HC_T(p, fn, h##e) \
  HC_T(p, fn, h##f)
#define HC_POOL(p, fn)                                                                    \
  HC_T16(p, fn, 0) HC_T16(p, fn, 1) HC_T16(p, fn, 2) HC_T16(p, fn, 3) HC_T16(p, fn, 4)    \
  HC_T16(p, fn, 5) HC_T16(p, fn, 6) HC_T16(p, fn, 7) HC_T16(p, fn, 8) HC_T16(p, fn, 9)    \
  HC_T16(p, fn, a) HC_T16(p, fn, b) HC_T16(p, fn, c) HC_T16(p, fn, d) HC_T16(p, fn, e)    \
  HC_T16(p, fn, f)
#define HC_N(p, x) p##x,
#define HC_N16(p, h)                                                                     \
  HC_N(p, h##0) HC_N(p, h##1) HC_N(p, h##2) HC_N(p, h##3) HC_N(p, h##4) HC_N(p, h##5)     \
  HC_N(p, h##6) HC_N(p, h##7) HC_N(p, h##8) HC_N(p, h##9) HC_N(p, h##a) HC_N(p, h##b)     \
  HC_N(p, h##c) HC_N(p, h##d) HC_N(p, h##e) HC_N(p, h##f)
#define HC_NAMES(p)                                                                     \
  HC_N16(p, 0) HC_N16(p, 1) HC_N16(p, 2) HC_N16(p, 3) HC_N16(p, 4) HC_N16(p, 5)         \
  HC_N16(p, 6) HC_N16(p, 7) HC_N16(p, 8) HC_N16(p, 9) HC_N16(p, a) HC_N16(p, b)         \
  HC_N16(p, c) HC_N16(p, d) HC_N16(p, e) HC_N16(p, f)

#endif
