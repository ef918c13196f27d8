/* Dispatching from inside a host callback without a deadlock.
 *
 * XLA's CPU client admits a fixed number of executions in flight per device
 * and makes a dispatch beyond it wait, inside PJRT_LoadedExecutable_Execute,
 * for one of them to finish. A dispatch from a host callback that waits there
 * may wait for itself: the slots are held by executions that cannot finish
 * while their callbacks wait (its own, and those queued behind it). Reported:
 * with 33 or more executions of a program queued on one device, a callback
 * of it that dispatched froze the process; with 31, it was fine. Reproduced
 * with 64 queued (frozen every time; tests/test_callback_dispatch.py).
 *
 * So a dispatch from inside a host callback is refused, with RuntimeError,
 * when it could wait: when the client's executions not yet complete plus its
 * PJRT calls in flight (a dispatch from another thread may be holding or
 * waiting for a slot) reach the limit. The count is per client, which is at
 * least the count of any one device: on a client with several devices the
 * refusal can come early, never late. Outside host callbacks nothing is
 * checked; a dispatch there may wait, as the plugin intends.
 *
 * The limit, measured on all three CPU builds (PJRT 0.81, 0.106, 0.115): the
 * 33rd dispatch of a program whose callback blocks waits, the 32nd returns
 * (tests/test_callback_dispatch.py). XLA's CPU client option
 * max_inflight_computations_per_device has 32 as its default, and the C API
 * does not report it.
 */
#include "client.h"

#define PJRT_PY_INFLIGHT_LIMIT 32

/* 0 if a dispatch on `c` may go ahead; -1 with RuntimeError if this thread
 * runs a host callback and the dispatch could wait for a slot. With the GIL. */
static int dispatch_admit(pjrt_py_client* c) {
  const char* inside = callback_on_pjrt_thread();
  if (inside == NULL) return 0;
  long in_flight = completion_running(c) + c->calls;
  if (in_flight < PJRT_PY_INFLIGHT_LIMIT) return 0;
  PyErr_Format(PyExc_RuntimeError,
               "cannot dispatch from inside a %s while %ld executions and calls are "
               "in flight on this client: the plugin admits %d per device and would make this "
               "dispatch wait for one to finish, which may need this very callback to return. "
               "Dispatch after the callback returns, or keep fewer executions in flight",
               inside, in_flight, PJRT_PY_INFLIGHT_LIMIT);
  return -1;
}
