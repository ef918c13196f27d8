/* Python host callbacks: a custom call's attributes (XLA FFI's attribute
 * dictionary) as Python values, and the route key of jax's callbacks. */
#include "host_callback.h"

static PyObject* hc_attrs_dict(const hc_attrs* attrs, int depth);

static PyObject* hc_scalar_value(const hc_scalar* s) {
  const void* v = s->value;
  switch (s->dtype) {
    case HC_PRED: return PyBool_FromLong(*(const uint8_t*)v != 0);
    case HC_S8: return PyLong_FromLong(*(const int8_t*)v);
    case HC_S16: return PyLong_FromLong(*(const int16_t*)v);
    case HC_S32: return PyLong_FromLong(*(const int32_t*)v);
    case HC_S64: return PyLong_FromLongLong(*(const int64_t*)v);
    case HC_U8: return PyLong_FromUnsignedLong(*(const uint8_t*)v);
    case HC_U16: return PyLong_FromUnsignedLong(*(const uint16_t*)v);
    case HC_U32: return PyLong_FromUnsignedLong(*(const uint32_t*)v);
    case HC_U64: return PyLong_FromUnsignedLongLong(*(const uint64_t*)v);
    case HC_F32: return PyFloat_FromDouble(*(const float*)v);
    case HC_F64: return PyFloat_FromDouble(*(const double*)v);
    default: break;
  }
  PyObject* descr = hc_descr(s->dtype);
  if (descr == NULL)
    return PyErr_Format(PyExc_TypeError, "an attribute has element type %d, which numpy lacks",
                        s->dtype);
  Py_INCREF(descr);
  return PyArray_Scalar((void*)v, (PyArray_Descr*)descr, NULL);
}

static PyObject* hc_array_value(const hc_array* a) {
  PyObject* descr = hc_descr(a->dtype);
  if (descr == NULL)
    return PyErr_Format(PyExc_TypeError, "an attribute has element type %d, which numpy lacks",
                        a->dtype);
  npy_intp size = (npy_intp)a->size;
  Py_INCREF(descr);
  PyObject* out = PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)descr, 1, &size, NULL,
                                       NULL, 0, NULL);
  if (out == NULL) return NULL;
  if (size > 0) memcpy(PyArray_DATA((PyArrayObject*)out), a->data, (size_t)PyArray_NBYTES((PyArrayObject*)out));
  PyArray_CLEARFLAGS((PyArrayObject*)out, NPY_ARRAY_WRITEABLE);
  return out;
}

static PyObject* hc_attr_value(int type, void* attr, int depth) {
  switch (type) {
    case HC_ATTR_SCALAR: return hc_scalar_value((const hc_scalar*)attr);
    case HC_ATTR_ARRAY: return hc_array_value((const hc_array*)attr);
    case HC_ATTR_STRING: {
      const hc_span* s = (const hc_span*)attr;
      return PyUnicode_DecodeUTF8(s->ptr, (Py_ssize_t)s->len, "replace");
    }
    case HC_ATTR_DICTIONARY: return hc_attrs_dict((const hc_attrs*)attr, depth + 1);
    default: return PyErr_Format(PyExc_TypeError, "an attribute of unknown kind %d", type);
  }
}

static PyObject* hc_attrs_dict(const hc_attrs* attrs, int depth) {
  if (depth > 32) return PyErr_Format(PyExc_ValueError, "attributes nested too deeply");
  PyObject* out = PyDict_New();
  for (int64_t i = 0; out != NULL && i < attrs->size; ++i) {
    const hc_span* n = attrs->names[i];
    PyObject* key = PyUnicode_DecodeUTF8(n->ptr, (Py_ssize_t)n->len, "replace");
    PyObject* value = key ? hc_attr_value(attrs->types[i], attrs->attrs[i], depth) : NULL;
    if (value == NULL || PyDict_SetItem(out, key, value) < 0) Py_CLEAR(out);
    Py_XDECREF(key);
    Py_XDECREF(value);
  }
  return out;
}

/* The `index` attribute jax's callbacks carry (slot 0): the route key. */
static int hc_route_key(const hc_attrs* attrs, unsigned long long* key) {
  for (int64_t i = 0; i < attrs->size; ++i) {
    const hc_span* n = attrs->names[i];
    if (attrs->types[i] != HC_ATTR_SCALAR || n->len != 5 || memcmp(n->ptr, "index", 5) != 0)
      continue;
    const hc_scalar* s = (const hc_scalar*)attrs->attrs[i];
    if (s->dtype == HC_U64 || s->dtype == HC_S64) {
      *key = *(const unsigned long long*)s->value;
      return 0;
    }
  }
  return -1;
}

