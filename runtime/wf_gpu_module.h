/*
 * wf_gpu_module.h - the binary interface between runtime/gpu.c and a GPU backend
 * module (libweft_cuda.so, built from kernels/cuda/).
 *
 * The module exports one symbol, WF_GPU_MODULE_ENTRY, a function returning a
 * table of function pointers (the way an NCCL transport is a table). Everything
 * else in the module is hidden. The runtime never links the CUDA libraries: it
 * dlopen()s the module, so a missing libcudart is a load failure with a reason,
 * not a binary that cannot start.
 *
 * Invariants:
 *  - No CUDA types cross this interface: streams and device pointers are void *,
 *    errors are the backend's int codes (0 = success) turned into text by
 *    error_str().
 *  - The module is not linked against the runtime (that would give it a second
 *    copy of the runtime's globals). What it needs from the host, logging and the
 *    accounting of the device memory it keeps for itself (its workspace), it gets
 *    through wf_gpu_host at init(). Every other allocation is the runtime's.
 *  - init()/fini() are reference counted by the module: each wf_gpu_open() calls
 *    init() once and its wf_gpu_close() calls fini() once.
 *  - `abi` must equal WF_GPU_MODULE_ABI; bump it whenever this struct changes.
 */
#ifndef WF_GPU_MODULE_H
#define WF_GPU_MODULE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_GPU_MODULE_ABI   3
#define WF_GPU_MODULE_ENTRY "wf_gpu_module_entry"

/* What probe() found. */
enum {
  WF_GPU_PROBE_OK = 0,        /* count >= 1 */
  WF_GPU_PROBE_NO_DRIVER = 1, /* no (or too old a) driver: libcuda missing */
  WF_GPU_PROBE_NO_DEVICE = 2, /* a driver but no visible device */
  WF_GPU_PROBE_ERROR = 3,     /* anything else; `detail` says what */
};

/* Services the host lends the module. */
typedef struct wf_gpu_host {
  void (*vlog)(int level, const char *file, int line, const char *fmt, va_list ap);
  /* Device memory the module allocated (bytes > 0) or freed (< 0) for itself, counted
   * with the runtime's (wf_mem_get_stats), so that mem= and the metrics include it. */
  void (*account_device)(int64_t bytes);
} wf_gpu_host;

typedef struct wf_gpu_ops {
  int abi;          /* WF_GPU_MODULE_ABI */
  const char *name; /* "cuda" */

  int (*init)(const wf_gpu_host *host);
  void (*fini)(void);
  const char *(*error_str)(int err);
  /* Counts devices; *count is 0 unless the result is WF_GPU_PROBE_OK. `detail`
   * gets the failing call and its error text. */
  int (*probe)(int *count, char *detail, size_t len);

  /* Each returns 0 or a backend error code. */
  int (*set_device)(int device);
  int (*device_name)(int device, char *name, size_t len);
  int (*pci_bus_id)(int device, char *bus_id, size_t len);
  int (*malloc)(void **ptr, size_t bytes);
  int (*free)(void *ptr);
  int (*memcpy_h2d)(void *dst, const void *src, size_t bytes);
  int (*memcpy_d2h)(void *dst, const void *src, size_t bytes);
  int (*memset)(void *dst, int value, size_t bytes);
  int (*stream_create)(void **stream);
  int (*stream_destroy)(void *stream);
  int (*stream_sync)(void *stream);
  int (*is_device_ptr)(const void *ptr); /* 1 device or managed, 0 otherwise */
  /* Asynchronous on `stream` (NULL: the legacy default stream); kind 0 host to device,
   * 1 device to host, 2 device to device. A copy into pageable host memory has finished
   * when it returns, as CUDA guarantees. */
  int (*memcpy_async)(void *dst, const void *src, size_t bytes, int kind, void *stream);
  int (*memset_async)(void *dst, int value, size_t bytes, void *stream);
  int (*event_create)(void **event); /* with timing */
  int (*event_destroy)(void *event);
  int (*event_record)(void *event, void *stream);
  int (*stream_wait_event)(void *stream, void *event);
  int (*event_sync)(void *event);
  int (*event_elapsed_ms)(float *ms, void *start, void *end);
  /* Page-locked host memory, for staging copies. */
  int (*host_alloc)(void **ptr, size_t bytes);
  int (*host_free)(void *ptr);
  /* Free and total bytes of the current device; its SM count and compute capability. */
  int (*mem_info)(size_t *free_bytes, size_t *total_bytes);
  int (*device_attrs)(int device, int *sm_count, int *cc_major, int *cc_minor);

  /* The kernels: a `const wf_kreg *` (kernels/wf_kreg.h).
   * The runtime hands it out untyped so that it does not depend on kernels/. */
  const void *kernels;
} wf_gpu_ops;

typedef const wf_gpu_ops *(*wf_gpu_module_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* WF_GPU_MODULE_H */
