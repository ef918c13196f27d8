/* Dispatch: one PJRT execution over rows of pinned Buffers, from the
 * arguments to the promises. The ways into it are ExecutableCore methods:
 * the fast paths of execute_async (executable.c) and execute_sharded(_async)
 * (sharded.c), which share fast_argument's check, and _run for what Python
 * checked. Outputs are made knowing where they live and how they are laid
 * out (outputs.c).
 */
#include "executable.h"

/* Pointers kept on the stack per call: a call over up to 16 devices with up
 * to 64 arguments and 64 outputs in all allocates nothing for them. */
#define PJRT_PY_STACK_ROWS 16
#define PJRT_PY_STACK_SLOTS 64

/* The promise of device d's outputs (`outs`, n_out of them, taken). Outputs
 * are made knowing `known` (n_out origins, or NULL); with `eager`, as Buffers
 * now, else a single output is made into a Buffer when first asked for. */
static PyObject* promise_of_row(ExecutableCoreObject* self, pjrt_py_client* c, PJRT_Buffer** outs,
                                size_t n_out, const buffer_origin* known, bool eager) {
  if (n_out == 1 && !eager) {
    PyObject* meta = self->out_metas ? PyTuple_GetItem(self->out_metas, 0) : NULL;
    PyObject* promise = promise_of_output(self->client, c, outs[0], meta, known);
    outs[0] = NULL;
    return promise;
  }
  PyObject* buffers = PyTuple_New((Py_ssize_t)n_out);
  for (size_t o = 0; buffers != NULL && o < n_out; ++o) {
    PyObject* meta = self->out_metas ? PyTuple_GetItem(self->out_metas, (Py_ssize_t)o) : NULL;
    BufferObject* b = buffer_wrap(self->client, c, outs[o], meta, known ? known[o].device : NULL);
    outs[o] = NULL;
    if (b == NULL) {
      Py_CLEAR(buffers);
      break;
    }
    buffer_set_origin(b, known ? &known[o] : NULL);
    PyTuple_SetItem(buffers, (Py_ssize_t)o, (PyObject*)b);
  }
  PyObject* promise = buffers ? promise_of_buffers(buffers, (int)n_out) : NULL;
  Py_XDECREF(buffers);
  return promise;
}

/* An argument of a call: a Buffer, or a promise of one output not yet made
 * into a Buffer (PromiseObject.raw; a chained result, used as is: making its
 * Buffer would cost more than the call's own share). A pin on such a promise
 * moves to its Buffer if another thread makes one while the call runs
 * (promise_at), so the call unpins wherever the pin is by then. */
static PJRT_Buffer* arg_handle(PyObject* a) {
  if (Py_TYPE(a) == BufferType) return ((BufferObject*)a)->buf;
  PromiseObject* p = (PromiseObject*)a;
  return p->raw != NULL ? p->raw : p->one->buf;
}

/* Whether the argument may be used now (with the GIL). */
static bool arg_live(PyObject* a) {
  if (Py_TYPE(a) != BufferType) {
    PromiseObject* p = (PromiseObject*)a;
    if (p->raw != NULL) return true;
    a = (PyObject*)p->one;
    if (a == NULL) return false;
  }
  return ((BufferObject*)a)->state == BUF_LIVE && ((BufferObject*)a)->buf != NULL;
}

/* Pins a live argument (arg_live, with nothing run since). */
static void arg_pin(PyObject* a) {
  PromiseObject* p = (PromiseObject*)a;
  if (Py_TYPE(a) == BufferType) {
    ((BufferObject*)a)->pins++;
  } else if (p->raw != NULL) {
    p->raw_pins++;
  } else {
    p->one->pins++;
  }
}

static void arg_unpin(PyObject* a) {
  PromiseObject* p = (PromiseObject*)a;
  if (Py_TYPE(a) == BufferType) {
    buffer_unpin((BufferObject*)a);
  } else if (p->raw != NULL) {
    p->raw_pins--;
  } else {
    buffer_unpin(p->one);
  }
}

/* One PJRT execution over n_dev rows of n_args pinned arguments (arg_*).
 * Writes n_dev new promises to `promises`; returns -1 with an exception (and
 * no promise) on failure. With the GIL; releases it around Execute. */
