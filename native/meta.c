/* Element types and buffer metadata.
 *
 * A buffer's metadata is one (shape, dtype) tuple, interned so that the
 * argument check of a call is a pointer comparison per argument. The dtype
 * table comes from pjrt_py.runtime.dtypes (set_dtypes), which is its one
 * source, once. Entry points that take a meta or a type from Python check
 * them here (meta_check): the core reads a meta as a tuple of ints and a
 * numpy dtype, and a type as the size of the memory it describes.
 */
#include "staging.h"

#include <string.h>

#define PJRT_PY_MAX_TYPES 64
#define PJRT_PY_MAX_METAS 4096 /* bound on interned metadata */

static PyObject* g_dtype_of[PJRT_PY_MAX_TYPES]; /* PJRT type -> np.dtype, or NULL */
static PyObject* g_metas;                       /* meta -> the same meta */

/* Whether a dtype can describe device memory: no Python objects in it. */
static int dtype_is_plain(PyObject* dtype) {
  return PyArray_DescrCheck(dtype) && !PyDataType_REFCHK((PyArray_Descr*)dtype);
}

/* set_dtypes([(np.dtype, PJRT type), ...]), at import (pjrt_py.runtime.dtypes):
 * every size the core reads by follows from it, so once set it is not
 * changed (a float32 remapped to F64 read twice an array's bytes); the same
 * pairs again (pjrt_py imported anew) are fine. */
static PyObject* core_set_dtypes(PyObject* self, PyObject* pairs) {
  (void)self;
  static int set = 0;
  PyObject* seq = PySequence_Tuple(pairs);
  if (seq == NULL) return NULL;
  for (Py_ssize_t i = 0; i < PyTuple_Size(seq); ++i) {
    PyObject* pair = PyTuple_GetItem(seq, i);
    PyObject* dtype = NULL;
    int code = -1;
    if (!PyArg_ParseTuple(pair, "Oi", &dtype, &code)) break;
    if (code < 0 || code >= PJRT_PY_MAX_TYPES || !dtype_is_plain(dtype)) {
      PyErr_SetString(PyExc_ValueError, "set_dtypes: bad pair");
      break;
    }
    if (set) {
      PyArray_Descr* had = (PyArray_Descr*)g_dtype_of[code];
      if (had == NULL || !PyArray_EquivTypes(had, (PyArray_Descr*)dtype)) {
        PyErr_SetString(PyExc_RuntimeError, "set_dtypes: the table set at import cannot change");
        break;
      }
      continue;
    }
    Py_INCREF(dtype);
    PJRT_PY_SETREF(g_dtype_of[code], dtype);
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) return NULL;
  set = 1;
  Py_RETURN_NONE;
}

/* The PJRT type of a dtype object, by identity with the table's canonical
 * dtypes (what arrays made the usual way carry); -1 if not one of them. An
 * equal but distinct dtype (-1 here) takes the Python path, which compares
 * by value. */
static int pjrt_type_of(PyArray_Descr* descr) {
  for (int code = 0; code < PJRT_PY_MAX_TYPES; ++code) {
    if (g_dtype_of[code] == (PyObject*)descr) return code;
  }
  return -1;
}

/* The interned copy of `meta` (a new reference). */
static PyObject* meta_intern(PyObject* meta) {
  PyObject* shared = PyDict_GetItemWithError(g_metas, meta); /* borrowed */
  if (shared != NULL) {
    Py_INCREF(shared);
    return shared;
  }
  if (PyErr_Occurred()) return NULL;
  if (PyDict_Size(g_metas) < PJRT_PY_MAX_METAS && PyDict_SetItem(g_metas, meta, meta) < 0)
    return NULL;
  Py_INCREF(meta);
  return meta;
}

/* Checks a meta given from Python: an exact (tuple of ints >= 0, plain
 * dtype) pair, as the core reads every meta; where given, of PJRT type
 * `type` (>= 0), of rank `ndim` and `dims` (non-NULL), of dtype `descr`
 * (non-NULL). A ValueError otherwise: a meta that was not one was read as
 * one and crashed, and one of another size had the plugin read past memory. */
static int meta_check(PyObject* meta, int type, int ndim, const int64_t* dims,
                      PyArray_Descr* descr) {
  PyObject* shape = PyTuple_CheckExact(meta) && PyTuple_Size(meta) == 2
                        ? PyTuple_GetItem(meta, 0) : NULL;
  PyObject* dtype = shape != NULL ? PyTuple_GetItem(meta, 1) : NULL;
  int ok = shape != NULL && PyTuple_CheckExact(shape) && dtype_is_plain(dtype) &&
           PyTuple_Size(shape) <= PJRT_PY_MAX_RANK &&
           (dims == NULL || PyTuple_Size(shape) == ndim);
  for (Py_ssize_t i = 0; ok && i < PyTuple_Size(shape); ++i) {
    PyObject* d = PyTuple_GetItem(shape, i);
    long long v = PyLong_CheckExact(d) ? PyLong_AsLongLong(d) : -1;
    if (v == -1 && PyErr_Occurred()) PyErr_Clear();
    ok = v >= 0 && (dims == NULL || v == dims[i]);
  }
  if (ok && type >= 0)
    ok = type < PJRT_PY_MAX_TYPES && g_dtype_of[type] != NULL &&
         PyArray_EquivTypes((PyArray_Descr*)g_dtype_of[type], (PyArray_Descr*)dtype);
  if (ok && descr != NULL) ok = PyArray_EquivTypes(descr, (PyArray_Descr*)dtype);
  if (ok) return 0;
  PyErr_SetString(PyExc_ValueError,
                  "not a buffer's metadata: (shape, dtype) of the memory and element type given");
  return -1;
}

