/*
 * attention_impl.cu - attention on the GPU: which implementation runs for a shape
 * (runtime.attention, through the attention op's set_impl) and the entries attention.cu
 * (the fp32 variant) and attention_lse.cu (bf16) register.
 *
 * Implementations (attn_int.h): cuDNN's fused attention (cudnn_sdpa.cu), weft's bf16
 * flash kernels (flash_bf16.cu), the fp32 reference kernels (flash.cu, attention_tt.cu).
 * The choice for a shape (with or without document starts: cuDNN's masked graph is
 * another graph) under a setting is made once, logged in one line, and cached:
 *   reference -> the fp32 kernels;
 *   cudnn, auto -> cuDNN if it loads and builds both plans for the shape, else
 *   flash, auto -> the flash kernels if they take the shape (head size 64 or 128, sm_80+),
 *   else the fp32 kernels; head sizes above 128 always take the fp32 (T, T) kernels.
 * (The worker turns auto into reference unless precision is bf16: docs/gpu-performance.md.)
 *
 * The fp32 entries (wf__attn_forward/backward: the attention op's fp32 variant) convert
 * around the bf16 paths:
 *   forward:  qkv (B,T,3C) fp32 -> bf16 copy (pool); the bf16 path writes O (bf16) and
 *             lse into `att`; O is widened into `out`;
 *   backward: qkv and dout -> bf16 copies (pool); the bf16 path writes dqkv (bf16, pool)
 *             from O and lse in `att`; dqkv (fp32) += that, widened.
 * `att` is laid out the same whatever runs: lse (B,NH,T) floats first, then O (B,T,C) in
 * bf16 (each part 64-byte aligned), for every head size up to 128; the reference forward
 * fills O too, so any forward pairs with any backward and a change of setting between
 * them is harmless. Its size does not depend on the setting, so buffers sized before a
 * change stay right. Above 128 `att` is the (T, T) fallback's (flash.cu).
 *
 * The bf16 entries (wf__attention_bf16_*: the attention_lse op, and the attention op's
 * bf16 variant) run cuDNN or flash, and the fp32 kernels through conversions where
 * neither applies.
 */
#include <atomic>
#include <mutex>

#include <cuda_bf16.h>

#include "attn_int.h"

static std::atomic<int> g_impl{WF_ATTN_REFERENCE}; /* until the worker says otherwise */

void wf__attention_set_impl(int impl)
{
  if (impl >= WF_ATTN_AUTO && impl <= WF_ATTN_REFERENCE)
    g_impl.store(impl);
}

int wf__cuda_cc_major(void)
{
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major;
}

/* ---- the choice ------------------------------------------------------------------- */

#define MAX_CHOICES 64

struct choice {
  int B, T, C, NH, NKV, impl, path;
  bool docs;
};

static std::mutex g_choice_lock; /* guards g_choices (and serialises cuDNN's plan builds) */
static choice g_choices[MAX_CHOICES];
static int g_nchoices;

static const char *impl_name(int p)
{
  return p == WF_ATTN_CUDNN ? "cudnn" : p == WF_ATTN_FLASH ? "flash" : "reference (fp32)";
}

/* The implementation for a shape under `impl`, with the one line that says so: the
 * path, and why each implementation tried before it could not run the shape. */
static int decide(int B, int T, int C, int NH, int NKV, int impl, bool docs)
{
  const char *what = docs ? " with document masks" : "";
  char why_c[256] = "", why_f[256] = "", why[600] = "";
  int hs = C / NH, path = WF_ATTN_REFERENCE;
  if (impl == WF_ATTN_REFERENCE)
    return path;
  if (hs > 128)
    snprintf(why, sizeof why, " (head size %d: above 128 only the fp32 (T, T) kernels)", hs);
  else if ((impl == WF_ATTN_AUTO || impl == WF_ATTN_CUDNN) &&
           wf__cudnn_sdpa_accepts(B, T, C, NH, NKV, docs, why_c, sizeof why_c))
    path = WF_ATTN_CUDNN;
  else if (wf__flash16_applies(B, T, C, NH, NKV, why_f, sizeof why_f))
    path = WF_ATTN_FLASH;
  if (why_c[0])
    snprintf(why, sizeof why, " (cuDNN: %s%s%s)", why_c, why_f[0] ? "; flash: " : "", why_f);
  else if (why_f[0])
    snprintf(why, sizeof why, " (flash: %s)", why_f);
  if (path == impl || (impl == WF_ATTN_AUTO && path == WF_ATTN_CUDNN))
    WF_INFO("attention, B %d x T %d, %d heads of %d (%d kv)%s: %s", B, T, NH, hs, NKV, what,
            impl_name(path));
  else
    WF_INFO("attention, B %d x T %d, %d heads of %d (%d kv)%s: runtime.attention=%s runs %s%s", B,
            T, NH, hs, NKV, what, impl == WF_ATTN_AUTO ? "auto" : impl_name(impl), impl_name(path),
            why);
  return path;
}

