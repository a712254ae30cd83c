/*
 * wf_gpu.h - the GPU backend as seen from host code.
 *
 * The CUDA runtime, cuBLAS and the CUDA kernels live in a shared module
 * (libweft_cuda.so, built from kernels/cuda/) that is dlopen()ed here, so one
 * worker binary runs with or without CUDA. wf_gpu_open() says in one line why
 * there is no GPU: the module or the CUDA libraries are missing, there is no
 * driver, or there is no device. Public headers carry no CUDA types: streams and
 * device pointers are plain void pointers.
 */
#ifndef WF_GPU_H
#define WF_GPU_H

#include <stddef.h>

#include "wf_runtime.h"

typedef struct wf_gpu wf_gpu;

/* Load the module and count devices. On failure *out is NULL and `why` holds the
 * reason for the "falling back to CPU" log line. The status is WF_ENODEV when the
 * machine has no GPU (no NVIDIA driver, or a driver that reports no device), and
 * WF_ECUDA when a GPU is present but unusable (the module or a CUDA library does not
 * load, the driver is too old, initialisation fails): a test skips only on the first. */
wf_status wf_gpu_open(wf_gpu **out, char *why, size_t why_len);

/* Ask the NVIDIA driver (libcuda.so.1) directly, without the module: WF_OK with
 * *devices >= 1; WF_ENODEV when there is no driver (or only the toolkit's stub) or it
 * reports no device; WF_ECUDA when it fails otherwise. *version is the CUDA version the
 * driver supports (13000 = 13.0), 0 when unknown; `why` says what was found. */
wf_status wf_gpu_driver_probe(int *devices, int *version, char *why, size_t why_len);
void wf_gpu_close(wf_gpu *g); /* accepts NULL */

int wf_gpu_device_count(const wf_gpu *g);
/* The device last selected with wf_gpu_set_device (0 before). */
int wf_gpu_current_device(const wf_gpu *g);
wf_status wf_gpu_set_device(wf_gpu *g, int device);
/* Name (e.g. "NVIDIA H100 80GB HBM3") and PCI bus id ("0000:19:00.0") of a device. */
wf_status wf_gpu_device_name(wf_gpu *g, int device, char *name, size_t len);
wf_status wf_gpu_pci_bus_id(wf_gpu *g, int device, char *bus_id, size_t len);

/* Device memory, accounted in wf_mem_get_stats(). */
wf_status wf_gpu_malloc(wf_gpu *g, void **ptr, size_t bytes);
void wf_gpu_free(wf_gpu *g, void *ptr); /* accepts NULL */
wf_status wf_gpu_memcpy_h2d(wf_gpu *g, void *dst, const void *src, size_t bytes);
wf_status wf_gpu_memcpy_d2h(wf_gpu *g, void *dst, const void *src, size_t bytes);
wf_status wf_gpu_memset(wf_gpu *g, void *dst, int value, size_t bytes);
wf_status wf_gpu_stream_create(wf_gpu *g, void **stream);
void wf_gpu_stream_destroy(wf_gpu *g, void *stream);
wf_status wf_gpu_stream_sync(wf_gpu *g, void *stream);
/* Asynchronous operations on a stream (a cudaStream_t; NULL = the default stream).
 * kind: 0 host to device, 1 device to host, 2 device to device. */
wf_status wf_gpu_memcpy_async(wf_gpu *g, void *dst, const void *src, size_t bytes, int kind,
                              void *stream);
wf_status wf_gpu_memset_async(wf_gpu *g, void *dst, int value, size_t bytes, void *stream);
/* Events (cudaEvent_t, with timing). */
wf_status wf_gpu_event_create(wf_gpu *g, void **event);
void wf_gpu_event_destroy(wf_gpu *g, void *event); /* accepts NULL */
wf_status wf_gpu_event_record(wf_gpu *g, void *event, void *stream);
wf_status wf_gpu_stream_wait_event(wf_gpu *g, void *stream, void *event);
wf_status wf_gpu_event_sync(wf_gpu *g, void *event);
wf_status wf_gpu_event_elapsed(wf_gpu *g, void *start, void *end, double *seconds);
/* Page-locked host memory (for staging), accounted as host memory; free it with the
 * size it was allocated with. */
wf_status wf_gpu_host_alloc(wf_gpu *g, void **ptr, size_t bytes);
void wf_gpu_host_free(wf_gpu *g, void *ptr, size_t bytes); /* accepts NULL */
/* The selected device's free and total memory; a device's SM count and compute
 * capability (for its nominal peak). */
wf_status wf_gpu_mem_info(wf_gpu *g, size_t *free_bytes, size_t *total_bytes);
wf_status wf_gpu_device_attrs(wf_gpu *g, int device, int *sm_count, int *cc_major, int *cc_minor);
/* True when `ptr` is device (or managed) memory: how collectives choose NCCL vs MPI. */
int wf_gpu_is_device_ptr(wf_gpu *g, const void *ptr);

/* The module's raw symbol table, for modules layered on it (kernels, NCCL): the
 * dlopen() handle, for wf_module_sym(). */
void *wf_gpu_module_handle(wf_gpu *g);
/* The module's kernel launchers, untyped so that runtime/ does not depend on
 * kernels/: use wf_kreg_check() from kernels/wf_kreg.h on it. */
const void *wf_gpu_kernel_table(wf_gpu *g);

#endif /* WF_GPU_H */
