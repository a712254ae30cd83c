/*
 * gpu.c - the GPU backend loader and the device API of wf_gpu.h.
 *
 * The CUDA runtime, cuBLAS and the CUDA kernels live in libweft_cuda.so
 * (kernels/cuda/), which is dlopen()ed here through wf_module_open(); nothing in
 * runtime/ links a CUDA library, so any binary built on runtime starts on a
 * machine without CUDA. The module exports one entry symbol that returns a table
 * of function pointers (wf_gpu_module.h).
 *
 * wf_gpu_open() fails with one sentence saying why, in the order the checks run:
 *   1. the module was not found (not built, or not on the search path);
 *   2. the module was found but could not load (a CUDA library is missing: the
 *      dynamic linker's own message names it);
 *   3. the module is not a weft GPU module or has another ABI version;
 *   4. there is no CUDA driver (cudaErrorInsufficientDriver, 35: no libcuda.so.1);
 *   5. there is a driver but no device (cudaErrorNoDevice, 100, or a count of 0).
 * The status tells "this machine has no GPU" from "a GPU is here but weft cannot use
 * it": after any failure the NVIDIA driver itself is asked (libcuda.so.1, which does
 * not need the module or any CUDA toolkit library; wf_gpu_driver_probe). No driver, or
 * a driver that reports no device, is WF_ENODEV; a driver that sees a GPU (or fails in
 * another way) makes the failure WF_ECUDA. Fallback to the CPU may follow either; a
 * GPU test skips only on WF_ENODEV.
 *
 * Invariants:
 *  - Every byte of device memory handed out by wf_gpu_malloc is counted in
 *    wf_mem_account(WF_MEM_DEVICE, ...) until wf_gpu_free gives it back. cudaFree
 *    does not tell the size, so the live allocations are kept in a small table
 *    (weft allocates a few large buffers, so a linear scan is cheap next to
 *    cudaFree itself).
 *  - Once a device has been found the module stays mapped for the life of the
 *    process (RTLD_NODELETE): the CUDA runtime inside it does not survive being
 *    unmapped while a context exists. Failed opens unload it again.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_gpu.h"
#include "wf_gpu_module.h"
#include "wf_runtime.h"

#define MODULE_NAME "weft_cuda"
#define MODULE_FILE "lib" MODULE_NAME ".so"

typedef struct alloc_rec {
  void *ptr;
  size_t bytes;
} alloc_rec;

struct wf_gpu {
  void *module;          /* dlopen handle */
  const wf_gpu_ops *ops; /* the module's table */
  bool initialised;      /* ops->init succeeded, so close calls ops->fini */
  int count;             /* visible devices, >= 1 once open */
  int device;            /* the device last selected with wf_gpu_set_device */
  pthread_mutex_t lock;  /* guards allocs */
  alloc_rec *allocs;     /* live device allocations */
  size_t n_allocs, cap_allocs;
};

static void account_device(int64_t bytes) { wf_mem_account(WF_MEM_DEVICE, bytes); }

static const wf_gpu_host host_services = {.vlog = wf_vlog, .account_device = account_device};

static void say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void say(char *why, size_t len, const char *fmt, ...)
{
  if (!why || !len)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, len, fmt, ap);
  va_end(ap);
}

/* Turn a backend error code into a logged wf_status. */
static wf_status backend_status(const wf_gpu *g, int err, const char *what, int line)
{
  if (err == 0)
    return WF_OK;
  wf_log(WF_LOG_ERROR, __FILE__, line, "%s: %s (CUDA error %d)", what, g->ops->error_str(err), err);
  return WF_ECUDA;
}
#define BACKEND(g, call, what) backend_status((g), (call), (what), __LINE__)

/* Steps 1-2: find and dlopen the module. wf_module_open keeps the most useful
 * reason: for a module that exists but needs a missing library, the dynamic
 * linker's message naming that library; for a module that is nowhere, its own
 * sentence (or the linker's), which starts with the module's file name. */
