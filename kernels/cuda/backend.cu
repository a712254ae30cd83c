/*
 * backend.cu - the weft_cuda module's entry point: the device-op table that
 * runtime/gpu.c loads (wf_gpu_module.h), the kernel registry (wf_kreg.h: every op's
 * variants, one .cu per op), the module's error state and its cuBLAS handles.
 *
 * Only wf_gpu_module_entry is exported (the module is built with hidden
 * visibility). The module does not link the runtime library, which would give it
 * a second copy of the runtime's globals; instead it defines its own wf_log and
 * wf_vlog, which forward to the host's logger handed over at init().
 *
 * Workspace: one device allocation per device, made when the device is selected and
 * kept until the last fini(), holding cuBLASLt's workspace and the column reductions'
 * partial sums (WF_KREG_GPU_WORKSPACE bytes, which the planner adds too). It is the
 * only device memory the module allocates for itself, and it is counted with the
 * runtime's through the host (account_device), so mem=, the metrics and --estimate
 * all see it. Nothing here allocates per call. The exception is attention's bf16 paths
 * under runtime.attention (attention_impl.cu, cudnn_sdpa.cu): their bf16 copies of fp32
 * operands and cuDNN's workspace still come from the stream-ordered pool, uncounted.
 *
 * cuBLAS(Lt): one cuBLASLt handle per device, created lazily at the first GEMM. One
 * module-level handle is enough because weft drives one device per process from one
 * compute thread (one rank per GPU), and a handle is costly to create (it loads
 * kernels), so a handle per call would only add latency. The workspace is used in
 * stream order: GEMMs and column reductions of a device are all issued on its compute
 * stream, so consecutive ones reuse it in order; the module's lock is held while a GEMM
 * is enqueued so that two threads never interleave their use of it.
 *
 * Errors: launches are asynchronous and the launchers return void like their CPU
 * twins, so the first failure is kept in g_first_error and handed out (then
 * cleared) by last_error().
 */
#include <atomic>
#include <mutex>
#include <stdio.h>

#include "attn_int.h"
#include "cuda_int.h"

#define MAX_DEVICES 64

static std::atomic<const wf_gpu_host *> g_host{nullptr};
static std::atomic<int> g_first_error{0};
static std::atomic<uint64_t> g_launches{0};
/* cuBLASLt's part of the workspace: what NVIDIA recommends for Hopper (32 MiB; 4 MiB
 * suffices before it), enough for every algorithm its heuristics return for weft's
 * shapes. The rest holds the column reductions' partial sums. */
#define LT_WORKSPACE_BYTES ((size_t)32 << 20)
static_assert(WF_KREG_GPU_WORKSPACE > LT_WORKSPACE_BYTES, "no room for partial sums");

static std::mutex g_lock; /* guards g_refs and g_dev */
static int g_refs;
static struct {
  cublasLtHandle_t handle;
  void *workspace; /* WF_KREG_GPU_WORKSPACE bytes */
} g_dev[MAX_DEVICES];

static void account(int64_t bytes)
{
  const wf_gpu_host *h = g_host.load();
  if (h && h->account_device)
    h->account_device(bytes);
}

/* ---- logging through the host ------------------------------------------------- */

