/* pjrt_py._core: what the native files share.
 *
 * The module is one translation unit (core.c includes every .c file here), so
 * everything here is static. Who owns what:
 *
 *   pjrt_py_client   one PJRT client, reference counted (client_ref.c). The
 *                    Python Client holds a reference until close(); so does
 *                    every Buffer, Loaded executable and no-output promise,
 *                    and every PJRT call made without the GIL (a "call").
 *   BufferObject     one PJRT_Buffer. Freed once, by delete() or dealloc;
 *                    never while a call uses it (pins, buffer.c).
 *   PromiseObject    PJRT events, made lazily, destroyed at dealloc.
 *   LoadedObject     one PJRT_LoadedExecutable, shared by the Executables of
 *                    one compiled program; dispatch holds it for the call.
 *
 * Every PJRT call is made either with the GIL held (quick queries, destroys)
 * or, for anything that may take time (Execute, large copies, waits), with
 * the GIL released and its objects pinned. Process phases (fork, exit) are in
 * state.c: after fork the inherited objects never call PJRT again; from exit
 * on nothing does.
 */
#ifndef PJRT_PY_CORE_H
#define PJRT_PY_CORE_H

#define _GNU_SOURCE 1 /* dlmopen, on_exit */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL pjrt_py_core_ARRAY_API
#include <numpy/arrayobject.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pjrt_c_api.h"

/* Py_XSETREF is not in the limited API. */
#define PJRT_PY_SETREF(dst, src)   \
  do {                             \
    PyObject* _old = (PyObject*)(dst); \
    (dst) = (src);                 \
    Py_XDECREF(_old);              \
  } while (0)

#define PJRT_PY_MAX_RANK 64
#define PJRT_PY_STACK_ARGS 16 /* arguments per fast-path call without a heap array */

/* Whether the plugin's function table reaches `fn` (older plugins end sooner). */
#define PJRT_PY_HAS(api, fn) \
  ((api)->struct_size >= offsetof(PJRT_Api, fn) + sizeof((api)->fn) && (api)->fn != NULL)

/* ---- clients (client_ref.c, completion.c) ---------------------------- */

typedef struct pjrt_py_epoch {
  long id;
  long running;
  struct pjrt_py_epoch* next;
} pjrt_py_epoch;

typedef struct pjrt_py_client {
  const PJRT_Api* api;
  PJRT_Client* client; /* NULL once destroyed */
  long refs;           /* owners (see above); the last one destroys. Changed with the GIL */
  long calls;          /* PJRT calls in flight without the GIL. Changed with the GIL */
  long transfers;      /* host<->device copies in flight (completion.c). Atomic */
  int closed;          /* close() ran: new work is refused */
  int cpu;             /* platform "cpu": CPU-only fast paths apply */
  int zombie;          /* no owner left but executions still run: the reaper ends it */
  unsigned long generation; /* the process generation it was made in (fork) */
  PJRT_Device* default_device;
  void* kv;           /* the key-value store's holder (kv_store.c), or NULL */
  pthread_mutex_t mu; /* guards the epochs */
  pthread_cond_t cv;  /* an epoch emptied */
  pjrt_py_epoch* oldest;
  pjrt_py_epoch* newest;
  struct pjrt_py_client* prev; /* the registry of live clients (state.c) */
  struct pjrt_py_client* next;
} pjrt_py_client;

/* ---- Python objects ---------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  pjrt_py_client* c; /* NULL until attached */
  PyObject* dict;    /* the Python subclass's attributes */
  PyObject* weakrefs;
} ClientCoreObject;

enum { BUF_LIVE = 0, BUF_DELETED = 1, BUF_DONATED = 2 };

typedef struct {
  PyObject_HEAD
  PJRT_Buffer* buf;  /* NULL once freed */
  pjrt_py_client* c; /* one reference while the object lives */
  PyObject* client;  /* the Python Client */
  PyObject* meta;    /* (shape, dtype), interned; NULL until read */
  PyObject* weakrefs;
  PJRT_Device* device; /* where buf lives; NULL until asked (buffer_device) */
  PJRT_Memory* memory; /* the memory space it lives in; NULL until asked (buffer_memory) */
  int pins;          /* calls using buf without the GIL (each also holds the client) */
  int exports;       /* DLPack capsules lending buf's memory (dlpack.c), each holding b */
  unsigned char state;        /* BUF_* as Python sees it */
  unsigned char ready;        /* known ready without error (never goes back) */
  unsigned char dense;        /* 0 unknown, 1 host memory dense row-major, 2 not */
  unsigned char host_aliased; /* memory the host owns (zero-copy): never donated */
  unsigned char row_major;    /* 0 unknown, 1 row-major (or the plugin cannot say), 2 not */
} BufferObject;

/* A promise: events (made on first use), what they said, and callbacks. */
enum { PROMISE_BUFFERS = 0, PROMISE_ARRAY = 1, PROMISE_COMPLETION = 2 };