static int execute_rows(ExecutableCoreObject* self, LoadedObject* loaded, PyObject** args,
                        size_t n_dev, size_t n_args, const int64_t* refused, size_t n_refused,
                        PyObject** promises) {
  pjrt_py_client* c = loaded->c;
  size_t n_out = (size_t)self->num_outputs;
  PJRT_Buffer* arg_stack[PJRT_PY_STACK_SLOTS];
  PJRT_Buffer* out_stack[PJRT_PY_STACK_SLOTS];
  PJRT_Buffer* const* arg_lists_stack[PJRT_PY_STACK_ROWS];
  PJRT_Buffer** out_lists_stack[PJRT_PY_STACK_ROWS];
  PJRT_Event* events_stack[PJRT_PY_STACK_ROWS];
  size_t total_args = n_dev * n_args, total_outs = n_dev * n_out;
  bool small = total_args <= PJRT_PY_STACK_SLOTS && total_outs <= PJRT_PY_STACK_SLOTS &&
               n_dev <= PJRT_PY_STACK_ROWS;
  PJRT_Buffer** ptrs = small ? arg_stack : PyMem_Calloc(total_args + 1, sizeof(PJRT_Buffer*));
  PJRT_Buffer** outs = small ? out_stack : PyMem_Calloc(total_outs + 1, sizeof(PJRT_Buffer*));
  PJRT_Buffer* const** arg_lists = small ? arg_lists_stack : PyMem_Calloc(n_dev, sizeof(void*));
  PJRT_Buffer*** out_lists = small ? out_lists_stack : PyMem_Calloc(n_dev, sizeof(void*));
  PJRT_Event** events = small ? events_stack : PyMem_Calloc(n_dev, sizeof(PJRT_Event*));
  int result = -1;
  if (!ptrs || !outs || !arg_lists || !out_lists || !events) {
    PyErr_NoMemory();
    goto done;
  }
  for (size_t i = 0; i < total_args; ++i) ptrs[i] = arg_handle(args[i]);
  for (size_t d = 0; d < n_dev; ++d) {
    arg_lists[d] = ptrs + d * n_args;
    out_lists[d] = outs + d * n_out;
    events[d] = NULL;
  }
  PJRT_ExecuteOptions options = {0};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  options.non_donatable_input_indices = refused;
  options.num_non_donatable_input_indices = n_refused;
  PJRT_LoadedExecutable_Execute_Args run = {0};
  run.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  run.executable = loaded->exe;
  run.options = &options;
  run.argument_lists = arg_lists;
  run.num_devices = n_dev;
  run.num_args = n_args;
  run.output_lists = out_lists;
  /* Always asked for: effects_barrier() and the exit sequence count them. */
  run.device_complete_events = events;
  PJRT_Error* error;
  Py_BEGIN_ALLOW_THREADS
  error = c->api->PJRT_LoadedExecutable_Execute(&run);
  if (error == NULL) completion_track(c, events, n_dev);
  Py_END_ALLOW_THREADS
  if (error != NULL) {
    /* The plugin ran the program as it dispatched it (XLA's CPU client runs
     * cheap programs inline) and the program failed, e.g. a host callback
     * raised. As a failure found later would, it goes to the promises:
     * reading them raises it. (Arguments were checked before the call.) */
    PyObject* exc = error_from_pjrt(c->api, error);
    if (exc == NULL) goto done;
    result = 0;
    for (size_t d = 0; d < n_dev; ++d) {
      promises[d] = result == 0 ? promise_failed(c, exc, (int)n_out) : NULL;
      if (promises[d] == NULL) result = -1;
    }
    Py_DECREF(exc);
    if (result < 0)
      for (size_t d = 0; d < n_dev; ++d) Py_CLEAR(promises[d]);
    goto done;
  }
  /* Donated arguments stop counting before the outputs count (accounting.c).
   * Only _run runs a program that donates (blocked), and only on Buffers. */
  if (self->blocked) acct_donated(c->api, (BufferObject**)args, total_args);
  /* The first execution's outputs are made as Buffers at once, and what
   * they are learned from them (outputs.c); later ones are made knowing it. */
  const buffer_origin* known = outputs_known(loaded, n_dev, n_out);
  bool learn = known == NULL && n_out > 0 && self->out_metas != NULL;
  result = 0;
  for (size_t d = 0; d < n_dev; ++d) {
    PyObject* promise = NULL;
    if (result == 0 && n_out == 0) {
      promise = promise_of_completion(c, events[d]);
      events[d] = NULL;
    } else if (result == 0) {
      promise = promise_of_row(self, c, outs + d * n_out, n_out, known ? known + d * n_out : NULL,
                               learn);
    }
    event_destroy(c->api, events[d]);
    promises[d] = promise;
    if (promise == NULL) result = -1;
  }
  if (result == 0 && learn) outputs_learn(loaded, (PromiseObject**)promises, n_dev, n_out);
  if (result < 0) { /* drop what was made; free outputs not wrapped yet */
    for (size_t d = 0; d < n_dev; ++d) Py_CLEAR(promises[d]);
    for (size_t i = 0; i < total_outs; ++i) {
      if (outs[i] == NULL) continue;
      buffer_handle_destroy(c->api, outs[i]);
    }
  }
done:
  if (!small) {
    PyMem_Free(ptrs);
    PyMem_Free(outs);
    PyMem_Free((void*)arg_lists);
    PyMem_Free(out_lists);
    PyMem_Free(events);
  }
  return result;
}

