/* Python host callbacks: the XLA FFI handler that runs a Python function.
 *
 * A program calls `stablehlo.custom_call @name(...) {api_version = 4 : i32}`;
 * the plugin calls the handler registered under `name` on one of its threads
 * (or inline, on the dispatching thread) with an XLA FFI call frame. The call
 * frame does not carry the target's name, so each name gets a handler of its
 * own: a fixed pool of HC_SLOTS trampolines, each passing its slot number to
 * hc_handle(). Registration with XLA is permanent, but the Python function
 * in a slot can be replaced.
 *
 * Slot 0 is the router for jax's callbacks (pjrt_py.jit): jax numbers its
 * callbacks with an `index` attribute; pjrt_py rewrites that to a key of its
 * own and maps keys to the callables in g_hc_routes.
 *
 * A call: enter the gate (never Python once the exit sequence has begun),
 * take the GIL, wrap each operand as a read-only numpy array, call the
 * function with the custom call's attributes as keyword arguments, check each
 * returned array's shape and dtype against the result buffer and copy it in.
 * Any failure returns an XLA FFI error whose message names the callback; the
 * plugin fails the execution with it, so it surfaces as a PjrtError where the
 * results are read. Exceptions never propagate into the plugin.
 *
 * Operands are views of XLA's memory, valid during the call only. A view (or
 * an array derived from it) still referenced when the function returns would
 * read freed memory later, so the call fails instead ("copy=True", or
 * np.array(x) inside the function, keeps the data). Derived views name the
 * same base object (numpy collapses bases to the first non-array), so one
 * reference count per call detects every escape.
 *
 * That is the CPU handler (hc_handle), which uses XLA's buffers in place. On
 * a GPU plugin they are device memory: the staged handler of
 * host_callback_gpu.c copies them to host memory and back around the same
 * hc_call().
 *
 * The call frame's layout is in host_callback.h; the attributes are read in
 * host_callback_attrs.c, the operands and results in host_callback_values.c. */

#include "host_callback.h"

typedef struct {
  PyObject* fn;   /* the function; NULL: free slot */
  PyObject* name; /* str, for messages */
  int copy;       /* operands copied rather than viewed */
} hc_slot;

static hc_slot g_hc_slots[HC_SLOTS];
static PyObject* g_hc_routes;             /* dict: key -> jax's callable (slot 0) */
static PyObject* g_hc_format_error;       /* (name, exception) -> str */
static long g_hc_calls = 0; /* completed calls into Python, for tests */

/* A failed call: what to tell XLA. */
typedef struct {
  int code;
  char* message; /* malloc'd; NULL: no failure */
} hc_failure;

static void hc_fail(hc_failure* f, int code, PyObject* text) {
  if (f->message != NULL || text == NULL) {
    Py_XDECREF(text);
    return;
  }
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);
  if (utf8 == NULL) {
    PyErr_Clear();
    utf8 = "host callback failed (message not printable)";
    size = (Py_ssize_t)strlen(utf8);
  }
  f->message = (char*)malloc((size_t)size + 1);
  if (f->message != NULL) {
    memcpy(f->message, utf8, (size_t)size);
    f->message[size] = '\0';
  }
  f->code = code;
  Py_DECREF(text);
}

/* The Python exception now set, as a failure (its message from the hook, with
 * the traceback summary). A KeyboardInterrupt is delivered again to the main
 * thread, so Ctrl-C is not swallowed by a plugin thread. */
static void hc_fail_exception(hc_failure* f, PyObject* name, int code) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
  int interrupt = value != NULL && PyErr_GivenExceptionMatches(value, PyExc_KeyboardInterrupt);
  PyObject* text = NULL;
  if (g_hc_format_error != NULL && value != NULL)
    text = PyObject_CallFunctionObjArgs(g_hc_format_error, name, value, NULL);
  if (text == NULL || !PyUnicode_Check(text)) {
    PyErr_Clear();
    Py_XDECREF(text);
    text = PyUnicode_FromFormat("host callback %R raised an exception", name);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  hc_fail(f, interrupt ? HC_CANCELLED : code, text);
  if (interrupt) PyErr_SetInterrupt();
  PyErr_Clear();
}