static int path_for(int B, int T, int C, int NH, int NKV, int impl, bool docs)
{
  std::lock_guard<std::mutex> guard(g_choice_lock);
  for (int i = 0; i < g_nchoices; i++) {
    const choice &c = g_choices[i];
    if (c.B == B && c.T == T && c.C == C && c.NH == NH && c.NKV == NKV && c.impl == impl &&
        c.docs == docs)
      return c.path;
  }
  int path = decide(B, T, C, NH, NKV, impl, docs);
  if (g_nchoices < MAX_CHOICES) /* past that, decide (and log) again: harmless */
    g_choices[g_nchoices++] = choice{B, T, C, NH, NKV, impl, path, docs};
  return path;
}

static bool shape_ok(int B, int T, int C, int NH, int NKV)
{
  return B > 0 && T > 0 && C > 0 && NH > 0 && NKV > 0 && C % NH == 0 && NH % NKV == 0;
}

int wf__attention_path(int B, int T, int C, int NH, int NKV)
{
  return shape_ok(B, T, C, NH, NKV) ? path_for(B, T, C, NH, NKV, g_impl.load(), false)
                                    : WF_ATTN_REFERENCE;
}

/* ---- conversions ------------------------------------------------------------------- */

/* dst (n) = src rounded to bf16; four elements a thread where both are 16/8-byte aligned
 * (every buffer here is: pool memory and `att`'s 64-byte aligned parts). */
__global__ static void narrow_kernel(__nv_bfloat16 *dst, const float *src, size_t n, int vec)
{
  size_t start = 0;
  if (vec) {
    WF_GRID_STRIDE(i, n / 4)
    {
      float4 v = reinterpret_cast<const float4 *>(src)[i];
      __nv_bfloat162 *d = reinterpret_cast<__nv_bfloat162 *>(dst + 4 * i);
      d[0] = __floats2bfloat162_rn(v.x, v.y);
      d[1] = __floats2bfloat162_rn(v.z, v.w);
    }
    start = n / 4 * 4;
  }
  WF_GRID_STRIDE(i, n - start) { dst[start + i] = __float2bfloat16_rn(src[start + i]); }
}

/* dst (n) = src widened, 4 at a time where both are 16-byte aligned (vec). */
__global__ static void widen_kernel(float *dst, const __nv_bfloat16 *src, size_t n, int vec)
{
  size_t start = 0;
  if (vec) {
    WF_GRID_STRIDE(i, n / 4)
    {
      const __nv_bfloat162 *x = reinterpret_cast<const __nv_bfloat162 *>(src + 4 * i);
      float2 a = __bfloat1622float2(x[0]), b = __bfloat1622float2(x[1]);
      reinterpret_cast<float4 *>(dst)[i] = make_float4(a.x, a.y, b.x, b.y);
    }
    start = n / 4 * 4;
  }
  WF_GRID_STRIDE(i, n - start) { dst[start + i] = __bfloat162float(src[start + i]); }
}

static int aligned(const void *a, const void *b)
{
  return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15) == 0;
}

static void narrow(wf_bf16 *dst, const float *src, size_t n, cudaStream_t s)
{
  narrow_kernel<<<wf__grid_1d((n + 3) / 4, 256), 256, 0, s>>>(
      reinterpret_cast<__nv_bfloat16 *>(dst), src, n, aligned(dst, src));
  WF_CUDA_LAUNCHED("narrow_kernel (attention's bf16 operands)");
}

/* dst = src widened. */
static void widen(float *dst, const wf_bf16 *src, size_t n, cudaStream_t s)
{
  widen_kernel<<<wf__grid_1d((n + 3) / 4, 256), 256, 0, s>>>(
      dst, reinterpret_cast<const __nv_bfloat16 *>(src), n, aligned(dst, src));
  WF_CUDA_LAUNCHED("widen_kernel (attention's bf16 results)");
}

/* Stream-ordered scratch, as matmul.cu's operand copies; NULL (logged) on failure. */
static void *pool_alloc(size_t bytes, cudaStream_t s)
{
  void *p = NULL;
  return WF_CUDA_OK(cudaMallocAsync(&p, bytes, s)) ? p : NULL;
}

