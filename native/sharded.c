/* The fast path of execute_sharded_async and execute_sharded: a program over
 * several devices (replicated, partitioned, or both) run from the call to
 * its promises in C, as execute_async runs a one-device program.
 *
 * It takes a call whose per_device_args is a list (or tuple) of one list (or
 * tuple) per device, every argument a live Buffer (or a one-buffer
 * BufferPromise) of this client with the compiled (shape, dtype), already on
 * its row's device, in the memory the program reads parameters from there:
 * per argument, pointer compares against what _attach cached (the devices
 * and memories) and what the Buffer knows of itself (buffer_origin). No
 * keyword but non_donatable=None; a program that donates nothing.
 *
 * Everything else (host values, other frameworks' arrays, a wrong count,
 * type, shape or device, a dead buffer, donation, a deleted executable or a
 * closed client) goes to Executable._execute_sharded_async_slow, which
 * checks, explains and transfers exactly as before this path existed.
 *
 * Lifetimes: every argument taken (a Buffer, or a promise whose output is
 * used as it is, dispatch.c) is held (a new reference) from the moment it is
 * found until the call is made, and the rows while they are read: making a
 * Buffer of a promise may run the garbage collector, and with it Python that
 * could empty the caller's lists or delete() an argument. So after the
 * arguments are collected, the executable, the client and every argument
 * are checked again, with nothing run since, before they are pinned
 * (run_pinned) and the GIL is released around Execute.
 */
#include "executable.h"

static PyObject* g_non_donatable; /* the keyword's interned name */

/* Item i of a list or tuple (borrowed), or NULL. */
static PyObject* sequence_item(PyObject* seq, Py_ssize_t i) {
  return PyList_CheckExact(seq) ? PyList_GetItem(seq, i) : PyTuple_GetItem(seq, i);
}

/* The length of an exact list or tuple, or -1 for anything else. */
static Py_ssize_t sequence_size(PyObject* seq) {
  if (PyList_CheckExact(seq)) return PyList_Size(seq);
  if (PyTuple_CheckExact(seq)) return PyTuple_Size(seq);
  return -1;
}

/* Whether the keywords of a call are none, or non_donatable=None. */
static bool sharded_keywords_plain(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (kwnames == NULL) return true;
  if (PyTuple_Size(kwnames) != 1 || args[nargs] != Py_None) return false;
  PyObject* name = PyTuple_GetItem(kwnames, 0);
  if (name == g_non_donatable) return true;
  int same = PyUnicode_Compare(name, g_non_donatable);
  PyErr_Clear();
  return same == 0;
}

/* Takes each argument of `rows` (n_dev rows of n_args) that the fast path may
 * use into `bufs`, device-major, each with a new reference. Returns how many
 * were taken: all of them, or fewer where one is not for the fast path. */
static size_t sharded_collect(ExecutableCoreObject* self, pjrt_py_client* c, PyObject* rows,
                              Py_ssize_t n_dev, Py_ssize_t n_args, PyObject** bufs) {
  size_t taken = 0;
  for (Py_ssize_t d = 0; d < n_dev; ++d) {
    PyObject* row = sequence_item(rows, d);
    if (row == NULL || sequence_size(row) != n_args) return taken;
    Py_INCREF(row);
    for (Py_ssize_t i = 0; i < n_args; ++i) {
      PyObject* arg = sequence_item(row, i);
      PyObject* b = arg == NULL ? NULL
                                : fast_argument(arg, c, PyTuple_GetItem(self->expect, i),
                                                self->devices[d], self->memories[d]);
      if (b == NULL) {
        Py_DECREF(row);
        return taken;
      }
      Py_INCREF(b);
      bufs[taken++] = b;
    }
    Py_DECREF(row);
  }
  return taken;
}

/* The fast path: 1 if it took the call (*out: the list of promises, or NULL
 * with the exception that refused it), 0 if the call is not for it (nothing
 * raised, nothing run). */
