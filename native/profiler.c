/* PJRT's profiler extension: a plugin's own record of what it and its devices
 * did, as serialized XSpace (tsl's xplane.proto) that pjrt_py.xspace reads.
 *
 * The extension (PJRT_Extension_Type_Profiler) is a base followed by a
 * pointer to a function table of XLA's plugin profiler API, which has its
 * own error type (not PJRT_Error). Neither header ships with the plugins;
 * the layouts are declared here from XLA's (extension version 1, profiler API
 * version 1). Later versions append: the extension a traceme_context_id (for
 * use as an args extension, which pjrt_py does not do), the API more
 * functions after collect_data. Each struct_size is checked before a pointer
 * past the base is read.
 *
 * A session runs create -> start -> stop -> collect -> destroy. The object
 * below enforces that order (a call out of order raises instead of reaching
 * the plugin), lets one thread at a time in (the plugin's session is not
 * thread-safe), and destroys the session once: at close() or dealloc, never
 * in a forked child (the plugin's threads are not there) nor after the exit
 * sequence has finished.
 */
#include "common.h"

#include <stdlib.h>

#define PROF_END(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

typedef struct prof_session prof_session; /* the plugin's PLUGIN_Profiler */
typedef struct prof_error prof_error;     /* the plugin's PLUGIN_Profiler_Error */

typedef struct {
  size_t struct_size;
  void* priv;
  prof_error* error;
} prof_error_destroy_args;

typedef struct {
  size_t struct_size;
  void* priv;
  const prof_error* error;
  const char* message; /* out, lives as long as the error */
  size_t message_size; /* out */
} prof_error_message_args;

typedef struct {
  size_t struct_size;
  void* priv;
  const prof_error* error;
  int code; /* out */
} prof_error_code_args;

typedef struct {
  size_t struct_size;
  const char* options; /* a serialized tensorflow.ProfileOptions */
  size_t options_size;
  prof_session* profiler; /* out */
} prof_create_args;

typedef struct {
  size_t struct_size;
  prof_session* profiler;
} prof_session_args; /* destroy, start and stop */

typedef struct {
  size_t struct_size;
  prof_session* profiler;
  uint8_t* buffer;             /* in: NULL, or where to write; out: see prof_collect */
  size_t buffer_size_in_bytes; /* out */
} prof_collect_args;

typedef struct {
  size_t struct_size;
  void* priv;
  void (*error_destroy)(prof_error_destroy_args*);
  void (*error_message)(prof_error_message_args*);
  prof_error* (*error_get_code)(prof_error_code_args*);
  prof_error* (*create)(prof_create_args*);
  prof_error* (*destroy)(prof_session_args*);
  prof_error* (*start)(prof_session_args*);
  prof_error* (*stop)(prof_session_args*);
  prof_error* (*collect_data)(prof_collect_args*);
} prof_api;

typedef struct {
  PJRT_Extension_Base base;
  const prof_api* profiler_api;
} prof_extension;

/* The plugin's profiler API, if its chain has one that reaches every function
 * pjrt_py calls; NULL otherwise. */
static const prof_api* prof_find(const PJRT_Api* api) {
  int guard = 0;
  for (PJRT_Extension_Base* e = api->extension_start; e != NULL && ++guard < 256; e = e->next) {
    if (e->type != PJRT_Extension_Type_Profiler) continue;
    if (e->struct_size < PROF_END(prof_extension, profiler_api)) return NULL;
    const prof_api* p = ((const prof_extension*)e)->profiler_api;
    if (p == NULL || p->struct_size < PROF_END(prof_api, collect_data)) return NULL;
    if (!p->error_destroy || !p->error_message || !p->error_get_code || !p->create ||
        !p->destroy || !p->start || !p->stop || !p->collect_data)
      return NULL;
    return p;
  }
  return NULL;
}

/* Raises the PjrtError subclass for the plugin's profiler error (destroying
 * it), its message prefixed with what failed; returns NULL. */