extern "C" void wf_vlog(int level, const char *file, int line, const char *fmt, va_list ap)
{
  const wf_gpu_host *h = g_host.load();
  if (h && h->vlog) {
    h->vlog(level, file, line, fmt, ap);
    return;
  }
  fprintf(stderr, "[weft cuda %s:%d] ", file, line); /* before init: still say it */
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

extern "C" void wf_log(int level, const char *file, int line, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  wf_vlog(level, file, line, fmt, ap);
  va_end(ap);
}

/* ---- error state ---------------------------------------------------------------- */

void wf__cuda_record(int err)
{
  int none = 0;
  g_first_error.compare_exchange_strong(none, err ? err : -1);
}

bool wf__cuda_check(cudaError_t e, const char *file, int line, const char *what)
{
  if (e == cudaSuccess)
    return true;
  wf_log(WF_LOG_ERROR, file, line, "%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
  wf__cuda_record((int)e);
  return false;
}

void wf__cuda_count_launch(void) { g_launches.fetch_add(1, std::memory_order_relaxed); }

static uint64_t launches(void) { return g_launches.load(std::memory_order_relaxed); }

bool wf__cuda_check_launch(const char *file, int line, const char *what)
{
  wf__cuda_count_launch();
  return wf__cuda_check(cudaGetLastError(), file, line, what);
}

wf_status wf__cuda_last_error(void) { return g_first_error.exchange(0) ? WF_ECUDA : WF_OK; }

/* ---- cuBLASLt ---------------------------------------------------------------------- */

static bool lt_failed(cublasStatus_t st, const char *file, int line, const char *what)
{
  if (st == CUBLAS_STATUS_SUCCESS)
    return false;
  wf_log(WF_LOG_ERROR, file, line, "%s: %s (cuBLAS status %d)", what, cublasLtGetStatusString(st),
         (int)st);
  wf__cuda_record(-(int)st);
  return true;
}

/* The device's stream-ordered pool keeps what it has allocated (cuDNN's workspace, a
 * GEMM's bias copy) instead of returning it to the driver at every synchronization, its
 * default: the training step synchronizes every step (the loss), and each step's first
 * cudaMallocAsync would otherwise map memory anew. The pool holds at most the largest
 * set of stream-ordered buffers live at once. */
static bool pool_keep(int dev, const char *file, int line)
{
  cudaMemPool_t pool = NULL;
  uint64_t keep = UINT64_MAX;
  return wf__cuda_check(cudaDeviceGetDefaultMemPool(&pool, dev), file, line,
                        "cudaDeviceGetDefaultMemPool") &&
         wf__cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), file,
                        line, "cudaMemPoolSetAttribute (release threshold)");
}

/* The current device's workspace, allocated (and counted) if missing, and its pool set
 * to keep its memory; g_lock held. */
static bool workspace_ensure(int dev, const char *file, int line)
{
  if (g_dev[dev].workspace)
    return true;
  void *ws = NULL;
  if (!pool_keep(dev, file, line) || !wf__cuda_check(cudaMalloc(&ws, WF_KREG_GPU_WORKSPACE), file,
                                                     line, "cudaMalloc (the module's workspace)"))
    return false;
  g_dev[dev].workspace = ws;
  account((int64_t)WF_KREG_GPU_WORKSPACE);
  return true;
}

/* The current device's handle, created if missing, and its workspace; g_lock held. */
static bool lt_ensure(int dev, const char *file, int line)
{
  if (!workspace_ensure(dev, file, line))
    return false;
  if (g_dev[dev].handle)
    return true;
  cublasLtHandle_t h = NULL;
  if (lt_failed(cublasLtCreate(&h), file, line, "cublasLtCreate"))
    return false;
  g_dev[dev].handle = h;
  return true;
}

/* The current device's number, checked against MAX_DEVICES. */
static bool current_device(int *dev, const char *file, int line)
{
  if (!wf__cuda_check(cudaGetDevice(dev), file, line, "cudaGetDevice"))
    return false;
  if (*dev >= 0 && *dev < MAX_DEVICES)
    return true;
  wf_log(WF_LOG_ERROR, file, line, "CUDA device %d: weft supports devices 0..%d", *dev,
         MAX_DEVICES - 1);
  wf__cuda_record(-1);
  return false;
}

bool wf__lt_begin(wf__lt *lt, const char *file, int line)
{
  int dev = 0;
  if (!current_device(&dev, file, line))
    return false;
  g_lock.lock();
  if (!lt_ensure(dev, file, line)) {
    g_lock.unlock();
    return false;
  }
  lt->handle = g_dev[dev].handle;
  lt->workspace = g_dev[dev].workspace;
  lt->workspace_bytes = LT_WORKSPACE_BYTES;
  return true;
}

bool wf__partials(float **part, size_t *floats, const char *file, int line)
{
  int dev = 0;
  if (!current_device(&dev, file, line))
    return false;
  std::lock_guard<std::mutex> guard(g_lock);
  if (!workspace_ensure(dev, file, line))
    return false;
  *part = (float *)((char *)g_dev[dev].workspace + LT_WORKSPACE_BYTES);
  *floats = (WF_KREG_GPU_WORKSPACE - LT_WORKSPACE_BYTES) / sizeof(float);
  return true;
}

