/* Buffers: one PJRT_Buffer each (buffer.c, buffer_type.c, memory.c, layout.c). */
#ifndef PJRT_PY_BUFFER_H
#define PJRT_PY_BUFFER_H

#include "accounting.h"
#include "client.h"

enum { BUF_LIVE = 0, BUF_DELETED = 1, BUF_DONATED = 2 };

typedef struct {
  PyObject_HEAD
  PJRT_Buffer* buf;  /* NULL once freed */
  pjrt_py_client* c; /* one reference while the object lives */
  PyObject* client;  /* the Python Client */
  PyObject* meta;    /* (shape, dtype), interned; NULL until read */
  PyObject* weakrefs;
  PJRT_Device* device; /* where buf lives; NULL until asked (buffer_device) */
  PJRT_Memory* memory; /* the memory space it lives in; NULL until asked (buffer_memory) */
  int pins;          /* calls using buf without the GIL (each also holds the client) */
  int exports;       /* DLPack capsules (dlpack_export.c) and staged reads (staging_d2h.c)
                        lending buf's memory, each holding b: it is not donated */
  acct_tag acct;     /* the bytes buf counts (accounting.h) */
  unsigned char state;        /* BUF_* as Python sees it */
  unsigned char ready;        /* known ready without error (never goes back) */
  unsigned char dense;        /* 0 unknown, 1 host memory dense row-major, 2 not */
  unsigned char host_aliased; /* memory the host owns (zero-copy): never donated */
  unsigned char row_major;    /* 0 unknown, 1 row-major (or the plugin cannot say), 2 not */
} BufferObject;

/* What pjrt_py knows of a buffer it made itself (an execution's output, a
 * transfer), set at creation so that no later call asks the plugin: where it
 * lives and how it is laid out. A zero field is unknown, and asked of the
 * plugin on first use, as for any other buffer. */
typedef struct {
  PJRT_Device* device;
  PJRT_Memory* memory;
  unsigned char row_major; /* as BufferObject.row_major */
} buffer_origin;

/* buffer.c */
static PyTypeObject* BufferType;
static BufferObject* buffer_wrap(PyObject* client, pjrt_py_client* c, PJRT_Buffer* buf,
                                 PyObject* meta, PJRT_Device* device);
static BufferObject* buffer_wrap_uncounted(PyObject* client, pjrt_py_client* c, PJRT_Buffer* buf,
                                           PyObject* meta);
static void buffer_set_origin(BufferObject* b, const buffer_origin* origin);
static PyObject* buffer_meta(BufferObject* b);
static int buffer_pin(BufferObject* b);
static void buffer_unpin(BufferObject* b);

/* accounting.c */
static void acct_buffer(BufferObject* b, PJRT_Device* device);

/* layout.c */
static int buffer_row_major_state(BufferObject* b, size_t ndim);

#endif