static wf_status open_module(wf_gpu *g, char *why, size_t len)
{
  char err[512] = "";
  g->module = wf_module_open(MODULE_NAME, err, sizeof err);
  if (g->module)
    return WF_OK;
  size_t n = strlen(MODULE_FILE);
  bool nowhere = err[0] == '\0' || strstr(err, " not found") != NULL ||
                 (strncmp(err, MODULE_FILE, n) == 0 && (err[n] == ' ' || err[n] == ':'));
  if (nowhere)
    say(why, len,
        "GPU module not found: %s; build weft with -Dcuda=enabled (needs nvcc) or point "
        "WEFT_MODULE_PATH at the folder holding " MODULE_FILE,
        err[0] ? err : MODULE_FILE);
  else if (strstr(err, "cannot open shared object file"))
    say(why, len,
        "GPU module " MODULE_FILE " failed to load, a CUDA library is missing: %s; install "
        "the CUDA runtime or add its lib directory to the linker path",
        err);
  else
    say(why, len, "GPU module " MODULE_FILE " failed to load: %s", err);
  return WF_ENODEV;
}

/* Step 3: resolve the entry symbol, check the ABI, initialise. */
static wf_status bind_module(wf_gpu *g, char *why, size_t len)
{
  void *sym = wf_module_sym(g->module, WF_GPU_MODULE_ENTRY);
  if (!sym) {
    say(why, len, MODULE_FILE " is not a weft GPU module (no symbol " WF_GPU_MODULE_ENTRY ")");
    return WF_ENODEV;
  }
  wf_gpu_module_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry); /* POSIX: object to function pointer */
  g->ops = entry();
  if (!g->ops || g->ops->abi != WF_GPU_MODULE_ABI) {
    say(why, len, MODULE_FILE " has module ABI %d, this runtime expects %d; rebuild weft",
        g->ops ? g->ops->abi : -1, WF_GPU_MODULE_ABI);
    return WF_ENODEV;
  }
  int err = g->ops->init(&host_services);
  if (err != 0) {
    say(why, len, "GPU module failed to initialise: %s (CUDA error %d)", g->ops->error_str(err),
        err);
    return WF_ENODEV;
  }
  g->initialised = true;
  return WF_OK;
}

/* Steps 4-5: is there a driver, and a device? */
static wf_status probe_devices(wf_gpu *g, char *why, size_t len)
{
  char detail[256] = "";
  int count = 0;
  const char *visible = getenv("CUDA_VISIBLE_DEVICES");
  switch (g->ops->probe(&count, detail, sizeof detail)) {
  case WF_GPU_PROBE_OK: g->count = count; return WF_OK;
  case WF_GPU_PROBE_NO_DRIVER:
    say(why, len,
        "no CUDA driver (%s); the NVIDIA driver (libcuda.so.1) is missing or older than "
        "the CUDA runtime",
        detail);
    break;
  case WF_GPU_PROBE_NO_DEVICE:
    say(why, len, "no CUDA device (%s; CUDA_VISIBLE_DEVICES=%s)", detail,
        visible ? visible : "unset");
    break;
  default: say(why, len, "CUDA initialisation failed (%s)", detail); break;
  }
  return WF_ENODEV;
}

