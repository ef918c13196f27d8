/* A Buffer as a Python scalar: bool(), int(), float(), complex(),
 * operator.index() and format() of its value, as numpy's and jax's arrays
 * convert. The
 * buffer is read to the host (after its work) and numpy decides: a buffer of
 * one element converts, a larger one is numpy's error ("truth value of an
 * array with more than one element is ambiguous", ...).
 *
 * Decision: a Buffer is a handle, but `if buf:` was always true (the object
 * default), a silently wrong answer for a buffer holding False, while int()
 * and float() raised. jax.Array converts, so a Buffer does too. */

#include "buffer.h"

static PyObject* buffer_to_numpy(BufferObject* b, PyObject* unused); /* buffer_type.c */

/* What numpy decides from: b's value where it has one element; else an
 * uninitialised array of b's shape and dtype (numpy refuses it without
 * reading it: a 64 MiB buffer was copied to the host first). */
static PyObject* buffer_scalar_array(BufferObject* b) {
  if (buffer_live(b) < 0) return NULL;
  Py_ssize_t size = buffer_size_of(b);
  if (size < 0) return NULL;
  if (size == 1) return buffer_to_numpy(b, NULL);
  npy_intp dims[PJRT_PY_MAX_RANK];
  int ndim;
  PyArray_Descr* descr;
  if (meta_unpack(b->meta, dims, &ndim, &descr) < 0) return NULL;
  Py_INCREF(descr); /* stolen */
  return PyArray_Empty(ndim, dims, descr, 0);
}

/* op(numpy value of b), or NULL with the exception. */
static PyObject* buffer_scalar_via(BufferObject* b, PyObject* (*op)(PyObject*)) {
  PyObject* array = buffer_scalar_array(b);
  if (array == NULL) return NULL;
  PyObject* result = op(array);
  Py_DECREF(array);
  return result;
}

/* format(b, spec), as a numpy array formats: its str() for an empty spec;
 * else the value's format (a 0-d or one-element buffer), or numpy's error. */
static PyObject* buffer_format(BufferObject* b, PyObject* spec) {
  if (!PyUnicode_Check(spec)) {
    PyErr_SetString(PyExc_TypeError, "__format__ takes a str");
    return NULL;
  }
  if (PyUnicode_GetLength(spec) == 0) return PyObject_Str((PyObject*)b);
  PyObject* array = buffer_scalar_array(b);
  if (array == NULL) return NULL;
  PyObject* out = PyObject_Format(array, spec);
  Py_DECREF(array);
  return out;
}

static int buffer_nb_bool(BufferObject* b) {
  PyObject* array = buffer_scalar_array(b);
  if (array == NULL) return -1;
  int truth = PyObject_IsTrue(array);
  Py_DECREF(array);
  return truth;
}

static PyObject* buffer_nb_int(BufferObject* b) { return buffer_scalar_via(b, PyNumber_Long); }

static PyObject* buffer_nb_float(BufferObject* b) { return buffer_scalar_via(b, PyNumber_Float); }

static PyObject* buffer_nb_index(BufferObject* b) { return buffer_scalar_via(b, PyNumber_Index); }

static PyObject* as_complex(PyObject* array) {
  return PyObject_CallFunctionObjArgs((PyObject*)&PyComplex_Type, array, NULL);
}

static PyObject* buffer_complex(BufferObject* b, PyObject* unused) {
  (void)unused;
  return buffer_scalar_via(b, as_complex);
}
