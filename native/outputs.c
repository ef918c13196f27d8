/* What pjrt_py knows of the outputs a program makes.
 *
 * A compiled program puts its output o on device d in the same memory, in
 * the same layout, at every execution. The first execution's outputs are
 * asked once (PJRT_Buffer_Device, PJRT_Buffer_Memory and
 * PJRT_Buffer_GetMemoryLayout) and the answers kept on the Loaded program;
 * every later output is made knowing them (buffer_origin), so that a chained
 * call compares cached pointers and never asks the plugin again.
 *
 * Decision: learned from the plugin's own answer for a real output rather
 * than read from the compiled module. The PJRT C API pjrt_py builds against
 * has no query for an executable's output layouts, and the module's layout
 * would be a second source that could disagree with what the plugin reports
 * for its buffers, which is what the argument checks and to_numpy go by
 * (on CPU a program may return a column-major output: tests/test_layouts.py).
 * A program whose output shapes are not fixed (no out_metas) learns nothing:
 * its outputs are asked about one by one, as any other buffer.
 */
#include "executable.h"

/* The origins of `loaded`'s outputs for a call of n_dev rows of n_out, or
 * NULL before the first such call. */
static const buffer_origin* outputs_known(LoadedObject* loaded, size_t n_dev, size_t n_out) {
  if (loaded->origins == NULL || loaded->num_origins != n_dev * n_out) return NULL;
  return loaded->origins;
}

/* Learns the origins from the promises of one call (n_dev of them, each of
 * n_out live Buffers with their metadata). With the GIL. A query the plugin
 * fails leaves that field unknown; running out of memory leaves it all to
 * the next call. Runs no Python. */
static void outputs_learn(LoadedObject* loaded, PromiseObject** promises, size_t n_dev,
                          size_t n_out) {
  size_t n = n_dev * n_out;
  if (n == 0 || loaded->origins != NULL) return;
  buffer_origin* origins = PyMem_Calloc(n, sizeof(buffer_origin));
  if (origins == NULL) return;
  for (size_t d = 0; d < n_dev; ++d) {
    for (size_t o = 0; o < n_out; ++o) {
      BufferObject* b = promise_at(promises[d], (Py_ssize_t)o);
      if (b == NULL || b->meta == NULL || b->buf == NULL) {
        PyErr_Clear();
        PyMem_Free(origins);
        return;
      }
      buffer_origin* known = &origins[d * n_out + o];
      size_t ndim = (size_t)PyTuple_Size(PyTuple_GetItem(b->meta, 0));
      known->device = buffer_device(b);
      known->memory = buffer_memory(b);
      known->row_major = (unsigned char)buffer_row_major_state(b, ndim);
    }
  }
  loaded->origins = origins;
  loaded->num_origins = n;
}