/* A promise's output not made into a Buffer yet, if this call may use it as
 * it is: everything the checks below ask of a Buffer was known when it was
 * made (buffer_origin). NULL: make the Buffer and check that instead. */
static PyObject* fast_raw(PromiseObject* p, pjrt_py_client* c, PyObject* expect,
                          PJRT_Device* device, PJRT_Memory* memory) {
  const buffer_origin* o = &p->raw_origin;
  if (p->c != c || p->raw_meta != expect || (c->cpu && o->row_major != 1)) return NULL;
  if (memory != NULL ? o->memory != memory : (device != NULL && o->device != device)) return NULL;
  return (PyObject*)p;
}

/* The argument (borrowed) as this call may use it: a Buffer, or a promise of
 * one output not yet made into a Buffer (arg_*); NULL if it is neither, or is
 * not right for the call. `device`: the program's one device, `memory` the
 * memory it reads its parameters from, or NULL (a buffer elsewhere goes to
 * Python, which says so before anything runs). The memory, where known, is
 * compared instead of the device: it belongs to that one device, and both
 * are one cached pointer. */
static PyObject* fast_argument(PyObject* arg, pjrt_py_client* c, PyObject* expect,
                               PJRT_Device* device, PJRT_Memory* memory) {
  BufferObject* b;
  if (Py_TYPE(arg) == BufferType) {
    b = (BufferObject*)arg;
  } else if (Py_TYPE(arg) == BufferPromiseType && ((PromiseObject*)arg)->kind == PROMISE_BUFFERS &&
             promise_visible((PromiseObject*)arg) == 1) {
    PromiseObject* p = (PromiseObject*)arg;
    if (p->raw != NULL) {
      PyObject* raw = fast_raw(p, c, expect, device, memory);
      if (raw != NULL) return raw;
    }
    b = promise_at(p, 0);
    if (b == NULL) {
      PyErr_Clear();
      return NULL;
    }
  } else {
    return NULL;
  }
  if (b->c != c || b->state != BUF_LIVE || b->buf == NULL) return NULL;
  if (memory != NULL) {
    if (buffer_memory(b) != memory) return NULL;
  } else if (device != NULL && buffer_device(b) != device) {
    return NULL;
  }
  if (b->meta != expect &&
      (b->meta == NULL || PyObject_RichCompareBool(b->meta, expect, Py_EQ) != 1)) {
    PyErr_Clear();
    return NULL;
  }
  /* On CPU a program reads its parameters row-major (a program that asks for
   * other layouts is blocked): a buffer in another layout, such as a program's
   * column-major output, would be read wrong, so Python relays it out. */
  if (c->cpu && b->row_major != 1 &&
      buffer_row_major_state(b, (size_t)PyTuple_Size(PyTuple_GetItem(expect, 0))) != 1)
    return NULL;
  return (PyObject*)b;
}

/* Pins `args`, holds the executable and client for the call, runs; see
 * execute_rows. `checked`: the caller has just checked that the client takes
 * work and every argument is live, with nothing run since (the fast path). */
static int run_pinned(ExecutableCoreObject* self, PyObject** args, size_t n_dev,
                      size_t n_args, const int64_t* refused, size_t n_refused,
                      PyObject** promises, bool checked) {
  LoadedObject* loaded = self->loaded;
  if (loaded == NULL) {
    PyErr_SetString(PyExc_ValueError, "executable has been deleted");
    return -1;
  }
  size_t total = n_dev * n_args, pinned = 0;
  int result = -1;
  if (dispatch_admit(loaded->c) < 0) return -1; /* inside a host callback (admission.c) */
  if (checked) {
    client_enter_checked(loaded->c);
  } else if (client_enter(loaded->c, "executable") < 0) {
    return -1;
  }
  Py_INCREF(loaded);
  for (; pinned < total; ++pinned) {
    if (checked) {
      arg_pin(args[pinned]);
    } else if (buffer_pin((BufferObject*)args[pinned]) < 0) { /* _run: Buffers only */
      goto done;
    }
  }
  result = execute_rows(self, loaded, args, n_dev, n_args, refused, n_refused, promises);
done:
  for (size_t i = 0; i < pinned; ++i) arg_unpin(args[i]);
  client_leave(loaded->c);
  Py_DECREF(loaded);
  return result;
}