/* Keep the module mapped for the life of the process (see the file comment). */
static void pin_module(wf_gpu *g)
{
  Dl_info info;
  void *sym = wf_module_sym(g->module, WF_GPU_MODULE_ENTRY);
  if (sym && dladdr(sym, &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

/* The driver API entry points the probe calls (CUresult is an int, 0 = success). */
#define CU_ERROR_STUB_LIBRARY 34 /* the toolkit's stub libcuda, not a driver */
#define CU_ERROR_NO_DEVICE    100

wf_status wf_gpu_driver_probe(int *devices, int *version, char *why, size_t why_len)
{
  int n = 0, v = 0, (*cu_init)(unsigned) = NULL, (*cu_count)(int *) = NULL,
      (*cu_version)(int *) = NULL;
  *devices = 0;
  if (version)
    *version = 0;
  /* RTLD_NODELETE: after cuInit the driver may run threads; it must stay mapped. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!lib) {
    const char *e = dlerror();
    say(why, why_len, "no NVIDIA driver (%s)", e ? e : "libcuda.so.1 not found");
    return WF_ENODEV;
  }
  *(void **)&cu_init = dlsym(lib, "cuInit");
  *(void **)&cu_count = dlsym(lib, "cuDeviceGetCount");
  *(void **)&cu_version = dlsym(lib, "cuDriverGetVersion");
  if (!cu_init || !cu_count || !cu_version) {
    say(why, why_len, "libcuda.so.1 lacks cuInit, cuDeviceGetCount or cuDriverGetVersion");
    return WF_ECUDA;
  }
  if (cu_version(&v) == 0 && version)
    *version = v;
  int err = cu_init(0);
  if (err == CU_ERROR_STUB_LIBRARY) {
    say(why, why_len, "no NVIDIA driver (libcuda.so.1 is the CUDA toolkit's stub)");
    return WF_ENODEV;
  }
  if (err == 0)
    err = cu_count(&n);
  if (err == CU_ERROR_NO_DEVICE || (err == 0 && n == 0)) {
    say(why, why_len, "the NVIDIA driver (CUDA %d.%d) reports no device", v / 1000, v % 1000 / 10);
    return WF_ENODEV;
  }
  if (err != 0) {
    say(why, why_len, "the NVIDIA driver (CUDA %d.%d) fails: cuInit or cuDeviceGetCount error %d",
        v / 1000, v % 1000 / 10, err);
    return WF_ECUDA;
  }
  *devices = n;
  say(why, why_len, "the NVIDIA driver (CUDA %d.%d) reports %d device(s)", v / 1000, v % 1000 / 10,
      n);
  return WF_OK;
}

/* After a failed open: WF_ENODEV when the driver confirms there is no GPU; otherwise
 * WF_ECUDA, with what the driver says added to `why`. */
static wf_status classify_failure(char *why, size_t len)
{
  char driver[256] = "";
  int devices = 0;
  if (wf_gpu_driver_probe(&devices, NULL, driver, sizeof driver) == WF_ENODEV)
    return WF_ENODEV;
  if (why && len) {
    size_t used = strlen(why);
    snprintf(why + used, len - used, "; yet %s: a GPU is here and weft cannot use it", driver);
  }
  return WF_ECUDA;
}

wf_status wf_gpu_open(wf_gpu **out, char *why, size_t why_len)
{
  if (!out)
    return WF_EINVAL;
  *out = NULL;
  wf_gpu *g = calloc(1, sizeof *g);
  if (!g) {
    say(why, why_len, "out of memory");
    return WF_ENOMEM;
  }
  pthread_mutex_init(&g->lock, NULL);
  wf_status st = open_module(g, why, why_len);
  if (st == WF_OK)
    st = bind_module(g, why, why_len);
  if (st == WF_OK)
    st = probe_devices(g, why, why_len);
  if (st != WF_OK) {
    wf_gpu_close(g);
    if (st == WF_ENODEV)
      st = classify_failure(why, why_len);
    if (why && why_len)
      WF_DEBUG("wf_gpu_open: %s", why);
    return st;
  }
  pin_module(g);
  WF_DEBUG("wf_gpu_open: %d CUDA device(s)", g->count);
  *out = g;
  return WF_OK;
}

/* Device memory still live at close is a leak in the caller: say so, and give
 * it back so the accounting stays balanced. */
static void release_leaks(wf_gpu *g)
{
  if (g->n_allocs == 0)
    return;
  size_t bytes = 0;
  for (size_t i = 0; i < g->n_allocs; i++) {
    bytes += g->allocs[i].bytes;
    g->ops->free(g->allocs[i].ptr);
  }
  WF_WARN("wf_gpu_close: %zu device allocation(s), %zu bytes, were never freed", g->n_allocs,
          bytes);
  wf_mem_account(WF_MEM_DEVICE, -(int64_t)bytes);
  g->n_allocs = 0;
}

void wf_gpu_close(wf_gpu *g)
{
  if (!g)
    return;
  if (g->initialised) {
    release_leaks(g);
    g->ops->fini();
  }
  wf_module_close(g->module);
  pthread_mutex_destroy(&g->lock);
  free(g->allocs);
  free(g);
}

int wf_gpu_device_count(const wf_gpu *g) { return g ? g->count : 0; }
int wf_gpu_current_device(const wf_gpu *g) { return g ? g->device : 0; }

wf_status wf_gpu_set_device(wf_gpu *g, int device)
{
  if (!g)
    return WF_EINVAL;
  if (device < 0 || device >= g->count) {
    WF_ERROR("CUDA device %d does not exist (%d visible)", device, g->count);
    return WF_EINVAL;
  }
  wf_status st = BACKEND(g, g->ops->set_device(device), "cudaSetDevice");
  if (st == WF_OK)
    g->device = device;
  return st;
}

wf_status wf_gpu_device_name(wf_gpu *g, int device, char *name, size_t len)
{
  if (!g || !name || !len)
    return WF_EINVAL;
  return BACKEND(g, g->ops->device_name(device, name, len), "cudaGetDeviceProperties");
}

wf_status wf_gpu_pci_bus_id(wf_gpu *g, int device, char *bus_id, size_t len)
{
  if (!g || !bus_id || !len)
    return WF_EINVAL;
  return BACKEND(g, g->ops->pci_bus_id(device, bus_id, len), "cudaDeviceGetPCIBusId");
}

/* Append to the live-allocation table; false when out of host memory. */
static bool track(wf_gpu *g, void *ptr, size_t bytes)
{
  bool ok = true;
  pthread_mutex_lock(&g->lock);
  if (g->n_allocs == g->cap_allocs) {
    size_t cap = g->cap_allocs ? 2 * g->cap_allocs : 64;
    alloc_rec *a = realloc(g->allocs, cap * sizeof *a);
    if (a) {
      g->allocs = a;
      g->cap_allocs = cap;
    }
  }
  if (g->n_allocs < g->cap_allocs)
    g->allocs[g->n_allocs++] = (alloc_rec){ptr, bytes};
  else
    ok = false;
  pthread_mutex_unlock(&g->lock);
  return ok;
}

/* Remove `ptr` from the table; returns its size, or -1 when it is not there. */
static int64_t untrack(wf_gpu *g, void *ptr)
{
  int64_t bytes = -1;
  pthread_mutex_lock(&g->lock);
  for (size_t i = g->n_allocs; i-- > 0;) {
    if (g->allocs[i].ptr == ptr) {
      bytes = (int64_t)g->allocs[i].bytes;
      g->allocs[i] = g->allocs[--g->n_allocs];
      break;
    }
  }
  pthread_mutex_unlock(&g->lock);
  return bytes;
}

wf_status wf_gpu_malloc(wf_gpu *g, void **ptr, size_t bytes)
{
  if (!g || !ptr)
    return WF_EINVAL;
  *ptr = NULL;
  if (bytes == 0)
    return WF_OK;
  void *p = NULL;
  int err = g->ops->malloc(&p, bytes);
  if (err != 0) {
    WF_ERROR("cudaMalloc of %zu bytes on device %d: %s (CUDA error %d)", bytes, g->device,
             g->ops->error_str(err), err);
    return err == 2 /* cudaErrorMemoryAllocation */ ? WF_ENOMEM : WF_ECUDA;
  }
  if (!track(g, p, bytes)) {
    g->ops->free(p);
    WF_ERROR("out of host memory tracking a device allocation");
    return WF_ENOMEM;
  }
  wf_mem_account(WF_MEM_DEVICE, (int64_t)bytes);
  *ptr = p;
  return WF_OK;
}

void wf_gpu_free(wf_gpu *g, void *ptr)
{
  if (!g || !ptr)
    return;
  int64_t bytes = untrack(g, ptr);
  if (bytes < 0)
    WF_WARN("wf_gpu_free(%p): not allocated by wf_gpu_malloc", ptr);
  else
    wf_mem_account(WF_MEM_DEVICE, -bytes);
  BACKEND(g, g->ops->free(ptr), "cudaFree");
}

wf_status wf_gpu_memcpy_h2d(wf_gpu *g, void *dst, const void *src, size_t bytes)
{
  if (!g || ((!dst || !src) && bytes))
    return WF_EINVAL;
  return BACKEND(g, g->ops->memcpy_h2d(dst, src, bytes), "cudaMemcpy (host to device)");
}

wf_status wf_gpu_memcpy_d2h(wf_gpu *g, void *dst, const void *src, size_t bytes)
{
  if (!g || ((!dst || !src) && bytes))
    return WF_EINVAL;
  return BACKEND(g, g->ops->memcpy_d2h(dst, src, bytes), "cudaMemcpy (device to host)");
}

wf_status wf_gpu_memset(wf_gpu *g, void *dst, int value, size_t bytes)
{
  if (!g || (!dst && bytes))
    return WF_EINVAL;
  return BACKEND(g, g->ops->memset(dst, value, bytes), "cudaMemset");
}

wf_status wf_gpu_stream_create(wf_gpu *g, void **stream)
{
  if (!g || !stream)
    return WF_EINVAL;
  *stream = NULL;
  return BACKEND(g, g->ops->stream_create(stream), "cudaStreamCreate");
}

void wf_gpu_stream_destroy(wf_gpu *g, void *stream)
{
  if (!g || !stream) /* NULL is the default stream, which is never destroyed */
    return;
  BACKEND(g, g->ops->stream_destroy(stream), "cudaStreamDestroy");
}

wf_status wf_gpu_stream_sync(wf_gpu *g, void *stream)
{
  if (!g)
    return WF_EINVAL;
  return BACKEND(g, g->ops->stream_sync(stream), "cudaStreamSynchronize");
}

int wf_gpu_is_device_ptr(wf_gpu *g, const void *ptr)
{
  if (!g || !ptr)
    return 0;
  return g->ops->is_device_ptr(ptr);
}

void *wf_gpu_module_handle(wf_gpu *g) { return g ? g->module : NULL; }

const void *wf_gpu_kernel_table(wf_gpu *g) { return g ? g->ops->kernels : NULL; }

wf_status wf_gpu_memcpy_async(wf_gpu *g, void *dst, const void *src, size_t bytes, int kind,
                              void *stream)
{
  static const char *what[] = {"cudaMemcpyAsync (host to device)",
                               "cudaMemcpyAsync (device to host)",
                               "cudaMemcpyAsync (device to device)"};
  if (!g || kind < 0 || kind > 2 || ((!dst || !src) && bytes))
    return WF_EINVAL;
  return BACKEND(g, g->ops->memcpy_async(dst, src, bytes, kind, stream), what[kind]);
}

wf_status wf_gpu_memset_async(wf_gpu *g, void *dst, int value, size_t bytes, void *stream)
{
  if (!g || (!dst && bytes))
    return WF_EINVAL;
  return BACKEND(g, g->ops->memset_async(dst, value, bytes, stream), "cudaMemsetAsync");
}

wf_status wf_gpu_event_create(wf_gpu *g, void **event)
{
  if (!g || !event)
    return WF_EINVAL;
  *event = NULL;
  return BACKEND(g, g->ops->event_create(event), "cudaEventCreate");
}

void wf_gpu_event_destroy(wf_gpu *g, void *event)
{
  if (g && event)
    BACKEND(g, g->ops->event_destroy(event), "cudaEventDestroy");
}

wf_status wf_gpu_event_record(wf_gpu *g, void *event, void *stream)
{
  if (!g || !event)
    return WF_EINVAL;
  return BACKEND(g, g->ops->event_record(event, stream), "cudaEventRecord");
}

wf_status wf_gpu_stream_wait_event(wf_gpu *g, void *stream, void *event)
{
  if (!g || !event)
    return WF_EINVAL;
  return BACKEND(g, g->ops->stream_wait_event(stream, event), "cudaStreamWaitEvent");
}

wf_status wf_gpu_event_sync(wf_gpu *g, void *event)
{
  if (!g || !event)
    return WF_EINVAL;
  return BACKEND(g, g->ops->event_sync(event), "cudaEventSynchronize");
}

wf_status wf_gpu_event_elapsed(wf_gpu *g, void *start, void *end, double *seconds)
{
  float ms = 0;
  if (!g || !start || !end)
    return WF_EINVAL;
  wf_status st = BACKEND(g, g->ops->event_elapsed_ms(&ms, start, end), "cudaEventElapsedTime");
  *seconds = st == WF_OK ? ms * 1e-3 : 0;
  return st;
}

wf_status wf_gpu_host_alloc(wf_gpu *g, void **ptr, size_t bytes)
{
  if (!g || !ptr)
    return WF_EINVAL;
  *ptr = NULL;
  if (bytes == 0)
    return WF_OK;
  wf_status st = BACKEND(g, g->ops->host_alloc(ptr, bytes), "cudaMallocHost");
  if (st == WF_OK)
    wf_mem_account(WF_MEM_HOST, (int64_t)bytes);
  return st;
}

void wf_gpu_host_free(wf_gpu *g, void *ptr, size_t bytes)
{
  if (!g || !ptr)
    return;
  wf_mem_account(WF_MEM_HOST, -(int64_t)bytes);
  BACKEND(g, g->ops->host_free(ptr), "cudaFreeHost");
}

wf_status wf_gpu_mem_info(wf_gpu *g, size_t *free_bytes, size_t *total_bytes)
{
  if (!g)
    return WF_EINVAL;
  return BACKEND(g, g->ops->mem_info(free_bytes, total_bytes), "cudaMemGetInfo");
}

wf_status wf_gpu_device_attrs(wf_gpu *g, int device, int *sm_count, int *cc_major, int *cc_minor)
{
  if (!g)
    return WF_EINVAL;
  return BACKEND(g, g->ops->device_attrs(device, sm_count, cc_major, cc_minor),
                 "cudaDeviceGetAttribute");
}
