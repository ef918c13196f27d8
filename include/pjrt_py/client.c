/* Client lifetime: a reference count kept in C.
 *
 * Every buffer and executable made through the helpers takes a reference,
 * and so does the Python Client; the PJRT client is destroyed when the last
 * one goes. Python finalizers may run in any order (garbage cycles), so the
 * order of destruction is decided here, not there. The helpers that create
 * children take their references themselves: no extra call per buffer. */
#include <pthread.h>
#include <stdlib.h>

/* Executions still running, grouped by epoch (see completion.c). */
typedef struct pjrt_py_epoch {
  long id;
  long running;
  struct pjrt_py_epoch* next;
} pjrt_py_epoch;

struct pjrt_py_client {
  const PJRT_Api* api;
  PJRT_Client* client;
  long refs;
  pthread_mutex_t mu; /* guards the epochs */
  pthread_cond_t cv;  /* signalled when an epoch's last execution completes */
  pjrt_py_epoch* oldest;
  pjrt_py_epoch* newest;
};

static int pjrt_py_epochs_free(pjrt_py_client* c);

pjrt_py_client* pjrt_py_client_wrap(const PJRT_Api* api, PJRT_Client* client) {
  pjrt_py_client* c = (pjrt_py_client*)malloc(sizeof(*c));
  if (c == NULL) return NULL;
  pjrt_py_epoch* e = (pjrt_py_epoch*)calloc(1, sizeof(*e));
  if (e == NULL) {
    free(c);
    return NULL;
  }
  c->api = api;
  c->client = client;
  c->refs = 1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->oldest = c->newest = e;
  return c;
}

static void pjrt_py_client_add(pjrt_py_client* c, long n) {
  __atomic_add_fetch(&c->refs, n, __ATOMIC_RELAXED);
}

void pjrt_py_client_ref(pjrt_py_client* c) { pjrt_py_client_add(c, 1); }

void pjrt_py_client_unref(pjrt_py_client* c) {
  if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  PJRT_Client* client = __atomic_exchange_n(&c->client, NULL, __ATOMIC_ACQ_REL);
  if (client != NULL) {
    /* Destroying the client runs (or cancels) what is pending, so every
     * completion callback has come back before the epochs go. */
    PJRT_Client_Destroy_Args args = {0};
    args.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
    args.client = client;
    pjrt_py_error_destroy(c->api, c->api->PJRT_Client_Destroy(&args));
  }
  if (!pjrt_py_epochs_free(c)) return; /* a callback may still come: leak c */
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
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
