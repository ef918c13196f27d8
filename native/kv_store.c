/* PJRT key-value store callbacks backed by a Python object
 * (Client(kv_store=...), pjrt_py/kv.py).
 *
 * A plugin that runs across processes exchanges topologies (and, on GPU,
 * collective ids) through three callbacks given to PJRT_Client_Create: get
 * (blocking, with a timeout), try_get and put. It calls them from the thread
 * creating the client and later from its own threads. Each call here enters
 * the gate (never Python once the exit sequence has begun), takes the GIL
 * and hands the store, the operation, the key and its argument to
 * pjrt_py.runtime.kv_store's dispatcher, which calls the store and answers (code, payload,
 * interrupted). A value goes back in malloc'd memory with free() as its
 * deleter; a failure becomes a PJRT error made by the plugin's own
 * callback_error, with the code the plugin expects (NOT_FOUND, ...).
 *
 * The store lives in a kv_holder owned by the native client: it is released
 * after PJRT_Client_Destroy, when the plugin can no longer call (client_ref.c),
 * under the GIL (run_with_gil). A client never destroyed (left to the
 * process exit) keeps it. */
#include "client.h"

typedef struct {
  PyObject* store;
} kv_holder;

enum { KV_GET = 0, KV_TRY_GET = 1, KV_PUT = 2 };

static PyObject* g_kv_dispatch; /* (store, op, key, arg) -> (code, bytes | str, interrupted) */
static long g_kv_calls = 0;     /* callbacks that reached Python, for tests */

static void kv_holder_release(void* arg) {
  kv_holder* h = (kv_holder*)arg;
  Py_XDECREF(h->store);
  free(h);
}

static PJRT_Error* kv_fail(PJRT_CallbackError* make, PJRT_Error_Code code, const char* text,
                           size_t size) {
  if (make == NULL || *make == NULL) return NULL; /* nothing to report with */
  return (*make)(code, text, size);
}

#define KV_FAIL(make, code, literal) kv_fail((make), (code), (literal), sizeof(literal) - 1)

/* One callback's arguments and answer. */
typedef struct {
  kv_holder* h;
  PJRT_CallbackError* make;
  int op;
  const char* key;
  size_t key_size;
  const char* value;
  size_t value_size;
  int timeout_ms;
  char** out;
  size_t* out_size;
  PJRT_Error* error;
} kv_call;

/* Asks the store, with the GIL (gate_call). */
static void kv_ask(void* arg) {
  kv_call* q = (kv_call*)arg;
  PJRT_CallbackError* make = q->make;
  int op = q->op;
  PyObject *type, *exc, *tb;
  PyErr_Fetch(&type, &exc, &tb); /* a call inline in client creation may have one set */
  PJRT_Error* error = NULL;
  PyObject* k = PyBytes_FromStringAndSize(q->key, (Py_ssize_t)q->key_size);
  PyObject* operand = op == KV_PUT ? PyBytes_FromStringAndSize(q->value, (Py_ssize_t)q->value_size)
                                : PyLong_FromLong(q->timeout_ms);
  PyObject* answer = NULL;
  if (k != NULL && operand != NULL && g_kv_dispatch != NULL && q->h->store != NULL)
    answer = PyObject_CallFunction(g_kv_dispatch, "OiOO", q->h->store, op, k, operand);
  Py_XDECREF(k);
  Py_XDECREF(operand);
  long code = -1;
  int interrupted = 0;
  PyObject* payload = NULL;
  if (answer != NULL && PyTuple_Check(answer) && PyTuple_Size(answer) == 3) {
    code = PyLong_AsLong(PyTuple_GetItem(answer, 0));
    payload = PyTuple_GetItem(answer, 1);
    interrupted = PyObject_IsTrue(PyTuple_GetItem(answer, 2)) == 1;
  }
  if (code == 0 && op != KV_PUT) {
    char* data = NULL;
    Py_ssize_t size = -1;
    if (payload != NULL && PyBytes_Check(payload) && PyBytes_AsStringAndSize(payload, &data, &size) == 0) {
      *q->out = (char*)malloc(size > 0 ? (size_t)size : 1);
      if (*q->out != NULL) {
        memcpy(*q->out, data, (size_t)size);
        *q->out_size = (size_t)size;
      } else {
        error = KV_FAIL(make, PJRT_Error_Code_RESOURCE_EXHAUSTED, "pjrt_py: no memory for a value");
      }
    } else {
      error = KV_FAIL(make, PJRT_Error_Code_INTERNAL, "pjrt_py: the store's value is not bytes");
    }
  } else if (code > 0 && payload != NULL && PyUnicode_Check(payload)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(payload, &size);
    error = text != NULL ? kv_fail(make, (PJRT_Error_Code)code, text, (size_t)size)
                         : KV_FAIL(make, (PJRT_Error_Code)code, "key-value store error");
  } else if (code != 0) {
    error = KV_FAIL(make, PJRT_Error_Code_INTERNAL, "pjrt_py: the key-value store dispatch failed");
  }
  Py_XDECREF(answer);
  PyErr_Clear();
  __atomic_add_fetch(&g_kv_calls, 1, __ATOMIC_RELAXED);
  PyErr_Restore(type, exc, tb);
  if (interrupted) PyErr_SetInterrupt(); /* Ctrl-C reaches the main thread */
  q->error = error;
}

