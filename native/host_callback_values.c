/* Python host callbacks: the values a callback sees and gives back. The
 * operands become numpy arrays (views or copies); what the function returns
 * is checked against the result types the program declares, then copied
 * into XLA's result buffers. Included before host_callback.c, which runs
 * the call; host_callback_gpu.c reuses both over staged host memory. */

#include "host_callback.h"

static PyObject* g_hc_dtype[HC_MAX_TYPE]; /* XLA type -> numpy dtype (set_dtypes) */
static PyObject* hc_descr(int dtype) {
  return dtype > 0 && dtype < HC_MAX_TYPE ? g_hc_dtype[dtype] : NULL;
}

/* ---- operands and results ------------------------------------------------ */

/* A numpy array of b's shape and `descr` over `data` (NULL: new memory
 * numpy owns), writable if `flags` says so. b's rank is at most NPY_MAXDIMS. */
static PyArrayObject* hc_ndarray(const hc_buffer* b, PyObject* descr, void* data, int flags) {
  npy_intp dims[NPY_MAXDIMS];
  for (int64_t d = 0; d < b->rank; ++d) dims[d] = (npy_intp)b->dims[d];
  Py_INCREF(descr); /* stolen by numpy */
  return (PyArrayObject*)PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)descr,
                                              (int)b->rank, dims, NULL, data, flags, NULL);
}

/* The operands as a tuple of arrays: views whose base is `guard` (NULL: copies).
 * Tokens become None (`tokens_as_none`, jax's convention) or are left out. */
static PyObject* hc_operands(const hc_frame* frame, PyObject* guard, int tokens_as_none,
                             PyObject* name) {
  PyObject* args = PyList_New(0);
  for (int64_t i = 0; args != NULL && i < frame->args.size; ++i) {
    const hc_buffer* b = (const hc_buffer*)frame->args.items[i];
    if (frame->args.types[i] != 1 || b->dtype == HC_TOKEN) {
      if (tokens_as_none && PyList_Append(args, Py_None) < 0) Py_CLEAR(args);
      continue;
    }
    PyObject* descr = hc_descr(b->dtype);
    if (descr == NULL) {
      PyErr_Format(PyExc_TypeError,
                   "host callback %R: operand %lld has XLA element type %d, which has no numpy "
                   "dtype here (packed sub-byte types, int4 to float4_e2m1fn, are refused)",
                   name, (long long)i, b->dtype);
      Py_CLEAR(args);
      break;
    }
    if (b->rank < 0 || b->rank > NPY_MAXDIMS) {
      PyErr_Format(PyExc_ValueError, "host callback %R: operand %lld has rank %lld", name,
                   (long long)i, (long long)b->rank);
      Py_CLEAR(args);
      break;
    }
    PyArrayObject* arr = hc_ndarray(b, descr, guard != NULL ? b->data : NULL, 0);
    if (arr != NULL && guard != NULL) {
      Py_INCREF(guard);
      if (PyArray_SetBaseObject(arr, guard) < 0) Py_CLEAR(arr);
    } else if (arr != NULL && PyArray_NBYTES(arr) > 0) {
      memcpy(PyArray_DATA(arr), b->data, (size_t)PyArray_NBYTES(arr));
    }
    if (arr == NULL || PyList_Append(args, (PyObject*)arr) < 0) Py_CLEAR(args);
    Py_XDECREF(arr);
  }
  if (args == NULL) return NULL;
  PyObject* tuple = PyList_AsTuple(args);
  Py_DECREF(args);
  return tuple;
}

/* Copies `value` into the result buffer `r` (index `i` of the callback's
 * results) after checking its dtype and shape. -1 with an exception. */