/* ---- the call ------------------------------------------------------------ */

static void hc_run(int slot, const hc_frame* frame, hc_failure* failure) {
  PyObject *fn = NULL, *name = NULL, *kwargs = NULL;
  int copy = 1, jax_style = slot == 0;
  if (jax_style) {
    unsigned long long key = 0;
    PyObject* k = hc_route_key(&frame->attrs, &key) == 0 ? PyLong_FromUnsignedLongLong(key) : NULL;
    fn = k && g_hc_routes ? PyDict_GetItemWithError(g_hc_routes, k) : NULL;
    Py_XINCREF(fn);
    name = k ? PyUnicode_FromFormat("jax callback %S", k) : NULL;
    Py_XDECREF(k);
  } else {
    fn = g_hc_slots[slot].fn;
    name = g_hc_slots[slot].name;
    copy = g_hc_slots[slot].copy;
    Py_XINCREF(fn);
    Py_XINCREF(name);
  }
  if (name == NULL) {
    PyErr_Clear();
    name = PyUnicode_FromString("?");
  }
  if (fn == NULL) {
    PyErr_Clear();
    hc_fail(failure, HC_NOT_FOUND,
            PyUnicode_FromFormat("host callback %R no longer exists (its executable was freed, "
                                 "or it belongs to another process)",
                                 name));
    Py_XDECREF(name);
    return;
  }
  PyObject* guard = copy ? NULL : PyObject_CallNoArgs((PyObject*)&PyBaseObject_Type);
  PyObject* args = (copy || guard) ? hc_operands(frame, guard, jax_style, name) : NULL;
  if (args != NULL && !jax_style && frame->attrs.size > 0) {
    kwargs = hc_attrs_dict(&frame->attrs, 0);
    if (kwargs == NULL) Py_CLEAR(args);
  }
  PyObject* out = args ? PyObject_Call(fn, args, kwargs) : NULL;
  Py_XDECREF(args);
  Py_XDECREF(kwargs);
  if (out == NULL) {
    hc_fail_exception(failure, name, HC_UNKNOWN);
  } else {
    if (hc_results(frame, out, jax_style, name) < 0)
      hc_fail_exception(failure, name, HC_INVALID_ARGUMENT);
    Py_DECREF(out);
  }
  if (guard != NULL && Py_REFCNT(guard) > 1 && failure->message == NULL) {
    hc_fail(failure, HC_FAILED_PRECONDITION,
            PyUnicode_FromFormat(
                "host callback %R kept a reference to one of its operands after returning; "
                "operands are views of the program's memory, valid during the call only: copy "
                "what you keep (np.array(x)), or register the callback with copy=True",
                name));
  }
  Py_XDECREF(guard);
  Py_DECREF(fn);
  Py_DECREF(name);
  __atomic_add_fetch(&g_hc_calls, 1, __ATOMIC_RELAXED);
}

static void* hc_error(const hc_frame* frame, int code, const char* message) {
  hc_error_args a = {sizeof(a), NULL, message, code};
  return frame->api->error_create(&a);
}

typedef struct {
  int slot;
  const hc_frame* frame;
  hc_failure* failure;
} hc_call_args;

/* With the GIL (gate_call). */
static void hc_enter(void* arg) {
  hc_call_args* call = (hc_call_args*)arg;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb); /* an inline call may come with an exception set */
  t_in_host_callback++;
  hc_run(call->slot, call->frame, call->failure);
  t_in_host_callback--;
  PyErr_Restore(type, value, tb);
}

/* Runs the slot's function on `frame`, whose buffers are host memory: NULL,
 * or the XLA FFI error that fails the execution. */
