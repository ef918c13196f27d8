/* Clients: the reference-counted PJRT client (client_ref.c, completion.c)
 * and ClientCore, the native base of pjrt_py.Client (client.c). */
#ifndef PJRT_PY_CLIENT_H
#define PJRT_PY_CLIENT_H

#include "common.h"

typedef struct pjrt_py_epoch {
  long id;
  long running;
  struct pjrt_py_epoch* next;
} pjrt_py_epoch;

struct pjrt_py_client {
  const PJRT_Api* api;
  PJRT_Client* client; /* NULL once destroyed */
  long refs;           /* owners (see above); the last one destroys. Changed with the GIL */
  long calls;          /* PJRT calls in flight without the GIL. Changed with the GIL */
  long transfers;      /* host<->device copies in flight (completion.c). Atomic */
  int closed;          /* close() ran: new work is refused */
  int cpu;             /* platform "cpu": CPU-only fast paths apply */
  int zombie;          /* no owner left but executions still run: the reaper ends it */
  unsigned long generation; /* the process generation it was made in (fork) */
  PJRT_Device* default_device;
  /* Each addressable device and its default memory (NULL where the plugin
   * has none), num_places of each, malloc'd (client.c: _set_devices): where
   * a transfer that names no memory lands, known without asking. */
  PJRT_Device** place_devices;
  PJRT_Memory** place_memories;
  size_t num_places;
  void* kv;           /* the key-value store's holder (kv_store.c), or NULL */
  struct staging_ring* staging; /* staged transfers' ring (staging_ring.c), or NULL */
  pthread_mutex_t mu; /* guards the epochs */
  pthread_cond_t cv;  /* an epoch emptied */
  pjrt_py_epoch* oldest;
  pjrt_py_epoch* newest;
  struct pjrt_py_client* prev; /* the registry of live clients (state.c) */
  struct pjrt_py_client* next;
};

typedef struct {
  PyObject_HEAD
  pjrt_py_client* c; /* NULL until attached */
  PyObject* dict;    /* the Python subclass's attributes */
  PyObject* weakrefs;
} ClientCoreObject;

/* client_ref.c */
static void client_ref(pjrt_py_client* c);
static void client_unref(pjrt_py_client* c);
static int client_enter(pjrt_py_client* c, const char* what);
static void client_enter_checked(pjrt_py_client* c);
static void client_leave(pjrt_py_client* c);
static PJRT_Memory* client_default_memory(const pjrt_py_client* c, PJRT_Device* device);

/* client.c */
static PyTypeObject* ClientCoreType;

/* staging_ring.c: frees c's ring before its PJRT client is destroyed */
static void staging_ring_release(pjrt_py_client* c, PJRT_Client* client);

#endif
