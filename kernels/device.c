/*
 * device.c - the device seam's common layer (wf_device.h): argument checks, logging
 * and the staged views, over any implementation's table.
 *
 * Invariants: a device's ops table has every entry (checked at creation); a view with
 * a staging buffer owns it until unmap; the CPU device is one object that no call
 * mutates but its sync counter, so it is the one shared instance every CPU rank and
 * test uses.
 *
 * Host synchronisations are counted here, above every implementation, by what the
 * call means (the host waits until the device is done), so the CPU device counts what
 * a GPU would wait for: a test of the CPU path sees how often a step would stall a GPU.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_check.h"
#include "wf_device.h"

struct wf_dev {
  const wf_dev_ops *ops;
  void *impl;
  const wf_kreg *reg;
  wf_kset sets[WF_DT_COUNT]; /* reg resolved, by element type */
  char name[32];
  atomic_uint_fast64_t syncs; /* host synchronisations so far */
};

static void synced(wf_dev *d) { atomic_fetch_add_explicit(&d->syncs, 1, memory_order_relaxed); }

/* kernels/cpu/device.c, kernels/cpu/registry.c */
extern const wf_dev_ops wf__cpu_dev_ops;
extern const wf_kreg wf__cpu_kreg;

static wf_dev cpu_dev = {.ops = &wf__cpu_dev_ops, .reg = &wf__cpu_kreg, .name = "cpu"};
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_resolve(void) { wf_kset_resolve(cpu_dev.sets, cpu_dev.reg); }

wf_dev *wf_dev_cpu(void)
{
  pthread_once(&cpu_once, cpu_resolve);
  return &cpu_dev;
}

static bool ops_complete(const wf_dev_ops *o)
{
  return o && o->version == WF_DEV_OPS_VERSION && o->alloc && o->free && o->memset && o->copy &&
         o->stream_create && o->stream_destroy && o->stream_sync && o->event_create &&
         o->event_destroy && o->event_record && o->stream_wait && o->event_sync &&
         o->event_elapsed && o->host_alloc && o->host_free && o->destroy;
}

wf_status wf_dev_create(wf_dev **out, const wf_dev_ops *ops, void *impl, const wf_kreg *reg,
                        const char *name)
{
  wf_status st = WF_OK;
  wf_dev *d = NULL;
  *out = NULL;
  WF_CHECK(ops_complete(ops) && reg && reg->abi == WF_KREG_ABI, WF_EINVAL,
           "device '%s': incomplete device table, or kernel registry ABI %d (expected %d)", name,
           reg ? reg->abi : -1, WF_KREG_ABI);
  WF_CHECK_ALLOC(d = calloc(1, sizeof *d));
  d->ops = ops, d->impl = impl, d->reg = reg;
  wf_kset_resolve(d->sets, reg);
  wf_strlcpy(d->name, name, sizeof d->name);
  *out = d;
fail:
  return st;
}

void wf_dev_close(wf_dev *d)
{
  if (!d || d == &cpu_dev)
    return;
  d->ops->destroy(d->impl);
  free(d);
}

const char *wf_dev_name(const wf_dev *d) { return d->name; }
bool wf_dev_host_visible(const wf_dev *d) { return d->ops->host_visible; }
const wf_kset *wf_dev_kernels(const wf_dev *d, int dt)
{
  return dt >= 0 && dt < WF_DT_COUNT ? &d->sets[dt] : NULL;
}

wf_status wf_dev_alloc(wf_dev *d, void **p, size_t bytes)
{
  *p = NULL;
  return bytes ? d->ops->alloc(d->impl, p, bytes) : WF_OK;
}

void wf_dev_free(wf_dev *d, void *p)
{
  if (p)
    d->ops->free(d->impl, p);
}

wf_status wf_dev_alloc_floats(wf_dev *d, float **p, size_t n)
{
  *p = NULL;
  if (n > SIZE_MAX / sizeof(float)) {
    WF_ERROR("%s: %zu floats do not fit in memory", d->name, n);
    return WF_ENOMEM;
  }
  return wf_dev_alloc(d, (void **)p, n * sizeof(float));
}

wf_status wf_dev_memset(wf_dev *d, void *p, int value, size_t bytes, wf_stream *s)
{
  return bytes ? d->ops->memset(d->impl, p, value, bytes, s) : WF_OK;
}