static PyObject* prof_raise(const prof_api* p, prof_error* error, const char* what) {
  prof_error_code_args code_args = {PROF_END(prof_error_code_args, code), p->priv, error,
                                    PJRT_Error_Code_UNKNOWN};
  prof_error* inner = p->error_get_code(&code_args);
  if (inner != NULL) { /* the code could not be read */
    prof_error_destroy_args drop = {PROF_END(prof_error_destroy_args, error), p->priv, inner};
    p->error_destroy(&drop);
    code_args.code = PJRT_Error_Code_UNKNOWN;
  }
  prof_error_message_args m = {PROF_END(prof_error_message_args, message_size), p->priv, error,
                               NULL, 0};
  p->error_message(&m);
  if (m.message == NULL) m.message_size = 0;
  PyObject* text = PyUnicode_DecodeUTF8(m.message ? m.message : "", (Py_ssize_t)m.message_size,
                                        "replace");
  prof_error_destroy_args drop = {PROF_END(prof_error_destroy_args, error), p->priv, error};
  p->error_destroy(&drop);
  if (text == NULL) return NULL;
  PyObject* message = PyUnicode_FromFormat("profiler %s: %U", what, text);
  Py_DECREF(text);
  if (message == NULL) return NULL;
  PyObject* exc = error_for_code(message, (int)code_args.code);
  Py_DECREF(message);
  if (exc != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

/* ---- the session object -------------------------------------------------- */

enum { PROF_CREATED, PROF_STARTED, PROF_STOPPED, PROF_COLLECTED, PROF_CLOSED };
static const char* const prof_state_names[] = {"created", "started", "stopped", "collected",
                                               "closed"};

typedef struct {
  PyObject_HEAD
  const prof_api* p;
  prof_session* session;
  unsigned long generation;
  int state;
  int busy; /* a thread is inside the plugin with this session (set under the GIL) */
} ProfilerObject;

static PyTypeObject* PluginProfilerType;

static int prof_no_plugin_calls(ProfilerObject* self) {
  return self->generation != g_generation || phase() == PHASE_FINISHED;
}

/* 0 if a call that needs state `want` may go to the plugin now (busy is then
 * set); else -1 with an exception. */
static int prof_enter(ProfilerObject* self, int want, const char* what) {
  if (self->generation != g_generation) {
    PyErr_Format(PyExc_RuntimeError,
                 "profiler %s: this session was created before os.fork() in the parent", what);
    return -1;
  }
  if (phase() != PHASE_RUNNING) {
    PyErr_Format(PyExc_RuntimeError, "profiler %s: the interpreter is exiting", what);
    return -1;
  }
  if (self->busy) {
    PyErr_Format(PyExc_RuntimeError, "profiler %s: another thread is using this session", what);
    return -1;
  }
  if (self->state != want) {
    PyErr_Format(PyExc_RuntimeError, "profiler %s: the session is %s, not %s", what,
                 prof_state_names[self->state], prof_state_names[want]);
    return -1;
  }
  self->busy = 1;
  return 0;
}

/* PluginProfiler(api, options): a session of the plugin's profiler, created
 * (not started) with `options`, a serialized ProfileOptions. */
static PyObject* prof_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* address;
  const char* options;
  Py_ssize_t options_size;
  static char* names[] = {"api", "options", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oy#:PluginProfiler", names, &address,
                                   &options, &options_size))
    return NULL;
  const PJRT_Api* api = address_of_api(address);
  if (api == NULL) return NULL;
  const prof_api* p = prof_find(api);
  if (p == NULL) {
    PyErr_SetString(PyExc_ValueError, "the plugin has no usable PJRT profiler extension");
    return NULL;
  }
  if (phase() != PHASE_RUNNING) {
    PyErr_SetString(PyExc_RuntimeError, "profiler create: the interpreter is exiting");
    return NULL;
  }
  ProfilerObject* self = PyObject_New(ProfilerObject, type);
  if (self == NULL) return NULL;
  self->p = p;
  self->session = NULL;
  self->generation = g_generation;
  self->state = PROF_CLOSED; /* until create succeeds: dealloc then destroys nothing */
  self->busy = 0;
  prof_create_args a = {PROF_END(prof_create_args, profiler), options, (size_t)options_size,
                        NULL};
  prof_error* error;
  Py_BEGIN_ALLOW_THREADS
  error = p->create(&a);
  Py_END_ALLOW_THREADS
  if (error != NULL) {
    Py_DECREF(self);
    return prof_raise(p, error, "create");
  }
  if (a.profiler == NULL) {
    Py_DECREF(self);
    PyErr_SetString(PyExc_RuntimeError, "profiler create: the plugin returned no session");
    return NULL;
  }
  self->session = a.profiler;
  self->state = PROF_CREATED;
  return (PyObject*)self;
}

