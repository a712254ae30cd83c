/*
 * wf_device.h - the device seam: where a rank's tensors live and how its ops run.
 *
 * The model, the parallel engines and the optimizer reach memory and kernels only
 * through a wf_dev. A device is a table of functions (wf_dev_ops, versioned) plus the
 * kernel registry (wf_kreg.h), the way NCCL's transports and libuv's platform layer are
 * tables; callers never ask which implementation they hold. Two exist:
 *  - the CPU device (wf_dev_cpu): host memory from the runtime's accounted allocator,
 *    the OpenBLAS kernels of kernels/cpu, one implicit stream on which every op has
 *    finished when it returns;
 *  - the CUDA device (wf_dev_open_cuda, kernels/device_cuda.c): memory of one GPU, its
 *    streams and events, page-locked staging, and the CUDA kernels of the weft_cuda
 *    module, which runtime/gpu.c loads.
 *
 * Device memory. A pointer from wf_dev_alloc is memory of the device: host code must
 * not dereference it (on the CPU device it happens to be host memory, which is why the
 * CPU path costs nothing extra). The host reaches it through copies, or through a
 * staged view for I/O (wf_dev_map): on the CPU a view is the memory itself; on a GPU it
 * is a host buffer filled from (READ) or written back to (WRITE) the device.
 *
 * Streams and ordering. Every op takes a stream; NULL is the device's default stream.
 * Work on one stream runs in order. An event recorded on one stream can be waited for
 * by another (stream_wait) or by the host (event_sync). Copies between host and device
 * are asynchronous on their stream; a copy into pageable host memory (D2H) has
 * finished when wf_dev_copy returns.
 *
 * Errors. Every function returns a wf_status and logs what failed where it failed.
 * Kernel launches cannot fail synchronously on a GPU: wf_dev_check() reports (and
 * clears) the first failed launch since the last check, naming the kernel in the log.
 */
#ifndef WF_DEVICE_H
#define WF_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_gpu.h"
#include "wf_kreg.h"
#include "wf_op_headers.h" /* the ops' tables, for WF_K */
#include "wf_runtime.h"

typedef struct wf_dev wf_dev;
typedef struct wf_event wf_event;

typedef enum wf_copy_kind { WF_COPY_H2D = 0, WF_COPY_D2H, WF_COPY_D2D } wf_copy_kind;

/* Access of a staged view: READ fills the view from the device; WRITE writes it back
 * when unmapped (its contents start undefined unless READ is set too). */
typedef enum wf_map_mode { WF_MAP_READ = 1, WF_MAP_WRITE = 2, WF_MAP_RW = 3 } wf_map_mode;

typedef struct wf_dev_view {
  void *host;   /* where the host reads or writes the bytes */
  void *dev;    /* the device memory viewed */
  size_t bytes; /* bytes viewed */
  int mode;     /* wf_map_mode */
  void *stage;  /* the device's staging buffer, or NULL when host is dev itself */
} wf_dev_view;

/* The implementation of a device. Every function pointer is required. */
#define WF_DEV_OPS_VERSION 1
typedef struct wf_dev_ops {
  int version;      /* WF_DEV_OPS_VERSION */
  const char *kind; /* "cpu", "cuda" */
  wf_status (*alloc)(void *impl, void **p, size_t bytes);
  void (*free)(void *impl, void *p);
  wf_status (*memset)(void *impl, void *p, int value, size_t bytes, wf_stream *s);
  wf_status (*copy)(void *impl, void *dst, const void *src, size_t bytes, wf_copy_kind k,
                    wf_stream *s);
  wf_status (*stream_create)(void *impl, wf_stream **s);
  void (*stream_destroy)(void *impl, wf_stream *s);
  wf_status (*stream_sync)(void *impl, wf_stream *s);
  wf_status (*event_create)(void *impl, wf_event **e);
  void (*event_destroy)(void *impl, wf_event *e);
  wf_status (*event_record)(void *impl, wf_event *e, wf_stream *s);
  wf_status (*stream_wait)(void *impl, wf_stream *s, wf_event *e);
  wf_status (*event_sync)(void *impl, wf_event *e);
  wf_status (*event_elapsed)(void *impl, wf_event *a, wf_event *b, double *seconds);
  /* Pinned host memory for staging (plain host memory on the CPU). */
  wf_status (*host_alloc)(void *impl, void **p, size_t bytes);
  void (*host_free)(void *impl, void *p, size_t bytes);
  /* Whether device memory is host memory (views need no staging). */
  bool host_visible;
  void (*destroy)(void *impl);
} wf_dev_ops;

