/*
 * device_cuda.c - the CUDA device (wf_device.h): one GPU's memory, streams, events and
 * page-locked staging through the runtime's GPU loader (runtime/gpu.c, which owns the
 * dlopen()ed weft_cuda module), and the module's kernel registry.
 *
 * Nothing here links CUDA: every call goes through wf_gpu_*, so a binary built with
 * this file still starts on a machine without CUDA (the device simply cannot be
 * opened). Streams and events are the module's cudaStream_t and cudaEvent_t, passed
 * through as opaque pointers; NULL is the legacy default stream, on which the model
 * runs, and which waits for (and is waited for by) every blocking stream.
 *
 * Invariant: wf_dev_alloc's memory is zeroed, as the CPU device's is (cudaMalloc's is
 * not): allocation is followed by a memset on the default stream.
 */
#include <stdio.h>
#include <stdlib.h>

#include "wf_check.h"
#include "wf_device.h"

typedef struct cuda_dev {
  wf_gpu *gpu; /* borrowed */
} cuda_dev;

static wf_gpu *gpu_of(void *impl) { return ((cuda_dev *)impl)->gpu; }

static wf_status cuda_alloc(void *impl, void **p, size_t bytes)
{
  wf_status st = wf_gpu_malloc(gpu_of(impl), p, bytes);
  if (st == WF_OK)
    st = wf_gpu_memset_async(gpu_of(impl), *p, 0, bytes, NULL);
  return st;
}

static void cuda_free(void *impl, void *p) { wf_gpu_free(gpu_of(impl), p); }

static wf_status cuda_memset(void *impl, void *p, int value, size_t bytes, wf_stream *s)
{
  return wf_gpu_memset_async(gpu_of(impl), p, value, bytes, s);
}

static wf_status cuda_copy(void *impl, void *dst, const void *src, size_t bytes, wf_copy_kind k,
                           wf_stream *s)
{
  int kind = k == WF_COPY_H2D ? 0 : k == WF_COPY_D2H ? 1 : 2;
  return wf_gpu_memcpy_async(gpu_of(impl), dst, src, bytes, kind, s);
}

static wf_status cuda_stream_create(void *impl, wf_stream **s)
{
  void *p = NULL;
  wf_status st = wf_gpu_stream_create(gpu_of(impl), &p);
  *s = p;
  return st;
}

static void cuda_stream_destroy(void *impl, wf_stream *s)
{
  wf_gpu_stream_destroy(gpu_of(impl), s);
}

static wf_status cuda_stream_sync(void *impl, wf_stream *s)
{
  return wf_gpu_stream_sync(gpu_of(impl), s);
}

static wf_status cuda_event_create(void *impl, wf_event **e)
{
  void *p = NULL;
  wf_status st = wf_gpu_event_create(gpu_of(impl), &p);
  *e = p;
  return st;
}

static void cuda_event_destroy(void *impl, wf_event *e) { wf_gpu_event_destroy(gpu_of(impl), e); }

static wf_status cuda_event_record(void *impl, wf_event *e, wf_stream *s)
{
  return wf_gpu_event_record(gpu_of(impl), e, s);
}

static wf_status cuda_stream_wait(void *impl, wf_stream *s, wf_event *e)
{
  return wf_gpu_stream_wait_event(gpu_of(impl), s, e);
}

static wf_status cuda_event_sync(void *impl, wf_event *e)
{
  return wf_gpu_event_sync(gpu_of(impl), e);
}

static wf_status cuda_event_elapsed(void *impl, wf_event *a, wf_event *b, double *seconds)
{
  return wf_gpu_event_elapsed(gpu_of(impl), a, b, seconds);
}

static wf_status cuda_host_alloc(void *impl, void **p, size_t bytes)
{
  return wf_gpu_host_alloc(gpu_of(impl), p, bytes);
}

static void cuda_host_free(void *impl, void *p, size_t bytes)
{
  wf_gpu_host_free(gpu_of(impl), p, bytes);
}

static void cuda_destroy(void *impl) { free(impl); }

static const wf_dev_ops cuda_ops = {
    .version = WF_DEV_OPS_VERSION,
    .kind = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .memset = cuda_memset,
    .copy = cuda_copy,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait = cuda_stream_wait,
    .event_sync = cuda_event_sync,
    .event_elapsed = cuda_event_elapsed,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .host_visible = false,
    .destroy = cuda_destroy,
};

wf_status wf_dev_open_cuda(wf_dev **out, wf_gpu *gpu, char *why, size_t why_len)
{
  const void *raw = gpu ? wf_gpu_kernel_table(gpu) : NULL;
  const wf_kreg *k = wf_kreg_check(raw);
  char name[32];
  *out = NULL;
  if (!k) {
    snprintf(why, why_len,
             "the GPU module's kernel registry is %s (this weft expects ABI %d); rebuild weft",
             raw ? "of another ABI" : "missing", WF_KREG_ABI);
    return WF_ENODEV;
  }
  cuda_dev *impl = calloc(1, sizeof *impl);
  if (!impl) {
    snprintf(why, why_len, "out of memory");
    return WF_ENOMEM;
  }
  impl->gpu = gpu;
  snprintf(name, sizeof name, "cuda:%d", wf_gpu_current_device(gpu));
  wf_status st = wf_dev_create(out, &cuda_ops, impl, k, name);
  if (st != WF_OK) {
    free(impl);
    snprintf(why, why_len, "cannot create the CUDA device (see above)");
  }
  return st;
}
