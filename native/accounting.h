/* Byte accounting: the device memory pjrt_py's own handles hold, per device
 * (accounting.c; read by pjrt_py.runtime.memory_watch).
 *
 * Every Buffer, and every promise holding an output handle no Buffer was made
 * for yet, carries a tag: how many bytes it counted, on which device's
 * counter. A handle is counted when pjrt_py takes it (buffer_wrap,
 * promise_of_output) and let go when pjrt_py destroys it; a view of memory
 * someone else owns (DLPack imports, zero-copy host arrays) counts nothing.
 * Everything here runs with the GIL held, so the counters are plain integers.
 * On the dispatch path the cost is acct_handle (a cached bytes and device
 * lookup, then acct_add) and acct_drop: about 50 instructions a call
 * (docs/performance.md).
 */
#ifndef PJRT_PY_ACCOUNTING_H
#define PJRT_PY_ACCOUNTING_H

#include "common.h"

#define PJRT_PY_ACCT_DEVICES 256 /* devices counted; more go uncounted */

typedef struct {
  int64_t bytes; /* counted on g_acct[slot]; 0: nothing counted */
  int slot;
} acct_tag;

typedef struct {
  PJRT_Device* device;
  int64_t live; /* bytes held now */
  int64_t peak; /* the most held since the last mark (accounting(reset=True)) */
} acct_counter;

static acct_counter g_acct[PJRT_PY_ACCT_DEVICES];

/* Counts `bytes` on counter `slot` under tag t (which counted nothing). */
static inline void acct_add(acct_tag* t, int slot, int64_t bytes) {
  acct_counter* k = &g_acct[slot];
  t->bytes = bytes;
  t->slot = slot;
  k->live += bytes;
  if (k->live > k->peak) k->peak = k->live;
}

/* Lets go of what t counted, once. */
static inline void acct_drop(acct_tag* t) {
  if (t->bytes == 0) return;
  g_acct[t->slot].live -= t->bytes;
  t->bytes = 0;
}

/* Hands what `from` counted to `to` (a handle changing owner). */
static inline void acct_move(acct_tag* to, acct_tag* from) {
  *to = *from;
  from->bytes = 0;
}

/* accounting.c */
static void acct_handle(acct_tag* t, const PJRT_Api* api, PJRT_Buffer* buf, PJRT_Device* device,
                        PyObject* meta);

#endif