bool wf__lt_end(cublasStatus_t st, const char *file, int line, const char *what)
{
  g_lock.unlock();
  wf__cuda_count_launch();
  return !lt_failed(st, file, line, what);
}

/* Destroy every handle and workspace, each with its own device current, then restore
 * the current device. */
static void destroy_workspaces(void)
{
  int cur = 0;
  bool have_cur = cudaGetDevice(&cur) == cudaSuccess;
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (!g_dev[d].handle && !g_dev[d].workspace)
      continue;
    if (cudaSetDevice(d) == cudaSuccess) {
      if (g_dev[d].workspace) {
        cudaFree(g_dev[d].workspace);
        account(-(int64_t)WF_KREG_GPU_WORKSPACE);
      }
      if (g_dev[d].handle)
        cublasLtDestroy(g_dev[d].handle);
    }
    g_dev[d].handle = NULL;
    g_dev[d].workspace = NULL;
  }
  if (have_cur)
    cudaSetDevice(cur);
}

/* ---- device ops -------------------------------------------------------------------- */

static int op_init(const wf_gpu_host *host)
{
  std::lock_guard<std::mutex> guard(g_lock);
  g_host.store(host);
  g_refs++;
  return 0;
}

static void op_fini(void)
{
  std::lock_guard<std::mutex> guard(g_lock);
  if (g_refs > 0 && --g_refs == 0) {
    destroy_workspaces();
    wf__cudnn_sdpa_release();
  }
}

static const char *op_error_str(int err)
{
  if (err < 0)
    return "cuBLAS or module error";
  return cudaGetErrorString((cudaError_t)err);
}

/* cudaGetDeviceCount leaves its argument untouched on failure, hence n = 0. */
static int op_probe(int *count, char *detail, size_t len)
{
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  *count = 0;
  if (e == cudaSuccess && n > 0) {
    *count = n;
    return WF_GPU_PROBE_OK;
  }
  if (e == cudaSuccess) {
    snprintf(detail, len, "cudaGetDeviceCount found 0 devices");
    return WF_GPU_PROBE_NO_DEVICE;
  }
  snprintf(detail, len, "cudaGetDeviceCount: %s, CUDA error %d", cudaGetErrorString(e), (int)e);
  cudaGetLastError(); /* do not leave it for the next launch check */
  switch (e) {
  case cudaErrorInsufficientDriver: /* 35: no libcuda.so.1, or an older one */
  case cudaErrorStubLibrary:        /* 34: the toolkit's stub libcuda */
  case cudaErrorSystemDriverMismatch: return WF_GPU_PROBE_NO_DRIVER;
  case cudaErrorNoDevice: /* 100 */ return WF_GPU_PROBE_NO_DEVICE;
  default: return WF_GPU_PROBE_ERROR;
  }
}

/* The device's workspace comes with it, so that the memory counted from here on is
 * what the device keeps (the planner counts it too). */
static int op_set_device(int device)
{
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess || device >= MAX_DEVICES)
    return (int)e;
  std::lock_guard<std::mutex> guard(g_lock);
  return workspace_ensure(device, __FILE__, __LINE__) ? 0 : (int)cudaErrorMemoryAllocation;
}

static int op_device_name(int device, char *name, size_t len)
{
  cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e == cudaSuccess)
    snprintf(name, len, "%s", p.name);
  return (int)e;
}

static int op_pci_bus_id(int device, char *bus_id, size_t len)
{
  return (int)cudaDeviceGetPCIBusId(bus_id, (int)(len < 64 ? len : 64), device);
}

static int op_malloc(void **ptr, size_t bytes) { return (int)cudaMalloc(ptr, bytes); }
static int op_free(void *ptr) { return (int)cudaFree(ptr); }

static int op_memcpy_h2d(void *dst, const void *src, size_t bytes)
{
  return (int)cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
}

static int op_memcpy_d2h(void *dst, const void *src, size_t bytes)
{
  return (int)cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
}

