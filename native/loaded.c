/* Loaded: owns one PJRT_LoadedExecutable (and its PJRT_Executable), shared by
 * the Executables of one compiled program; freed with the object. A call
 * holds it for its duration, so delete() from another thread cannot free it
 * under PJRT. */
#include "executable.h"

/* Destroys an executable no Loaded took, made by `c` (held by the caller). */
static void loaded_handle_destroy(pjrt_py_client* c, PJRT_LoadedExecutable* exe) {
  if (c == NULL || !state_pjrt_allowed(c)) return; /* exiting or forked: it leaks */
  PJRT_LoadedExecutable_Destroy_Args args = {0};
  args.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
  args.executable = exe;
  error_destroy(c->api, c->api->PJRT_LoadedExecutable_Destroy(&args));
}

/* Loaded(client, address, pin=None): takes a PJRT_LoadedExecutable of
 * client's. `pin`: the token of the client._pin() the executable was made
 * under; if close() ran meanwhile, the executable is destroyed through it
 * (the pin keeps the PJRT client alive) and the call says the client is
 * closed, as every other call racing close() does. */
static PyObject* loaded_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* client;
  PyObject* address;
  PyObject* pin = Py_None;
  if (kwargs != NULL || !PyArg_ParseTuple(args, "OO|O:Loaded", &client, &address, &pin))
    return NULL;
  if (!PyObject_TypeCheck(client, ClientCoreType)) {
    PyErr_SetString(PyExc_TypeError, "Loaded takes a Client");
    return NULL;
  }
  pjrt_py_client* c = ((ClientCoreObject*)client)->c;
  PJRT_LoadedExecutable* exe = (PJRT_LoadedExecutable*)PyLong_AsVoidPtr(address);
  if (exe == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "NULL executable");
    return NULL;
  }
  if (c == NULL) { /* closed (or never attached) while the executable was made */
    if (pin != Py_None && PyCapsule_IsValid(pin, "pjrt_py_client"))
      loaded_handle_destroy((pjrt_py_client*)PyCapsule_GetPointer(pin, "pjrt_py_client"), exe);
    PyErr_SetString(PyExc_ValueError, "client is closed");
    return NULL;
  }
  LoadedObject* self = (LoadedObject*)PyType_GenericAlloc(type, 0);
  if (self == NULL) return NULL; /* the executable leaks: it cannot be freed safely here */
  self->c = c;
  client_ref(c);
  self->exe = exe;
  PJRT_LoadedExecutable_GetExecutable_Args g = {0};
  g.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE;
  g.loaded_executable = exe;
  PJRT_Error* error = c->api->PJRT_LoadedExecutable_GetExecutable(&g);
  if (error != NULL) {
    Py_DECREF(self);
    return raise_pjrt(c->api, error);
  }
  self->unloaded = g.executable;
  return (PyObject*)self;
}

static void loaded_dealloc(LoadedObject* self) {
  pjrt_py_client* c = self->c;
  if (c != NULL && state_pjrt_allowed(c)) {
    const PJRT_Api* api = c->api;
    if (self->unloaded != NULL) {
      PJRT_Executable_Destroy_Args args = {0};
      args.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
      args.executable = self->unloaded;
      error_destroy(api, api->PJRT_Executable_Destroy(&args));
    }
    PJRT_LoadedExecutable_Destroy_Args args = {0};
    args.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
    args.executable = self->exe;
    error_destroy(api, api->PJRT_LoadedExecutable_Destroy(&args));
  }
  if (c != NULL) client_unref(c);
  PyMem_Free(self->origins);
  PyTypeObject* type = Py_TYPE(self);
  PyObject_Free(self);
  Py_DECREF(type);
}

/* The addresses the cffi layer queries; valid while this object lives. */
static PyObject* loaded_get_address(LoadedObject* self, void* unused) {
  (void)unused;
  return PyLong_FromVoidPtr(self->exe);
}

static PyObject* loaded_get_executable(LoadedObject* self, void* unused) {
  (void)unused;
  return PyLong_FromVoidPtr(self->unloaded);
}

static PyGetSetDef loaded_getset[] = {
    {"address", (getter)loaded_get_address, NULL, "The PJRT_LoadedExecutable*.", NULL},
    {"executable", (getter)loaded_get_executable, NULL, "Its PJRT_Executable*.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot loaded_slots[] = {
    {Py_tp_doc, "Owns one compiled program (PJRT_LoadedExecutable); freed with the object."},
    {Py_tp_new, loaded_new},
    {Py_tp_dealloc, loaded_dealloc},
    {Py_tp_getset, loaded_getset},
    {0, NULL},
};

static PyType_Spec loaded_spec = {"pjrt_py._core.Loaded", sizeof(LoadedObject), 0,
                                  Py_TPFLAGS_DEFAULT, loaded_slots};

