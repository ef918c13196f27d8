/* PJRT errors -> Python exceptions, and plugin loading.
 *
 * The exception classes are pjrt_py.runtime.errors' (a pure Python module this one
 * imports at load): one per PJRT error code, each with .code and .message.
 */
#include "common.h"

#include <dlfcn.h>
#include <stdio.h>

static PyObject* g_errors_by_code; /* dict: code -> class */
static PyObject* g_pjrt_error;     /* PjrtError */
static PyObject* g_plugin_load_error;

static int errors_init(void) {
  PyObject* module = PyImport_ImportModule("pjrt_py.runtime.errors");
  if (module == NULL) return -1;
  g_errors_by_code = PyObject_GetAttrString(module, "BY_CODE");
  g_pjrt_error = PyObject_GetAttrString(module, "PjrtError");
  g_plugin_load_error = PyObject_GetAttrString(module, "PluginLoadError");
  Py_DECREF(module);
  return (g_errors_by_code && g_pjrt_error && g_plugin_load_error) ? 0 : -1;
}

/* The exception now set, taken from the interpreter (NULL if none). */
static PyObject* error_take(void) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
}

/* PyErr_Clear before a fallback (a fast path gives way to the Python one),
 * except that Ctrl-C is not dropped: a signal handler raises
 * KeyboardInterrupt inside whatever Python code the attempt ran (a
 * producer's __dlpack__), and clearing it would lose the interrupt. It is
 * tripped again, for the next check. */
static void clear_for_fallback(void) {
  int interrupted = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
  PyErr_Clear();
  if (interrupted) PyErr_SetInterrupt();
}

/* The name of o's type, as a str (tp_name is not in the limited API). */
static PyObject* type_name(PyObject* o) {
  PyObject* name = PyObject_GetAttrString((PyObject*)Py_TYPE(o), "__name__");
  if (name == NULL) {
    PyErr_Clear();
    name = PyUnicode_FromString("?");
  }
  return name;
}

/* Calls self.<name>(*args, **kwargs) with a fast call's arguments: how a
 * native fast path hands a call it does not take to its Python method. */
static PyObject* call_python_method(PyObject* self, const char* name, PyObject* const* args,
                                   Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* tuple = PyTuple_New(nargs);
  if (tuple == NULL) return NULL;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(tuple, i, args[i]);
  }
  PyObject* kwargs = PyDict_New();
  Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
  for (Py_ssize_t i = 0; kwargs != NULL && i < nkw; ++i) {
    if (PyDict_SetItem(kwargs, PyTuple_GetItem(kwnames, i), args[nargs + i]) < 0)
      Py_CLEAR(kwargs);
  }
  PyObject* result = NULL;
  PyObject* method = kwargs ? PyObject_GetAttrString(self, name) : NULL;
  if (method != NULL) {
    result = PyObject_Call(method, tuple, kwargs);
    Py_DECREF(method);
  }
  Py_DECREF(tuple);
  Py_XDECREF(kwargs);
  return result;
}

static void error_destroy(const PJRT_Api* api, PJRT_Error* error) {
  if (error == NULL) return;
  PJRT_Error_Destroy_Args args = {0};
  args.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
  args.error = error;
  api->PJRT_Error_Destroy(&args);
}

/* Destroys a PJRT buffer handle nothing else owns. */
static void buffer_handle_destroy(const PJRT_Api* api, PJRT_Buffer* buffer) {
  PJRT_Buffer_Destroy_Args args = {0};
  args.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
  args.buffer = buffer;
  error_destroy(api, api->PJRT_Buffer_Destroy(&args));
}

/* The PjrtError subclass for `code`'s instance for `message`, made without
 * running Python code. PjrtError.__init__ is Python: a signal handler due at
 * its first line (Ctrl-C that a host callback on a plugin thread passed on)
 * raised inside it, and the caller lost the error (a failed execution's
 * promise then gave its unwritten outputs). BaseException.__new__ sets the
 * args; the attributes are what __init__ sets. NULL if out of memory. */
static PyObject* error_for_code(PyObject* message, int code) {
  PyObject* key = PyLong_FromLong(code);
  PyObject* cls = key ? PyDict_GetItemWithError(g_errors_by_code, key) : NULL; /* borrowed */
  if (cls == NULL && !PyErr_Occurred()) cls = g_pjrt_error;
  PyObject* exc = cls ? PyObject_CallMethod(PyExc_BaseException, "__new__", "OO", cls, message)
                      : NULL;
  if (exc != NULL && (PyObject_SetAttrString(exc, "message", message) < 0 ||
                      PyObject_SetAttrString(exc, "code", key) < 0))
    Py_CLEAR(exc);
  Py_XDECREF(key);
  return exc;
}

