/* Completion tracking for pjrt_py.effects_barrier().
 *
 * Every execution's completion event comes here. One that is already ready
 * (the CPU plugin runs cheap programs inline at dispatch) is dropped at once,
 * so the common small call pays one readiness check. Otherwise it counts as
 * running in the client's newest epoch until its OnReady callback arrives.
 *
 * A barrier closes the newest epoch (opening a fresh one for later
 * dispatches) and waits until no epoch up to the closed one has executions
 * running. Work dispatched after the barrier started, from any thread, never
 * extends its wait. Epochs are a list, oldest first; one is freed once it is
 * both closed and empty. */

typedef struct {
  pjrt_py_client* c;
  pjrt_py_epoch* epoch;
} pjrt_py_running;

/* Frees the empty closed epochs at the head. Caller holds c->mu. */
static void pjrt_py_epochs_trim(pjrt_py_client* c) {
  while (c->oldest != c->newest && c->oldest->running == 0) {
    pjrt_py_epoch* e = c->oldest;
    c->oldest = e->next;
    free(e);
  }
}

/* One counted execution has completed (or will never be reported). */
static void pjrt_py_running_done(pjrt_py_running* r) {
  pjrt_py_client* c = r->c;
  pthread_mutex_lock(&c->mu);
  r->epoch->running--;
  pjrt_py_epochs_trim(c);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  free(r);
}

static void pjrt_py_completed(PJRT_Error* error, void* user_arg) {
  pjrt_py_running* r = (pjrt_py_running*)user_arg;
  pjrt_py_error_destroy(r->c->api, error); /* the outcome belongs to the execution's outputs */
  pjrt_py_running_done(r);
}

/* Counts one execution until event is ready. Does not take the event: the
 * caller destroys it when it likes (PJRT keeps the callback registered). */
static void pjrt_py_track(pjrt_py_client* c, PJRT_Event* event) {
  if (pjrt_py_event_is_ready(c->api, event)) return;
  pjrt_py_running* r = (pjrt_py_running*)malloc(sizeof(*r));
  if (r == NULL) return; /* the barrier cannot see this one; nothing worse */
  r->c = c;
  pthread_mutex_lock(&c->mu);
  r->epoch = c->newest;
  r->epoch->running++;
  pthread_mutex_unlock(&c->mu);
  PJRT_Event_OnReady_Args args = {0};
  args.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  args.event = event;
  args.callback = pjrt_py_completed;
  args.user_arg = r;
  PJRT_Error* error = c->api->PJRT_Event_OnReady(&args);
  if (error != NULL) { /* no callback will come */
    pjrt_py_error_destroy(c->api, error);
    pjrt_py_running_done(r);
  }
}

long pjrt_py_client_running(pjrt_py_client* c) {
  pthread_mutex_lock(&c->mu);
  long n = 0;
  for (pjrt_py_epoch* e = c->oldest; e != NULL; e = e->next) n += e->running;
  pthread_mutex_unlock(&c->mu);
  return n;
}

int pjrt_py_client_barrier(pjrt_py_client* c) {
  pjrt_py_epoch* fresh = (pjrt_py_epoch*)calloc(1, sizeof(*fresh));
  if (fresh == NULL) return -1;
  pthread_mutex_lock(&c->mu);
  long closed = c->newest->id;
  fresh->id = closed + 1;
  c->newest->next = fresh;
  c->newest = fresh;
  pjrt_py_epochs_trim(c);
  while (c->oldest->id <= closed) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

/* At the client's end: 1 if the epochs were freed, 0 if an execution is
 * still counted (its callback would touch them; they are left alone). */
static int pjrt_py_epochs_free(pjrt_py_client* c) {
  if (pjrt_py_client_running(c)) return 0;
  while (c->oldest != NULL) {
    pjrt_py_epoch* e = c->oldest;
    c->oldest = e->next;
    free(e);
  }
  return 1;
}
