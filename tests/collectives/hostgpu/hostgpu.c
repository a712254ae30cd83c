/*
 * hostgpu.c - a GPU stand-in for tests on machines without one: a libweft_cuda.so
 * whose "device" is host memory, behind the real module table (wf_gpu_module.h).
 *
 * What it is for: the orchestration around device buffers (which transport a
 * communicator gives them, host staging, inheritance of the device path, the host
 * synchronisations a path costs) runs on the CPU exactly as it does beside a GPU,
 * because the collectives ask the module, not the hardware, what is device memory.
 * What it is not: a GPU. It has no kernel registry (so wf_dev_open_cuda refuses it), no
 * NCCL, no streams (every operation is done when it returns). Its memory is plain
 * host memory, so nothing here can show a device pointer dereferenced on the host;
 * tests use it to check paths and values, never speed.
 *
 * Device memory is every block its malloc returned (a small table, searched by range),
 * so is_device_ptr answers as CUDA's pointer attributes do.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wf_gpu_module.h"

#define EXPORT     __attribute__((visibility("default")))
#define MAX_BLOCKS 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char *p;
  size_t n;
} blocks[MAX_BLOCKS];
static int n_blocks;

static int init(const wf_gpu_host *h)
{
  (void)h;
  return 0;
}

static void fini(void) {}
static const char *error_str(int e) { return e ? "host stand-in error" : "no error"; }

static int probe(int *count, char *detail, size_t len)
{
  (void)detail, (void)len;
  *count = 1;
  return WF_GPU_PROBE_OK;
}

static int set_device(int d) { return d == 0 ? 0 : 1; }

static int device_name(int d, char *name, size_t len)
{
  snprintf(name, len, "weft host stand-in %d", d);
  return 0;
}

static int pci_bus_id(int d, char *bus, size_t len)
{
  snprintf(bus, len, "0000:%02x:00.0", d);
  return 0;
}

static int dmalloc(void **p, size_t n)
{
  int err = 1;
  pthread_mutex_lock(&lock);
  if (n_blocks < MAX_BLOCKS && (*p = calloc(1, n ? n : 1))) {
    blocks[n_blocks].p = *p, blocks[n_blocks].n = n;
    n_blocks++;
    err = 0;
  }
  pthread_mutex_unlock(&lock);
  return err;
}

static int dfree(void *p)
{
  pthread_mutex_lock(&lock);
  for (int i = 0; i < n_blocks; i++)
    if (blocks[i].p == p) {
      blocks[i] = blocks[--n_blocks];
      free(p);
      break;
    }
  pthread_mutex_unlock(&lock);
  return 0;
}

static int is_device_ptr(const void *p)
{
  const char *q = p;
  int found = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < n_blocks && !found; i++)
    found = q >= blocks[i].p && q < blocks[i].p + (blocks[i].n ? blocks[i].n : 1);
  pthread_mutex_unlock(&lock);
  return found;
}

static int copy(void *dst, const void *src, size_t n)
{
  memmove(dst, src, n);
  return 0;
}

static int copy_async(void *dst, const void *src, size_t n, int kind, void *s)
{
  (void)kind, (void)s;
  return copy(dst, src, n);
}

static int dmemset(void *p, int v, size_t n)
{
  memset(p, v, n);
  return 0;
}

static int memset_async(void *p, int v, size_t n, void *s)
{
  (void)s;
  return dmemset(p, v, n);
}

/* Streams are never waited on: every operation has finished when it returns. */
static int stream_create(void **s)
{
  *s = malloc(1);
  return *s ? 0 : 1;
}

static int stream_free(void *s)
{
  free(s);
  return 0;
}

static int nothing(void *s)
{
  (void)s;
  return 0;
}

static int stream_wait_event(void *s, void *e)
{
  (void)s, (void)e;
  return 0;
}

/* An event is the time it was recorded at. */
static int event_create(void **e)
{
  *e = calloc(1, sizeof(double));
  return *e ? 0 : 1;
}

static int event_record(void *e, void *s)
{
  struct timespec ts;
  (void)s;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *(double *)e = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
  return 0;
}

static int elapsed(float *ms, void *a, void *b)
{
  *ms = (float)((*(double *)b - *(double *)a) * 1e3);
  return 0;
}

static int host_alloc(void **p, size_t n)
{
  *p = malloc(n ? n : 1);
  return *p ? 0 : 1;
}

static int host_free(void *p)
{
  free(p);
  return 0;
}

static int mem_info(size_t *f, size_t *t)
{
  *f = *t = (size_t)1 << 30;
  return 0;
}

static int attrs(int d, int *sm, int *major, int *minor)
{
  (void)d;
  *sm = 1, *major = 0, *minor = 0;
  return 0;
}

static const wf_gpu_ops ops = {
    .abi = WF_GPU_MODULE_ABI,
    .name = "host stand-in",
    .init = init,
    .fini = fini,
    .error_str = error_str,
    .probe = probe,
    .set_device = set_device,
    .device_name = device_name,
    .pci_bus_id = pci_bus_id,
    .malloc = dmalloc,
    .free = dfree,
    .memcpy_h2d = copy,
    .memcpy_d2h = copy,
    .memset = dmemset,
    .stream_create = stream_create,
    .stream_destroy = stream_free,
    .stream_sync = nothing,
    .is_device_ptr = is_device_ptr,
    .memcpy_async = copy_async,
    .memset_async = memset_async,
    .event_create = event_create,
    .event_destroy = stream_free,
    .event_record = event_record,
    .stream_wait_event = stream_wait_event,
    .event_sync = nothing,
    .event_elapsed_ms = elapsed,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .mem_info = mem_info,
    .device_attrs = attrs,
    .kernels = NULL,
};

EXPORT const wf_gpu_ops *wf_gpu_module_entry(void) { return &ops; }