typedef struct {
  PyObject_HEAD
  int kind;            /* PROMISE_* */
  int arity;           /* buffers: 1 -> a Buffer, 0 -> None, else a tuple */
  BufferObject* one;   /* the one Buffer (buffers), or the copy's source (array) */
  PyObject* buffers;   /* a tuple of Buffers, where there are several or none */
  /* A one-output execution's output until someone asks for its Buffer (most
   * dispatched results are only chained or dropped): the handle, owned here. */
  PJRT_Buffer* raw;
  PyObject* raw_meta;
  PyObject* owner; /* the Python Client, to make that Buffer */
  int raw_ready;
  PyObject* array;     /* the numpy destination (array) */
  pjrt_py_client* c;   /* completion promises hold one reference */
  const PJRT_Api* api;
  PJRT_Event** events; /* NULL until made */
  int num_events;
  int made;            /* events made */
  int done;            /* all events ready; error harvested */
  int failed;          /* the work failed at dispatch: no buffers, only `error` */
  int watching;        /* OnReady notifications outstanding */
  PyObject* error;     /* the first error of the work, or NULL */
  PyObject* callbacks; /* list, or NULL */
  PyObject* weakrefs;
} PromiseObject;

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

/* ---- shared functions ---------------------------------------------------- */

/* state.c */
static bool state_pjrt_allowed(const pjrt_py_client* c);
static int state_check_usable(const pjrt_py_client* c, const char* what);
static bool gate_enter(void);
static void gate_leave(void);

/* gate_call.c */
static int gate_call(void (*fn)(void*), void* arg);

/* dlpack.c */
static void deferred_after_fork(void);

/* client_ref.c */
static void client_ref(pjrt_py_client* c);
static void client_unref(pjrt_py_client* c);
static int client_enter(pjrt_py_client* c, const char* what);
static void client_enter_checked(pjrt_py_client* c);
static void client_leave(pjrt_py_client* c);

/* errors.c */
static PyObject* type_name(PyObject* o);
static PyObject* error_from_pjrt(const PJRT_Api* api, PJRT_Error* error);
static PyObject* raise_pjrt(const PJRT_Api* api, PJRT_Error* error);
static void error_destroy(const PJRT_Api* api, PJRT_Error* error);
static void buffer_handle_destroy(const PJRT_Api* api, PJRT_Buffer* buffer);
static PyObject* call_python_method(PyObject* self, const char* name, PyObject* const* args,
                                   Py_ssize_t nargs, PyObject* kwnames);

/* events.c */
static int event_is_ready(const PJRT_Api* api, PJRT_Event* event);
static void event_destroy(const PJRT_Api* api, PJRT_Event* event);
static int wait_event(const PJRT_Api* api, PJRT_Event* event, double timeout);
static void release_on_ready(const PJRT_Api* api, PJRT_Event* event, PyObject* keep);

/* completion.c */
static void completion_track(pjrt_py_client* c, PJRT_Event* event);
static long completion_running(pjrt_py_client* c);
static void transfer_track(pjrt_py_client* c, PJRT_Event* event);
static long transfers_in_flight(pjrt_py_client* c);

/* host.c */
static PyObject* meta_intern(PyObject* meta);
static PyObject* meta_from_dims(const int64_t* dims, size_t ndims, int type);
static int meta_unpack(PyObject* meta, npy_intp* dims, int* ndim, PyArray_Descr** descr);
static int pjrt_type_of(PyArray_Descr* descr);

/* client.c, executable.c */
static PyTypeObject* ClientCoreType;

/* buffer.c */
static PyTypeObject* BufferType;
static BufferObject* buffer_wrap(PyObject* client, pjrt_py_client* c, PJRT_Buffer* buf,
                                 PyObject* meta);
static PyObject* buffer_meta(BufferObject* b);
static int buffer_pin(BufferObject* b);
static void buffer_unpin(BufferObject* b);

/* promise.c */
static PyTypeObject* PromiseType;
static PyTypeObject* BufferPromiseType;
static PyTypeObject* ArrayPromiseType;
static PyObject* promise_of_buffers(PyObject* buffers, int arity);
static PyObject* promise_of_one(BufferObject* buffer);
static PyObject* promise_of_output(PyObject* owner, pjrt_py_client* c, PJRT_Buffer* raw,
                                   PyObject* meta);
static BufferObject* promise_at(PromiseObject* p, Py_ssize_t i);
static PyObject* promise_of_array(pjrt_py_client* c, PyObject* array, PyObject* source,
                                  PJRT_Event* event);
static PyObject* promise_of_completion(pjrt_py_client* c, PJRT_Event* event);

/* hooks set from Python (core.c) */
/* How deep this thread is in host callbacks (host_callback.c): Python run by
 * a program. Waiting there without a bound for other work could wait for
 * the very plugin thread that is waiting (wait_event refuses). */
static _Thread_local int t_in_host_callback = 0;

static PyObject* hook_await;          /* promise -> awaitable */
static PyObject* hook_callback_error; /* (fn, exception) -> None: reports it */

#endif
