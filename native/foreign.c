/* Foreign arguments on the dispatch fast path: another framework's array
 * (jax, torch, any DLPack producer other than numpy) viewed in place.
 *
 * On a CPU client, an argument that is not a Buffer is asked for a DLPack
 * tensor; one that matches the compiled (shape, dtype) exactly, lies in host
 * memory, is compact row-major and 64-byte aligned becomes a view (the same
 * one pjrt_py.interop.dlpack makes). Anything else, or any error, sends the whole
 * call to the Python path, which takes the tensor again and explains. */
#include "dlpack.h"
#include "promise.h"

static int g_dl_code[PJRT_PY_MAX_TYPES]; /* PJRT type -> code << 8 | bits; 0 unknown */
static PyObject* g_dlpack_name;          /* "__dlpack__" */
static PyObject* g_dlpack_kwargs;        /* {"max_version": (1, 1)} */
static PyObject* g_empty_tuple;
static PyObject* g_lazy_torch_prefix;  /* "torch" */
static PyObject* g_lazy_bit_names[2];  /* "is_neg", "is_conj" */
static PyObject* g_lazy_type;          /* the last type asked about (a strong reference) */
static int g_lazy_type_torch;          /* whether it is one of torch's */

/* set_dlpack_codes([(PJRT type, DLPack code, bits), ...]), at import: once set,
 * not changed (a remapped code had a producer of smaller elements viewed as
 * larger ones); the same rows again (pjrt_py imported anew) are fine. */
static PyObject* core_set_dlpack_codes(PyObject* self, PyObject* rows) {
  (void)self;
  PyObject* seq = PySequence_Tuple(rows);
  if (seq == NULL) return NULL;
  for (Py_ssize_t i = 0; i < PyTuple_Size(seq); ++i) {
    int type, code, bits;
    if (!PyArg_ParseTuple(PyTuple_GetItem(seq, i), "iii", &type, &code, &bits)) break;
    if (type < 0 || type >= PJRT_PY_MAX_TYPES) {
      PyErr_SetString(PyExc_ValueError, "set_dlpack_codes: bad PJRT type");
      break;
    }
    if (g_dlpack_name != NULL && g_dl_code[type] != ((code << 8) | bits)) {
      PyErr_SetString(PyExc_RuntimeError, "set_dlpack_codes: the table set at import cannot change");
      break;
    }
    g_dl_code[type] = (code << 8) | bits;
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) return NULL;
  if (g_dlpack_name == NULL) {
    g_dlpack_name = PyUnicode_InternFromString("__dlpack__");
    g_empty_tuple = PyTuple_New(0);
    g_dlpack_kwargs = Py_BuildValue("{s:(ii)}", "max_version", DLP_VERSION_MAJOR,
                                    DLP_VERSION_MINOR);
    g_lazy_torch_prefix = PyUnicode_InternFromString("torch");
    g_lazy_bit_names[0] = PyUnicode_InternFromString("is_neg");
    g_lazy_bit_names[1] = PyUnicode_InternFromString("is_conj");
    if (!g_dlpack_name || !g_empty_tuple || !g_dlpack_kwargs || !g_lazy_torch_prefix ||
        !g_lazy_bit_names[0] || !g_lazy_bit_names[1])
      return NULL;
  }
  Py_RETURN_NONE;
}

/* Whether t can be viewed as `expect` (an interned meta) on a CPU client. */
static int foreign_matches(const dlp_tensor* t, PyObject* expect, int* type) {
  PyObject* shape = PyTuple_GetItem(expect, 0);
  PyArray_Descr* descr = (PyArray_Descr*)PyTuple_GetItem(expect, 1);
  *type = pjrt_type_of(descr);
  if (*type < 0 || g_dl_code[*type] == 0 || t->dtype.lanes != 1 ||
      ((t->dtype.code << 8) | t->dtype.bits) != g_dl_code[*type])
    return 0;
  if (t->device.device_type != 1 || t->ndim != PyTuple_Size(shape)) return 0;
  const char* data = (const char*)t->data + t->byte_offset;
  /* XLA's CPU client views only 64-byte aligned memory (ZERO_COPY_ALIGNMENT in buffer.py) */
  if (t->data == NULL || ((uintptr_t)data % 64) != 0) return 0;
  int64_t step = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    int64_t d = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
    if (d != t->shape[i] || d <= 0) return 0; /* an empty array takes the Python path */
    if (t->strides != NULL && d != 1 && t->strides[i] != step) return 0;
    step *= d;
  }
  return 1;
}

/* Whether `arg` is a torch tensor whose memory does not hold its values:
 * torch's lazy negation and conjugation bits (`c.conj().imag`) are not in
 * DLPack, and torch exports the memory as it is. Such a tensor takes the
 * Python path, which resolves the bit into a copy (pjrt_py.interop.dlpack). Only
 * torch's types are asked (their module starts with "torch"): the answer is
 * kept for the last type seen, which is held so its address stays its own. */