static PyObject* core_intern_meta(PyObject* self, PyObject* meta) {
  (void)self;
  if (meta_check(meta, -1, 0, NULL, NULL) < 0) return NULL;
  return meta_intern(meta);
}

static PyObject* shape_tuple(const int64_t* dims, size_t ndims) {
  PyObject* shape = PyTuple_New((Py_ssize_t)ndims);
  if (shape == NULL) return NULL;
  for (size_t i = 0; i < ndims; ++i) {
    PyObject* d = PyLong_FromLongLong(dims[i]);
    if (d == NULL) {
      Py_DECREF(shape);
      return NULL;
    }
    PyTuple_SetItem(shape, (Py_ssize_t)i, d);
  }
  return shape;
}

/* The interned meta for dims and a PJRT element type (a new reference). */
static PyObject* meta_from_dims(const int64_t* dims, size_t ndims, int type) {
  if (type < 0 || type >= PJRT_PY_MAX_TYPES || g_dtype_of[type] == NULL) {
    PyErr_Format(PyExc_TypeError, "PJRT element type %d has no numpy dtype in pjrt_py", type);
    return NULL;
  }
  PyObject* shape = shape_tuple(dims, ndims);
  if (shape == NULL) return NULL;
  PyObject* meta = PyTuple_Pack(2, shape, g_dtype_of[type]);
  Py_DECREF(shape);
  if (meta == NULL) return NULL;
  PyObject* shared = meta_intern(meta);
  Py_DECREF(meta);
  return shared;
}

/* Reads a meta into numpy terms; *descr is borrowed. */
static int meta_unpack(PyObject* meta, npy_intp* dims, int* ndim, PyArray_Descr** descr) {
  PyObject* shape = PyTuple_GetItem(meta, 0);
  PyObject* dtype = PyTuple_GetItem(meta, 1);
  if (shape == NULL || dtype == NULL) return -1;
  Py_ssize_t n = PyTuple_Size(shape);
  if (n < 0 || n > PJRT_PY_MAX_RANK) {
    PyErr_SetString(PyExc_ValueError, "buffer rank out of range");
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    dims[i] = (npy_intp)PyLong_AsSsize_t(PyTuple_GetItem(shape, i));
    if (dims[i] == -1 && PyErr_Occurred()) return -1;
  }
  *ndim = (int)n;
  *descr = (PyArray_Descr*)dtype;
  return 0;
}

/* A small cache from (dtype, shape) of an array to its interned meta: the
 * fast path of buffer_async builds no tuple for a shape seen recently. */
typedef struct {
  PyArray_Descr* descr; /* borrowed: canonical dtypes live forever */
  int ndim;
  npy_intp dims[8];
  PyObject* meta;
} meta_slot;

static meta_slot g_meta_cache[16];

static PyObject* meta_of_array(PyArrayObject* array) {
  int ndim = PyArray_NDIM(array);
  const npy_intp* dims = PyArray_DIMS(array);
  PyArray_Descr* descr = PyArray_DESCR(array);
  size_t h = (size_t)descr >> 4;
  for (int i = 0; i < ndim; ++i) h = h * 31 + (size_t)dims[i];
  meta_slot* slot = &g_meta_cache[(h + (size_t)ndim) & 15];
  if (ndim <= 8 && slot->meta != NULL && slot->descr == descr && slot->ndim == ndim &&
      memcmp(slot->dims, dims, (size_t)ndim * sizeof(npy_intp)) == 0) {
    Py_INCREF(slot->meta);
    return slot->meta;
  }
  int64_t dims64[PJRT_PY_MAX_RANK];
  for (int i = 0; i < ndim; ++i) dims64[i] = (int64_t)dims[i];
  PyObject* shape = shape_tuple(dims64, (size_t)ndim);
  if (shape == NULL) return NULL;
  PyObject* meta = PyTuple_Pack(2, shape, (PyObject*)descr);
  Py_DECREF(shape);
  if (meta == NULL) return NULL;
  PyObject* shared = meta_intern(meta);
  Py_DECREF(meta);
  if (shared != NULL && ndim <= 8) {
    Py_INCREF(shared);
    PJRT_PY_SETREF(slot->meta, shared);
    slot->descr = descr;
    slot->ndim = ndim;
    memcpy(slot->dims, dims, (size_t)ndim * sizeof(npy_intp));
  }
  return shared;
}
