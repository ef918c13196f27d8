/* Donation, as Python sees it. An execution may consume (donate) a Buffer
 * given for a parameter the program aliases to an output; pjrt_py first
 * refuses what must not go (pjrt_py.programs.arguments.non_donatable_indices:
 * memory the host owns, or lent to a DLPack consumer or a staged read), then
 * asks PJRT which arguments it really took (_pjrt_deleted) and retires those
 * Buffers (_retire_donated), so that any later use raises instead of
 * reaching memory the output now owns. With the GIL.
 */
#include "promise.h"

/* _pjrt_deleted(): whether PJRT consumed the handle (donation). */
static PyObject* buffer_pjrt_deleted(BufferObject* b, PyObject* unused) {
  (void)unused;
  if (b->buf == NULL || !state_pjrt_allowed(b->c)) Py_RETURN_FALSE;
  PJRT_Buffer_IsDeleted_Args args = {0};
  args.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  PJRT_Error* error = b->c->api->PJRT_Buffer_IsDeleted(&args);
  if (error != NULL) {
    error_destroy(b->c->api, error);
    Py_RETURN_FALSE;
  }
  return PyBool_FromLong(args.is_deleted);
}

/* _retire_donated(): PJRT consumed it; any later use raises. The handle is
 * destroyed without the GIL: XLA's CPU client of PJRT 0.81 waits in
 * PJRT_Buffer_Destroy for the execution the buffer went to to start. */
static PyObject* buffer_retire_donated(BufferObject* b, PyObject* unused) {
  (void)unused;
  buffer_retire(b, BUF_DONATED, true);
  Py_RETURN_NONE;
}