static void pool_free(void *p, cudaStream_t s)
{
  if (p)
    WF_CUDA_OK(cudaFreeAsync(p, s));
}

/* ---- the saved buffer -------------------------------------------------------------- */

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static bool bf16_layout(int C, int NH) { return NH > 0 && C % NH == 0 && C / NH <= 128; }

size_t wf__attn_saved(int B, int T, int C, int NH)
{
  if (!bf16_layout(C, NH))
    return wf__attn32_saved(B, T, C, NH);
  return align16((size_t)B * NH * T) + align16(((size_t)B * T * C + 1) / 2);
}

size_t wf__attn_scratch(int B, int T, int C, int NH)
{
  return wf__attn32_scratch(B, T, C, NH); /* D (B,NH,T), or the (T, T) fallback's */
}

/* O (B,T,C) bf16 inside `att`, after lse. */
static wf_bf16 *saved_out(float *att, int B, int T, int NH)
{
  return reinterpret_cast<wf_bf16 *>(att + align16((size_t)B * NH * T));
}

wf_bf16 *wf__attn_saved_out(float *att, int B, int T, int NH) { return saved_out(att, B, T, NH); }

/* ---- bf16 paths -------------------------------------------------------------------- */

/* Floats of a packed qkv of NH query and NKV kv heads: (B, T, C + 2 NKV hs). */
static size_t qkv_elems(int B, int T, int C, int NH, int NKV)
{
  return (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH));
}

/* The fp32 (grouped-query) kernels on widened copies: out and lse from qkv. */
static void reference16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, const int *starts,
                                int B, int T, int C, int NH, int NKV, cudaStream_t s)
{
  size_t nx = qkv_elems(B, T, C, NH, NKV), ny = (size_t)B * T * C;
  float *x = (float *)pool_alloc(nx * sizeof(float), s);
  float *y = (float *)pool_alloc(ny * sizeof(float), s);
  if (x && y) {
    widen(x, qkv, nx, s);
    wf__attn32_forward(y, lse, x, starts, B, T, C, NH, NKV, (wf_stream *)s);
    narrow(out, y, ny, s);
  }
  pool_free(y, s);
  pool_free(x, s);
}

static void reference16_backward(wf_bf16 *dqkv, float *D, const wf_bf16 *dout, const wf_bf16 *qkv,
                                 const float *lse, const int *starts, int B, int T, int C, int NH,
                                 int NKV, cudaStream_t s)
{
  size_t nx = qkv_elems(B, T, C, NH, NKV), ny = (size_t)B * T * C;
  float *x = (float *)pool_alloc(nx * sizeof(float), s);
  float *dx = (float *)pool_alloc(nx * sizeof(float), s);
  float *dy = (float *)pool_alloc(ny * sizeof(float), s);
  if (x && dx && dy) { /* the fp32 backward writes dx */
    widen(x, qkv, nx, s);
    widen(dy, dout, ny, s);
    wf__attn32_backward(dx, D, dy, x, lse, starts, B, T, C, NH, NKV, (wf_stream *)s);
    narrow(dqkv, dx, nx, s);
  }
  pool_free(dy, s);
  pool_free(dx, s);
  pool_free(x, s);
}

/* Whether the reference can stand in for a bf16 call (its lse-only saved state exists up
 * to head size 128; it takes kv heads through the grouped-query kernels). */
static bool reference16_ok(int C, int NH, int NKV)
{
  if (C / NH <= 128)
    return true;
  WF_ERROR("attention (bf16): %d heads of %d with %d kv heads need cuDNN or the flash kernels, "
           "and neither takes the shape (see the log line above)",
           NH, C / NH, NKV);
  wf__cuda_record((int)cudaErrorNotSupported);
  return false;
}

static void forward16(int path, wf_bf16 *out, float *lse, const wf_bf16 *qkv, const int *starts,
                      int B, int T, int C, int NH, int NKV, cudaStream_t s)
{
  if (path == WF_ATTN_CUDNN)
    wf__cudnn_sdpa_forward(out, lse, qkv, starts, B, T, C, NH, NKV, s);
  else if (path == WF_ATTN_FLASH)
    wf__flash16_forward(out, lse, qkv, starts, B, T, C, NH, NKV, s);
  else if (reference16_ok(C, NH, NKV))
    reference16_forward(out, lse, qkv, starts, B, T, C, NH, NKV, s);
}

