/* Which extensions a plugin carries: the types in its PJRT_Api extension
 * chain, in order (pjrt_py.runtime.plugin.Plugin.extensions names them). Read-only:
 * pjrt_py uses an extension through the file of its concept (ffi.c,
 * stream.c, ...). */
#include "common.h"

/* plugin_extensions(api) -> [type, ...] */
static PyObject* core_plugin_extensions(PyObject* self, PyObject* address) {
  (void)self;
  const PJRT_Api* api = address_of_api(address);
  if (api == NULL) return NULL;
  PyObject* types = PyList_New(0);
  int guard = 0; /* a chain that loops is not followed forever */
  for (PJRT_Extension_Base* e = api->extension_start; e != NULL && types != NULL; e = e->next) {
    PyObject* type = PyLong_FromLong((long)e->type);
    if (type == NULL || PyList_Append(types, type) < 0 || ++guard > 256) {
      Py_XDECREF(type);
      Py_CLEAR(types);
      if (guard > 256) PyErr_SetString(PyExc_ValueError, "the plugin's extension chain loops");
      break;
    }
    Py_DECREF(type);
  }
  return types;
}
