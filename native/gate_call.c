/* Running Python on a thread Python does not own: PJRT's worker threads
 * (host callbacks, OnReady callbacks) and whatever thread a plugin calls the
 * key-value store from. Every such entry goes through gate_call().
 *
 * The gate (state.c) keeps new entries out once the exit sequence has begun,
 * but a thread already inside Python then (a host callback in a long loop,
 * one blocked in C code, one waiting for the GIL) cannot be made to leave.
 * When Python finalizes, CPython (3.11 to 3.13) ends such a thread the next
 * time it asks for the GIL, with pthread_exit(). That unwinds the thread's
 * stack through the plugin's C++ frames below ours, and the plugins' own
 * unwinder crashes there (SIGSEGV in __gxx_personality_v0 / unw_get_proc_info,
 * four exits in four with a host callback still running Python).
 *
 * So the unwinding stops in our frame: a cleanup handler registered around
 * the Python part catches it and parks the thread for good. It holds no GIL
 * then (CPython drops it first), never touches Python again, and never
 * returns into the plugin; the exit sequence has already left its client
 * undestroyed, and the process ends without running the plugin's static
 * destructors (state.c, quick_exit_handler). CPython 3.14 parks such threads
 * itself; the handler then never runs.
 */
#include "common.h"

#include <unistd.h>

static void gate_park(void* unused) {
  (void)unused;
  for (;;) pause();
}

/* Runs fn(arg) with the GIL, from any thread. Returns 1 if it ran, 0 if the
 * gate is closed (the interpreter is exiting): fn did not run. */
static int gate_call(void (*fn)(void*), void* arg) {
  if (!gate_enter()) return 0;
  /* A thread that waited here through the whole finalization must not ask
   * for a GIL that no longer exists. */
  if (__atomic_load_n(&g_python_gone, __ATOMIC_ACQUIRE)) gate_park(NULL);
  pthread_cleanup_push(gate_park, NULL);
  PyGILState_STATE gil = PyGILState_Ensure();
  fn(arg);
  PyGILState_Release(gil);
  pthread_cleanup_pop(0);
  gate_leave();
  return 1;
}