static int foreign_lazy_bits(PyObject* arg) {
  PyObject* type = (PyObject*)Py_TYPE(arg);
  if (type != g_lazy_type) {
    PyObject* module = PyObject_GetAttrString(type, "__module__");
    int torch = module != NULL && PyUnicode_Check(module) &&
                PyUnicode_Tailmatch(module, g_lazy_torch_prefix, 0, 5, -1) == 1;
    Py_XDECREF(module);
    clear_for_fallback();
    Py_INCREF(type);
    PJRT_PY_SETREF(g_lazy_type, type);
    g_lazy_type_torch = torch;
  }
  if (!g_lazy_type_torch) return 0;
  for (int i = 0; i < 2; ++i) {
    PyObject* answer = PyObject_CallMethodObjArgs(arg, g_lazy_bit_names[i], NULL);
    int set = answer == Py_True;
    Py_XDECREF(answer);
    if (answer == NULL) {
      clear_for_fallback();
      return 1; /* the Python path asks again, and explains */
    }
    if (set) return 1;
  }
  return 0;
}

/* A view of a foreign argument, as a new Buffer; NULL (no exception) when the
 * argument is not one the fast path takes. */
static BufferObject* foreign_argument(PyObject* arg, PyObject* client, pjrt_py_client* c,
                                      PJRT_Device* device, PyObject* expect) {
  /* pjrt_py's own Buffers and promises are never taken as foreign: one on
   * another device, memory or client gets the Python path's refusal (a
   * promise was viewed through DLPack instead, wherever it was). */
  if (!c->cpu || device == NULL || g_dlpack_name == NULL || PyArray_Check(arg) ||
      PyArray_IsScalar(arg, Generic) || PyObject_TypeCheck(arg, BufferType) ||
      PyObject_TypeCheck(arg, PromiseType) ||
      !PJRT_PY_HAS(c->api, PJRT_Client_CreateViewOfDeviceBuffer))
    return NULL;
  if (foreign_lazy_bits(arg)) return NULL;
  PyObject* method = PyObject_GetAttr(arg, g_dlpack_name);
  if (method == NULL) {
    clear_for_fallback();
    return NULL;
  }
  PyObject* capsule = PyObject_Call(method, g_empty_tuple, g_dlpack_kwargs);
  Py_DECREF(method);
  TensorObject* tensor = capsule ? (TensorObject*)core_dlpack_unpack(NULL, capsule) : NULL;
  Py_XDECREF(capsule);
  if (tensor == NULL) {
    clear_for_fallback();
    return NULL;
  }
  int type;
  BufferObject* b = NULL;
  if (foreign_matches(tensor->t, expect, &type)) {
    b = tensor_view(client, c, tensor, type, device, expect, 0);
    if (b == NULL) PyErr_Clear();
  }
  Py_DECREF(tensor); /* a view holds its own reference */
  return b;
}

/* Arrays small enough to copy on the dispatch path: below this, the copy
 * holds the GIL (host.c) and takes well under a microsecond. */
#define PJRT_PY_INLINE_ARG_BYTES PJRT_PY_GIL_FREE_BYTES

/* A numpy array argument with exactly the compiled shape and dtype, native
 * byte order, C-contiguous and small: copied into a new Buffer on `device`
 * (a snapshot, as the Python path makes: PJRT copies it during the call), or
 * NULL for the Python path to check, transfer and explain. No Python code
 * runs here. */
static BufferObject* numpy_argument(PyObject* arg, PyObject* client, pjrt_py_client* c,
                                    PJRT_Device* device, PyObject* expect) {
  if (device == NULL || !PyArray_CheckExact(arg)) return NULL;
  PyArrayObject* a = (PyArrayObject*)arg;
  npy_intp dims[PJRT_PY_MAX_RANK];
  int ndim;
  PyArray_Descr* dtype;
  if (meta_unpack(expect, dims, &ndim, &dtype) < 0 || PyArray_DESCR(a) != dtype ||
      PyArray_NDIM(a) != ndim ||
      memcmp(PyArray_DIMS(a), dims, (size_t)ndim * sizeof(npy_intp)) != 0 ||
      !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) ||
      PyArray_NBYTES(a) >= PJRT_PY_INLINE_ARG_BYTES) {
    PyErr_Clear();
    return NULL;
  }
  int type = pjrt_type_of(dtype);
  if (type < 0) return NULL;
  BufferObject* b = host_to_device(client, c, a, type,
                                   PJRT_HostBufferSemantics_kImmutableOnlyDuringCall, device,
                                   NULL, expect, 0);
  if (b == NULL) PyErr_Clear(); /* the Python path reports it */
  return b;
}