/* A new exception for `error` (which is destroyed); NULL if that failed. */
static PyObject* error_from_pjrt(const PJRT_Api* api, PJRT_Error* error) {
  PJRT_Error_GetCode_Args code_args = {0};
  code_args.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE;
  code_args.error = error;
  int code = PJRT_Error_Code_UNKNOWN;
  PJRT_Error* inner = api->PJRT_Error_GetCode(&code_args);
  if (inner == NULL) {
    code = (int)code_args.code;
  } else {
    error_destroy(api, inner);
  }
  PJRT_Error_Message_Args message_args = {0};
  message_args.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
  message_args.error = error;
  api->PJRT_Error_Message(&message_args);
  PyObject* message = PyUnicode_DecodeUTF8(message_args.message,
                                           (Py_ssize_t)message_args.message_size, "replace");
  error_destroy(api, error);
  if (message == NULL) return NULL;
  PyObject* exc = error_for_code(message, code);
  Py_DECREF(message);
  return exc;
}

/* Raises the exception for `error`; returns NULL for `return raise_pjrt(...)`. */
static PyObject* raise_pjrt(const PJRT_Api* api, PJRT_Error* error) {
  PyObject* exc = error_from_pjrt(api, error);
  if (exc != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

/* The PJRT_Api addresses load_plugin handed out. Entry points that take an
 * api as an int read it only if it is one of these, so a stray int raises
 * instead of being followed (a process loads a handful of plugins). */
#define KNOWN_APIS 64
static const PJRT_Api* g_known_apis[KNOWN_APIS];
static int g_known_api_count;

static bool api_known(const void* api) {
  for (int i = 0; i < g_known_api_count; i++)
    if (g_known_apis[i] == api) return true;
  return false;
}

/* 0 when the table is full (the GIL is held). */
static int api_remember(const PJRT_Api* api) {
  if (api_known(api)) return 1;
  if (g_known_api_count == KNOWN_APIS) return 0;
  g_known_apis[g_known_api_count++] = api;
  return 1;
}

static const PJRT_Api* address_of_api(PyObject* address) {
  void* p = PyLong_AsVoidPtr(address);
  if (p == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "NULL PJRT_Api");
    return NULL;
  }
  if (api_known(p)) return (const PJRT_Api*)p;
  PyErr_SetString(PyExc_ValueError, "not the address of a PJRT_Api that load_plugin returned");
  return NULL;
}

/* error_from_pjrt(api, error) -> exception, for PJRT errors met by the cffi
 * layer (addresses as ints). */
static PyObject* core_error_from_pjrt(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  (void)self;
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "error_from_pjrt(api, error)");
    return NULL;
  }
  const PJRT_Api* api = address_of_api(args[0]);
  if (api == NULL) return NULL;
  PJRT_Error* error = (PJRT_Error*)PyLong_AsVoidPtr(args[1]);
  if (error == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "NULL PJRT_Error");
    return NULL;
  }
  return error_from_pjrt(api, error);
}

/* load_plugin(path) -> PJRT_Api address. dlopen'd once and never closed:
 * RTLD_LOCAL, because plugins bundle their own LLVM, protobuf, ...; they
 * must not resolve against each other or against jaxlib.
 *
 * A new instance of a library the process already has (in a child of fork())
 * is loaded from a copy of the file (runtime/library.py): dlopen tells
 * objects apart by inode. Not dlmopen: a second link-map namespace
 * brings a second libc, whose pthread key table is empty while the threads'
 * key slots are shared, so the plugin's first key took slot 0, Python's
 * GIL-state key, and cleared it on the main thread (measured on the 0.115
 * CPU build: jaxlib then aborted at import in about 1 child in 8). */
static PyObject* core_load_plugin(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* path_obj;
  if (!PyArg_ParseTuple(args, "U:load_plugin", &path_obj)) return NULL;
  PyObject* encoded = PyUnicode_EncodeFSDefault(path_obj);
  if (encoded == NULL) return NULL;
  const char* path = PyBytes_AsString(encoded);
  char message[4096] = "";
  const PJRT_Api* api = NULL;
  if (path != NULL) {
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
      snprintf(message, sizeof(message), "%s", dlerror());
    } else {
      typedef const PJRT_Api* (*get_api_fn)(void);
      get_api_fn get_api = (get_api_fn)dlsym(handle, "GetPjrtApi");
      if (get_api == NULL) {
        snprintf(message, sizeof(message), "%s has no GetPjrtApi symbol: not a PJRT plugin", path);
      } else if ((api = get_api()) == NULL) {
        snprintf(message, sizeof(message), "GetPjrtApi in %s returned NULL", path);
      }
    }
  }
  Py_DECREF(encoded);
  if (path == NULL) return NULL;
  if (api == NULL) {
    PyErr_Format(g_plugin_load_error, "cannot load PJRT plugin %S: %s", path_obj, message);
    return NULL;
  }
  if (!api_remember(api)) {
    PyErr_Format(PyExc_RuntimeError, "cannot load PJRT plugin %S: %d plugins already loaded",
                 path_obj, KNOWN_APIS);
    return NULL;
  }
  return PyLong_FromVoidPtr((void*)api);
}
