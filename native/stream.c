/* PJRT's stream extension: ordering a DLPack exchange on the device, with no
 * host wait.
 *
 * DLPack's rule is that the consumer names its stream and the producer makes
 * that stream wait for the producer's work. A GPU plugin that carries the
 * extension (PJRT_Extension_Type_Stream in the PJRT_Api extension chain)
 * offers both halves:
 *
 *   get_stream   the stream of a device on which the plugin tracks memory it
 *                does not own: pjrt_py hands it to a producer's
 *                __dlpack__(stream=...) on import, then gives the same value
 *                to PJRT_Client_CreateViewOfDeviceBuffer, which accepts no
 *                other (the CUDA plugin answers NOT_FOUND for a stream it
 *                does not know: "GetStreamFromExternalStream failed").
 *   wait_stream  makes a consumer's stream wait until a buffer is ready: what
 *                Buffer.__dlpack__(stream=s) does on export.
 *
 * The extension is experimental in XLA and its header is not shipped with
 * the plugins, so its layout is declared here (version 0: the base, then the
 * two function pointers). Both argument structs end at their last field: no
 * extension_start. CPU plugins have no such extension; the functions below
 * then answer None / raise, and pjrt_py.interop.dlpack keeps host-side ordering.
 */
#include "buffer.h"

typedef struct {
  size_t struct_size;
  PJRT_Device* device;
  intptr_t stream; /* out */
} stream_get_args;

typedef struct {
  size_t struct_size;
  intptr_t stream;
  PJRT_Buffer* buffer;
} stream_wait_args;

typedef struct {
  PJRT_Extension_Base base;
  PJRT_Error* (*get_stream)(stream_get_args*);
  PJRT_Error* (*wait_stream)(stream_wait_args*);
} stream_extension;

/* The plugin's stream extension, if it has one that reaches both functions. */
static const stream_extension* stream_find(const PJRT_Api* api) {
  for (PJRT_Extension_Base* e = api->extension_start; e != NULL; e = e->next) {
    if (e->type != PJRT_Extension_Type_Stream) continue;
    const stream_extension* s = (const stream_extension*)e;
    if (e->struct_size < sizeof(stream_extension) || s->get_stream == NULL ||
        s->wait_stream == NULL)
      return NULL;
    return s;
  }
  return NULL;
}

/* stream_extension_usable(api) -> whether the plugin's stream extension is one
 * pjrt_py can use (a GPU plugin loaded without its GPU can say: tests). */
static PyObject* core_stream_extension_usable(PyObject* module, PyObject* address) {
  (void)module;
  const PJRT_Api* api = address_of_api(address);
  if (api == NULL) return NULL;
  return PyBool_FromLong(stream_find(api) != NULL);
}

/* The stream `device` (a PJRT_Device* as an int) of client `c` tracks
 * external readiness on, or None if the plugin has no stream extension
 * (ClientCore._ready_stream, client.c). */
static PyObject* stream_for_device(pjrt_py_client* c, PyObject* device_address) {
  const stream_extension* ext = stream_find(c->api);
  if (ext == NULL) Py_RETURN_NONE;
  PJRT_Device* device = (PJRT_Device*)PyLong_AsVoidPtr(device_address);
  if (PyErr_Occurred()) return NULL;
  stream_get_args args = {sizeof(stream_get_args), device, 0};
  PJRT_Error* error = ext->get_stream(&args);
  if (error != NULL) return raise_pjrt(c->api, error);
  return PyLong_FromSsize_t((Py_ssize_t)args.stream);
}

/* Buffer._wait_on_stream(stream) -> bool: make the consumer's `stream` wait
 * until the buffer is ready (no host wait). False, doing nothing, if the
 * plugin has no stream extension. Called with the GIL released, the buffer
 * pinned: the plugin may wait on the host for the buffer's event to exist. */
static PyObject* buffer_wait_on_stream(BufferObject* b, PyObject* stream_obj) {
  Py_ssize_t stream = PyLong_AsSsize_t(stream_obj);
  if (stream == -1 && PyErr_Occurred()) return NULL;
  if (buffer_live(b) < 0) return NULL;
  const PJRT_Api* api = b->c->api;
  const stream_extension* ext = stream_find(api);
  if (ext == NULL) Py_RETURN_FALSE;
  pjrt_py_client* c = b->c;
  if (client_enter(c, "the buffer") < 0) return NULL;
  if (buffer_pin(b) < 0) {
    client_leave(c);
    return NULL;
  }
  stream_wait_args args = {sizeof(stream_wait_args), (intptr_t)stream, b->buf};
  PJRT_Error* error;
  Py_BEGIN_ALLOW_THREADS error = ext->wait_stream(&args);
  Py_END_ALLOW_THREADS buffer_unpin(b);
  client_leave(c);
  if (error != NULL) return raise_pjrt(api, error);
  Py_RETURN_TRUE;
}
