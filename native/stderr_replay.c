/* A crash's last words survive pjrt_py's capture of file descriptor 2.
 *
 * While the plugin compiles or loads an executable, pjrt_py.runtime.plugin_log
 * points descriptor 2 at a file, to route the plugin's log lines through
 * Python's logging. A compiler that crashes writes its reason there (absl's
 * "F... Check failed: ..." and its stack) just before the signal that ends
 * the process, so no Python code runs to show it. This handler does: on a
 * fatal signal during a capture it copies the file, from the first byte not
 * yet delivered, to the real stderr, points descriptor 2 back at it, and
 * hands the signal on to the handler it replaced (faulthandler's, or the
 * default action), as faulthandler itself chains.
 *
 * Async-signal-safe only: atomics, pread, write, dup2, sigaction, raise.
 * Installed once, on the first capture; outside a capture it only hands the
 * signal on (replay_chain), with the original siginfo. SIGTERM is taken only where its
 * action was the default (the process would end): a program's own SIGTERM
 * handler, and anything set later by Python's signal module, replace or keep
 * ours as they choose.
 */
#include "common.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

static const int replay_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTERM};
#define REPLAY_SIGNALS ((int)(sizeof replay_signals / sizeof replay_signals[0]))

static int g_replay_from = -1; /* the capture file; -1: no capture */
static int g_replay_to = -1;   /* a duplicate of the real stderr */
static long long g_replay_offset = 0;
static struct sigaction g_replay_previous[REPLAY_SIGNALS];
static int g_replay_installed = 0;

/* Hands the signal on as if we had never been installed: a handler that
 * takes siginfo gets the original one (a runtime that resumes from a fault it
 * expects, such as a JVM's, still can); the default action is restored and
 * the signal raised again, which ends the process as it would have. */
static void replay_chain(int sig, siginfo_t* info, void* context, int i) {
  struct sigaction* previous = &g_replay_previous[i];
  if ((previous->sa_flags & SA_SIGINFO) && previous->sa_sigaction != NULL) {
    previous->sa_sigaction(sig, info, context);
    return;
  }
  if (previous->sa_handler == SIG_IGN) return;
  if (previous->sa_handler != SIG_DFL && previous->sa_handler != NULL) {
    previous->sa_handler(sig);
    return;
  }
  sigaction(sig, previous, NULL);
  raise(sig); /* SA_NODEFER: the default action runs now */
}

static void replay_on_fatal(int sig, siginfo_t* info, void* context) {
  int saved_errno = errno;
  int from = __atomic_exchange_n(&g_replay_from, -1, __ATOMIC_SEQ_CST);
  int to = __atomic_load_n(&g_replay_to, __ATOMIC_SEQ_CST);
  if (from >= 0 && to >= 0) { /* only during a capture: otherwise we are not here */
    char chunk[4096];
    off_t at = (off_t)__atomic_load_n(&g_replay_offset, __ATOMIC_SEQ_CST);
    ssize_t n;
    while ((n = pread(from, chunk, sizeof chunk, at)) > 0) {
      for (ssize_t done = 0; done < n;) {
        ssize_t w = write(to, chunk + done, (size_t)(n - done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) goto written;
        done += w;
      }
      at += n;
    }
  written:
    dup2(to, 2); /* what follows (a faulthandler chained after us) shows too */
  }
  errno = saved_errno;
  for (int i = 0; i < REPLAY_SIGNALS; i++) {
    if (replay_signals[i] == sig) {
      replay_chain(sig, info, context, i);
      break;
    }
  }
}

/* stderr_replay(from_fd, to_fd, offset): arm the replay of `from_fd` from
 * `offset` on to `to_fd` on a fatal signal (called again with the same
 * descriptors: only move the offset); from_fd -1 disarms. With the GIL. */
static PyObject* core_stderr_replay(PyObject* self, PyObject* args) {
  (void)self;
  int from, to;
  long long offset;
  if (!PyArg_ParseTuple(args, "iiL:stderr_replay", &from, &to, &offset)) return NULL;
  if (from >= 0 && !g_replay_installed) {
    g_replay_installed = 1;
    for (int i = 0; i < REPLAY_SIGNALS; i++) {
      int sig = replay_signals[i];
      struct sigaction ours;
      memset(&ours, 0, sizeof ours);
      ours.sa_sigaction = replay_on_fatal;
      ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
      sigemptyset(&ours.sa_mask);
      if (sigaction(sig, NULL, &g_replay_previous[i]) != 0) continue;
      if (sig == SIGTERM && g_replay_previous[i].sa_handler != SIG_DFL) continue;
      sigaction(sig, &ours, NULL);
    }
  }
  if (from >= 0 && from == g_replay_from && to == g_replay_to) { /* delivered up to here */
    __atomic_store_n(&g_replay_offset, offset, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
  }
  __atomic_store_n(&g_replay_from, -1, __ATOMIC_SEQ_CST);
  __atomic_store_n(&g_replay_offset, offset, __ATOMIC_SEQ_CST);
  __atomic_store_n(&g_replay_to, to, __ATOMIC_SEQ_CST);
  __atomic_store_n(&g_replay_from, from, __ATOMIC_SEQ_CST);
  Py_RETURN_NONE;
}