static int op_memset(void *dst, int value, size_t bytes)
{
  return (int)cudaMemset(dst, value, bytes);
}

/* Blocking streams: the legacy default stream (used by the synchronous memcpy
 * above) waits for them, so a copy after a launch sees the launch's results. */
static int op_stream_create(void **stream)
{
  cudaStream_t s = NULL;
  cudaError_t e = cudaStreamCreate(&s);
  *stream = e == cudaSuccess ? (void *)s : NULL;
  return (int)e;
}

static int op_stream_destroy(void *stream) { return (int)cudaStreamDestroy((cudaStream_t)stream); }
static int op_stream_sync(void *stream) { return (int)cudaStreamSynchronize((cudaStream_t)stream); }

static int op_is_device_ptr(const void *ptr)
{
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static int op_memcpy_async(void *dst, const void *src, size_t bytes, int kind, void *stream)
{
  static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                         cudaMemcpyDeviceToDevice};
  return (int)cudaMemcpyAsync(dst, src, bytes, kinds[kind], (cudaStream_t)stream);
}

static int op_memset_async(void *dst, int value, size_t bytes, void *stream)
{
  return (int)cudaMemsetAsync(dst, value, bytes, (cudaStream_t)stream);
}

static int op_event_create(void **event)
{
  cudaEvent_t e = NULL;
  cudaError_t r = cudaEventCreate(&e);
  *event = r == cudaSuccess ? (void *)e : NULL;
  return (int)r;
}

static int op_event_destroy(void *event) { return (int)cudaEventDestroy((cudaEvent_t)event); }

static int op_event_record(void *event, void *stream)
{
  return (int)cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
}

static int op_stream_wait_event(void *stream, void *event)
{
  return (int)cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
}

static int op_event_sync(void *event) { return (int)cudaEventSynchronize((cudaEvent_t)event); }

static int op_event_elapsed_ms(float *ms, void *start, void *end)
{
  return (int)cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end);
}

static int op_host_alloc(void **ptr, size_t bytes) { return (int)cudaMallocHost(ptr, bytes); }
static int op_host_free(void *ptr) { return (int)cudaFreeHost(ptr); }

static int op_mem_info(size_t *free_bytes, size_t *total_bytes)
{
  return (int)cudaMemGetInfo(free_bytes, total_bytes);
}

static int op_device_attrs(int device, int *sm_count, int *cc_major, int *cc_minor)
{
  cudaError_t e = cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(cc_major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(cc_minor, cudaDevAttrComputeCapabilityMinor, device);
  return (int)e;
}

static size_t op_workspace_bytes(void) { return WF_KREG_GPU_WORKSPACE; }

/* ---- the registry ------------------------------------------------------------------ */

static const wf_kvariants *const kernel_ops[] = {
#define WF__CUDA_OP_REF(name) &wf__cuda_##name,
    WF_OP_LIST(WF__CUDA_OP_REF)
#undef WF__CUDA_OP_REF
};

static const wf_kreg kreg = {
    WF_KREG_ABI,
    "cuda",
    (int)(sizeof kernel_ops / sizeof *kernel_ops),
    kernel_ops,
    op_workspace_bytes,
    wf__cuda_last_error,
    launches,
};

static const wf_gpu_ops ops = {
    WF_GPU_MODULE_ABI,
    "cuda",
    op_init,
    op_fini,
    op_error_str,
    op_probe,
    op_set_device,
    op_device_name,
    op_pci_bus_id,
    op_malloc,
    op_free,
    op_memcpy_h2d,
    op_memcpy_d2h,
    op_memset,
    op_stream_create,
    op_stream_destroy,
    op_stream_sync,
    op_is_device_ptr,
    op_memcpy_async,
    op_memset_async,
    op_event_create,
    op_event_destroy,
    op_event_record,
    op_stream_wait_event,
    op_event_sync,
    op_event_elapsed_ms,
    op_host_alloc,
    op_host_free,
    op_mem_info,
    op_device_attrs,
    &kreg,
};

extern "C" WF_EXPORT const wf_gpu_ops *wf_gpu_module_entry(void) { return &ops; }