/* A copy to the host returns once it has finished: a synchronisation. */
wf_status wf_dev_copy(wf_dev *d, void *dst, const void *src, size_t bytes, wf_copy_kind k,
                      wf_stream *s)
{
  if (!bytes || dst == src)
    return WF_OK;
  if (k == WF_COPY_D2H)
    synced(d);
  return d->ops->copy(d->impl, dst, src, bytes, k, s);
}

wf_status wf_dev_stream_create(wf_dev *d, wf_stream **s)
{
  return d->ops->stream_create(d->impl, s);
}

void wf_dev_stream_destroy(wf_dev *d, wf_stream *s)
{
  if (s)
    d->ops->stream_destroy(d->impl, s);
}

wf_status wf_dev_stream_sync(wf_dev *d, wf_stream *s)
{
  synced(d);
  return d->ops->stream_sync(d->impl, s);
}
wf_status wf_dev_event_create(wf_dev *d, wf_event **e) { return d->ops->event_create(d->impl, e); }

void wf_dev_event_destroy(wf_dev *d, wf_event *e)
{
  if (e)
    d->ops->event_destroy(d->impl, e);
}

wf_status wf_dev_event_record(wf_dev *d, wf_event *e, wf_stream *s)
{
  return d->ops->event_record(d->impl, e, s);
}

wf_status wf_dev_stream_wait(wf_dev *d, wf_stream *s, wf_event *e)
{
  return d->ops->stream_wait(d->impl, s, e);
}

wf_status wf_dev_event_sync(wf_dev *d, wf_event *e)
{
  synced(d);
  return d->ops->event_sync(d->impl, e);
}

wf_status wf_dev_event_elapsed(wf_dev *d, wf_event *a, wf_event *b, double *seconds)
{
  return d->ops->event_elapsed(d->impl, a, b, seconds);
}

wf_status wf_dev_map(wf_dev *d, wf_dev_view *v, void *p, size_t bytes, wf_map_mode mode)
{
  wf_status st = WF_OK;
  *v = (wf_dev_view){.host = p, .dev = p, .bytes = bytes, .mode = mode};
  if (d->ops->host_visible || bytes == 0)
    return WF_OK;
  WF_TRY(d->ops->host_alloc(d->impl, &v->stage, bytes));
  v->host = v->stage;
  if (mode & WF_MAP_READ)
    WF_TRY(wf_dev_read(d, v->host, p, bytes));
  return WF_OK;
fail:
  d->ops->host_free(d->impl, v->stage, bytes);
  v->stage = v->host = NULL;
  return st;
}

wf_status wf_dev_unmap(wf_dev *d, wf_dev_view *v)
{
  wf_status st = WF_OK;
  if (v->stage && (v->mode & WF_MAP_WRITE))
    st = wf_dev_write(d, v->dev, v->stage, v->bytes);
  if (v->stage)
    d->ops->host_free(d->impl, v->stage, v->bytes);
  v->stage = v->host = NULL;
  return st;
}

/* The default stream's earlier work first, so the bytes read are its results. One
 * synchronisation: the copy and the wait end together. */
wf_status wf_dev_read(wf_dev *d, void *host, const void *p, size_t bytes)
{
  if (!bytes)
    return WF_OK;
  synced(d);
  wf_status st = host == p ? WF_OK : d->ops->copy(d->impl, host, p, bytes, WF_COPY_D2H, NULL);
  return st == WF_OK ? d->ops->stream_sync(d->impl, NULL) : st;
}

wf_status wf_dev_write(wf_dev *d, void *p, const void *host, size_t bytes)
{
  if (!bytes || p == host)
    return WF_OK;
  synced(d);
  wf_status st = d->ops->copy(d->impl, p, host, bytes, WF_COPY_H2D, NULL);
  return st == WF_OK ? d->ops->stream_sync(d->impl, NULL) : st;
}

uint64_t wf_dev_host_syncs(const wf_dev *d)
{
  return atomic_load_explicit(&((wf_dev *)d)->syncs, memory_order_relaxed);
}

wf_status wf_dev_check(wf_dev *d) { return d->reg->last_error(); }
