/* pjrt_py._core: the helpers every native file shares (one place).
 *
 * Includes, macros, and the prototypes of the shared mechanisms: process
 * phases and the exit gate (state.c, gate_call.c), PJRT errors (errors.c),
 * events and completion counting (events.c, completion.c), (shape, dtype)
 * metadata (host.c), releases from threads without the GIL (releases.c),
 * and the hooks Python sets (core.c). The per-type headers (client.h,
 * buffer.h, promise.h, executable.h, dlpack.h, host_callback.h) build on it.
 */
#ifndef PJRT_PY_COMMON_H
#define PJRT_PY_COMMON_H

#define _GNU_SOURCE 1 /* on_exit */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL pjrt_py_core_ARRAY_API
#include <numpy/arrayobject.h>

/* PyGILState_Check has been exported by every CPython 3 but is declared for
 * the limited API only from 3.13: declared here, or GCC 14 refuses the call
 * (implicit declarations became errors there). */
#if defined(Py_LIMITED_API) && Py_LIMITED_API + 0 < 0x030D0000
PyAPI_FUNC(int) PyGILState_Check(void);
#endif

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

/* ---- shared functions ---------------------------------------------------- */

typedef struct pjrt_py_client pjrt_py_client; /* client.h */

/* state.c */
static bool state_pjrt_allowed(const pjrt_py_client* c);
static int state_check_usable(const pjrt_py_client* c, const char* what);
static bool gate_enter(void);
static void gate_leave(void);

/* gate_call.c */
static int gate_call(void (*fn)(void*), void* arg);

/* releases.c, staging_pool.c */
static void deferred_after_fork(void);
static void staging_after_fork(void);
static void run_with_gil(void (*fn)(void*), void* arg);
static void run_with_gil_unless_exiting(void (*fn)(void*), void* arg);
static void drop_reference(void* object);

/* errors.c */
static PyObject* type_name(PyObject* o);
static PyObject* error_from_pjrt(const PJRT_Api* api, PJRT_Error* error);
static PyObject* raise_pjrt(const PJRT_Api* api, PJRT_Error* error);
static void clear_for_fallback(void);
static PyObject* error_take(void);
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
static void completion_track(pjrt_py_client* c, PJRT_Event* const* events, size_t n);
static long completion_running(pjrt_py_client* c);
static void transfer_track(pjrt_py_client* c, PJRT_Event* event);
static long transfers_in_flight(pjrt_py_client* c);

/* host.c */
static PyObject* meta_intern(PyObject* meta);
static PyObject* meta_from_dims(const int64_t* dims, size_t ndims, int type);
static int meta_unpack(PyObject* meta, npy_intp* dims, int* ndim, PyArray_Descr** descr);
static int pjrt_type_of(PyArray_Descr* descr);

/* hooks set from Python (core.c) */
/* How deep this thread is in host callbacks (host_callback.c): Python run by
 * a program. Waiting there without a bound for other work could wait for
 * the very plugin thread that is waiting (wait_event refuses). */
static _Thread_local int t_in_host_callback = 0;
/* How deep this thread is in promise done callbacks run by a PJRT thread
 * (callbacks.c). The same holds there: the work waited for may need it. */
static _Thread_local int t_in_done_callback = 0;

/* The callback this thread runs Python in on a PJRT thread, where a wait
 * without a bound may wait for itself: "host callback", "done callback", or
 * NULL for neither. */
static inline const char* callback_on_pjrt_thread(void) {
  return t_in_host_callback ? "host callback" : t_in_done_callback ? "done callback" : NULL;
}

static PyObject* hook_await;          /* promise -> awaitable */
static PyObject* hook_callback_error; /* (fn, exception) -> None: reports it */

#endif
