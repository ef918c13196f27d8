/* DLPack's ABI as pjrt_py uses it (dlpack_export.c, dlpack_import.c).
 *
 * The structs follow the DLPack ABI: versions 0.x ("dltensor" capsules) and
 * 1.x ("dltensor_versioned"). The protocol decisions (which version, copy or
 * not, which device) are made in pjrt_py/interop/dlpack.py and foreign.py.
 */
#ifndef PJRT_PY_DLPACK_H
#define PJRT_PY_DLPACK_H

#include "buffer.h"

typedef struct {
  uint32_t major;
  uint32_t minor;
} dlp_version;

typedef struct {
  int32_t device_type;
  int32_t device_id;
} dlp_device;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} dlp_dtype;

typedef struct {
  void* data;
  dlp_device device;
  int32_t ndim;
  dlp_dtype dtype;
  int64_t* shape;
  int64_t* strides; /* in elements; NULL: compact row-major */
  uint64_t byte_offset;
} dlp_tensor;

typedef struct dlp_managed {
  dlp_tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct dlp_managed*);
} dlp_managed;

typedef struct dlp_managed_v {
  dlp_version version;
  void* manager_ctx;
  void (*deleter)(struct dlp_managed_v*);
  uint64_t flags;
  dlp_tensor dl_tensor;
} dlp_managed_v;

#define DLP_FLAG_READ_ONLY 1ULL
#define DLP_FLAG_IS_COPIED 2ULL
#define DLP_VERSION_MAJOR 1
#define DLP_VERSION_MINOR 1 /* the float8 type codes are 1.1 */

static PyObject* int64_tuple(const int64_t* values, int32_t n);

static const char DLP_NAME[] = "dltensor";
static const char DLP_NAME_V[] = "dltensor_versioned";
static const char DLP_USED[] = "used_dltensor";
static const char DLP_USED_V[] = "used_dltensor_versioned";

/* An imported tensor (dlpack_import.c): the producer's managed tensor, owned. */
typedef struct {
  PyObject_HEAD
  void* managed;  /* dlp_managed or dlp_managed_v, owned: its deleter runs at dealloc */
  int versioned;
  dlp_tensor* t;
  uint64_t flags;
} TensorObject;

static PyTypeObject* TensorType;

#endif