/* Runs start or stop (GIL released) and moves to state `next`. */
static PyObject* prof_step(ProfilerObject* self, int want, int next, const char* what) {
  if (prof_enter(self, want, what) < 0) return NULL;
  const prof_api* p = self->p;
  prof_session_args a = {PROF_END(prof_session_args, profiler), self->session};
  prof_error* error;
  Py_BEGIN_ALLOW_THREADS
  error = (next == PROF_STARTED ? p->start : p->stop)(&a);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (error != NULL) return prof_raise(p, error, what);
  self->state = next;
  Py_RETURN_NONE;
}

static PyObject* prof_start(ProfilerObject* self, PyObject* unused) {
  (void)unused;
  return prof_step(self, PROF_CREATED, PROF_STARTED, "start");
}

static PyObject* prof_stop(ProfilerObject* self, PyObject* unused) {
  (void)unused;
  return prof_step(self, PROF_STARTED, PROF_STOPPED, "stop");
}

/* collect() -> bytes: the serialized XSpace of a stopped session, once.
 *
 * XLA's header asks for two calls (the size, then the bytes into the
 * caller's buffer), but XLA's implementation answers the first call with a
 * buffer of its own (alive until the session is destroyed or collects again)
 * and, on the second, collects from its tracers anew, writing without a
 * bound. So: one call with no buffer; its buffer is copied. Only a plugin
 * that answers with a size and no buffer gets the second call, into a buffer
 * of that size, and a larger answer is refused. */
static PyObject* prof_collect(ProfilerObject* self, PyObject* unused) {
  (void)unused;
  if (prof_enter(self, PROF_STOPPED, "collect") < 0) return NULL;
  const prof_api* p = self->p;
  prof_collect_args a = {PROF_END(prof_collect_args, buffer_size_in_bytes), self->session, NULL,
                         0};
  prof_error* error;
  uint8_t* mine = NULL;
  Py_BEGIN_ALLOW_THREADS
  error = p->collect_data(&a);
  if (error == NULL && a.buffer == NULL && a.buffer_size_in_bytes > 0 &&
      a.buffer_size_in_bytes <= (size_t)PY_SSIZE_T_MAX &&
      (mine = (uint8_t*)malloc(a.buffer_size_in_bytes)) != NULL) {
    size_t room = a.buffer_size_in_bytes;
    a.buffer = mine;
    error = p->collect_data(&a);
    if (error == NULL && a.buffer_size_in_bytes > room) a.buffer = NULL; /* refused below */
  }
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (error != NULL) {
    free(mine);
    return prof_raise(p, error, "collect");
  }
  self->state = PROF_COLLECTED;
  PyObject* data;
  if (a.buffer_size_in_bytes == 0) {
    data = PyBytes_FromStringAndSize("", 0);
  } else if (a.buffer == NULL || a.buffer_size_in_bytes > (size_t)PY_SSIZE_T_MAX) {
    data = PyErr_Format(PyExc_RuntimeError,
                        "profiler collect: the plugin gave %zu bytes and no buffer holding them",
                        a.buffer_size_in_bytes);
  } else {
    data = PyBytes_FromStringAndSize((const char*)a.buffer, (Py_ssize_t)a.buffer_size_in_bytes);
  }
  free(mine);
  return data;
}

