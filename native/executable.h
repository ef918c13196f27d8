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
  PJRT_Device* device; /* the one device of a one-device program, or NULL */
  /* The memory its parameters are read from (the device's default), or NULL:
   * then only the device is compared on the fast path. */
  PJRT_Memory* memory;
  int blocked; /* every call takes the Python path (see executable.c) */
} ExecutableCoreObject;

static PyTypeObject* LoadedType;
static PyTypeObject* ExecutableCoreType;

#endif