static int sharded_fast(ExecutableCoreObject* self, PyObject* const* args, Py_ssize_t nargs,
                        PyObject* kwnames, PyObject** out) {
  LoadedObject* loaded = self->loaded;
  if (nargs != 1 || self->blocked || loaded == NULL || self->expect == NULL ||
      self->devices == NULL || !sharded_keywords_plain(args, nargs, kwnames))
    return 0;
  Py_ssize_t n_dev = self->num_devices, n_args = PyTuple_Size(self->expect);
  if (n_dev < 1 || sequence_size(args[0]) != n_dev || n_args < 0) return 0;
  size_t total = (size_t)(n_dev * n_args);
  PyObject* stack[PJRT_PY_STACK_SLOTS]; /* the arguments (dispatch.c: arg_*) */
  PyObject* promise_stack[PJRT_PY_STACK_ROWS];
  bool small = total <= PJRT_PY_STACK_SLOTS && n_dev <= PJRT_PY_STACK_ROWS;
  PyObject** bufs = small ? stack : PyMem_Calloc(total + 1, sizeof(PyObject*));
  PyObject** promises = small ? promise_stack : PyMem_Calloc((size_t)n_dev, sizeof(PyObject*));
  int took = 0;
  size_t taken = 0;
  if (bufs == NULL || promises == NULL) goto done;
  taken = sharded_collect(self, loaded->c, args[0], n_dev, n_args, bufs);
  /* Checked again: collecting may have run Python (see above). */
  if (taken != total || self->loaded != loaded || state_check_usable(loaded->c, "executable") < 0)
    goto done;
  for (size_t i = 0; i < total; ++i)
    if (!arg_live(bufs[i])) goto done;
  took = 1;
  *out = NULL;
  /* -1: refused before the plugin saw it (admission, inside a host callback). */
  if (run_pinned(self, bufs, (size_t)n_dev, (size_t)n_args, NULL, 0, promises, true) < 0) goto done;
  *out = PyList_New(n_dev);
  for (Py_ssize_t d = 0; d < n_dev; ++d) {
    if (*out != NULL) {
      PyList_SetItem(*out, d, promises[d]); /* steals */
    } else {
      Py_DECREF(promises[d]);
    }
  }
done:
  if (!took) clear_for_fallback();
  for (size_t i = 0; i < taken; ++i) Py_DECREF(bufs[i]);
  if (!small) {
    PyMem_Free(bufs);
    PyMem_Free(promises);
  }
  return took;
}

static PyObject* executable_execute_sharded_async(ExecutableCoreObject* self,
                                                  PyObject* const* args, Py_ssize_t nargs,
                                                  PyObject* kwnames) {
  PyObject* promises = NULL;
  if (sharded_fast(self, args, nargs, kwnames, &promises)) return promises;
  return call_python_method((PyObject*)self, "_execute_sharded_async_slow", args, nargs, kwnames);
}

/* A list of the Buffers of promise `p`, which is done. */
static PyObject* promise_buffer_list(PromiseObject* p) {
  PyObject* buffers = buffer_promise_get_buffers(p, NULL);
  if (buffers == NULL) return NULL;
  PyObject* list = PySequence_List(buffers);
  Py_DECREF(buffers);
  return list;
}

/* execute_sharded: execute_sharded_async, then every promise waited for (the
 * first error raised), then one list of output Buffers per device. */
static PyObject* executable_execute_sharded(ExecutableCoreObject* self, PyObject* const* args,
                                            Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* promises = executable_execute_sharded_async(self, args, nargs, kwnames);
  if (promises == NULL) return NULL;
  Py_ssize_t n = PyList_CheckExact(promises) ? PyList_Size(promises) : -1;
  for (Py_ssize_t d = 0; d < n; ++d) {
    if (!PyObject_TypeCheck(PyList_GetItem(promises, d), BufferPromiseType)) n = -1;
  }
  if (n < 0) {
    Py_DECREF(promises);
    PyErr_SetString(PyExc_TypeError, "execute_sharded_async did not return a list of promises");
    return NULL;
  }
  PyObject* result = NULL;
  for (Py_ssize_t d = 0; d < n; ++d) {
    PyObject* value = promise_value_impl((PromiseObject*)PyList_GetItem(promises, d), -1);
    if (value == NULL) goto done;
    Py_DECREF(value);
  }
  result = PyList_New(n);
  for (Py_ssize_t d = 0; result != NULL && d < n; ++d) {
    PyObject* row = promise_buffer_list((PromiseObject*)PyList_GetItem(promises, d));
    if (row == NULL) {
      Py_CLEAR(result);
    } else {
      PyList_SetItem(result, d, row); /* steals */
    }
  }
done:
  Py_DECREF(promises);
  return result;
}
