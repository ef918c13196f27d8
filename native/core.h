/* pjrt_py._core: what the native files share.
 *
 * The module is one translation unit (core.c includes every .c file here), so
 * everything here is static. Who owns what:
 *
 *   pjrt_py_client   one PJRT client, reference counted (client_ref.c). The
 *                    Python Client holds a reference until close(); so does
 *                    every Buffer, Loaded executable and no-output promise,
 *                    and every PJRT call made without the GIL (a "call").
 *   BufferObject     one PJRT_Buffer. Freed once, by delete() or dealloc;
 *                    never while a call uses it (pins, buffer.c).
 *   PromiseObject    PJRT events, made lazily, destroyed at dealloc.
 *   LoadedObject     one PJRT_LoadedExecutable, shared by the Executables of
 *                    one compiled program; dispatch holds it for the call.
 *
 * Every PJRT call is made either with the GIL held (quick queries, destroys)
 * or, for anything that may take time (Execute, large copies, waits), with
 * the GIL released and its objects pinned. Process phases (fork, exit) are in
 * state.c: after fork the inherited objects never call PJRT again; from exit
 * on nothing does.
 */
#ifndef PJRT_PY_CORE_H
#define PJRT_PY_CORE_H

/* One header per native type, on the shared helpers (common.h). */
#include "common.h"
#include "client.h"
#include "buffer.h"
#include "promise.h"
#include "executable.h"
#include "dlpack.h"

#endif
