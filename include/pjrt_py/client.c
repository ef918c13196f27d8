/* Client lifetime: a reference count kept in C.
 *
 * Every buffer and executable made through the helpers takes a reference,
 * and so does the Python Client; the PJRT client is destroyed when the last
 * one goes. Python finalizers may run in any order (garbage cycles), so the
 * order of destruction is decided here, not there. The helpers that create
 * children take their references themselves: no extra call per buffer. */
#include <stdlib.h>

struct pjrt_py_client {
  const PJRT_Api* api;
  PJRT_Client* client;
  long refs;
};

pjrt_py_client* pjrt_py_client_wrap(const PJRT_Api* api, PJRT_Client* client) {
  pjrt_py_client* c = (pjrt_py_client*)malloc(sizeof(*c));
  if (c == NULL) return NULL;
  c->api = api;
  c->client = client;
  c->refs = 1;
  return c;
}

static void pjrt_py_client_add(pjrt_py_client* c, long n) {
  __atomic_add_fetch(&c->refs, n, __ATOMIC_RELAXED);
}

void pjrt_py_client_ref(pjrt_py_client* c) { pjrt_py_client_add(c, 1); }

void pjrt_py_client_unref(pjrt_py_client* c) {
  if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  PJRT_Client* client = __atomic_exchange_n(&c->client, NULL, __ATOMIC_ACQ_REL);
  if (client == NULL) {
    free(c);
    return;
  }
  PJRT_Client_Destroy_Args args = {0};
  args.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
  args.client = client;
  pjrt_py_error_destroy(c->api, c->api->PJRT_Client_Destroy(&args));
  free(c);
}

/* At interpreter exit only: destroy the PJRT client now, whatever holds it.
 * Its destructor drains and joins the plugin's worker threads, so none is
 * still running when the process tears down its static objects (which
 * crashes the CPU plugin). Nothing may use the client afterwards: pjrt_py
 * stops all PJRT calls before this runs. The handle itself is leaked. */
void pjrt_py_client_destroy_at_exit(pjrt_py_client* c) {
  PJRT_Client* client = __atomic_exchange_n(&c->client, NULL, __ATOMIC_ACQ_REL);
  if (client == NULL) return;
  PJRT_Client_Destroy_Args args = {0};
  args.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
  args.client = client;
  pjrt_py_error_destroy(c->api, c->api->PJRT_Client_Destroy(&args));
}

long pjrt_py_client_refs(pjrt_py_client* c) {
  return __atomic_load_n(&c->refs, __ATOMIC_ACQUIRE);
}