static void backward16(int path, wf_bf16 *dqkv, float *D, const wf_bf16 *dout, const wf_bf16 *qkv,
                       const wf_bf16 *out, const float *lse, const int *starts, int B, int T, int C,
                       int NH, int NKV, cudaStream_t s)
{
  if (path == WF_ATTN_CUDNN)
    wf__cudnn_sdpa_backward(dqkv, dout, qkv, out, lse, starts, B, T, C, NH, NKV, s);
  else if (path == WF_ATTN_FLASH)
    wf__flash16_backward(dqkv, D, dout, qkv, out, lse, starts, B, T, C, NH, NKV, s);
  else if (reference16_ok(C, NH, NKV))
    reference16_backward(dqkv, D, dout, qkv, lse, starts, B, T, C, NH, NKV, s);
}

void wf__attention_bf16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, const int *starts,
                                int B, int T, int C, int NH, int NKV, wf_stream *stream)
{
  if (!shape_ok(B, T, C, NH, NKV))
    return;
  forward16(path_for(B, T, C, NH, NKV, g_impl.load(), starts != NULL), out, lse, qkv, starts, B, T,
            C, NH, NKV, (cudaStream_t)stream);
}

void wf__attention_bf16_backward(wf_bf16 *dqkv, float *scratch, const wf_bf16 *dout,
                                 const wf_bf16 *qkv, const wf_bf16 *out, const float *lse,
                                 const int *starts, int B, int T, int C, int NH, int NKV,
                                 wf_stream *stream)
{
  if (!shape_ok(B, T, C, NH, NKV))
    return;
  backward16(path_for(B, T, C, NH, NKV, g_impl.load(), starts != NULL), dqkv, scratch, dout, qkv,
             out, lse, starts, B, T, C, NH, NKV, (cudaStream_t)stream);
}

/* D (B,NH,T) for the flash kernels (cuDNN and the reference keep their own). */
size_t wf__attention_bf16_scratch(int B, int T, int C, int NH, int NKV)
{
  return shape_ok(B, T, C, NH, NKV) ? (size_t)B * NH * T : 0;
}

/* ---- the fp32 entries --------------------------------------------------------------- */

/* The table's fp32 attention entries (grouped-query; multi-head is NKV = NH): the path
 * runtime.attention picks for the shape, on bf16 copies, or the fp32 kernels. */
void wf__attn_forward(float *out, float *att, const float *qkv, const int *starts, int B, int T,
                      int C, int NH, int NKV, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (!shape_ok(B, T, C, NH, NKV))
    return;
  size_t nx = qkv_elems(B, T, C, NH, NKV), ny = (size_t)B * T * C;
  int path = path_for(B, T, C, NH, NKV, g_impl.load(), starts != NULL);
  if (path == WF_ATTN_REFERENCE) {
    wf__attn32_forward(out, att, qkv, starts, B, T, C, NH, NKV, stream);
    if (bf16_layout(C, NH)) /* O for a bf16 backward, should the setting change */
      narrow(saved_out(att, B, T, NH), out, ny, s);
    return;
  }
  wf_bf16 *x = (wf_bf16 *)pool_alloc(nx * sizeof(wf_bf16), s);
  if (!x)
    return;
  narrow(x, qkv, nx, s);
  forward16(path, saved_out(att, B, T, NH), att, x, starts, B, T, C, NH, NKV, s);
  widen(out, saved_out(att, B, T, NH), ny, s);
  pool_free(x, s);
}

void wf__attn_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                       const float *att, const int *starts, int B, int T, int C, int NH, int NKV,
                       wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (!shape_ok(B, T, C, NH, NKV))
    return;
  size_t nx = qkv_elems(B, T, C, NH, NKV), ny = (size_t)B * T * C;
  int path = path_for(B, T, C, NH, NKV, g_impl.load(), starts != NULL);
  if (path == WF_ATTN_REFERENCE) {
    wf__attn32_backward(dqkv, scratch, dout, qkv, att, starts, B, T, C, NH, NKV, stream);
    return;
  }
  wf_bf16 *x = (wf_bf16 *)pool_alloc(nx * sizeof(wf_bf16), s);
  wf_bf16 *dx = (wf_bf16 *)pool_alloc(nx * sizeof(wf_bf16), s);
  wf_bf16 *dy = (wf_bf16 *)pool_alloc(ny * sizeof(wf_bf16), s);
  if (x && dx && dy) {
    narrow(x, qkv, nx, s);
    narrow(dy, dout, ny, s);
    backward16(path, dx, scratch, dy, x, saved_out(const_cast<float *>(att), B, T, NH), att, starts,
               B, T, C, NH, NKV, s);
    widen(dqkv, dx, nx, s); /* written (attention.h) */
  }
  pool_free(dy, s);
  pool_free(dx, s);
  pool_free(x, s);
}