static int hc_store(const hc_buffer* r, PyObject* value, Py_ssize_t i, PyObject* name) {
  PyObject* descr = hc_descr(r->dtype);
  if (descr == NULL) {
    PyErr_Format(PyExc_TypeError,
                 "host callback %R: result %zd has XLA element type %d, which has no numpy dtype "
                 "here (packed sub-byte types, int4 to float4_e2m1fn, are refused)",
                 name, i, r->dtype);
    return -1;
  }
  PyArrayObject* arr = (PyArrayObject*)PyArray_FromAny(value, NULL, 0, 0, 0, NULL);
  if (arr == NULL) return -1;
  int ok = PyArray_EquivTypes(PyArray_DESCR(arr), (PyArray_Descr*)descr) &&
           PyArray_NDIM(arr) == r->rank;
  for (int d = 0; ok && d < PyArray_NDIM(arr); ++d) ok = PyArray_DIM(arr, d) == r->dims[d];
  if (!ok) {
    PyObject* got_shape = PyObject_GetAttrString((PyObject*)arr, "shape");
    PyObject* want = shape_tuple(r->dims, (size_t)r->rank);
    if (got_shape != NULL && want != NULL)
      PyErr_Format(PyExc_ValueError,
                   "host callback %R returned %S %R for result %zd; the program declares %S %R",
                   name, (PyObject*)PyArray_DESCR(arr), got_shape, i, descr, want);
    Py_XDECREF(got_shape);
    Py_XDECREF(want);
    Py_DECREF(arr);
    return -1;
  }
  npy_intp nbytes = PyArray_NBYTES(arr);
  if (nbytes > 0 && PyArray_IS_C_CONTIGUOUS(arr)) {
    memmove(r->data, PyArray_DATA(arr), (size_t)nbytes);
  } else if (nbytes > 0) { /* strided: numpy copies it into a view of the result */
    PyArrayObject* out = hc_ndarray(r, descr, r->data, NPY_ARRAY_WRITEABLE);
    int copied = out != NULL ? PyArray_CopyInto(out, arr) : -1;
    Py_XDECREF(out);
    if (copied < 0) {
      Py_DECREF(arr);
      return -1;
    }
  }
  Py_DECREF(arr);
  return 0;
}

/* The function's return value into the result buffers. jax's callables
 * return every result, tokens included (ignored); pjrt_py's return the
 * non-token results: one array (or a 1-tuple) for one, a sequence for more. */
static int hc_results(const hc_frame* frame, PyObject* out, int jax_style, PyObject* name) {
  Py_ssize_t wanted = 0;
  for (int64_t i = 0; i < frame->rets.size; ++i) {
    const hc_buffer* r = (const hc_buffer*)frame->rets.items[i];
    if (frame->rets.types[i] == 1 && r->dtype != HC_TOKEN) wanted++;
  }
  if (wanted == 0) return 0; /* nothing to store: the return value is ignored */
  if (out == Py_None) {
    PyErr_Format(PyExc_ValueError, "host callback %R returned None; the program declares %zd %s",
                 name, wanted, wanted == 1 ? "result" : "results");
    return -1;
  }
  PyObject* seq = NULL;
  if (!jax_style && wanted == 1 &&
      !((PyTuple_Check(out) || PyList_Check(out)) && PySequence_Size(out) == 1)) {
    seq = PyTuple_Pack(1, out);
  } else if (PyTuple_Check(out) || PyList_Check(out)) {
    seq = PySequence_Tuple(out);
  } else {
    PyObject* type = type_name(out);
    PyErr_Format(PyExc_TypeError, "host callback %R must return a tuple or list of %zd arrays, got %S",
                 name, wanted, type);
    Py_XDECREF(type);
    return -1;
  }
  if (seq == NULL) return -1;
  Py_ssize_t expected = jax_style ? (Py_ssize_t)frame->rets.size : wanted;
  if (PyTuple_Size(seq) != expected) {
    PyErr_Format(PyExc_ValueError, "host callback %R returned %zd results; the program expects %zd",
                 name, PyTuple_Size(seq), expected);
    Py_DECREF(seq);
    return -1;
  }
  Py_ssize_t k = 0; /* position in seq */
  int status = 0;
  for (int64_t i = 0; status == 0 && i < frame->rets.size; ++i) {
    const hc_buffer* r = (const hc_buffer*)frame->rets.items[i];
    int token = frame->rets.types[i] != 1 || r->dtype == HC_TOKEN;
    if (token) {
      if (jax_style) k++;
      continue;
    }
    status = hc_store(r, PyTuple_GetItem(seq, k), k, name);
    k++;
  }
  Py_DECREF(seq);
  if (status < 0 && !jax_style && wanted == 1 && (PyTuple_Check(out) || PyList_Check(out)) &&
      PyErr_ExceptionMatches(PyExc_ValueError)) { /* (a, b) for one result: say how it was read */
    PyErr_Clear();
    PyObject* type = type_name(out);
    PyErr_Format(PyExc_ValueError,
                 "host callback %R returned a %S of %zd values, read as one array: the program "
                 "declares one result (return a 1-tuple or the array itself)",
                 name, type, PySequence_Size(out));
    Py_XDECREF(type);
  }
  return status;
}