static void* hc_call(int slot, const hc_frame* frame) {
  hc_failure failure = {0, NULL};
  hc_call_args call = {slot, frame, &failure};
  if (!gate_call(hc_enter, &call))
    return hc_error(frame, HC_UNAVAILABLE,
                    "pjrt_py: the interpreter is exiting; the host callback was not run");
  if (failure.message == NULL) {
    if (failure.code == 0) return NULL;
    return hc_error(frame, HC_UNKNOWN, "host callback failed (out of memory for its message)");
  }
  void* error = hc_error(frame, failure.code, failure.message);
  free(failure.message);
  return error;
}

/* The CPU handler: operands and results are host memory, used in place. */
static void* hc_handle(int slot, hc_frame* frame) {
  if (ffi_answer_metadata(frame->extension_start)) return NULL;
  return hc_call(slot, frame);
}

HC_POOL(hc_t_, hc_handle)
static void* (*const hc_trampolines[HC_SLOTS])(hc_frame*) = {HC_NAMES(hc_t_)};

/* ---- Python entry points ------------------------------------------------- */

/* host_callback_setup(dtypes: {xla type: dtype}, routes: dict, format_error) -> slots */
static PyObject* core_host_callback_setup(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *dtypes, *routes, *format_error;
  if (!PyArg_ParseTuple(args, "O!O!O:host_callback_setup", &PyDict_Type, &dtypes, &PyDict_Type,
                        &routes, &format_error))
    return NULL;
  PyObject *key, *value; /* the dtypes, which size XLA's buffers, do not change once set */
  Py_ssize_t pos = 0;
  while (PyDict_Next(dtypes, &pos, &key, &value)) {
    long code = PyLong_AsLong(key);
    if (code <= 0 || code >= HC_MAX_TYPE || !dtype_is_plain(value)) {
      PyErr_Clear();
      PyErr_SetString(PyExc_ValueError, "host_callback_setup: bad dtype entry");
      return NULL;
    }
    if (g_hc_routes != NULL && (g_hc_dtype[code] == NULL ||
                                !PyArray_EquivTypes((PyArray_Descr*)g_hc_dtype[code],
                                                    (PyArray_Descr*)value))) {
      PyErr_SetString(PyExc_RuntimeError, "host_callback_setup: the dtypes set cannot change");
      return NULL;
    }
    Py_INCREF(value);
    PJRT_PY_SETREF(g_hc_dtype[code], value);
  }
  Py_INCREF(routes);
  PJRT_PY_SETREF(g_hc_routes, routes);
  Py_INCREF(format_error);
  PJRT_PY_SETREF(g_hc_format_error, format_error);
  return PyLong_FromLong(HC_SLOTS);
}

/* host_callback_set(slot, fn, name, copy) -> the slot's handler address.
 * fn None frees the slot's function (calls then fail as "no longer exists"). */
static PyObject* core_host_callback_set(PyObject* self, PyObject* args) {
  (void)self;
  int slot, copy;
  PyObject *fn, *name;
  if (!PyArg_ParseTuple(args, "iOUp:host_callback_set", &slot, &fn, &name, &copy)) return NULL;
  if (slot < 0 || slot >= HC_SLOTS) return PyErr_Format(PyExc_ValueError, "no slot %d", slot);
  hc_slot* s = &g_hc_slots[slot];
  Py_INCREF(name);
  PJRT_PY_SETREF(s->name, name);
  if (fn == Py_None) {
    Py_CLEAR(s->fn);
  } else {
    Py_INCREF(fn);
    PJRT_PY_SETREF(s->fn, fn);
  }
  s->copy = copy;
  return PyLong_FromVoidPtr((void*)hc_trampolines[slot]);
}

/* How many calls into Python completed (tests count them). */
static PyObject* core_host_callback_calls(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return PyLong_FromLong(__atomic_load_n(&g_hc_calls, __ATOMIC_RELAXED));
}

static PyObject* core_in_host_callback(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return PyBool_FromLong(t_in_host_callback > 0);
}
