/* cdef: pjrt_py's own C helpers (implemented in the *.c files beside this
 * one). They own the hot path (execute, host transfers, buffer teardown) and
 * the PJRT_Event_OnReady plumbing, so Python builds no PJRT args structs per
 * call. Helpers that call into PJRT return the plugin's PJRT_Error* (NULL on
 * success); Python turns it into an exception and destroys it. */

/* Plugin loading: dlopen + GetPjrtApi. Never dlclose'd. NULL on failure with
 * the reason in err. */
const PJRT_Api* pjrt_py_load_plugin(const char* path, char* err, size_t err_size);

/* Every slot of the header's PJRT_Api: its name and the byte offset where it
 * ends. A slot is callable only if end <= the plugin's PJRT_Api.struct_size. */
typedef struct {
  const char* name;
  size_t end;
} pjrt_py_slot;
extern const pjrt_py_slot pjrt_py_slots[];
extern const size_t pjrt_py_num_slots;

/* Errors. */
int pjrt_py_error_code(const PJRT_Api* api, PJRT_Error* error);
const char* pjrt_py_error_message(const PJRT_Api* api, PJRT_Error* error, size_t* size);
void pjrt_py_error_destroy(const PJRT_Api* api, PJRT_Error* error);

/* Events. */
int pjrt_py_event_is_ready(const PJRT_Api* api, PJRT_Event* event);
PJRT_Error* pjrt_py_event_error(const PJRT_Api* api, PJRT_Event* event);
void pjrt_py_event_destroy(const PJRT_Api* api, PJRT_Event* event);
/* Blocks (the caller has released the GIL) until the event is ready or
 * timeout seconds pass; timeout < 0 waits forever. 1: ready, 0: timed out. */
int pjrt_py_event_wait(const PJRT_Api* api, PJRT_Event* event, double timeout);
/* How long pjrt_py_event_wait polls before it blocks (ns; 0: never polls).
 * Process-wide; the default is set in event.c, $PJRT_PY_SPIN_US overrides. */
void pjrt_py_set_spin_ns(long ns);
long pjrt_py_spin_ns(void);
/* Calls _pjrt_py_event_ready(handle) from PJRT's thread once the event is
 * ready, unless pjrt_py_shutdown() ran first. 0 on success. */
int pjrt_py_event_notify(const PJRT_Api* api, PJRT_Event* event, void* handle);
extern "Python" void _pjrt_py_event_ready(void* handle);
/* Stops further Python notifications and waits for running ones to finish. */
void pjrt_py_shutdown(void);

/* Lifetimes. A pjrt_py_client is a reference-counted PJRT_Client: the
 * Python Client holds one reference, and so does every buffer and executable
 * (taken by the helpers that make them). The last unref destroys it. */
typedef struct pjrt_py_client pjrt_py_client;
pjrt_py_client* pjrt_py_client_wrap(const PJRT_Api* api, PJRT_Client* client);
void pjrt_py_client_ref(pjrt_py_client* c);
void pjrt_py_client_unref(pjrt_py_client* c);
long pjrt_py_client_refs(pjrt_py_client* c);
/* At interpreter exit: destroy the PJRT client now (joins its threads). */
void pjrt_py_client_destroy_at_exit(pjrt_py_client* c);
/* Destroy a buffer / an executable and drop its client reference. */
void pjrt_py_buffer_destroy(pjrt_py_client* c, PJRT_Buffer* buffer);
void pjrt_py_loaded_executable_destroy(pjrt_py_client* c, PJRT_LoadedExecutable* exe,
                                       PJRT_Executable* unloaded);

/* Host transfers. */
PJRT_Error* pjrt_py_buffer_from_host(pjrt_py_client* c, const void* data, int type, const int64_t* dims,
                                     size_t num_dims, int semantics, PJRT_Device* device,
                                     PJRT_Buffer** buffer, PJRT_Event** done_with_host);
/* Copies into dst in dense row-major layout (requested explicitly). */
PJRT_Error* pjrt_py_buffer_to_host(const PJRT_Api* api, PJRT_Buffer* buffer, void* dst,
                                   size_t dst_size, size_t num_dims, PJRT_Event** done);
/* The CPU fast path of a small device-to-host copy: if the buffer lives in
 * host memory, is ready without error, and is dense row-major of exactly
 * size bytes, copy it into dst now (under an external reference) and return
 * 1. Otherwise return 0 and touch nothing: use pjrt_py_buffer_to_host. This
 * skips the hand-off to the plugin's worker thread that its own copy does. */
int pjrt_py_buffer_read_ready(const PJRT_Api* api, PJRT_Buffer* buffer, void* dst, size_t size,
                              size_t num_dims);
/* Shape and element type in one call (dims has room for max_dims). */
PJRT_Error* pjrt_py_buffer_meta(const PJRT_Api* api, PJRT_Buffer* buffer, int64_t* dims,
                                size_t max_dims, size_t* num_dims, int* type);
PJRT_Error* pjrt_py_buffer_ready_event(const PJRT_Api* api, PJRT_Buffer* buffer,
                                       PJRT_Event** event);

/* Execution on num_devices devices at once (replicas x partitions, in the
 * executable's addressable-device order). args holds num_devices rows of
 * num_args buffers, outputs room for num_devices rows of num_outputs.
 * complete_events, if not NULL, receives one event per device (the caller
 * destroys them). non_donatable lists parameter indices the plugin must not
 * donate for this call. Every execution is counted for
 * pjrt_py_client_barrier until it completes. */
PJRT_Error* pjrt_py_execute_n(pjrt_py_client* c, PJRT_LoadedExecutable* exe, size_t num_devices,
                              PJRT_Buffer** args, size_t num_args, PJRT_Buffer** outputs,
                              size_t num_outputs, PJRT_Event** complete_events,
                              const int64_t* non_donatable, size_t num_non_donatable);
/* Blocks (GIL released) until every execution dispatched on c before the
 * call has completed; later dispatches, from any thread, do not extend the
 * wait. 0 on success, -1 out of memory. */
int pjrt_py_client_barrier(pjrt_py_client* c);
/* Executions of c still running (for tests and diagnostics). */
long pjrt_py_client_running(pjrt_py_client* c);
/* 1 if PJRT has deleted (e.g. donated) the buffer. */
int pjrt_py_buffer_is_deleted(const PJRT_Api* api, PJRT_Buffer* buffer);
/* A one-output program on one device, the common case: returns the output,
 * or NULL with the error kept for pjrt_py_take_error() (per thread). Saves
 * the caller an output array per call. Asks for no completion event, so
 * pjrt_py_client_barrier does not count it: the caller tracks the output. */
PJRT_Buffer* pjrt_py_execute1(pjrt_py_client* c, PJRT_LoadedExecutable* exe, PJRT_Buffer** args,
                              size_t num_args);
PJRT_Error* pjrt_py_take_error(void);
