/* Memory spaces of a Buffer: where it lives, and copies between memories.
 * Which memories a device has is read in Python (pjrt_py/memory.py); the
 * client checks a target Memory (and that the plugin has the call) before
 * anything here reaches PJRT. */

/* The PJRT_Memory* holding b, as an int. */
static PyObject* buffer_memory_address(BufferObject* b) {
  if (buffer_live(b) < 0) return NULL;
  const PJRT_Api* api = b->c->api;
  if (!PJRT_PY_HAS(api, PJRT_Buffer_Memory)) Py_RETURN_NONE;
  PJRT_Buffer_Memory_Args args = {0};
  args.struct_size = PJRT_Buffer_Memory_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  PJRT_Error* error = api->PJRT_Buffer_Memory(&args);
  if (error != NULL) return raise_pjrt(api, error);
  return PyLong_FromVoidPtr(args.memory);
}

static PyObject* buffer_get_memory(BufferObject* b, void* unused) {
  (void)unused;
  PyObject* address = buffer_memory_address(b);
  if (address == NULL) return NULL;
  PyObject* memory = PyObject_CallMethod(b->client, "_memory_for", "O", address);
  Py_DECREF(address);
  return memory;
}

static PyObject* buffer_copy_to_memory_async(BufferObject* b, PyObject* memory) {
  if (buffer_live(b) < 0) return NULL;
  PyObject* target = PyObject_CallMethod(b->client, "_memory_target", "OO", memory, (PyObject*)b);
  if (target == NULL) return NULL;
  PyObject* address = PyObject_GetAttrString(target, "_addr");
  Py_DECREF(target);
  if (address == NULL) return NULL;
  PJRT_Memory* dst = (PJRT_Memory*)PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  if (PyErr_Occurred() || buffer_live(b) < 0) return NULL; /* _memory_target ran Python */
  PJRT_Buffer_CopyToMemory_Args args = {0};
  args.struct_size = PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE;
  args.buffer = b->buf;
  args.dst_memory = dst;
  PJRT_Error* error = b->c->api->PJRT_Buffer_CopyToMemory(&args);
  if (error != NULL) return raise_pjrt(b->c->api, error);
  BufferObject* copy = buffer_wrap(b->client, b->c, args.dst_buffer, b->meta);
  if (copy == NULL) return NULL;
  PyObject* promise = promise_of_one(copy);
  Py_DECREF(copy);
  return promise;
}

static PyObject* buffer_copy_to_memory(BufferObject* b, PyObject* memory) {
  PyObject* promise = buffer_copy_to_memory_async(b, memory);
  if (promise == NULL) return NULL;
  PyObject* value = promise_value_impl((PromiseObject*)promise, -1);
  Py_DECREF(promise);
  return value;
}