/* One callback: the store's answer, or a PJRT error. *out / *out_size get a
 * malloc'd value for get and try_get. */
static PJRT_Error* kv_run(void* user_arg, PJRT_CallbackError* make, int op, const char* key,
                          size_t key_size, const char* value, size_t value_size, int timeout_ms,
                          char** out, size_t* out_size) {
  kv_holder* h = (kv_holder*)user_arg;
  if (h == NULL) return KV_FAIL(make, PJRT_Error_Code_INTERNAL, "pjrt_py: no key-value store");
  kv_call q = {h, make, op, key, key_size, value, value_size, timeout_ms, out, out_size, NULL};
  if (!gate_call(kv_ask, &q))
    return KV_FAIL(make, PJRT_Error_Code_UNAVAILABLE,
                   "pjrt_py: the interpreter is exiting; the key-value store is closed");
  return q.error;
}

static void kv_free_value(char* value) { free(value); }

static PJRT_Error* kv_get(PJRT_KeyValueGetCallback_Args* a) {
  PJRT_Error* error = kv_run(a->user_arg, a->callback_error, KV_GET, a->key, a->key_size, NULL, 0,
                             a->timeout_in_ms, &a->value, &a->value_size);
  if (error == NULL) a->value_deleter_callback = kv_free_value;
  return error;
}

static PJRT_Error* kv_try_get(PJRT_KeyValueTryGetCallback_Args* a) {
  PJRT_Error* error = kv_run(a->user_arg, a->callback_error, KV_TRY_GET, a->key, a->key_size,
                             NULL, 0, 0, &a->value, &a->value_size);
  if (error == NULL) a->value_deleter_callback = kv_free_value;
  return error;
}

static PJRT_Error* kv_put(PJRT_KeyValuePutCallback_Args* a) {
  return kv_run(a->user_arg, a->callback_error, KV_PUT, a->key, a->key_size, a->value,
                a->value_size, 0, NULL, NULL);
}

/* ---- Python entry points ------------------------------------------------- */

static PyObject* core_kv_set_dispatch(PyObject* self, PyObject* fn) {
  (void)self;
  Py_INCREF(fn);
  PJRT_PY_SETREF(g_kv_dispatch, fn);
  Py_RETURN_NONE;
}

/* kv_callbacks() -> (get, try_get, put) addresses, as PJRT_Client_Create takes them. */
static PyObject* core_kv_callbacks(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return Py_BuildValue("(NNN)", PyLong_FromVoidPtr((void*)kv_get),
                       PyLong_FromVoidPtr((void*)kv_try_get), PyLong_FromVoidPtr((void*)kv_put));
}

/* kv_holder_new(store) -> the address of a holder with a reference to store:
 * the user_arg of the three callbacks. Owned by the caller until handed to
 * a client (_attach), or freed with kv_holder_free. */
static PyObject* core_kv_holder_new(PyObject* self, PyObject* store) {
  (void)self;
  kv_holder* h = (kv_holder*)malloc(sizeof(*h));
  if (h == NULL) return PyErr_NoMemory();
  Py_INCREF(store);
  h->store = store;
  return PyLong_FromVoidPtr(h);
}

static PyObject* core_kv_holder_free(PyObject* self, PyObject* address) {
  (void)self;
  kv_holder* h = (kv_holder*)PyLong_AsVoidPtr(address);
  if (h == NULL) return PyErr_Occurred() ? NULL : (Py_INCREF(Py_None), Py_None);
  kv_holder_release(h);
  Py_RETURN_NONE;
}

static PyObject* core_kv_calls(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return PyLong_FromLong(__atomic_load_n(&g_kv_calls, __ATOMIC_RELAXED));
}