/* Stops a started session and destroys it; errors from the plugin are
 * dropped (there is nothing left to do with the session). */
static void prof_destroy(ProfilerObject* self) {
  const prof_api* p = self->p;
  prof_session_args a = {PROF_END(prof_session_args, profiler), self->session};
  int started = self->state == PROF_STARTED;
  self->state = PROF_CLOSED;
  self->session = NULL;
  prof_error_destroy_args drop = {PROF_END(prof_error_destroy_args, error), p->priv, NULL};
  Py_BEGIN_ALLOW_THREADS
  if (started) {
    drop.error = p->stop(&a);
    if (drop.error != NULL) p->error_destroy(&drop);
  }
  drop.error = p->destroy(&a);
  if (drop.error != NULL) p->error_destroy(&drop);
  Py_END_ALLOW_THREADS
}

/* close(): destroys the session (stopping it first if it runs). Idempotent. */
static PyObject* prof_close(ProfilerObject* self, PyObject* unused) {
  (void)unused;
  if (self->state == PROF_CLOSED) Py_RETURN_NONE;
  if (self->busy) {
    PyErr_SetString(PyExc_RuntimeError, "profiler close: another thread is using this session");
    return NULL;
  }
  if (prof_no_plugin_calls(self)) { /* a forked child or a finished exit: leave it */
    self->state = PROF_CLOSED;
    Py_RETURN_NONE;
  }
  self->busy = 1;
  prof_destroy(self);
  self->busy = 0;
  Py_RETURN_NONE;
}

static PyObject* prof_get_state(ProfilerObject* self, void* unused) {
  (void)unused;
  return PyUnicode_FromString(prof_state_names[self->state]);
}

static void prof_dealloc(ProfilerObject* self) {
  if (self->state != PROF_CLOSED && !prof_no_plugin_calls(self)) prof_destroy(self);
  PyTypeObject* type = Py_TYPE(self);
  PyObject_Free(self);
  Py_DECREF(type);
}

/* profiler_available(api) -> whether the plugin's chain has a usable profiler API. */
static PyObject* core_profiler_available(PyObject* module, PyObject* address) {
  (void)module;
  const PJRT_Api* api = address_of_api(address);
  if (api == NULL) return NULL;
  return PyBool_FromLong(prof_find(api) != NULL);
}

static PyMethodDef prof_methods[] = {
    {"start", (PyCFunction)prof_start, METH_NOARGS, "Start recording (a created session)."},
    {"stop", (PyCFunction)prof_stop, METH_NOARGS, "Stop recording (a started session)."},
    {"collect", (PyCFunction)prof_collect, METH_NOARGS,
     "collect() -> the serialized XSpace of a stopped session (once)."},
    {"close", (PyCFunction)prof_close, METH_NOARGS, "Destroy the session. Idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef prof_getset[] = {
    {"state", (getter)prof_get_state, NULL,
     "created, started, stopped, collected or closed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot prof_slots[] = {
    {Py_tp_doc, "PluginProfiler(api, options): a session of a plugin's PJRT profiler "
                "extension (internal; pjrt_py.runtime.profiler)."},
    {Py_tp_new, prof_new},
    {Py_tp_dealloc, prof_dealloc},
    {Py_tp_methods, prof_methods},
    {Py_tp_getset, prof_getset},
    {0, NULL},
};

static PyType_Spec prof_spec = {"pjrt_py._core.PluginProfiler", sizeof(ProfilerObject), 0,
                                Py_TPFLAGS_DEFAULT, prof_slots};
