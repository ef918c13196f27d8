/* Executables: a compiled program (Loaded, loaded.c) and the dispatch fast
 * path of pjrt_py.Executable (ExecutableCore, executable.c, dispatch.c). */
#ifndef PJRT_PY_EXECUTABLE_H
#define PJRT_PY_EXECUTABLE_H

#include "promise.h"

typedef struct {
  PyObject_HEAD
  pjrt_py_client* c;
  PJRT_LoadedExecutable* exe;
  PJRT_Executable* unloaded;
  /* Where each output lives and how it is laid out, per device and output
   * (device-major), read from the first execution's outputs: a compiled
   * program's outputs are the same every time. Later outputs are made
   * knowing it (outputs.c). NULL until learned. */
  buffer_origin* origins;
  size_t num_origins;
} LoadedObject;

typedef struct {
  PyObject_HEAD
  PyObject* dict;
  PyObject* weakrefs;
  LoadedObject* loaded; /* NULL once deleted */
  PyObject* client;     /* the Python Client */
  PyObject* expect;     /* tuple of interned metas a call must match, or NULL */
  PyObject* out_metas;  /* tuple of output metas, or NULL if unknown */
  Py_ssize_t num_outputs;
  int num_devices;
  /* Per device, in execution order (num_devices each, PyMem): the device,
   * and the memory its parameters are read from there (its default), or
   * NULL: then only the device is compared on the fast path. */
  PJRT_Device** devices;
  PJRT_Memory** memories;
  PJRT_Device* device; /* devices[0] of a one-device program, else NULL */
  PJRT_Memory* memory; /* memories[0] of a one-device program, else NULL */
  int blocked; /* every call takes the Python path (see executable.c) */
} ExecutableCoreObject;

static PyTypeObject* LoadedType;
static PyTypeObject* ExecutableCoreType;

#endif