/* The CPU device: no state, never destroyed (wf_dev_close ignores it). */
wf_dev *wf_dev_cpu(void);
/* A device over the GPU `gpu` has selected (wf_gpu_set_device); the GPU is borrowed and
 * must outlive the device. WF_ENODEV, with `why`, when the GPU module's kernel registry is
 * missing or of another version. */
wf_status wf_dev_open_cuda(wf_dev **out, wf_gpu *gpu, char *why, size_t why_len);
void wf_dev_close(wf_dev *d); /* accepts NULL */

/* "cpu" or "cuda:N". */
const char *wf_dev_name(const wf_dev *d);
/* Whether device memory is host memory (the CPU device). For choices of cost, not of
 * correctness: code must work on both without asking. */
bool wf_dev_host_visible(const wf_dev *d);
/* The device's ops of element type dt (a wf_dtype), or NULL for no such type. Before
 * computing with a set, state the ops needed (wf_kset_need). */
const wf_kset *wf_dev_kernels(const wf_dev *d, int dt);

/* Memory: zeroed, 64-byte aligned, counted in the runtime's memory statistics (host or
 * device). bytes 0 gives NULL and WF_OK. */
wf_status wf_dev_alloc(wf_dev *d, void **p, size_t bytes);
void wf_dev_free(wf_dev *d, void *p); /* accepts NULL */
/* n floats (the common case), with the size overflow checked. */
wf_status wf_dev_alloc_floats(wf_dev *d, float **p, size_t n);
wf_status wf_dev_memset(wf_dev *d, void *p, int value, size_t bytes, wf_stream *s);
wf_status wf_dev_copy(wf_dev *d, void *dst, const void *src, size_t bytes, wf_copy_kind k,
                      wf_stream *s);

wf_status wf_dev_stream_create(wf_dev *d, wf_stream **s);
void wf_dev_stream_destroy(wf_dev *d, wf_stream *s); /* accepts NULL */
wf_status wf_dev_stream_sync(wf_dev *d, wf_stream *s);
wf_status wf_dev_event_create(wf_dev *d, wf_event **e);
void wf_dev_event_destroy(wf_dev *d, wf_event *e); /* accepts NULL */
wf_status wf_dev_event_record(wf_dev *d, wf_event *e, wf_stream *s);
/* Work queued on `s` after this call waits for what `e` recorded. */
wf_status wf_dev_stream_wait(wf_dev *d, wf_stream *s, wf_event *e);
wf_status wf_dev_event_sync(wf_dev *d, wf_event *e);
/* Seconds between two recorded events, after both completed. */
wf_status wf_dev_event_elapsed(wf_dev *d, wf_event *a, wf_event *b, double *seconds);

/* A host view of `bytes` of device memory at `p` (see the top of the file); a READ
 * view waits for the default stream first. Every successful map is paired with one
 * unmap, which writes a WRITE view back (synchronously) and releases the staging. */
wf_status wf_dev_map(wf_dev *d, wf_dev_view *v, void *p, size_t bytes, wf_map_mode mode);
wf_status wf_dev_unmap(wf_dev *d, wf_dev_view *v);
/* Host <-> device scalars and small arrays, synchronously (a loss, a norm, a flag). */
wf_status wf_dev_read(wf_dev *d, void *host, const void *p, size_t bytes);
wf_status wf_dev_write(wf_dev *d, void *p, const void *host, size_t bytes);

/* How many times the host has waited for the device through d: each stream or event
 * synchronisation, copy to the host, wf_dev_read and wf_dev_write (one each), counted
 * by what the call means on any device, so the CPU device counts what a GPU would wait
 * for. A training step may wait only where a value must reach the host. */
uint64_t wf_dev_host_syncs(const wf_dev *d);

/* The first kernel launch that failed since the last check (then cleared): WF_OK, or
 * WF_ECUDA after the launcher logged which kernel failed and why. */
wf_status wf_dev_check(wf_dev *d);

/* For implementations: a device over `ops` with state `impl` and kernels `reg`, named
 * `name`. The device owns impl (ops->destroy frees it). */
wf_status wf_dev_create(wf_dev **out, const wf_dev_ops *ops, void *impl, const wf_kreg *reg,
                        const char *name);

#endif /* WF_DEVICE_H */
