/* The reference-counted PJRT client.
 *
 * References and calls are taken and dropped only with the GIL held, which
 * orders them: they are plain integers, not atomics (a dispatch changes
 * them several times). The reaper and the exit sequence, which run without
 * the GIL, only read them, under the registry lock, and an effects_barrier()
 * takes its references under that lock too. The last owner destroys the
 * PJRT client with the GIL released: the plugin joins its threads, and one of
 * them may be waiting for the GIL to run a promise callback. If executions or
 * copies are still running then, destroying would wait for them, perhaps
 * forever, or pull the plugin's work runner from under them: the client goes
 * to the reaper instead (state.c).
 */
#include "client.h"

#include <stdlib.h>

static pjrt_py_client* client_new(const PJRT_Api* api, PJRT_Client* client, int cpu) {
  pjrt_py_client* c = (pjrt_py_client*)calloc(1, sizeof(*c));
  pjrt_py_epoch* e = (pjrt_py_epoch*)calloc(1, sizeof(*e));
  if (c == NULL || e == NULL) {
    free(c);
    free(e);
    return NULL;
  }
  c->api = api;
  c->client = client;
  c->refs = 1;
  c->cpu = cpu;
  c->generation = g_generation;
  pthread_mutex_init(&c->mu, NULL);
  cond_init(&c->cv);
  c->oldest = c->newest = e;
  registry_add(c);
  return c;
}

static void kv_holder_release(void* arg); /* kv_store.c */

static void client_destroy_pjrt(pjrt_py_client* c) {
  PJRT_Client* client = __atomic_exchange_n(&c->client, NULL, __ATOMIC_ACQ_REL);
  if (client == NULL) return;
  staging_ring_release(c, client); /* idle: no staged copy in flight */
  PJRT_Client_Destroy_Args args = {0};
  args.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
  args.client = client;
  error_destroy(c->api, c->api->PJRT_Client_Destroy(&args));
  /* The plugin can no longer call the key-value store: release it, now if
   * this thread holds the GIL, else queued for the interpreter. On the
   * reaper's thread once the exit has begun, the store is kept instead: the
   * interpreter may be finalizing, and its queue with it. */
  void* kv = __atomic_exchange_n(&c->kv, NULL, __ATOMIC_ACQ_REL);
  if (kv == NULL) return;
  if (PyGILState_Check())
    kv_holder_release(kv);
  else
    run_with_gil_unless_exiting(kv_holder_release, kv);
}

/* Frees the struct, unless an execution or a copy is still counted (its
 * callback would touch it): then it is leaked. Not in the registry any more. */
static void client_free(pjrt_py_client* c) {
  if (completion_running(c) != 0 || transfers_in_flight(c) != 0) return;
  while (c->oldest != NULL) {
    pjrt_py_epoch* e = c->oldest;
    c->oldest = e->next;
    free(e);
  }
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c->place_devices);
  free(c->place_memories);
  free(c);
}

/* The default memory of one of c's devices, or NULL if not known. */
static PJRT_Memory* client_default_memory(const pjrt_py_client* c, PJRT_Device* device) {
  for (size_t i = 0; i < c->num_places; ++i)
    if (c->place_devices[i] == device) return c->place_memories[i];
  return NULL;
}

static void client_ref(pjrt_py_client* c) { c->refs++; }

static void client_unref(pjrt_py_client* c) {
  if (--c->refs != 0) return;
  /* Inherited from a parent process: its threads are gone; leave it. At exit:
   * exit_sequence() decides (it is still in the registry). */
  if (c->generation != g_generation || phase() != PHASE_RUNNING) return;
  /* The reaper's thread destroys it when: an effects_barrier() let go of a
   * zombie; executions still run (destroying would wait for them); or this
   * is a PJRT thread, inside a callback (the plugin would join itself). */
  if (__atomic_load_n(&c->zombie, __ATOMIC_ACQUIRE) || completion_running(c) != 0 ||
      transfers_in_flight(c) != 0 ||
      t_in_callback > 0) {
    reaper_adopt(c);
    return;
  }
  pthread_mutex_lock(&g_registry_mu);
  registry_remove_locked(c);
  pthread_mutex_unlock(&g_registry_mu);
  Py_BEGIN_ALLOW_THREADS
  client_destroy_pjrt(c);
  Py_END_ALLOW_THREADS
  client_free(c);
}

/* Start a PJRT call on `c` that runs without the GIL: checks that the client
 * may take new work, and holds it until client_leave(). */
static int client_enter(pjrt_py_client* c, const char* what) {
  if (state_check_usable(c, what) < 0) return -1;
  client_enter_checked(c);
  return 0;
}

/* client_enter for a client the caller just checked. */
static void client_enter_checked(pjrt_py_client* c) {
  c->refs++;
  c->calls++;
}

static void client_leave(pjrt_py_client* c) {
  c->calls--;
  client_unref(c);
}
