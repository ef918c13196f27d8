/* A Buffer's on-device layout: dense strides, row-major or not, and the CPU
 * read of a dense buffer in another dimension order. Used by DLPack export,
 * to_numpy and the dispatch fast path (which relays non-row-major buffers).
 */
#include "buffer.h"

/* Element strides of b's on-device layout where it is dense, without tiles or
 * padding, in any dimension order (row-major, column-major, ...): 1 with
 * `strides` filled; else 0 (tiled, padded, or the plugin cannot say). */
static int buffer_layout_strides(BufferObject* b, size_t ndim, const int64_t* dims,
                                 int64_t* strides) {
  int64_t order[PJRT_PY_MAX_RANK];
  if (!buffer_minor_to_major(b, ndim, order)) return 0;
  unsigned char seen[PJRT_PY_MAX_RANK] = {0};
  int64_t step = 1;
  for (size_t k = 0; k < ndim; ++k) {
    int64_t axis = order[k];
    if (axis < 0 || (size_t)axis >= ndim || seen[axis]) return 0;
    seen[axis] = 1;
    strides[axis] = step;
    step *= dims[axis] > 0 ? dims[axis] : 1;
  }
  return 1;
}

/* Whether b is row-major (1) or in another layout the plugin reports (2);
 * asked once. A plugin that cannot say counts as row-major: its buffers are
 * what it made them. With the GIL; b is live. */
static int buffer_row_major_state(BufferObject* b, size_t ndim) {
  if (b->row_major != 0) return b->row_major;
  int state = 1;
  if (PJRT_PY_HAS(b->c->api, PJRT_Buffer_GetMemoryLayout)) {
    int64_t order[PJRT_PY_MAX_RANK];
    if (!buffer_minor_to_major(b, ndim, order)) state = 2; /* tiled or padded */
    for (size_t k = 0; state == 1 && k < ndim; ++k)
      if (order[k] != (int64_t)(ndim - 1 - k)) state = 2;
  }
  b->row_major = (unsigned char)state;
  return state;
}

/* _layout(): minor_to_major of the buffer's on-device layout, or None where
 * it is tiled or not reported. A buffer known to be row-major (made so, or
 * asked before) is not asked again. */
static PyObject* buffer_get_layout(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return NULL;
  size_t ndim = (size_t)PyTuple_Size(PyTuple_GetItem(meta, 0));
  int64_t order[PJRT_PY_MAX_RANK];
  if (b->row_major == 1 && PJRT_PY_HAS(b->c->api, PJRT_Buffer_GetMemoryLayout)) {
    for (size_t k = 0; k < ndim; ++k) order[k] = (int64_t)(ndim - 1 - k);
  } else if (!buffer_minor_to_major(b, ndim, order)) {
    Py_RETURN_NONE;
  }
  return int64_tuple(order, (int32_t)ndim);
}

/* The buffer's dims (from its metadata) into `dims`; its rank, or -1. */
static Py_ssize_t buffer_dims(BufferObject* b, int64_t* dims) {
  PyObject* meta = buffer_meta(b);
  if (meta == NULL) return -1;
  PyObject* shape = PyTuple_GetItem(meta, 0);
  Py_ssize_t ndim = PyTuple_Size(shape);
  for (Py_ssize_t i = 0; i < ndim; ++i) dims[i] = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
  return ndim;
}

/* _dlpack_layout_ok(): whether the buffer can be lent as is (dense, untiled,
 * any dimension order: the capsule then carries its strides). */
static PyObject* buffer_dlpack_layout_ok(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (buffer_live(b) < 0) return NULL;
  int64_t dims[PJRT_PY_MAX_RANK], strides[PJRT_PY_MAX_RANK];
  Py_ssize_t ndim = buffer_dims(b, dims);
  if (ndim < 0) return NULL;
  return PyBool_FromLong(buffer_layout_strides(b, (size_t)ndim, dims, strides));
}

/* The CPU path of to_numpy for a buffer whose layout is dense but not
 * row-major (a program's output with another mhlo.layout_mode): numpy copies
 * it through its strides into the row-major `array`. PJRT_Buffer_ToHostBuffer
 * ignores the requested host layout on some builds (xla-cpu-pjrt 0.81 returns
 * the column-major bytes as they lie). Waits for the buffer. 1 if copied, 0 if
 * not this case, -1 with an exception. */
static int buffer_read_permuted(BufferObject* b, PyArrayObject* array) {
  int64_t dims[PJRT_PY_MAX_RANK], strides[PJRT_PY_MAX_RANK];
  Py_ssize_t ndim = PyArray_NDIM(array);
  for (Py_ssize_t i = 0; i < ndim; ++i) dims[i] = (int64_t)PyArray_DIMS(array)[i];
  if (!buffer_layout_strides(b, (size_t)ndim, dims, strides)) return 0;
  bool row_major = true;
  int64_t step = 1;
  for (Py_ssize_t i = ndim - 1; i >= 0; --i) {
    if (dims[i] != 1 && strides[i] != step) row_major = false;
    step *= dims[i] > 0 ? dims[i] : 1;
  }
  if (row_major) return 0;
  PyObject* ready = buffer_block_until_ready(b, NULL); /* raises the work's error */
  if (ready == NULL) return -1;
  Py_DECREF(ready);
  if (buffer_live(b) < 0) return -1; /* the wait let other threads run */
  const PJRT_Api* api = b->c->api;
  PJRT_Error* error = buffer_hold_memory(b);
  if (error != NULL) {
    raise_pjrt(api, error);
    return -1;
  }
  void* data = NULL;
  error = buffer_data_address(b, &data);
  int copied = -1;
  if (error != NULL) {
    raise_pjrt(api, error);
  } else {
    npy_intp byte_strides[PJRT_PY_MAX_RANK];
    npy_intp item = (npy_intp)PyArray_ITEMSIZE(array);
    for (Py_ssize_t i = 0; i < ndim; ++i) byte_strides[i] = (npy_intp)strides[i] * item;
    PyArray_Descr* descr = PyArray_DESCR(array);
    Py_INCREF(descr);
    PyObject* source = PyArray_NewFromDescr(&PyArray_Type, descr, (int)ndim, PyArray_DIMS(array),
                                            byte_strides, data, 0, NULL);
    if (source != NULL) {
      copied = PyArray_CopyInto(array, (PyArrayObject*)source) < 0 ? -1 : 1;
      Py_DECREF(source);
    }
  }
  buffer_release_memory(b);
  return copied;
}
