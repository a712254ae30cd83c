/*
 * device.c - the CPU device (wf_device.h): host memory from the runtime's accounted
 * allocator, the CPU kernels, and streams and events that exist only as handles.
 *
 * Every op has finished when it returns, so a stream is an order that already holds
 * and an event is the wall-clock time at which it was recorded (event_elapsed is then
 * exactly the host time between two records). The kernels are the CPU registry's
 * (registry.c).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_int.h"
#include "wf_device.h"
#include "wf_kernels.h"

/* ---- memory -------------------------------------------------------------------- */

static wf_status cpu_alloc(void *impl, void **p, size_t bytes)
{
  *p = wf_mem_alloc(bytes);
  if (*p)
    return WF_OK;
  WF_ERROR("out of host memory allocating %zu bytes", bytes);
  return WF_ENOMEM;
}

static void cpu_free(void *impl, void *p) { wf_mem_free(p); }
static void cpu_host_free(void *impl, void *p, size_t bytes) { wf_mem_free(p); }

struct fill {
  char *p;
  int value;
  size_t n;
};

static void fill_share(void *ctx, int tid, int nt)
{
  const struct fill *f = ctx;
  size_t lo, hi;
  wf__split(f->n, tid, nt, 64, &lo, &hi);
  memset(f->p + lo, f->value, hi - lo);
}

/* Gradient buffers are the size of the model, and one core alone does not reach the
 * memory bandwidth: large fills are split over the kernels' pool. */
static wf_status cpu_memset(void *impl, void *p, int value, size_t bytes, wf_stream *s)
{
  struct fill f = {p, value, bytes};
  wf__parallel(bytes < ((size_t)4 << 20) ? 1 : wf__threads(), fill_share, &f);
  return WF_OK;
}

static wf_status cpu_copy(void *impl, void *dst, const void *src, size_t bytes, wf_copy_kind k,
                          wf_stream *s)
{
  memmove(dst, src, bytes);
  return WF_OK;
}

/* ---- streams and events ------------------------------------------------------------ */

/* Handles only: a distinct non-NULL pointer per stream. */
static wf_status cpu_stream_create(void *impl, wf_stream **s)
{
  *s = malloc(1);
  return *s ? WF_OK : WF_ENOMEM;
}

static void cpu_stream_destroy(void *impl, wf_stream *s) { free(s); }
static wf_status cpu_stream_sync(void *impl, wf_stream *s) { return WF_OK; }

struct wf_event {
  double t; /* wf_now() when recorded; 0 before */
};

static wf_status cpu_event_create(void *impl, wf_event **e)
{
  *e = calloc(1, sizeof **e);
  return *e ? WF_OK : WF_ENOMEM;
}

static void cpu_event_destroy(void *impl, wf_event *e) { free(e); }

static wf_status cpu_event_record(void *impl, wf_event *e, wf_stream *s)
{
  e->t = wf_now();
  return WF_OK;
}

static wf_status cpu_stream_wait(void *impl, wf_stream *s, wf_event *e) { return WF_OK; }
static wf_status cpu_event_sync(void *impl, wf_event *e) { return WF_OK; }

static wf_status cpu_event_elapsed(void *impl, wf_event *a, wf_event *b, double *seconds)
{
  *seconds = b->t - a->t;
  return WF_OK;
}

static void cpu_destroy(void *impl) {}

const wf_dev_ops wf__cpu_dev_ops = {
    .version = WF_DEV_OPS_VERSION,
    .kind = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset = cpu_memset,
    .copy = cpu_copy,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_sync = cpu_event_sync,
    .event_elapsed = cpu_event_elapsed,
    .host_alloc = cpu_alloc,
    .host_free = cpu_host_free,
    .host_visible = true,
    .destroy = cpu_destroy,
};
