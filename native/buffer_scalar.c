/* A Buffer as a Python scalar: bool(), int(), float(), complex() and
 * operator.index() of its value, as numpy's and jax's arrays convert. The
 * buffer is read to the host (after its work) and numpy decides: a buffer of
 * one element converts, a larger one is numpy's error ("truth value of an
 * array with more than one element is ambiguous", ...).
 *
 * Decision: a Buffer is a handle, but `if buf:` was always true (the object
 * default), a silently wrong answer for a buffer holding False, while int()
 * and float() raised. jax.Array converts, so a Buffer does too. */

#include "buffer.h"

static PyObject* buffer_to_numpy(BufferObject* b, PyObject* unused); /* buffer_type.c */

/* op(numpy value of b), or NULL with the exception. */
static PyObject* buffer_scalar_via(BufferObject* b, PyObject* (*op)(PyObject*)) {
  PyObject* array = buffer_to_numpy(b, NULL);
  if (array == NULL) return NULL;
  PyObject* result = op(array);
  Py_DECREF(array);
  return result;
}

static int buffer_nb_bool(BufferObject* b) {
  PyObject* array = buffer_to_numpy(b, NULL);
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
