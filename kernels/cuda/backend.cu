/*
 * backend.cu - the weft_cuda module's entry point: the device-op table that
 * runtime/gpu.c loads (wf_gpu_module.h), the kernel-launcher table
 * (wf_ktable.h), the module's error state and its cuBLAS handles.
 *
 * Only wf_gpu_module_entry is exported (the module is built with hidden
 * visibility). The module does not link the runtime library, which would give it
 * a second copy of the runtime's globals; instead it defines its own wf_log and
 * wf_vlog, which forward to the host's logger handed over at init().
 *
 * cuBLAS: one handle per device, created lazily at the first GEMM and kept in the
 * module until the last fini(). One module-level handle is enough because weft
 * drives one device per process from one compute thread (one rank per GPU), and a
 * handle is costly to create (it allocates workspace and loads kernels), so a
 * handle per call or per stream would only add latency. The handle is shared by
 * every stream: a GEMM takes the module's cuBLAS lock, binds the handle to its
 * stream and enqueues, so two threads can never interleave cublasSetStream with
 * another thread's GEMM.
 *
 * Errors: launches are asynchronous and the launchers return void like their CPU
 * twins, so the first failure is kept in g_first_error and handed out (then
 * cleared) by last_error().
 */
#include <atomic>
#include <mutex>
#include <stdio.h>

#include "cuda_int.h"

#define MAX_DEVICES 64

static std::atomic<const wf_gpu_host *> g_host{nullptr};
static std::atomic<int> g_first_error{0};
static std::mutex g_lock; /* guards g_refs and g_cublas */
static int g_refs;
static cublasHandle_t g_cublas[MAX_DEVICES];

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

bool wf__cuda_check_launch(const char *file, int line, const char *what)
{
  return wf__cuda_check(cudaGetLastError(), file, line, what);
}

wf_status wf_cuda_last_error(void) { return g_first_error.exchange(0) ? WF_ECUDA : WF_OK; }

/* ---- cuBLAS ------------------------------------------------------------------------ */

cublasHandle_t wf__cublas_begin(cudaStream_t stream, const char *file, int line)
{
  int dev = 0;
  if (!wf__cuda_check(cudaGetDevice(&dev), file, line, "cudaGetDevice"))
    return NULL;
  if (dev < 0 || dev >= MAX_DEVICES) {
    wf_log(WF_LOG_ERROR, file, line, "CUDA device %d: weft supports devices 0..%d", dev,
           MAX_DEVICES - 1);
    wf__cuda_record(-1);
    return NULL;
  }
  g_lock.lock();
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (!g_cublas[dev]) {
    cublasHandle_t h = NULL;
    st = cublasCreate(&h);
    if (st == CUBLAS_STATUS_SUCCESS)
      g_cublas[dev] = h;
  }
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasSetStream(g_cublas[dev], stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    wf__cublas_end(st, file, line, "cublasCreate/cublasSetStream");
    return NULL;
  }
  return g_cublas[dev];
}

void wf__cublas_end(cublasStatus_t st, const char *file, int line, const char *what)
{
  g_lock.unlock();
  if (st == CUBLAS_STATUS_SUCCESS)
    return;
  wf_log(WF_LOG_ERROR, file, line, "%s: %s (cuBLAS status %d)", what, cublasGetStatusString(st),
         (int)st);
  wf__cuda_record(-(int)st);
}

/* Destroy every handle, each with its own device current, then restore it. */
static void destroy_cublas_handles(void)
{
  int cur = 0;
  bool have_cur = cudaGetDevice(&cur) == cudaSuccess;
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (!g_cublas[d])
      continue;
    if (cudaSetDevice(d) == cudaSuccess)
      cublasDestroy(g_cublas[d]);
    g_cublas[d] = NULL;
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
  if (g_refs > 0 && --g_refs == 0)
    destroy_cublas_handles();
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

static int op_set_device(int device) { return (int)cudaSetDevice(device); }

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

/* ---- the tables ------------------------------------------------------------------ */

static const wf_ktable kernels = {
    WF_KTABLE_VERSION,
    wf_cuda_encoder_forward,
    wf_cuda_encoder_backward,
    wf_cuda_encoder_forward_vp,
    wf_cuda_encoder_backward_vp,
    wf_cuda_layernorm_forward,
    wf_cuda_layernorm_backward,
    wf_cuda_matmul_forward,
    wf_cuda_matmul_backward,
    wf_cuda_attention_forward,
    wf_cuda_attention_backward,
    wf_cuda_gelu_forward,
    wf_cuda_gelu_backward,
    wf_cuda_residual_forward,
    wf_cuda_residual_backward,
    wf_cuda_xent_stats,
    wf_cuda_xent_pack,
    wf_cuda_xent_combine,
    wf_cuda_xent_loss,
    wf_cuda_xent_backward,
    wf_cuda_loss_accumulate,
    wf_cuda_tokens_check,
    wf_cuda_adamw_update,
    wf_cuda_sumsq_acc,
    wf_cuda_scale,
    wf_cuda_round_bf16,
    wf_cuda_round_fp16,
    wf_cuda_last_error,
};

static const wf_gpu_ops ops = {
    WF_GPU_MODULE_ABI, "cuda",         op_init,          op_fini,       op_error_str,
    op_probe,          op_set_device,  op_device_name,   op_pci_bus_id, op_malloc,
    op_free,           op_memcpy_h2d,  op_memcpy_d2h,    op_memset,     op_stream_create,
    op_stream_destroy, op_stream_sync, op_is_device_ptr, &kernels,
};

extern "C" WF_EXPORT const wf_gpu_ops *wf_gpu_module_entry(void) { return &ops; }
